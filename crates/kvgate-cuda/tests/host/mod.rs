//! Building `kernels/*.cu` for the host (tests without a GPU): the system C++ compiler, and the
//! emulated device's driver (`fake_cuda.cpp`: a stand-in libcuda.so.1 and libnvrtc.so.13 that run every
//! launch on `cuda_host.h`'s fibers).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// A C++20 compiler, if one is installed (x86-64 only: the fibers' context switch is x86-64 assembly).
pub fn compiler() -> Option<&'static str> {
    if !cfg!(target_arch = "x86_64") {
        return None;
    }
    ["c++", "g++", "clang++"].into_iter().find(|c| {
        Command::new(c)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Compiles `source` (under tests/host) with `kernels/` on the include path into `out`; `shared` makes a
/// shared library. Panics with the compiler's output when it fails.
pub fn build(cxx: &str, source: &str, out: &Path, shared: bool) {
    let mut cmd = Command::new(cxx);
    cmd.args(["-std=c++20", "-O2", "-ffp-contract=off", "-w", "-I"])
        .arg(root().join("../../kernels"))
        .arg(root().join("tests/host").join(source))
        .arg("-o")
        .arg(out);
    if shared {
        cmd.args(["-shared", "-fPIC"]);
    }
    let o = cmd.output().unwrap();
    assert!(
        o.status.success(),
        "building {source} for the host failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A folder holding the emulated device's libcuda.so.1 and libnvrtc.so.13: put it on LD_LIBRARY_PATH
/// of a process started after this, and cudarc loads them.
pub fn emulated_driver(cxx: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kvgate-emulated-cuda-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    build(cxx, "fake_cuda.cpp", &dir.join("libcuda.so.1"), true);
    std::fs::copy(dir.join("libcuda.so.1"), dir.join("libnvrtc.so.13")).unwrap();
    dir
}

/// Whether this process is the emulated run of [`rerun_on_emulated_device`].
pub fn emulated() -> bool {
    std::env::var_os("KVGATE_EMULATED").is_some()
}

/// Runs the current test binary again, every test but `this` one, on the emulated device (its
/// libcuda.so.1 and libnvrtc.so.13 on `LD_LIBRARY_PATH`, `KVGATE_EMULATED` and `KVGATE_REQUIRE_GPU`
/// set, its own CUBIN cache), and returns the child's success and its output. `None` — nothing to do —
/// inside that run, on a machine with a GPU (the tests run on it directly), or without a C++ compiler.
pub fn rerun_on_emulated_device(this: &str) -> Option<(bool, String)> {
    if emulated() || kvgate_cuda::device_count().is_ok() {
        return None;
    }
    let Some(cxx) = compiler() else {
        eprintln!("SKIP: no C++ compiler (c++, g++ or clang++) on x86-64 to build the emulated device");
        return None;
    };
    let dir = emulated_driver(cxx);
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--test-threads=1", "--nocapture", "--skip", this])
        .env("LD_LIBRARY_PATH", &dir)
        .env("KVGATE_EMULATED", "1")
        .env("KVGATE_CUBIN_CACHE", dir.join("cubin"))
        .env("KVGATE_REQUIRE_GPU", "1")
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{text}");
    Some((out.status.success(), text))
}
