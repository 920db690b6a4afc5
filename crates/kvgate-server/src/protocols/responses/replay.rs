//! The events of background responses, kept so that a client can stream one — from its start, or
//! resumed after the last event it saw (`GET /v1/responses/{id}?stream=true&starting_after=N`, and
//! `background: true` with `stream: true` at create) — while it runs and after it ended, as long as
//! its log is kept (per API key, bounded like the store). One writer (the background run) appends
//! through a [`Recorder`]; every reader follows a `watch` receiver of the same log, so a reader never
//! blocks the run and sees every event exactly once, in order.

use std::sync::Arc;

use axum::response::Response;
use futures::stream::{self, StreamExt};
use tokio::sync::watch;

use crate::pipeline::events::sse_named;

/// One event: its SSE name and its JSON.
type Entry = (Option<&'static str>, Arc<str>);

/// A background response's events so far, and whether there will be more.
#[derive(Debug, Clone, Default)]
pub(crate) struct Log {
    events: Vec<Entry>,
    ended: bool,
}

/// A log being read: a receiver of its updates.
pub(crate) type Replay = watch::Receiver<Log>;

/// The writer's end of a log; the log ends when it is dropped.
pub(crate) struct Recorder(watch::Sender<Log>);

impl Drop for Recorder {
    fn drop(&mut self) {
        self.0.send_modify(|l| l.ended = true);
    }
}

impl Recorder {
    /// Appends the events of one step.
    pub(crate) fn push(&self, batch: Vec<(Option<&'static str>, String)>) {
        if batch.is_empty() {
            return;
        }
        self.0
            .send_modify(|l| l.events.extend(batch.into_iter().map(|(n, j)| (n, Arc::from(j)))));
    }
}

/// A new log: its writer and a reader.
pub(crate) fn channel() -> (Recorder, Replay) {
    let (tx, rx) = watch::channel(Log::default());
    (Recorder(tx), rx)
}

/// The bytes a kept log is counted as in its bound (its events are not known when it is kept).
pub(crate) fn size(_: &Replay) -> usize {
    4096
}

/// The log's events after the `after`-th (all of them when `None`), as SSE, following the log until
/// it ends. Events are numbered from 0 in the order they went out (their `sequence_number`).
pub(crate) fn stream(rx: Replay, after: Option<usize>) -> Response {
    let start = after.map_or(0, |n| n + 1);
    let events = stream::unfold((rx, start, false), |(mut rx, cursor, done)| async move {
        if done {
            return None;
        }
        loop {
            let (batch, ended) = {
                let log = rx.borrow_and_update();
                let batch: Vec<(Option<&'static str>, String)> = log
                    .events
                    .iter()
                    .skip(cursor)
                    .map(|(n, j)| (*n, j.to_string()))
                    .collect();
                (batch, log.ended)
            };
            if !batch.is_empty() || ended {
                let next = cursor + batch.len();
                return Some((batch, (rx, next, ended)));
            }
            if rx.changed().await.is_err() {
                return Some((vec![], (rx, cursor, true)));
            }
        }
    });
    sse_named(events.boxed(), false)
}
