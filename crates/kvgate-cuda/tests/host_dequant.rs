//! The weight dequantizers of `kernels/model.cu` (every GGUF layout the CUDA matmul reads) built for the
//! host with the system C++ compiler and checked against candle's dequantization of the same blocks:
//! a wrong bit layout fails CI here, before any GPU sees it. The CUDA-only parts of the file (warp
//! shuffles, thread indices) are shimmed; only `dequant_chunk` is called. Skipped when no C++ compiler
//! is installed.

use std::io::Write;
use std::process::Command;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use kvgate_cuda::WeightFormat;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const HARNESS: &str = r#"
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <vector>
#include <algorithm>
using std::min;
#define __device__
#define __global__
#define __forceinline__ inline
#define __shared__ static
struct dim3_ { unsigned x, y, z; };
static dim3_ threadIdx, blockIdx, blockDim;
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
template <typename T> static inline T __shfl_xor_sync(unsigned, T v, int) { return v; }
static inline void __syncthreads() {}
#include "model.cu"
int main(int argc, char** argv) {
    int fmt = atoi(argv[1]), rows = atoi(argv[2]), cols = atoi(argv[3]);
    long row_bytes = atol(argv[4]);
    std::vector<u8> data((size_t)rows * row_bytes);
    if (fread(data.data(), 1, data.size(), stdin) != data.size()) return 3;
    float w[32];
    for (int r = 0; r < rows; r++)
        for (int c = 0; 32 * c < cols; c++) {
            dequant_chunk(data.data() + (size_t)r * row_bytes, fmt, c, cols, w);
            int m = std::min(32, cols - 32 * c);
            fwrite(w, 4, m, stdout);
        }
    return 0;
}
"#;

fn compiler() -> Option<&'static str> {
    ["c++", "g++", "clang++"].into_iter().find(|c| {
        Command::new(c)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

#[test]
fn every_gguf_layout_dequantizes_as_candle_does() {
    let Some(cxx) = compiler() else {
        eprintln!("SKIP: no C++ compiler (c++, g++ or clang++) to build the host dequantizers");
        return;
    };
    let dir = std::env::temp_dir().join(format!("kvgate-host-dequant-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kernels = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../kernels");
    std::fs::write(dir.join("harness.cpp"), HARNESS).unwrap();
    let exe = dir.join("harness");
    let out = Command::new(cxx)
        .args(["-O1", "-std=c++17", "-w", "-I"])
        .arg(&kernels)
        .arg(dir.join("harness.cpp"))
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the host build of kernels/model.cu failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut r = ChaCha8Rng::seed_from_u64(11);
    let (rows, cols) = (6usize, 768usize);
    // values at several scales, with outliers, so every scale/min code path is exercised
    let w: Vec<f32> = (0..rows * cols)
        .map(|i| {
            r.random_range(-1.0f32..1.0) * [0.01f32, 0.3, 2.0, 40.0][i / cols % 4] + if i % 97 == 0 { 3.0 } else { 0.0 }
        })
        .collect();
    let t = Tensor::from_vec(w, (rows, cols), &Device::Cpu).unwrap();
    let formats = [
        (GgmlDType::F32, WeightFormat::F32),
        (GgmlDType::F16, WeightFormat::F16),
        (GgmlDType::BF16, WeightFormat::BF16),
        (GgmlDType::Q4_0, WeightFormat::Q4_0),
        (GgmlDType::Q4_1, WeightFormat::Q4_1),
        (GgmlDType::Q5_0, WeightFormat::Q5_0),
        (GgmlDType::Q5_1, WeightFormat::Q5_1),
        (GgmlDType::Q8_0, WeightFormat::Q8_0),
        (GgmlDType::Q4K, WeightFormat::Q4K),
        (GgmlDType::Q5K, WeightFormat::Q5K),
        (GgmlDType::Q6K, WeightFormat::Q6K),
    ];
    for (gt, wf) in formats {
        let q = QTensor::quantize(&t, gt).unwrap();
        let bytes = q.data().unwrap().into_owned();
        let row_bytes = wf.row_bytes(cols).unwrap();
        assert_eq!(bytes.len(), rows * row_bytes, "{gt:?}: the row size the kernels assume");
        let want: Vec<f32> = q
            .dequantize(&Device::Cpu)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let mut child = Command::new(&exe)
            .args([
                (wf as i32).to_string(),
                rows.to_string(),
                cols.to_string(),
                row_bytes.to_string(),
            ])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(&bytes).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{gt:?}: harness failed");
        let got: Vec<f32> = out
            .stdout
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        assert_eq!(got.len(), want.len(), "{gt:?}");
        let worst = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs() / b.abs().max(1e-3))
            .fold(0f32, f32::max);
        let exact = got
            .iter()
            .zip(&want)
            .filter(|(a, b)| a.to_bits() == b.to_bits())
            .count();
        eprintln!(
            "{gt:?}: {exact}/{} values bit-equal, worst relative difference {worst:.1e}",
            want.len()
        );
        assert!(
            worst < 1e-6,
            "{gt:?}: the kernel's dequantization differs from candle's by {worst}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
