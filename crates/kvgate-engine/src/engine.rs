//! The engine thread. It owns the model, the KV cache, the scheduler (with the block pool and prefix
//! cache) and every request's state, and loops: take commands, drop requests whose caller went away,
//! schedule a step, run it as one flat batch, sample or read decisions, send events, free what ended.
//!
//! Every way a request ends goes through [`Engine::end_request`], which releases its blocks: finished,
//! stopped, cancelled (stream dropped or abort), failed, or the engine resetting after a panic. A panic
//! inside a step fails the requests in flight with an internal error and the engine keeps serving.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use kvgate_kv::{AttentionBackend, CacheShape, CpuAttention, KvCache, KvDtype};
use kvgate_model::{Batch, Model, Tokenizer};
use tokio::sync::mpsc as tmpsc;
use tracing::{error, info, warn};

use crate::error::EngineError;
use crate::handle::{Command, EngineHandle, EngineStats, Limits, Shared};
use crate::metrics as m;
use crate::request::{
    DecideRequest, DecisionRead, Event, FinishReason, GenerateRequest, ReadResult, RequestId, StopMatch, Usage,
};
use crate::sampling::{log_softmax, top_k_of, Sampler, SamplingParams, TokenLogprob};
use crate::scheduler::{Chunk, GroupId, Logits, Scheduler, SchedulerConfig, SeqId};
use crate::text::TextState;

/// Engine configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// Tokens per block.
    pub block_size: usize,
    /// Blocks in the pool.
    pub num_blocks: usize,
    /// Sequences running at once.
    pub max_num_seqs: usize,
    /// Tokens per step.
    pub max_num_batched_tokens: usize,
    /// Waiting requests before 429.
    pub max_queue: usize,
    /// Prefix caching on.
    pub prefix_caching: bool,
    /// KV-cache dtype.
    pub kv_dtype: KvDtype,
    /// Per-layer (k_scale, v_scale) from the checkpoint, if any.
    pub kv_scales: Option<Vec<(f32, f32)>>,
    /// Calibrate scales from the first prefill.
    pub calculate_kv_scales: bool,
    /// Context length served.
    pub max_model_len: usize,
    /// Label of every metric series.
    pub model_name: String,
}

struct Choice {
    index: usize,
    sampler: Sampler,
    text: TextState,
}

struct GenState {
    tx: tmpsc::UnboundedSender<Event>,
    params: SamplingParams,
    prompt_len: usize,
    choices: HashMap<SeqId, Choice>,
    forked: bool,
    remaining: usize,
    completion_tokens: usize,
    prompt_lps: Vec<Option<TokenLogprob>>,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
}

struct DecState {
    tx: tmpsc::UnboundedSender<Event>,
    reads: Vec<DecisionRead>,
    results: Vec<Option<ReadResult>>,
    keep_alive: Option<Duration>,
    shared_len: usize,
    pinned: bool,
}

enum Kind {
    Gen(Box<GenState>),
    Dec(Box<DecState>),
}

struct Active {
    id: RequestId,
    kind: Kind,
    arrival: Instant,
    admitted: Option<Instant>,
    cached_tokens: usize,
    computed_tokens: usize,
}

impl Active {
    fn tx(&self) -> &tmpsc::UnboundedSender<Event> {
        match &self.kind {
            Kind::Gen(g) => &g.tx,
            Kind::Dec(d) => &d.tx,
        }
    }
}

/// The engine's state, owned by its thread.
pub struct Engine {
    cfg: EngineConfig,
    model: Model,
    cache: KvCache,
    attn: Box<dyn AttentionBackend>,
    sched: Scheduler,
    tok: Arc<Tokenizer>,
    eos: Vec<u32>,
    shared: Arc<Shared>,
    reqs: HashMap<GroupId, Active>,
    by_id: HashMap<RequestId, GroupId>,
    epoch: Instant,
    calibrated: bool,
    panic_next: bool,
    last_prefix: (u64, u64),
    last_preemptions: u64,
}

fn label(cfg: &EngineConfig) -> [(&'static str, String); 1] {
    [("model_name", cfg.model_name.clone())]
}

/// Starts the engine thread and returns its handle.
pub fn start(model: Model, tok: Arc<Tokenizer>, eos: Vec<u32>, cfg: EngineConfig) -> Result<EngineHandle, EngineError> {
    let mc = model.config().clone();
    let shape = CacheShape {
        num_layers: mc.num_layers,
        num_kv_heads: mc.num_kv_heads,
        head_dim: mc.head_dim,
        block_size: cfg.block_size,
        dtype: cfg.kv_dtype,
    };
    cfg.kv_dtype
        .check(mc.head_dim, cfg.block_size)
        .map_err(|e| EngineError::Internal(e.to_string()))?;
    if cfg.num_blocks * cfg.block_size < cfg.max_model_len.min(model.max_positions()) {
        warn!(
            blocks = cfg.num_blocks,
            max_model_len = cfg.max_model_len,
            "the KV cache holds fewer tokens than one sequence of max_model_len"
        );
    }
    let mut cache = KvCache::new(shape, cfg.num_blocks);
    match &cfg.kv_scales {
        Some(scales) => {
            for (l, &(k, v)) in scales.iter().enumerate().take(mc.num_layers) {
                cache.set_scales(l, k, v);
            }
        }
        None if cfg.kv_dtype.is_scaled() && !cfg.calculate_kv_scales => {
            warn!(dtype = %cfg.kv_dtype, "no k/v scales in the checkpoint: using 1.0 (pass --calculate-kv-scales to calibrate)");
        }
        None => {}
    }
    let limits = Limits {
        max_model_len: cfg.max_model_len,
        max_queue: cfg.max_queue,
        num_blocks: cfg.num_blocks,
        block_size: cfg.block_size,
        vocab_size: mc.vocab_size,
    };
    let shared = Arc::new(Shared {
        queued: AtomicUsize::new(0),
        alive: AtomicBool::new(true),
        next_id: AtomicU64::new(1),
        limits,
    });
    let sched = Scheduler::new(
        SchedulerConfig {
            max_num_seqs: cfg.max_num_seqs,
            max_num_batched_tokens: cfg.max_num_batched_tokens,
            block_size: cfg.block_size,
            prefix_caching: cfg.prefix_caching,
        },
        cfg.num_blocks,
    );
    let (tx, rx) = mpsc::channel();
    let calibrated = !cfg.calculate_kv_scales;
    let engine = Engine {
        cfg,
        model,
        cache,
        attn: Box::new(CpuAttention),
        sched,
        tok,
        eos,
        shared: shared.clone(),
        reqs: HashMap::new(),
        by_id: HashMap::new(),
        epoch: Instant::now(),
        calibrated,
        panic_next: false,
        last_prefix: (0, 0),
        last_preemptions: 0,
    };
    std::thread::Builder::new()
        .name("kvgate-engine".into())
        .spawn(move || engine.run(rx))
        .map_err(|e| EngineError::Internal(format!("cannot start the engine thread: {e}")))?;
    Ok(EngineHandle::new(tx, shared))
}

struct AliveGuard(Arc<Shared>);

impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0.alive.store(false, Ordering::SeqCst);
    }
}

impl Engine {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn run(mut self, rx: mpsc::Receiver<Command>) {
        let _guard = AliveGuard(self.shared.clone());
        loop {
            // Wait for work when idle (waking for keep_alive expiries).
            if self.sched.is_idle() {
                let cmd = match self.sched.next_pin_expiry() {
                    Some(t) => {
                        let wait = t.saturating_sub(self.now_ms());
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
            let now = self.now_ms();
            self.sched.expire_pins(now);
            self.drop_abandoned();
            if self.sched.is_idle() {
                self.update_gauges();
                continue;
            }
            let result = std::panic::catch_unwind(AssertUnwindSafe(|| self.step()));
            match result {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    error!(error = %e, "engine step failed; failing the requests in flight");
                    self.fail_all(EngineError::Internal(e.to_string()));
                }
                Err(panic) => {
                    let msg = panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_else(|| "unknown panic".into());
                    error!(panic = %msg, "engine step panicked; failing the requests in flight and resetting");
                    self.fail_all(EngineError::Internal(format!("engine panic: {msg}")));
                }
            }
            self.update_gauges();
        }
    }

    /// Handles one command; false means stop the engine.
    fn command(&mut self, c: Command) -> bool {
        match c {
            Command::Generate(id, req, tx) => self.add_generate(id, req, tx),
            Command::Decide(id, req, tx) => self.add_decide(id, req, tx),
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
                    pins: usize::from(self.sched.next_pin_expiry().is_some()),
                });
            }
            Command::InjectPanic => self.panic_next = true,
            Command::Shutdown => {
                info!("engine shutting down");
                self.fail_all(EngineError::EngineDead);
                return false;
            }
        }
        true
    }

    fn add_generate(&mut self, id: RequestId, req: GenerateRequest, tx: tmpsc::UnboundedSender<Event>) {
        let all = req.params.prompt_logprobs.is_some();
        let (g, seq) = self
            .sched
            .add_generate(req.prompt.clone(), req.cache_salt.as_deref().unwrap_or(""), all);
        let p = req.params;
        let tail_from = req.prompt.len().saturating_sub(6);
        let mut choices = HashMap::new();
        choices.insert(
            seq,
            Choice {
                index: 0,
                sampler: Sampler::new(&p, &req.prompt, 0),
                text: TextState::new(
                    &req.prompt[tail_from..],
                    p.stop.clone(),
                    p.include_stop_str_in_output,
                    p.skip_special_tokens,
                ),
            },
        );
        let n = p.n.max(1);
        self.reqs.insert(
            g,
            Active {
                id,
                kind: Kind::Gen(Box::new(GenState {
                    tx,
                    prompt_len: req.prompt.len(),
                    choices,
                    forked: n == 1,
                    remaining: n,
                    completion_tokens: 0,
                    prompt_lps: vec![None; if all { req.prompt.len() } else { 0 }],
                    first_token: None,
                    last_token: None,
                    params: p,
                })),
                arrival: Instant::now(),
                admitted: None,
                cached_tokens: 0,
                computed_tokens: 0,
            },
        );
        self.by_id.insert(id, g);
    }

    fn add_decide(&mut self, id: RequestId, req: DecideRequest, tx: tmpsc::UnboundedSender<Event>) {
        let prompts: Vec<Vec<u32>> = req.reads.iter().map(|r| r.prompt.clone()).collect();
        let first = &prompts[0];
        let shared_len = prompts
            .iter()
            .map(|p| first.iter().zip(p).take_while(|(a, b)| a == b).count())
            .min()
            .unwrap_or(0);
        let g = self
            .sched
            .add_decision(prompts, req.cache_salt.as_deref().unwrap_or(""));
        let n = req.reads.len();
        self.reqs.insert(
            g,
            Active {
                id,
                kind: Kind::Dec(Box::new(DecState {
                    tx,
                    reads: req.reads,
                    results: vec![None; n],
                    keep_alive: req.keep_alive,
                    shared_len,
                    pinned: false,
                })),
                arrival: Instant::now(),
                admitted: None,
                cached_tokens: 0,
                computed_tokens: 0,
            },
        );
        self.by_id.insert(id, g);
        metrics::counter!(m::DECISION_REQUESTS, &label(&self.cfg)).increment(1);
    }

    /// Ends a request however it ended: releases every block it holds, fixes the queue count, records
    /// the finish reason.
    fn end_request(&mut self, g: GroupId, reason: Option<&str>) {
        self.sched.finish_group(g);
        if let Some(a) = self.reqs.remove(&g) {
            self.by_id.remove(&a.id);
            if a.admitted.is_none() {
                self.shared.queued.fetch_sub(1, Ordering::SeqCst);
            }
            if let Some(r) = reason {
                metrics::counter!(m::REQUEST_SUCCESS, "model_name" => self.cfg.model_name.clone(), "finished_reason" => r.to_string()).increment(1);
            }
        }
    }

    fn fail_all(&mut self, e: EngineError) {
        let groups: Vec<GroupId> = self.reqs.keys().copied().collect();
        for g in groups {
            if let Some(a) = self.reqs.get(&g) {
                let _ = a.tx().send(Event::Error(e.clone()));
            }
            self.end_request(g, Some("error"));
        }
        // Whatever bookkeeping a failed step left behind goes with it; cached content is dropped too.
        self.sched.clear_pins();
        self.sched = Scheduler::new(*self.sched.config(), self.cfg.num_blocks);
    }

    fn drop_abandoned(&mut self) {
        let gone: Vec<GroupId> = self
            .reqs
            .iter()
            .filter(|(_, a)| a.tx().is_closed())
            .map(|(g, _)| *g)
            .collect();
        for g in gone {
            self.end_request(g, Some("abort"));
        }
    }

    fn update_gauges(&mut self) {
        let l = label(&self.cfg);
        let c = self.sched.pool().counts();
        metrics::gauge!(m::RUNNING, &l).set(self.sched.num_running_groups() as f64);
        metrics::gauge!(m::WAITING, &l).set(self.sched.num_waiting() as f64);
        metrics::gauge!(m::KV_USAGE, &l).set(c.used as f64 / c.total.max(1) as f64);
        metrics::gauge!(m::KV_CACHED_FREE, &l).set(c.cached_free as f64);
        let p = self.sched.prefix_stats();
        metrics::counter!(m::PREFIX_QUERIES, &l).increment(p.queries - self.last_prefix.0.min(p.queries));
        metrics::counter!(m::PREFIX_HITS, &l).increment(p.hits - self.last_prefix.1.min(p.hits));
        self.last_prefix = (p.queries, p.hits);
        let pre = self.sched.preemptions();
        metrics::counter!(m::PREEMPTIONS, &l).increment(pre - self.last_preemptions.min(pre));
        self.last_preemptions = pre;
    }

    fn step(&mut self) -> Result<(), kvgate_model::ModelError> {
        if std::mem::take(&mut self.panic_next) {
            panic!("injected panic (test hook)");
        }
        let plan = self.sched.schedule();
        for g in &plan.failed {
            let needed = 0;
            if let Some(a) = self.reqs.get(g) {
                let _ = a.tx().send(Event::Error(EngineError::DoesNotFit {
                    needed,
                    available: self.cfg.num_blocks,
                }));
            }
            self.end_request(*g, Some("error"));
        }
        // Admission bookkeeping (queue time, cached tokens).
        let now = Instant::now();
        let l = label(&self.cfg);
        for (g, a) in self.reqs.iter_mut() {
            if a.admitted.is_none() && self.sched.is_running(*g) {
                a.admitted = Some(now);
                let u = self.sched.usage(*g);
                a.cached_tokens = u.cached_tokens;
                if matches!(a.kind, Kind::Gen(_)) && u.decision_warmed_tokens > 0 {
                    metrics::counter!(m::DECISION_PREFIX_REUSE, &l).increment(u.decision_warmed_tokens as u64);
                }
                self.shared.queued.fetch_sub(1, Ordering::SeqCst);
                metrics::histogram!(m::QUEUE_TIME, &l).record((now - a.arrival).as_secs_f64());
            }
        }
        if plan.chunks.is_empty() {
            return Ok(());
        }
        for c in &plan.copies {
            self.cache.copy_block(c.src as usize, c.dst as usize);
        }
        let batch = self.build_batch(&plan.chunks);
        if !self.calibrated {
            self.calibrate(&batch)?;
        }
        // The whole forward runs inside the compute pool (one hand-off per step instead of one per
        // parallel region: the engine thread is not a pool worker).
        let (model, cache, attn) = (&self.model, &mut self.cache, self.attn.as_ref());
        let logits = rayon::scope(|_| model.forward(&batch, cache, attn))?;
        for c in &plan.chunks {
            self.sched.advance(c);
            if let Some(seq) = self.sched.seq(c.seq) {
                if let Some(a) = self.reqs.get_mut(&seq.group) {
                    a.computed_tokens += c.len;
                }
            }
        }
        let vocab = logits.len() / batch.logit_rows.len().max(1);
        let mut row = 0;
        for c in &plan.chunks {
            let n_rows = match c.logits {
                Logits::None => 0,
                Logits::Last => 1,
                Logits::All => c.len,
            };
            if n_rows == 0 {
                continue;
            }
            let rows = &logits[row * vocab..(row + n_rows) * vocab];
            row += n_rows;
            self.on_logits(c, rows, vocab);
        }
        Ok(())
    }

    fn build_batch(&self, chunks: &[Chunk]) -> Batch {
        let bs = self.cfg.block_size;
        let mut b = Batch::default();
        for c in chunks {
            let s = self.sched.seq(c.seq).expect("scheduled sequence exists");
            let t = b.tables.len() as u32;
            b.tables.push(s.blocks.blocks.clone());
            for p in c.start..c.start + c.len {
                if c.logits == Logits::All || (c.logits == Logits::Last && p == c.start + c.len - 1) {
                    b.logit_rows.push(b.tokens.len());
                }
                b.tokens.push(s.tokens[p]);
                b.positions.push(p as u32);
                b.slots.push(s.blocks.blocks[p / bs] as usize * bs + p % bs);
                b.seq_of_row.push(t);
            }
        }
        b
    }

    /// `--calculate-kv-scales`: runs the first batch once on a scratch f32 cache to measure per-layer
    /// amax of K and V, and sets the scales so that amax maps to the format's largest value.
    fn calibrate(&mut self, batch: &Batch) -> Result<(), kvgate_model::ModelError> {
        let mut shape = *self.cache.shape();
        shape.dtype = KvDtype::F32;
        let mut scratch = KvCache::new(
            shape,
            self.cfg.num_blocks.min(
                batch
                    .tables
                    .iter()
                    .map(|t| t.iter().max().map_or(0, |m| *m as usize + 1))
                    .max()
                    .unwrap_or(1),
            ),
        );
        let (_, amax) = self.model.forward_with_amax(batch, &mut scratch, self.attn.as_ref())?;
        let range = match self.cfg.kv_dtype {
            KvDtype::Fp8E4m3 => 448.0,
            KvDtype::Fp8E5m2 => 57344.0,
            KvDtype::Nvfp4 => 448.0 * 6.0,
            _ => 1.0,
        };
        for (l, (k, v)) in amax.k.iter().zip(&amax.v).enumerate() {
            self.cache.set_scales(l, kv_scale(*k, range), kv_scale(*v, range));
        }
        info!(dtype = %self.cfg.kv_dtype, layers = amax.k.len(), "calibrated KV scales from the first prefill");
        self.calibrated = true;
        Ok(())
    }

    fn on_logits(&mut self, c: &Chunk, rows: &[f32], vocab: usize) {
        let Some(seq) = self.sched.seq(c.seq) else { return };
        let g = seq.group;
        let at_end = c.start + c.len == seq.tokens.len();
        let Some(a) = self.reqs.get_mut(&g) else { return };
        match &mut a.kind {
            Kind::Dec(d) => {
                if !at_end {
                    return;
                }
                let last = &rows[rows.len() - vocab..];
                let Some(qi) = seq.read else { return };
                let ls = log_softmax(last);
                let probs: Vec<f64> = d.reads[qi]
                    .labels
                    .iter()
                    .map(|aliases| aliases.iter().map(|&t| (ls[t as usize] as f64).exp()).sum())
                    .collect();
                let mass = probs.iter().sum();
                d.results[qi] = Some(ReadResult {
                    label_probs: probs,
                    label_mass: mass,
                });
                if let (Some(k), false) = (d.keep_alive, d.pinned) {
                    d.pinned = true;
                    let until = self.epoch.elapsed().as_millis() as u64 + k.as_millis() as u64;
                    self.sched.pin_prefix(c.seq, d.shared_len, until);
                }
                self.sched.finish_seq(c.seq);
                if d.results.iter().all(Option::is_some) {
                    let reads: Vec<ReadResult> = d.results.iter_mut().map(|r| r.take().expect("all set")).collect();
                    let prompt_tokens: usize = d.reads.iter().map(|r| r.prompt.len()).sum();
                    let usage = Usage {
                        prompt_tokens,
                        completion_tokens: 0,
                        cached_tokens: prompt_tokens.saturating_sub(a.computed_tokens),
                    };
                    let _ = d.tx.send(Event::Decision { reads, usage });
                    let l = label(&self.cfg);
                    metrics::histogram!(m::DECISION_LATENCY, &l).record(a.arrival.elapsed().as_secs_f64());
                    metrics::histogram!(m::E2E, &l).record(a.arrival.elapsed().as_secs_f64());
                    metrics::counter!(m::PROMPT_TOKENS, &l).increment(prompt_tokens as u64);
                    self.end_request(g, Some("stop"));
                }
            }
            Kind::Gen(gs) => {
                if c.logits == Logits::All {
                    // Prompt logprobs: row i predicts the token at position start + i + 1.
                    let k = gs.params.prompt_logprobs.unwrap_or(0);
                    for i in 0..c.len {
                        let p = c.start + i + 1;
                        if p >= gs.prompt_len {
                            break;
                        }
                        let ls = log_softmax(&rows[i * vocab..(i + 1) * vocab]);
                        let t = seq.tokens[p];
                        gs.prompt_lps[p] = Some(TokenLogprob {
                            token: t,
                            logprob: ls[t as usize],
                            top: top_k_of(&ls, k),
                        });
                    }
                }
                if !at_end {
                    return;
                }
                let last = rows[rows.len() - vocab..].to_vec();
                let mut targets = vec![c.seq];
                if !gs.forked {
                    gs.forked = true;
                    let n = gs.params.n.max(1);
                    let children = self.sched.fork(c.seq, n - 1);
                    let prompt = seq_prompt(&self.sched, c.seq, gs.prompt_len);
                    for (i, ch) in children.iter().enumerate() {
                        let p = &gs.params;
                        let tail_from = prompt.len().saturating_sub(6);
                        gs.choices.insert(
                            *ch,
                            Choice {
                                index: i + 1,
                                sampler: Sampler::new(p, &prompt, i + 1),
                                text: TextState::new(
                                    &prompt[tail_from..],
                                    p.stop.clone(),
                                    p.include_stop_str_in_output,
                                    p.skip_special_tokens,
                                ),
                            },
                        );
                    }
                    targets.extend(children);
                }
                if !gs.prompt_lps.is_empty() {
                    let lps = std::mem::take(&mut gs.prompt_lps);
                    let _ = gs.tx.send(Event::PromptLogprobs(lps));
                }
                let now = Instant::now();
                let l = label(&self.cfg);
                match gs.last_token {
                    None => metrics::histogram!(m::TTFT, &l).record((now - a.arrival).as_secs_f64()),
                    Some(t) => metrics::histogram!(m::ITL, &l).record((now - t).as_secs_f64()),
                }
                gs.first_token.get_or_insert(now);
                gs.last_token = Some(now);
                let mut stop_ids: Vec<u32> = gs.params.stop_token_ids.clone();
                if !gs.params.ignore_eos {
                    stop_ids.extend(&self.eos);
                }
                let mut ended = vec![];
                for t in targets {
                    let Some(ch) = gs.choices.get_mut(&t) else { continue };
                    let (tok, lp) = ch.sampler.sample(&last, &gs.params, &stop_ids);
                    self.sched.append_token(t, tok);
                    gs.completion_tokens += 1;
                    metrics::counter!(m::GENERATION_TOKENS, &l).increment(1);
                    let is_eos = !gs.params.ignore_eos && self.eos.contains(&tok);
                    let is_stop_id = gs.params.stop_token_ids.contains(&tok);
                    let mut finish: Option<(FinishReason, Option<StopMatch>)> = None;
                    let mut text = String::new();
                    if is_eos || is_stop_id {
                        finish = Some((
                            FinishReason::Stop,
                            if is_stop_id && !is_eos {
                                Some(StopMatch::Token(tok))
                            } else {
                                None
                            },
                        ));
                    } else {
                        let d = ch.text.push(&self.tok, tok);
                        text = d.text;
                        if let Some(s) = d.stopped_by {
                            finish = Some((FinishReason::Stop, Some(StopMatch::Text(s))));
                        }
                    }
                    let len = self.sched.seq(t).map_or(0, |s| s.tokens.len());
                    if finish.is_none()
                        && (ch.sampler.generated() >= gs.params.max_tokens || len >= self.cfg.max_model_len)
                    {
                        finish = Some((FinishReason::Length, None));
                    }
                    let _ = gs.tx.send(Event::Token {
                        choice: ch.index,
                        token: tok,
                        text,
                        logprob: lp,
                    });
                    if let Some((reason, stop)) = finish {
                        let tail = if stop.is_some() && matches!(stop, Some(StopMatch::Text(_))) {
                            String::new()
                        } else {
                            ch.text.finish(&self.tok)
                        };
                        let _ = gs.tx.send(Event::Finished {
                            choice: ch.index,
                            reason,
                            text: tail,
                            stop,
                        });
                        ended.push((t, reason));
                    }
                }
                let mut last_reason = None;
                for (t, reason) in ended {
                    gs.choices.remove(&t);
                    gs.remaining -= 1;
                    self.sched.finish_seq(t);
                    last_reason = Some(reason);
                }
                if gs.remaining == 0 {
                    let usage = Usage {
                        prompt_tokens: gs.prompt_len,
                        completion_tokens: gs.completion_tokens,
                        cached_tokens: a.cached_tokens,
                    };
                    let _ = gs.tx.send(Event::Done(usage));
                    metrics::histogram!(m::E2E, &l).record(a.arrival.elapsed().as_secs_f64());
                    metrics::counter!(m::PROMPT_TOKENS, &l).increment(gs.prompt_len as u64);
                    let reason = last_reason.map(FinishReason::as_str);
                    self.end_request(g, reason);
                }
            }
        }
    }
}

/// The calibrated scale for an observed amax: the power of two at or above `amax / range`, times two.
/// A power of two scales values exactly, so values in the format's normal range round exactly as with
/// scale 1 and only the range moves (away from underflow); the factor two leaves headroom for later
/// prompts that reach further than the first one.
pub fn kv_scale(amax: f32, range: f32) -> f32 {
    if !(amax > 0.0 && amax.is_finite()) {
        return 1.0;
    }
    2f32.powi((amax / range).log2().ceil() as i32 + 1)
}

fn seq_prompt(s: &Scheduler, seq: SeqId, prompt_len: usize) -> Vec<u32> {
    s.seq(seq)
        .map(|x| x.tokens[..prompt_len.min(x.tokens.len())].to_vec())
        .unwrap_or_default()
}
