//! A step's results applied in one call (vLLM's `update_from_output`): the request kinds record what
//! their outputs did to each sequence — tokens appended (sampled or forced by a grammar), a prefix
//! pinned, the sequence finished — in a [`StepUpdate`] while they process the step, and the scheduler
//! applies the whole list at once, in order, after the step's chunks were advanced
//! ([`Scheduler::advance_step`]). Forking a completion into its `n` choices stays a direct call: it
//! happens once per request, at its first sample, and the new ids key the choices.

use super::{Chunk, Result, Scheduler};
use crate::layout::PinKind;
use crate::registry::SeqId;

/// One change to a sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SeqOp {
    /// A token joins the sequence.
    Append(u32),
    /// Pin the full blocks among its first `tokens` tokens until `until` (a decision's `keep_alive`).
    Pin {
        /// Prefix tokens.
        tokens: usize,
        /// Clock value the pin expires at.
        until: u64,
        /// Whose pin it is.
        tenant: Option<u32>,
        /// `keep_alive` or session retention.
        kind: PinKind,
        /// What holds it besides its deadline (a connection).
        owner: Option<u64>,
    },
    /// The sequence ends; its blocks are released.
    Finish,
    /// Of the tokens its last decode chunk proposed, this path was kept (chunk rows in depth order:
    /// `1, 2, …` for a single path, a branch of its token tree otherwise; appended just before):
    /// their K/V stay, the rejected ones' slots are given back.
    AcceptPath(Vec<usize>),
    /// Most tokens it may propose from now on (0: none).
    SpecLimit(usize),
}

/// What one step's outputs did to the sequences, in the order it happened.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct StepUpdate {
    ops: Vec<(SeqId, SeqOp)>,
}

impl StepUpdate {
    /// Records that `seq` got token `tok`.
    pub(crate) fn append(&mut self, seq: SeqId, tok: u32) {
        self.ops.push((seq, SeqOp::Append(tok)));
    }

    /// Records a pin of `seq`'s first `tokens` tokens.
    pub(crate) fn pin(&mut self, seq: SeqId, tokens: usize, until: u64, tenant: Option<u32>, kind: PinKind) {
        self.pin_owned(seq, tokens, until, tenant, kind, None);
    }

    /// As [`StepUpdate::pin`], held by `owner` too (released when it goes).
    pub(crate) fn pin_owned(
        &mut self,
        seq: SeqId,
        tokens: usize,
        until: u64,
        tenant: Option<u32>,
        kind: PinKind,
        owner: Option<u64>,
    ) {
        self.ops.push((
            seq,
            SeqOp::Pin {
                tokens,
                until,
                tenant,
                kind,
                owner,
            },
        ));
    }

    /// Records that `seq` ended.
    pub(crate) fn finish(&mut self, seq: SeqId) {
        self.ops.push((seq, SeqOp::Finish));
    }

    /// Records that `seq` kept the first `n` tokens its decode chunk proposed (recorded after their
    /// appends, before a finish).
    #[cfg(test)]
    pub(crate) fn accept(&mut self, seq: SeqId, n: usize) {
        self.ops.push((seq, SeqOp::AcceptPath((1..=n).collect())));
    }

    /// Records that `seq` kept path `rows` (chunk rows from the first row's child on) of its decode
    /// chunk's token tree (recorded after their appends, before a finish).
    pub(crate) fn accept_path(&mut self, seq: SeqId, rows: Vec<usize>) {
        self.ops.push((seq, SeqOp::AcceptPath(rows)));
    }

    /// Records how many tokens `seq` may propose from now on: the request kind knows what it can
    /// verify (0 for a sequence under a grammar) and how many tokens it still may emit.
    pub(crate) fn spec_limit(&mut self, seq: SeqId, n: usize) {
        self.ops.push((seq, SeqOp::SpecLimit(n)));
    }

    /// Whether nothing was recorded.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

impl Scheduler {
    /// Records that every chunk of a step ran: their tokens are now in the cache (full blocks join the
    /// prefix cache).
    pub(crate) fn advance_step(&mut self, chunks: &[Chunk]) -> Result<()> {
        if !chunks.is_empty() {
            self.steps += 1;
        }
        chunks.iter().try_for_each(|c| self.advance(c))
    }

    /// Applies one step's outputs to every sequence they touched, in order.
    pub(crate) fn update_from_output(&mut self, update: StepUpdate) -> Result<()> {
        for (seq, op) in update.ops {
            match op {
                SeqOp::Append(tok) => self.append_token(seq, tok)?,
                SeqOp::Pin {
                    tokens,
                    until,
                    tenant,
                    kind,
                    owner,
                } => {
                    // a pin is added (the last) exactly when blocks were pinned
                    if self.pin_prefix(seq, tokens, until, tenant, kind)? > 0 {
                        if let Some(o) = owner {
                            self.pins.own_last(o);
                        }
                    }
                }
                SeqOp::Finish => self.finish_seq(seq)?,
                SeqOp::AcceptPath(rows) => self.accept_path(seq, &rows)?,
                SeqOp::SpecLimit(n) => self.reg.seq_mut(seq)?.spec.limit = n,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::SchedulerConfig;

    #[test]
    fn one_update_appends_pins_and_finishes_in_order() {
        let cfg = SchedulerConfig::new(8, 64, 4);
        let mut s = Scheduler::new(cfg, 16);
        let (g, a) = s.add_generate((10..19).collect(), "", false);
        let plan = s.schedule().unwrap();
        s.advance_step(&plan.chunks).unwrap();
        let b = s.fork(a, 1).unwrap()[0];
        let mut u = StepUpdate::default();
        assert!(u.is_empty());
        u.append(a, 1);
        u.append(b, 2);
        u.pin(b, 8, 100, None, PinKind::KeepAlive);
        u.finish(b);
        s.update_from_output(u).unwrap();
        assert_eq!(s.seq(a).unwrap().tokens.last(), Some(&1));
        assert!(s.seq(b).is_err(), "finished");
        assert_eq!(s.pinned_blocks(), 2, "the pin outlives its sequence");
        assert_eq!(s.group_seqs(g), [a]);
        // an op on a sequence that does not exist fails the update
        let mut bad = StepUpdate::default();
        bad.append(b, 3);
        assert!(s.update_from_output(bad).is_err());
        s.finish_group(g);
        s.clear_pins();
        s.check_invariants();
    }

    /// A pin held by an owner (a connection) goes when the owner is released; others stay.
    #[test]
    fn an_owners_pins_go_with_it() {
        let mut s = Scheduler::new(SchedulerConfig::new(8, 64, 4), 16);
        for (prompt, owner) in [((0..12).collect::<Vec<u32>>(), Some(7)), ((100..112).collect(), None)] {
            let (_, seq) = s.add_generate(prompt, "", false);
            let plan = s.schedule().unwrap();
            s.advance_step(&plan.chunks).unwrap();
            let mut u = StepUpdate::default();
            u.pin_owned(seq, usize::MAX, 1_000_000, None, PinKind::Session, owner);
            u.finish(seq);
            s.update_from_output(u).unwrap();
        }
        assert_eq!(s.pinned_blocks(), 6, "three full blocks each");
        assert_eq!(s.release_owned(7), 1);
        assert_eq!(s.pinned_blocks(), 3, "the unowned pin stays");
        assert_eq!(s.release_owned(7), 0);
        s.check_invariants();
    }
}
