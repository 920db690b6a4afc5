//! The CUDA kernels of `kernels/*.cu` run without a GPU: `tests/host/kernels_test.cpp` builds both
//! sources for the host with the system C++ compiler (C++20), emulating CUDA threads, warps and blocks
//! (`tests/host/cuda_host.h`: an OS thread per CUDA thread, barriers for `__syncthreads`, `__syncwarp`
//! and the warp shuffles), and checks the model kernels (matmul over f32 and Q8_0 rows with batch
//! invariance, embedding, RMSNorm, RoPE, activations, softcap, gathers, log-probabilities) and the
//! paged attention of query rows over their own ranges (prefill rows, sliding windows, softcap, GQA,
//! f32/f16/bf16/fp8 caches) against references in double. What it cannot check — the real device's
//! scheduling, memory model and speed — is the GPU tests' job (`backend_parity.rs`, `gpu.rs`).
//! Skipped when no C++ compiler is installed.

use std::path::PathBuf;
use std::process::Command;

fn compiler() -> Option<&'static str> {
    ["c++", "g++", "clang++"].into_iter().find(|c| {
        Command::new(c)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

#[test]
fn the_kernels_compute_what_their_references_do_on_an_emulated_device() {
    let Some(cxx) = compiler() else {
        eprintln!("SKIP: no C++ compiler (c++, g++ or clang++) to build the kernels for the host");
        return;
    };
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let exe = std::env::temp_dir().join(format!("kvgate-host-kernels-{}", std::process::id()));
    let out = Command::new(cxx)
        .args(["-std=c++20", "-O1", "-ffp-contract=off", "-pthread", "-w", "-I"])
        .arg(root.join("../../kernels"))
        .arg(root.join("tests/host/kernels_test.cpp"))
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "building kernels/*.cu for the host failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).output().unwrap();
    let _ = std::fs::remove_file(&exe);
    let report = String::from_utf8_lossy(&run.stdout);
    eprintln!("{report}");
    assert!(run.status.success() && report.contains("ok: 0 failures"), "{report}");
}
