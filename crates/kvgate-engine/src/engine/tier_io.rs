//! The engine's side of the second KV tier: opening it (once the cache's fingerprint is final), carrying
//! out each plan's spills and restores through the backend's copy interface before the step's copies
//! and forward pass, and writing the hot cache to the spill file at shutdown.

use std::time::Instant;

use kvgate_backend::Backend;
use tracing::{info, warn};

use super::Engine;
use crate::error::EngineError;
use crate::registry::GroupId;
use crate::tier::{SecondTier, TierConfig};

/// Bytes of blocks read for the shared store that wait for the engine's idle time at most.
const SHARED_BATCH_BYTES: usize = 64 << 20;

/// Fewer missing blocks than this are computed rather than fetched from the shared store (measured: a
/// warm follow-up's 1–3 new blocks asked of a local Redis cost 2 ms, 5% of its time to the first
/// token, and are never there).
const MIN_FETCH_BLOCKS: usize = 4;

/// Opens the second tier for `backend`'s blocks, under its current fingerprint.
pub(super) fn open_tier(cfg: &TierConfig, backend: &dyn Backend) -> Result<SecondTier, EngineError> {
    let shape = backend.cache_shape();
    let tier = SecondTier::open(
        cfg,
        shape.block_size(),
        shape.bytes_per_block(),
        backend.kv_fingerprint(),
    )
    .map_err(|e| EngineError::Config(format!("--kv-offload-dir: {e}")))?;
    info!(
        memory_bytes = cfg.memory_bytes,
        disk_bytes = cfg.disk_bytes,
        spill_file = ?tier.spill_path(),
        reloaded = tier.stats().spill.reloaded,
        "second KV tier"
    );
    Ok(tier)
}

impl Engine {
    /// Carries out the plan's tier operations: reads every spilled block (before anything overwrites
    /// it), writes every restored one, then stores the spilled bytes in the tier.
    pub(super) fn flush_tier(&mut self) -> Result<(), EngineError> {
        let ops = self.sched.take_tier_ops();
        if ops.is_empty() {
            return Ok(());
        }
        let t0 = Instant::now();
        let bpb = self.backend.capacity().bytes_per_block;
        let mut spilled = Vec::with_capacity(ops.spills.len());
        for (b, meta) in ops.spills {
            let mut bytes = Vec::with_capacity(bpb);
            self.backend.read_block(b.into(), &mut bytes)?;
            spilled.push((meta, bytes));
        }
        // newly registered blocks, read now (nothing has written them since) and written behind to
        // the shared store when the engine is idle or enough wait (`write_shared`)
        if self.sched.tier().is_some_and(|t| t.shared().is_some()) {
            for (b, meta) in ops.shares {
                let mut bytes = Vec::with_capacity(bpb);
                self.backend.read_block(b.into(), &mut bytes)?;
                self.unshared_bytes += bytes.len();
                self.unshared.push((meta, bytes));
            }
        }
        let t1 = Instant::now();
        let mut restored = 0u64;
        for r in &ops.restores {
            self.backend.write_block(r.block.into(), &r.bytes)?;
            restored += r.bytes.len() as u64;
        }
        let restore_secs = t1.elapsed().as_secs_f64();
        if let Some(tier) = self.sched.tier_mut() {
            for (meta, bytes) in spilled {
                tier.store(meta, bytes);
            }
        }
        self.rec.tier_io(restored, restore_secs, (t1 - t0).as_secs_f64());
        Ok(())
    }

    /// Hands the blocks read for the shared store to its worker — when no request runs (an agent's
    /// gap between turns: encoding and sending them then costs the streams nothing; measured with a
    /// local Redis on 2 cores, writing them while streams decode cost 3–5% of the decode rate) or when
    /// [`SHARED_BATCH_BYTES`] wait (a busy replica writes as it goes), or `now`.
    pub(super) fn write_shared(&mut self, now: bool) {
        let idle = self.sched.num_running_groups() == 0;
        if idle || now {
            // the last step's newly registered blocks (read at the next step's start otherwise; with
            // nothing running no step plans a spill or a restore, so only they are pending)
            if let Err(e) = self.flush_tier() {
                warn!(error = %e, "reading blocks for the shared KV tier failed; not writing them");
            }
        }
        if self.unshared.is_empty() {
            return;
        }
        if !(now || idle || self.unshared_bytes >= SHARED_BATCH_BYTES) {
            return;
        }
        let Some(shared) = self.sched.tier().and_then(|t| t.shared()) else {
            self.unshared.clear();
            self.unshared_bytes = 0;
            return;
        };
        for (meta, bytes) in self.unshared.drain(..) {
            shared.store(meta, bytes);
        }
        self.unshared_bytes = 0;
    }

    /// Asks the shared store for the blocks of newly added group `g` that no local tier holds, and
    /// holds `g` out of admission until they land or the store's timeout passes.
    pub(super) fn fetch_shared(&mut self, g: GroupId) {
        let misses = self.sched.shared_misses(g);
        let Some(shared) = self.sched.tier().and_then(|t| t.shared()) else {
            return;
        };
        // a warm follow-up misses only its new blocks: computing them costs less than a round trip
        if misses.len() < MIN_FETCH_BLOCKS {
            return;
        }
        let deadline = Instant::now() + shared.timeout();
        if shared.fetch(g.raw(), misses) {
            self.sched.hold(g);
            self.fetching.insert(g, deadline);
        }
    }

    /// Puts what the shared store answered into the local tier and lets those groups (and any whose
    /// fetch timed out) be admitted.
    pub(super) fn land_shared(&mut self) {
        if self.fetching.is_empty() {
            return;
        }
        let answered = self
            .sched
            .tier()
            .and_then(|t| t.shared())
            .map(|s| s.answered())
            .unwrap_or_default();
        for f in answered {
            if let Some(t) = self.sched.tier_mut() {
                for (meta, bytes) in f.blocks {
                    t.land(meta, bytes);
                }
            }
            let g = GroupId::from_raw(f.tag);
            self.fetching.remove(&g);
            self.sched.release_hold(g);
        }
        let now = Instant::now();
        let late: Vec<GroupId> = self
            .fetching
            .iter()
            .filter(|(_, &t)| t <= now)
            .map(|(&g, _)| g)
            .collect();
        for g in late {
            warn!(group = ?g, "shared KV tier: a fetch timed out; admitting without it");
            self.fetching.remove(&g);
            self.sched.release_hold(g);
        }
    }

    /// At shutdown, with a spill file: what the memory tier holds and every cached block of the hot
    /// pool (least recently used first) go to the file, so the next run over it finds whole prefixes,
    /// not only what was evicted (a shared system prompt is never evicted).
    pub(super) fn spill_hot_pool(&mut self) {
        if self.sched.tier().is_none_or(|t| t.spill_path().is_none()) {
            return;
        }
        let (blocks, metas): (Vec<_>, Vec<_>) = self.sched.pool().cached_blocks().into_iter().unzip();
        let backend = &self.backend;
        let Some(t) = self.sched.tier_mut() else { return };
        let n = t.persist(metas, |i| {
            let mut bytes = vec![];
            backend.read_block(blocks[i].into(), &mut bytes).ok().map(|_| bytes)
        });
        info!(blocks = n, spill_file = ?t.spill_path(), "hot cache written to the spill file");
    }
}
