//! The CUDA backend's speed on the shapes of the benchmark models, without their files (the device
//! machine reaches no network and a carried tree holds no GGUF): Qwen2.5-0.5B and SmolLM2-135M configs
//! with random weights in their GGUF formats (throughput does not depend on the values). Reports
//! prefill tok/s at 4k and 12k tokens, decode tok/s at 1, 32 and 256 streams, a decision's latency on a
//! warm 12k-token state, and the decode rate's weight-read bandwidth against the device's copy
//! bandwidth. Run on a GPU (scripts/device-check.sh); elsewhere it prints "skipped: no CUDA device".
//! `KVGATE_BENCH_REPORT=path` also writes the table to a file.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device as CDevice, Tensor};
use kvgate_backend::{Backend, Batch, KvMemory, Output, Want};
use kvgate_cuda::{CudaBackend, CudaSettings, Gpu};
use kvgate_kv::KvDtype;
use kvgate_model::{ModelConfig, RopeStyle, StoredLinear, StoredModel, StoredTensor, StoredWeights};

const BS: usize = 16;

fn tiny_config(arch: &str) -> ModelConfig {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/tiny")
        .join(arch);
    kvgate_model::load_stored(&dir).unwrap().0
}

/// A `rows × cols` matrix of small pseudo-random values stored as `q`.
fn matrix(rows: usize, cols: usize, q: GgmlDType, seed: u32) -> StoredTensor {
    let v: Vec<f32> = (0..rows * cols)
        .map(|i| {
            let h = (i as u32 ^ seed).wrapping_mul(2_654_435_761);
            (h >> 8) as f32 / (1u32 << 24) as f32 * 0.1 - 0.05
        })
        .collect();
    let t = Tensor::from_vec(v, (rows, cols), &CDevice::Cpu).unwrap();
    StoredTensor::Gguf(Arc::new(
        kvgate_model::GgufTensor::from_qtensor(&QTensor::quantize(&t, q).unwrap()).unwrap(),
    ))
}

struct Shape {
    name: &'static str,
    cfg: ModelConfig,
    /// Format of the attention and MLP matrices, of `down`, of the embedding and head.
    formats: (GgmlDType, GgmlDType, GgmlDType),
}

fn shapes() -> Vec<Shape> {
    let mut qwen = tiny_config("qwen2");
    (
        qwen.vocab_size,
        qwen.hidden_size,
        qwen.intermediate_size,
        qwen.num_layers,
    ) = (151_936, 896, 4864, 24);
    (qwen.num_heads, qwen.num_kv_heads, qwen.head_dim) = (14, 2, 64);
    qwen.attn_scale = 0.125;
    qwen.rope_theta = 1e6;
    qwen.rope_style = RopeStyle::Half;
    qwen.sliding_layers = vec![false; 24];
    qwen.max_position_embeddings = 32_768;
    let mut smol = tiny_config("llama");
    (
        smol.vocab_size,
        smol.hidden_size,
        smol.intermediate_size,
        smol.num_layers,
    ) = (49_152, 576, 1536, 30);
    (smol.num_heads, smol.num_kv_heads, smol.head_dim) = (9, 3, 64);
    smol.attn_scale = 0.125;
    smol.rope_theta = 1e5;
    smol.rope_style = RopeStyle::Interleaved;
    smol.sliding_layers = vec![false; 30];
    smol.max_position_embeddings = 8192;
    vec![
        Shape {
            name: "Qwen2.5-0.5B shape (Q4_K, Q6_K down, Q8_0 embedding/head)",
            cfg: qwen,
            formats: (GgmlDType::Q4K, GgmlDType::Q6K, GgmlDType::Q8_0),
        },
        Shape {
            name: "SmolLM2-135M shape (Q4_1, Q8_0 embedding, tied)",
            cfg: smol,
            formats: (GgmlDType::Q4_1, GgmlDType::Q4_1, GgmlDType::Q8_0),
        },
    ]
}

fn model(s: &Shape) -> StoredModel {
    let c = &s.cfg;
    let (d, kv, inter) = (c.hidden_size, c.num_kv_heads * c.head_dim, c.intermediate_size);
    let (main, down, emb) = s.formats;
    let lin = |rows, cols, q, seed, bias: bool| StoredLinear {
        weight: matrix(rows, cols, q, seed),
        bias: bias.then(|| vec![0.01; rows]),
    };
    // one layer's matrices, shared by every layer (each is uploaded on its own)
    let layer = kvgate_model::StoredLayer {
        attn_norm: vec![1.0; d],
        q: lin(c.num_heads * c.head_dim, d, main, 1, c.qkv_bias),
        k: lin(kv, d, main, 2, c.qkv_bias),
        v: lin(kv, d, main, 3, c.qkv_bias),
        o: lin(d, c.num_heads * c.head_dim, main, 4, false),
        q_norm: None,
        k_norm: None,
        post_attn_norm: None,
        ffn_norm: vec![1.0; d],
        post_ffn_norm: None,
        gate: lin(inter, d, main, 5, false),
        up: lin(inter, d, main, 6, false),
        down: lin(d, inter, down, 7, false),
    };
    let tied = s.name.contains("tied");
    StoredModel {
        config: c.clone(),
        weights: StoredWeights {
            embed: matrix(c.vocab_size, d, emb, 8),
            layers: vec![layer; c.num_layers],
            final_norm: vec![1.0; d],
            lm_head: (!tied).then(|| lin(c.vocab_size, d, emb, 9, false)),
        },
        max_positions: 16_384,
    }
}

/// Rows `from..to` of sequence `seq` (its table `table`), the last one asking for `want`.
fn chunk(seq_table: &[u32], from: usize, to: usize, want: Option<Want>) -> Batch {
    let mut b = Batch {
        tables: vec![seq_table[..to.div_ceil(BS)].to_vec()],
        ..Batch::default()
    };
    for p in from..to {
        b.tokens.push((p * 7919 % 30_000) as u32 + 10);
        b.positions.push(p as u32);
        b.slots.push(seq_table[p / BS] as usize * BS + p % BS);
        b.seq_of_row.push(0);
    }
    if let Some(w) = want {
        b.outputs.push(Output {
            row: to - from - 1,
            want: w,
        });
    }
    b
}

/// Prefills `len` tokens of one sequence from block `first` in chunks of 2048; seconds.
fn prefill(be: &mut dyn Backend, first: u32, len: usize) -> f64 {
    let table: Vec<u32> = (first..first + len.div_ceil(BS) as u32 + 4).collect();
    let t = Instant::now();
    for from in (0..len).step_by(2048) {
        let to = (from + 2048).min(len);
        let want = (to == len).then_some(Want::Logits);
        be.forward(&chunk(&table, from, to, want)).unwrap();
    }
    t.elapsed().as_secs_f64()
}

/// Decode tok/s of `streams` sequences of 256 tokens each, 16 steps.
fn decode(be: &mut dyn Backend, streams: usize) -> f64 {
    let per = (256 + 32) / BS;
    let tables: Vec<Vec<u32>> = (0..streams)
        .map(|s| (0..per as u32).map(|i| (s * per) as u32 + i).collect())
        .collect();
    for t in &tables {
        be.forward(&chunk(t, 0, 256, None)).unwrap();
    }
    let t0 = Instant::now();
    for step in 0..16 {
        let pos: usize = 256 + step;
        let mut b = Batch {
            tables: tables.iter().map(|t| t[..(pos + 1).div_ceil(BS)].to_vec()).collect(),
            ..Batch::default()
        };
        for (s, t) in tables.iter().enumerate() {
            b.tokens.push(100 + s as u32);
            b.positions.push(pos as u32);
            b.slots.push(t[pos / BS] as usize * BS + pos % BS);
            b.seq_of_row.push(s as u32);
            b.outputs.push(Output {
                row: s,
                want: Want::Logits,
            });
        }
        be.forward(&b).unwrap();
    }
    (streams * 16) as f64 / t0.elapsed().as_secs_f64()
}

/// Where a decode step's time goes on the Qwen2.5-0.5B shape: the launch floor (a one-element kernel),
/// each matmul shape at 1 and 8 rows, and one row's attention over 4k and 12k bf16 positions (split-K),
/// each in µs and as read bandwidth against the copy's.
fn kernel_breakdown(gpu: &Gpu, copy_gbs: f64, report: &mut String) {
    use kvgate_cuda::{Attention, DevMatrix, Dims, QueryRow, WeightFormat};
    use kvgate_kv::KvQuant;
    report.push_str("| kernel (Qwen2.5-0.5B shape) | time | read rate |\n|---|---|---|\n");
    let mut one = gpu.zeros_f32(1).unwrap();
    let ms = gpu
        .time_ms(200, || gpu.add(&mut one, &gpu.zeros_f32(1).unwrap(), 1))
        .unwrap();
    report.push_str(&format!(
        "| launch floor (one-element add, with its 1-float alloc) | {:.1} µs | |\n",
        ms * 1e3
    ));
    let shapes = [
        ("q (896×896 Q4_K)", 896, 896, WeightFormat::Q4K),
        ("k/v (128×896 Q4_K)", 128, 896, WeightFormat::Q4K),
        ("gate/up (4864×896 Q4_K)", 4864, 896, WeightFormat::Q4K),
        ("down (896×4864 Q6_K)", 896, 4864, WeightFormat::Q6K),
        ("head (151936×896 Q8_0)", 151_936, 896, WeightFormat::Q8_0),
    ];
    for (name, rows, cols, wf) in shapes {
        let StoredTensor::Gguf(q) = matrix(rows, cols, wf.gguf(), 3) else {
            unreachable!()
        };
        let m = DevMatrix::upload(gpu, wf, rows, cols, q.data(), None).unwrap();
        for n in [1usize, 8] {
            let x = gpu.upload(&vec![0.01f32; n * cols]).unwrap();
            let mut y = gpu.zeros_f32(n * rows).unwrap();
            let ms = gpu.time_ms(20, || gpu.matmul(&mut y, &x, &m, n)).unwrap();
            let gbs = m.bytes() as f64 / (ms / 1e3) / 1e9;
            report.push_str(&format!(
                "| matmul {name}, {n} row(s) | {:.1} µs | {gbs:.0} GB/s ({:.0}% of copy) |\n",
                ms * 1e3,
                100.0 * gbs / copy_gbs
            ));
        }
    }
    let d = Dims {
        num_kv_heads: 2,
        num_heads: 14,
        head_dim: 64,
        block_size: BS,
    };
    for ctx in [4096usize, 12_288] {
        let blocks = ctx / BS;
        let bytes = blocks * 2 * BS * 64 * 2; // bf16 K of one layer
        let (k, v) = (gpu.zeros(bytes).unwrap(), gpu.zeros(bytes).unwrap());
        let table: Vec<i32> = (0..blocks as i32).collect();
        let rows = [QueryRow {
            seq: 0,
            first: 0,
            end: ctx,
        }];
        let t = gpu.upload_rows(&table, blocks, &rows, BS).unwrap();
        let q = gpu.upload(&vec![0.1f32; 14 * 64]).unwrap();
        let mut out = gpu.zeros_f32(14 * 64).unwrap();
        let a = Attention {
            dtype: KvDtype::BF16,
            quant: KvQuant::PLAIN,
            d,
            scale: 0.125,
            k_scale: 1.0,
            v_scale: 1.0,
            softcap: None,
        };
        let ms = gpu
            .time_ms(20, || gpu.attention(&a, None, &mut out, &q, &k, &v, &t))
            .unwrap();
        let gbs = 2.0 * bytes as f64 / (ms / 1e3) / 1e9;
        report.push_str(&format!(
            "| attention, 1 row over {ctx} bf16 positions (one layer, split-K) | {:.1} µs | {gbs:.0} GB/s ({:.0}% of copy) |\n",
            ms * 1e3,
            100.0 * gbs / copy_gbs
        ));
    }
    report.push('\n');
}

#[test]
fn bench_report() {
    if std::env::var_os("KVGATE_EMULATED").is_some() {
        return; // timings of the emulated device mean nothing
    }
    let gpu = match Gpu::new(0) {
        Ok(g) => g,
        Err(e) => {
            assert!(
                std::env::var("KVGATE_REQUIRE_GPU").as_deref() != Ok("1"),
                "KVGATE_REQUIRE_GPU=1 but no usable GPU: {e}"
            );
            eprintln!("skipped: no CUDA device ({e})");
            return;
        }
    };
    let src = gpu.zeros(1 << 30).unwrap();
    let mut dst = gpu.zeros(1 << 30).unwrap();
    let ms = gpu.time_ms(5, || gpu.copy(&src, &mut dst)).unwrap();
    let copy_gbs = 2.0 * (1u64 << 30) as f64 / (ms / 1e3) / 1e9;
    drop((src, dst));
    let mut report = format!(
        "# CUDA backend benchmark ({})\n\ndevice copy bandwidth: {copy_gbs:.0} GB/s (1 GiB device-to-device, read + write)\n\n",
        gpu.name()
    );
    kernel_breakdown(&gpu, copy_gbs, &mut report);
    drop(gpu);
    report.push_str("| model shape | measure | result |\n|---|---|---|\n");
    for s in shapes() {
        let m = model(&s);
        let shape = m.config.cache_shape(BS, KvDtype::BF16).unwrap();
        let t = Instant::now();
        let mut be = CudaBackend::open(m, shape, KvMemory::Bytes(16 << 30), CudaSettings::default()).unwrap();
        let (wbytes, widened) = be.weight_bytes();
        let mut row = |what: &str, v: String| {
            eprintln!("{}: {what}: {v}", s.name);
            report.push_str(&format!("| {} | {what} | {v} |\n", s.name));
        };
        row(
            "open (upload, NVRTC)",
            format!(
                "{:.2} s, {:.0} MiB of weights, {widened} widened",
                t.elapsed().as_secs_f64(),
                wbytes as f64 / (1 << 20) as f64
            ),
        );
        for len in [4096usize, 12_288] {
            let secs = prefill(&mut be, 0, len);
            row(
                &format!("prefill {len} tokens"),
                format!("{:.0} tok/s ({secs:.2} s)", len as f64 / secs),
            );
        }
        // a decision on the warm 12k state: 40 new rows after it, log-probs of 4 ids on the last
        let table: Vec<u32> = (0..(12_288 + 64) as u32 / BS as u32).collect();
        let mut lat = Vec::new();
        for _ in 0..3 {
            let t = Instant::now();
            be.forward(&chunk(
                &table,
                12_288,
                12_328,
                Some(Want::Logprobs(vec![11, 12, 13, 14])),
            ))
            .unwrap();
            lat.push(t.elapsed().as_secs_f64() * 1e3);
        }
        row(
            "decision on a warm 12k state (40 rows)",
            format!(
                "{:.1} ms (best of 3; {:?})",
                lat.iter().cloned().fold(f64::MAX, f64::min),
                lat.iter().map(|x| format!("{x:.1}")).collect::<Vec<_>>()
            ),
        );
        for streams in [1usize, 32, 256] {
            let tps = decode(&mut be, streams);
            let note = if streams == 1 {
                format!(
                    ", weights read at {:.0} GB/s ({:.0}% of copy)",
                    tps * wbytes as f64 / 1e9,
                    100.0 * tps * wbytes as f64 / 1e9 / copy_gbs
                )
            } else {
                String::new()
            };
            row(
                &format!("decode, {streams} streams (256-token contexts)"),
                format!("{tps:.0} tok/s{note}"),
            );
        }
    }
    eprintln!("{report}");
    if let Ok(p) = std::env::var("KVGATE_BENCH_REPORT") {
        std::fs::write(p, &report).unwrap();
    }
}
