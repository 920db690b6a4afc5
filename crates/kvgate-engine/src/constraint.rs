//! The engine's seam for constrained decoding (structured outputs, tool calls): a per-choice
//! [`TokenConstraint`] says which tokens may come next and which tokens the grammar forces after a
//! sampled one. The engine computes each constrained choice's mask on a second thread while the
//! forward pass runs, applies it before sampling, and appends forced tokens without sampling them
//! (they are computed by the next step like a short prefill). The engine knows no grammar engine: the
//! server hands it a [`Guide`] (llguidance behind it, see `kvgate-grammar`).
//!
//! Guarantees: a mask only removes tokens (batch invariance: other rows are untouched); a constraint
//! error ends the choice with `stop` and is logged, it never fails the step.

use std::fmt;
use std::sync::Arc;

/// The tokens allowed next: a bitset over token ids (bit `i` of word `i / 32`). Ids past the set's
/// length are disallowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenMask {
    words: Vec<u32>,
}

impl TokenMask {
    /// A mask over `words` (bit `i` of word `i / 32` allows token `i`).
    pub fn from_words(words: Vec<u32>) -> TokenMask {
        TokenMask { words }
    }

    /// A mask allowing exactly `ids`.
    pub fn from_ids(vocab: usize, ids: &[u32]) -> TokenMask {
        let mut words = vec![0u32; vocab.div_ceil(32)];
        for &i in ids {
            if let Some(w) = words.get_mut(i as usize / 32) {
                *w |= 1 << (i % 32);
            }
        }
        TokenMask { words }
    }

    /// Whether token `id` is allowed.
    pub fn allows(&self, id: u32) -> bool {
        self.words
            .get(id as usize / 32)
            .is_some_and(|w| w & (1 << (id % 32)) != 0)
    }

    /// Allowed tokens.
    pub fn count(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Sets every disallowed entry of a logits row to −∞.
    pub fn apply(&self, logits: &mut [f32]) {
        for (i, v) in logits.iter_mut().enumerate() {
            if !self.allows(i as u32) {
                *v = f32::NEG_INFINITY;
            }
        }
    }
}

/// The grammar state of one choice.
pub trait TokenConstraint: Send {
    /// The tokens allowed next (called before the forward pass that produces the logits it masks).
    fn mask(&mut self) -> Result<TokenMask, String>;
    /// Records a sampled token; with `fast_forward`, also returns the tokens the grammar forces right
    /// after it, already recorded (empty otherwise).
    fn commit(&mut self, token: u32, fast_forward: bool) -> Result<Vec<u32>, String>;
    /// The grammar is complete and allows nothing more: the choice ends (`stop`).
    fn is_stopped(&self) -> bool;
    /// An independent copy in the same state (for the `n` choices of a request).
    fn fork(&self) -> Box<dyn TokenConstraint>;
}

/// Makes the constraint of each choice of a request.
pub trait ConstraintFactory: Send + Sync {
    /// A constraint in its start state.
    fn start(&self) -> Box<dyn TokenConstraint>;
    /// What it enforces, for logs.
    fn describe(&self) -> String;
}

/// A request's constraint: compiled once by the server, started once per choice by the engine.
#[derive(Clone)]
pub struct Guide(pub Arc<dyn ConstraintFactory>);

impl fmt::Debug for Guide {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Guide({})", self.0.describe())
    }
}

impl PartialEq for Guide {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// A choice's constraint with the mask prepared for its next sample.
pub(crate) struct GuideState {
    pub(crate) constraint: Box<dyn TokenConstraint>,
    pub(crate) mask: Option<Result<TokenMask, String>>,
}

impl GuideState {
    pub(crate) fn new(g: &Guide) -> GuideState {
        GuideState {
            constraint: g.0.start(),
            mask: None,
        }
    }

    /// Computes the next mask unless one is ready; returns the seconds it took (0 when ready).
    pub(crate) fn prepare(&mut self) -> f64 {
        if self.mask.is_some() {
            return 0.0;
        }
        let t = std::time::Instant::now();
        self.mask = Some(self.constraint.mask());
        t.elapsed().as_secs_f64()
    }

    /// A copy for a forked choice (same state, same prepared mask).
    pub(crate) fn fork(&self) -> GuideState {
        GuideState {
            constraint: self.constraint.fork(),
            mask: self.mask.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_bits_and_apply() {
        let m = TokenMask::from_ids(70, &[0, 33, 69, 500]);
        assert!(m.allows(0) && m.allows(33) && m.allows(69));
        assert!(!m.allows(1) && !m.allows(500) && !m.allows(10_000));
        assert_eq!(m.count(), 3);
        let mut row = vec![1.0f32; 80];
        m.apply(&mut row);
        assert_eq!(row.iter().filter(|v| v.is_finite()).count(), 3);
    }
}
