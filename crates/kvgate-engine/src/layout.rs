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

impl DecisionLayout {
    /// The layout of reads whose tokens from `plain_upto[i]` on are tree tokens: the shared prefix
    /// stops before the first tree token of any read (it is computed causally, once).
    pub fn of_reads<P: AsRef<[u32]>>(prompts: &[P], plain_upto: &[usize]) -> DecisionLayout {
        let l = DecisionLayout::of(prompts);
        let shared = l.shared.min(plain_upto.iter().copied().min().unwrap_or(usize::MAX));
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
    /// Per read: its tokens before its first tree token (`usize::MAX`: no tree).
    pub(crate) plain_upto: Vec<usize>,
    /// Its layout.
    pub(crate) layout: DecisionLayout,
    /// Whether the read sequences exist (always, for a layout that does not fork).
    pub(crate) forked: bool,
}

impl DecisionState {
    pub(crate) fn new(prompts: Vec<Vec<u32>>, plain_upto: Vec<usize>) -> DecisionState {
        DecisionState {
            layout: DecisionLayout::of_reads(&prompts, &plain_upto),
            prompts,
            plain_upto,
            forked: false,
        }
    }
}

/// Why blocks are pinned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PinKind {
    /// An explicit `keep_alive`: held until its deadline (or pressure), whoever reuses the blocks.
    KeepAlive,
    /// Session retention: a state expected again (a decision's state, a completion with a session
    /// hint), held until its window ends, pressure, or its next turn arrives and takes the blocks over
    /// (the pin is consumed: the next turn pins again at its own end).
    Session,
}

/// Whether a request matching `blocks` continues the retained state `pinned`: it starts the same and
/// holds at least three quarters of it. (A decision retains its state with the question read after
/// it; the follow-up shares the state, not the question. Another session that only shares a system
/// prompt holds a smaller part.)
fn continues(blocks: &[BlockId], pinned: &[BlockId]) -> bool {
    if pinned.is_empty() || pinned.first() != blocks.first() {
        return false;
    }
    let held = pinned.iter().filter(|b| blocks.contains(b)).count();
    4 * held >= 3 * pinned.len()
}

/// One pin.
#[derive(Debug, Clone)]
struct Pin {
    /// When it was taken (the caller's clock).
    since: u64,
    /// When its session's state has been held since, turn after turn.
    held_since: u64,
    /// The scheduler's step count when it was taken.
    step: u64,
    until: u64,
    tenant: Option<u32>,
    kind: PinKind,
    blocks: Vec<BlockId>,
    /// What holds it besides its deadline (a connection), released with it.
    owner: Option<u64>,
}

/// Blocks held from eviction until a deadline, each pin one extra reference per block, oldest first.
#[derive(Debug, Clone, Default)]
pub(crate) struct Pins {
    pins: Vec<Pin>,
}

impl Pins {
    /// Records a pin (the caller took the references); `held_since`: when its session's state has been
    /// held since (`since` for a first turn); `step`: the scheduler's step count when it was taken.
    pub(crate) fn add(
        &mut self,
        at: (u64, u64, u64),
        until: u64,
        tenant: Option<u32>,
        kind: PinKind,
        blocks: Vec<BlockId>,
    ) {
        let (since, held_since, step) = at;
        self.pins.push(Pin {
            since,
            held_since,
            step,
            until,
            tenant,
            kind,
            blocks,
            owner: None,
        });
    }

    /// Gives the pin added last an owner.
    pub(crate) fn own_last(&mut self, owner: u64) {
        if let Some(p) = self.pins.last_mut() {
            p.owner = Some(owner);
        }
    }

    /// Removes and returns the pins `owner` holds.
    pub(crate) fn take_owned(&mut self, owner: u64) -> Vec<Vec<BlockId>> {
        let (gone, kept) = std::mem::take(&mut self.pins)
            .into_iter()
            .partition(|p| p.owner == Some(owner));
        self.pins = kept;
        gone.into_iter().map(|p: Pin| p.blocks).collect()
    }

    /// Removes and returns the pins whose deadline is `≤ now` (the caller drops their references).
    pub(crate) fn take_expired(&mut self, now: u64) -> Vec<Vec<BlockId>> {
        let (done, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pins).into_iter().partition(|p| p.until <= now);
        self.pins = keep;
        done.into_iter().map(|p| p.blocks).collect()
    }

    /// Removes and returns the session pins whose state `blocks` continues ([`continues`]): the
    /// session's next turn took them over. A pin that only shares a prefix with `blocks` (a common
    /// system prompt) stays.
    /// Each comes with when its state has been held since.
    pub(crate) fn take_sessions_over(&mut self, blocks: &[BlockId]) -> Vec<(Vec<BlockId>, u64)> {
        let (done, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pins)
            .into_iter()
            .partition(|p| p.kind == PinKind::Session && continues(blocks, &p.blocks));
        self.pins = keep;
        done.into_iter().map(|p| (p.blocks, p.held_since)).collect()
    }

    /// Whether `blocks` continue some session pin's state (they would take it over).
    pub(crate) fn any_session_over(&self, blocks: &[BlockId]) -> bool {
        self.pins
            .iter()
            .any(|p| p.kind == PinKind::Session && continues(blocks, &p.blocks))
    }

    /// Removes and returns the oldest pin's blocks (the caller drops their references).
    pub(crate) fn take_oldest(&mut self) -> Option<Vec<BlockId>> {
        (!self.pins.is_empty()).then(|| self.pins.remove(0).blocks)
    }

    /// Removes and returns the oldest pin of `tenant`.
    pub(crate) fn take_oldest_of(&mut self, tenant: u32) -> Option<Vec<BlockId>> {
        let i = self.pins.iter().position(|p| p.tenant == Some(tenant))?;
        Some(self.pins.remove(i).blocks)
    }

    /// Removes and returns the oldest pin idle since `idle` = (a time, a step count) or before, or
    /// whose state has been held since `held` or before — sparing the session states that a waiting
    /// request continues (`awaited`: their next turns' warm blocks).
    pub(crate) fn take_oldest_since(
        &mut self,
        idle: Option<(u64, u64)>,
        held: Option<u64>,
        awaited: &[Vec<BlockId>],
    ) -> Option<Vec<BlockId>> {
        let i = self.pins.iter().position(|p| {
            let old = idle.is_some_and(|(t, s)| p.since <= t && p.step <= s) || held.is_some_and(|h| p.held_since <= h);
            old && !(p.kind == PinKind::Session && awaited.iter().any(|w| continues(w, &p.blocks)))
        })?;
        Some(self.pins.remove(i).blocks)
    }

    /// Removes and returns the oldest pin, one that no waiting request continues (`awaited`) first.
    pub(crate) fn take_oldest_sparing(&mut self, awaited: &[Vec<BlockId>]) -> Option<Vec<BlockId>> {
        let spared = |p: &Pin| p.kind == PinKind::Session && awaited.iter().any(|w| continues(w, &p.blocks));
        let i = self
            .pins
            .iter()
            .position(|p| !spared(p))
            .or((!self.pins.is_empty()).then_some(0))?;
        Some(self.pins.remove(i).blocks)
    }

    /// Removes and returns the oldest pin of `kind` taken at or before `cutoff`.
    pub(crate) fn take_oldest_kind_since(&mut self, kind: PinKind, cutoff: u64) -> Option<Vec<BlockId>> {
        let i = self.pins.iter().position(|p| p.kind == kind && p.since <= cutoff)?;
        Some(self.pins.remove(i).blocks)
    }

    /// Whether nothing is pinned.
    pub(crate) fn is_empty(&self) -> bool {
        self.pins.is_empty()
    }

    /// Blocks pinned as `kind` (with multiplicity).
    pub(crate) fn count_kind(&self, kind: PinKind) -> usize {
        self.pins
            .iter()
            .filter(|p| p.kind == kind)
            .map(|p| p.blocks.len())
            .sum()
    }

    /// Blocks pinned by `tenant`.
    pub(crate) fn count_of(&self, tenant: u32) -> usize {
        self.pins
            .iter()
            .filter(|p| p.tenant == Some(tenant))
            .map(|p| p.blocks.len())
            .sum()
    }

    /// Earliest deadline, if any.
    pub(crate) fn next_expiry(&self) -> Option<u64> {
        self.pins.iter().map(|p| p.until).min()
    }

    /// Blocks pinned (with multiplicity: a block pinned twice counts twice).
    pub(crate) fn blocks(&self) -> impl Iterator<Item = BlockId> + '_ {
        self.pins.iter().flat_map(|p| p.blocks.iter().copied())
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
        p.add((0, 0, 0), 5, None, PinKind::KeepAlive, vec![]);
        p.add((1, 1, 0), 3, Some(1), PinKind::Session, vec![]);
        assert!(p
            .take_oldest_since(Some((0, u64::MAX)), None, &[])
            .is_some_and(|b| b.is_empty()));
        assert!(
            p.take_oldest_since(Some((0, u64::MAX)), None, &[]).is_none(),
            "the other is newer"
        );
        p.add((0, 0, 0), 5, None, PinKind::KeepAlive, vec![]);
        assert_eq!(p.next_expiry(), Some(3));
        assert_eq!(p.take_expired(4).len(), 1);
        assert_eq!(p.next_expiry(), Some(5));
        assert_eq!(p.take_expired(u64::MAX).len(), 1);
        assert_eq!(p.next_expiry(), None);
    }

    #[test]
    fn a_next_turn_takes_over_only_the_session_it_extends() {
        let b = |i: usize| BlockId::from_index(i);
        let mut p = Pins::default();
        // two sessions over a common system-prompt block 0; a keep_alive over the same state as 1
        p.add((0, 0, 0), 9, None, PinKind::Session, vec![b(0), b(1), b(2)]);
        p.add((0, 0, 0), 9, None, PinKind::Session, vec![b(0), b(3)]);
        p.add((0, 0, 0), 9, None, PinKind::KeepAlive, vec![b(0), b(1), b(2)]);
        assert_eq!(p.count_kind(PinKind::Session), 5);
        // a request sharing only the system prompt takes nothing over
        assert!(p.take_sessions_over(&[b(0), b(7)]).is_empty());
        assert!(!p.any_session_over(&[b(0), b(1)]), "two thirds of the first state");
        assert!(p.any_session_over(&[b(0), b(1), b(2), b(8)]));
        // the first session's next turn (its whole state, then more) takes over its pin only
        assert_eq!(
            p.take_sessions_over(&[b(0), b(1), b(2), b(8)]),
            vec![(vec![b(0), b(1), b(2)], 0)]
        );
        assert_eq!(p.count_kind(PinKind::Session), 2);
        assert_eq!(p.blocks().count(), 5, "the keep_alive pin stays");
    }

    #[test]
    fn a_state_whose_next_turn_waits_is_spared() {
        let b = |i: usize| BlockId::from_index(i);
        let mut p = Pins::default();
        p.add((0, 0, 0), 9, None, PinKind::Session, vec![b(0), b(1)]);
        p.add((1, 1, 1), 9, None, PinKind::Session, vec![b(2), b(3)]);
        let awaited = vec![vec![b(0), b(1), b(4)]];
        assert_eq!(
            p.take_oldest_since(Some((5, 5)), None, &awaited),
            Some(vec![b(2), b(3)])
        );
        assert!(p.take_oldest_since(Some((5, 5)), None, &awaited).is_none());
        assert_eq!(
            p.take_oldest_sparing(&awaited),
            Some(vec![b(0), b(1)]),
            "running work takes it last"
        );
    }

    #[test]
    fn a_state_held_long_enough_gives_way_though_its_pin_is_young() {
        let mut p = Pins::default();
        p.add((90, 0, 9), 200, None, PinKind::Session, vec![]); // held since 0, retaken at 90
        p.add((50, 50, 5), 200, None, PinKind::Session, vec![]);
        assert!(p.take_oldest_since(Some((40, u64::MAX)), None, &[]).is_none());
        assert!(
            p.take_oldest_since(Some((60, 4)), None, &[]).is_none(),
            "taken at step 5"
        );
        assert!(
            p.take_oldest_since(Some((40, u64::MAX)), Some(10), &[]).is_some(),
            "held since 0"
        );
        assert!(p.take_oldest_since(None, Some(10), &[]).is_none(), "the other since 50");
        assert!(p.take_oldest_since(Some((60, 5)), None, &[]).is_some());
    }
}
