//! The engine's side of the second KV tier: opening it (once the cache's fingerprint is final), carrying
//! out each plan's spills and restores through the backend's copy interface before the step's copies
//! and forward pass, and writing the hot cache to the spill file at shutdown.

use std::time::Instant;

use kvgate_backend::Backend;
use tracing::info;

use super::Engine;
use crate::error::EngineError;
use crate::tier::{SecondTier, TierConfig};

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
