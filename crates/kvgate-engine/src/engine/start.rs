//! Starting the engine: the backend checked against the configuration, the scheduler, the limits
//! callers see and the second tier set up, and the engine's thread spawned. [`start`] opens the CPU
//! backend for a model first (what tests and benches use); [`start_with_backend`] takes any backend.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{mpsc, Arc};
use std::time::Instant;

use kvgate_backend::{Backend, KvMemory};
use kvgate_model::{Model, Tokenizer};
use tracing::warn;

use super::tier_io::open_tier;
use super::Engine;
use crate::config::{calibration_of, prefill_cap, EngineConfig};
use crate::device::{open_backend, BackendSpec};
use crate::error::EngineError;
use crate::handle::{EngineHandle, Limits, Shared};
use crate::metrics::Recorder;
use crate::pacing::DecodeFloor;
use crate::requests::OutputEnv;
use crate::scheduler::{Scheduler, SchedulerConfig};

/// Starts the engine thread on the CPU backend (`model` over a host cache of `cfg.num_blocks` blocks),
/// opened through [`open_backend`].
pub fn start(model: Model, tok: Arc<Tokenizer>, eos: Vec<u32>, cfg: EngineConfig) -> Result<EngineHandle, EngineError> {
    let shape = model
        .config()
        .cache_shape(cfg.block_size, cfg.kv_dtype)
        .and_then(|s| s.with_quant(cfg.kv_quant))
        .map_err(|e| EngineError::Config(e.to_string()))?;
    let spec = BackendSpec {
        device: kvgate_backend::Device::Cpu,
        shape,
        memory: KvMemory::Blocks(cfg.num_blocks),
        int8_activations: cfg.int8_activations,
        gpu_memory_utilization: crate::device::DEFAULT_GPU_MEMORY_UTILIZATION,
    };
    start_with_backend(open_backend(model, &spec)?, tok, eos, cfg)
}

/// Starts the engine thread on a backend; `cfg`'s block size, block count and dtype must be the
/// backend's.
pub fn start_with_backend(
    mut backend: Box<dyn Backend>,
    tok: Arc<Tokenizer>,
    eos: Vec<u32>,
    cfg: EngineConfig,
) -> Result<EngineHandle, EngineError> {
    let shape = backend.cache_shape();
    if (
        shape.block_size(),
        shape.dtype(),
        shape.quant(),
        backend.capacity().num_blocks,
    ) != (cfg.block_size, cfg.kv_dtype, cfg.kv_quant, cfg.num_blocks)
    {
        return Err(EngineError::Config(format!(
            "the {} backend's cache is {} blocks of {} tokens as {} ({}), the configuration says {} blocks of {} as {} ({})",
            backend.device(),
            backend.capacity().num_blocks,
            shape.block_size(),
            shape.dtype(),
            shape.quant().name(),
            cfg.num_blocks,
            cfg.block_size,
            cfg.kv_dtype,
            cfg.kv_quant.name()
        )));
    }
    if cfg.num_blocks * cfg.block_size < cfg.max_model_len.min(backend.max_positions()) {
        warn!(
            blocks = cfg.num_blocks,
            max_model_len = cfg.max_model_len,
            "the KV cache holds fewer tokens than one sequence of max_model_len"
        );
    }
    if cfg.kv_scales.is_none() && cfg.kv_dtype.is_scaled() && !cfg.calculate_kv_scales {
        warn!(dtype = %cfg.kv_dtype, "no k/v scales in the checkpoint: using 1.0 (pass --calculate-kv-scales to calibrate)");
    }
    let how = calibration_of(&cfg);
    let calibration = if how.needs_batch() {
        Some(how)
    } else {
        if !how.is_noop() {
            backend.calibrate(&how, None)?;
        }
        None
    };
    let limits = Limits {
        max_model_len: cfg.max_model_len,
        max_queue: cfg.max_queue,
        num_blocks: cfg.num_blocks,
        block_size: cfg.block_size,
        vocab_size: backend.vocab_size(),
        hidden_size: backend.hidden_size(),
        // the live span of a windowed sequence: from its first read position, rounded down to a
        // block, to the end of the chunk being written
        window_blocks: backend
            .attention_span()
            .map(|w| (w + cfg.max_num_batched_tokens).div_ceil(cfg.block_size) + 2),
    };
    let shared = Arc::new(Shared {
        queued: AtomicUsize::new(0),
        alive: AtomicBool::new(true),
        next_id: AtomicU64::new(1),
        limits,
    });
    let mut sched = Scheduler::new(
        SchedulerConfig {
            max_num_seqs: cfg.max_num_seqs,
            max_num_batched_tokens: cfg.max_num_batched_tokens,
            block_size: cfg.block_size,
            prefix_caching: cfg.prefix_caching,
            release_window: backend.attention_span(),
        },
        cfg.num_blocks,
    );
    if let Some(n) = cfg.max_pinned_blocks {
        sched.set_max_pinned_blocks(n);
    }
    sched.set_max_pinned_per_tenant(cfg.max_pinned_blocks_per_tenant);
    sched.set_admission(cfg.admission);
    sched.set_prefill_cap(prefill_cap(&cfg));
    if cfg.kv_events.is_some() {
        sched.record_kv_events();
    }
    // a chunk of prompt logprobs returns at most 64 MiB of logits
    sched.set_all_rows_cap((64 << 20) / (4 * backend.vocab_size().max(1)));
    if let Some(n) = cfg.max_retained_blocks {
        sched.set_max_retained_blocks(n);
    }
    let mut tier_pending = None;
    if cfg.tier.enabled() {
        if calibration.is_some() {
            tier_pending = Some(cfg.tier.clone());
        } else {
            sched.set_tier(Some(open_tier(&cfg.tier, backend.as_ref())?));
        }
    }
    let (tx, rx) = mpsc::channel();
    let engine = Engine {
        env: OutputEnv { tok, eos, limits },
        rec: Recorder::new(&cfg.model_name, cfg.block_size),
        calibration,
        tier_pending,
        floor: DecodeFloor::new(cfg.decode_share),
        cfg,
        backend,
        sched,
        shared: shared.clone(),
        reqs: HashMap::new(),
        by_id: HashMap::new(),
        epoch: Instant::now(),
        panic_next: false,
    };
    std::thread::Builder::new()
        .name("kvgate-engine".into())
        .spawn(move || engine.run(rx))
        .map_err(|e| EngineError::Spawn(e.to_string()))?;
    Ok(EngineHandle::new(tx, shared))
}
