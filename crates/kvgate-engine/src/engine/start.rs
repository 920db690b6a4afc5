//! Starting the engine on the backend it is handed (the engine opens none: `serve` chooses the device
//! at its edge): the cache's shape read from the backend, the scheduler, the limits callers see and the
//! second tier set up, and the engine's thread spawned.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{mpsc, Arc};
use std::time::Instant;

use kvgate_backend::Backend;
use kvgate_model::Tokenizer;
use tracing::warn;

use super::tier_io::open_tier;
use super::Engine;
use crate::config::{calibration_of, prefill_cap, EngineConfig};
use crate::draft::Drafter;
use crate::error::EngineError;
use crate::handle::{EngineHandle, Shared};
use crate::inference::Limits;
use crate::kinds::OutputEnv;
use crate::metrics::Recorder;
use crate::pacing::DecodeFloor;
use crate::scheduler::{Caps, Scheduler, SchedulerConfig, SpecPlan};

/// Starts the engine thread on `backend`: the cache — its block size, block count, dtype and method —
/// is the backend's, read from it here; `cfg` says how to schedule, retain and tier over it.
pub fn start(
    backend: Box<dyn Backend>,
    tok: Arc<Tokenizer>,
    eos: Vec<u32>,
    cfg: EngineConfig,
) -> Result<EngineHandle, EngineError> {
    start_with_draft(backend, None, tok, eos, cfg)
}

/// [`start`] with a draft model for speculative decoding (`cfg.speculation`'s method
/// [`crate::SpecMethod::DraftModel`] or [`crate::SpecMethod::LookupThenDraft`]): `draft` runs the draft model over its own cache, on the same
/// vocabulary as `backend`'s model.
pub fn start_with_draft(
    mut backend: Box<dyn Backend>,
    draft: Option<Box<dyn Backend>>,
    tok: Arc<Tokenizer>,
    eos: Vec<u32>,
    cfg: EngineConfig,
) -> Result<EngineHandle, EngineError> {
    let wants_draft = cfg.speculation.is_some_and(|c| c.method.drafts());
    match (&draft, wants_draft) {
        (None, true) => {
            return Err(EngineError::Config(
                "speculation by a draft model needs the draft model's backend".into(),
            ))
        }
        (Some(_), false) => {
            return Err(EngineError::Config(
                "a draft model was given but speculation's method uses none".into(),
            ))
        }
        _ => {}
    }
    let shape = backend.cache_shape();
    let (block_size, num_blocks) = (shape.block_size(), backend.capacity().num_blocks);
    if num_blocks * block_size < cfg.max_model_len.min(backend.max_positions()) {
        warn!(
            blocks = num_blocks,
            max_model_len = cfg.max_model_len,
            "the KV cache holds fewer tokens than one sequence of max_model_len"
        );
    }
    if cfg.kv_scales.is_none() && shape.dtype().is_scaled() && !cfg.calculate_kv_scales {
        warn!(dtype = %shape.dtype(), "no k/v scales in the checkpoint: using 1.0 (pass --calculate-kv-scales to calibrate)");
    }
    let how = calibration_of(&cfg, shape.quant());
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
        num_blocks,
        block_size,
        vocab_size: backend.vocab_size(),
        hidden_size: backend.hidden_size(),
        // the live span of a windowed sequence: from its first read position, rounded down to a
        // block, to the end of the chunk being written
        window_blocks: backend
            .attention_span()
            .map(|w| (w + cfg.max_num_batched_tokens).div_ceil(block_size) + 2),
        tree_attention: backend.tree_attention(),
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
            block_size,
            prefix_caching: cfg.prefix_caching,
            release_window: backend.attention_span(),
            admission: cfg.admission,
            caps: Caps {
                max_pinned_blocks: cfg.max_pinned_blocks,
                max_retained_blocks: cfg.max_retained_blocks,
                max_pinned_per_tenant: cfg.max_pinned_blocks_per_tenant,
                prefill_cap: prefill_cap(&cfg),
                // a chunk of prompt logprobs returns at most 64 MiB of logits
                all_rows_cap: (64 << 20) / (4 * backend.vocab_size().max(1)),
            },
            speculation: cfg.speculation.map(|config| SpecPlan {
                config,
                max_len: cfg.max_model_len.min(backend.max_positions()),
                rows_per_weight_read: backend.rows_per_weight_read(),
                tree: backend.token_trees(),
            }),
            kv_events: cfg.kv_events.is_some(),
        },
        num_blocks,
    );
    let mut tier_pending = None;
    if cfg.tier.enabled() {
        if calibration.is_some() {
            tier_pending = Some(cfg.tier.clone());
        } else {
            sched.set_tier(Some(open_tier(&cfg.tier, backend.as_ref())?));
        }
    }
    let drafter = draft.map(|d| {
        let (p_min, window) = cfg.speculation.map_or((0.0, (usize::MAX, 10)), |c| {
            (c.draft_p_min, (c.draft_window, c.draft_share))
        });
        Drafter::new(d, backend.vocab_size(), cfg.max_num_batched_tokens, p_min, window)
    });
    let (tx, rx) = mpsc::channel();
    let engine = Engine {
        drafter,
        env: OutputEnv {
            tok,
            eos,
            limits,
            speculates: cfg.speculation.is_some(),
        },
        rec: Recorder::new(&cfg.model_name, block_size),
        calibration,
        tier_pending,
        fetching: HashMap::new(),
        unshared: Vec::new(),
        unshared_bytes: 0,
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
