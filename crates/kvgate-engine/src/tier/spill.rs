//! The second tier's disk part: one spill file of fixed-size slots under a byte budget, written by its
//! own thread so the engine never waits on the disk to evict.
//!
//! A slot holds one record: a header (magic, the cache's fingerprint, the block's key and its parent's,
//! token count, payload length), the tokens, the block's bytes, and an xxh3-64 checksum over all of
//! them. Crash safety: the file is only a cache — a record is served only when its magic, fingerprint,
//! key, parent, tokens, length and checksum all check out when it is read, so a torn write, a file of
//! another model or dtype, or a flipped bit is dropped, never served. On open, an existing file's
//! headers are indexed (a later run restores what an earlier one spilled); one process holds the file
//! (an exclusive lock), a second one gets an error naming it.
//!
//! Until the writer has written a record, reads are served from the bytes it was handed.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use xxhash_rust::xxh3::xxh3_64;

use super::key::{BlockMeta, ChainKey};

const MAGIC: &[u8; 8] = b"KVGSPIL1";
const HEADER: usize = 8 + 8 + 16 + 16 + 4 + 4;

/// The spill file's name inside `--kv-offload-dir`.
pub const SPILL_FILE: &str = "kvgate-kv-spill.bin";

#[derive(Debug)]
struct Entry {
    meta: BlockMeta,
    slot: u64,
    tick: u64,
    /// The payload until the writer confirms the slot is written.
    pending: Option<Arc<[u8]>>,
}

struct Job {
    slot: u64,
    meta: BlockMeta,
    bytes: Arc<[u8]>,
}

/// What the disk did with a job.
type Ack = (u64, ChainKey, bool);

#[derive(Debug)]
struct Writer {
    tx: Option<Sender<Job>>,
    acks: Receiver<Ack>,
    handle: Option<JoinHandle<()>>,
}

/// Counters of the disk part.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpillStats {
    /// Records found valid on open.
    pub reloaded: u64,
    /// Records written.
    pub written: u64,
    /// Writes that failed (the record is dropped).
    pub write_errors: u64,
    /// Records that failed a check when read (dropped, not served).
    pub rejected: u64,
}

/// The spill file.
#[derive(Debug)]
pub(crate) struct SpillFile {
    path: PathBuf,
    file: File,
    fingerprint: u64,
    block_size: usize,
    block_bytes: usize,
    slot_size: u64,
    capacity: u64,
    index: HashMap<ChainKey, Entry>,
    lru: BTreeMap<u64, ChainKey>,
    tick: u64,
    free: Vec<u64>,
    next: u64,
    writer: Writer,
    stats: SpillStats,
}

fn slot_size(block_size: usize, block_bytes: usize) -> u64 {
    (HEADER + 4 * block_size + block_bytes + 8) as u64
}

fn encode(fingerprint: u64, meta: &BlockMeta, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + 4 * meta.tokens.len() + payload.len() + 8);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&fingerprint.to_le_bytes());
    out.extend_from_slice(&meta.key.0.to_le_bytes());
    out.extend_from_slice(&meta.parent.0.to_le_bytes());
    out.extend_from_slice(&(meta.tokens.len() as u32).to_le_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    for t in meta.tokens.iter() {
        out.extend_from_slice(&t.to_le_bytes());
    }
    out.extend_from_slice(payload);
    let sum = xxh3_64(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u128_at(b: &[u8], at: usize) -> u128 {
    u128::from_le_bytes(b[at..at + 16].try_into().expect("16 bytes"))
}

impl SpillFile {
    /// Opens (creating it if needed) `dir/`[`SPILL_FILE`] for blocks of `block_bytes` bytes and
    /// `block_size` tokens, at most `budget` bytes, and indexes the valid records an earlier run left.
    pub(crate) fn open(
        dir: &Path,
        budget: u64,
        block_size: usize,
        block_bytes: usize,
        fingerprint: u64,
    ) -> io::Result<SpillFile> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(SPILL_FILE);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        file.try_lock().map_err(|e| {
            io::Error::new(
                io::ErrorKind::WouldBlock,
                format!("{} is in use by another process ({e})", path.display()),
            )
        })?;
        let slot_size = slot_size(block_size, block_bytes);
        let capacity = budget / slot_size;
        let writer = Self::spawn_writer(file.try_clone()?, fingerprint, slot_size)?;
        let mut s = SpillFile {
            path,
            file,
            fingerprint,
            block_size,
            block_bytes,
            slot_size,
            capacity,
            index: HashMap::new(),
            lru: BTreeMap::new(),
            tick: 0,
            free: vec![],
            next: 0,
            writer,
            stats: SpillStats::default(),
        };
        s.reload()?;
        Ok(s)
    }

    fn spawn_writer(file: File, fingerprint: u64, slot_size: u64) -> io::Result<Writer> {
        let (tx, rx) = channel::<Job>();
        let (ack_tx, acks) = channel::<Ack>();
        let handle = std::thread::Builder::new().name("kvgate-spill".into()).spawn(move || {
            for job in rx {
                let rec = encode(fingerprint, &job.meta, &job.bytes);
                let ok = file.write_all_at(&rec, job.slot * slot_size).is_ok();
                if ack_tx.send((job.slot, job.meta.key, ok)).is_err() {
                    break;
                }
            }
        })?;
        Ok(Writer {
            tx: Some(tx),
            acks,
            handle: Some(handle),
        })
    }

    /// Indexes the records of an existing file whose headers are of this cache; every other slot is free.
    fn reload(&mut self) -> io::Result<()> {
        let len = self.file.metadata()?.len();
        let slots = (len / self.slot_size).min(self.capacity);
        let mut head = vec![0u8; HEADER + 4 * self.block_size];
        for slot in 0..slots {
            let meta = match self.file.read_exact_at(&mut head, slot * self.slot_size) {
                Ok(()) => self.parse_header(&head),
                Err(_) => None,
            };
            match meta {
                Some(meta) if !self.index.contains_key(&meta.key) => {
                    self.stats.reloaded += 1;
                    self.insert(meta, slot, None);
                }
                _ => self.free.push(slot),
            }
        }
        self.next = slots;
        Ok(())
    }

    /// The record's identity from a slot's header and tokens, when they are of this cache.
    fn parse_header(&self, b: &[u8]) -> Option<BlockMeta> {
        let ok = &b[0..8] == MAGIC
            && u64::from_le_bytes(b[8..16].try_into().ok()?) == self.fingerprint
            && u32_at(b, 48) as usize == self.block_size
            && u32_at(b, 52) as usize == self.block_bytes;
        ok.then(|| BlockMeta {
            key: ChainKey(u128_at(b, 16)),
            parent: ChainKey(u128_at(b, 32)),
            tokens: (0..self.block_size).map(|i| u32_at(b, HEADER + 4 * i)).collect(),
            published: None,
        })
    }

    fn insert(&mut self, meta: BlockMeta, slot: u64, pending: Option<Arc<[u8]>>) {
        self.tick += 1;
        self.lru.insert(self.tick, meta.key);
        self.index.insert(
            meta.key,
            Entry {
                meta,
                slot,
                tick: self.tick,
                pending,
            },
        );
    }

    /// Applies the writer's confirmations: written records are read from the file from now on, failed
    /// ones are dropped.
    fn drain_acks(&mut self) {
        while let Ok((slot, key, ok)) = self.writer.acks.try_recv() {
            if self.index.get(&key).is_none_or(|e| e.slot != slot) {
                continue;
            }
            if ok {
                self.stats.written += 1;
                if let Some(e) = self.index.get_mut(&key) {
                    e.pending = None;
                }
            } else {
                self.stats.write_errors += 1;
                self.remove(key);
            }
        }
    }

    /// Records held.
    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }

    /// Bytes the held records take in the file.
    pub(crate) fn used(&self) -> u64 {
        self.index.len() as u64 * self.slot_size
    }

    /// Counters.
    pub(crate) fn stats(&self) -> SpillStats {
        self.stats
    }

    /// Whether the record `key` with this parent and tokens is indexed.
    pub(crate) fn holds(&self, key: ChainKey, parent: ChainKey, tokens: &[u32]) -> bool {
        self.index.get(&key).is_some_and(|e| e.meta.is(key, parent, tokens))
    }

    /// The block's bytes, read and checked (a record failing any check is dropped and `None` returned).
    pub(crate) fn get(&mut self, key: ChainKey, parent: ChainKey, tokens: &[u32]) -> Option<Arc<[u8]>> {
        self.drain_acks();
        if !self.holds(key, parent, tokens) {
            return None;
        }
        let e = self.index.get_mut(&key)?;
        self.lru.remove(&e.tick);
        self.tick += 1;
        e.tick = self.tick;
        self.lru.insert(self.tick, key);
        if let Some(p) = &e.pending {
            return Some(p.clone());
        }
        let slot = e.slot;
        let got = self.read_record(slot, key, parent, tokens);
        if got.is_none() {
            self.stats.rejected += 1;
            self.remove(key);
        }
        got
    }

    fn read_record(&self, slot: u64, key: ChainKey, parent: ChainKey, tokens: &[u32]) -> Option<Arc<[u8]>> {
        let mut buf = vec![0u8; self.slot_size as usize];
        self.file.read_exact_at(&mut buf, slot * self.slot_size).ok()?;
        let body = buf.len() - 8;
        let sum = u64::from_le_bytes(buf[body..].try_into().ok()?);
        if xxh3_64(&buf[..body]) != sum {
            return None;
        }
        let meta = self.parse_header(&buf)?;
        if !meta.is(key, parent, tokens) {
            return None;
        }
        let at = HEADER + 4 * self.block_size;
        Some(Arc::from(&buf[at..at + self.block_bytes]))
    }

    /// Hands a record to the writer (taking the least recently used slot when the file is full).
    /// Returns whether it is kept and the key of a record pushed out to make room; a record of the
    /// wrong size is not kept.
    pub(crate) fn put(&mut self, meta: BlockMeta, bytes: Arc<[u8]>) -> (bool, Option<ChainKey>) {
        self.drain_acks();
        if self.capacity == 0 || bytes.len() != self.block_bytes || meta.tokens.len() != self.block_size {
            return (false, None);
        }
        self.remove(meta.key);
        let mut evicted = None;
        let slot = if let Some(s) = self.free.pop() {
            s
        } else if self.next < self.capacity {
            self.next += 1;
            self.next - 1
        } else {
            let Some((_, old)) = self.lru.pop_first() else {
                return (false, None);
            };
            let Some(e) = self.index.remove(&old) else {
                return (false, None);
            };
            evicted = Some(old);
            e.slot
        };
        let Some(tx) = &self.writer.tx else {
            return (false, evicted);
        };
        if tx
            .send(Job {
                slot,
                meta: meta.clone(),
                bytes: bytes.clone(),
            })
            .is_err()
        {
            self.free.push(slot);
            return (false, evicted);
        }
        self.insert(meta, slot, Some(bytes));
        (true, evicted)
    }

    /// Drops record `key`, if indexed (its slot becomes free).
    pub(crate) fn remove(&mut self, key: ChainKey) {
        if let Some(e) = self.index.remove(&key) {
            self.lru.remove(&e.tick);
            self.free.push(e.slot);
        }
    }

    /// Waits until every handed record is written (tests; shutdown).
    pub(crate) fn flush(&mut self) {
        self.writer.tx = None;
        if let Some(h) = self.writer.handle.take() {
            let _ = h.join();
        }
        self.drain_acks();
        if let Ok(w) = self
            .file
            .try_clone()
            .and_then(|f| Self::spawn_writer(f, self.fingerprint, self.slot_size))
        {
            self.writer = w;
        }
    }

    /// The file's path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        assert_eq!(self.index.len(), self.lru.len());
        assert!(self.index.len() as u64 <= self.capacity);
        let mut slots: Vec<u64> = self
            .index
            .values()
            .map(|e| e.slot)
            .chain(self.free.iter().copied())
            .collect();
        slots.sort();
        let n = slots.len();
        slots.dedup();
        assert_eq!(slots.len(), n, "a slot is both used and free, or used twice");
        assert!(slots.iter().all(|&s| s < self.next));
    }
}

impl Drop for SpillFile {
    fn drop(&mut self) {
        self.writer.tx = None;
        if let Some(h) = self.writer.handle.take() {
            let _ = h.join();
        }
    }
}
