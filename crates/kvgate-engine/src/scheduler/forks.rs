//! Decision groups in the scheduler: a decision's sequences (the shared-prefix sequence, or one plain
//! sequence per read, by its [`crate::layout::DecisionLayout`]) and the fork of the reads once the
//! shared prefix is computed.

use super::{Result, Scheduler};
use crate::kv_manager::Salts;
use crate::layout::{DecisionLayout, DecisionState};
use crate::registry::{GroupId, GroupKind, SchedError};

impl Scheduler {
    /// The layout the scheduler runs a decision group with.
    pub fn decision_layout(&self, g: GroupId) -> Result<DecisionLayout> {
        Ok(self.decision(g)?.layout)
    }

    /// Queues a decision: one read per prompt (each non-empty), laid out by
    /// [`crate::layout::DecisionLayout`]: a shared prefix computed once and forked per read, or plain
    /// sequences.
    #[cfg(test)]
    pub fn add_decision(&mut self, prompts: Vec<Vec<u32>>, salt: &str) -> GroupId {
        let plain = vec![usize::MAX; prompts.len()];
        self.add_decision_reads(prompts, plain, salt)
    }

    /// [`Scheduler::add_decision`] of reads whose tokens from `plain_upto[i]` on are tree tokens
    /// (never matched or registered in the prefix cache, never in the shared prefix).
    pub fn add_decision_reads(&mut self, prompts: Vec<Vec<u32>>, plain_upto: Vec<usize>, salt: &str) -> GroupId {
        let g = self.reg.add_group(
            GroupKind::Decide(DecisionState::new(prompts, plain_upto)),
            salt.to_string(),
            self.now,
        );
        // The group was just added, so this cannot fail.
        let _ = self.init_decision(g);
        self.waiting.push_back(g);
        g
    }

    pub(super) fn decision(&self, g: GroupId) -> Result<&DecisionState> {
        match &self.reg.group(g)?.kind {
            GroupKind::Decide(d) => Ok(d),
            GroupKind::Generate => Err(SchedError::NotADecision(g)),
        }
    }

    pub(super) fn decision_mut(&mut self, g: GroupId) -> Result<&mut DecisionState> {
        match &mut self.reg.group_mut(g)?.kind {
            GroupKind::Decide(d) => Ok(d),
            GroupKind::Generate => Err(SchedError::NotADecision(g)),
        }
    }

    /// (Re)creates a decision's sequences: the shared-prefix sequence, or one plain sequence per read.
    pub(super) fn init_decision(&mut self, g: GroupId) -> Result<()> {
        let d = self.decision(g)?;
        let (prompts, layout, plain) = (d.prompts.clone(), d.layout, d.plain_upto.clone());
        let seqs = if layout.forks {
            vec![self.reg.add_seq(g, prompts[0][..layout.shared].to_vec(), false, false)]
        } else {
            let mut ids = Vec::with_capacity(prompts.len());
            for (i, p) in prompts.into_iter().enumerate() {
                let id = self.reg.add_seq(g, p, false, true);
                let s = self.reg.seq_mut(id)?;
                s.read = Some(i);
                s.plain_upto = plain.get(i).copied().unwrap_or(usize::MAX);
                ids.push(id);
            }
            ids
        };
        self.decision_mut(g)?.forked = !layout.forks;
        self.reg.group_mut(g)?.seqs = seqs;
        Ok(())
    }

    /// Forks every running decision whose shared prefix is computed into its read sequences.
    pub(super) fn fork_ready_decisions(&mut self) -> Result<()> {
        for g in self.running.clone() {
            let Ok(d) = self.decision(g) else { continue };
            if d.forked {
                continue;
            }
            let (prompts, shared, plain) = (d.prompts.clone(), d.layout.shared, d.plain_upto.clone());
            let Some(&prefix) = self.group_seqs(g).first() else {
                continue;
            };
            if self.reg.seq(prefix)?.computed < shared {
                continue;
            }
            let mut ids = Vec::with_capacity(prompts.len());
            let bs = self.cfg.block_size;
            for (i, p) in prompts.into_iter().enumerate() {
                let id = self.reg.add_seq(g, p, false, true);
                self.reg.seq_mut(id)?.plain_upto = plain.get(i).copied().unwrap_or(usize::MAX);
                // A read computed before (the same question over the same state, asked again) is in
                // the prefix cache beyond the shared prefix: it takes those blocks (their K/V are the
                // same bits whatever batch computed them) and computes only the rest; otherwise it
                // shares the prefix's table (copy-on-write of its partial block).
                let max_blocks = self.matchable_blocks(self.reg.seq(id)?);
                let grp = self.reg.group(g)?;
                let salts = Salts {
                    own: &grp.salt,
                    exact: grp.exact_salt.as_deref(),
                };
                let mut found = self
                    .kv
                    .match_prefix(&self.reg.seq(id)?.tokens, max_blocks, salts, false);
                let (sb, computed) = if found.len() * bs > shared {
                    let n = found.len() * bs;
                    (found, n)
                } else {
                    self.kv.release(&mut found);
                    (self.kv.fork(&self.reg.seq(prefix)?.blocks), shared)
                };
                let s = self.reg.seq_mut(id)?;
                s.read = Some(i);
                s.blocks = sb;
                s.computed = computed;
                s.matched = true;
                ids.push(id);
            }
            let mut pre = self.reg.remove_seq(prefix)?;
            self.kv.release(&mut pre.blocks);
            self.reg.group_mut(g)?.seqs = ids;
            self.decision_mut(g)?.forked = true;
        }
        Ok(())
    }
}
