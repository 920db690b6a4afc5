//! The tiers' side of the KV events ([`crate::kv_events`]): a block evicted from the KV cache and kept
//! by host memory or the spill file is published again with that medium (vLLM's `BlockStored` with
//! medium `CPU`, as its offloading publishes), and unpublished when the tier lets it go — so a router
//! that indexes this replica knows the prefix is still here, one copy away. Only blocks the pool
//! published (not a tenant's salted ones) are; a hash is stored once per medium however many
//! records share it (an exact block and its fast-path twin) and removed with the last of them.

use std::collections::HashMap;

use super::key::{BlockMeta, ChainKey, Published};
use super::Medium;
use crate::kv_events::KvEvent;

/// The events of one replica's tiers, since the last take.
#[derive(Debug, Default)]
pub(crate) struct TierEvents {
    events: Vec<KvEvent>,
    /// The published records each medium holds.
    held: HashMap<(ChainKey, Medium), Published>,
    /// Records per published hash and medium.
    counts: HashMap<(u64, Medium), u32>,
}

impl TierEvents {
    /// `meta` is now kept in `medium`.
    pub(crate) fn stored(&mut self, meta: &BlockMeta, medium: Medium) {
        let Some(p) = meta.published else { return };
        if self.held.insert((meta.key, medium), p).is_some() {
            return;
        }
        let n = self.counts.entry((p.hash, medium)).or_insert(0);
        *n += 1;
        if *n == 1 {
            self.events.push(KvEvent::TierStored {
                hash: p.hash,
                parent: p.parent,
                tokens: meta.tokens.clone(),
                medium,
            });
        }
    }

    /// The record `key` left `medium` (nothing when it was never published there).
    pub(crate) fn removed(&mut self, key: ChainKey, medium: Medium) {
        let Some(p) = self.held.remove(&(key, medium)) else {
            return;
        };
        if let Some(n) = self.counts.get_mut(&(p.hash, medium)) {
            *n -= 1;
            if *n == 0 {
                self.counts.remove(&(p.hash, medium));
                self.events.push(KvEvent::TierRemoved { hash: p.hash, medium });
            }
        }
    }

    /// The events since the last call.
    pub(crate) fn take(&mut self) -> Vec<KvEvent> {
        std::mem::take(&mut self.events)
    }
}
