//! The weight dequantizers of `kernels/model.cu` (every GGUF layout the CUDA matmul reads) built for the
//! host with the system C++ compiler and checked against candle's dequantization of the same blocks:
//! a wrong bit layout fails CI here, before any GPU sees it (`tests/host/dequant_harness.cpp`, on the
//! emulated device's shims of `tests/host/cuda_host.h`; only `dequant_chunk` is called). Skipped when
//! no C++ compiler is installed.

mod host;

use std::io::Write;
use std::process::Command;

use candle_core::quantized::QTensor;
use candle_core::{Device, Tensor};
use kvgate_cuda::WeightFormat;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

#[test]
fn every_gguf_layout_dequantizes_as_candle_does() {
    let Some(cxx) = host::compiler() else {
        eprintln!("SKIP: no C++ compiler (c++, g++ or clang++) on x86-64 to build the host dequantizers");
        return;
    };
    let exe = std::env::temp_dir().join(format!("kvgate-host-dequant-{}", std::process::id()));
    host::build(cxx, "dequant_harness.cpp", &exe, false);
    let mut r = ChaCha8Rng::seed_from_u64(11);
    let (rows, cols) = (6usize, 768usize);
    // values at several scales, with outliers, so every scale/min code path is exercised
    let w: Vec<f32> = (0..rows * cols)
        .map(|i| {
            r.random_range(-1.0f32..1.0) * [0.01f32, 0.3, 2.0, 40.0][i / cols % 4] + if i % 97 == 0 { 3.0 } else { 0.0 }
        })
        .collect();
    let t = Tensor::from_vec(w, (rows, cols), &Device::Cpu).unwrap();
    for wf in WeightFormat::ALL {
        let gt = wf.gguf();
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
    let _ = std::fs::remove_file(&exe);
}
