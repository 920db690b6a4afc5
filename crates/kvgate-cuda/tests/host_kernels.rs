//! The CUDA kernels of `kernels/*.cu` run without a GPU: `tests/host/kernels_test.cpp` builds both
//! sources for the host with the system C++ compiler (C++20), emulating CUDA threads, warps and blocks
//! (`tests/host/cuda_host.h`: a fiber per CUDA thread, barriers for `__syncthreads`, `__syncwarp`
//! and the warp shuffles), and checks the model kernels (matmul over f32 and Q8_0 rows with batch
//! invariance, embedding, RMSNorm, RoPE, activations, softcap, gathers, log-probabilities) and the
//! paged attention of query rows over their own ranges (prefill rows, sliding windows, softcap, GQA,
//! f32/f16/bf16/fp8 caches) against references in double. What it cannot check — the real device's
//! scheduling, memory model and speed — is the GPU tests' job (`backend_parity.rs`, `gpu.rs`).
//! Skipped when no C++ compiler is installed.

mod host;

use std::process::Command;

#[test]
fn the_kernels_compute_what_their_references_do_on_an_emulated_device() {
    let Some(cxx) = host::compiler() else {
        eprintln!("SKIP: no C++ compiler (c++, g++ or clang++) on x86-64 to build the kernels for the host");
        return;
    };
    let exe = std::env::temp_dir().join(format!("kvgate-host-kernels-{}", std::process::id()));
    host::build(cxx, "kernels_test.cpp", &exe, false);
    let run = Command::new(&exe).output().unwrap();
    let _ = std::fs::remove_file(&exe);
    let report = String::from_utf8_lossy(&run.stdout);
    eprintln!("{report}");
    assert!(run.status.success() && report.contains("ok: 0 failures"), "{report}");
}
