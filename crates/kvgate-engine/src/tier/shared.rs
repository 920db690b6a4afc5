//! The shared KV tier (`--kv-shared redis://host:port[/db]`): full blocks kept in Redis (or Valkey)
//! by replicas of one model, so a session whose replica died finds its prefix warm on another.
//!
//! The engine never waits on the network on its step path. A worker thread owns an async, multiplexed
//! connection (the `redis` crate's `ConnectionManager`, which reconnects by itself) and takes two
//! kinds of work over bounded queues: *stores* — write-behind of every block the prefix cache
//! registers, as a [`super::record`] with a TTL (dropped, and counted, when the queue is full or the
//! store is down: a later replica recomputes) — and *fetches* — a waiting request's blocks past what
//! the local tiers hold, read in order with `MGET`, each record verified ([`super::record::decode`]),
//! stopping at the first missing or refused one. Fetched blocks land in the local memory tier, where
//! the request's admission finds them as any tier hit (the engine holds the request back until its
//! fetch answers or `timeout` passes). Redis down, slow, restarted, flushed, full or answering garbage
//! is a miss (and a counter and a warning), never a failed request.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tracing::{info, warn};

use super::key::BlockMeta;
use super::record::{self, Refused};

/// Where the store is and how it is used (`--kv-shared*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedConfig {
    /// `redis://host:port[/db]` (or `rediss://`, `unix://`).
    pub url: String,
    /// How long a block is kept after it was last written.
    pub ttl: Duration,
    /// Most time a waiting request is held for its fetch (and a command may take).
    pub timeout: Duration,
}

/// Counters of the shared tier (monotonic).
#[derive(Debug, Default)]
pub(crate) struct SharedCounters {
    /// Blocks fetched and verified.
    pub(crate) hits: AtomicU64,
    /// Blocks asked for and not found (the first missing block ends a fetch).
    pub(crate) misses: AtomicU64,
    /// Records refused by verification.
    pub(crate) refused: AtomicU64,
    /// Bytes read from the store.
    pub(crate) bytes_in: AtomicU64,
    /// Bytes written to it.
    pub(crate) bytes_out: AtomicU64,
    /// Blocks written.
    pub(crate) stored: AtomicU64,
    /// Blocks not written (queue full, store down, a failed write).
    pub(crate) dropped: AtomicU64,
    /// Connection failures, timeouts and error replies.
    pub(crate) errors: AtomicU64,
    /// Fetches answered, and their total time in microseconds.
    pub(crate) fetches: AtomicU64,
    pub(crate) fetch_micros: AtomicU64,
}

/// A snapshot of [`SharedCounters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SharedStats {
    /// Blocks fetched and verified.
    pub hits: u64,
    /// Blocks asked for and not found.
    pub misses: u64,
    /// Records refused by verification (torn, foreign, mislabelled, corrupted).
    pub refused: u64,
    /// Bytes read from the store.
    pub bytes_in: u64,
    /// Bytes written to it.
    pub bytes_out: u64,
    /// Blocks written.
    pub stored: u64,
    /// Blocks not written.
    pub dropped: u64,
    /// Connection failures, timeouts and error replies.
    pub errors: u64,
    /// Fetches answered.
    pub fetches: u64,
    /// Their total time, in microseconds.
    pub fetch_micros: u64,
}

impl SharedCounters {
    fn snapshot(&self) -> SharedStats {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SharedStats {
            hits: g(&self.hits),
            misses: g(&self.misses),
            refused: g(&self.refused),
            bytes_in: g(&self.bytes_in),
            bytes_out: g(&self.bytes_out),
            stored: g(&self.stored),
            dropped: g(&self.dropped),
            errors: g(&self.errors),
            fetches: g(&self.fetches),
            fetch_micros: g(&self.fetch_micros),
        }
    }
}

/// What a fetch found: the blocks, in order from the first asked, that the store held and that
/// verified.
#[derive(Debug)]
pub(crate) struct Fetched {
    /// The tag the fetch was asked with (the request's group).
    pub(crate) tag: u64,
    pub(crate) blocks: Vec<(BlockMeta, Vec<u8>)>,
}

/// Blocks queued for writing at most (about 200 KiB each for a 0.5B model in f16: ~200 MiB).
const STORE_QUEUE: usize = 1024;
/// Records per `MGET` and per write pipeline.
const BATCH: usize = 32;
/// Wait between reconnection attempts while the store is down.
const RECONNECT: Duration = Duration::from_secs(1);

/// The engine's handle on the shared tier.
#[derive(Debug)]
pub struct SharedTier {
    stores: tokio::sync::mpsc::Sender<(BlockMeta, Vec<u8>)>,
    fetches: tokio::sync::mpsc::Sender<(u64, Vec<BlockMeta>)>,
    done: mpsc::Receiver<Fetched>,
    counters: Arc<SharedCounters>,
    timeout: Duration,
}

impl SharedTier {
    /// Starts the worker for blocks of `block_bytes` bytes of a cache with `fingerprint`; the store
    /// is connected in the background (an unreachable one is a miss until it answers).
    pub fn open(cfg: &SharedConfig, fingerprint: u64, block_bytes: usize) -> Result<SharedTier, String> {
        let client = redis::Client::open(cfg.url.as_str()).map_err(|e| format!("--kv-shared {}: {e}", cfg.url))?;
        let (stores, store_rx) = tokio::sync::mpsc::channel(STORE_QUEUE);
        let (fetches, fetch_rx) = tokio::sync::mpsc::channel(64);
        let (done_tx, done) = mpsc::channel();
        let counters = Arc::new(SharedCounters::default());
        let worker = Worker {
            client,
            url: cfg.url.clone(),
            ttl: cfg.ttl.as_secs().max(1),
            timeout: cfg.timeout,
            fingerprint,
            block_bytes,
            counters: counters.clone(),
            done: done_tx,
        };
        std::thread::Builder::new()
            .name("kvgate-shared-tier".into())
            .spawn(move || worker.run(store_rx, fetch_rx))
            .map_err(|e| format!("--kv-shared: starting its worker: {e}"))?;
        Ok(SharedTier {
            stores,
            fetches,
            done,
            counters,
            timeout: cfg.timeout,
        })
    }

    /// Queues block `meta`'s bytes for writing (dropped and counted when the queue is full).
    pub(crate) fn store(&self, meta: BlockMeta, bytes: Vec<u8>) {
        if self.stores.try_send((meta, bytes)).is_err() {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Asks for `blocks` (a prefix's next blocks, in order) under `tag`; false when it cannot be
    /// asked now (the fetch queue is full or the worker gone): nothing will answer.
    pub(crate) fn fetch(&self, tag: u64, blocks: Vec<BlockMeta>) -> bool {
        self.fetches.try_send((tag, blocks)).is_ok()
    }

    /// The fetches answered since the last call.
    pub(crate) fn answered(&self) -> Vec<Fetched> {
        self.done.try_iter().collect()
    }

    /// How long a waiting request is held for its fetch.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The counters.
    pub fn stats(&self) -> SharedStats {
        self.counters.snapshot()
    }
}

/// The worker thread's state.
struct Worker {
    client: redis::Client,
    url: String,
    ttl: u64,
    timeout: Duration,
    fingerprint: u64,
    block_bytes: usize,
    counters: Arc<SharedCounters>,
    done: mpsc::Sender<Fetched>,
}

impl Worker {
    fn run(
        self,
        mut stores: tokio::sync::mpsc::Receiver<(BlockMeta, Vec<u8>)>,
        mut fetches: tokio::sync::mpsc::Receiver<(u64, Vec<BlockMeta>)>,
    ) {
        let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(rt) => rt,
            Err(e) => {
                warn!(error = %e, "the shared KV tier's worker could not start; running without it");
                return;
            }
        };
        let me = Arc::new(self);
        rt.block_on(async move {
            // fetches and stores on their own tasks (and connections): a slow write never holds a
            // waiting request's fetch
            let w = me.clone();
            let fetching = tokio::spawn(async move {
                let mut conn = Link::default();
                while let Some((tag, blocks)) = fetches.recv().await {
                    match conn.get(&w).await {
                        Some(c) => {
                            let w = w.clone();
                            tokio::spawn(async move { w.fetch(c, tag, blocks).await });
                        }
                        None => {
                            // down: a fetch finds nothing
                            w.counters.misses.fetch_add(blocks.len() as u64, Ordering::Relaxed);
                            let _ = w.done.send(Fetched { tag, blocks: vec![] });
                        }
                    }
                }
            });
            let mut conn = Link::default();
            while let Some(first) = stores.recv().await {
                let mut batch = vec![first];
                while batch.len() < BATCH {
                    match stores.try_recv() {
                        Ok(s) => batch.push(s),
                        Err(_) => break,
                    }
                }
                match conn.get(&me).await {
                    // one batch at a time: a slow store fills the queue, which then drops
                    Some(c) => me.store(c, batch).await,
                    None => {
                        me.counters.dropped.fetch_add(batch.len() as u64, Ordering::Relaxed);
                    }
                }
            }
            let _ = fetching.await;
        });
    }

    async fn connect(&self) -> Option<ConnectionManager> {
        let cfg = ConnectionManagerConfig::new()
            .set_connection_timeout(self.timeout)
            .set_response_timeout(self.timeout)
            .set_number_of_retries(1);
        match tokio::time::timeout(self.timeout * 2, self.client.get_connection_manager_with_config(cfg)).await {
            Ok(Ok(c)) => {
                info!(url = %self.url, "shared KV tier connected");
                Some(c)
            }
            Ok(Err(e)) => {
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
                warn!(url = %self.url, error = %e, "shared KV tier unreachable; serving from the local tiers");
                None
            }
            Err(_) => {
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
                warn!(url = %self.url, "shared KV tier: connecting timed out; serving from the local tiers");
                None
            }
        }
    }

    async fn store(&self, mut c: ConnectionManager, batch: Vec<(BlockMeta, Vec<u8>)>) {
        let mut pipe = redis::pipe();
        let mut bytes = 0;
        for (meta, payload) in &batch {
            let rec = record::encode(self.fingerprint, meta, payload);
            bytes += rec.len() as u64;
            pipe.set_ex(record::redis_key(self.fingerprint, meta.key), rec, self.ttl)
                .ignore();
        }
        match tokio::time::timeout(self.timeout * 4, pipe.query_async::<()>(&mut c)).await {
            Ok(Ok(())) => {
                self.counters.stored.fetch_add(batch.len() as u64, Ordering::Relaxed);
                self.counters.bytes_out.fetch_add(bytes, Ordering::Relaxed);
            }
            Ok(Err(e)) => {
                // a full store (OOM under noeviction), a restart: the blocks are simply not there
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
                self.counters.dropped.fetch_add(batch.len() as u64, Ordering::Relaxed);
                warn!(error = %e, blocks = batch.len(), "shared KV tier: a write failed");
            }
            Err(_) => {
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
                self.counters.dropped.fetch_add(batch.len() as u64, Ordering::Relaxed);
                warn!(blocks = batch.len(), "shared KV tier: a write timed out");
            }
        }
    }

    async fn fetch(&self, mut c: ConnectionManager, tag: u64, blocks: Vec<BlockMeta>) {
        let t0 = Instant::now();
        let mut found = vec![];
        let total = blocks.len();
        'batches: for chunk in blocks.chunks(BATCH) {
            let keys: Vec<String> = chunk
                .iter()
                .map(|m| record::redis_key(self.fingerprint, m.key))
                .collect();
            let got = tokio::time::timeout(
                self.timeout,
                redis::cmd("MGET")
                    .arg(&keys)
                    .query_async::<Vec<Option<Vec<u8>>>>(&mut c),
            )
            .await;
            let values = match got {
                Ok(Ok(v)) if v.len() == chunk.len() => v,
                Ok(Ok(_)) => {
                    self.counters.errors.fetch_add(1, Ordering::Relaxed);
                    warn!("shared KV tier: MGET answered the wrong number of values");
                    break;
                }
                Ok(Err(e)) => {
                    self.counters.errors.fetch_add(1, Ordering::Relaxed);
                    warn!(error = %e, "shared KV tier: a read failed; recomputing");
                    break;
                }
                Err(_) => {
                    self.counters.errors.fetch_add(1, Ordering::Relaxed);
                    warn!("shared KV tier: a read timed out; recomputing");
                    break;
                }
            };
            for (meta, v) in chunk.iter().zip(values) {
                let Some(rec) = v else { break 'batches };
                self.counters.bytes_in.fetch_add(rec.len() as u64, Ordering::Relaxed);
                match record::decode(&rec, self.fingerprint, meta, self.block_bytes) {
                    Ok(bytes) => found.push((meta.clone(), bytes)),
                    Err(why) => {
                        self.counters.refused.fetch_add(1, Ordering::Relaxed);
                        warn_refused(why);
                        break 'batches;
                    }
                }
            }
        }
        let c = &self.counters;
        c.hits.fetch_add(found.len() as u64, Ordering::Relaxed);
        c.misses.fetch_add((total - found.len()) as u64, Ordering::Relaxed);
        c.fetches.fetch_add(1, Ordering::Relaxed);
        c.fetch_micros
            .fetch_add(t0.elapsed().as_micros() as u64, Ordering::Relaxed);
        let _ = self.done.send(Fetched { tag, blocks: found });
    }
}

fn warn_refused(why: Refused) {
    warn!(reason = ?why, "shared KV tier: a record failed verification; it is dropped and recomputed");
}

/// One task's connection: made on first use, tried again at most every [`RECONNECT`] while the store
/// is down; once made, the `ConnectionManager` reconnects by itself.
#[derive(Default)]
struct Link {
    conn: Option<ConnectionManager>,
    last_try: Option<Instant>,
}

impl Link {
    async fn get(&mut self, w: &Worker) -> Option<ConnectionManager> {
        if self.conn.is_none() && self.last_try.is_none_or(|t| t.elapsed() >= RECONNECT) {
            self.last_try = Some(Instant::now());
            self.conn = w.connect().await;
        }
        self.conn.clone()
    }
}
