//! The CUDA backend against the CPU backend (run on a machine with an NVIDIA GPU; elsewhere each test
//! prints "skipped: no CUDA device", and with `KVGATE_REQUIRE_GPU=1` a missing GPU fails):
//! - every weight format the kernels read (f32, f16, bf16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K,
//!   Q6_K), quantized here by candle: matmul and embedding rows against the CPU's dequantized f32;
//! - the tiny checkpoint of every architecture (Llama, Qwen2, Qwen3, Gemma 3) and a Q8_0/Q4_1 copy of the
//!   tiny Llama: prefill logits within 1e-3 (relative to the row's largest logit), greedy tokens equal
//!   for 32 steps, decision log-probabilities within 1e-3, and batch invariance (a row's logits bitwise
//!   the same alone and among 16 sequences);
//! - every KV dtype and method the kernels take, end to end, against the CPU backend with the same cache;
//! - without any GPU, opening the backend fails with a message that names what is missing.
//!
//! Without a GPU, `the_backend_runs_on_an_emulated_device` runs all of the above once more in a child
//! process whose libcuda.so.1 and libnvrtc.so.13 are the emulated device of `tests/host` (every kernel
//! launch executed on host fibers): the unchanged backend — cudarc calls, kernel arguments, the
//! forward pass — against the CPU backend, in CI. It runs a lighter profile (8 greedy steps, one or
//! two methods per KV dtype); the real device runs the whole one.

mod host;

use std::path::PathBuf;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device as CDevice, Tensor};
use kvgate_backend::{Backend, BackendError, Batch, KvMemory, Output, RowMask, Want};
use kvgate_cpu::{prepare, CpuBackend, CpuLayout, CpuSettings};
use kvgate_cuda::{CudaBackend, CudaSettings, DevMatrix, Gpu, WeightFormat};
use kvgate_kv::{KvDtype, KvQuant};
use kvgate_model::{StoredModel, StoredTensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn gpu() -> Option<Gpu> {
    match Gpu::new(0) {
        Ok(g) => Some(g),
        Err(e) => {
            let required = std::env::var("KVGATE_REQUIRE_GPU").as_deref() == Ok("1");
            assert!(!required, "KVGATE_REQUIRE_GPU=1 but no usable GPU: {e}");
            eprintln!("skipped: no CUDA device ({e})");
            None
        }
    }
}

fn tiny(arch: &str) -> StoredModel {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/tiny")
        .join(arch);
    let (config, weights) = kvgate_model::load_stored(&dir).unwrap();
    StoredModel {
        config,
        weights,
        max_positions: 256,
    }
}

const ARCHS: [&str; 4] = ["llama", "qwen2", "qwen3", "gemma3_text"];

/// The tiny Llama with every matrix stored as `q` GGUF blocks.
fn tiny_quantized(q: GgmlDType) -> StoredModel {
    let mut m = tiny("llama");
    let quant = |t: &mut StoredTensor| {
        if let StoredTensor::Dense(d) = t {
            let g = kvgate_model::GgufTensor::from_qtensor(&QTensor::quantize(d, q).unwrap()).unwrap();
            *t = StoredTensor::Gguf(std::sync::Arc::new(g));
        }
    };
    for l in &mut m.weights.layers {
        for lin in [
            &mut l.q,
            &mut l.k,
            &mut l.v,
            &mut l.o,
            &mut l.gate,
            &mut l.up,
            &mut l.down,
        ] {
            quant(&mut lin.weight);
        }
    }
    quant(&mut m.weights.embed);
    m
}

fn cpu_backend(m: &StoredModel, dtype: KvDtype, quant: KvQuant, blocks: usize) -> CpuBackend {
    let shape = m.config.cache_shape(4, dtype).unwrap().with_quant(quant).unwrap();
    let layout = CpuLayout {
        five_bit: false,
        f32_weights: true,
    };
    CpuBackend::open(
        prepare::model(m.clone(), layout).unwrap(),
        shape,
        KvMemory::Blocks(blocks),
        CpuSettings::default(),
    )
    .unwrap()
}

fn cuda_backend(m: &StoredModel, dtype: KvDtype, quant: KvQuant, blocks: usize) -> CudaBackend {
    let shape = m.config.cache_shape(4, dtype).unwrap().with_quant(quant).unwrap();
    CudaBackend::open(m.clone(), shape, KvMemory::Blocks(blocks), CudaSettings::default()).unwrap()
}

/// Largest |a − b| over a row, relative to the row's largest |b| (at least 1).
fn rel_diff(a: &[f32], b: &[f32], width: usize) -> f32 {
    assert_eq!(a.len(), b.len());
    a.chunks(width)
        .zip(b.chunks(width))
        .map(|(x, y)| {
            let top = y.iter().fold(1f32, |m, v| m.max(v.abs()));
            x.iter().zip(y).fold(0f32, |m, (p, q)| m.max((p - q).abs())) / top
        })
        .fold(0f32, f32::max)
}

fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}

/// One decode row of sequence 0 at `pos` (blocks 0, 1, … of 4 tokens).
fn decode_row(token: u32, pos: usize, want: Want) -> Batch {
    Batch {
        tokens: vec![token],
        positions: vec![pos as u32],
        slots: vec![pos],
        seq_of_row: vec![0],
        tables: vec![(0..(pos + 1).div_ceil(4) as u32).collect()],
        outputs: vec![Output { row: 0, want }],
        precision: vec![],
        rope: Vec::new(),
        masks: Vec::new(),
    }
}

fn prompt(len: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut r = ChaCha8Rng::seed_from_u64(seed);
    (0..len).map(|_| r.random_range(1..vocab as u32)).collect()
}

#[test]
fn every_weight_format_matches_the_cpu() {
    let Some(g) = gpu() else { return };
    let mut r = ChaCha8Rng::seed_from_u64(7);
    let (rows, cols) = (48, 512);
    let w: Vec<f32> = (0..rows * cols).map(|_| r.random_range(-1.0..1.0)).collect();
    let t = Tensor::from_vec(w.clone(), (rows, cols), &CDevice::Cpu).unwrap();
    for wf in WeightFormat::ALL {
        let gt = wf.gguf();
        let q = QTensor::quantize(&t, gt).unwrap();
        let deq: Vec<f32> = q
            .dequantize(&CDevice::Cpu)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let m = DevMatrix::upload(&g, wf, rows, cols, &q.data().unwrap(), None).unwrap();
        for n in [1usize, 5, 17] {
            let x: Vec<f32> = (0..n * cols).map(|_| r.random_range(-1.0..1.0)).collect();
            let mut y = g.zeros_f32(n * rows).unwrap();
            g.matmul(&mut y, &g.upload(&x).unwrap(), &m, n).unwrap();
            let got = g.download(&y).unwrap();
            let want: Vec<f32> = (0..n)
                .flat_map(|i| {
                    let xr = &x[i * cols..(i + 1) * cols];
                    (0..rows)
                        .map(|j| {
                            deq[j * cols..(j + 1) * cols]
                                .iter()
                                .zip(xr)
                                .map(|(a, b)| a * b)
                                .sum::<f32>()
                        })
                        .collect::<Vec<_>>()
                })
                .collect();
            let d = rel_diff(&got[..n * rows], &want, rows);
            assert!(d < 1e-4, "{gt:?} matmul of {n} rows: {d}");
        }
        // embedding rows are the dequantized rows, exactly
        let tokens = [0u32, 47, 3, 3];
        let mut e = g.zeros_f32(tokens.len() * cols).unwrap();
        g.embed(&mut e, &m, &g.upload(&tokens).unwrap(), tokens.len(), 1.0)
            .unwrap();
        let got = g.download(&e).unwrap();
        for (i, &tk) in tokens.iter().enumerate() {
            let want = &deq[tk as usize * cols..(tk as usize + 1) * cols];
            let d = rel_diff(&got[i * cols..(i + 1) * cols], want, cols);
            assert!(d < 1e-6, "{gt:?} embedding row {tk}: {d}");
        }
        eprintln!("{gt:?}: matmul and embedding match the CPU");
    }
}

/// Prefill logits, greedy decoding, decisions and batch invariance of `m` on both backends.
fn parity(name: &str, m: &StoredModel, dtype: KvDtype, quant: KvQuant, tol: f32) {
    let vocab = m.config.vocab_size;
    let mut cpu = cpu_backend(m, dtype, quant, 64);
    let mut gpu = cuda_backend(m, dtype, quant, 64);
    let ids = prompt(19, vocab, 1);
    let batch = Batch::single_sequence(&ids, 4);
    let a = gpu.forward(&batch).unwrap();
    let b = cpu.forward(&batch).unwrap();
    let d = rel_diff(&a.logits, &b.logits, vocab);
    assert!(
        d <= tol,
        "{name} {dtype} {}: prefill logits differ by {d}",
        quant.name()
    );
    // greedy: 32 steps (8 on the emulated device), each backend on its own tokens
    let steps = if host::emulated() { 8 } else { 32 };
    let (mut ta, mut tb) = (argmax(&a.logits[18 * vocab..]), argmax(&b.logits[18 * vocab..]));
    for step in 0..steps {
        assert_eq!(ta, tb, "{name} {dtype} {}: greedy token {step}", quant.name());
        let pos = ids.len() + step;
        let la = gpu.forward(&decode_row(ta, pos, Want::Logits)).unwrap().logits;
        let lb = cpu.forward(&decode_row(tb, pos, Want::Logits)).unwrap().logits;
        (ta, tb) = (argmax(&la), argmax(&lb));
    }
    // a decision's few log-probabilities, computed on the device
    let pos = ids.len() + steps;
    let want = Want::Logprobs(vec![1, 2, 3, (vocab - 1) as u32]);
    let la = gpu.forward(&decode_row(ta, pos, want.clone())).unwrap();
    let lb = cpu.forward(&decode_row(tb, pos, want)).unwrap();
    assert!(la.logits.is_empty(), "no logits row crosses for a read");
    for (x, y) in la.logprobs[0].iter().zip(&lb.logprobs[0]) {
        assert!((x - y).abs() <= 1e-3, "{name}: logprob {x} vs {y}");
    }
    // tree rows (a set read): rows 11–13 and 14–16 two branches at the same RoPE positions, each
    // seeing the prefix and itself, rows 17–18 seeing everything
    let mut tree = Batch::single_sequence(&ids, 4);
    let bits = |idx: &[usize]| vec![idx.iter().fold(0u64, |w, &i| w | 1 << i)];
    tree.rope = (0..19u32).map(|p| if p >= 14 { p - 3 } else { p }).collect();
    tree.masks = (0..19usize)
        .map(|p| {
            let seen: Vec<usize> = match p {
                0..=10 => return None,
                11..=13 => (0..=p - 11).collect(),
                14..=16 => (3..=p - 11).collect(),
                _ => (0..=p - 11).collect(),
            };
            Some(RowMask {
                base: 11,
                seen: bits(&seen),
            })
        })
        .collect();
    let a = gpu.forward(&tree).unwrap();
    let b = cpu.forward(&tree).unwrap();
    let dt = rel_diff(&a.logits, &b.logits, vocab);
    assert!(dt <= tol, "{name} {dtype} {}: tree logits differ by {dt}", quant.name());
    eprintln!(
        "{name} {dtype} {}: prefill within {d:.2e}, {steps} greedy tokens equal, tree rows within {dt:.2e}",
        quant.name()
    );
}

#[test]
fn tiny_models_of_every_architecture_match_the_cpu() {
    if gpu().is_none() {
        return;
    }
    for arch in ARCHS {
        parity(arch, &tiny(arch), KvDtype::F32, KvQuant::PLAIN, 1e-3);
    }
    for q in [GgmlDType::Q8_0, GgmlDType::Q4_1] {
        parity(
            &format!("llama {q:?}"),
            &tiny_quantized(q),
            KvDtype::F32,
            KvQuant::PLAIN,
            1e-3,
        );
    }
}

#[test]
fn every_kv_dtype_and_method_matches_the_cpu() {
    if gpu().is_none() {
        return;
    }
    let m = tiny("qwen3");
    for dtype in kvgate_cuda::DTYPES {
        for &quant in KvQuant::methods_for(dtype) {
            if quant.smooth {
                continue; // offsets come from a calibration pass: see calibration_matches_the_cpu
            }
            // emulated: each dtype plain, and the rotating + fine method of the 8- and 4-bit ones
            if host::emulated() && quant != KvQuant::PLAIN && !(quant.name() == "both" && dtype != KvDtype::Fp8E5m2) {
                continue;
            }
            // quantized caches: a K/V value a rounding boundary apart may round differently
            let tol = if matches!(dtype, KvDtype::F32 | KvDtype::F16 | KvDtype::BF16) {
                1e-3
            } else {
                2e-2
            };
            parity("qwen3", &m, dtype, quant, tol);
        }
    }
}

#[test]
fn calibration_matches_the_cpu() {
    if gpu().is_none() {
        return;
    }
    let m = tiny("llama");
    let how = kvgate_backend::KvCalibration {
        scales: kvgate_backend::Scales::Measured,
        offsets: true,
    };
    for dtype in [KvDtype::Fp8E4m3, KvDtype::Nvfp4] {
        let quant = *KvQuant::methods_for(dtype).iter().find(|q| q.smooth).unwrap();
        let mut cpu = cpu_backend(&m, dtype, quant, 64);
        let mut gpu = cuda_backend(&m, dtype, quant, 64);
        let batch = Batch::single_sequence(&prompt(23, m.config.vocab_size, 5), 4);
        let rc = cpu.calibrate(&how, Some(&batch)).unwrap();
        let rg = gpu.calibrate(&how, Some(&batch)).unwrap();
        assert_eq!((rc.scales, rc.offset_layers), (rg.scales, rg.offset_layers), "{dtype}");
        let d = rel_diff(
            &gpu.forward(&batch).unwrap().logits,
            &cpu.forward(&batch).unwrap().logits,
            m.config.vocab_size,
        );
        assert!(d < 2e-2, "{dtype} {}: {d}", quant.name());
    }
}

#[test]
fn a_row_computes_the_same_bits_alone_and_in_a_batch_of_16() {
    if gpu().is_none() {
        return;
    }
    let m = tiny("gemma3_text");
    let vocab = m.config.vocab_size;
    let mut gpu = cuda_backend(&m, KvDtype::BF16, KvQuant::PLAIN, 256);
    // 16 sequences of different lengths, each in its own 8 blocks
    let mut big = Batch::default();
    let mut alone = Vec::new();
    for s in 0..16usize {
        let ids = prompt(5 + s, vocab, 100 + s as u64);
        let table: Vec<u32> = (0..8).map(|i| (s * 8 + i) as u32).collect();
        let mut one = Batch {
            tables: vec![table.clone()],
            ..Batch::default()
        };
        for (p, &t) in ids.iter().enumerate() {
            for (b, seq) in [(&mut big, s as u32), (&mut one, 0)] {
                b.tokens.push(t);
                b.positions.push(p as u32);
                b.slots.push(table[p / 4] as usize * 4 + p % 4);
                b.seq_of_row.push(seq);
            }
        }
        big.tables.push(table);
        let last = ids.len() - 1;
        one.outputs.push(Output {
            row: last,
            want: Want::Logits,
        });
        big.outputs.push(Output {
            row: big.tokens.len() - 1,
            want: Want::Logits,
        });
        alone.push(one);
    }
    let together = gpu.forward(&big).unwrap().logits;
    for (s, one) in alone.iter().enumerate() {
        let got = gpu.forward(one).unwrap().logits;
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&together[s * vocab..(s + 1) * vocab]), "sequence {s}");
    }
}

#[test]
fn blocks_read_back_are_the_bytes_written_and_copies_are_exact() {
    if gpu().is_none() {
        return;
    }
    let m = tiny("qwen2");
    let mut gpu = cuda_backend(&m, KvDtype::Fp8E4m3, KvQuant::PLAIN, 16);
    gpu.forward(&Batch::single_sequence(&prompt(8, m.config.vocab_size, 9), 4))
        .unwrap();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    gpu.read_block(1, &mut a).unwrap();
    assert_eq!(a.len(), gpu.capacity().bytes_per_block);
    gpu.write_block(7, &a).unwrap();
    gpu.read_block(7, &mut b).unwrap();
    assert_eq!(a, b);
    gpu.copy_blocks(&[kvgate_backend::BlockCopy { src: 0, dst: 9 }])
        .unwrap();
    let (mut c, mut d) = (Vec::new(), Vec::new());
    gpu.read_block(0, &mut c).unwrap();
    gpu.read_block(9, &mut d).unwrap();
    assert_eq!(c, d);
    assert!(matches!(
        gpu.read_block(16, &mut Vec::new()),
        Err(BackendError::Cache(_))
    ));
}

#[test]
fn without_a_gpu_opening_says_what_is_missing() {
    if kvgate_cuda::device_count().is_ok() {
        let name = Gpu::new(0).map(|g| g.name()).unwrap_or_default();
        eprintln!("a GPU is here ({name}): nothing to refuse");
        return;
    }
    let m = tiny("llama");
    let shape = m.config.cache_shape(4, KvDtype::BF16).unwrap();
    let err = CudaBackend::open(m, shape, KvMemory::Auto, CudaSettings::default()).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, BackendError::Unavailable { .. }), "{msg}");
    assert!(
        msg.contains("libcuda.so.1") && msg.contains("install the NVIDIA driver")
            || msg.contains("no usable CUDA device"),
        "{msg}"
    );
    // a cache dtype without a CUDA kernel is refused before any device is touched
    let m = tiny("llama");
    let shape = m.config.cache_shape(4, KvDtype::Int8).unwrap();
    let msg = CudaBackend::open(m, shape, KvMemory::Auto, CudaSettings::default())
        .unwrap_err()
        .to_string();
    assert!(msg.contains("int8") && msg.contains("bfloat16"), "{msg}");
}

#[test]
fn the_backend_runs_on_an_emulated_device() {
    let Some((ok, text)) = host::rerun_on_emulated_device("the_backend_runs_on_an_emulated_device") else {
        return;
    };
    assert!(ok, "the CUDA backend on the emulated device:\n{text}");
    assert!(text.contains("test result: ok. 7 passed"), "every test ran: {text}");
    assert!(
        text.contains("emulated device"),
        "the emulated driver was the one loaded: {text}"
    );
}
