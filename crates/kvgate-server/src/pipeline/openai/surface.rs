//! vLLM's (and SGLang's) request fields beyond OpenAI's that kvgate does not act on, as one field set
//! beside each endpoint's: the routers people put in front of replicas (vllm-router, sglang-router)
//! re-serialise every request with some of them at their defaults (`no_stop_trim: false`,
//! `return_hidden_states: false`, …). A field at the value that means "do what you do anyway" is
//! accepted; any other value is a 400 naming the field and the value, never silently ignored. The
//! fields kvgate honours (`skip_special_tokens`, `include_stop_str_in_output`, `min_tokens`,
//! `chat_template_kwargs`, `add_generation_prompt`, `continue_final_message`, `include_reasoning`,
//! `separate_reasoning`, `cache_salt`, …) are typed with their endpoint's fields instead.

use serde::Deserialize;

use crate::http::error::ApiError;
use crate::pipeline::openai::request::{Int, Refused};

/// An endpoint's own field set, with the defaults the vLLM surface is checked against.
pub trait EndpointFields {
    /// vLLM's default for `add_special_tokens` on this endpoint (completions add the tokenizer's
    /// special tokens, chat does not: its template already has them).
    const ADD_SPECIAL_TOKENS: bool;
}

/// The vLLM/SGLang fields accepted only at their no-op values, and those refused whenever set.
#[derive(Debug, Default, Deserialize)]
pub struct VllmFields {
    /// SGLang's: keep the stop string in the output (only `false`: kvgate trims it; vLLM's
    /// `include_stop_str_in_output` keeps it).
    no_stop_trim: Option<bool>,
    /// SGLang's: return the hidden states (only `false`).
    return_hidden_states: Option<bool>,
    /// vLLM's: spaces between special tokens when detokenizing (only `true`, the default).
    spaces_between_special_tokens: Option<bool>,
    /// vLLM's: add the tokenizer's special tokens (only the endpoint's default).
    add_special_tokens: Option<bool>,
    /// vLLM's: scheduling priority (only 0: kvgate schedules by arrival and cache warmth).
    priority: Option<Int>,
    /// vLLM's beam-search length penalty (only 1.0: no beam search).
    length_penalty: Option<f64>,
    /// vLLM's: logprob tokens as `token_id:N` strings (only `false`).
    return_tokens_as_token_ids: Option<bool>,
    /// vLLM's: the prompt's and output's token ids in the response (only `false`).
    return_token_ids: Option<bool>,
    /// vLLM's data-parallel rank pin (kvgate has one engine per replica: only 0).
    data_parallel_rank: Option<Int>,
    truncate_prompt_tokens: Refused,
    request_id: Refused,
    kv_transfer_params: Refused,
    vllm_xargs: Refused,
    logits_processors: Refused,
    mm_processor_kwargs: Refused,
    chat_template: Refused,
    documents: Refused,
    prompt_embeds: Refused,
    structural_tag: Refused,
    lora_request: Refused,
    thinking_token_budget: Refused,
}

impl VllmFields {
    /// 400 for the first field set to a value kvgate would not honour.
    pub fn check<E: EndpointFields>(&self) -> Result<(), ApiError> {
        let flag = |name: &str, v: Option<bool>, ok: bool, why: &str| match v {
            Some(v) if v != ok => Err(ApiError::param(
                name,
                format!("'{name}: {v}' is not supported by kvgate ({why}); only {ok} is accepted"),
            )),
            _ => Ok(()),
        };
        flag(
            "no_stop_trim",
            self.no_stop_trim,
            false,
            "stop strings are trimmed; 'include_stop_str_in_output: true' keeps them",
        )?;
        flag(
            "return_hidden_states",
            self.return_hidden_states,
            false,
            "hidden states are not returned",
        )?;
        flag(
            "spaces_between_special_tokens",
            self.spaces_between_special_tokens,
            true,
            "detokenization always spaces special tokens",
        )?;
        flag(
            "add_special_tokens",
            self.add_special_tokens,
            E::ADD_SPECIAL_TOKENS,
            "this endpoint's special tokens are fixed",
        )?;
        flag(
            "return_tokens_as_token_ids",
            self.return_tokens_as_token_ids,
            false,
            "logprob tokens are text",
        )?;
        flag(
            "return_token_ids",
            self.return_token_ids,
            false,
            "use /tokenize for token ids",
        )?;
        if let Some(Int(p)) = self.priority.filter(|p| p.0 != 0) {
            return Err(ApiError::param(
                "priority",
                format!("'priority: {p}' is not supported by kvgate (no priority scheduling); only 0 is accepted"),
            ));
        }
        if let Some(Int(r)) = self.data_parallel_rank.filter(|r| r.0 != 0) {
            return Err(ApiError::param(
                "data_parallel_rank",
                format!("'data_parallel_rank: {r}' does not exist: a kvgate replica has one engine (rank 0)"),
            ));
        }
        if let Some(l) = self.length_penalty.filter(|&l| l != 1.0) {
            return Err(ApiError::param(
                "length_penalty",
                format!("'length_penalty: {l}' is not supported by kvgate (no beam search); only 1.0 is accepted"),
            ));
        }
        let refused = [
            ("truncate_prompt_tokens", self.truncate_prompt_tokens.is_some()),
            ("request_id", self.request_id.is_some()),
            ("kv_transfer_params", self.kv_transfer_params.is_some()),
            ("vllm_xargs", self.vllm_xargs.is_some()),
            ("logits_processors", self.logits_processors.is_some()),
            ("mm_processor_kwargs", self.mm_processor_kwargs.is_some()),
            ("chat_template", self.chat_template.is_some()),
            ("documents", self.documents.is_some()),
            ("prompt_embeds", self.prompt_embeds.is_some()),
            ("structural_tag", self.structural_tag.is_some()),
            ("lora_request", self.lora_request.is_some()),
            ("thinking_token_budget", self.thinking_token_budget.is_some()),
        ];
        match refused.iter().find(|(_, set)| *set) {
            Some((k, _)) => Err(ApiError::param(k, format!("'{k}' is not supported by kvgate"))),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;
    use crate::pipeline::openai::request::typed;

    /// An endpoint that adds no special tokens (chat's rule).
    struct ChatFields;
    impl EndpointFields for ChatFields {
        const ADD_SPECIAL_TOKENS: bool = false;
    }

    /// An endpoint that adds them (completions' rule).
    struct CompletionFields;
    impl EndpointFields for CompletionFields {
        const ADD_SPECIAL_TOKENS: bool = true;
    }

    fn check<E: EndpointFields>(v: Value) -> Result<(), String> {
        let f: VllmFields = typed(&v).map_err(|e| e.to_string())?;
        f.check::<E>().map_err(|e| e.to_string())
    }

    #[test]
    fn router_defaults_pass_and_other_values_are_named() {
        // What vllm-router 0.1.17 adds to every chat and completion.
        let chat = json!({"no_stop_trim": false, "return_hidden_states": false});
        assert_eq!(check::<ChatFields>(chat), Ok(()));
        assert_eq!(check::<CompletionFields>(json!({"add_special_tokens": true})), Ok(()));
        assert_eq!(
            check::<ChatFields>(json!({"add_special_tokens": false, "priority": 0})),
            Ok(())
        );
        assert_eq!(
            check::<ChatFields>(json!({"length_penalty": 1.0, "request_id": null})),
            Ok(())
        );
        for (body, named) in [
            (json!({"no_stop_trim": true}), "'no_stop_trim: true'"),
            (json!({"return_hidden_states": true}), "'return_hidden_states: true'"),
            (
                json!({"spaces_between_special_tokens": false}),
                "spaces_between_special_tokens",
            ),
            (json!({"priority": 3}), "'priority: 3'"),
            (json!({"data_parallel_rank": 1}), "'data_parallel_rank: 1'"),
            (json!({"length_penalty": 0.5}), "'length_penalty: 0.5'"),
            (json!({"truncate_prompt_tokens": 8}), "'truncate_prompt_tokens'"),
            (json!({"kv_transfer_params": {}}), "'kv_transfer_params'"),
            (json!({"chat_template": "{{x}}"}), "'chat_template'"),
        ] {
            let e = check::<ChatFields>(body.clone()).unwrap_err();
            assert!(e.contains(named), "{body}: {e}");
        }
        let e = check::<ChatFields>(json!({"add_special_tokens": true})).unwrap_err();
        assert!(e.contains("only false"), "{e}");
        let e = check::<CompletionFields>(json!({"add_special_tokens": false})).unwrap_err();
        assert!(e.contains("only true"), "{e}");
    }
}
