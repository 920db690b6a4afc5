//! The value types of the settings that are more than a number or a string: the KV-cache dtype and
//! method (`auto` or a fixed one), the activation precision and log format (plain enums, through
//! clap's `ValueEnum`), sizes in bytes. Each parses with one `FromStr`, which clap, the environment
//! and the TOML file all use.

use clap::ValueEnum;
use kvgate_decide::DecisionTemperature;
use kvgate_kv::{KvDtype, KvQuant};
use serde::{Deserialize, Serialize};

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

/// `FromStr` and `Display` of a plain setting enum through clap's `ValueEnum`: its names and aliases
/// are declared once, on the variants (case and surrounding space ignored); then the string serde.
macro_rules! value_enum_setting {
    ($t:ty, $what:literal) => {
        impl std::str::FromStr for $t {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                <$t as ValueEnum>::from_str(s.trim(), true).map_err(|_| {
                    let names: Vec<String> = <$t as ValueEnum>::value_variants()
                        .iter()
                        .filter_map(ValueEnum::to_possible_value)
                        .map(|p| p.get_name().to_string())
                        .collect();
                    format!("{s:?} is not {}: expected {}", $what, names.join(" or "))
                })
            }
        }
        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                match self.to_possible_value() {
                    Some(p) => f.write_str(p.get_name()),
                    None => Ok(()),
                }
            }
        }
        string_setting!($t);
    };
}

/// Parses a setting through its `FromStr` (clap's parser for the setting types, so `--help` lists no
/// possible values and every source parses alike).
pub(crate) fn parse_setting<T: std::str::FromStr<Err = String>>(s: &str) -> Result<T, String> {
    s.parse()
}

/// A read method by its wire name (`--decision-read`).
pub(super) fn parse_read_method(s: &str) -> Result<kvgate_decide::orders::ReadMethod, String> {
    kvgate_decide::orders::ReadMethod::try_from(s.to_string())
}

/// `--chat-template` (vLLM's flag): a Jinja file's path, or the template itself — a value containing
/// `{` is a template (no file name has one in practice), anything else a path, read at start-up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum ChatTemplateSetting {
    /// The template's source, given inline.
    Inline(String),
    /// A file holding it.
    File(std::path::PathBuf),
}

impl ChatTemplateSetting {
    /// The template's Jinja source (a file read now; the error names it).
    pub fn source(&self) -> Result<String, String> {
        match self {
            ChatTemplateSetting::Inline(s) => Ok(s.clone()),
            ChatTemplateSetting::File(p) => {
                std::fs::read_to_string(p).map_err(|e| format!("cannot read {}: {e}", p.display()))
            }
        }
    }
}

impl std::str::FromStr for ChatTemplateSetting {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s.trim().is_empty() {
            return Err("a chat template cannot be empty: give a Jinja file's path or the template".into());
        }
        Ok(if s.contains('{') {
            ChatTemplateSetting::Inline(s.to_string())
        } else {
            ChatTemplateSetting::File(s.trim().into())
        })
    }
}

impl std::fmt::Display for ChatTemplateSetting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChatTemplateSetting::Inline(s) => f.write_str(s),
            ChatTemplateSetting::File(p) => write!(f, "{}", p.display()),
        }
    }
}
string_setting!(ChatTemplateSetting);

/// `--decision-temperature`: `auto` (the temperatures fitted for the served model when it is one of
/// [`kvgate_decide::temperature::fitted_for`]'s, else [`DecisionTemperature::DEFAULT`]) or fixed ones.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum DecisionTemperatureSetting {
    /// Fitted for the model, else the generic default.
    Auto,
    /// These.
    Fixed(DecisionTemperature),
}

impl DecisionTemperatureSetting {
    /// The temperatures for a model with these fitted ones (if any).
    pub fn resolve(self, fitted: Option<DecisionTemperature>) -> DecisionTemperature {
        match self {
            DecisionTemperatureSetting::Auto => fitted.unwrap_or(DecisionTemperature::DEFAULT),
            DecisionTemperatureSetting::Fixed(t) => t,
        }
    }
}

impl std::str::FromStr for DecisionTemperatureSetting {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s.trim().eq_ignore_ascii_case("auto") {
            return Ok(DecisionTemperatureSetting::Auto);
        }
        s.parse().map(DecisionTemperatureSetting::Fixed)
    }
}

impl std::fmt::Display for DecisionTemperatureSetting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecisionTemperatureSetting::Auto => f.write_str("auto"),
            DecisionTemperatureSetting::Fixed(t) => t.fmt(f),
        }
    }
}
string_setting!(DecisionTemperatureSetting);

/// `--kv-cache-dtype`: `auto` (the model's choice) or a fixed dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum KvCacheDtype {
    /// float32 on the CPU, bfloat16 on a GPU.
    Auto,
    /// This dtype.
    Fixed(KvDtype),
}

impl KvCacheDtype {
    /// The dtype the cache is stored in on `device`.
    pub fn resolve(self, device: kvgate_engine::Device) -> KvDtype {
        match (self, device) {
            (KvCacheDtype::Auto, kvgate_engine::Device::Cpu) => KvDtype::F32,
            (KvCacheDtype::Auto, kvgate_engine::Device::Cuda(_)) => KvDtype::BF16,
            (KvCacheDtype::Fixed(d), _) => d,
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ValueEnum)]
#[serde(try_from = "String", into = "String")]
pub enum Activations {
    /// f32 activations (exact: every result equals a matmul against the dequantized weights up to
    /// f32 rounding).
    #[value(name = "f32", alias = "float32")]
    F32,
    /// The default: integer dot products for 4- and 8-bit weights from activations quantized per 32
    /// inputs (to 8 bits against 4-bit weights, as llama.cpp computes; to 16 bits against 8-bit ones);
    /// completions only, decisions stay f32.
    #[value(name = "int8", alias = "q8")]
    Int8,
}
value_enum_setting!(Activations, "an activation precision");

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ValueEnum)]
#[serde(try_from = "String", into = "String")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}
value_enum_setting!(LogFormat, "a log format");

/// `--admission`: how the waiting queue is ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ValueEnum)]
#[serde(try_from = "String", into = "String")]
pub enum AdmissionPolicy {
    /// Warm prefixes first; retained states protected from cold prefills up to the bound.
    CacheAware,
    /// Arrival order.
    Fifo,
}
value_enum_setting!(AdmissionPolicy, "an admission policy");

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

/// Parses "2GiB", "512MiB", "1.5GB", "1024" into bytes.
pub(crate) fn parse_bytes(s: &str) -> Result<u64, String> {
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

/// `--pooling`: how `/v1/embeddings` pools a prompt's final hidden states (llama.cpp's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ValueEnum)]
#[serde(try_from = "String", into = "String")]
pub enum PoolingSetting {
    /// The last token's hidden state (what a decoder has read the whole input by; the prefix cache
    /// serves everything before it).
    Last,
    /// The mean over every token's (every row computed).
    Mean,
}
value_enum_setting!(PoolingSetting, "a pooling");

impl From<PoolingSetting> for kvgate_engine::Pooling {
    fn from(p: PoolingSetting) -> kvgate_engine::Pooling {
        match p {
            PoolingSetting::Last => kvgate_engine::Pooling::Last,
            PoolingSetting::Mean => kvgate_engine::Pooling::Mean,
        }
    }
}

/// `--speculative-config`: kept as given once it reads as a speculative config (parsed into the
/// engine's `SpecConfig` where the engine starts).
pub fn speculative_config(s: &str) -> Result<String, String> {
    crate::startup::speculative::parse(s).map(|_| s.to_string())
}

/// `--kv-shared`: a Redis URL the client can open (`redis://`, `rediss://`, `unix://`, `redis+unix://`).
pub fn redis_url(s: &str) -> Result<String, String> {
    let scheme_ok = ["redis://", "rediss://", "unix://", "redis+unix://"]
        .iter()
        .any(|p| s.starts_with(p));
    if !scheme_ok {
        return Err(format!("'{s}' is not a Redis URL (redis://host:port[/db])"));
    }
    Ok(s.to_string())
}

/// `--kv-events-config`: kept as given once it reads as a KV events config (parsed into
/// [`crate::startup::kv_events::KvEventsConfig`] where the publisher starts).
pub fn kv_events_config(s: &str) -> Result<String, String> {
    crate::startup::kv_events::KvEventsConfig::parse(s).map(|_| s.to_string())
}
