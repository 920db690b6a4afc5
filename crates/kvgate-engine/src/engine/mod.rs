//! The engine thread: the loop. It owns the backend (KV storage + forward pass), the scheduler (with the
//! block pool, prefix cache, sequences and pins) and every request's state, and
//! loops: take commands, drop requests whose caller went away, plan a step, flatten it into a batch, run
//! it on the backend, hand each chunk's output to its request kind ([`crate::kinds`]), apply what
//! they did to the sequences in one scheduler call, free what ended.
//!
//! Every way a request ends goes through [`Engine::end_request`], which releases its blocks: finished,
//! stopped, cancelled (stream dropped or abort), failed, or the engine resetting after a failed or
//! panicking step (the requests in flight fail with an error and the engine keeps serving).

mod start;
mod tier_io;

pub use start::{start, start_with_draft};

use tier_io::open_tier;

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use kvgate_backend::{Backend, Batch, KvCalibration, Precision, Scales, StepOutput};
use tracing::{error, info, warn};

use crate::batch::{self, ChunkWant};
use crate::config::EngineConfig;
use crate::constraint::GuideState;
use crate::draft::Drafter;
use crate::error::EngineError;
use crate::handle::{Command, EngineStats, Shared};
use crate::kinds::{Active, AdmitEnv, ChunkOut, Outcome, OutputEnv, RequestKind, StepContext};
use crate::metrics::Recorder;
use crate::pacing::DecodeFloor;
use crate::registry::{GroupId, SeqId};
use crate::request::RequestId;
use crate::scheduler::{Chunk, Logits, Scheduler, StepUpdate};
use crate::tier::TierConfig;

/// The engine's state, owned by its thread.
pub(crate) struct Engine {
    cfg: EngineConfig,
    backend: Box<dyn Backend>,
    /// The draft model of speculative decoding, when its method is one.
    drafter: Option<Drafter>,
    sched: Scheduler,
    env: OutputEnv,
    rec: Recorder,
    shared: Arc<Shared>,
    reqs: HashMap<GroupId, Active>,
    by_id: HashMap<RequestId, GroupId>,
    epoch: Instant,
    /// The calibration that waits for the first batch (it measures it).
    calibration: Option<KvCalibration>,
    /// The decode floor (decode-only steps owed to running streams).
    floor: DecodeFloor,
    /// A second tier that opens once the calibration on the first batch has fixed the cache's
    /// fingerprint.
    tier_pending: Option<TierConfig>,
    /// Groups held out of admission for their shared-tier fetch, until when.
    fetching: HashMap<GroupId, Instant>,
    /// Blocks read for the shared store, waiting for the engine's idle time (and their bytes).
    unshared: Vec<(crate::tier::BlockMeta, Vec<u8>)>,
    unshared_bytes: usize,
    panic_next: bool,
}

struct AliveGuard(Arc<Shared>);

impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0.alive.store(false, Ordering::SeqCst);
    }
}

fn millis_since(epoch: Instant) -> u64 {
    epoch.elapsed().as_millis() as u64
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown panic".into())
}

impl Engine {
    fn run(mut self, rx: mpsc::Receiver<Command>) {
        let _guard = AliveGuard(self.shared.clone());
        // consumers learn at once that whatever they knew of this replica's cache is gone
        self.publish_kv_events();
        loop {
            // Wait for work when idle (waking for keep_alive expiries).
            if self.sched.is_idle() {
                let cmd = match self.sched.next_pin_expiry() {
                    Some(t) => {
                        let wait = t.saturating_sub(millis_since(self.epoch));
                        match rx.recv_timeout(Duration::from_millis(wait.max(1))) {
                            Ok(c) => Some(c),
                            Err(mpsc::RecvTimeoutError::Timeout) => None,
                            Err(mpsc::RecvTimeoutError::Disconnected) => break,
                        }
                    }
                    None => match rx.recv() {
                        Ok(c) => Some(c),
                        Err(_) => break,
                    },
                };
                if let Some(c) = cmd {
                    if !self.command(c) {
                        return;
                    }
                }
            }
            loop {
                match rx.try_recv() {
                    Ok(c) => {
                        if !self.command(c) {
                            return;
                        }
                    }
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => {
                        if self.sched.is_idle() {
                            return;
                        }
                        break;
                    }
                }
            }
            self.sched.expire_pins(millis_since(self.epoch));
            self.land_shared();
            self.drop_abandoned();
            if !self.sched.is_idle() {
                match std::panic::catch_unwind(AssertUnwindSafe(|| self.step())) {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        error!(error = %e, "engine step failed; failing the requests in flight");
                        self.fail_all(e);
                    }
                    Err(panic) => {
                        let msg = panic_message(panic.as_ref());
                        error!(panic = %msg, "engine step panicked; failing the requests in flight and resetting");
                        self.fail_all(EngineError::Panic(msg));
                    }
                }
            }
            self.publish_kv_events();
            self.write_shared(false);
            self.rec.update(&self.sched.stats());
            if let Some(s) = self.sched.tier().and_then(|t| t.shared()) {
                self.rec.shared(s.stats());
            }
            // Requests wait and nothing runs (cache-aware admission holds them for a retained state's
            // grace or the starvation bound): wait for a command a few milliseconds instead of spinning.
            if self.sched.num_running_groups() == 0 && !self.sched.is_idle() {
                if let Ok(c) = rx.recv_timeout(Duration::from_millis(5)) {
                    if !self.command(c) {
                        return;
                    }
                }
            }
        }
    }

    /// Hands the pool's KV events since the last call to the sink, as one batch.
    fn publish_kv_events(&mut self) {
        if let Some(sink) = &self.cfg.kv_events {
            sink.publish(self.sched.take_kv_events());
        }
    }

    /// Handles one command; false means stop the engine.
    fn command(&mut self, c: Command) -> bool {
        match c {
            Command::Admit(id, admit) => {
                let env = AdmitEnv {
                    fast_path: self.backend.fast_path(),
                    session_window: self.cfg.session_window,
                    rec: &self.rec,
                };
                let (g, kind) = admit(&mut self.sched, &env);
                self.register(id, g, kind);
                self.fetch_shared(g);
            }
            Command::Abort(id) => {
                if let Some(&g) = self.by_id.get(&id) {
                    self.end_request(g, Some("abort"));
                }
            }
            Command::Stats(tx) => {
                let p = self.sched.prefix_stats();
                let _ = tx.send(EngineStats {
                    pool: self.sched.pool().counts(),
                    running: self.sched.num_running_groups(),
                    waiting: self.sched.num_waiting(),
                    prefix_queries: p.queries,
                    prefix_hits: p.hits,
                    preemptions: self.sched.preemptions(),
                    active_requests: self.reqs.len(),
                    pins: self.sched.pinned_blocks(),
                    pins_released_early: self.sched.pins_released_early(),
                    tier: self.sched.tier_mut().map(|t| {
                        t.flush();
                        t.stats()
                    }),
                    spec: self.sched.stats().spec,
                    shared: self.sched.tier().and_then(|t| t.shared()).map(|s| s.stats()),
                    draft: self.drafter.as_ref().map(Drafter::stats),
                });
            }
            Command::ReleaseOwned(owner) => {
                self.sched.release_owned(owner);
            }
            Command::InjectPanic => self.panic_next = true,
            Command::Shutdown => {
                info!("engine shutting down");
                self.fail_all(EngineError::EngineDead);
                self.write_shared(true);
                self.spill_hot_pool();
                // the spill file's writer finishes and the file is let go before the engine says it
                // stopped
                drop(self.sched.set_tier(None));
                return false;
            }
        }
        true
    }

    /// Registers an admitted request of any kind.
    fn register(&mut self, id: RequestId, g: GroupId, kind: Box<dyn RequestKind>) {
        self.reqs.insert(g, Active::new(id, kind));
        self.by_id.insert(id, g);
    }

    /// Ends a request however it ended: releases every block it holds, fixes the queue count, records
    /// the finish reason.
    fn end_request(&mut self, g: GroupId, reason: Option<&str>) {
        self.sched.finish_group(g);
        if let Some(d) = self.drafter.as_mut() {
            let sched = &self.sched;
            d.retain(|s| sched.has_seq(s));
        }
        if let Some(a) = self.reqs.remove(&g) {
            self.by_id.remove(&a.id);
            if a.admitted.is_none() {
                self.shared.queued.fetch_sub(1, Ordering::SeqCst);
            }
            if let Some(r) = reason {
                self.rec.request_ended(r);
            }
        }
    }

    fn fail_all(&mut self, e: EngineError) {
        let groups: Vec<GroupId> = self.reqs.keys().copied().collect();
        for g in groups {
            if let Some(a) = self.reqs.get_mut(&g) {
                a.kind.fail(e.clone());
            }
            self.end_request(g, Some("error"));
        }
        // Whatever bookkeeping a failed step left behind goes with it; cached content is dropped too.
        if let Some(d) = self.drafter.as_mut() {
            d.reset();
        }
        self.sched.clear_pins();
        let tier = self.sched.set_tier(None);
        // the old pool's last events (what it stored before the failure) go out before it is cleared
        self.publish_kv_events();
        self.sched = Scheduler::new(*self.sched.config(), self.backend.capacity().num_blocks);
        self.sched.set_tier(tier);
    }

    fn drop_abandoned(&mut self) {
        let gone: Vec<GroupId> = self
            .reqs
            .iter()
            .filter(|(_, a)| a.kind.is_abandoned())
            .map(|(g, _)| *g)
            .collect();
        for g in gone {
            self.end_request(g, Some("abort"));
        }
    }

    /// Admission bookkeeping of the requests the last plan admitted (queue time, cached tokens).
    fn record_admissions(&mut self) {
        let now = Instant::now();
        for (g, a) in self.reqs.iter_mut() {
            if a.admitted.is_none() && self.sched.is_running(*g) {
                a.admitted = Some(now);
                let u = self.sched.usage(*g);
                a.cached_tokens = u.cached_tokens;
                let warmed = if a.kind.counts_warmed() {
                    u.decision_warmed_tokens
                } else {
                    0
                };
                self.rec.admitted(a.arrival, now, warmed);
                if let Some(prompt) = a.kind.session_prompt() {
                    self.rec.session_turn(prompt, u.cached_tokens);
                }
                self.shared.queued.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }

    fn step(&mut self) -> Result<(), EngineError> {
        if std::mem::take(&mut self.panic_next) {
            panic!("injected panic (test hook)");
        }
        let t0 = Instant::now();
        self.draft(None);
        let plan = self.plan()?;
        self.draft(Some(&plan.chunks));
        for &(g, needed) in &plan.failed {
            let available = self.backend.capacity().num_blocks;
            if let Some(a) = self.reqs.get_mut(&g) {
                a.kind.fail(EngineError::DoesNotFit { needed, available });
            }
            self.end_request(g, Some("error"));
        }
        self.record_admissions();
        // before anything writes a block: evicted blocks out to the tier, restored blocks in
        self.flush_tier()?;
        if plan.chunks.is_empty() {
            return Ok(());
        }
        let wants: Vec<ChunkWant> = plan.chunks.iter().map(|c| self.want_of(c)).collect();
        let fast = self.backend.fast_path().is_some();
        let precision: Vec<Precision> = plan
            .chunks
            .iter()
            .map(|c| match self.reqs.get(&c.group) {
                Some(a) if fast && a.kind.may_be_fast() => Precision::Fast,
                _ => Precision::Exact,
            })
            .collect();
        let trees: Vec<_> = plan
            .chunks
            .iter()
            .map(|c| self.reqs.get(&c.group).and_then(|a| a.kind.tree(c)))
            .collect();
        let batch = batch::build(&plan.chunks, &wants, &precision, &trees);
        if let Some(how) = self.calibration.take() {
            self.calibrate(&how, &batch)?;
        }
        self.backend.copy_blocks(&plan.copies)?;
        let out = self.forward_with_masks(&plan.chunks, &batch)?;
        self.sched.advance_step(&plan.chunks)?;
        for c in &plan.chunks {
            if let Some(a) = self.reqs.get_mut(&c.group) {
                a.computed_tokens += c.len;
            }
        }
        let mut update = StepUpdate::default();
        let mut done: Vec<(GroupId, &'static str)> = vec![];
        let (vocab, epoch) = (out.vocab, self.epoch);
        let (mut row, mut read, mut hidden) = (0, 0, 0);
        let width = out.width;
        for (c, want) in plan.chunks.iter().zip(&wants) {
            let rows = match want {
                ChunkWant::Nothing => continue,
                ChunkWant::Logits(_) => {
                    let n = want.logit_rows(c.len);
                    row += n;
                    ChunkOut::Logits {
                        rows: &out.logits[(row - n) * vocab..row * vocab],
                        vocab,
                    }
                }
                ChunkWant::Logprobs(_) => {
                    read += 1;
                    ChunkOut::Logprobs(&out.logprobs[read - 1])
                }
                ChunkWant::Hidden(_) => {
                    let n = want.hidden_rows(c.len);
                    hidden += n;
                    ChunkOut::Hidden {
                        rows: &out.hidden[(hidden - n) * width..hidden * width],
                        width,
                    }
                }
            };
            let Some(a) = self.reqs.get_mut(&c.group) else { continue };
            let pin_until = |k: Duration| millis_since(epoch) + k.as_millis() as u64;
            let mut cx = StepContext {
                seqs: &mut self.sched,
                update: &mut update,
                rec: &self.rec,
                env: &self.env,
                pin_until: &pin_until,
            };
            let progress = a.progress();
            if let Outcome::Done(reason) = a.kind.on_output(&mut cx, progress, c, rows)? {
                done.push((c.group, reason));
            }
        }
        self.sched.update_from_output(update)?;
        // kept token-tree rows to where their sequences read them, before anything else does
        let moves = self.sched.take_slot_moves();
        if !moves.is_empty() {
            self.backend.copy_slots(&moves)?;
        }
        for (g, reason) in done {
            self.end_request(g, Some(reason));
        }
        // a decode chunk is one row, or one plus its proposed tokens
        let decode_rows: usize = plan
            .chunks
            .iter()
            .filter(|c| c.len == 1 + c.draft && c.at_end)
            .map(|c| c.len)
            .sum();
        let rows: usize = plan.chunks.iter().map(|c| c.len).sum();
        self.floor.record(rows - decode_rows, decode_rows, t0.elapsed());
        Ok(())
    }

    /// The draft model's work (none without one): before a step is planned, its proposals for the
    /// sequences that decode next; once it is planned (`plan`), the prompt chunks the step computes.
    /// A failing draft proposes nothing and fails no request.
    fn draft(&mut self, plan: Option<&[Chunk]>) {
        let Some(d) = self.drafter.as_mut() else { return };
        let res = match plan {
            None => {
                // sequences that stopped running (preempted) give their draft blocks back
                let sched = &self.sched;
                d.retain(|s| sched.drafting(s));
                d.propose(&self.sched.draft_asks())
            }
            Some(chunks) => d.propose(&self.sched.draft_follows(chunks)),
        };
        let drafted = res.unwrap_or_else(|e| {
            warn!(error = %e, "the draft model failed a step; proposing nothing this step");
            vec![]
        });
        for (seq, tokens) in drafted {
            // the sequence was just asked: it exists
            let _ = self.sched.set_drafted(seq, tokens);
        }
    }

    /// The next step's plan: decode rows only while the decode floor is owed time (a normal step when
    /// there is nothing to decode).
    fn plan(&mut self) -> Result<crate::scheduler::Plan, EngineError> {
        if self.floor.decode_only() {
            let mut p = self.sched.schedule_step(true)?;
            if !p.chunks.is_empty() {
                return Ok(p);
            }
            self.floor.clear();
            let mut full = self.sched.schedule()?;
            full.failed.append(&mut p.failed);
            return Ok(full);
        }
        Ok(self.sched.schedule()?)
    }

    /// What a chunk needs back, as its request kind says.
    fn want_of(&self, c: &Chunk) -> ChunkWant {
        self.reqs.get(&c.group).map_or(ChunkWant::Nothing, |a| a.kind.want(c))
    }

    /// Runs the forward pass while a second thread computes the grammar masks of the constrained
    /// choices that sample after it (their masks depend only on tokens already known).
    fn forward_with_masks(&mut self, chunks: &[Chunk], batch: &Batch) -> Result<StepOutput, EngineError> {
        let mut sampling: HashMap<GroupId, Vec<SeqId>> = HashMap::new();
        for c in chunks.iter().filter(|c| c.at_end && c.logits != Logits::None) {
            sampling.entry(c.group).or_default().push(c.seq);
        }
        let mut jobs: Vec<&mut GuideState> = vec![];
        for (g, a) in self.reqs.iter_mut() {
            if let Some(seqs) = sampling.get(g) {
                a.kind.guides(seqs, &mut jobs);
            }
        }
        if jobs.is_empty() {
            return Ok(self.backend.forward(batch)?);
        }
        let backend = &mut self.backend;
        let (logits, secs) = std::thread::scope(|s| {
            let masks = s.spawn(move || jobs.into_iter().map(|j| j.prepare()).collect::<Vec<f64>>());
            let logits = backend.forward(batch);
            let secs = masks.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
            (logits, secs)
        });
        for t in secs.into_iter().filter(|&t| t > 0.0) {
            self.rec.grammar_mask_done(t);
        }
        Ok(logits?)
    }

    /// Calibration on the first batch, before anything is written: `--calculate-kv-scales` sets the
    /// scales so that the per-layer amax of K and V maps inside the format's range; a `smooth` method
    /// takes the batch's per-channel means of K and V as its offsets.
    fn calibrate(&mut self, how: &KvCalibration, batch: &Batch) -> Result<(), EngineError> {
        let report = self.backend.calibrate(how, Some(batch))?;
        if let Some(cfg) = self.tier_pending.take() {
            match open_tier(&cfg, self.backend.as_ref()) {
                Ok(t) => {
                    self.sched.set_tier(Some(t));
                }
                Err(e) => warn!(error = %e, "the second KV tier could not be opened; running without it"),
            }
        }
        if how.scales == Scales::Measured {
            info!(dtype = %self.backend.cache_shape().dtype(), layers = report.scales.len(), "calibrated KV scales from the first prefill");
        }
        if how.offsets {
            info!(
                method = self.backend.cache_shape().quant().name(),
                tokens = report.measured_rows,
                "KV offsets from the first prefill"
            );
        }
        Ok(())
    }
}
