//! GPU checks (run on a machine with an NVIDIA GPU; elsewhere they print SKIP, and with
//! `KVGATE_REQUIRE_GPU=1` a missing GPU is a failure):
//! - the CUDA quantize-on-store kernels write the same bytes as the CPU codecs, for bf16, fp8 e4m3,
//!   fp8 e5m2 and nvfp4, with every quantization method (rotation, fine scales, offsets and their
//!   combinations), on every
//!   boundary case (ties, saturation, subnormals, ±0, NaN, ±inf);
//! - the CUDA paged attention matches the CPU paged attention over the same blocks and block tables,
//!   for every dtype and method;
//! - a bandwidth report: each kernel's GB/s against the device's measured copy bandwidth
//!   (`KVGATE_GPU_REPORT=path` also writes it to a file).
//!
//! Without a GPU, `the_kernels_run_on_an_emulated_device` runs the two correctness checks in a child
//! process on the emulated device of `tests/host` (its libcuda.so.1 and libnvrtc.so.13).

mod host;

use kvgate_cuda::{CudaError, Dims, Gpu, QueryRow};
use kvgate_kv::Which;
use kvgate_kv::{
    AttentionBackend, AttnParams, AttnQuery, AttnRow, CacheShape, CpuAttention, KvCache, KvDtype, KvQuant, RowMask,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const DTYPES: [KvDtype; 4] = [KvDtype::BF16, KvDtype::Fp8E4m3, KvDtype::Fp8E5m2, KvDtype::Nvfp4];

/// Every (dtype, method) pair the kernels take: bf16 plain only, the quantized dtypes with all four.
fn cases() -> Vec<(KvDtype, KvQuant)> {
    DTYPES
        .iter()
        .flat_map(|&d| KvQuant::methods_for(d).iter().map(move |&m| (d, m)))
        .collect()
}

fn gpu() -> Option<Gpu> {
    match Gpu::new(0) {
        Ok(g) => Some(g),
        Err(e) => {
            let required = std::env::var("KVGATE_REQUIRE_GPU").as_deref() == Ok("1");
            assert!(!required, "KVGATE_REQUIRE_GPU=1 but no usable GPU: {e}");
            eprintln!("SKIP: {e}");
            None
        }
    }
}

/// Inputs that hit every codec boundary, then random values at many scales.
fn boundary_inputs(n: usize, seed: u64) -> Vec<f32> {
    let mut v = vec![
        0.0,
        -0.0,
        f32::NAN,
        -f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        448.0,
        449.0,
        464.0,
        480.0,
        1e9,
        57344.0,
        61440.0,
        1e-30,
    ];
    for c in 0..=255u8 {
        let a = kvgate_kv::codec::e4m3_to_f32(c);
        let b = kvgate_kv::codec::e4m3_to_f32(c.wrapping_add(1));
        if a.is_finite() {
            v.push(a);
            if b.is_finite() && c & 0x7F < 0x7E {
                let mid = (a + b) / 2.0;
                v.extend([
                    mid,
                    f32::from_bits(mid.to_bits() + 1),
                    f32::from_bits(mid.to_bits().saturating_sub(1)),
                ]);
            }
        }
        let e = kvgate_kv::codec::e5m2_to_f32(c);
        if e.is_finite() {
            v.push(e);
        }
    }
    for m in [0.25f32, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 7.0] {
        v.extend([m, -m, f32::from_bits(m.to_bits() + 1), f32::from_bits(m.to_bits() - 1)]);
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    while v.len() < n {
        let scale = 10f32.powi(rng.random_range(-4..3));
        v.push(rng.random_range(-1.0f32..1.0) * scale);
    }
    v.truncate(n);
    v
}

#[test]
fn store_kernels_match_the_cpu_codecs_byte_for_byte() {
    let Some(g) = gpu() else { return };
    eprintln!("device: {}", g.name());
    let (nkv, hd, bs, blocks) = (2usize, 64usize, 16usize, 12usize);
    let tokens = blocks * bs;
    for (dtype, quant) in cases() {
        for scale in [1.0f32, 0.37, 4.0] {
            let shape = CacheShape::new(1, nkv, hd, bs, dtype)
                .unwrap()
                .with_quant(quant)
                .unwrap();
            let x = boundary_inputs(tokens * nkv * hd, 7);
            // scattered slots: token t goes to block (t·5) mod blocks
            let slots: Vec<usize> = (0..tokens).map(|t| ((t / bs) * 5 % blocks) * bs + t % bs).collect();
            let mut cpu = KvCache::new(shape, blocks);
            cpu.set_scales(0, scale, scale).unwrap();
            // smooth methods: arbitrary offsets, the same on both sides
            let offsets: Vec<f32> = (0..nkv * hd).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
            if quant.smooth {
                cpu.set_offsets(0, offsets.clone(), offsets.clone()).unwrap();
            }
            cpu.write(0, &slots, &x, &x);
            let want = cpu.layer(0).raw(Which::K).as_bytes().to_vec();
            let dx = g.upload(&x).unwrap();
            let ds = g.upload_slots(&slots).unwrap();
            let mut dc = g.zeros(want.len()).unwrap();
            let dims = Dims {
                num_kv_heads: nkv,
                num_heads: nkv,
                head_dim: hd,
                block_size: bs,
            };
            let doff = g.upload(&offsets).unwrap();
            let doff = quant.smooth.then_some(&doff);
            g.store(dtype, quant, &dx, &ds, &mut dc, dims, scale, doff).unwrap();
            let got = g.download(&dc).unwrap();
            let m = quant.name();
            if let Some(i) = (0..want.len()).find(|&i| want[i] != got[i]) {
                panic!(
                    "{dtype} {m} scale {scale}: byte {i} differs: CPU {:#04x}, GPU {:#04x}",
                    want[i], got[i]
                );
            }
            eprintln!("{dtype} {m} scale {scale}: {} bytes identical", want.len());
        }
    }
}

#[test]
fn paged_attention_matches_the_cpu() {
    let Some(g) = gpu() else { return };
    let (nkv, nh, bs, blocks) = (2usize, 6usize, 16usize, 256usize);
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    // head_dim 96: a lane's elements straddle two nvfp4 groups.
    for ((dtype, quant), hd) in cases().into_iter().flat_map(|c| [64usize, 96, 128].map(|h| (c, h))) {
        let shape = CacheShape::new(1, nkv, hd, bs, dtype)
            .unwrap()
            .with_quant(quant)
            .unwrap();
        let mut cpu = KvCache::new(shape, blocks);
        cpu.set_scales(0, 0.05, 0.02).unwrap();
        let k_off: Vec<f32> = (0..nkv * hd).map(|i| ((i * 13 % 17) as f32 - 8.0) / 4.0).collect();
        let v_off: Vec<f32> = (0..nkv * hd).map(|i| ((i * 7 % 11) as f32 - 5.0) / 5.0).collect();
        if quant.smooth {
            cpu.set_offsets(0, k_off, v_off.clone()).unwrap();
        }
        // six sequences with scattered, disjoint block tables; the longest is read split-K (3 CTAs
        // per head, merged after)
        let lens = [1usize, 17, 250, 333, 511, 1300];
        let mut perm: Vec<u32> = (0..blocks as u32).collect();
        for i in (1..perm.len()).rev() {
            perm.swap(i, rng.random_range(0..=i));
        }
        let mut tables = vec![];
        let mut next = 0;
        for &l in &lens {
            let nb = l.div_ceil(bs);
            tables.push(perm[next..next + nb].to_vec());
            next += nb;
        }
        for (s, &l) in lens.iter().enumerate() {
            for t in 0..l {
                let k: Vec<f32> = (0..nkv * hd).map(|_| rng.random_range(-4.0f32..4.0)).collect();
                let v: Vec<f32> = (0..nkv * hd).map(|_| rng.random_range(-2.0f32..2.0)).collect();
                cpu.write(0, &[tables[s][t / bs] as usize * bs + t % bs], &k, &v);
            }
        }
        let q: Vec<f32> = (0..lens.len() * nh * hd)
            .map(|_| rng.random_range(-1.0f32..1.0))
            .collect();
        let rows: Vec<AttnRow> = lens
            .iter()
            .enumerate()
            .map(|(s, &l)| AttnRow {
                table: s as u32,
                pos: (l - 1) as u32,
            })
            .collect();
        let trefs: Vec<&[u32]> = tables.iter().map(|t| t.as_slice()).collect();
        let p = AttnParams {
            num_heads: nh,
            num_kv_heads: nkv,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
            window: None,
            softcap: None,
        };
        let mut want = vec![0f32; q.len()];
        CpuAttention.attend(
            &cpu,
            0,
            &AttnQuery {
                q: &q,
                rows: &rows,
                tables: &trefs,
                masks: &[],
            },
            &p,
            &mut want,
        );
        let max_blocks = tables.iter().map(Vec::len).max().unwrap();
        let flat: Vec<i32> = tables
            .iter()
            .flat_map(|t| (0..max_blocks).map(move |i| t.get(i).map_or(0, |&b| b as i32)))
            .collect();
        let dk = g.upload(cpu.layer(0).raw(Which::K).as_bytes()).unwrap();
        let dv = g.upload(cpu.layer(0).raw(Which::V).as_bytes()).unwrap();
        let dq = g.upload(&q).unwrap();
        let dt = g.upload_tables(&flat, max_blocks, &lens, bs).unwrap();
        let mut dout = g.upload(&vec![0f32; q.len()]).unwrap();
        let dims = Dims {
            num_kv_heads: nkv,
            num_heads: nh,
            head_dim: hd,
            block_size: bs,
        };
        let (ks, vs) = (cpu.layer(0).k_scale, cpu.layer(0).v_scale);
        let dvo = g.upload(&v_off).unwrap();
        let dvo = quant.smooth.then_some(&dvo);
        g.paged_attention(dtype, quant, dvo, &mut dout, &dq, &dk, &dv, &dt, dims, p.scale, ks, vs)
            .unwrap();
        let got = g.download(&dout).unwrap();
        let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        let m = quant.name();
        eprintln!("{dtype} {m} head_dim {hd}: max |GPU − CPU| = {worst:.2e}");
        assert!(
            worst < 2e-4,
            "{dtype} {m} head_dim {hd}: paged attention differs from the CPU by {worst}"
        );
        // the same rows as tree rows: each sees the first half of its sequence and a random half of
        // the rest (its own position always), split-K included
        let masks: Vec<Option<RowMask>> = lens
            .iter()
            .map(|&l| {
                let base = l / 2;
                let mut seen = vec![0u64; (l - base).div_ceil(64)];
                for i in 0..l - base {
                    if i + 1 == l - base || rng.random_bool(0.5) {
                        seen[i / 64] |= 1 << (i % 64);
                    }
                }
                Some(RowMask {
                    base: base as u32,
                    seen,
                })
            })
            .collect();
        CpuAttention.attend(
            &cpu,
            0,
            &AttnQuery {
                q: &q,
                rows: &rows,
                tables: &trefs,
                masks: &masks,
            },
            &p,
            &mut want,
        );
        let qrows: Vec<QueryRow> = lens
            .iter()
            .enumerate()
            .map(|(s, &l)| QueryRow {
                seq: s,
                first: 0,
                end: l,
            })
            .collect();
        let dt = g.upload_tree_rows(&flat, max_blocks, &qrows, &masks, bs).unwrap();
        g.paged_attention(dtype, quant, dvo, &mut dout, &dq, &dk, &dv, &dt, dims, p.scale, ks, vs)
            .unwrap();
        let got = g.download(&dout).unwrap();
        let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        eprintln!("{dtype} {m} head_dim {hd}, tree rows: max |GPU − CPU| = {worst:.2e}");
        assert!(
            worst < 2e-4,
            "{dtype} {m} head_dim {hd}: tree rows differ from the CPU by {worst}"
        );
    }
}

#[test]
fn bandwidth_report() -> Result<(), CudaError> {
    if host::emulated() {
        return Ok(()); // timings of the emulated device mean nothing
    }
    let Some(g) = gpu() else { return Ok(()) };
    let mut report = format!("device: {}\n", g.name());
    // Copy bandwidth: a 1 GiB device-to-device copy (read + write counted).
    let n = 1usize << 30;
    let src = g.zeros(n)?;
    let mut dst = g.zeros(n)?;
    let ms = g.time_ms(10, || g.copy(&src, &mut dst))?;
    let copy_gbps = 2.0 * n as f64 / (ms / 1e3) / 1e9;
    report.push_str(&format!(
        "copy bandwidth: {copy_gbps:.0} GB/s (1 GiB D2D, read + write)\n"
    ));
    drop((src, dst));
    report.push_str("| kernel | dtype | shape | time | GB/s | % of copy |\n|---|---|---|---|---|---|\n");
    // Decode attention at long context: 32 sequences × 16,384 tokens, 8 heads (= KV heads), head_dim 128.
    let (seqs, ctx, nh, hd, bs) = (32usize, 16384usize, 8usize, 128usize, 16usize);
    let blocks_per_seq = ctx / bs;
    let blocks = seqs * blocks_per_seq;
    let dims = Dims {
        num_kv_heads: nh,
        num_heads: nh,
        head_dim: hd,
        block_size: bs,
    };
    for (dtype, quant) in cases() {
        let shape = CacheShape::new(1, nh, hd, bs, dtype)
            .unwrap()
            .with_quant(quant)
            .unwrap();
        let m = quant.name();
        let layer_bytes = blocks * shape.layer_block_bytes();
        let k = g.zeros(layer_bytes)?;
        let v = g.zeros(layer_bytes)?;
        let tables: Vec<i32> = (0..blocks as i32).collect();
        let dt = g.upload_tables(&tables, blocks_per_seq, &vec![ctx; seqs], bs)?;
        let dq = g.upload(&vec![0.01f32; seqs * nh * hd])?;
        let mut out = g.upload(&vec![0f32; seqs * nh * hd])?;
        let ms = g.time_ms(5, || {
            g.paged_attention(dtype, quant, None, &mut out, &dq, &k, &v, &dt, dims, 0.088, 1.0, 1.0)
        })?;
        let bytes = 2.0 * layer_bytes as f64;
        let gbps = bytes / (ms / 1e3) / 1e9;
        report.push_str(&format!(
            "| paged attention decode | {dtype} {m} | {seqs} seqs x {ctx} tokens x {nh} heads x {hd} | {ms:.3} ms | {gbps:.0} | {:.0}% |\n",
            100.0 * gbps / copy_gbps
        ));
        // Quantize-on-store of 64k tokens.
        let tokens = 65536usize;
        let x = g.upload(&vec![0.5f32; tokens * nh * hd])?;
        let slots = g.upload_slots(&(0..tokens).collect::<Vec<_>>())?;
        let mut cache = g.zeros(tokens.div_ceil(bs) * shape.layer_block_bytes())?;
        let ms = g.time_ms(5, || g.store(dtype, quant, &x, &slots, &mut cache, dims, 1.0, None))?;
        let bytes = (tokens * nh * hd * 4) as f64 + (tokens * nh * shape.bytes_per_vector()) as f64;
        let gbps = bytes / (ms / 1e3) / 1e9;
        report.push_str(&format!(
            "| quantize-on-store | {dtype} {m} | {tokens} tokens x {nh} heads x {hd} | {ms:.3} ms | {gbps:.0} | {:.0}% |\n",
            100.0 * gbps / copy_gbps
        ));
    }
    eprintln!("{report}");
    if let Ok(path) = std::env::var("KVGATE_GPU_REPORT") {
        std::fs::write(path, &report).ok();
    }
    Ok(())
}

#[test]
fn the_kernels_run_on_an_emulated_device() {
    let Some((ok, text)) = host::rerun_on_emulated_device("the_kernels_run_on_an_emulated_device") else {
        return;
    };
    assert!(ok, "the kernels on the emulated device:\n{text}");
    assert!(text.contains("test result: ok. 3 passed"), "every test ran: {text}");
}
