//! The answer of vLLM's render endpoints, `POST /v1/chat/completions/render` and `POST /v1/completions/render`: a
//! request body read exactly as its endpoint reads it (the same checks, the same 400s), answered with
//! the prompt's token ids instead of a generation. Cache-aware routers (vllm-router's `cache_aware`,
//! llm-d's and Dynamo's endpoint pickers) call them on every replica to learn which tokens a request
//! will prefill; without them they pay a 404 and a `/tokenize` per replica per request. The answer has
//! vLLM's shape: for chat one object, for completions a list with one per prompt, each
//! `{request_id, token_ids, sampling_params, model, stream, cache_salt}`.
//! The handlers are chat's and completions' own (`chat::render`, `completions::render`).

use kvgate_engine::SamplingParams;
use serde::Serialize;

/// One rendered prompt (vLLM's `GenerateRequest`).
#[derive(Debug, Serialize)]
pub(crate) struct Rendered {
    pub(crate) request_id: String,
    pub(crate) token_ids: Vec<u32>,
    pub(crate) sampling_params: Sampling,
    pub(crate) model: String,
    pub(crate) stream: bool,
    pub(crate) cache_salt: Option<String>,
}

/// The sampling parameters the generation would run with (vLLM's names).
#[derive(Debug, Serialize)]
pub(crate) struct Sampling {
    n: usize,
    temperature: f32,
    top_p: f32,
    top_k: i64,
    min_p: f32,
    seed: Option<u64>,
    presence_penalty: f32,
    frequency_penalty: f32,
    repetition_penalty: f32,
    max_tokens: usize,
    min_tokens: usize,
    stop: Vec<String>,
    stop_token_ids: Vec<u32>,
    include_stop_str_in_output: bool,
    ignore_eos: bool,
    skip_special_tokens: bool,
    logprobs: Option<usize>,
    prompt_logprobs: Option<usize>,
}

impl From<&SamplingParams> for Sampling {
    fn from(p: &SamplingParams) -> Sampling {
        Sampling {
            n: p.n,
            temperature: p.temperature,
            top_p: p.top_p,
            top_k: if p.top_k == 0 { -1 } else { p.top_k as i64 },
            min_p: p.min_p,
            seed: p.seed,
            presence_penalty: p.presence_penalty,
            frequency_penalty: p.frequency_penalty,
            repetition_penalty: p.repetition_penalty,
            max_tokens: p.max_tokens,
            min_tokens: p.min_tokens,
            stop: p.stop.clone(),
            stop_token_ids: p.stop_token_ids.clone(),
            include_stop_str_in_output: p.include_stop_str_in_output,
            ignore_eos: p.ignore_eos,
            skip_special_tokens: p.skip_special_tokens,
            logprobs: p.logprobs,
            prompt_logprobs: p.prompt_logprobs,
        }
    }
}
