//! The middle both decision wires share (`/v1/systemone`, `/v1/decisions`): once a wire has typed
//! its body into a [`DecisionSpec`], the model is resolved (aliases included), the state is bounded
//! by its bytes before any read renders it, the request is logged when asked, the spec is salted and
//! tagged with its API key's tenant, and the decision service answers. The wires differ only in their
//! parser, the field a too-large state is named by, and their reply.

use kvgate_decide::{Decision, DecisionService, DecisionSpec, State as StateKind};

use crate::http::error::ApiError;
use crate::http::state::AppState;

/// What a wire says of its request besides the spec.
pub(crate) struct DecisionCall<'a> {
    /// The route (`/v1/systemone`), for the message of a model that does not generate.
    pub(crate) route: &'static str,
    /// The body field that holds the state (`state`, `input`).
    pub(crate) state_field: &'static str,
    /// The `model` the request named.
    pub(crate) model: Option<&'a str>,
    /// The API key's tenant.
    pub(crate) tenant: Option<u32>,
    /// The raw body (logged with `--log-requests`).
    pub(crate) body: &'a [u8],
}

/// Decides `spec` as `call` asks; returns the served model's name and the decision.
pub(crate) async fn decide(
    st: &AppState,
    service: &DecisionService,
    mut spec: DecisionSpec,
    call: DecisionCall<'_>,
) -> Result<(String, Decision), ApiError> {
    let model = st.check_decision_model(call.model)?;
    st.check_generates(call.route)?;
    // A state that cannot fit the context by its bytes is refused before any question renders and
    // tokenizes it (each read would).
    let state_bytes = match &spec.state {
        StateKind::Conversation(c) => crate::pipeline::conversation::message_bytes(c),
        StateKind::Text(t) => t.len(),
    };
    st.check_prompt_bytes(call.state_field, state_bytes)?;
    if st.settings().log_requests {
        tracing::info!(route = call.route, body = %String::from_utf8_lossy(call.body), "decision request");
    }
    spec.cache_salt = st.salted(call.tenant, spec.cache_salt.take());
    spec.tenant = call.tenant;
    let decision = service.decide(&spec).await?;
    Ok((model, decision))
}
