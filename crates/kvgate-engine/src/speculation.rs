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
//! with the same vocabulary proposes its greedy continuation, verified the same way, while it is
//! confident of it (its own probability of the proposal so far at least `draft_p_min`). Both in one configuration ([`SpecMethod::LookupThenDraft`]): prompt lookup where
//! the sequence's context holds a match (an agent's edits), the draft where it does not (free text).
//!
//! Each sequence adapts its own proposal length to what it keeps ([`next_len`]); while more sequences
//! decode than `max_batch`, a sequence speculates only while its proposals are kept ([`Keep`]).
//!
//! This module is pure: the configuration, the proposer, the adaptive proposal length, the
//! per-sequence keep rate and the draft's context window.

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
    /// Prompt lookup when the sequence's context holds a match, else the draft model.
    LookupThenDraft,
}

impl SpecMethod {
    /// Whether a draft model proposes (alone or after the lookup).
    pub fn drafts(self) -> bool {
        matches!(self, SpecMethod::DraftModel | SpecMethod::LookupThenDraft)
    }

    /// Whether prompt lookup proposes (alone or before the draft).
    pub fn looks_up(self) -> bool {
        matches!(self, SpecMethod::Ngram | SpecMethod::LookupThenDraft)
    }
}

/// The speculation settings (`--speculative-config`, vLLM's JSON, parsed at the edge).
#[derive(Debug, Clone, Copy, PartialEq)]
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
    /// Past it a sequence still speculates while its proposals are kept ([`Keep`]).
    pub max_batch: usize,
    /// A proposal ends where the draft model's own probability of it (the product of its tokens')
    /// would fall below this (`draft_p_min`; 0 never ends one early). Unlike llama.cpp's
    /// `--draft-p-min`, which looks at each token alone, a proposal's fourth token is weighed by the
    /// chance that all four are kept — the only case in which its pass and its row pay.
    pub draft_p_min: f32,
    /// Most tokens of a prompt's end the draft model reads (`draft_window`, see [`draft_start`]).
    pub draft_window: usize,
    /// The most of a prompt the draft model reads, in tenths ([`DRAFT_PROMPT_SHARE`] in `serve`; 10
    /// reads whole prompts up to the window).
    pub draft_share: usize,
    /// Most prompt-lookup proposals verified together as a token tree ([`crate::speculation::candidates`];
    /// 1: a single path). Only on a backend with exact token trees, in the rows a step's weight read
    /// computes anyway beside the first proposal.
    pub tree_branches: usize,
}

/// The default `token_tree_branches`.
pub const DEFAULT_TREE_BRANCHES: usize = 4;

/// Most `token_tree_branches`.
pub const MAX_TREE_BRANCHES: usize = 8;

/// The default `draft_p_min`: a proposal's next token pays when the chance that the proposal up to
/// it is kept, times what a target step costs, exceeds what it adds (a draft pass and a verified row)
/// — on 2 cores, Qwen2.5-Coder-1.5B drafted by its 0.5B (the draft's head cut to its first ids),
/// (8.5 + 3.3 ms) ÷ 36 ms ≈ 0.33.
pub const DEFAULT_DRAFT_P_MIN: f32 = 0.35;

/// The default `draft_window`.
pub const DEFAULT_DRAFT_WINDOW: usize = 1024;

/// The share of a prompt (tenths) a draft model reads at most: its prefill then costs about 7% of the
/// target's when the draft is a third of the target's size (Qwen2.5 0.5B for 1.5B), so the time to
/// the first token stays within 10% of decoding without speculation (at 3/10 it measured 1.08–1.10×
/// on ~2,000–2,600-token prompts, at the line; reading 400 instead of 600 tokens of a 2,000-token
/// document kept as many proposals). Prompts of up to
/// [`DRAFT_MIN_WINDOW`] tokens are read whole, after the first token (then they exceed the share: the
/// draft does not follow their prefill, it catches up when it first drafts).
pub const DRAFT_PROMPT_SHARE: usize = 2;

/// Prompts this short are read whole by the draft (see [`DRAFT_PROMPT_SHARE`]).
pub const DRAFT_MIN_WINDOW: usize = 64;

/// Where the draft model's context starts in a sequence first seen with `len` tokens: the last
/// `min(window, max(share/10 · len, 64))` of them ([`DRAFT_PROMPT_SHARE`] tenths in `serve`; 10 reads
/// every prompt whole, up to the window). The draft reads them at positions from 0 (rotary attention
/// sees a document that starts there); its proposals are verified by the target on the whole
/// context, so the window changes how many are kept, never what is emitted.
pub fn draft_start(len: usize, window: usize, share: usize) -> usize {
    let read = (len * share.min(10) / 10).max(DRAFT_MIN_WINDOW.min(len));
    len - read.min(window.max(1)).min(len)
}

/// A sequence's keep rate: how much of its proposals it has been keeping lately (an exponential mean
/// of kept ÷ proposed per verification, starting at 1). While the batch is past `max_batch`, a
/// sequence speculates only at [`Keep::SPECULATES`] or above; one that fell below creeps back up as it
/// decodes without speculating ([`Keep::decoded`]), so it tries again some tokens later.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Keep(pub(crate) f32);

impl Default for Keep {
    fn default() -> Keep {
        Keep(1.0)
    }
}

impl Keep {
    /// The rate from which a sequence speculates past `max_batch`.
    pub(crate) const SPECULATES: f32 = 0.8;

    /// After a verification that kept `accepted` of `proposed`.
    pub(crate) fn verified(self, proposed: usize, accepted: usize) -> Keep {
        if proposed == 0 {
            return self;
        }
        Keep(0.5 * self.0 + 0.5 * accepted as f32 / proposed as f32)
    }

    /// After a token decoded without proposals while the batch was past `max_batch`.
    pub(crate) fn decoded(self) -> Keep {
        Keep((self.0 + 0.05).min(1.0))
    }

    /// Whether it speculates past `max_batch`.
    pub(crate) fn speculates(self) -> bool {
        self.0 >= Self::SPECULATES
    }
}

/// How much a sequence's token trees have been paying lately: an exponential mean, over its tree
/// verifications, of the tokens the other proposals kept beyond what the first would have kept, per
/// row they took (starting at 1). A row of a step costs about a sixth of a one-token step on the
/// CPU at 0.5B (a speculating step of 8 rows, measured: 31 ms against 14 ms for one), so rows that
/// keep fewer than [`Branching::PAYS`] tokens each slow the stream down: below it a sequence proposes
/// one path, and creeps back up as it does ([`Branching::skipped`]) so it tries a tree again later.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Branching(pub(crate) f32);

impl Default for Branching {
    fn default() -> Branching {
        Branching(1.0)
    }
}

impl Branching {
    /// Tokens per row from which a sequence proposes trees.
    pub(crate) const PAYS: f32 = 0.4;

    /// After a tree whose other proposals took `rows` rows and kept `gained` tokens more.
    pub(crate) fn verified(self, rows: usize, gained: usize) -> Branching {
        if rows == 0 {
            return self;
        }
        Branching(0.7 * self.0 + 0.3 * (gained as f32 / rows as f32).min(1.0))
    }

    /// After a proposal that could have been a tree and was kept to one path.
    pub(crate) fn skipped(self) -> Branching {
        Branching((self.0 + 0.02).min(1.0))
    }

    /// Whether it proposes trees.
    pub(crate) fn branches(self) -> bool {
        self.0 >= Self::PAYS
    }
}

/// A speculation setting that cannot be used.
#[derive(Debug, Error, PartialEq)]
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
    /// `draft_p_min` is a probability.
    #[error("draft_p_min must be between 0 and 1, got {0}")]
    PMin(f32),
    /// `draft_window` is at least one token.
    #[error("draft_window must be at least 1 token")]
    Window,
    /// `token_tree_branches` is 1 ..= [`MAX_TREE_BRANCHES`].
    #[error("token_tree_branches must be between 1 and {MAX_TREE_BRANCHES}, got {0}")]
    Branches(usize),
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
    /// Verifications of a token tree (several proposals at once).
    pub trees: u64,
    /// Of those, the ones whose kept path left the first proposal (its rows were moved).
    pub tree_branch_kept: u64,
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
        if !(0.0..=1.0).contains(&self.draft_p_min) {
            return Err(SpecConfigError::PMin(self.draft_p_min));
        }
        if self.draft_window == 0 {
            return Err(SpecConfigError::Window);
        }
        if !(1..=MAX_TREE_BRANCHES).contains(&self.tree_branches) {
            return Err(SpecConfigError::Branches(self.tree_branches));
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
    match occurrences(tokens, min_n, max_n).next() {
        Some(from) => (&tokens[from..(from + k).min(len)], from),
        None => (&[], len),
    }
}

/// Where what followed each earlier occurrence of a suffix of `tokens` starts, for suffix lengths
/// `max_n` down to `min_n` and, for each, the most recent occurrence first: occurrences that end before
/// the suffix starts … and still have a token after them.
fn occurrences(tokens: &[u32], min_n: usize, max_n: usize) -> impl Iterator<Item = usize> + '_ {
    let len = tokens.len();
    (min_n..=max_n).rev().filter(move |&n| len > n).flat_map(move |n| {
        let pattern = &tokens[len - n..];
        (0..len - n)
            .rev()
            .filter(move |&start| tokens[start..start + n] == *pattern)
            .map(move |start| start + n)
    })
}

/// Up to `want` proposals of up to `k` tokens after `tokens` for a token tree: [`propose`]'s first,
/// then what followed other earlier occurrences of the suffixes it looks up (longest suffix first,
/// most recent first), each with where it starts; a proposal another one begins with is skipped.
pub(crate) fn candidates(
    tokens: &[u32],
    cursor: Option<Cursor>,
    min_n: usize,
    max_n: usize,
    k: usize,
    want: usize,
) -> Vec<(&[u32], usize)> {
    let len = tokens.len();
    let first = propose(tokens, cursor, min_n, max_n, k);
    if first.0.is_empty() {
        return vec![];
    }
    let mut out = vec![first];
    if want <= 1 {
        return out;
    }
    for from in occurrences(tokens, min_n, max_n) {
        let next = &tokens[from..(from + k).min(len)];
        if !out.iter().any(|(p, _)| p.starts_with(next)) {
            out.push((next, from));
            if out.len() == want {
                break;
            }
        }
    }
    out
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
            draft_p_min: DEFAULT_DRAFT_P_MIN,
            draft_window: DEFAULT_DRAFT_WINDOW,
            draft_share: DRAFT_PROMPT_SHARE,
            tree_branches: 1,
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

    #[test]
    fn the_draft_reads_a_prompts_end_within_its_share() {
        // short prompts whole, then 2/10 of a prompt, at most the window
        let d = |len, window| draft_start(len, window, DRAFT_PROMPT_SHARE);
        assert_eq!(d(0, 1024), 0);
        assert_eq!(d(40, 1024), 0);
        assert_eq!(d(100, 1024), 100 - 64);
        assert_eq!(d(670, 1024), 670 - 134);
        assert_eq!(d(2600, 1024), 2600 - 520);
        assert_eq!(d(6000, 1024), 6000 - 1024);
        assert_eq!(d(4000, 300), 3700);
        assert_eq!(d(30, 8), 22);
        // a whole share reads up to the window
        assert_eq!(draft_start(4000, usize::MAX, 10), 0);
        assert_eq!(draft_start(4000, 1000, 10), 3000);
    }

    #[test]
    fn a_sequence_speculates_past_the_batch_while_it_keeps_its_proposals() {
        let k = Keep::default();
        assert!(k.speculates());
        // all kept: stays; half kept twice: falls below
        assert!(k.verified(8, 8).speculates());
        let low = k.verified(8, 4).verified(8, 4);
        assert!(!low.speculates());
        assert_eq!(low.verified(0, 0), low);
        // decoding without proposals brings it back after a few tokens
        let mut back = low;
        let mut n = 0;
        while !back.speculates() {
            back = back.decoded();
            n += 1;
        }
        assert!((2..=12).contains(&n), "{n} tokens");
        assert!(Keep(1.0).decoded().0 <= 1.0);
    }
}
