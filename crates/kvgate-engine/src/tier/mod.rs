//! The second KV tier: full blocks evicted from the hot pool, kept by content key ([`ChainKey`] plus
//! verified parent and tokens) in host memory (`--kv-offload-memory`) and/or a spill file on local disk
//! (`--kv-offload-dir`), both bounded in bytes. Lossless: a record is the hot cache's own bytes, as the
//! backend's copy interface ([`kvgate_backend::Backend::read_block`]) gave them, so a restored block
//! is bitwise the block that was evicted and decisions stay reproducible.
//!
//! Memory is the first stop; what memory pushes out goes to disk (when there is a spill file), what
//! disk pushes out is gone. A lookup that finds a record hands back its bytes, shared (memory) or read
//! and checked (disk); the engine writes them into a hot block before the step that reads it.

mod events;
mod key;
mod memory;
mod record;
mod shared;
mod spill;

use std::path::PathBuf;
use std::sync::Arc;

pub use key::{BlockMeta, ChainKey, Published};
pub use shared::{SharedConfig, SharedStats, SharedTier};
pub use spill::{SpillStats, SPILL_FILE};

use memory::MemoryTier;
use spill::SpillFile;

/// Where a record was found (or is kept).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Medium {
    /// Host memory.
    Memory,
    /// The spill file.
    Disk,
}

impl Medium {
    /// The label metrics use.
    pub fn name(self) -> &'static str {
        match self {
            Medium::Memory => "memory",
            Medium::Disk => "disk",
        }
    }
}

/// How big the tier is and where its file lives (`--kv-offload-*`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TierConfig {
    /// Bytes of host memory (0: none).
    pub memory_bytes: u64,
    /// The directory of the spill file (`None`: no disk part).
    pub dir: Option<PathBuf>,
    /// Bytes the spill file may take.
    pub disk_bytes: u64,
    /// The store shared by replicas (`--kv-shared`), behind the local tiers.
    pub shared: Option<SharedConfig>,
}

/// Host memory the tier keeps when only a shared store is configured: where fetched blocks wait for
/// their request's admission.
pub const SHARED_LANDING_BYTES: u64 = 512 << 20;

impl TierConfig {
    /// Whether any tier is configured.
    pub fn enabled(&self) -> bool {
        self.memory_bytes > 0 || (self.dir.is_some() && self.disk_bytes > 0) || self.shared.is_some()
    }
}

/// Counters and sizes of the tier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TierStats {
    /// Records and bytes in memory.
    pub memory_blocks: usize,
    /// Bytes in memory.
    pub memory_bytes: u64,
    /// Records in the spill file.
    pub disk_blocks: usize,
    /// Bytes they take in the file.
    pub disk_bytes: u64,
    /// Records stored (blocks evicted from the hot pool into the tier).
    pub stored: u64,
    /// Records moved from memory to disk.
    pub demoted: u64,
    /// Records pushed out of memory with nowhere to go.
    pub dropped_memory: u64,
    /// Records pushed out of the spill file.
    pub dropped_disk: u64,
    /// Blocks fetched from the shared store into memory.
    pub landed: u64,
    /// Lookups that found a record, by medium.
    pub hits_memory: u64,
    /// Hits on the spill file.
    pub hits_disk: u64,
    /// The spill file's own counters.
    pub spill: SpillStats,
}

/// The tier.
#[derive(Debug)]
pub struct SecondTier {
    memory: MemoryTier,
    disk: Option<SpillFile>,
    /// The store shared by replicas: written behind, read ahead of admission (the engine drives it).
    shared: Option<SharedTier>,
    /// KV events of what the tiers keep, while the pool records them.
    events: Option<events::TierEvents>,
    block_bytes: usize,
    stats: TierStats,
}

impl SecondTier {
    /// Opens the tier for blocks of `block_bytes` bytes and `block_size` tokens of a cache with this
    /// fingerprint; an existing spill file's valid records are indexed.
    pub fn open(
        cfg: &TierConfig,
        block_size: usize,
        block_bytes: usize,
        fingerprint: u64,
    ) -> std::io::Result<SecondTier> {
        let disk = match &cfg.dir {
            Some(dir) if cfg.disk_bytes > 0 => Some(SpillFile::open(
                dir,
                cfg.disk_bytes,
                block_size,
                block_bytes,
                fingerprint,
            )?),
            _ => None,
        };
        let shared = match &cfg.shared {
            Some(c) => Some(SharedTier::open(c, fingerprint, block_bytes).map_err(std::io::Error::other)?),
            None => None,
        };
        let memory = if cfg.memory_bytes == 0 && shared.is_some() {
            SHARED_LANDING_BYTES
        } else {
            cfg.memory_bytes
        };
        Ok(SecondTier {
            memory: MemoryTier::new(memory),
            disk,
            shared,
            events: None,
            block_bytes,
            stats: TierStats::default(),
        })
    }

    /// Starts recording KV events of what the tiers keep ([`crate::KvEvent::TierStored`]).
    pub fn record_events(&mut self) {
        self.events.get_or_insert_with(Default::default);
    }

    /// The KV events since the last call (empty when not recording).
    pub fn take_events(&mut self) -> Vec<crate::KvEvent> {
        self.events.as_mut().map(events::TierEvents::take).unwrap_or_default()
    }

    /// The store shared by replicas, when there is one.
    pub fn shared(&self) -> Option<&SharedTier> {
        self.shared.as_ref()
    }

    /// Keeps a block fetched from the shared store where a match finds it (memory first).
    pub(crate) fn land(&mut self, meta: BlockMeta, bytes: Vec<u8>) {
        if bytes.len() != self.block_bytes || self.holds(meta.key, meta.parent, &meta.tokens) {
            return;
        }
        self.stats.landed += 1;
        self.keep(meta, bytes);
    }

    /// Bytes of one record's payload.
    pub fn block_bytes(&self) -> usize {
        self.block_bytes
    }

    /// The spill file's path, if there is one.
    pub fn spill_path(&self) -> Option<&std::path::Path> {
        self.disk.as_ref().map(|d| d.path())
    }

    /// Whether the block `key` (with this parent and tokens) is held, in either medium.
    pub fn holds(&self, key: ChainKey, parent: ChainKey, tokens: &[u32]) -> bool {
        self.memory.holds(key, parent, tokens) || self.disk.as_ref().is_some_and(|d| d.holds(key, parent, tokens))
    }

    /// The bytes of block `key` when held with this parent and tokens (checked, for the spill file).
    pub fn fetch(&mut self, key: ChainKey, parent: ChainKey, tokens: &[u32]) -> Option<(Arc<[u8]>, Medium)> {
        if let Some(b) = self.memory.get(key, parent, tokens) {
            self.stats.hits_memory += 1;
            return Some((b, Medium::Memory));
        }
        let b = self.disk.as_mut()?.get(key, parent, tokens)?;
        self.stats.hits_disk += 1;
        Some((b, Medium::Disk))
    }

    /// Keeps a block evicted from the hot pool: in memory, pushing its least recently used records to
    /// the spill file (or out); straight to the spill file when there is no memory part.
    pub fn store(&mut self, meta: BlockMeta, bytes: Vec<u8>) {
        if bytes.len() != self.block_bytes {
            return;
        }
        self.stats.stored += 1;
        self.keep(meta, bytes);
    }

    /// Memory first; what memory pushes out to the spill file (or out).
    fn keep(&mut self, meta: BlockMeta, bytes: Vec<u8>) {
        let bytes: Arc<[u8]> = bytes.into();
        let out = if self.memory.fits(bytes.len()) {
            if let Some(e) = self.events.as_mut() {
                e.stored(&meta, Medium::Memory);
            }
            self.memory.put(meta, bytes)
        } else {
            vec![(meta, bytes)]
        };
        for (meta, bytes) in out {
            let noted = self.events.is_some().then(|| meta.clone());
            if let Some(e) = self.events.as_mut() {
                e.removed(meta.key, Medium::Memory);
            }
            match self.disk.as_mut() {
                Some(d) => {
                    self.stats.demoted += 1;
                    let (kept, evicted) = d.put(meta, bytes);
                    if let Some(old) = evicted {
                        self.stats.dropped_disk += 1;
                        if let Some(e) = self.events.as_mut() {
                            e.removed(old, Medium::Disk);
                        }
                    }
                    if let (true, Some(m), Some(e)) = (kept, noted, self.events.as_mut()) {
                        e.stored(&m, Medium::Disk);
                    }
                }
                None => self.stats.dropped_memory += 1,
            }
        }
    }

    /// At shutdown: writes what memory holds to the spill file (least recently used first), then the
    /// hot blocks `hot` gives (bytes read on demand) that the file does not hold yet, and waits for the
    /// writer. Without a spill file nothing outlives the process and nothing is done. Returns the
    /// records written.
    pub fn persist(&mut self, hot: Vec<BlockMeta>, mut read: impl FnMut(usize) -> Option<Vec<u8>>) -> usize {
        let Some(d) = self.disk.as_mut() else { return 0 };
        let mut n = 0;
        for (meta, bytes) in self.memory.drain() {
            if !d.holds(meta.key, meta.parent, &meta.tokens) {
                d.put(meta, bytes);
                n += 1;
            }
        }
        for (i, meta) in hot.into_iter().enumerate() {
            if d.holds(meta.key, meta.parent, &meta.tokens) {
                continue;
            }
            if let Some(bytes) = read(i).filter(|b| b.len() == self.block_bytes) {
                d.put(meta, bytes.into());
                n += 1;
            }
        }
        d.flush();
        n
    }

    /// Waits for the spill file's writer (tests; shutdown).
    pub fn flush(&mut self) {
        if let Some(d) = self.disk.as_mut() {
            d.flush();
        }
    }

    /// Counters and sizes.
    pub fn stats(&self) -> TierStats {
        let mut s = self.stats;
        s.memory_blocks = self.memory.len();
        s.memory_bytes = self.memory.used();
        if let Some(d) = &self.disk {
            s.disk_blocks = d.len();
            s.disk_bytes = d.used();
            s.spill = d.stats();
        }
        s
    }

    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        self.memory.check_invariants();
        if let Some(d) = &self.disk {
            d.check_invariants();
        }
    }
}

#[cfg(test)]
mod tests;
