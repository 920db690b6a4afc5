//! One response pipeline for the OpenAI protocols: a protocol says how engine events become its wire
//! (a [`Shape`]: the chunks of a token and of a finish, the usage chunk, the whole body), and
//! [`respond`] does the rest for all of them — wait for every prompt and build the body, or stream:
//! merge the prompts' events, count tokens, sum usage over prompts and send it after the last one
//! (`include_usage`), stamp running usage on every chunk (`continuous_usage_stats`), turn an engine
//! error into the error event, frame it all as SSE. Completions and chat completions are two shapes;
//! `/v1/responses` is a third.

use axum::response::{IntoResponse, Response};
use futures::stream::{BoxStream, StreamExt};
use kvgate_engine::{EngineError, Event, FinishReason, StopMatch, TokenLogprob, Usage};
use serde::Serialize;

use crate::http::error::ApiError;
use crate::pipeline::events::{collect, merged, sse_named, ChoiceOut, Tagged};
use crate::pipeline::openai::response::{to_json, PromptLogprobMap, UsageOut, VllmLogprob};

/// Per prompt, the logprobs of its tokens (when asked).
pub type PromptLogprobs = Vec<Option<Vec<Option<TokenLogprob>>>>;

/// How one protocol writes engine events.
pub trait Shape: Send + 'static {
    /// A streamed chunk.
    type Chunk: Serialize + Send;
    /// The non-streamed body.
    type Body: Serialize;

    /// The chunks of one token of choice `choice` of prompt `prompt`.
    fn token(
        &mut self,
        prompt: usize,
        choice: usize,
        token: u32,
        text: String,
        logprob: Option<TokenLogprob>,
    ) -> Vec<Self::Chunk>;

    /// The chunks that end choice `choice` of prompt `prompt` (`text` is its last delta).
    fn finished(
        &mut self,
        prompt: usize,
        choice: usize,
        reason: FinishReason,
        text: String,
        stop: Option<StopMatch>,
    ) -> Vec<Self::Chunk>;

    /// A prompt's own logprobs arrived (before its first token).
    fn prompt_logprobs(&mut self, _prompt: usize, _lps: Vec<Option<TokenLogprob>>) {}

    /// The last chunk, carrying the whole request's usage.
    fn usage_chunk(&self, usage: UsageOut) -> Self::Chunk;

    /// Gives a chunk that has no usage this running usage.
    fn set_running_usage(chunk: &mut Self::Chunk, usage: UsageOut);

    /// The chunks that end a stream stopped on request before its engine events ended (nothing by
    /// default: only `/v1/responses` can be cancelled).
    fn cancelled(&mut self) -> Vec<Self::Chunk> {
        vec![]
    }

    /// The whole answer: every choice (prompt-major), every prompt's logprobs, the summed usage.
    fn body(self, choices: Vec<ChoiceOut>, prompt_lps: PromptLogprobs, usage: Usage) -> Self::Body;

    /// The chunks a stream opens with.
    fn start(&mut self) -> Vec<Self::Chunk> {
        vec![]
    }

    /// The chunks after the last prompt is done: by default the usage chunk when it was asked for.
    fn end(&mut self, usage: &Usage, include_usage: bool) -> Vec<Self::Chunk> {
        match include_usage {
            true => vec![self.usage_chunk(UsageOut::of(usage))],
            false => vec![],
        }
    }

    /// The chunks a stream ends with when the engine fails it (`None`: the generic error event).
    fn failed(&mut self, _e: &EngineError) -> Option<Vec<Self::Chunk>> {
        None
    }

    /// The SSE event name of a chunk (`None`: a plain `data:` line).
    fn event_name(_chunk: &Self::Chunk) -> Option<&'static str> {
        None
    }

    /// Whether the stream ends with `data: [DONE]`.
    const DONE_MARKER: bool = true;
}

/// What a stream reports of usage.
#[derive(Debug, Clone, Copy)]
pub struct StreamUsage {
    /// A last chunk with the request's usage (`stream_options.include_usage`).
    pub include: bool,
    /// Running usage on every chunk (`stream_options.continuous_usage_stats`).
    pub continuous: bool,
    /// Prompt tokens over all prompts (the running usage's prompt part).
    pub prompt_tokens: usize,
}

impl StreamUsage {
    /// A stream that reports no usage of its own (its shape's closing event carries it).
    pub fn bare(prompt_tokens: usize) -> StreamUsage {
        StreamUsage {
            include: false,
            continuous: false,
            prompt_tokens,
        }
    }
}

/// Answers the submitted prompts in `shape`: a body once all are done, or (with `stream`) SSE.
pub async fn respond<S: Shape>(
    tagged: Vec<Tagged>,
    n: usize,
    stream: Option<StreamUsage>,
    shape: S,
) -> Result<Response, ApiError> {
    respond_until(tagged, n, stream, shape, None).await
}

/// What stops a stream on request (`POST /v1/responses/{id}/cancel`).
pub type Stop = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// A stream's items: an engine event of a prompt, or the end of the events (all in, or stopped).
enum Msg {
    Event(usize, Event),
    End,
}

/// As [`respond`]; a stream also ends when `stop` resolves first, with the shape's
/// [`Shape::cancelled`] chunks (the engine requests are dropped, so aborted, with the stream).
pub async fn respond_until<S: Shape>(
    tagged: Vec<Tagged>,
    n: usize,
    stream: Option<StreamUsage>,
    shape: S,
    stop: Option<Stop>,
) -> Result<Response, ApiError> {
    let Some(u) = stream else {
        let (choices, prompt_lps, usage) = collect(tagged, n).await?;
        return Ok(axum::Json(shape.body(choices, prompt_lps, usage)).into_response());
    };
    Ok(sse_named(chunks(tagged, u, shape, stop), S::DONE_MARKER))
}

/// A stream's chunks, each with its event name, as JSON text, in the order they go out: what
/// [`respond_until`] frames as SSE and a WebSocket sends as text messages. Dropping the stream drops
/// the engine requests (so aborts them).
pub fn chunks<S: Shape>(
    tagged: Vec<Tagged>,
    u: StreamUsage,
    mut shape: S,
    stop: Option<Stop>,
) -> BoxStream<'static, Vec<(Option<&'static str>, String)>> {
    let prompts = tagged.len();
    let (mut done, mut emitted, mut usage) = (0usize, 0usize, Usage::default());
    let mut over = false;
    let opening: Vec<(Option<&'static str>, String)> =
        shape.start().iter().map(|c| (S::event_name(c), to_json(c))).collect();
    let msgs = merged(tagged).map(|(pi, ev)| Msg::Event(pi, ev));
    let msgs = match stop {
        Some(stop) => msgs.take_until(stop).boxed(),
        None => msgs.boxed(),
    };
    let msgs = msgs.chain(futures::stream::once(async { Msg::End }));
    let events = msgs.map(move |msg| {
        let (pi, ev) = match msg {
            Msg::Event(pi, ev) => (pi, ev),
            // every prompt's terminal event already went out, or the stream was stopped
            Msg::End if over => return vec![],
            Msg::End => {
                return shape
                    .cancelled()
                    .iter()
                    .map(|c| (S::event_name(c), to_json(c)))
                    .collect()
            }
        };
        let mut out = match ev {
            Event::Token {
                choice,
                token,
                text,
                logprob,
            } => {
                emitted += 1;
                shape.token(pi, choice, token, text, logprob)
            }
            Event::Finished {
                choice,
                reason,
                text,
                stop,
            } => shape.finished(pi, choice, reason, text, stop),
            Event::PromptLogprobs(l) => {
                shape.prompt_logprobs(pi, l);
                vec![]
            }
            Event::Done(d) => {
                usage.add(&d);
                done += 1;
                over = done == prompts;
                match over {
                    true => shape.end(&usage, u.include),
                    false => vec![],
                }
            }
            Event::Error(e) => {
                over = true;
                match shape.failed(&e) {
                    Some(out) => out,
                    None => return vec![(None, ApiError::from(e).body().to_string())],
                }
            }
        };
        if u.continuous {
            for c in out.iter_mut() {
                S::set_running_usage(c, UsageOut::running(u.prompt_tokens, emitted));
            }
        }
        out.iter().map(|c| (S::event_name(c), to_json(c))).collect()
    });
    futures::stream::once(async move { opening }).chain(events).boxed()
}

/// vLLM's `prompt_logprobs` of one prompt: null at the first position, then per token its own entry
/// and the `k` most likely (rank 1..k), each with its text.
pub fn vllm_prompt_logprobs(
    tok: &kvgate_model::Tokenizer,
    k: usize,
    lps: Option<&Vec<Option<TokenLogprob>>>,
) -> Vec<Option<PromptLogprobMap>> {
    let text = |t: u32| tok.decode(&[t], false).unwrap_or_default();
    lps.map(|v| v.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|lp| {
            let lp = lp.as_ref()?;
            let mut m = PromptLogprobMap::default();
            m.0.push((
                lp.token,
                VllmLogprob {
                    logprob: lp.logprob,
                    rank: lp.rank,
                    decoded_token: text(lp.token),
                },
            ));
            for (i, &(t, l)) in lp.top.iter().take(k).enumerate() {
                if t != lp.token {
                    let entry = VllmLogprob {
                        logprob: l,
                        rank: i + 1,
                        decoded_token: text(t),
                    };
                    m.0.push((t, entry));
                }
            }
            Some(m)
        })
        .collect()
}
