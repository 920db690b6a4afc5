//! The one value a [`Scheduler`](super::Scheduler) is built from: the step's limits, admission, the
//! caps on pins, retention and all-row chunks, and the speculation plan. A scheduler has no setters
//! for any of it: a reset (`Engine::fail_all`) is `Scheduler::new(*old.config(), blocks)` plus the
//! second tier handed over, so nothing is carried over field by field. A new knob is a field here and
//! its read where the scheduler uses it (the engine's start lists every field, so a new one is not
//! forgotten there).

use super::Admission;
use crate::speculation::SpecConfig;

/// Everything the scheduler is built from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SchedulerConfig {
    /// Sequences running at once.
    pub max_num_seqs: usize,
    /// Tokens per step.
    pub max_num_batched_tokens: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// Prefix caching on.
    pub prefix_caching: bool,
    /// When every layer of the model attends at most this many tokens back (sliding-window attention in
    /// all layers, as Mistral 7B v0.1): blocks that slid out of the window are given back as the
    /// sequence advances. `None` when any layer reads the whole context (Gemma 3's global layers).
    pub release_window: Option<usize>,
    /// How waiting requests are admitted.
    pub admission: Admission,
    /// Caps on what pins, retention and one chunk may hold.
    pub caps: Caps,
    /// Speculation, when on.
    pub speculation: Option<SpecPlan>,
    /// Whether the pool records KV events (an `AllCleared` first).
    pub kv_events: bool,
}

/// Caps on pinned and retained blocks and on the rows of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// Most blocks `keep_alive` pins may hold (`None`: half the pool).
    pub max_pinned_blocks: Option<usize>,
    /// Most blocks session retention may hold (`None`: three quarters of the pool).
    pub max_retained_blocks: Option<usize>,
    /// Most blocks one tenant's pins may hold (`None`: only the overall caps).
    pub max_pinned_per_tenant: Option<usize>,
    /// Most tokens a step holds when it decodes streams (prefill fills it up to this: shorter steps
    /// next to streams). `None`: the token budget.
    pub prefill_cap: Option<usize>,
    /// Most rows one chunk of a sequence whose every row returns an output computes (prompt logprobs,
    /// mean-pooled embeddings): its long prompt runs in several chunks instead of returning one
    /// `rows × vocab` block of logits.
    pub all_rows_cap: usize,
}

impl Default for Caps {
    /// The pool-relative defaults, no per-tenant cap, no prefill cap, no all-rows cap.
    fn default() -> Caps {
        Caps {
            max_pinned_blocks: None,
            max_retained_blocks: None,
            max_pinned_per_tenant: None,
            prefill_cap: None,
            all_rows_cap: usize::MAX,
        }
    }
}

/// How the scheduler speculates.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpecPlan {
    /// The settings (`--speculative-config`).
    pub config: SpecConfig,
    /// Most positions a sequence may reach (proposals stop there).
    pub max_len: usize,
    /// Rows of a sequence the backend computes per read of the weights (`None`: no such grain); a
    /// proposal that would spill a quarter of that or less into another read is trimmed to fit.
    pub rows_per_weight_read: Option<usize>,
    /// Where the backend computes token-tree rows exactly (`None`: single paths only).
    pub tree: Option<kvgate_backend::TreeGrain>,
}

#[cfg(test)]
impl SpecPlan {
    /// Speculation by `config` with no position limit and no read grain.
    pub fn new(config: SpecConfig) -> SpecPlan {
        SpecPlan {
            config,
            max_len: usize::MAX,
            rows_per_weight_read: None,
            tree: None,
        }
    }
}

#[cfg(test)]
impl SchedulerConfig {
    /// `max_num_seqs` sequences and `max_num_batched_tokens` tokens a step over blocks of
    /// `block_size` tokens, prefix caching on, every layer reading the whole context, arrival-order
    /// admission, the default caps, no speculation, no KV events.
    pub fn new(max_num_seqs: usize, max_num_batched_tokens: usize, block_size: usize) -> SchedulerConfig {
        SchedulerConfig {
            max_num_seqs,
            max_num_batched_tokens,
            block_size,
            prefix_caching: true,
            release_window: None,
            admission: Admission::default(),
            caps: Caps::default(),
            speculation: None,
            kv_events: false,
        }
    }
}
