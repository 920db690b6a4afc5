//! Micro-benchmarks of the CPU kernels: the packed Q4_1 / Q8_0 matmul at several batch sizes (GFLOP/s)
//! and paged attention over each cache dtype (GB/s of K/V read). `cargo bench --bench kernels`.
//!
//! On a host with AVX-512 the tables are printed twice: once on the AVX-512 path (the host's default),
//! then on the AVX2 path (the bench runs itself again with `KVGATE_NO_AVX512=1`), so a kernel change is
//! never judged on one ISA only. `KVGATE_NO_AVX512=1` runs the AVX2 tables alone.

use std::time::Instant;

use candle_core::quantized::GgmlDType;
use kvgate_cpu::QMatrix;
use kvgate_kv::{AttentionBackend, AttnParams, AttnQuery, AttnRow, CacheShape, CpuAttention, KvCache, KvDtype};

fn q4_1_data(n: usize, k: usize) -> Vec<u8> {
    let mut s = 12345u32;
    let mut out = vec![];
    for _ in 0..n * k / 32 {
        s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        out.extend(half::f16::from_f32(0.01 + (s >> 20) as f32 / 1e5).to_le_bytes());
        out.extend(half::f16::from_f32(-0.05).to_le_bytes());
        for _ in 0..16 {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            out.push((s >> 24) as u8);
        }
    }
    out
}

/// `blocks` random K-quant super-blocks (Q4_K: f16 `d`, `dmin` first; Q6_K: f16 `d` last) with small
/// finite scales and random quants and sub-block scales.
fn k_quant_data(dtype: GgmlDType, blocks: usize, bytes: usize) -> Vec<u8> {
    let mut s = 777u32;
    let mut out = Vec::with_capacity(blocks * bytes);
    for _ in 0..blocks {
        let mut b: Vec<u8> = (0..bytes)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (s >> 24) as u8
            })
            .collect();
        let d = half::f16::from_f32(0.001 + (s >> 22) as f32 * 1e-6).to_le_bytes();
        if dtype == GgmlDType::Q6K {
            b[bytes - 2..].copy_from_slice(&d);
        } else {
            b[..2].copy_from_slice(&d);
            b[2..4].copy_from_slice(&d);
        }
        out.extend(b);
    }
    out
}

fn time<F: FnMut()>(mut f: F, min_secs: f64) -> f64 {
    f();
    let t0 = Instant::now();
    let mut n = 0;
    while t0.elapsed().as_secs_f64() < min_secs {
        f();
        n += 1;
    }
    t0.elapsed().as_secs_f64() / n as f64
}

fn main() {
    // The timing loops run inside the pool, as the engine's forward pass does: a call from outside
    // would also time waking a pool thread (tens of microseconds here), not the kernel.
    let threads = std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let avx512 = std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512vl");
    let forced = std::env::var_os("KVGATE_NO_AVX512").is_some();
    let isa = if avx512 && !forced { "AVX-512" } else { "AVX2" };
    println!("\n## {isa} path ({threads} threads)\n");
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
    pool.install(run);
    if avx512 && !forced {
        // the same tables on the AVX2 path: the bench again, in a child that turns AVX-512 off
        let me = std::env::current_exe().expect("the bench's own path");
        let status = std::process::Command::new(me)
            .args(std::env::args_os().skip(1))
            .env("KVGATE_NO_AVX512", "1")
            .status()
            .expect("the bench runs again");
        assert!(status.success(), "the AVX2 run failed");
    }
}

/// One table row per batch size: time and GFLOP/s of `w.matmul` over that many activation rows (with
/// `int8`, every row through the 8-bit-activation kernel (completions' default), quantization included).
fn matmul_rows(name: &str, w: &QMatrix, batch: &[usize], int8: bool) {
    if !selected(name) {
        return;
    }
    let (n, k) = (w.rows(), w.cols());
    let name = if int8 {
        format!("{name} int8-act")
    } else {
        name.to_string()
    };
    for &rows in batch {
        let x: Vec<f32> = (0..rows * k).map(|i| ((i % 97) as f32 - 48.0) / 50.0).collect();
        let mask = vec![int8; rows];
        let t = time(
            || {
                std::hint::black_box(w.matmul_rows(&x, rows, &mask));
            },
            0.5,
        );
        let gf = 2.0 * (n * k * rows) as f64 / t / 1e9;
        println!("| {name} matmul | {n}x{k} | {rows} | {:.1} us | {gf:.1} |", t * 1e6);
    }
}

/// `KERNELS=word`: only the tables whose name contains it.
fn selected(name: &str) -> bool {
    std::env::var("KERNELS").map_or(true, |f| name.contains(f.as_str()))
}

/// A Q8_0 matrix: the bytes of a q4_1 matrix twice over reinterpreted as 34-byte blocks.
fn q8_0(n: usize, k: usize) -> QMatrix {
    let mut data = q4_1_data(2 * n, k);
    data.truncate(n * k / 32 * 34);
    for b in data.chunks_exact_mut(34) {
        b[..2].copy_from_slice(&half::f16::from_f32(0.002).to_le_bytes());
    }
    QMatrix::from_q8_0(&data, n, k)
}

fn run() {
    println!("| kernel | shape | rows | time | GFLOP/s |\n|---|---|---|---|---|");
    for (n, k) in [(256usize, 512usize), (1536usize, 576usize), (576, 1536), (4864, 896)] {
        let w = QMatrix::from_q4_1(&q4_1_data(n, k), n, k);
        matmul_rows("q4_1", &w, &[1, 4, 16, 64, 512], false);
        matmul_rows("q4_1", &w, &[1, 4, 16, 64, 512], true);
    }
    // Q8_0 (SmolLM2's tied output, Qwen's Q5_0 layers once widened).
    if selected("q8_0") {
        let w = q8_0(4864, 896);
        matmul_rows("q8_0", &w, &[1, 4, 16, 512], false);
        matmul_rows("q8_0", &w, &[1, 4, 16, 512], true);
    }
    // Qwen2.5-0.5B's output matrix (146 MB: streamed from memory, not cache).
    if selected("q8_0 output") {
        let w = q8_0(151_936, 896);
        matmul_rows("q8_0 output", &w, &[1, 8], false);
        matmul_rows("q8_0 output", &w, &[1, 8], true);
    }
    // K-quants (Q4_K_M's ffn_down on Qwen2.5, most matrices of a Llama-family Q4_K_M): 40–56 MB
    // matrices, which stream from memory on a 32 MiB L3 but sit in a 260 MiB one.
    // `KERNELS_DRAM=1`: 16× the columns (0.64 / 0.89 GB, past any L3), so every row count streams the
    // weights from memory as a decode step of a 1.5B+ model does; rows 1 to 16 in both modes.
    let dram = std::env::var_os("KERNELS_DRAM").is_some();
    for (name, dtype, bytes) in [("q4_k", GgmlDType::Q4K, 144), ("q6_k", GgmlDType::Q6K, 210)] {
        if selected(name) {
            let (n, k) = (if dram { 16 * 65_536 } else { 65_536 }, 1024);
            let w = QMatrix::from_ggml(dtype, &k_quant_data(dtype, n * k / 256, bytes), n, k, false).unwrap();
            println!(
                "| {name} records | {n}x{k} | | {:.1} MB | {:.2} bits/weight |",
                w.bytes() as f64 / 1e6,
                w.bytes() as f64 * 8.0 / (n * k) as f64
            );
            let (exact, int): (&[usize], &[usize]) = if dram {
                (&[1, 2, 4, 8, 16], &[1, 2, 4, 8, 16])
            } else {
                (&[1, 8, 512], &[1, 2, 4, 8, 512])
            };
            matmul_rows(name, &w, exact, false);
            matmul_rows(name, &w, int, true);
        }
    }
    // 16-bit float weights (a bf16 safetensors checkpoint) through the same kernel.
    let (n, k) = (1536usize, 576usize);
    let bits: Vec<u16> = (0..n * k)
        .map(|i| half::bf16::from_f32(((i % 89) as f32 - 44.0) / 300.0).to_bits())
        .collect();
    let w = QMatrix::from_halves(kvgate_cpu::QKind::Bf16, &bits, n, k).unwrap();
    matmul_rows("bf16", &w, &[1, 16, 512], false);
    // KERNELS=prefill: this table alone
    if selected("prefill attention") {
        prefill_attention();
    }
    if selected("attention, one stream") {
        one_stream_attention();
    }
    if !selected("attention (16 decode rows") {
        return;
    }
    println!("\n| attention (16 decode rows, 9 q / 3 kv heads, head_dim 64) | context | K/V elements/s | GB/s of K/V read |\n|---|---|---|---|");
    for dtype in KvDtype::ALL {
        let shape = CacheShape::new(1, 3, 64, 16, dtype).unwrap();
        let ctx = 4096;
        let mut cache = KvCache::new(shape, ctx / 16);
        let kv: Vec<f32> = (0..3 * 64).map(|i| ((i % 13) as f32 - 6.0) / 6.0).collect();
        for t in 0..ctx {
            cache.write(0, &[t], &kv, &kv);
        }
        let table: Vec<u32> = (0..(ctx / 16) as u32).collect();
        // Sixteen sequences (their own table each, here with the same blocks): decode rows are not tiled.
        let tables = [table.as_slice(); 16];
        let rows: Vec<AttnRow> = (0..16)
            .map(|i| AttnRow {
                table: i,
                pos: (ctx - 1) as u32,
            })
            .collect();
        let q: Vec<f32> = (0..16 * 9 * 64).map(|i| ((i % 11) as f32 - 5.0) / 5.0).collect();
        let mut out = vec![0f32; q.len()];
        let p = AttnParams {
            num_heads: 9,
            num_kv_heads: 3,
            head_dim: 64,
            scale: 0.125,
            window: None,
            softcap: None,
        };
        let t = time(
            || {
                CpuAttention.attend(
                    &cache,
                    0,
                    &AttnQuery {
                        q: &q,
                        rows: &rows,
                        tables: &tables,
                        masks: &[],
                    },
                    &p,
                    &mut out,
                )
            },
            0.5,
        );
        let vectors = 16.0 * ctx as f64 * 3.0 * 2.0;
        let bytes = vectors * dtype.bytes_per_vector(64) as f64;
        println!(
            "| {dtype} | {ctx} | {:.2} G | {:.2} |",
            vectors * 64.0 / t / 1e9,
            bytes / t / 1e9
        );
    }
}

/// One decode row of one long sequence (Qwen2.5-0.5B's attention shape: 14 q / 2 kv heads, its 24
/// layers, each layer's K/V its own, so that the whole step's K/V — 302 MB at 12k in f32 — streams from
/// memory as in the model rather than sitting in the last-level cache): the step a single long stream
/// runs, where every core must share one sequence's K/V. Per layer: the step's time / 24.
fn one_stream_attention() {
    println!("\n| attention, one stream (1 decode row, 14 q / 2 kv heads, head_dim 64, 24 layers) | context | time per layer | GB/s of K/V read |\n|---|---|---|---|");
    // ONE_STREAM_DTYPES=float32,int8: those dtypes alone
    let only = std::env::var("ONE_STREAM_DTYPES").ok();
    let dtypes = [KvDtype::F32, KvDtype::BF16, KvDtype::Int8, KvDtype::Fp8E4m3];
    for dtype in dtypes
        .into_iter()
        .filter(|d| only.as_deref().is_none_or(|o| o.split(',').any(|x| x == d.to_string())))
    {
        for ctx in [4096usize, 12288] {
            const LAYERS: usize = 24;
            let shape = CacheShape::new(LAYERS, 2, 64, 16, dtype).unwrap();
            let mut cache = KvCache::new(shape, ctx / 16);
            let kv: Vec<f32> = (0..2 * 64).map(|i| ((i % 13) as f32 - 6.0) / 6.0).collect();
            for layer in 0..LAYERS {
                for t in 0..ctx {
                    cache.write(layer, &[t], &kv, &kv);
                }
            }
            let table: Vec<u32> = (0..(ctx / 16) as u32).collect();
            let tables = [table.as_slice()];
            let rows = [AttnRow {
                table: 0,
                pos: (ctx - 1) as u32,
            }];
            let q: Vec<f32> = (0..14 * 64).map(|i| ((i % 11) as f32 - 5.0) / 5.0).collect();
            let mut out = vec![0f32; q.len()];
            let p = AttnParams {
                num_heads: 14,
                num_kv_heads: 2,
                head_dim: 64,
                scale: 0.125,
                window: None,
                softcap: None,
            };
            let query = AttnQuery {
                q: &q,
                rows: &rows,
                tables: &tables,
                masks: &[],
            };
            let step = || {
                for layer in 0..LAYERS {
                    CpuAttention.attend(&cache, layer, &query, &p, &mut out);
                }
            };
            let t = time(step, 1.0) / LAYERS as f64;
            let bytes = ctx as f64 * 2.0 * 2.0 * dtype.bytes_per_vector(64) as f64;
            println!("| {dtype} | {ctx} | {:.1} µs | {:.2} |", t * 1e6, bytes / t / 1e9);
        }
    }
}

/// A 512-row prefill chunk at positions 2,048..2,559 of one sequence (Qwen2.5-0.5B's attention shape:
/// 14 query / 2 KV heads, head_dim 64, f32 cache): the rows in one call (tiled: each K/V block read once
/// per 16 rows) against one call per row (untiled; the same bits).
fn prefill_attention() {
    println!("\n| prefill attention (512 rows at 2048..2559, 14 q / 2 kv heads, head_dim 64, f32) | time | GFLOP/s |\n|---|---|---|");
    let (nh, nkv, hd, ctx) = (14usize, 2usize, 64usize, 2560usize);
    let shape = CacheShape::new(1, nkv, hd, 16, KvDtype::F32).unwrap();
    let mut cache = KvCache::new(shape, ctx / 16);
    for t in 0..ctx {
        let kv: Vec<f32> = (0..nkv * hd).map(|i| (((i + t) % 13) as f32 - 6.0) / 6.0).collect();
        cache.write(0, &[t], &kv, &kv);
    }
    let table: Vec<u32> = (0..(ctx / 16) as u32).collect();
    let tables = [table.as_slice()];
    let rows: Vec<AttnRow> = (2048..ctx as u32).map(|pos| AttnRow { table: 0, pos }).collect();
    let row_len = nh * hd;
    let q: Vec<f32> = (0..rows.len() * row_len)
        .map(|i| ((i % 11) as f32 - 5.0) / 50.0)
        .collect();
    let mut out = vec![0f32; q.len()];
    let p = AttnParams {
        num_heads: nh,
        num_kv_heads: nkv,
        head_dim: hd,
        scale: 0.125,
        window: None,
        softcap: None,
    };
    // q·k and p·v: 2 · 2 flops per (row, head, position, element).
    let flops: f64 = rows.iter().map(|r| 4.0 * (r.pos as f64 + 1.0) * (nh * hd) as f64).sum();
    let tiled = time(
        || {
            let query = AttnQuery {
                q: &q,
                rows: &rows,
                tables: &tables,
                masks: &[],
            };
            CpuAttention.attend(&cache, 0, &query, &p, &mut out)
        },
        1.0,
    );
    let per_row = time(
        || {
            for (r, row) in rows.iter().enumerate() {
                let one = [*row];
                let query = AttnQuery {
                    q: &q[r * row_len..(r + 1) * row_len],
                    rows: &one,
                    tables: &tables,
                    masks: &[],
                };
                CpuAttention.attend(&cache, 0, &query, &p, &mut out[r * row_len..(r + 1) * row_len])
            }
        },
        1.0,
    );
    for (name, t) in [
        ("tiled (16 rows per K/V read)", tiled),
        ("one row per call (untiled)", per_row),
    ] {
        println!("| {name} | {:.1} ms | {:.1} |", t * 1e3, flops / t / 1e9);
    }
}
