//! The text of one choice as it is generated: incremental detokenization plus stop strings. Text that
//! could still turn into a stop string is held back, so a stream never shows the start of a stop string
//! that is later cut; the concatenation of all deltas equals the final text.

use kvgate_model::{IncrementalDecoder, Tokenizer};

/// Outcome of adding one token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextDelta {
    /// Text that became final.
    pub text: String,
    /// The stop string that matched, when one did (generation must end).
    pub stopped_by: Option<String>,
}

/// Per-choice text state.
#[derive(Debug, Clone)]
pub struct TextState {
    decoder: IncrementalDecoder,
    full: String,
    sent: usize,
    stops: Vec<String>,
    include_stop: bool,
    skip_special: bool,
    done: bool,
}

impl TextState {
    /// Starts with the prompt's tail as decoding context.
    pub fn new(prompt_tail: &[u32], stops: Vec<String>, include_stop: bool, skip_special: bool) -> TextState {
        TextState {
            decoder: IncrementalDecoder::new(prompt_tail),
            full: String::new(),
            sent: 0,
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            include_stop,
            skip_special,
            done: false,
        }
    }

    /// The text so far (including what is held back).
    #[cfg(test)]
    pub fn full_text(&self) -> &str {
        &self.full
    }

    /// Adds a token.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> TextDelta {
        if self.done {
            return TextDelta {
                text: String::new(),
                stopped_by: None,
            };
        }
        let delta = self.decoder.push(tok, id, self.skip_special).unwrap_or_default();
        let before = self.full.len();
        self.full.push_str(&delta);
        // Look for a stop string that ends inside the new text.
        let max_stop = self.stops.iter().map(String::len).max().unwrap_or(0);
        let mut from = before.saturating_sub(max_stop);
        while !self.full.is_char_boundary(from) {
            from -= 1;
        }
        let mut hit: Option<(usize, String)> = None;
        for s in &self.stops {
            if let Some(i) = self.full[from..].find(s.as_str()) {
                let at = from + i;
                if hit.as_ref().is_none_or(|(h, _)| at < *h) {
                    hit = Some((at, s.clone()));
                }
            }
        }
        if let Some((at, s)) = hit {
            let end = if self.include_stop { at + s.len() } else { at };
            self.full.truncate(end);
            self.done = true;
            let text = self.full[self.sent.min(end)..].to_string();
            self.sent = self.full.len();
            return TextDelta {
                text,
                stopped_by: Some(s),
            };
        }
        // Hold back the longest suffix that is a proper prefix of a stop string.
        let mut hold = 0;
        for s in &self.stops {
            for k in (1..s.len()).rev() {
                if k <= self.full.len() && s.is_char_boundary(k) && self.full.ends_with(&s[..k]) {
                    hold = hold.max(k);
                    break;
                }
            }
        }
        let upto = self.full.len() - hold;
        let text = if upto > self.sent {
            let t = self.full[self.sent..upto].to_string();
            self.sent = upto;
            t
        } else {
            String::new()
        };
        TextDelta { text, stopped_by: None }
    }

    /// Everything still held back (at the end of generation).
    pub fn finish(&mut self, tok: &Tokenizer) -> String {
        if !self.done {
            let tail = self.decoder.flush(tok, self.skip_special).unwrap_or_default();
            self.full.push_str(&tail);
            self.done = true;
        }
        let t = self.full[self.sent.min(self.full.len())..].to_string();
        self.sent = self.full.len();
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvgate_model::tiny::tiny_tokenizer;

    fn run(text: &str, stops: &[&str], include: bool) -> (Vec<String>, Option<String>, String) {
        let tok = tiny_tokenizer();
        let ids = tok.encode(text, false).unwrap();
        let mut st = TextState::new(&[], stops.iter().map(|s| s.to_string()).collect(), include, true);
        let mut deltas = vec![];
        for id in ids {
            let d = st.push(&tok, id);
            deltas.push(d.text);
            if d.stopped_by.is_some() {
                return (deltas, d.stopped_by, st.full_text().to_string());
            }
        }
        deltas.push(st.finish(&tok));
        (deltas, None, st.full_text().to_string())
    }

    #[test]
    fn stop_string_cuts_and_never_leaks() {
        let (deltas, stop, full) = run("hello world. STOP here", &["STOP"], false);
        assert_eq!(stop.as_deref(), Some("STOP"));
        assert_eq!(full, "hello world. ");
        assert_eq!(deltas.concat(), full);
        assert!(deltas.iter().all(|d| !d.contains('S')));
        let (_, _, full) = run("hello world. STOP here", &["STOP"], true);
        assert_eq!(full, "hello world. STOP");
    }

    #[test]
    fn held_text_is_released_when_it_does_not_match() {
        let (deltas, stop, full) = run("a ST b", &["STOP"], false);
        assert_eq!(stop, None);
        assert_eq!(full, "a ST b");
        assert_eq!(deltas.concat(), "a ST b");
    }

    #[test]
    fn multibyte_text_streams_whole() {
        let (deltas, _, full) = run("née 🚀 ok", &[], false);
        assert_eq!(full, "née 🚀 ok");
        assert_eq!(deltas.concat(), full);
        assert!(deltas.iter().all(|d| !d.contains('\u{FFFD}')));
    }
}
