//! `POST /v1/completions`: one prompt (string or token ids) or a list of them, non-streaming or SSE,
//! with `echo`, legacy `logprobs`, `n`, stop strings and usage.

mod wire;

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use kvgate_engine::{FinishReason, StopMatch, TokenLogprob, Usage};
use kvgate_grammar::GrammarSpec;
use serde_json::{Map, Value};

use crate::http::error::ApiError;
use crate::http::middleware::RequestTenant;
use crate::http::state::AppState;
use crate::ids::{now_secs, request_id};
use crate::pipeline::events::ChoiceOut;
use crate::pipeline::generation::{submit, Generation};
use crate::pipeline::openai::request::{endpoint_body, SamplingFields};
use crate::pipeline::openai::respond::{respond, vllm_prompt_logprobs, PromptLogprobs, Shape};
use crate::pipeline::openai::response::{StopReason, UsageOut};
use crate::pipeline::render::{Rendered, Sampling};
use crate::pipeline::sampling::{self, int_in};
use wire::{Completion, CompletionChoice, CompletionFields, LegacyLogprobs, TopMap};

/// A prompt as given: its tokens and its text (for `echo`).
pub(crate) struct Prompt {
    pub(crate) ids: Vec<u32>,
    text: String,
}

/// Tokens an empty text prompt is read as, the first this vocabulary has.
const DOCUMENT_START: [&str; 4] = ["<|endoftext|>", "<|begin_of_text|>", "<s>", "<bos>"];

/// A prompt as sent, before tokenization.
enum RawPrompt<'a> {
    Text(&'a str),
    Ids(&'a [Value]),
}

async fn read_prompts(prompt: Option<&Value>, st: &AppState) -> Result<Vec<Prompt>, ApiError> {
    let tok = &st.tokenizer();
    let raw: Vec<RawPrompt> = match prompt.filter(|v| !v.is_null()) {
        None => return Err(ApiError::param("prompt", "'prompt' is required")),
        Some(Value::String(s)) => vec![RawPrompt::Text(s)],
        Some(Value::Array(a)) if a.is_empty() => return Err(ApiError::param("prompt", "'prompt' must not be empty")),
        Some(Value::Array(a)) if a.iter().all(Value::is_string) => a
            .iter()
            .map(|s| RawPrompt::Text(s.as_str().unwrap_or_default()))
            .collect(),
        Some(Value::Array(a)) if a.iter().all(Value::is_number) => vec![RawPrompt::Ids(a)],
        Some(Value::Array(a)) if a.iter().all(Value::is_array) => a
            .iter()
            .map(|x| RawPrompt::Ids(x.as_array().map(Vec::as_slice).unwrap_or_default()))
            .collect(),
        Some(_) => {
            return Err(ApiError::param(
                "prompt",
                "'prompt' must be a string, a list of strings, a list of token ids, or a list of lists of token ids",
            ))
        }
    };
    if raw.len() > 64 {
        return Err(ApiError::param(
            "prompt",
            format!("at most 64 prompts per request, got {}", raw.len()),
        ));
    }
    let vocab = st.engine().limits().vocab_size;
    let mut prompts = Vec::with_capacity(raw.len());
    for r in raw {
        let p = match r {
            RawPrompt::Text(s) => {
                // bounded by bytes, then tokenized off the async runtime
                let mut ids = st.encode("prompt", s.to_string(), true).await?;
                if ids.is_empty() {
                    // `""` (which OpenAI accepts): the model's document-start token, as GPT models read
                    // an empty prompt after `<|endoftext|>`
                    ids.extend(DOCUMENT_START.iter().find_map(|t| tok.token_to_id(t)));
                }
                Prompt {
                    ids,
                    text: s.to_string(),
                }
            }
            RawPrompt::Ids(a) => {
                let ids: Vec<u32> = a
                    .iter()
                    .map(|x| {
                        x.as_u64()
                            .filter(|&t| (t as usize) < vocab)
                            .map(|t| t as u32)
                            .ok_or_else(|| {
                                ApiError::param(
                                    "prompt",
                                    format!("'prompt' contains token id {x}, outside the vocabulary (size {vocab})"),
                                )
                            })
                    })
                    .collect::<Result<_, _>>()?;
                let text = tok.decode(&ids, false).unwrap_or_default();
                Prompt { ids, text }
            }
        };
        if p.ids.is_empty() {
            return Err(ApiError::param("prompt", "'prompt' must contain at least one token"));
        }
        prompts.push(p);
    }
    Ok(prompts)
}

/// Legacy completions logprobs for a run of tokens (`k` alternatives each), `text_offset` starting at
/// `offset`.
fn legacy_logprobs(
    st: &AppState,
    k: usize,
    lps: &[Option<TokenLogprob>],
    tokens: &[u32],
    offset: usize,
) -> LegacyLogprobs {
    let mut out = LegacyLogprobs {
        tokens: vec![],
        token_logprobs: vec![],
        top_logprobs: vec![],
        text_offset: vec![],
    };
    let mut off = offset;
    for (i, &t) in tokens.iter().enumerate() {
        let s = st.tokenizer().decode(&[t], false).unwrap_or_default();
        out.text_offset.push(off);
        off += s.len();
        out.tokens.push(s);
        let l = lps.get(i).and_then(|x| x.as_ref());
        out.token_logprobs.push(l.map(|l| l.logprob));
        out.top_logprobs.push(l.filter(|l| !l.top.is_empty() && k > 0).map(|l| {
            let mut m = TopMap::default();
            for &(id, lp) in l.top.iter().take(k) {
                m.insert(st.tokenizer().decode(&[id], false).unwrap_or_default(), lp);
            }
            m
        }));
    }
    out
}

/// A completions body read and checked up to its prompts' token ids: everything the generation needs
/// but the compiled grammar. What `/v1/completions` submits and `/v1/completions/render` shows.
pub(crate) struct Prepared {
    pub(crate) sf: SamplingFields,
    pub(crate) value: Value,
    pub(crate) model: String,
    pub(crate) c: sampling::Common,
    pub(crate) prompts: Vec<Prompt>,
    /// `max_tokens: 0` with `echo`: the prompt is scored, nothing generated.
    pub(crate) score_only: bool,
    echo: bool,
    logprobs: Option<usize>,
    constraint: Option<(&'static str, GrammarSpec)>,
}

/// Reads a completions body: its fields, sampling, `echo` and legacy `logprobs`, structured output and
/// prompts, every error a 400 naming the field.
pub(crate) async fn prepare(st: &AppState, map: Map<String, Value>) -> Result<Prepared, ApiError> {
    let (sf, so, cf, value) = endpoint_body::<CompletionFields>(map)?;
    let model = st.check_model(sf.model.as_deref())?;
    let echo = cf.echo.unwrap_or(false);
    let max_tokens = int_in("max_tokens", sf.max_tokens, 0, i64::MAX)?.unwrap_or(16);
    // `max_tokens: 0` with `echo` scores the prompt only (lm-eval's loglikelihood): the engine samples
    // one token from the last position's logits (no further forward pass), which is left out of the
    // answer and of `usage`
    let score_only = max_tokens == 0;
    if score_only && !echo {
        return Err(ApiError::param(
            "max_tokens",
            "'max_tokens' must be at least 1 unless 'echo' is true (0 with echo scores the prompt only), got 0",
        ));
    }
    if score_only && sf.stream.unwrap_or(false) {
        return Err(ApiError::param(
            "max_tokens",
            "'max_tokens' 0 (score the prompt only) is not supported with 'stream'",
        ));
    }
    let mut c = sampling::read(
        &sf,
        st.defaults(),
        st.engine().limits().vocab_size,
        Some(max_tokens.max(1)),
    )?;
    c.params.bad_words = st.bad_words(sf.bad_words.as_ref())?;
    if score_only && c.params.min_tokens > 0 {
        return Err(ApiError::param(
            "min_tokens",
            format!(
                "'min_tokens' ({}) must not exceed 'max_tokens' (0)",
                c.params.min_tokens
            ),
        ));
    }
    let logprobs = int_in("logprobs", cf.logprobs, 0, 20)?.map(|x| x as usize);
    c.params.logprobs = logprobs;
    if echo && logprobs.is_some() {
        // the echoed prompt's legacy logprobs and vLLM's prompt_logprobs come from one computation
        c.params.prompt_logprobs = logprobs.max(c.prompt_logprobs);
    }
    let prompts = read_prompts(cf.prompt.as_ref(), st).await?;
    let constraint = crate::pipeline::structured::read(&so)?;
    if let Some((field, _)) = constraint.as_ref().filter(|_| score_only) {
        return Err(ApiError::param(
            field,
            format!("'{field}' has nothing to constrain with 'max_tokens' 0"),
        ));
    }
    Ok(Prepared {
        sf,
        value,
        model,
        c,
        prompts,
        score_only,
        echo,
        logprobs,
        constraint,
    })
}

/// The handler.
pub async fn completions(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    RequestTenant(tenant): RequestTenant,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let map = st.json_body(&headers, body)?;
    st.check_generates("/v1/completions")?;
    let Prepared {
        sf,
        value,
        model,
        c,
        prompts,
        score_only,
        echo,
        logprobs,
        constraint,
    } = prepare(&st, map).await?;
    if st.settings().log_requests {
        tracing::info!(body = %value, "completion request");
    }
    let generation = Generation {
        prompts: prompts.iter().map(|p| p.ids.clone()).collect(),
        sampling: c,
        guide: constraint,
        session: sf.prompt_cache_key,
        breakpoints: vec![],
        breakpoints_only: crate::pipeline::cache::select(&[], sf.prompt_cache_options.as_ref()).only,
    };
    let sub = submit(&st, &headers, tenant, generation).await?;
    let (n, stream, prompt_lp) = (sub.sampling.params.n, sub.stream_usage(), sub.sampling.prompt_logprobs);
    let slots = prompts.len() * n;
    let shape = CompletionShape {
        st,
        id: request_id("cmpl"),
        created: now_secs(),
        model,
        n,
        echo,
        logprobs,
        score_only,
        prompt_lp,
        prompt_lps: vec![None; prompts.len()],
        prompts,
        echoed: vec![false; slots],
        offsets: vec![0; slots],
    };
    respond(sub.tagged, n, stream, shape).await
}

/// How a completion writes engine events: `text_completion` objects, choice index = (prompt index
/// times n) plus choice, the prompt echoed (with its logprobs) before a choice's first token, legacy
/// logprobs with text offsets.
struct CompletionShape {
    st: Arc<AppState>,
    id: String,
    created: u64,
    model: String,
    n: usize,
    echo: bool,
    logprobs: Option<usize>,
    score_only: bool,
    /// vLLM's `prompt_logprobs` (non-streamed): alternatives per prompt token.
    prompt_lp: Option<usize>,
    prompts: Vec<Prompt>,
    prompt_lps: PromptLogprobs,
    /// Per choice: whether its prompt was echoed yet.
    echoed: Vec<bool>,
    /// Per choice: the text offset its next token starts at.
    offsets: Vec<usize>,
}

impl CompletionShape {
    fn chunk(&self, choices: Vec<CompletionChoice>, usage: Option<UsageOut>) -> Completion {
        Completion {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        }
    }

    fn text_len(&self, token: u32) -> usize {
        self.st
            .tokenizer()
            .decode(&[token], false)
            .map(|s| s.len())
            .unwrap_or(0)
    }
}

fn choice(index: usize, text: String, logprobs: Option<LegacyLogprobs>) -> CompletionChoice {
    CompletionChoice {
        index,
        text,
        logprobs,
        finish_reason: None,
        stop_reason: None,
        prompt_logprobs: None,
    }
}

impl Shape for CompletionShape {
    type Chunk = Completion;
    type Body = Completion;

    fn token(
        &mut self,
        pi: usize,
        c: usize,
        token: u32,
        text: String,
        logprob: Option<TokenLogprob>,
    ) -> Vec<Completion> {
        let idx = pi * self.n + c;
        let mut t = String::new();
        let first_echo = self.echo && !self.echoed[idx];
        if first_echo {
            self.echoed[idx] = true;
            t.push_str(&self.prompts[pi].text);
        }
        t.push_str(&text);
        let lp = match (self.logprobs, logprob) {
            // the echoed prompt's logprobs come with its text, offsets counting from its start
            (Some(k), Some(l)) if first_echo => {
                let ids = &self.prompts[pi].ids;
                let mut all = self.prompt_lps[pi].clone().unwrap_or_else(|| vec![None; ids.len()]);
                all.push(Some(l));
                let mut toks = ids.clone();
                toks.push(token);
                let v = Some(legacy_logprobs(&self.st, k, &all, &toks, 0));
                self.offsets[idx] = toks.iter().map(|&t| self.text_len(t)).sum();
                v
            }
            (Some(k), Some(l)) => {
                let v = Some(legacy_logprobs(&self.st, k, &[Some(l)], &[token], self.offsets[idx]));
                self.offsets[idx] += self.text_len(token);
                v
            }
            _ => None,
        };
        vec![self.chunk(vec![choice(idx, t, lp)], None)]
    }

    fn finished(
        &mut self,
        pi: usize,
        c: usize,
        reason: FinishReason,
        text: String,
        stop: Option<StopMatch>,
    ) -> Vec<Completion> {
        let mut ch = choice(pi * self.n + c, text, None);
        ch.finish_reason = Some(reason.as_str());
        ch.stop_reason = StopReason::of(&stop);
        vec![self.chunk(vec![ch], None)]
    }

    fn prompt_logprobs(&mut self, pi: usize, lps: Vec<Option<TokenLogprob>>) {
        if let Some(slot) = self.prompt_lps.get_mut(pi) {
            *slot = Some(lps);
        }
    }

    fn usage_chunk(&self, usage: UsageOut) -> Completion {
        self.chunk(vec![], Some(usage))
    }

    fn set_running_usage(chunk: &mut Completion, usage: UsageOut) {
        chunk.usage.get_or_insert(usage);
    }

    fn body(self, mut choices: Vec<ChoiceOut>, prompt_lps: PromptLogprobs, mut usage: Usage) -> Completion {
        if self.score_only {
            for ch in &mut choices {
                ch.text.clear();
                ch.tokens.clear();
                ch.logprobs.clear();
                ch.stop = None;
                ch.finish = Some(FinishReason::Length);
            }
            usage.completion_tokens = 0;
        }
        let n = self.n;
        let choices = choices
            .iter()
            .enumerate()
            .map(|(i, ch)| {
                let p = &self.prompts[i / n];
                let mut text = String::new();
                if self.echo {
                    text.push_str(&p.text);
                }
                text.push_str(&ch.text);
                let lp = self.logprobs.map(|k| {
                    let gen: Vec<Option<TokenLogprob>> = ch.logprobs.iter().cloned().map(Some).collect();
                    if self.echo {
                        let mut all = prompt_lps[i / n].clone().unwrap_or_else(|| vec![None; p.ids.len()]);
                        all.extend(gen);
                        let mut toks = p.ids.clone();
                        toks.extend(&ch.tokens);
                        legacy_logprobs(&self.st, k, &all, &toks, 0)
                    } else {
                        legacy_logprobs(&self.st, k, &gen, &ch.tokens, 0)
                    }
                });
                CompletionChoice {
                    index: i,
                    text,
                    logprobs: lp,
                    finish_reason: ch.finish.map(FinishReason::as_str),
                    stop_reason: StopReason::of(&ch.stop),
                    prompt_logprobs: self
                        .prompt_lp
                        .map(|k| vllm_prompt_logprobs(self.st.tokenizer(), k, prompt_lps[i / n].as_ref())),
                }
            })
            .collect();
        Completion {
            usage: Some(UsageOut::of(&usage)),
            ..self.chunk(choices, None)
        }
    }
}

/// `POST /v1/completions/render`.
pub(crate) async fn render(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let map = st.json_body(&headers, body)?;
    st.check_generates("/v1/completions/render")?;
    let p = prepare(&st, map).await?;
    let mut params = p.c.params;
    if p.score_only {
        params.max_tokens = 0;
    }
    let id = request_id("cmpl");
    let out: Vec<Rendered> = p
        .prompts
        .into_iter()
        .enumerate()
        .map(|(i, prompt)| Rendered {
            request_id: format!("{id}-{i}"),
            token_ids: prompt.ids,
            sampling_params: Sampling::from(&params),
            model: p.model.clone(),
            stream: p.c.stream,
            cache_salt: p.c.cache_salt.clone(),
        })
        .collect();
    Ok(axum::Json(out).into_response())
}
