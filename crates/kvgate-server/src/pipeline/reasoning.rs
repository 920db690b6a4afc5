//! Reasoning out of a token stream, for models that think (Qwen3, QwQ, DeepSeek-R1 style): the text
//! between `<think>` and `</think>` is the reasoning, the rest is the answer. The output thinks when it
//! opens with `<think>` (after blanks), or when the rendered prompt already opened it (a template that
//! ends the generation prompt with `<think>`, as DeepSeek-R1's does); a reasoning cut off by the limit
//! stays reasoning. A possible start of a tag is held back until it is known, so deltas never split a
//! tag. Chat reports it as `reasoning_content` and `reasoning` (clients read either), the Responses API
//! as a `reasoning` item; `include_reasoning: false` drops it, `separate_reasoning: false` leaves the
//! text whole.

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// What the splitter releases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Split {
    /// Reasoning text.
    Reasoning(String),
    /// Answer text.
    Content(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing but blanks yet: an opening `<think>` may come.
    Start,
    Inside,
    /// Just closed: the blanks before the answer are skipped.
    Closed,
    After,
}

/// One choice's splitter.
#[derive(Debug, Clone)]
pub struct ReasoningSplit {
    state: State,
    buf: String,
}

/// The length of the longest suffix of `s` that is a proper prefix of `pat`.
fn partial_suffix(s: &str, pat: &str) -> usize {
    (1..pat.len().min(s.len() + 1))
        .rev()
        .find(|&k| s.is_char_boundary(s.len() - k) && pat.starts_with(&s[s.len() - k..]))
        .unwrap_or(0)
}

impl ReasoningSplit {
    /// The end of a rendered prompt, as much as [`ReasoningSplit::new`] reads of it.
    pub fn tail_of(prompt: &str) -> String {
        prompt[prompt.floor_char_boundary(prompt.len().saturating_sub(32))..].to_string()
    }

    /// A splitter for an output whose prompt ends as `prompt_tail` (it may have opened the thinking).
    pub fn new(prompt_tail: &str) -> ReasoningSplit {
        let opened = prompt_tail.trim_end().ends_with(OPEN);
        ReasoningSplit {
            state: if opened { State::Inside } else { State::Start },
            buf: String::new(),
        }
    }

    /// Adds a text delta; returns what became final.
    pub fn push(&mut self, text: &str) -> Vec<Split> {
        self.buf.push_str(text);
        let mut out = vec![];
        loop {
            match self.state {
                State::Start => {
                    let t = self.buf.trim_start();
                    if t.is_empty() || (OPEN.starts_with(t) && t.len() < OPEN.len()) {
                        break;
                    }
                    if let Some(rest) = t.strip_prefix(OPEN) {
                        self.buf = rest.to_string();
                        self.state = State::Inside;
                    } else {
                        self.state = State::After;
                    }
                }
                State::Inside => match self.buf.find(CLOSE) {
                    Some(end) => {
                        let r = self.buf[..end].to_string();
                        self.buf.drain(..end + CLOSE.len());
                        push(&mut out, Split::Reasoning(r));
                        self.state = State::Closed;
                    }
                    None => {
                        let keep = partial_suffix(&self.buf, CLOSE);
                        let r: String = self.buf.drain(..self.buf.len() - keep).collect();
                        push(&mut out, Split::Reasoning(r));
                        break;
                    }
                },
                State::Closed => {
                    // the answer starts after the blank line that usually follows
                    let t = self.buf.trim_start().to_string();
                    self.buf = t;
                    if self.buf.is_empty() {
                        break;
                    }
                    self.state = State::After;
                }
                State::After => {
                    let c = std::mem::take(&mut self.buf);
                    push(&mut out, Split::Content(c));
                    break;
                }
            }
        }
        out
    }

    /// The end of the output: whatever is held back.
    pub fn finish(&mut self) -> Vec<Split> {
        let rest = std::mem::take(&mut self.buf);
        let mut out = vec![];
        match self.state {
            State::Inside => push(&mut out, Split::Reasoning(rest)),
            State::Closed => {}
            State::Start | State::After => push(&mut out, Split::Content(rest)),
        }
        out
    }

    /// A whole output split at once: (reasoning, answer).
    pub fn whole(prompt_tail: &str, text: &str) -> (Option<String>, String) {
        let mut s = ReasoningSplit::new(prompt_tail);
        let mut parts = s.push(text);
        parts.extend(s.finish());
        let (mut r, mut c) = (None::<String>, String::new());
        for p in parts {
            match p {
                Split::Reasoning(t) => r.get_or_insert_with(String::new).push_str(&t),
                Split::Content(t) => c.push_str(&t),
            }
        }
        (r, c)
    }
}

fn push(out: &mut Vec<Split>, s: Split) {
    match &s {
        Split::Reasoning(t) | Split::Content(t) if t.is_empty() => {}
        _ => out.push(s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_at_every_cut() {
        let cases = [
            (
                "",
                "<think>\nWeigh it.\n</think>\n\nYes.",
                (Some("\nWeigh it.\n"), "Yes."),
            ),
            ("", "  <think>a</think>b", (Some("a"), "b")),
            ("", "No thinking here.", (None, "No thinking here.")),
            ("", "<thin", (None, "<thin")),
            ("<think>\n", "Weigh it.</think>Yes.", (Some("Weigh it."), "Yes.")),
            ("", "<think>cut off by the limit", (Some("cut off by the limit"), "")),
            ("", "<think>a</thi", (Some("a</thi"), "")),
        ];
        for (tail, text, (r, c)) in cases {
            let want = (r.map(str::to_string), c.to_string());
            assert_eq!(ReasoningSplit::whole(tail, text), want, "{text:?}");
            for step in 1..5 {
                let mut s = ReasoningSplit::new(tail);
                let mut parts = vec![];
                let chars: Vec<char> = text.chars().collect();
                for ch in chars.chunks(step) {
                    parts.extend(s.push(&ch.iter().collect::<String>()));
                }
                parts.extend(s.finish());
                let (mut gr, mut gc) = (None::<String>, String::new());
                for p in parts {
                    match p {
                        Split::Reasoning(t) => gr.get_or_insert_with(String::new).push_str(&t),
                        Split::Content(t) => gc.push_str(&t),
                    }
                }
                assert_eq!((gr, gc), want, "{text:?} by {step}");
            }
        }
    }
}
