//! The scheduler's side of the shared KV tier ([`crate::tier::SharedTier`]): which blocks a newly
//! added request would read from the store ([`Scheduler::shared_misses`]), and holding it out of
//! admission while the engine fetches them ([`Scheduler::hold`]) — so that when it is admitted, its
//! match finds them in the local tier instead of recomputing them. A held request is passed over,
//! never blocks the queue, and is let go by the engine when its fetch answers or times out.

use super::Scheduler;
use crate::kv_manager::Salts;
use crate::registry::GroupId;
use crate::tier::BlockMeta;

impl Scheduler {
    /// The blocks of `g`'s prompt (its first sequence's) that neither the hot pool nor the local tier
    /// holds and that a match could take, keyed as the shared store keys them; empty without a shared
    /// store.
    pub(crate) fn shared_misses(&self, g: GroupId) -> Vec<BlockMeta> {
        if self.kv.tier().and_then(|t| t.shared()).is_none() {
            return vec![];
        }
        let Some(&sid) = self.group_seqs(g).first() else {
            return vec![];
        };
        let (Ok(s), Ok(grp)) = (self.reg.seq(sid), self.reg.group(g)) else {
            return vec![];
        };
        let salts = Salts {
            own: &grp.salt,
            exact: grp.exact_salt.as_deref(),
        };
        self.kv.misses(&s.tokens, self.matchable_blocks(s), salts)
    }

    /// Keeps waiting group `g` out of admission until [`Scheduler::release_hold`].
    pub(crate) fn hold(&mut self, g: GroupId) {
        self.held.insert(g);
    }

    /// Lets `g` be admitted again.
    pub(crate) fn release_hold(&mut self, g: GroupId) {
        self.held.remove(&g);
    }

    /// Whether `g` may be admitted now.
    pub(super) fn admissible(&self, g: GroupId) -> bool {
        !self.held.contains(&g)
    }
}
