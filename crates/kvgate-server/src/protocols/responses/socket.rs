//! The Responses API's WebSocket mode: `GET /v1/responses` upgraded to a WebSocket (openai-python's
//! `client.responses.connect()`, the Agents SDK's WebSocket transport). Each turn is a
//! `response.create` message — the create body without the transport fields (`stream` is implicit,
//! `background` is refused) — answered with exactly the events the SSE stream sends, one JSON text
//! message each; a problem is an `error` event (`{"type": "error", "status", "error"}`) and the
//! connection stays open. Turns on one connection run in order (OpenAI's one lane: a second
//! `response.create` waits for the first to end).
//!
//! The connection is the agent's session: it keeps the last response of each chain it answered,
//! `store: false` included (at most [`super::chains::MAX_CHAINS`]), so `previous_response_id` continues from memory
//! without the store; every turn's KV state is retained for the next as a stored response's is; a
//! continuation that fails evicts what it continued. Authentication is the handshake's (the same
//! keys); a browser's upgrade from an origin not in `--allowed-origins` is refused (403), so a page
//! elsewhere cannot open a socket with the user's credentials; at most `--max-websocket-connections`
//! are open (an upgrade past it gets 429), and a connection idle past `--websocket-idle-timeout` or
//! older than `--websocket-max-age` is closed with 1001 between turns. Whatever way a connection ends — the
//! client closes or vanishes mid-stream, the server shuts down — the turn's stream is dropped, which
//! aborts its engine request, the connection's memory goes with it, and the KV states its turns
//! retained are released (`Retain::owner`: the connection holds them).

use std::collections::VecDeque;
use std::sync::Arc;

use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{close_code, CloseFrame, Message as WsMessage, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::Response;
use futures::stream::{SplitSink, SplitStream};
use futures::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::chains::Chains;
use super::finish;
use super::prepare::{prepare, Prepared};
use super::shape::ResponsesShape;
use super::wire::{ResponseUsage, ResponsesBody, StreamEvent, WithResponse};
use super::{cancel_signal, ResponsesState};
use crate::http::error::{ApiError, SpecError};
use crate::http::middleware::RequestTenant;
use crate::http::settings::SocketLimits;
use crate::pipeline::events::collect;
use crate::pipeline::generation::submit_owned;
use crate::pipeline::openai::request::strict_body;
use crate::pipeline::openai::respond::{chunks, StreamUsage};

/// `GET /v1/responses`: the WebSocket upgrade (anything else is a 400 saying what this route is).
pub async fn connect(
    State(st): State<Arc<ResponsesState>>,
    headers: HeaderMap,
    RequestTenant(tenant): RequestTenant,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, SpecError> {
    let ws = ws.map_err(|e| {
        ApiError::bad(format!(
            "GET /v1/responses is the Responses WebSocket mode and needs a WebSocket upgrade ({e}); create a response with POST /v1/responses"
        ))
    })?;
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("");
        if !st.settings().cors.allows(origin) {
            return Err(ApiError::Forbidden(format!(
                "the origin {origin:?} is not in --allowed-origins: a WebSocket from it is refused"
            ))
            .into());
        }
    }
    st.check_generates("/v1/responses")?;
    let limits = st.settings().sockets;
    let slot = st.open_socket(limits.max).ok_or_else(|| ApiError::TooManyRequests {
        message: format!(
            "{} Responses WebSocket connections are open (--max-websocket-connections); retry later",
            limits.max
        ),
        retry_after: 1,
    })?;
    Ok(ws.on_upgrade(move |socket| async move {
        let _slot = slot;
        serve(st, headers, tenant, socket, limits).await
    }))
}

/// The connection was lost while a message was being sent.
struct Gone;

/// The connection: where events go, where messages come from, and the messages read while a turn
/// streamed (pings are answered as they are read, so a turn longer than the client's keepalive does
/// not look dead; a `response.create` sent meanwhile waits its turn).
struct Conn {
    /// Its id: the retained states of its turns are held by it, and let go when it closes.
    id: u64,
    sink: SplitSink<WebSocket, WsMessage>,
    stream: SplitStream<WebSocket>,
    inbox: VecDeque<WsMessage>,
    closed: bool,
}

impl Conn {
    /// The next message: one read during a turn first.
    async fn next(&mut self) -> Option<Result<WsMessage, axum::Error>> {
        if let Some(m) = self.inbox.pop_front() {
            return Some(Ok(m));
        }
        if self.closed {
            return None;
        }
        self.stream.next().await
    }

    /// Reads what arrives while a turn streams: pings are answered by the read itself; a close or a
    /// lost connection ends the turn; anything else waits in the inbox.
    fn took(&mut self, msg: Option<Result<WsMessage, axum::Error>>) -> Result<(), Gone> {
        match msg {
            Some(Ok(WsMessage::Ping(_) | WsMessage::Pong(_))) => Ok(()),
            Some(Ok(WsMessage::Close(_))) | Some(Err(_)) | None => {
                self.closed = true;
                Err(Gone)
            }
            Some(Ok(m)) => {
                self.inbox.push_back(m);
                Ok(())
            }
        }
    }
}

/// Answers the connection's turns until it closes, sits idle past `--websocket-idle-timeout` or
/// outlives `--websocket-max-age` (both closed with 1001, "going away", between turns).
async fn serve(
    st: Arc<ResponsesState>,
    headers: HeaderMap,
    tenant: Option<u32>,
    socket: WebSocket,
    limits: SocketLimits,
) {
    let (sink, stream) = socket.split();
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let mut conn = Conn {
        id: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        sink,
        stream,
        inbox: VecDeque::new(),
        closed: false,
    };
    let mut chains = Chains::default();
    let end_of_life = Instant::now() + limits.max_age;
    loop {
        let wake = (Instant::now() + limits.idle).min(end_of_life);
        let msg = match tokio::time::timeout_at(wake, conn.next()).await {
            Ok(Some(msg)) => msg,
            Ok(None) => break,
            Err(_) => {
                let reason = match Instant::now() >= end_of_life {
                    true => "the connection reached --websocket-max-age; reconnect",
                    false => "the connection sat idle past --websocket-idle-timeout",
                };
                let frame = CloseFrame {
                    code: close_code::AWAY,
                    reason: reason.into(),
                };
                let _ = conn.sink.send(WsMessage::Close(Some(frame))).await;
                break;
            }
        };
        let text = match msg {
            Ok(WsMessage::Text(t)) => t,
            Ok(WsMessage::Binary(_)) => {
                let e = ApiError::bad("send events as JSON text messages, not binary ones");
                if send(&mut conn, e.socket_event(Some("invalid_event"))).await.is_err() {
                    break;
                }
                continue;
            }
            Ok(WsMessage::Close(_)) | Err(_) => break,
            Ok(_) => continue,
        };
        if turn(&st, &headers, tenant, text.as_str(), &mut chains, &mut conn)
            .await
            .is_err()
        {
            break;
        }
    }
    // however the connection ended, the states its turns retained go with it
    st.engine().release_retained(conn.id);
}

async fn send(conn: &mut Conn, text: String) -> Result<(), Gone> {
    conn.sink.send(WsMessage::Text(text.into())).await.map_err(|_| Gone)
}

/// The body of a `response.create` event and whether it generates (`generate: false`: a warm-up,
/// Codex's start-up prewarm); an error event's error and code otherwise.
fn create_body(text: &str) -> Result<(ResponsesBody, bool), (ApiError, &'static str)> {
    let invalid = |m: String| (ApiError::bad(m), "invalid_event");
    let v: Value = serde_json::from_str(text).map_err(|e| invalid(format!("the event is not valid JSON: {e}")))?;
    let Value::Object(mut map) = v else {
        return Err(invalid("an event is a JSON object with a \"type\"".into()));
    };
    match map.remove("type") {
        Some(Value::String(t)) if t == "response.create" => {}
        Some(Value::String(t)) => {
            return Err((
                ApiError::param(
                    "type",
                    format!("unknown event type {t:?}: this server takes \"response.create\""),
                ),
                "unknown_event_type",
            ))
        }
        _ => return Err(invalid("an event needs a \"type\" (\"response.create\")".into())),
    }
    // transport fields: the socket streams, and a lane is the connection
    map.remove("stream");
    map.remove("stream_id");
    if map.get("background").is_some_and(|b| b.as_bool() == Some(true)) {
        return Err((
            ApiError::param(
                "background",
                "'background' is not supported over a WebSocket; use POST /v1/responses",
            ),
            "invalid_request_error",
        ));
    }
    map.remove("background");
    let generate = match map.remove("generate") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => b,
        Some(_) => {
            return Err((
                ApiError::param("generate", "'generate' must be a boolean"),
                "invalid_request_error",
            ))
        }
    };
    let body = strict_body(map).map_err(|e| (e, "invalid_request_error"))?;
    Ok((body, generate))
}

/// One turn: the create event read and answered with its events. Only a lost connection is an
/// error; every other problem is an `error` event.
async fn turn(
    st: &Arc<ResponsesState>,
    headers: &HeaderMap,
    tenant: Option<u32>,
    text: &str,
    chains: &mut Chains,
    conn: &mut Conn,
) -> Result<(), Gone> {
    if st.settings().log_requests {
        tracing::info!(body = %text, "responses websocket event");
    }
    let (b, generate) = match create_body(text) {
        Ok(b) => b,
        Err((e, code)) => return send(conn, e.socket_event(Some(code))).await,
    };
    let continued = b.previous_response_id.clone();
    let p = match start(st, tenant, &b, chains).await {
        Ok(p) => p,
        Err(e) => {
            let code = match (&e, &continued) {
                (ApiError::NotFound(_), Some(_)) => Some("previous_response_not_found"),
                _ => None,
            };
            // a continuation that fails no longer continues anything
            if let Some(prev) = &continued {
                chains.evict(prev);
            }
            return send(conn, e.socket_event(code)).await;
        }
    };
    if !generate {
        return warm_up(st, headers, tenant, p, chains, continued.as_deref(), conn).await;
    }
    if p.trigger {
        // Codex's remote compaction, as over HTTP: one `compaction` item
        let (response, events, conversation) = match super::compact::trigger(st, headers, p).await {
            Ok(t) => t,
            Err(e) => return send(conn, e.socket_event(None)).await,
        };
        chains.keep(response.id, conversation, continued.as_deref());
        for e in events {
            send(conn, serde_json::to_string(&e).unwrap_or_default()).await?;
        }
        return Ok(());
    }
    let Prepared {
        generation,
        response,
        mut turn,
        prompt_len,
        ..
    } = p;
    let (tx, rx) = oneshot::channel();
    turn.kept.chain = Some(tx);
    let id = response.id.clone();
    let tagged = match submit_owned(st, headers, tenant, generation, Some(conn.id)).await {
        Ok(s) => s.tagged,
        Err(e) => return send(conn, e.socket_event(None)).await,
    };
    let shape = ResponsesShape::new(st.clone(), response, turn);
    // `POST /v1/responses/{id}/cancel` may stop it, as over HTTP
    let stop = cancel_signal(st, tenant, &id);
    let mut events = chunks(tagged, StreamUsage::bare(prompt_len), shape, Some(stop));
    loop {
        let batch = tokio::select! {
            batch = events.next() => batch,
            msg = conn.stream.next(), if !conn.closed => {
                conn.took(msg)?;
                continue;
            }
        };
        let Some(batch) = batch else { break };
        for (_, json) in batch {
            send(conn, json).await?;
        }
    }
    drop(events);
    if let Ok((id, conversation)) = rx.await {
        chains.keep(id, conversation, continued.as_deref());
    }
    Ok(())
}

/// The turn's generation read as a create's, continuing from the connection's chains.
async fn start(
    st: &Arc<ResponsesState>,
    tenant: Option<u32>,
    b: &ResponsesBody,
    chains: &Chains,
) -> Result<Prepared, ApiError> {
    let model = st.check_model(b.model.as_deref())?;
    prepare(st, tenant, b, model, Some(chains)).await
}

/// A `generate: false` turn (a warm-up): the prompt is computed into the cache (one token sampled and
/// dropped) and retained for the turn that continues it; the response has no output. Its events are
/// `response.created` and `response.completed`; the connection keeps it as a chain's end.
async fn warm_up(
    st: &Arc<ResponsesState>,
    headers: &HeaderMap,
    tenant: Option<u32>,
    p: Prepared,
    chains: &mut Chains,
    continued: Option<&str>,
    conn: &mut Conn,
) -> Result<(), Gone> {
    let Prepared {
        mut generation,
        mut response,
        turn,
        ..
    } = p;
    generation.sampling.params.max_tokens = 1;
    generation.sampling.stream = false;
    generation.guide = None;
    let usage = match submit_owned(st, headers, tenant, generation, Some(conn.id)).await {
        Ok(sub) => collect(sub.tagged, 1).await.map(|(_, _, u)| u),
        Err(e) => Err(e),
    };
    let usage = match usage {
        Ok(u) => u,
        Err(e) => return send(conn, e.socket_event(None)).await,
    };
    let opened = response.clone();
    response.status = "completed";
    response.completed_at = Some(crate::ids::now_secs());
    response.usage = Some(ResponseUsage::of(&kvgate_engine::Usage {
        completion_tokens: 0,
        ..usage
    }));
    finish::compacted(st, tenant, &response, turn.kept.conversation.clone());
    chains.keep(response.id.clone(), turn.kept.conversation, continued);
    let with = |response| WithResponse {
        sequence_number: 0,
        response,
    };
    for (i, mut e) in [
        StreamEvent::Created(with(opened)),
        StreamEvent::Completed(with(response)),
    ]
    .into_iter()
    .enumerate()
    {
        e.set_sequence(i);
        send(conn, serde_json::to_string(&e).unwrap_or_default()).await?;
    }
    Ok(())
}
