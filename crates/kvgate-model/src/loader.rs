//! Loading a model from a path: a `.gguf` file, or a Hugging Face directory. Collects everything the
//! engine and server need: the model, the tokenizer, the chat template, the stop tokens, and the
//! sampling defaults of `generation_config.json`.

use std::path::Path;

use serde_json::Value;

use crate::chat::ChatTemplate;
use crate::error::{ModelError, Result};
use crate::load_gguf::load_gguf;
use crate::load_hf::load_hf_dir_with_scales;
use crate::stored::{StoredModel, StoredWeights};
use crate::tokenizer::Tokenizer;

/// Server-side sampling defaults (from `generation_config.json`; unset fields use the API defaults).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationDefaults {
    /// Default temperature.
    pub temperature: Option<f32>,
    /// Default top-p.
    pub top_p: Option<f32>,
    /// Default top-k.
    pub top_k: Option<i64>,
    /// Default min-p.
    pub min_p: Option<f32>,
    /// Default repetition penalty.
    pub repetition_penalty: Option<f32>,
}

/// A model with everything around it: `M` is the network, as stored ([`StoredModel`], from
/// [`load_unprepared`], for a backend to prepare) or laid out by one (`kvgate_cpu::load`).
#[derive(Debug)]
pub struct LoadedModel<M = StoredModel> {
    /// The network.
    pub model: M,
    /// Its tokenizer.
    pub tokenizer: Tokenizer,
    /// Its chat template, when it has one.
    pub chat_template: Option<ChatTemplate>,
    /// Tokens that end generation.
    pub eos_token_ids: Vec<u32>,
    /// Sampling defaults.
    pub defaults: GenerationDefaults,
    /// A name derived from the file (the default served model name).
    pub name: String,
    /// Context length (prompt + output) this instance serves.
    pub max_model_len: usize,
    /// Where it came from, for logs.
    pub source: String,
    /// Per-layer KV-cache scales from the checkpoint, when it has them.
    pub kv_scales: Option<Vec<(f32, f32)>>,
}

/// Loading options.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// Serve at most this many tokens per sequence (default: the model's context length).
    pub max_model_len: Option<usize>,
    /// (The CPU's `load`) lay weights out for the 8-bit-activation mode (5-bit GGUF formats stay
    /// 5-bit): the same weights, their products rounded differently in f32.
    pub int8_activations: bool,
    /// (The CPU's `load`) every GGUF weight dequantized to f32 and multiplied in plain f32 (a
    /// reference: the same weight values, none of the packed kernels). Not for serving: four to eight
    /// times the memory.
    pub f32_weights: bool,
    /// A chat template's Jinja source used in place of the model's own (vLLM's `--chat-template`):
    /// for a checkpoint that carries none, or one the operator wants replaced.
    pub chat_template: Option<String>,
}

fn read_json(path: &Path) -> Option<Value> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

/// The template text of a `tokenizer_config.json` `chat_template` (a string, or a list of named
/// templates of which `default` is used) or of a standalone `chat_template.jinja`.
fn template_from_dir(dir: &Path, tc: Option<&Value>) -> Option<String> {
    if let Ok(t) = std::fs::read_to_string(dir.join("chat_template.jinja")) {
        return Some(t);
    }
    match tc?.get("chat_template")? {
        Value::String(s) => Some(s.clone()),
        Value::Array(list) => list
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .or_else(|| list.first())
            .and_then(|t| t.get("template"))
            .and_then(Value::as_str)
            .map(str::to_string),
        _ => None,
    }
}

fn special_str(tc: Option<&Value>, key: &str) -> Option<String> {
    match tc?.get(key)? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
}

fn defaults_from(gc: Option<&Value>) -> GenerationDefaults {
    let f = |k: &str| gc.and_then(|g| g.get(k)).and_then(Value::as_f64).map(|x| x as f32);
    let sample = gc
        .and_then(|g| g.get("do_sample"))
        .and_then(Value::as_bool)
        .unwrap_or(true);
    if !sample {
        return GenerationDefaults::default();
    }
    GenerationDefaults {
        temperature: f("temperature"),
        top_p: f("top_p"),
        top_k: gc.and_then(|g| g.get("top_k")).and_then(Value::as_i64),
        min_p: f("min_p"),
        repetition_penalty: f("repetition_penalty"),
    }
}

fn ids(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_u64).map(|x| x as u32).collect(),
        _ => vec![],
    }
}

/// The config and weights of the model at `path` (a `.gguf` file or a Hugging Face directory), as the
/// file stores them: what a device prepares its own layout from.
pub fn load_stored(path: &Path) -> Result<(crate::config::ModelConfig, StoredWeights)> {
    if path.is_dir() {
        let (cfg, w, _, _) = load_hf_dir_with_scales(path)?;
        Ok((cfg, w))
    } else {
        let (cfg, w, _) = load_gguf(path)?;
        Ok((cfg, w))
    }
}

/// What a checkpoint gives before its template is parsed and its stop tokens completed.
struct Parts {
    cfg: crate::config::ModelConfig,
    weights: StoredWeights,
    tokenizer: Tokenizer,
    /// The chat template's source, when it has one.
    template: Option<String>,
    /// The template's `bos_token` and `eos_token` strings.
    bos: String,
    eos_str: String,
    /// Tokens that end generation so far.
    eos: Vec<u32>,
    defaults: GenerationDefaults,
    kv_scales: Option<Vec<(f32, f32)>>,
}

/// A Hugging Face directory's parts: its safetensors, `tokenizer.json`, `tokenizer_config.json` and
/// `generation_config.json`.
fn hf_dir_parts(path: &Path) -> Result<Parts> {
    let (cfg, weights, _raw, kv_scales) = load_hf_dir_with_scales(path)?;
    let tok_path = path.join("tokenizer.json");
    if !tok_path.exists() {
        return Err(ModelError::Invalid(format!("{} has no tokenizer.json", path.display())));
    }
    let tokenizer = Tokenizer::from_file(&tok_path)?;
    let tc = read_json(&path.join("tokenizer_config.json"));
    let gc = read_json(&path.join("generation_config.json"));
    let template = template_from_dir(path, tc.as_ref());
    let mut eos = cfg.eos_token_ids.clone();
    eos.extend(ids(gc.as_ref().and_then(|g| g.get("eos_token_id"))));
    let eos_str = special_str(tc.as_ref(), "eos_token").unwrap_or_default();
    if let Some(id) = tokenizer.token_to_id(&eos_str) {
        eos.push(id);
    }
    let bos = special_str(tc.as_ref(), "bos_token").unwrap_or_default();
    Ok(Parts {
        cfg,
        weights,
        tokenizer,
        template,
        bos,
        eos_str,
        eos,
        defaults: defaults_from(gc.as_ref()),
        kv_scales,
    })
}

/// A GGUF's parts: its tensors, its metadata's tokenizer (or a `tokenizer.json` beside it) and template.
fn gguf_parts(path: &Path) -> Result<Parts> {
    let (cfg, weights, meta) = load_gguf(path)?;
    let side = path.with_file_name("tokenizer.json");
    let tokenizer = if side.exists() {
        Tokenizer::from_file(&side)?
    } else {
        Tokenizer::from_gguf(&meta)?
    };
    let template = meta.str("tokenizer.chat_template").map(str::to_string);
    let name_of = |id: Option<u32>| id.and_then(|i| tokenizer.id_to_token(i)).unwrap_or_default();
    let bos = name_of(meta.u32("tokenizer.ggml.bos_token_id"));
    let eos_str = name_of(meta.u32("tokenizer.ggml.eos_token_id"));
    let eos = cfg.eos_token_ids.clone();
    Ok(Parts {
        cfg,
        weights,
        tokenizer,
        template,
        bos,
        eos_str,
        eos,
        defaults: GenerationDefaults::default(),
        kv_scales: None,
    })
}

/// Loads the model at `path` with everything around it, its weights as stored: no device decision is
/// taken (a backend lays them out at its start; `opts`' CPU switches are for `kvgate_cpu::load`).
pub fn load_unprepared(path: &Path, opts: &LoadOptions) -> Result<LoadedModel<StoredModel>> {
    let Parts {
        cfg,
        weights,
        tokenizer,
        template,
        bos,
        eos_str,
        mut eos,
        defaults,
        kv_scales,
    } = if path.is_dir() {
        hf_dir_parts(path)?
    } else {
        gguf_parts(path)?
    };
    // End-of-turn markers of the common chat formats also stop generation.
    for marker in ["<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|endoftext|>"] {
        if let Some(id) = tokenizer.token_to_id(marker) {
            if tokenizer.is_special(id) {
                eos.push(id);
            }
        }
    }
    eos.sort_unstable();
    eos.dedup();
    let template = opts.chat_template.clone().or(template);
    let chat_template = template.map(|t| ChatTemplate::new(&t, &bos, &eos_str)).transpose()?;
    let max_model_len = opts.max_model_len.unwrap_or(cfg.max_position_embeddings);
    if max_model_len == 0 {
        return Err(ModelError::Invalid("max_model_len must be positive".into()));
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_else(|| "model".into());
    let name = name.strip_suffix(".gguf").unwrap_or(&name).to_string();
    let model = StoredModel {
        config: cfg,
        weights,
        max_positions: max_model_len,
    };
    Ok(LoadedModel {
        model,
        tokenizer,
        chat_template,
        eos_token_ids: eos,
        defaults,
        name,
        max_model_len,
        source: path.display().to_string(),
        kv_scales,
    })
}
