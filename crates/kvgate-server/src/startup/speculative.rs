//! `--speculative-config`: vLLM's JSON for speculative decoding, read into the engine's
//! [`SpecConfig`]. kvgate speculates by prompt lookup (`"method": "ngram"`, with vLLM's keys and
//! defaults: `num_speculative_tokens` required, `prompt_lookup_min` / `prompt_lookup_max` default to
//! each other, or both to 5); `disable_by_batch_size` is vLLM's too: speculation pauses while that
//! many sequences or more decode at once (a step that is compute-bound gains nothing from extra
//! rows). A method kvgate does not run (`draft_model`, `eagle`, `mtp`, …) or a key it does not know is
//! refused at startup with its name, never silently ignored.

use kvgate_engine::SpecConfig;
use serde::Deserialize;

/// Sequences decoding at once from which speculation pauses, unless the config says: on a CPU a
/// step of two streams is already bound by computing rather than by reading the weights. Measured
/// (`cargo bench --bench speculation`, Qwen2.5-Coder-0.5B, 2 cores, chat, k = 8): with speculation at
/// any batch, 1 stream 1.47×, 2 streams 0.97×, 4 streams 0.88×, 8 streams 0.89× of decoding without.
pub const DEFAULT_DISABLE_BY_BATCH_SIZE: usize = 2;

/// The JSON as vLLM spells it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Wire {
    method: Option<String>,
    num_speculative_tokens: Option<usize>,
    prompt_lookup_min: Option<usize>,
    prompt_lookup_max: Option<usize>,
    disable_by_batch_size: Option<usize>,
    /// A draft model (`method: "draft_model"`): refused with the method for now.
    model: Option<String>,
}

/// Parses `--speculative-config` (clap's value parser: the message names what is wrong).
pub fn parse(s: &str) -> Result<SpecConfig, String> {
    let w: Wire = serde_json::from_str(s).map_err(|e| format!("not a speculative config: {e}"))?;
    let method = w.method.clone().unwrap_or_else(|| {
        if w.model.is_some() {
            "draft_model".into()
        } else {
            "ngram".into()
        }
    });
    if method != "ngram" && method != "[ngram]" {
        return Err(format!(
            "method \"{method}\" is not supported; kvgate speculates by prompt lookup: \"method\": \"ngram\""
        ));
    }
    if let Some(m) = &w.model {
        return Err(format!(
            "\"model\" ({m}) is for a draft model; the ngram method takes none"
        ));
    }
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
    SpecConfig {
        num_speculative_tokens: k,
        prompt_lookup_min: min,
        prompt_lookup_max: max,
        max_batch: disable - 1,
    }
    .validate()
    .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllms_ngram_json_reads_with_its_defaults() {
        let c = parse(r#"{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}"#).unwrap();
        assert_eq!(
            (c.num_speculative_tokens, c.prompt_lookup_min, c.prompt_lookup_max),
            (5, 4, 4)
        );
        assert_eq!(c.max_batch, DEFAULT_DISABLE_BY_BATCH_SIZE - 1);
        let c = parse(r#"{"method": "ngram", "num_speculative_tokens": 3, "disable_by_batch_size": 9}"#).unwrap();
        assert_eq!((c.prompt_lookup_min, c.prompt_lookup_max, c.max_batch), (5, 5, 8));
        let c = parse(r#"{"num_speculative_tokens": 2, "prompt_lookup_min": 2, "prompt_lookup_max": 3}"#).unwrap();
        assert_eq!((c.prompt_lookup_min, c.prompt_lookup_max), (2, 3));
    }

    #[test]
    fn what_kvgate_does_not_run_is_refused_by_name() {
        let e = parse(r#"{"method": "eagle", "model": "x", "num_speculative_tokens": 3}"#).unwrap_err();
        assert!(e.contains("\"eagle\" is not supported"), "{e}");
        let e = parse(r#"{"model": "draft.gguf", "num_speculative_tokens": 3}"#).unwrap_err();
        assert!(e.contains("\"draft_model\""), "{e}");
        let e = parse(r#"{"method": "ngram"}"#).unwrap_err();
        assert!(e.contains("num_speculative_tokens is required"), "{e}");
        let e = parse(r#"{"method": "ngram", "num_speculative_tokens": 40}"#).unwrap_err();
        assert!(e.contains("between 1 and 32, got 40"), "{e}");
        let e = parse(
            r#"{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 4, "prompt_lookup_max": 2}"#,
        )
        .unwrap_err();
        assert!(e.contains("(4)") && e.contains("(2)"), "{e}");
        let e = parse(r#"{"method": "ngram", "num_speculative_tokens": 3, "typo": 1}"#).unwrap_err();
        assert!(e.contains("unknown field `typo`"), "{e}");
        assert!(parse("ngram").unwrap_err().starts_with("not a speculative config"));
    }
}
