//! Prompt caching as OpenAI's clients ask for it (openai-python 3.60) on chat and responses:
//! `prompt_cache_options {mode, ttl}`, `prompt_cache_breakpoint {mode: "explicit", ttl?}` on content
//! parts, and `prompt_cache_retention` (accepted; kvgate's retention is its session window).
//!
//! A breakpoint closes its message: the prompt's prefix up to the end of that message (rendered
//! exactly as the request renders it, found by its tokens) is pinned for the breakpoint's `ttl`
//! (else the request's, else 30 minutes) as a keep-alive pin, within the pin caps; a pin released
//! under pressure leaves its blocks cached, so with a second KV tier they move there rather than away.
//! Which are written is OpenAI's rule ([`select`]): in `implicit` mode (the default) the latest three
//! beside the implicit one (kvgate's session retention), in `explicit` mode the latest four and no
//! implicit one.

use std::time::Duration;

use kvgate_model::prompt::Message;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::http::error::ApiError;
use crate::http::state::AppState;
use crate::pipeline::conversation::render_with_tools;
use crate::pipeline::tools::ToolSpec;

/// Breakpoints one request writes.
const WRITES: usize = 4;

/// `prompt_cache_options`.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CacheOptions {
    /// `implicit` (the default) or `explicit`.
    #[serde(default)]
    pub mode: Option<CacheMode>,
    /// The least lifetime of what the request writes.
    #[serde(default)]
    pub ttl: Option<Ttl>,
}

/// How a request writes the prompt cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum CacheMode {
    /// One breakpoint chosen by the server, plus the latest three explicit ones.
    Implicit,
    /// Only the latest four explicit breakpoints.
    Explicit,
}

/// A breakpoint's lifetime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Ttl {
    /// Thirty minutes.
    #[serde(rename = "30m")]
    Minutes30,
    /// Twelve hours.
    #[serde(rename = "12h")]
    Hours12,
}

impl Ttl {
    /// As a duration.
    pub fn duration(self) -> Duration {
        match self {
            Ttl::Minutes30 => Duration::from_secs(30 * 60),
            Ttl::Hours12 => Duration::from_secs(12 * 3600),
        }
    }
}

/// `prompt_cache_breakpoint` on a content part.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Breakpoint {
    /// Always `explicit`.
    #[allow(dead_code)] // checked by its type
    pub mode: BreakpointMode,
    /// Its own lifetime (else the request's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<Ttl>,
}

/// A breakpoint's mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum BreakpointMode {
    /// The only one.
    Explicit,
}

/// `prompt_cache_retention` (deprecated by OpenAI; accepted, kvgate retains by its session window).
#[derive(Debug, Clone, Copy, Deserialize)]
pub(crate) enum Retention {
    /// In memory.
    #[serde(rename = "in_memory")]
    InMemory,
    /// A day.
    #[serde(rename = "24h")]
    Day,
}

/// Messages, and the ones a prompt-cache breakpoint closes (index, the breakpoint's own ttl).
pub(crate) type Marked = (Vec<Message>, Vec<(usize, Option<Ttl>)>);

/// What a request writes: per breakpoint, the index of the message it closes and its lifetime; and
/// whether only those (no session retention).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Writes {
    /// Message index and lifetime, oldest first.
    pub marks: Vec<(usize, Duration)>,
    /// Explicit mode: no implicit retention.
    pub only: bool,
}

/// OpenAI's choice among the marked messages (index, own ttl), in message order.
pub(crate) fn select(marked: &[(usize, Option<Ttl>)], options: Option<&CacheOptions>) -> Writes {
    let mode = options.and_then(|o| o.mode).unwrap_or(CacheMode::Implicit);
    let default_ttl = options.and_then(|o| o.ttl).unwrap_or(Ttl::Minutes30);
    let keep = match mode {
        CacheMode::Explicit => WRITES,
        CacheMode::Implicit => WRITES - 1,
    };
    let mut marks: Vec<(usize, Duration)> = marked
        .iter()
        .map(|&(i, ttl)| (i, ttl.unwrap_or(default_ttl).duration()))
        .collect();
    marks.dedup_by_key(|m| m.0);
    let marks = marks[marks.len().saturating_sub(keep)..].to_vec();
    Writes {
        marks,
        only: mode == CacheMode::Explicit,
    }
}

/// The prompt-token boundaries of `writes` in `prompt`: each marked message's prefix rendered as the
/// request renders it (no generation prompt), tokenized and matched against the prompt's tokens.
pub(crate) async fn boundaries(
    st: &AppState,
    messages: &[Message],
    writes: &Writes,
    kwargs: &Map<String, Value>,
    tools: Option<&ToolSpec>,
    prompt: &[u32],
) -> Result<Vec<(usize, Duration)>, ApiError> {
    let mut out = Vec::with_capacity(writes.marks.len());
    for &(k, ttl) in &writes.marks {
        let Some(prefix) = messages.get(..=k) else {
            continue;
        };
        let text = render_with_tools(st, prefix, false, false, kwargs, tools)?;
        let ids = st.encode("messages", text, false).await?;
        let n = ids.iter().zip(prompt).take_while(|(a, b)| a == b).count();
        out.push((n, ttl));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_chooses_the_latest_breakpoints() {
        let marked: Vec<(usize, Option<Ttl>)> = (0..6).map(|i| (i, None)).collect();
        let w = select(&marked, None);
        assert_eq!(w.marks.iter().map(|m| m.0).collect::<Vec<_>>(), [3, 4, 5]);
        assert!(!w.only);
        let explicit = CacheOptions {
            mode: Some(CacheMode::Explicit),
            ttl: Some(Ttl::Hours12),
        };
        let w = select(&marked, Some(&explicit));
        assert_eq!(w.marks.iter().map(|m| m.0).collect::<Vec<_>>(), [2, 3, 4, 5]);
        assert_eq!(w.marks[0].1, Duration::from_secs(12 * 3600), "the request's ttl");
        assert!(w.only);
        let own = select(&[(1, Some(Ttl::Hours12)), (1, None), (4, None)], None);
        assert_eq!(
            own.marks,
            [(1, Duration::from_secs(43200)), (4, Duration::from_secs(1800))],
            "a breakpoint's own ttl wins; two on one message are one"
        );
        assert_eq!(
            select(&[], Some(&explicit)),
            Writes {
                marks: vec![],
                only: true
            }
        );
    }
}
