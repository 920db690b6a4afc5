//! The engine's configuration: what [`crate::start`] builds the scheduler, admission, retention and
//! tiers from, with [`EngineConfig::default`] as serve's defaults for tests and benches, and the KV
//! calibration it asks the backend for. The cache itself — block size, block count, dtype and method —
//! is the backend's: the engine reads it from the backend it is handed, never from here.

use std::time::Duration;

use kvgate_backend::{KvCalibration, Scales};
use kvgate_kv::KvQuant;

use crate::kv_events::KvEventSink;
use crate::scheduler::Admission;
use crate::speculation::SpecConfig;
use crate::tier::TierConfig;

/// Engine configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// Sequences running at once.
    pub max_num_seqs: usize,
    /// Tokens per step.
    pub max_num_batched_tokens: usize,
    /// Waiting requests before 429.
    pub max_queue: usize,
    /// Prefix caching on.
    pub prefix_caching: bool,
    /// Per-layer (k_scale, v_scale) from the checkpoint, if any.
    pub kv_scales: Option<Vec<(f32, f32)>>,
    /// Calibrate scales from the first prefill.
    pub calculate_kv_scales: bool,
    /// Context length served.
    pub max_model_len: usize,
    /// Label of every metric series.
    pub model_name: String,
    /// Most blocks `keep_alive` pins may hold (`None`: half the pool).
    pub max_pinned_blocks: Option<usize>,
    /// Most blocks one tenant's pins may hold (`None`: only the overall cap).
    pub max_pinned_blocks_per_tenant: Option<usize>,
    /// Most blocks session retention may hold (`None`: three quarters of the pool).
    pub max_retained_blocks: Option<usize>,
    /// Session retention: a decision's state (without an explicit `keep_alive`) is retained this long
    /// for its session's next turn, and a completion with a session hint asks for it too. `None`: off.
    pub session_window: Option<Duration>,
    /// How waiting requests are admitted (cache-aware: warm prefixes first, retained states protected
    /// from cold prefills up to a starvation bound).
    pub admission: Admission,
    /// The decode floor: the share of time running streams keep under a flood of prompts (0: off).
    pub decode_share: f64,
    /// The second KV tier (`--kv-offload-memory`, `--kv-offload-dir`); off by default.
    pub tier: TierConfig,
    /// Where the engine publishes its KV events (`--kv-events-config`); `None`: not recorded.
    pub kv_events: Option<KvEventSink>,
    /// Speculative decoding by prompt lookup (`--speculative-config`); `None`: off.
    pub speculation: Option<SpecConfig>,
}

impl Default for EngineConfig {
    /// `serve`'s defaults where it has them (256 sequences, 2,048 tokens a step, 1,024 waiting, prefix
    /// caching on, the pin caps' own defaults, cache-aware admission with a 30 s bound) and a 2,048-token
    /// context: what tests and benches start from. Session retention is off here (serve's default is
    /// 60 s): a test that checks the pool empties opts in.
    fn default() -> EngineConfig {
        EngineConfig {
            max_num_seqs: 256,
            max_num_batched_tokens: 2048,
            max_queue: 1024,
            prefix_caching: true,
            kv_scales: None,
            calculate_kv_scales: false,
            max_model_len: 2048,
            model_name: "model".into(),
            max_pinned_blocks: None,
            max_pinned_blocks_per_tenant: None,
            max_retained_blocks: None,
            session_window: None,
            admission: Admission::cache_aware(30_000),
            decode_share: 0.7,
            tier: TierConfig::default(),
            kv_events: None,
            speculation: None,
        }
    }
}

/// The calibration `cfg` asks for of a cache written with `quant`: measured scales win over given ones;
/// a `smooth` method measures its offsets.
pub(crate) fn calibration_of(cfg: &EngineConfig, quant: KvQuant) -> KvCalibration {
    KvCalibration {
        scales: match (&cfg.kv_scales, cfg.calculate_kv_scales) {
            (_, true) => Scales::Measured,
            (Some(s), false) => Scales::Given(s.clone()),
            (None, false) => Scales::Unit,
        },
        offsets: quant.smooth,
    }
}

/// With the decode floor on, a step that decodes streams holds at most an eighth of the token budget
/// (at least 64): prefill next to streams comes in short steps, each paid back by decode-only time.
pub(crate) fn prefill_cap(cfg: &EngineConfig) -> Option<usize> {
    (cfg.decode_share > 0.0).then(|| (cfg.max_num_batched_tokens / 8).max(64))
}
