//! Turning engine event streams into OpenAI responses: submission, non-streaming aggregation, and the
//! merged event stream of several prompts (completions accept a list of prompts; choice index =
//! prompt index · n + choice).

use futures::stream::{self, BoxStream, StreamExt};
use kvgate_engine::{EngineError, Event, FinishReason, GenerateRequest, RequestStream, StopMatch, TokenLogprob, Usage};

use crate::http::error::ApiError;
use crate::http::state::AppState;

/// One finished choice.
#[derive(Debug, Clone, Default)]
pub struct ChoiceOut {
    /// Its text.
    pub text: String,
    /// Its tokens.
    pub tokens: Vec<u32>,
    /// Per token logprobs, when asked.
    pub logprobs: Vec<TokenLogprob>,
    /// Why it ended.
    pub finish: Option<FinishReason>,
    /// What stopped it.
    pub stop: Option<StopMatch>,
}

/// A submitted prompt's stream, tagged with the prompt's index.
pub struct Tagged {
    /// Index of the prompt.
    pub prompt: usize,
    /// Its events.
    pub stream: RequestStream,
}

/// Submits one generate request per prompt. A refused submission fails the whole call (earlier streams
/// are dropped, which aborts them).
pub fn submit_all(st: &AppState, reqs: Vec<GenerateRequest>) -> Result<Vec<Tagged>, ApiError> {
    reqs.into_iter()
        .enumerate()
        .map(|(i, r)| {
            st.engine()
                .generate(r)
                .map(|s| Tagged { prompt: i, stream: s })
                .map_err(ApiError::from)
        })
        .collect()
}

/// Waits for every prompt to finish: choices in order (prompt-major), prompt logprobs per prompt, and
/// the summed usage.
pub async fn collect(
    tagged: Vec<Tagged>,
    n: usize,
) -> Result<(Vec<ChoiceOut>, Vec<Option<Vec<Option<TokenLogprob>>>>, Usage), ApiError> {
    let prompts = tagged.len();
    let mut choices = vec![ChoiceOut::default(); prompts * n];
    let mut prompt_lps = vec![None; prompts];
    let mut usage = Usage::default();
    for mut t in tagged {
        loop {
            let Some(ev) = t.stream.next().await else {
                return Err(ApiError::Unavailable("the engine stopped".into()));
            };
            match ev {
                Event::Token {
                    choice,
                    token,
                    text,
                    logprob,
                } => {
                    let c = &mut choices[t.prompt * n + choice];
                    c.text.push_str(&text);
                    c.tokens.push(token);
                    if let Some(l) = logprob {
                        c.logprobs.push(l);
                    }
                }
                Event::Finished {
                    choice,
                    reason,
                    text,
                    stop,
                } => {
                    let c = &mut choices[t.prompt * n + choice];
                    c.text.push_str(&text);
                    c.finish = Some(reason);
                    c.stop = stop;
                }
                Event::PromptLogprobs(l) => prompt_lps[t.prompt] = Some(l),
                Event::Done(u) => {
                    usage.add(&u);
                    break;
                }
                Event::Error(e) => return Err(e.into()),
            }
        }
    }
    Ok((choices, prompt_lps, usage))
}

/// All prompts' events merged into one stream of (prompt index, event), ending after each prompt's
/// terminal event (an `EngineDead` error when its stream ended without one).
pub fn merged(tagged: Vec<Tagged>) -> BoxStream<'static, (usize, Event)> {
    let streams = tagged.into_iter().map(|t| {
        stream::unfold(Some(t), |state| async move {
            let mut t = state?;
            // A stream that ends without its terminal event (the engine died mid-request) ends with
            // an error event, never silently.
            let ev = t.stream.next().await.unwrap_or(Event::Error(EngineError::EngineDead));
            let terminal = matches!(ev, Event::Done(_) | Event::Error(_));
            let item = (t.prompt, ev);
            Some((item, if terminal { None } else { Some(t) }))
        })
        .boxed()
    });
    stream::select_all(streams).boxed()
}

/// Frames chunks (each with its SSE event name, if any) as Server-Sent Events, ending with `data:
/// [DONE]` when `done_marker`.
pub fn sse_named<S>(chunks: S, done_marker: bool) -> axum::response::Response
where
    S: futures::Stream<Item = Vec<(Option<&'static str>, String)>> + Send + 'static,
{
    use axum::response::sse::{Event as SseEvent, Sse};
    use axum::response::IntoResponse;
    let events = chunks
        .flat_map(|values| {
            stream::iter(values.into_iter().map(|(name, v)| {
                // `event:` first, as OpenAI writes it
                let e = match name {
                    Some(n) => SseEvent::default().event(n),
                    None => SseEvent::default(),
                };
                Ok::<_, std::convert::Infallible>(e.data(v))
            }))
        })
        .chain(stream::iter(
            done_marker.then(|| Ok(SseEvent::default().data("[DONE]"))),
        ));
    Sse::new(events).into_response()
}
