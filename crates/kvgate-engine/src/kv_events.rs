//! KV cache events as vLLM publishes them, for the routers that place requests where their prefix is
//! cached (vllm-router's `kv_aware`, llm-d's indexer, Dynamo): `Stored` when a full block gets its
//! prefix-cache identity (computed, or restored from a second tier), `Removed` when it loses it
//! (evicted from the pool), `AllCleared` when the pool starts over (engine start, reset after a failed
//! step). The block pool records them ([`crate::block_pool::BlockPool::take_kv_events`]); the engine
//! thread hands each step's events to a [`KvEventSink`] as one batch with the next sequence number.
//!
//! Guarantees:
//! - a block's hash is the chain key of its tokens alone (`tier::ChainKey` with no path key, folded
//!   to 64 bits): the same token prefix gets the same hash in every process, and a block computed on
//!   the exact path (a decision's state) and its fast-path twin (a completion's) are one published
//!   block — stored when the first of them is cached, removed when the last one goes. Consumers index
//!   by these hashes (vllm-router anchors one engine hash per token position: two hashes for one
//!   prefix would orphan the second's children). A `Stored` names its parent's hash (`None` for a
//!   sequence's first block), which was itself published before (or in the same batch);
//! - blocks under a tenant's `cache_salt` (or an API key's salt) are never published: their token ids
//!   would tell whoever reads the stream what another tenant sent, and a router cannot route to a
//!   salted prefix anyway (it does not know the salt). Their children share the salt, so they are not
//!   published either; consumers see those requests as cache misses;
//! - publishing never blocks the engine: the sink's queue is bounded, a batch that does not fit is
//!   dropped and counted (`kvgate:kv_events_dropped_batches_total`), and its sequence number is still
//!   consumed, so a consumer sees the gap (and resynchronises as vLLM's consumers do: replay, or purge
//!   the replica's index).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::tier::ChainKey;

/// One event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvEvent {
    /// A full block got its prefix-cache identity.
    Stored {
        /// The block's hash.
        hash: u64,
        /// Its parent's hash (`None`: the first block of a sequence).
        parent: Option<u64>,
        /// Its tokens (one block's worth).
        tokens: Box<[u32]>,
    },
    /// A block lost its identity (evicted).
    Removed {
        /// The block's hash.
        hash: u64,
    },
    /// Every block is gone (the pool starts over).
    AllCleared,
    /// A block evicted from the KV cache is kept by a tier of this replica (`medium`: host memory or
    /// the spill file) — vLLM's `BlockStored` with medium `CPU` (or `DISK`).
    TierStored {
        /// The block's hash (as its `Stored` named it).
        hash: u64,
        /// Its parent's hash.
        parent: Option<u64>,
        /// Its tokens.
        tokens: Box<[u32]>,
        /// Where it is kept.
        medium: crate::tier::Medium,
    },
    /// A tier of this replica no longer keeps the block.
    TierRemoved {
        /// The block's hash.
        hash: u64,
        /// Where it was kept.
        medium: crate::tier::Medium,
    },
}

/// The published hash of a chain key.
pub fn block_hash(key: ChainKey) -> u64 {
    (key.0 as u64) ^ ((key.0 >> 64) as u64)
}

/// One step's events with their sequence number (from 1, no gaps but dropped batches) and time.
#[derive(Debug, Clone, PartialEq)]
pub struct KvEventBatch {
    /// Sequence number.
    pub seq: u64,
    /// Unix time in seconds.
    pub ts: f64,
    /// The events, in the order they happened.
    pub events: Vec<KvEvent>,
}

/// Where the engine thread hands its batches: a bounded queue that never blocks.
#[derive(Debug, Clone)]
pub struct KvEventSink {
    tx: mpsc::Sender<KvEventBatch>,
    seq: Arc<AtomicU64>,
    dropped: Arc<AtomicU64>,
}

impl PartialEq for KvEventSink {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.seq, &other.seq)
    }
}

impl KvEventSink {
    /// A sink whose queue holds `capacity` batches, and the receiving end.
    pub fn channel(capacity: usize) -> (KvEventSink, mpsc::Receiver<KvEventBatch>) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        let sink = KvEventSink {
            tx,
            seq: Arc::new(AtomicU64::new(0)),
            dropped: Arc::new(AtomicU64::new(0)),
        };
        (sink, rx)
    }

    /// Queues `events` as the next batch (nothing for an empty list); a full queue drops it, counted,
    /// its sequence number spent.
    pub fn publish(&self, events: Vec<KvEvent>) {
        if events.is_empty() {
            return;
        }
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        if self.tx.try_send(KvEventBatch { seq, ts, events }).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            metrics::counter!(crate::metrics::KV_EVENTS_DROPPED).increment(1);
        }
    }

    /// Batches dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_number_from_one_and_a_full_queue_leaves_a_gap() {
        let (sink, mut rx) = KvEventSink::channel(2);
        sink.publish(vec![]);
        for _ in 0..3 {
            sink.publish(vec![KvEvent::AllCleared]);
        }
        assert_eq!(sink.dropped(), 1);
        assert_eq!(rx.try_recv().unwrap().seq, 1);
        assert_eq!(rx.try_recv().unwrap().seq, 2);
        assert!(rx.try_recv().is_err());
        sink.publish(vec![KvEvent::Removed { hash: 5 }]);
        assert_eq!(rx.try_recv().unwrap().seq, 4, "the dropped batch's number stays spent");
    }

    /// A consumer that indexes the stream as llm-d's indexer does (a store whose parent it does not
    /// hold would be dropped; a removal of a hash it does not hold is an error) holds, after every step
    /// of a seeded random workload over a small pool (shared prefixes, evictions, tenant salts, the
    /// fast path reading exact blocks), exactly the pool's unsalted cached blocks.
    #[test]
    fn a_consumer_indexing_the_stream_always_agrees_with_the_pool() {
        use std::collections::HashSet;

        use rand::{Rng, SeedableRng};
        use rand_chacha::ChaCha8Rng;

        use crate::block_pool::BlockPool;
        use crate::kv_manager::{KvManager, SeqBlocks};
        use crate::salts::{fast_key, Salts};

        let (fast, fast_salted) = (fast_key("f", ""), fast_key("f", "t"));
        for seed in 0..16 {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let mut m = KvManager::new(BlockPool::new(24), 4, true);
            m.pool_mut().record_kv_events();
            // odd seeds: a host-memory tier of 6 blocks behind the pool, publishing what it keeps
            let tiered = seed % 2 == 1;
            if tiered {
                let cfg = crate::tier::TierConfig {
                    memory_bytes: 6 * 16,
                    ..Default::default()
                };
                m.set_tier(Some(crate::tier::SecondTier::open(&cfg, 4, 16, 1).unwrap()));
            }
            let mut index: HashSet<u64> = HashSet::new();
            let mut in_memory: HashSet<u64> = HashSet::new();
            let mut ever: HashSet<u64> = HashSet::new();
            let mut kept = 0;
            let mut live: Vec<SeqBlocks> = vec![];
            let (mut stored, mut removed) = (0, 0);
            for _ in 0..400 {
                if !live.is_empty() && rng.random_bool(0.45) {
                    let mut sb = live.swap_remove(rng.random_range(0..live.len()));
                    m.release(&mut sb);
                } else {
                    let base = rng.random_range(0..4u32) * 1000;
                    let toks: Vec<u32> = (0..rng.random_range(1..22u32)).map(|i| base + i).collect();
                    let salts = match rng.random_range(0..4) {
                        0 => Salts { own: "", exact: None },
                        1 => Salts { own: "t", exact: None },
                        2 => Salts {
                            own: &fast,
                            exact: Some(""),
                        },
                        _ => Salts {
                            own: &fast_salted,
                            exact: Some("t"),
                        },
                    };
                    let mut sb = m.match_prefix(&toks, usize::MAX, salts, false);
                    let hit = (sb.len() * 4).min(toks.len() - 1);
                    if m.reserve(&mut sb, hit, toks.len(), &mut vec![]) {
                        m.commit(&mut sb, &toks, toks.len(), salts.own, false);
                        live.push(sb);
                    } else {
                        m.release(&mut sb);
                    }
                }
                // the engine keeps what the step evicted (before the events are taken)
                for (_, meta) in m.take_tier_ops().spills {
                    if let Some(t) = m.tier_mut() {
                        t.store(meta, vec![0; 16]);
                    }
                }
                let mut events = m.pool_mut().take_kv_events();
                events.extend(m.tier_mut().map(|t| t.take_events()).unwrap_or_default());
                for e in events {
                    match e {
                        KvEvent::AllCleared => index.clear(),
                        KvEvent::Stored { hash, parent, tokens } => {
                            if let Some(p) = parent {
                                assert!(index.contains(&p), "seed {seed}: a store whose parent is unknown");
                            }
                            assert_eq!(tokens.len(), 4);
                            assert!(tokens.iter().all(|&t| t % 1000 < 22), "token ids as committed");
                            assert!(index.insert(hash), "seed {seed}: stored twice");
                            ever.insert(hash);
                            stored += 1;
                        }
                        KvEvent::Removed { hash } => {
                            assert!(index.remove(&hash), "seed {seed}: removal of an unknown hash");
                            removed += 1;
                        }
                        // a tier keeps only what the cache published first, once per medium
                        KvEvent::TierStored { hash, medium, .. } => {
                            assert!(tiered && medium == crate::tier::Medium::Memory);
                            assert!(ever.contains(&hash), "seed {seed}: a tier store of an unknown hash");
                            assert!(in_memory.insert(hash), "seed {seed}: kept twice");
                            kept += 1;
                        }
                        KvEvent::TierRemoved { hash, .. } => {
                            assert!(
                                in_memory.remove(&hash),
                                "seed {seed}: a tier removal of an unknown hash"
                            );
                        }
                    }
                }
                assert_eq!(index, m.pool().published_hashes(), "seed {seed}");
            }
            assert!(
                stored > 20 && removed > 5,
                "seed {seed}: the workload evicts ({stored}, {removed})"
            );
            assert!(!tiered || kept > 5, "seed {seed}: the tier kept blocks ({kept})");
            assert!(in_memory.len() <= 6, "the tier holds at most 6");
        }
    }

    /// An exact block and its fast-path twin (same tokens, different path keys) are one published
    /// block: stored once, removed with the last of them; a salted one never shows.
    #[test]
    fn twins_publish_once_and_salted_blocks_never() {
        use crate::block_pool::BlockPool;
        use crate::salts::fast_key;

        let mut p = BlockPool::new(3);
        p.record_kv_events();
        let fast = fast_key("f", "");
        let (a, _) = p.allocate_evicting().unwrap();
        p.register(a, None, ChainKey::ROOT, &[1, 2], "");
        let (b, _) = p.allocate_evicting().unwrap();
        p.register(b, None, ChainKey::ROOT, &[1, 2], &fast);
        let (c, _) = p.allocate_evicting().unwrap();
        p.register(c, None, ChainKey::ROOT, &[1, 2], &fast_key("f", "tenant"));
        let ev = p.take_kv_events();
        let stored: Vec<_> = ev.iter().filter(|e| matches!(e, KvEvent::Stored { .. })).collect();
        assert_eq!(ev[0], KvEvent::AllCleared);
        assert_eq!(stored.len(), 1, "{ev:?}");
        for x in [a, b, c] {
            p.decref(x);
        }
        // reuse all three: the exact one goes first (no event), then its twin (removed), then the
        // salted one (nothing)
        for _ in 0..3 {
            p.allocate_evicting().unwrap();
        }
        let ev = p.take_kv_events();
        assert_eq!(ev.len(), 1, "{ev:?}");
        assert!(matches!(ev[0], KvEvent::Removed { .. }));
    }

    #[test]
    fn hashes_fold_both_halves() {
        assert_eq!(block_hash(ChainKey(0)), 0);
        assert_ne!(block_hash(ChainKey(1 << 64)), block_hash(ChainKey(2 << 64)));
    }
}
