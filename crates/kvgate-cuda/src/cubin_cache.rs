//! Compiled kernels kept on disk between processes: NVRTC takes tens of seconds for `kernels/*.cu`,
//! and every `serve` start and every GPU test binary would pay it again. A CUBIN is stored under
//! `KVGATE_CUBIN_CACHE` (default `$XDG_CACHE_HOME/kvgate/cubin` or `~/.cache/kvgate/cubin`), named by a
//! hash of the source, the target architecture and the NVRTC version, so a changed kernel or compiler
//! never reuses a stale one. Reading or writing the cache is best effort: any failure compiles.

use std::path::{Path, PathBuf};

use crate::{nvrtc, CudaError};

/// The cache folder.
pub fn dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("KVGATE_CUBIN_CACHE") {
        return Some(PathBuf::from(d));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("kvgate").join("cubin"))
}

/// The file a compiled `src` for `arch` is kept in under `dir`.
fn path(dir: &Path, name: &str, src: &str, arch: &str) -> Option<PathBuf> {
    let (major, minor) = nvrtc::version().ok()?;
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(src.as_bytes());
    h.update(arch.as_bytes());
    h.update(&major.to_le_bytes());
    h.update(&minor.to_le_bytes());
    let stem = name.trim_end_matches(".cu");
    Some(dir.join(format!("{stem}-{arch}-{:016x}.cubin", h.digest())))
}

/// The CUBIN of `src` for `arch`: from the cache ([`dir`]) when it holds one, else compiled (and stored).
pub fn compile_cached(name: &str, src: &str, arch: &str) -> Result<Vec<u8>, CudaError> {
    compile_in(dir().as_deref(), name, src, arch)
}

/// [`compile_cached`] with the cache in `dir` (`None`: no cache).
pub fn compile_in(dir: Option<&Path>, name: &str, src: &str, arch: &str) -> Result<Vec<u8>, CudaError> {
    let file = dir.and_then(|d| path(d, name, src, arch));
    if let Some(bytes) = file.as_ref().and_then(|f| std::fs::read(f).ok()) {
        if bytes.starts_with(b"\x7fELF") {
            return Ok(bytes);
        }
    }
    let cubin = nvrtc::compile_cubin(name, src, arch)?;
    if let Some(f) = file {
        // best effort, written whole then renamed: a reader never sees half a file
        if let Some(parent) = f.parent() {
            let _ = std::fs::create_dir_all(parent);
        }
        let tmp = f.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, &cubin).is_ok() {
            let _ = std::fs::rename(&tmp, &f);
        }
    }
    Ok(cubin)
}
