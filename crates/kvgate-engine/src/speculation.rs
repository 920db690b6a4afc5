//! Speculative decoding by prompt lookup (vLLM's `ngram` method, llama.cpp's n-gram lookup): a
//! sequence's next tokens are guessed by finding its last `n` tokens earlier in its own prompt and
//! output and proposing what followed them there. The scheduler runs the proposals as extra rows of
//! the sequence's decode chunk ([`crate::scheduler`]); the request kind verifies them row by row with
//! the sequence's own sampler, so what a sequence emits is exactly what decoding one token per step
//! would emit (greedy: token for token; sampled: the same distribution — for a proposal that is one
//! token, "sample from the target and keep the proposal if they agree" is the standard accept rule,
//! and the rejected rows' residual is the target renormalised without the proposed token).
//!
//! The other method is a draft model ([`SpecMethod::DraftModel`], [`crate::draft`]): a smaller model
//! with the same vocabulary proposes its greedy continuation, verified the same way.
//!
//! This module is pure: the configuration, the proposer, and the adaptive proposal length.

use thiserror::Error;

/// Where proposals come from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SpecMethod {
    /// Prompt lookup (vLLM's `ngram`): the sequence's own tokens.
    #[default]
    Ngram,
    /// A draft model's greedy continuation (vLLM's `draft_model`): the engine is started with the
    /// draft's backend beside the target's.
    DraftModel,
}

/// The speculation settings (`--speculative-config`, vLLM's JSON, parsed at the edge).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecConfig {
    /// Where proposals come from.
    pub method: SpecMethod,
    /// Most tokens proposed per sequence and step (`num_speculative_tokens`).
    pub num_speculative_tokens: usize,
    /// Shortest suffix that is looked up (`prompt_lookup_min`).
    pub prompt_lookup_min: usize,
    /// Longest suffix that is looked up, tried first (`prompt_lookup_max`).
    pub prompt_lookup_max: usize,
    /// Most sequences decoding at once for which a step still speculates: past it a step is
    /// compute-bound and verifying proposals costs more than it saves (`max_batch`, kvgate's own).
    pub max_batch: usize,
}

/// A speculation setting that cannot be used.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SpecConfigError {
    /// `num_speculative_tokens` must be 1 ..= 16.
    #[error("num_speculative_tokens must be between 1 and {max}, got {got}")]
    Tokens {
        /// The largest accepted value.
        max: usize,
        /// The value given.
        got: usize,
    },
    /// `prompt_lookup_min` ≤ `prompt_lookup_max`, both at least 1 and at most 64.
    #[error("prompt_lookup_min ({min}) and prompt_lookup_max ({max}) must satisfy 1 <= min <= max <= 64")]
    Lookup {
        /// `prompt_lookup_min`.
        min: usize,
        /// `prompt_lookup_max`.
        max: usize,
    },
}

/// The largest `num_speculative_tokens` accepted (a decode chunk's rows each carry a logits row).
pub const MAX_SPECULATIVE_TOKENS: usize = 32;

/// Verified proposals so far (vLLM's `spec_decode_*` counters).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Decode chunks that carried proposed tokens.
    pub drafts: u64,
    /// Tokens proposed.
    pub draft_tokens: u64,
    /// Proposed tokens kept.
    pub accepted: u64,
    /// Kept proposals by position (`[i]`: proposals whose token `i` was kept).
    pub accepted_per_pos: [u64; MAX_SPECULATIVE_TOKENS],
}

impl SpecStats {
    /// Records one verification: `accepted` of `proposed` kept.
    pub(crate) fn record(&mut self, proposed: usize, accepted: usize) {
        self.drafts += 1;
        self.draft_tokens += proposed as u64;
        self.accepted += accepted as u64;
        for n in self.accepted_per_pos.iter_mut().take(accepted) {
            *n += 1;
        }
    }
}

impl SpecConfig {
    /// Checks the ranges (the edge parses the JSON, this says whether the values make sense).
    pub fn validate(self) -> Result<SpecConfig, SpecConfigError> {
        if !(1..=MAX_SPECULATIVE_TOKENS).contains(&self.num_speculative_tokens) {
            return Err(SpecConfigError::Tokens {
                max: MAX_SPECULATIVE_TOKENS,
                got: self.num_speculative_tokens,
            });
        }
        let (min, max) = (self.prompt_lookup_min, self.prompt_lookup_max);
        if min == 0 || min > max || max > 64 {
            return Err(SpecConfigError::Lookup { min, max });
        }
        Ok(self)
    }
}

/// Where a sequence's last proposal came from: `from`, the index of its first token in the
/// sequence's own tokens, when the sequence held `len` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cursor {
    pub(crate) from: usize,
    pub(crate) len: usize,
}

/// Up to `k` tokens to propose after `tokens`, and where in `tokens` they start.
///
/// First the copy in progress: when the last proposal came from `cursor` and what the sequence
/// emitted since is what followed there (its last `min_n` tokens end where the copy has got to), the
/// copy goes on from there — in text that repeats itself (code: `return x` in every function) the
/// most recent occurrence of a short suffix is often another place than the one being copied.
/// Otherwise what followed the most recent earlier occurrence of the longest suffix of `tokens`
/// whose length is in `min_n ..= max_n` (longest first); empty when no suffix recurs.
pub(crate) fn propose(tokens: &[u32], cursor: Option<Cursor>, min_n: usize, max_n: usize, k: usize) -> (&[u32], usize) {
    let len = tokens.len();
    if k == 0 || min_n == 0 {
        return (&[], len);
    }
    if let Some(c) = cursor {
        // the copy has got to `at` if the sequence emitted what followed `from`
        let at = c.from + len.saturating_sub(c.len);
        if c.len <= len && at >= min_n && at + min_n <= len && tokens[at - min_n..at] == tokens[len - min_n..] {
            return (&tokens[at..(at + k).min(len)], at);
        }
    }
    for n in (min_n..=max_n).rev() {
        if len <= n {
            continue;
        }
        let pattern = &tokens[len - n..];
        // occurrences that end before the suffix starts … and still have a token after them
        for start in (0..len - n).rev() {
            if tokens[start..start + n] == *pattern {
                let from = start + n;
                return (&tokens[from..(from + k).min(len)], from);
            }
        }
    }
    (&[], len)
}

/// The next proposal length of a sequence from its last verification: `accepted` of `proposed`
/// kept. All kept: the next proposal may be twice as long (up to `max`: text being copied is copied
/// for a while); some rejected: the next is one past what was kept (a proposal that keeps failing
/// shrinks to one token, where a rejection costs one row).
pub(crate) fn next_len(current: usize, proposed: usize, accepted: usize, max: usize) -> usize {
    if proposed == 0 {
        return current.clamp(1, max);
    }
    if accepted >= proposed {
        (current.max(proposed) * 2).min(max)
    } else {
        (accepted + 1).clamp(1, max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_recent_suffix_proposes_what_followed_it() {
        let p = |t: &[u32], min: usize, max: usize, k: usize| propose(t, None, min, max, k).0.to_vec();
        // "a b c d a b c" → the suffix "a b c" occurred at 0, followed by "d a b c"
        let t = [1, 2, 3, 4, 1, 2, 3];
        assert_eq!(p(&t, 1, 3, 2), [4, 1]);
        assert_eq!(propose(&t, None, 1, 3, 10), (&[4, 1, 2, 3][..], 3));
        // the most recent occurrence wins: "x 5 ... x 6 ... x" → after the last earlier "x" comes 6
        let t = [9, 5, 7, 9, 6, 7, 9];
        assert_eq!(p(&t, 1, 1, 1), [6]);
        // a longer suffix beats a more recent shorter one
        let t = [1, 2, 8, 0, 2, 9, 1, 2];
        assert_eq!(p(&t, 1, 2, 1), [8]);
        assert_eq!(p(&t, 1, 1, 1), [9]);
        // nothing recurs
        assert!(p(&[1, 2, 3], 1, 3, 4).is_empty());
        assert!(p(&[], 1, 3, 4).is_empty());
        assert!(p(&[7], 1, 3, 4).is_empty());
        assert!(p(&[7, 7], 1, 3, 0).is_empty());
        // a suffix of min length only
        assert_eq!(p(&[7, 7], 1, 3, 4), [7]);
        assert!(p(&[1, 2, 1, 2], 3, 3, 4).is_empty());
    }

    #[test]
    fn a_copy_in_progress_goes_on_where_it_is() {
        // two functions alike: "r x 1 ; r x 2 ;" then the copy of the first has emitted "r x"
        let mut t = vec![5, 6, 1, 0, 5, 6, 2, 0, 9, 5, 6];
        // the most recent "5 6" is the second function's: without the cursor, 2 comes next
        assert_eq!(propose(&t, None, 2, 2, 2), (&[2, 0][..], 6));
        // the copy started at 0 when the sequence held 9 tokens: it has got to 2, so 1 comes next
        let c = Cursor { from: 0, len: 9 };
        assert_eq!(propose(&t, Some(c), 2, 2, 2), (&[1, 0][..], 2));
        // a sequence that went elsewhere leaves the copy: back to the suffix search
        t.push(3);
        assert_eq!(propose(&t, Some(c), 2, 2, 2).0, &[] as &[u32]);
        t.extend([5, 6]);
        assert_eq!(propose(&t, Some(c), 2, 2, 2), (&[3, 5][..], 11));
    }

    #[test]
    fn proposals_grow_when_kept_and_shrink_when_rejected() {
        assert_eq!(next_len(3, 3, 3, 5), 5);
        assert_eq!(next_len(2, 2, 2, 16), 4);
        assert_eq!(next_len(8, 3, 3, 16), 16);
        assert_eq!(next_len(5, 5, 5, 5), 5);
        assert_eq!(next_len(5, 5, 2, 5), 3);
        assert_eq!(next_len(5, 5, 0, 5), 1);
        assert_eq!(next_len(0, 0, 0, 5), 1);
    }

    #[test]
    fn settings_out_of_range_are_named() {
        let ok = SpecConfig {
            method: SpecMethod::Ngram,
            num_speculative_tokens: 4,
            prompt_lookup_min: 2,
            prompt_lookup_max: 5,
            max_batch: 4,
        };
        assert_eq!(ok.validate(), Ok(ok));
        let e = SpecConfig {
            num_speculative_tokens: 0,
            ..ok
        }
        .validate()
        .unwrap_err();
        assert_eq!(e.to_string(), "num_speculative_tokens must be between 1 and 32, got 0");
        let e = SpecConfig {
            prompt_lookup_min: 6,
            ..ok
        }
        .validate()
        .unwrap_err();
        assert!(e.to_string().contains("(6)"), "{e}");
    }
}
