//! Tool calls out of a token stream: text is released as content until a `<tool_call>` opens (a
//! possible start of one is held back), a call is released whole once its `</tool_call>` arrives, and
//! an output that starts as bare JSON (or a code fence) is held to the end and then read as calls or
//! as content.

use super::{ParsedCall, ToolSpec, CLOSE, OPEN};

/// What the stream releases.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    /// Content text.
    Content(String),
    /// A complete call.
    Call(ParsedCall),
}

/// One choice's tool-call stream.
#[derive(Debug, Default)]
pub struct CallStream {
    buf: String,
    in_call: bool,
    bare: Option<bool>,
    calls: usize,
}

/// The length of the longest suffix of `s` that is a proper prefix of `pat`.
fn partial_suffix(s: &str, pat: &str) -> usize {
    (1..pat.len().min(s.len() + 1))
        .rev()
        .find(|&k| s.is_char_boundary(s.len() - k) && pat.starts_with(&s[s.len() - k..]))
        .unwrap_or(0)
}

impl CallStream {
    /// Calls released so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    fn content(&self, s: &str, out: &mut Vec<Piece>) {
        let blank_after_call = self.calls > 0 && s.trim().is_empty();
        if !s.is_empty() && !blank_after_call {
            out.push(Piece::Content(s.to_string()));
        }
    }

    fn call(&mut self, spec: &ToolSpec, body: &str, out: &mut Vec<Piece>) {
        match spec.call_of(body.trim()) {
            Some(c) => {
                self.calls += 1;
                out.push(Piece::Call(c));
            }
            None => self.content(&format!("{OPEN}{body}"), out),
        }
    }

    /// Adds a text delta; returns what became final.
    pub fn push(&mut self, spec: &ToolSpec, text: &str) -> Vec<Piece> {
        self.buf.push_str(text);
        let mut out = vec![];
        if self.bare.is_none() {
            let t = self.buf.trim_start();
            if t.is_empty() {
                return out;
            }
            if "```".starts_with(t) {
                return out;
            }
            self.bare = Some(super::may_be_bare(t));
        }
        if self.bare == Some(true) {
            return out;
        }
        loop {
            if self.in_call {
                let Some(end) = self.buf.find(CLOSE) else { break };
                let body = self.buf[..end].to_string();
                self.buf.drain(..end + CLOSE.len());
                self.in_call = false;
                self.call(spec, &body, &mut out);
                if out.last().is_some_and(|p| matches!(p, Piece::Content(_))) {
                    if let Some(Piece::Content(c)) = out.last_mut() {
                        c.push_str(CLOSE);
                    }
                }
            } else if let Some(start) = self.buf.find(OPEN) {
                let before = self.buf[..start].to_string();
                self.content(&before, &mut out);
                self.buf.drain(..start + OPEN.len());
                self.in_call = true;
            } else {
                let keep = partial_suffix(&self.buf, OPEN);
                let release = self.buf[..self.buf.len() - keep].to_string();
                self.content(&release, &mut out);
                self.buf.drain(..self.buf.len() - keep);
                break;
            }
        }
        out
    }

    /// The end of the output: whatever is held back.
    pub fn finish(&mut self, spec: &ToolSpec) -> Vec<Piece> {
        let buf = std::mem::take(&mut self.buf);
        let mut out = vec![];
        if self.bare == Some(true) {
            match spec.bare_json(buf.trim()) {
                Some(calls) => {
                    self.calls += calls.len();
                    out.extend(calls.into_iter().map(Piece::Call));
                }
                None => self.content(&buf, &mut out),
            }
        } else if self.in_call {
            // an unclosed call: taken when it parses, dropped when it was cut off
            self.in_call = false;
            if let Some(c) = spec.call_of(buf.trim()) {
                self.calls += 1;
                out.push(Piece::Call(c));
            }
        } else {
            self.content(&buf, &mut out);
        }
        out
    }
}
