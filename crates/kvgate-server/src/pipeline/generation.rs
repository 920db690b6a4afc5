//! The request half of the shared pipeline: what every generating protocol's parser produces — one
//! typed [`Generation`] (the prompts' tokens, sampling and streaming as read, the guide to compile,
//! the session hint) — and the one [`submit`] that compiles the guide, salts the prefix cache by
//! tenant, asks for session retention and hands one engine request per prompt to the engine. The
//! response half is [`crate::pipeline::openai::respond`] with each protocol's `Shape`: a new protocol is a
//! parser to a `Generation` and a `Shape`.

use axum::http::HeaderMap;
use kvgate_engine::GenerateRequest;
use kvgate_grammar::GrammarSpec;

use crate::http::error::ApiError;
use crate::http::state::AppState;
use crate::pipeline::events::{submit_all, Tagged};
use crate::pipeline::openai::respond::StreamUsage;
use crate::pipeline::sampling::Common;
use crate::pipeline::structured;

/// A generation as a protocol's parser reads it.
pub(crate) struct Generation {
    /// Each prompt's token ids (one engine request each; `n` choices per prompt).
    pub(crate) prompts: Vec<Vec<u32>>,
    /// Sampling, streaming, usage options and the request's own `cache_salt`.
    pub(crate) sampling: Common,
    /// A structured output or a forced tool call, with the field it came from, to compile.
    pub(crate) guide: Option<(&'static str, GrammarSpec)>,
    /// The session hint (`prompt_cache_key`, or a stored response's id) that asks for retention.
    pub(crate) session: Option<String>,
    /// Prompt-cache breakpoints ([`crate::pipeline::cache`]): prompt prefixes (tokens) to keep, and
    /// for how long.
    pub(crate) breakpoints: Vec<(usize, std::time::Duration)>,
    /// Explicit caching mode: only the breakpoints are kept (no session retention).
    pub(crate) breakpoints_only: bool,
}

/// A generation handed to the engine.
pub(crate) struct Submitted {
    /// Each prompt's event stream, tagged with its index.
    pub(crate) tagged: Vec<Tagged>,
    /// The sampling as submitted (guide compiled, salt applied).
    pub(crate) sampling: Common,
    /// Prompt tokens over all prompts.
    pub(crate) prompt_tokens: usize,
}

impl Submitted {
    /// The stream's usage options, when it streams.
    pub(crate) fn stream_usage(&self) -> Option<StreamUsage> {
        self.sampling.stream.then_some(StreamUsage {
            include: self.sampling.include_usage,
            continuous: self.sampling.continuous_usage,
            prompt_tokens: self.prompt_tokens,
        })
    }
}

/// Compiles `g`'s guide, salts it for `tenant`, asks for retention when a session hint (or an
/// `X-Session-ID` header) is there (not in explicit caching mode) and for its breakpoints' pins, and
/// submits one engine request per prompt.
pub(crate) async fn submit(
    st: &AppState,
    headers: &HeaderMap,
    tenant: Option<u32>,
    g: Generation,
) -> Result<Submitted, ApiError> {
    submit_owned(st, headers, tenant, g, None).await
}

/// As [`submit`], the retained state held by `owner` too (a WebSocket connection: released when it
/// closes, `Inference::release_retained`).
pub(crate) async fn submit_owned(
    st: &AppState,
    headers: &HeaderMap,
    tenant: Option<u32>,
    g: Generation,
    owner: Option<u64>,
) -> Result<Submitted, ApiError> {
    let Generation {
        prompts,
        mut sampling,
        guide,
        session,
        breakpoints,
        breakpoints_only,
    } = g;
    if let Some((field, spec)) = guide {
        sampling.params.guide = Some(structured::compile(st.grammars().await, field, spec).await?);
    }
    sampling.cache_salt = st.salted(tenant, sampling.cache_salt.take());
    let retain = if breakpoints_only {
        None
    } else {
        st.retain_for(headers, session.as_deref(), tenant)
            .map(|r| kvgate_engine::Retain { owner, ..r })
    };
    let prompt_tokens = prompts.iter().map(Vec::len).sum();
    let reqs = prompts
        .into_iter()
        .map(|prompt| GenerateRequest {
            prompt,
            params: sampling.params.clone(),
            cache_salt: sampling.cache_salt.clone(),
            retain,
            breakpoints: breakpoints.clone(),
        })
        .collect();
    let tagged = submit_all(st, reqs)?;
    Ok(Submitted {
        tagged,
        sampling,
        prompt_tokens,
    })
}
