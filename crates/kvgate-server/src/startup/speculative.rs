//! `--speculative-config`: vLLM's JSON for speculative decoding, read into the engine's
//! [`SpecConfig`] and the draft model's path. Two of vLLM's methods run: prompt lookup (`"method":
//! "ngram"`, with vLLM's keys and defaults: `num_speculative_tokens` required, `prompt_lookup_min` /
//! `prompt_lookup_max` default to each other, or both to 5) and a draft model (`"method":
//! "draft_model"` — or no method with a `"model"` — a GGUF with the target's vocabulary, which
//! `serve` loads beside the target). A draft model given `prompt_lookup_min`/`_max` too runs both:
//! prompt lookup where the context holds a match, the draft where it does not. kvgate's own keys for
//! a draft: `draft_p_min` (a proposal ends where the draft's probability of all of it would fall
//! below it, default 0.35), `draft_window` (most tokens of a prompt's end the draft reads, default
//! 1024; at most 2/10 of a prompt, so the draft's prefill stays under a tenth of the target's) and
//! `draft_vocab` (on the CPU, the draft scores only the first that many token ids, default 49,152; 0
//! for all: see [`DEFAULT_DRAFT_VOCAB`]).
//! `disable_by_batch_size` is vLLM's too: speculation pauses while that many sequences or more decode
//! at once (a step that is compute-bound gains nothing from extra rows) — except for a sequence that
//! keeps its proposals. A method kvgate does not run (`eagle`, `mtp`, …), a key the method does not
//! take or a key kvgate does not know is refused at startup with its name, never silently ignored.

use kvgate_engine::{
    Backend, Device, KvMemory, SpecConfig, SpecMethod, DEFAULT_DRAFT_P_MIN, DEFAULT_DRAFT_WINDOW,
    DEFAULT_TREE_BRANCHES, DRAFT_PROMPT_SHARE,
};
use kvgate_model::{load_unprepared, Configured, LoadOptions, Tokenizer};
use std::path::{Path, PathBuf};

use crate::startup::backends::{open_backend, BackendSpec};
use serde::Deserialize;

/// Sequences decoding at once from which speculation pauses, unless the config says: on a CPU a
/// step of two streams is already bound by computing rather than by reading the weights. Measured
/// (`cargo bench --bench speculation`, Qwen2.5-Coder-0.5B, 2 cores, k = 8, speculating at any batch,
/// × decoding without): chat 1 stream 1.32×, 2 streams 0.99× (AVX2: 0.94×), 4 streams 0.96×, 8
/// streams 0.88×; an edit (copying) 2.77×, 1.74× (AVX2: 1.34×), 1.33×. Text that copies gains at 2
/// and 4 streams, free text loses there: the default keeps the loss off (raise it for edit-heavy
/// agents).
pub const DEFAULT_DISABLE_BY_BATCH_SIZE: usize = 2;

/// Token ids a draft model scores on the CPU: its output projection cut to the vocabulary's first ids
/// (SGLang's `--speculative-token-map`, FR-Spec's frequent-token head; a BPE vocabulary lists its
/// merges in training order, so its first ids are its most frequent). Qwen2.5-Coder-0.5B's head is
/// 151,936 × 896 at 8 bits, 37% of what its pass reads: at 49,152 ids a pass takes 8.2 ms instead of
/// 11.6 (2 cores, AVX-512), and the ids past it are 4% of the 1.5B's greedy chat tokens (those the
/// draft cannot propose; the target still emits them). A vocabulary no larger keeps its head whole.
pub const DEFAULT_DRAFT_VOCAB: usize = 49_152;

/// The JSON as vLLM spells it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Wire {
    method: Option<String>,
    num_speculative_tokens: Option<usize>,
    prompt_lookup_min: Option<usize>,
    prompt_lookup_max: Option<usize>,
    disable_by_batch_size: Option<usize>,
    /// The draft model's GGUF (`method: "draft_model"`).
    model: Option<String>,
    /// kvgate's: a draft token below this probability ends the proposal.
    draft_p_min: Option<f32>,
    /// kvgate's: most tokens of a prompt's end the draft reads.
    draft_window: Option<usize>,
    /// kvgate's: the first token ids the draft scores (0: all).
    draft_vocab: Option<usize>,
    /// kvgate's: most prompt-lookup proposals verified together as a token tree (1: one path).
    token_tree_branches: Option<usize>,
}

/// What `--speculative-config` asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct Speculative {
    /// The engine's settings.
    pub config: SpecConfig,
    /// The draft model's GGUF (the `draft_model` method).
    pub draft_model: Option<PathBuf>,
    /// The first token ids the draft scores on the CPU (0: all).
    pub draft_vocab: usize,
}

/// Parses `--speculative-config` (clap's value parser: the message names what is wrong).
pub fn parse(s: &str) -> Result<Speculative, String> {
    let w: Wire = serde_json::from_str(s).map_err(|e| format!("not a speculative config: {e}"))?;
    let method = w.method.clone().unwrap_or_else(|| {
        if w.model.is_some() {
            "draft_model".into()
        } else {
            "ngram".into()
        }
    });
    let (method, draft_model) = match method.as_str() {
        "ngram" | "[ngram]" => {
            if let Some(m) = &w.model {
                return Err(format!(
                    "\"model\" ({m}) is for a draft model; the ngram method takes none"
                ));
            }
            if let Some(key) = [
                ("draft_p_min", w.draft_p_min.is_some()),
                ("draft_window", w.draft_window.is_some()),
                ("draft_vocab", w.draft_vocab.is_some()),
            ]
            .iter()
                .find_map(|(k, given)| given.then_some(k))
            {
                return Err(format!("{key} is for a draft model; the ngram method takes none"));
            }
            (SpecMethod::Ngram, None)
        }
        "draft_model" => {
            let m = w
                .model
                .as_deref()
                .ok_or("the draft_model method needs \"model\": the draft model's GGUF file")?;
            // with prompt lookup's keys: lookup where the context holds a match, the draft elsewhere
            let both = w.prompt_lookup_min.is_some() || w.prompt_lookup_max.is_some();
            let method = if both {
                SpecMethod::LookupThenDraft
            } else {
                SpecMethod::DraftModel
            };
            (method, Some(PathBuf::from(m)))
        }
        other => {
            return Err(format!(
                "method \"{other}\" is not supported; kvgate speculates by prompt lookup (\"method\": \"ngram\") or by a draft model (\"method\": \"draft_model\", \"model\": a GGUF)"
            ))
        }
    };
    let k = w
        .num_speculative_tokens
        .ok_or("num_speculative_tokens is required (the most tokens proposed per step)")?;
    let (min, max) = match (w.prompt_lookup_min, w.prompt_lookup_max) {
        (None, None) => (5, 5),
        (Some(a), None) => (a, a),
        (None, Some(b)) => (b, b),
        (Some(a), Some(b)) => (a, b),
    };
    let disable = w.disable_by_batch_size.unwrap_or(DEFAULT_DISABLE_BY_BATCH_SIZE);
    if disable == 0 {
        return Err("disable_by_batch_size must be at least 1, got 0".into());
    }
    let config = SpecConfig {
        method,
        num_speculative_tokens: k,
        prompt_lookup_min: min,
        prompt_lookup_max: max,
        max_batch: disable - 1,
        draft_p_min: w.draft_p_min.unwrap_or(DEFAULT_DRAFT_P_MIN),
        draft_window: w.draft_window.unwrap_or(DEFAULT_DRAFT_WINDOW),
        draft_share: DRAFT_PROMPT_SHARE,
        tree_branches: w.token_tree_branches.unwrap_or(DEFAULT_TREE_BRANCHES),
    }
    .validate()
    .map_err(|e| e.to_string())?;
    let draft_vocab = w.draft_vocab.unwrap_or(DEFAULT_DRAFT_VOCAB);
    if (1..MIN_DRAFT_VOCAB).contains(&draft_vocab) {
        return Err(format!(
            "draft_vocab must be 0 (every id) or at least {MIN_DRAFT_VOCAB}, got {draft_vocab}"
        ));
    }
    Ok(Speculative {
        config,
        draft_model,
        draft_vocab,
    })
}

/// Fewest token ids a cut draft head may score.
const MIN_DRAFT_VOCAB: usize = 256;

/// Loads the draft model `path` and opens its backend beside the target's (`target`: the same device,
/// activations, block size, KV dtype and method, and as many blocks as the target's cache, each
/// smaller by the draft's size). Its tokenizer must be the target's, token for token: a proposal is
/// a token id, meaningless under another vocabulary. On the CPU its head scores the first `vocab`
/// ids (0: all); a GPU keeps the whole head (its pass is not bound by the head's bytes alone).
pub(crate) fn open_draft(
    path: &Path,
    target: &BackendSpec,
    target_tok: &Tokenizer,
    num_blocks: usize,
    vocab: usize,
) -> Result<Box<dyn Backend>, String> {
    let opts = LoadOptions {
        max_model_len: None,
        int8_activations: target.int8_activations,
        f32_weights: false,
        chat_template: None,
    };
    let name = path.display();
    let mut draft = load_unprepared(path, &opts).map_err(|e| format!("the draft model {name}: {e}"))?;
    same_vocabulary(target_tok, &draft.tokenizer).map_err(|e| format!("the draft model {name}: {e}"))?;
    if vocab > 0 && target.device == Device::Cpu {
        draft
            .model
            .weights
            .keep_head_rows(vocab)
            .map_err(|e| format!("the draft model {name}: its head's first {vocab} ids: {e}"))?;
    }
    let shape = draft
        .model
        .config()
        .cache_shape(target.shape.block_size(), target.shape.dtype())
        .and_then(|s| s.with_quant(target.shape.quant()))
        .map_err(|e| format!("the draft model {name}: its KV cache: {e}"))?;
    let spec = BackendSpec {
        shape,
        memory: KvMemory::Blocks(num_blocks),
        ..target.clone()
    };
    let layers = draft.model.config().num_layers;
    let backend = open_backend(draft.model, &spec).map_err(|e| format!("the draft model {name}: {e}"))?;
    tracing::info!(
        "speculative decoding by a draft model: {name} ({layers} layers), its own KV cache of {num_blocks} blocks ({:.1} MiB)",
        backend.capacity().budget_bytes as f64 / (1u64 << 20) as f64
    );
    Ok(backend)
}

/// Whether two tokenizers are the same vocabulary: the same size and the same token behind every id.
fn same_vocabulary(target: &Tokenizer, draft: &Tokenizer) -> Result<(), String> {
    let (t, d) = (target.vocab_size(), draft.vocab_size());
    if t != d {
        return Err(format!(
            "its vocabulary has {d} tokens, the target's {t}: a draft model needs the target's tokenizer"
        ));
    }
    match (0..t as u32).find(|&id| target.id_to_token(id) != draft.id_to_token(id)) {
        Some(id) => Err(format!(
            "token {id} is {:?} in its vocabulary and {:?} in the target's: a draft model needs the target's tokenizer",
            draft.id_to_token(id).unwrap_or_default(),
            target.id_to_token(id).unwrap_or_default()
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllms_ngram_json_reads_with_its_defaults() {
        let c = parse(r#"{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}"#)
            .unwrap()
            .config;
        assert_eq!(
            (c.num_speculative_tokens, c.prompt_lookup_min, c.prompt_lookup_max),
            (5, 4, 4)
        );
        assert_eq!(c.max_batch, DEFAULT_DISABLE_BY_BATCH_SIZE - 1);
        let c = parse(r#"{"method": "ngram", "num_speculative_tokens": 3, "disable_by_batch_size": 9}"#)
            .unwrap()
            .config;
        assert_eq!((c.prompt_lookup_min, c.prompt_lookup_max, c.max_batch), (5, 5, 8));
        let c = parse(r#"{"num_speculative_tokens": 2, "prompt_lookup_min": 2, "prompt_lookup_max": 3}"#)
            .unwrap()
            .config;
        assert_eq!((c.prompt_lookup_min, c.prompt_lookup_max), (2, 3));
        // token trees by default; kvgate's key sets how many proposals, 1 for a single path
        assert_eq!(c.tree_branches, DEFAULT_TREE_BRANCHES);
        let c = parse(r#"{"num_speculative_tokens": 4, "token_tree_branches": 1}"#)
            .unwrap()
            .config;
        assert_eq!(c.tree_branches, 1);
    }

    #[test]
    fn a_draft_model_reads_as_vllm_spells_it() {
        let s = parse(r#"{"method": "draft_model", "model": "/m/draft.gguf", "num_speculative_tokens": 4}"#).unwrap();
        assert_eq!(s.config.method, SpecMethod::DraftModel);
        assert_eq!(s.config.num_speculative_tokens, 4);
        assert_eq!(s.draft_model, Some(PathBuf::from("/m/draft.gguf")));
        // no method with a model is a draft model, as in vLLM
        let s = parse(r#"{"model": "d.gguf", "num_speculative_tokens": 2, "disable_by_batch_size": 3}"#).unwrap();
        assert_eq!((s.config.method, s.config.max_batch), (SpecMethod::DraftModel, 2));
        assert_eq!(
            (s.config.draft_p_min, s.config.draft_window),
            (DEFAULT_DRAFT_P_MIN, DEFAULT_DRAFT_WINDOW)
        );
        // with prompt lookup's keys: both methods; kvgate's draft keys
        let s = parse(
            r#"{"model": "d.gguf", "num_speculative_tokens": 6, "prompt_lookup_min": 2, "prompt_lookup_max": 5,
                "draft_p_min": 0.6, "draft_window": 256}"#,
        )
        .unwrap();
        assert_eq!(s.config.method, SpecMethod::LookupThenDraft);
        assert_eq!(
            (
                s.config.prompt_lookup_min,
                s.config.prompt_lookup_max,
                s.config.draft_p_min,
                s.config.draft_window
            ),
            (2, 5, 0.6, 256)
        );
        // the draft's head: the first 49,152 ids by default, all with 0, at least 256 otherwise
        assert_eq!(s.draft_vocab, DEFAULT_DRAFT_VOCAB);
        let s = parse(r#"{"model": "d.gguf", "num_speculative_tokens": 4, "draft_vocab": 0}"#).unwrap();
        assert_eq!(s.draft_vocab, 0);
        let s = parse(r#"{"model": "d.gguf", "num_speculative_tokens": 4, "draft_vocab": 32768}"#).unwrap();
        assert_eq!(s.draft_vocab, 32768);
        let e = parse(r#"{"model": "d.gguf", "num_speculative_tokens": 4, "draft_vocab": 100}"#).unwrap_err();
        assert!(
            e.contains("draft_vocab must be 0 (every id) or at least 256, got 100"),
            "{e}"
        );
        let e = parse(r#"{"num_speculative_tokens": 4, "draft_vocab": 4096}"#).unwrap_err();
        assert!(e.contains("draft_vocab is for a draft model"), "{e}");
    }

    #[test]
    fn what_kvgate_does_not_run_is_refused_by_name() {
        let e = parse(r#"{"method": "eagle", "model": "x", "num_speculative_tokens": 3}"#).unwrap_err();
        assert!(e.contains("\"eagle\" is not supported"), "{e}");
        let e = parse(r#"{"method": "ngram", "model": "draft.gguf", "num_speculative_tokens": 3}"#).unwrap_err();
        assert!(e.contains("the ngram method takes none"), "{e}");
        let e = parse(r#"{"method": "draft_model", "num_speculative_tokens": 3}"#).unwrap_err();
        assert!(e.contains("needs \"model\""), "{e}");
        let e = parse(r#"{"method": "ngram", "num_speculative_tokens": 3, "draft_p_min": 0.5}"#).unwrap_err();
        assert!(e.contains("draft_p_min is for a draft model"), "{e}");
        let e = parse(r#"{"model": "d.gguf", "num_speculative_tokens": 3, "draft_p_min": 2}"#).unwrap_err();
        assert!(e.contains("draft_p_min must be between 0 and 1, got 2"), "{e}");
        let e = parse(r#"{"model": "d.gguf", "num_speculative_tokens": 3, "draft_window": 0}"#).unwrap_err();
        assert!(e.contains("draft_window must be at least 1"), "{e}");
        let e =
            parse(r#"{"model": "d.gguf", "num_speculative_tokens": 3, "draft_tensor_parallel_size": 1}"#).unwrap_err();
        assert!(e.contains("unknown field `draft_tensor_parallel_size`"), "{e}");
        let e = parse(r#"{"method": "ngram"}"#).unwrap_err();
        assert!(e.contains("num_speculative_tokens is required"), "{e}");
        let e = parse(r#"{"method": "ngram", "num_speculative_tokens": 40}"#).unwrap_err();
        assert!(e.contains("between 1 and 32, got 40"), "{e}");
        let e = parse(
            r#"{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 4, "prompt_lookup_max": 2}"#,
        )
        .unwrap_err();
        assert!(e.contains("(4)") && e.contains("(2)"), "{e}");
        let e = parse(r#"{"method": "ngram", "num_speculative_tokens": 3, "token_tree_branches": 0}"#).unwrap_err();
        assert!(e.contains("token_tree_branches must be between 1 and 8, got 0"), "{e}");
        let e = parse(r#"{"method": "ngram", "num_speculative_tokens": 3, "typo": 1}"#).unwrap_err();
        assert!(e.contains("unknown field `typo`"), "{e}");
        assert!(parse("ngram").unwrap_err().starts_with("not a speculative config"));
    }
}
