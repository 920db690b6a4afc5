//! The bandwidth bound the anchor bench reports decode against: copy and read bandwidth measured in
//! the same run, bytes a decode step reads (every weight once plus the stream's KV), and the CPU's
//! flags for the report's header.

use std::path::Path;
use std::time::Instant;

/// Copy bandwidth with two threads (each copies half of a 256 MiB buffer; read + write counted), GB/s.
pub(crate) fn copy_bandwidth() -> f64 {
    let n = 256usize << 20;
    let src = vec![1u8; n];
    let mut dst = vec![0u8; n];
    let mut best = 0f64;
    for _ in 0..5 {
        let t0 = Instant::now();
        std::thread::scope(|s| {
            for (d, c) in dst.chunks_mut(n / 2).zip(src.chunks(n / 2)) {
                s.spawn(move || d.copy_from_slice(c));
            }
        });
        best = best.max(2.0 * n as f64 / t0.elapsed().as_secs_f64() / 1e9);
    }
    std::hint::black_box(&dst);
    best
}

/// The rate two threads read memory at (GB/s): a decode step only reads, and the copy figure above
/// counts a write beside every read, so it exceeds what the cores can read (on a 2-core VM: copy
/// 36.6 GB/s, read 26.9 GB/s, measured minutes apart). Best of five passes over 256 MiB.
pub(crate) fn read_bandwidth() -> f64 {
    let n = (256usize << 20) / 8;
    let src: Vec<u64> = (0..n as u64).collect();
    let mut best = 0f64;
    for _ in 0..5 {
        let t0 = Instant::now();
        let sums: Vec<u64> = std::thread::scope(|s| {
            let hs: Vec<_> = src
                .chunks(n / 2)
                .map(|c| s.spawn(move || c.iter().fold(0u64, |a, &x| a.wrapping_add(x))))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap_or(0)).collect()
        });
        std::hint::black_box(sums);
        best = best.max(8.0 * n as f64 / t0.elapsed().as_secs_f64() / 1e9);
    }
    best
}

/// What one decode step of one stream reads.
pub(crate) struct StepBytes {
    /// Every matmul weight once, the embedding one row.
    pub(crate) weights: f64,
    /// KV bytes per context token in kvgate's cache (its dtype from `KVGATE_ARGS`, else float32).
    pub(crate) kv_per_token: f64,
    pub(crate) kv_dtype: &'static str,
    /// The same in f16 (llama.cpp's default cache).
    pub(crate) kv_per_token_f16: f64,
}

/// What a decode step of `model` reads, on kvgate's defaults (or `KVGATE_ARGS`).
pub(crate) fn bytes_per_step(model: &Path) -> Option<StepBytes> {
    let args = std::env::var("KVGATE_ARGS").unwrap_or_default();
    let m = kvgate_cpu::load(
        model,
        &kvgate_model::LoadOptions {
            max_model_len: Some(4096),
            // serve's default is 8-bit activations
            int8_activations: !args.contains("--activations f32"),
            f32_weights: false,
            chat_template: None,
        },
    )
    .ok()?;
    let c = m.model.config();
    let w = m.model.weights();
    let words: Vec<&str> = args.split_whitespace().collect();
    let dtype = words
        .iter()
        .position(|a| *a == "--kv-cache-dtype")
        .and_then(|i| words.get(i + 1))
        .and_then(|d| kvgate_kv::KvDtype::parse(d).ok().flatten())
        .unwrap_or(kvgate_kv::KvDtype::F32);
    let vectors = (2 * c.num_layers * c.num_kv_heads) as f64;
    Some(StepBytes {
        weights: (w.matmul_bytes() + c.hidden_size * 4) as f64,
        kv_per_token: vectors * dtype.bytes_per_vector(c.head_dim) as f64,
        kv_dtype: dtype.name(),
        kv_per_token_f16: vectors * (2 * c.head_dim) as f64,
    })
}

/// The CPU's model name and its AVX2 / AVX-512 flags.
pub(crate) fn cpu_flags() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = info
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .unwrap_or("?")
        .trim()
        .to_string();
    let flags = info.lines().find(|l| l.starts_with("flags")).unwrap_or("");
    let mut f: Vec<&str> = flags
        .split_whitespace()
        .filter(|w| *w == "avx2" || w.starts_with("avx512"))
        .collect();
    f.sort();
    f.dedup();
    format!("{model}; {}", f.join(" "))
}
