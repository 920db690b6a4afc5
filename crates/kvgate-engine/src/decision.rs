//! Decision groups and keep-alive pins: the one place that decides how a decision's reads share their
//! prefix, and the pins that keep a decision's state blocks from eviction.
//!
//! The rule ([`DecisionLayout::of`]): the reads' shared prefix is their longest common prefix, capped so
//! that every read keeps at least one token of its own (its last token is computed to read its logits).
//! A decision with two or more reads and a non-empty shared prefix computes that prefix once and forks
//! one sequence per read from it; otherwise each read is a plain sequence. The handle sizes a decision
//! with this layout, the scheduler runs it, and the engine pins its shared prefix.

use crate::block_pool::BlockId;

/// How a decision's reads are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecisionLayout {
    /// Tokens computed once for all reads.
    pub shared: usize,
    /// Whether the reads fork from a shared-prefix sequence (else each read is a plain sequence).
    pub forks: bool,
}

impl DecisionLayout {
    /// The layout of reads with these prompts (each non-empty).
    pub fn of<P: AsRef<[u32]>>(prompts: &[P]) -> DecisionLayout {
        let Some(first) = prompts.first().map(AsRef::as_ref) else {
            return DecisionLayout {
                shared: 0,
                forks: false,
            };
        };
        let mut common = first.len();
        let mut min_len = first.len();
        for p in &prompts[1..] {
            let p = p.as_ref();
            common = common.min(first.iter().zip(p).take_while(|(a, b)| a == b).count());
            min_len = min_len.min(p.len());
        }
        let shared = common.min(min_len.saturating_sub(1));
        DecisionLayout {
            shared,
            forks: prompts.len() > 1 && shared > 0,
        }
    }
}

/// A decision group's own state in the scheduler.
#[derive(Debug, Clone)]
pub(crate) struct DecisionState {
    /// One prompt per read.
    pub(crate) prompts: Vec<Vec<u32>>,
    /// Its layout.
    pub(crate) layout: DecisionLayout,
    /// Whether the read sequences exist (always, for a layout that does not fork).
    pub(crate) forked: bool,
}

impl DecisionState {
    pub(crate) fn new(prompts: Vec<Vec<u32>>) -> DecisionState {
        DecisionState {
            layout: DecisionLayout::of(&prompts),
            prompts,
            forked: false,
        }
    }
}

/// Blocks held from eviction until a deadline (`keep_alive`), each pin one extra reference per block.
#[derive(Debug, Clone, Default)]
pub(crate) struct Pins {
    pins: Vec<(u64, Option<u32>, Vec<BlockId>)>,
}

impl Pins {
    /// Records a pin (the caller took the references).
    pub(crate) fn add(&mut self, until: u64, tenant: Option<u32>, blocks: Vec<BlockId>) {
        self.pins.push((until, tenant, blocks));
    }

    /// Removes and returns the pins whose deadline is `≤ now` (the caller drops their references).
    pub(crate) fn take_expired(&mut self, now: u64) -> Vec<Vec<BlockId>> {
        let (done, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pins)
            .into_iter()
            .partition(|(t, _, _)| *t <= now);
        self.pins = keep;
        done.into_iter().map(|(_, _, b)| b).collect()
    }

    /// Removes and returns the oldest pin's blocks (the caller drops their references).
    pub(crate) fn take_oldest(&mut self) -> Option<Vec<BlockId>> {
        (!self.pins.is_empty()).then(|| self.pins.remove(0).2)
    }

    /// Removes and returns the oldest pin of `tenant`.
    pub(crate) fn take_oldest_of(&mut self, tenant: u32) -> Option<Vec<BlockId>> {
        let i = self.pins.iter().position(|(_, t, _)| *t == Some(tenant))?;
        Some(self.pins.remove(i).2)
    }

    /// Blocks pinned by `tenant`.
    pub(crate) fn count_of(&self, tenant: u32) -> usize {
        self.pins
            .iter()
            .filter(|(_, t, _)| *t == Some(tenant))
            .map(|(_, _, b)| b.len())
            .sum()
    }

    /// Earliest deadline, if any.
    pub(crate) fn next_expiry(&self) -> Option<u64> {
        self.pins.iter().map(|(t, _, _)| *t).min()
    }

    /// Blocks pinned (with multiplicity: a block pinned twice counts twice).
    pub(crate) fn blocks(&self) -> impl Iterator<Item = BlockId> + '_ {
        self.pins.iter().flat_map(|(_, _, b)| b.iter().copied())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_rule() {
        // one read: nothing forks, the shared prefix still leaves the last token to compute
        assert_eq!(
            DecisionLayout::of(&[vec![1, 2, 3]]),
            DecisionLayout {
                shared: 2,
                forks: false
            }
        );
        // identical reads: every read keeps one token
        assert_eq!(DecisionLayout::of(&[vec![1, 2, 3], vec![1, 2, 3]]).shared, 2);
        // common prefix of 2, shortest read 3
        let l = DecisionLayout::of(&[vec![1, 2, 3, 4], vec![1, 2, 5]]);
        assert_eq!(l, DecisionLayout { shared: 2, forks: true });
        // nothing shared: plain sequences
        assert!(!DecisionLayout::of(&[vec![1], vec![2]]).forks);
        assert!(!DecisionLayout::of::<Vec<u32>>(&[]).forks);
    }

    #[test]
    fn pins_expire_in_order() {
        let mut p = Pins::default();
        p.add(5, None, vec![]);
        p.add(3, Some(1), vec![]);
        assert_eq!(p.next_expiry(), Some(3));
        assert_eq!(p.take_expired(4).len(), 1);
        assert_eq!(p.next_expiry(), Some(5));
        assert_eq!(p.take_expired(u64::MAX).len(), 1);
        assert_eq!(p.next_expiry(), None);
    }
}
