//! The state every handler shares, read-only: the engine handle, the tokenizer and chat template, the
//! served model's names and defaults, the settings, the metrics exporter, the tokenization slots and
//! the grammar compiler. It sits at the ground of the server's layers (startup → protocols →
//! pipeline → http core) and imports none above it: a protocol's own state (the Responses stores,
//! the decision service) is that protocol's, given to its routes by the router
//! (`startup::router::Routes`), never a field here.

use std::sync::Arc;

use axum::http::HeaderMap;
use kvgate_decide::temperature::Fitted;
use kvgate_grammar::Grammars;
use kvgate_model::{ChatTemplate, GenerationDefaults, Tokenizer};
use metrics_exporter_prometheus::PrometheusHandle;

use crate::http::error::ApiError;
use crate::http::settings::Settings;
use crate::infer::Inference;

/// Shared by all handlers.
pub struct AppState {
    /// The engine, behind the HTTP ↔ engine seam.
    engine: Arc<dyn Inference>,
    /// The tokenizer.
    tokenizer: Arc<Tokenizer>,
    /// The chat template, if the model has one.
    chat: Option<Arc<ChatTemplate>>,
    /// The served model's names, sampling defaults and end-of-sequence ids.
    served: Served,
    /// The Prometheus exporter, when installed.
    metrics: Option<PrometheusHandle>,
    /// The serving settings, parsed once from the flags.
    settings: Settings,
    /// Tokenization off the async runtime: bytes per token at most, and the slots.
    tokenize: TokenizeSlots,
    /// The structured-output grammar compiler, built on its own thread (see [`GrammarsSlot`]).
    grammars: GrammarsSlot,
}

/// What the API says of the served model.
struct Served {
    /// Names the API answers to; the first is reported.
    names: Vec<String>,
    /// Sampling defaults.
    defaults: GenerationDefaults,
    /// The model's end-of-sequence token ids.
    eos_token_ids: Vec<u32>,
    /// Start time (unix seconds), used as `created` of the model.
    created: u64,
}

/// What handlers read of the shared state: each part read-only, behind its accessor.
impl AppState {
    /// The engine, behind the HTTP ↔ engine seam.
    pub(crate) fn engine(&self) -> &Arc<dyn Inference> {
        &self.engine
    }
    /// The tokenizer.
    pub(crate) fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }
    /// The chat template, if the model has one.
    pub(crate) fn chat(&self) -> Option<&Arc<ChatTemplate>> {
        self.chat.as_ref()
    }
    /// Names the API answers to; the first is reported.
    pub(crate) fn served_names(&self) -> &[String] {
        &self.served.names
    }
    /// Sampling defaults.
    pub(crate) fn defaults(&self) -> &GenerationDefaults {
        &self.served.defaults
    }
    /// The Prometheus exporter, when installed.
    pub(crate) fn metrics(&self) -> Option<&PrometheusHandle> {
        self.metrics.as_ref()
    }
    /// The serving settings.
    pub(crate) fn settings(&self) -> &Settings {
        &self.settings
    }
    /// Start time (unix seconds).
    pub(crate) fn created(&self) -> u64 {
        self.served.created
    }
    /// The model's end-of-sequence token ids.
    pub(crate) fn eos_token_ids(&self) -> &[u32] {
        &self.served.eos_token_ids
    }
    /// The structured-output grammar compiler (`None` if this tokenizer cannot be described to it),
    /// once built.
    pub(crate) async fn grammars(&self) -> Option<Arc<Grammars>> {
        self.grammars.get().await
    }
}

/// What the handlers need of the loaded model besides the engine.
pub struct ServedModel {
    /// The tokenizer.
    pub tokenizer: Arc<Tokenizer>,
    /// The chat template, if the model has one.
    pub chat: Option<ChatTemplate>,
    /// Sampling defaults.
    pub defaults: GenerationDefaults,
    /// End-of-sequence token ids.
    pub eos_token_ids: Vec<u32>,
    /// Vocabulary size (the width of a logits row).
    pub vocab_size: usize,
    /// Names the API answers to; the first is reported.
    pub served_names: Vec<String>,
    /// Decision temperatures and default option orders fitted for this model, if it is a fitted one.
    pub fitted: Option<Fitted>,
}

/// Tokenization runs on the blocking pool, a few at a time (the cores), with a bounded queue; text is
/// only tokenized once it is known to be able to fit the context by its bytes (no token is longer than
/// the vocabulary's longest, so more bytes than `max_model_len` × that cannot fit).
pub struct TokenizeSlots {
    longest_token: usize,
    slots: Arc<tokio::sync::Semaphore>,
    waiting: std::sync::atomic::AtomicUsize,
    max_waiting: usize,
}

impl TokenizeSlots {
    /// Slots for `tok`: as many at once as there are cores, up to `max_waiting` waiting (the engine's
    /// `--max-queue`: a burst the engine would queue is not refused before it gets there).
    pub fn new(tok: &Tokenizer, max_waiting: usize) -> TokenizeSlots {
        let longest_token = tok.token_bytes().iter().map(|(b, _)| b.len()).max().unwrap_or(1).max(1);
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        TokenizeSlots {
            longest_token,
            slots: Arc::new(tokio::sync::Semaphore::new(cores)),
            waiting: std::sync::atomic::AtomicUsize::new(0),
            max_waiting: max_waiting.max(1),
        }
    }
}

/// The grammar compiler, built on a thread of its own from the start (indexing a 150,000-token
/// vocabulary takes about half a second), so that the server answers while it is built; a request
/// with a grammar before it is ready waits for it. Guarantee: every waiter gets the one compiler (or
/// `None` when the tokenizer cannot be described, or the build died).
#[derive(Clone)]
pub(crate) struct GrammarsSlot(tokio::sync::watch::Receiver<Option<Option<Arc<Grammars>>>>);

impl GrammarsSlot {
    /// Starts building the compiler for `tok`.
    pub(crate) fn start(tok: &Arc<Tokenizer>, eos: &[u32], vocab: usize) -> GrammarsSlot {
        let (tx, rx) = tokio::sync::watch::channel(None);
        let (tok, eos) = (tok.clone(), eos.to_vec());
        std::thread::Builder::new()
            .name("grammars".into())
            .spawn(move || {
                let _ = tx.send(Some(grammars_for(&tok, &eos, vocab)));
            })
            .map_err(|e| tracing::warn!(error = %e, "structured outputs are unavailable: no thread to build them"))
            .ok();
        GrammarsSlot(rx)
    }

    /// The compiler, once built.
    async fn get(&self) -> Option<Arc<Grammars>> {
        let mut rx = self.0.clone();
        let ready = rx.wait_for(Option::is_some).await.ok()?;
        ready.clone().flatten()
    }
}

/// Builds the grammar compiler for a tokenizer (logged; `None` with a warning when it cannot).
pub fn grammars_for(tok: &Arc<Tokenizer>, eos: &[u32], vocab: usize) -> Option<Arc<Grammars>> {
    let t = std::time::Instant::now();
    match Grammars::new(tok.clone(), eos, vocab) {
        Ok(g) => {
            tracing::info!(
                ms = t.elapsed().as_millis() as u64,
                "structured outputs ready (llguidance)"
            );
            Some(Arc::new(g))
        }
        Err(e) => {
            tracing::warn!(error = %e, "structured outputs and forced tool calls are unavailable");
            None
        }
    }
}

impl AppState {
    /// The state over `engine` and `model` with `settings`: the tokenization slots (at most
    /// `max_queue` waiting) and the grammar compiler are started here, once, for `serve` and the test
    /// servers alike.
    pub fn new(
        engine: Arc<dyn Inference>,
        model: ServedModel,
        settings: Settings,
        max_queue: usize,
        metrics: Option<PrometheusHandle>,
    ) -> AppState {
        let ServedModel {
            tokenizer,
            chat,
            defaults,
            eos_token_ids,
            vocab_size,
            served_names,
            fitted: _,
        } = model;
        AppState {
            engine,
            grammars: GrammarsSlot::start(&tokenizer, &eos_token_ids, vocab_size),
            tokenize: TokenizeSlots::new(&tokenizer, max_queue),
            served: Served {
                names: served_names,
                defaults,
                eos_token_ids,
                created: crate::ids::now_secs(),
            },
            tokenizer,
            chat: chat.map(Arc::new),
            metrics,
            settings,
        }
    }

    /// The reported model name.
    pub fn model_name(&self) -> &str {
        &self.served.names[0]
    }

    /// Checks a System One request's `model`: also accepts the aliases (`--model-alias`).
    pub fn check_decision_model(&self, name: Option<&str>) -> Result<String, ApiError> {
        match name {
            Some(n) if self.settings.model_aliases.iter().any(|a| a == n) => Ok(self.model_name().to_string()),
            other => self.check_model(other),
        }
    }

    /// Checks a request's `model` (absent means the served model); unknown names are 404.
    pub fn check_model(&self, name: Option<&str>) -> Result<String, ApiError> {
        match name {
            None => Ok(self.model_name().to_string()),
            Some(n) if self.served.names.iter().any(|s| s == n) => Ok(self.model_name().to_string()),
            Some(n) => Err(ApiError::NotFound(format!("The model `{n}` does not exist."))),
        }
    }

    /// The `cache_salt` a request computes with: its own, joined to its API key's tenant when tenants
    /// are kept apart (several keys), so prefixes are only shared within a key.
    pub fn salted(&self, tenant: Option<u32>, salt: Option<String>) -> Option<String> {
        match tenant {
            Some(t) if !self.settings.share_prefix_cache_across_keys => {
                Some(format!("\u{1}tenant-{t}\u{1}{}", salt.unwrap_or_default()))
            }
            _ => salt,
        }
    }

    /// The retention a completion asks for: a session hint (`prompt_cache_key`, or an `X-Session-ID`
    /// header as vllm-router's consistent hashing routes by) with session retention on.
    pub fn retain_for(
        &self,
        headers: &HeaderMap,
        prompt_cache_key: Option<&str>,
        tenant: Option<u32>,
    ) -> Option<kvgate_engine::Retain> {
        let hinted = prompt_cache_key.is_some_and(|k| !k.is_empty()) || headers.contains_key("x-session-id");
        let window = self.settings.session_window.filter(|_| hinted)?;
        Some(kvgate_engine::Retain {
            window,
            tenant,
            owner: None,
        })
    }

    /// vLLM's `bad_words` as token sequences: each word as written and after a space (as it appears
    /// inside a text), at most 256 words of at most 512 bytes.
    pub fn bad_words(&self, words: Option<&Vec<String>>) -> Result<Vec<Vec<u32>>, ApiError> {
        let Some(words) = words else { return Ok(vec![]) };
        if words.len() > 256 {
            return Err(ApiError::param(
                "bad_words",
                format!("'bad_words' may hold at most 256 words, got {}", words.len()),
            ));
        }
        let mut out = vec![];
        for (i, w) in words.iter().enumerate() {
            if w.is_empty() || w.len() > 512 {
                return Err(ApiError::param(
                    "bad_words",
                    format!("bad_words[{i}] must be 1 to 512 bytes, got {}", w.len()),
                ));
            }
            for text in [w.clone(), format!(" {}", w.trim_start())] {
                let ids = self
                    .tokenizer
                    .encode(&text, false)
                    .map_err(|e| ApiError::param("bad_words", format!("bad_words[{i}]: {e}")))?;
                if !ids.is_empty() && !out.contains(&ids) {
                    out.push(ids);
                }
            }
        }
        Ok(out)
    }

    /// The most bytes a text of at most `max_model_len` tokens can have.
    pub fn max_prompt_bytes(&self) -> usize {
        self.engine
            .limits()
            .max_model_len
            .saturating_mul(self.tokenize.longest_token)
    }

    /// A 400 on `field` when `bytes` of text cannot fit the context, decided before tokenizing it.
    pub fn check_prompt_bytes(&self, field: &str, bytes: usize) -> Result<(), ApiError> {
        let max = self.max_prompt_bytes();
        if bytes <= max {
            return Ok(());
        }
        Err(ApiError::param(
            field,
            format!(
                "This model's maximum context length is {} tokens. However, your '{field}' is {bytes} bytes, \
                 more than {} tokens can hold ({max} bytes: no token is longer than {} bytes); it was not tokenized.",
                self.engine.limits().max_model_len,
                self.engine.limits().max_model_len,
                self.tokenize.longest_token
            ),
        ))
    }

    /// Tokenizes `text` (checked by bytes first) on the blocking pool; 503 with the queue's size when
    /// too many tokenizations are waiting.
    pub async fn encode(&self, field: &str, text: String, add_special: bool) -> Result<Vec<u32>, ApiError> {
        use std::sync::atomic::Ordering;
        self.check_prompt_bytes(field, text.len())?;
        let t = &self.tokenize;
        if t.waiting.fetch_add(1, Ordering::SeqCst) >= t.max_waiting {
            t.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(ApiError::TooManyRequests {
                message: format!(
                    "the server is busy: {} tokenizations are already waiting; retry later",
                    t.max_waiting
                ),
                retry_after: 1,
            });
        }
        let permit = t.slots.clone().acquire_owned().await;
        t.waiting.fetch_sub(1, Ordering::SeqCst);
        let permit = permit.map_err(|_| ApiError::Unavailable("the server is shutting down".into()))?;
        let tok = self.tokenizer.clone();
        let r = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            tok.encode(&text, add_special)
        })
        .await
        .map_err(|e| ApiError::Internal(format!("tokenization failed: {e}")))?;
        r.map_err(|e| ApiError::param(field, e.to_string()))
    }

    /// 400 when the served model does not generate (an embedding model), naming what it serves.
    pub fn check_generates(&self, route: &str) -> Result<(), ApiError> {
        if self.engine.generates() {
            return Ok(());
        }
        Err(ApiError::bad(format!(
            "the model '{}' is an embedding model (a sentence encoder): it serves /v1/embeddings, not {route}",
            self.model_name()
        )))
    }
}
