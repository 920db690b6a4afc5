//! kvgate's own matmul for the GGUF formats that matter most on CPU (Q4_0, Q4_1, Q8_0): the weight stays
//! 4- or 8-bit, the activations stay f32 (they are not quantized, unlike llama.cpp's and candle's
//! `q8_1` path), so the result equals a matmul against the dequantized weights up to f32 rounding — the
//! Hugging Face reference on the dequantized GGUF — while reading a quarter of the bytes.
//!
//! Layout: at load, each block of 32 weights is repacked into an f32 scale `d`, an f32 offset `m`
//! (Q4_0 becomes `m = -8·d`) and its packed quants, so the inner loop does no f16 conversion. The inner
//! loop decodes a block to `w = fma(q, d, m)` once and multiplies it with up to [`ROWS`] activation rows.
//!
//! Batch invariance: every output `y[r][c]` is reduced in the same order (blocks ascending, fixed 8-lane
//! accumulator, fixed horizontal sum) whatever the number of rows or the tiling, so a row's result never
//! depends on the batch. Rows are processed in groups so that each decoded weight block is reused
//! from registers by up to [`ROWS`] activation rows (batched decode and prefill read the weights once
//! per tile). AVX-512 is used when the CPU has it (checked once at run time), else AVX2.

use rayon::prelude::*;

/// Weights per block.
pub const QK: usize = 32;

/// Activation rows that share one decoded weight block (16 measured slower than 8 on AVX-512 too).
pub const ROWS: usize = 8;

/// Whether the CPU has AVX-512F (checked once; the same machine always takes the same path, so results
/// stay deterministic).
#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
static AVX512: std::sync::LazyLock<bool> = std::sync::LazyLock::new(|| {
    std::env::var_os("KVGATE_NO_AVX512").is_none() && std::arch::is_x86_feature_detected!("avx512f")
});

/// f32 storage aligned to 64 bytes.
struct Aligned {
    buf: Vec<Line>,
    len: usize,
}

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([f32; 16]);

impl Aligned {
    fn from(x: &[f32]) -> Aligned {
        let mut buf = vec![Line([0.0; 16]); x.len().div_ceil(16)];
        for (line, chunk) in buf.iter_mut().zip(x.chunks(16)) {
            line.0[..chunk.len()].copy_from_slice(chunk);
        }
        Aligned { buf, len: x.len() }
    }

    fn as_slice(&self) -> &[f32] {
        // SAFETY: `Line` is `repr(C)` around `[f32; 16]` (size 64, no padding), so the buffer is
        // `16 · buf.len()` contiguous f32s, of which the first `len` were written.
        unsafe { std::slice::from_raw_parts(self.buf.as_ptr() as *const f32, self.len) }
    }
}

/// Packed formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QKind {
    /// 4-bit (Q4_0 and Q4_1): low nibbles are elements 0..16, high nibbles 16..32.
    Q4,
    /// 8-bit signed (Q8_0).
    Q8,
}

/// A repacked quantized matrix, `n` rows (outputs) of `k` inputs.
#[derive(Debug, Clone)]
pub struct QMatrix {
    kind: QKind,
    n: usize,
    k: usize,
    d: Vec<f32>,
    m: Vec<f32>,
    qs: Vec<u8>,
}

fn f16le(b: &[u8]) -> f32 {
    half::f16::from_le_bytes([b[0], b[1]]).to_f32()
}

impl QMatrix {
    /// A matrix from per-block scales, offsets and packed quants (see [`crate::repack`]).
    pub(crate) fn from_parts(kind: QKind, n: usize, k: usize, d: Vec<f32>, m: Vec<f32>, qs: Vec<u8>) -> QMatrix {
        debug_assert_eq!(d.len(), n * k / QK);
        debug_assert_eq!(qs.len(), d.len() * if kind == QKind::Q4 { 16 } else { 32 });
        QMatrix { kind, n, k, d, m, qs }
    }

    /// Repacks GGUF Q4_0 data (`d: f16, qs: [u8; 16]` per block).
    pub fn from_q4_0(data: &[u8], n: usize, k: usize) -> QMatrix {
        Self::repack(data, n, k, 18, QKind::Q4, |b| {
            let d = f16le(b);
            (d, -8.0 * d, &b[2..18])
        })
    }

    /// Repacks GGUF Q4_1 data (`d: f16, m: f16, qs: [u8; 16]` per block).
    pub fn from_q4_1(data: &[u8], n: usize, k: usize) -> QMatrix {
        Self::repack(data, n, k, 20, QKind::Q4, |b| (f16le(b), f16le(&b[2..]), &b[4..20]))
    }

    /// Repacks GGUF Q8_0 data (`d: f16, qs: [i8; 32]` per block).
    pub fn from_q8_0(data: &[u8], n: usize, k: usize) -> QMatrix {
        Self::repack(data, n, k, 34, QKind::Q8, |b| (f16le(b), 0.0, &b[2..34]))
    }

    fn repack(
        data: &[u8],
        n: usize,
        k: usize,
        block_bytes: usize,
        kind: QKind,
        split: impl Fn(&[u8]) -> (f32, f32, &[u8]),
    ) -> QMatrix {
        assert_eq!(k % QK, 0, "k must be a multiple of 32");
        let blocks = n * k / QK;
        assert_eq!(data.len(), blocks * block_bytes, "quantized data size");
        let mut d = Vec::with_capacity(blocks);
        let mut m = Vec::with_capacity(blocks);
        let mut qs = Vec::with_capacity(blocks * if kind == QKind::Q4 { 16 } else { 32 });
        for b in data.chunks_exact(block_bytes) {
            let (dd, mm, q) = split(b);
            d.push(dd);
            m.push(mm);
            qs.extend_from_slice(q);
        }
        QMatrix { kind, n, k, d, m, qs }
    }

    /// The rows of several matrices of the same format and width stacked into one (e.g. q, k, v).
    pub fn concat(parts: &[&QMatrix]) -> Option<QMatrix> {
        let first = parts.first()?;
        if parts.iter().any(|p| p.kind != first.kind || p.k != first.k) {
            return None;
        }
        let mut out = QMatrix {
            kind: first.kind,
            n: 0,
            k: first.k,
            d: vec![],
            m: vec![],
            qs: vec![],
        };
        for p in parts {
            out.n += p.n;
            out.d.extend_from_slice(&p.d);
            out.m.extend_from_slice(&p.m);
            out.qs.extend_from_slice(&p.qs);
        }
        Some(out)
    }

    /// Output rows.
    pub fn rows(&self) -> usize {
        self.n
    }

    /// Inputs per row.
    pub fn cols(&self) -> usize {
        self.k
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.qs.len() + 4 * (self.d.len() + self.m.len())
    }

    /// The dequantized value of row `r`, element `i` (tests).
    pub fn value(&self, r: usize, i: usize) -> f32 {
        let b = r * (self.k / QK) + i / QK;
        let j = i % QK;
        let q = match self.kind {
            QKind::Q4 => {
                let byte = self.qs[b * 16 + j % 16];
                (if j < 16 { byte & 0xF } else { byte >> 4 }) as f32
            }
            QKind::Q8 => self.qs[b * 32 + j] as i8 as f32,
        };
        self.d[b] * q + self.m[b]
    }

    /// `x` is `rows × k`; returns `rows × n`.
    pub fn matmul(&self, x: &[f32], rows: usize) -> Vec<f32> {
        let (n, k) = (self.n, self.k);
        debug_assert_eq!(x.len(), rows * k);
        // The activations are copied to a 64-byte aligned buffer: with k a multiple of 32, every
        // vector load of the kernels is then aligned (a split cache-line load costs two).
        let aligned = Aligned::from(x);
        let x = aligned.as_slice();
        let tile = TILE;
        let tiles = n.div_ceil(tile);
        let nb = k / QK;
        let mut out = vec![0f32; rows * n];
        let parts: Vec<(usize, Vec<f32>)> = (0..tiles)
            .into_par_iter()
            .map(|t| {
                let c0 = t * tile;
                let c1 = (c0 + tile).min(n);
                let w = c1 - c0;
                let mut y = vec![0f32; rows * w];
                // Accumulators of (column, row) pairs of a row group, kept between k-chunks.
                let mut acc = [0f32; TILE * ROWS * LANES];
                let mut r = 0;
                while r < rows {
                    let rr = (rows - r).min(ROWS);
                    acc[..w * rr * LANES].fill(0.0);
                    // When a row group's activations outgrow L1, k-chunks keep a chunk of every
                    // activation row and of every weight row of the tile in L1 while the columns pass
                    // over it. Each accumulator still sums its blocks in ascending order, so the
                    // result is the same with or without chunks.
                    let chunk = if rr * k * 4 <= 16 * 1024 { nb } else { KCHUNK };
                    let mut b0 = 0;
                    while b0 < nb {
                        let b1 = (b0 + chunk).min(nb);
                        for c in c0..c1 {
                            let a = &mut acc[(c - c0) * rr * LANES..(c - c0 + 1) * rr * LANES];
                            self.dot_rows(c, &x[r * k..], rr, b0, b1, a);
                        }
                        b0 = b1;
                    }
                    for c in c0..c1 {
                        let a = &acc[(c - c0) * rr * LANES..(c - c0 + 1) * rr * LANES];
                        for i in 0..rr {
                            y[(r + i) * w + c - c0] = reduce(&a[i * LANES..(i + 1) * LANES]);
                        }
                    }
                    r += rr;
                }
                (c0, y)
            })
            .collect();
        for (c0, y) in parts {
            let w = y.len() / rows.max(1);
            for r in 0..rows {
                out[r * n + c0..r * n + c0 + w].copy_from_slice(&y[r * w..(r + 1) * w]);
            }
        }
        out
    }

    /// Adds blocks `b0..b1` of weight row `c` times `rr` (≤ [`ROWS`]) consecutive activation rows
    /// starting at `x` into the accumulators `acc` (`ROWS × LANES` floats, row-major).
    #[inline]
    fn dot_rows(&self, c: usize, x: &[f32], rr: usize, b0: usize, b1: usize, acc: &mut [f32]) {
        debug_assert!(acc.len() >= rr * LANES && b1 <= self.k / QK);
        #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
        {
            if *AVX512 {
                // SAFETY: avx512f was detected at run time; bounds as argued in `avx512::dot_rows`.
                return unsafe { avx512::dot_rows(self, c, x, rr, b0, b1, acc) };
            }
            // SAFETY: the avx2 and fma target features are enabled at compile time (this cfg), so the
            // intrinsics are available; every access stays inside the slices as argued there.
            unsafe { avx2::dot_rows(self, c, x, rr, b0, b1, acc) }
        }
        #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma")))]
        {
            scalar_dot_rows(self, c, x, rr, b0, b1, acc)
        }
    }
}

/// Accumulator lanes per (row, column): 16 (one AVX-512 register; AVX2 uses two registers' worth).
pub const LANES: usize = 16;

/// Blocks of 32 weights per k-chunk (512 activations).
const KCHUNK: usize = 16;

/// Output columns per parallel task.
const TILE: usize = 16;

/// The fixed-order sum of one accumulator: lane i + lane i+8, then pairwise.
#[inline]
fn reduce(a: &[f32]) -> f32 {
    let s: [f32; 8] = std::array::from_fn(|i| a[i] + a[i + 8]);
    ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]))
}

/// Decodes one block to `w = fma(q, d, m)` (32 values).
#[inline]
fn decode_block(w: &QMatrix, blk: usize, q: &mut [f32; QK]) {
    let (d, m) = (w.d[blk], w.m[blk]);
    match w.kind {
        QKind::Q4 => {
            let qs = &w.qs[blk * 16..blk * 16 + 16];
            for j in 0..16 {
                q[j] = ((qs[j] & 0xF) as f32).mul_add(d, m);
                q[j + 16] = ((qs[j] >> 4) as f32).mul_add(d, m);
            }
        }
        QKind::Q8 => {
            for (j, v) in w.qs[blk * 32..blk * 32 + 32].iter().enumerate() {
                q[j] = (*v as i8 as f32).mul_add(d, m);
            }
        }
    }
}

/// The portable kernel: the same block order and lane assignment as the AVX-512 kernel (element j of a
/// block goes to lane j mod 16).
#[allow(dead_code)]
fn scalar_dot_rows(w: &QMatrix, c: usize, x: &[f32], rr: usize, b0: usize, b1: usize, acc: &mut [f32]) {
    let (k, nb) = (w.k, w.k / QK);
    let mut q = [0f32; QK];
    for b in b0..b1 {
        decode_block(w, c * nb + b, &mut q);
        for r in 0..rr {
            let xr = &x[r * k + b * QK..r * k + b * QK + QK];
            let a = &mut acc[r * LANES..(r + 1) * LANES];
            for j in 0..QK {
                a[j % LANES] = q[j].mul_add(xr[j], a[j % LANES]);
            }
        }
    }
}

#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{QKind, QMatrix, LANES, QK};

    /// SAFETY (caller): avx2+fma available. Bounds: block `c·nb + b < n·nb`, so the quant loads stay
    /// inside `w.qs`; row `r < rr ≤ ROWS` reads `x[r·k + b·32 .. +32]` with `b < nb = k/32`, inside `x`
    /// (the caller passes at least `rr` rows of `k`); `acc` holds `rr · LANES` floats.
    pub unsafe fn dot_rows(w: &QMatrix, c: usize, x: &[f32], rr: usize, b0: usize, b1: usize, acc: &mut [f32]) {
        // At most four rows per pass: two accumulators per row plus the decoded block must fit in the
        // 16 AVX2 registers. Rows are independent, so the split changes no result.
        if rr > 4 {
            dot_rows(w, c, x, 4, b0, b1, acc);
            return dot_rows(w, c, &x[4 * w.k..], rr - 4, b0, b1, &mut acc[4 * LANES..]);
        }
        match rr {
            1 => dot_r::<1>(w, c, x, b0, b1, acc),
            2 => dot_r::<2>(w, c, x, b0, b1, acc),
            3 => dot_r::<3>(w, c, x, b0, b1, acc),
            _ => dot_r::<4>(w, c, x, b0, b1, acc),
        }
    }

    /// Exactly `R` rows (accumulators in registers for the chunk). Lanes 0–7 of a row's accumulator
    /// take block elements 0–7 and 16–23, lanes 8–15 take 8–15 and 24–31, as in the AVX-512 kernel.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn dot_r<const R: usize>(w: &QMatrix, c: usize, x: &[f32], b0: usize, b1: usize, acc: &mut [f32]) {
        let (k, nb) = (w.k, w.k / QK);
        let ap = acc.as_mut_ptr();
        let mut lo = [_mm256_setzero_ps(); R];
        let mut hi = [_mm256_setzero_ps(); R];
        for r in 0..R {
            lo[r] = _mm256_loadu_ps(ap.add(r * LANES));
            hi[r] = _mm256_loadu_ps(ap.add(r * LANES + 8));
        }
        let xp = x.as_ptr();
        let mask = _mm_set1_epi8(0x0F);
        for b in b0..b1 {
            let blk = c * nb + b;
            let d = _mm256_set1_ps(*w.d.get_unchecked(blk));
            let m = _mm256_set1_ps(*w.m.get_unchecked(blk));
            let q: [__m256; 4] = match w.kind {
                QKind::Q4 => {
                    let raw = _mm_loadu_si128(w.qs.as_ptr().add(blk * 16) as *const __m128i);
                    let l = _mm_and_si128(raw, mask);
                    let h = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
                    [
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(l)), d, m),
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(l, 8))), d, m),
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(h)), d, m),
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(h, 8))), d, m),
                    ]
                }
                QKind::Q8 => {
                    let p = w.qs.as_ptr().add(blk * 32);
                    let a = _mm_loadu_si128(p as *const __m128i);
                    let bb = _mm_loadu_si128(p.add(16) as *const __m128i);
                    [
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(a)), d, m),
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(a, 8))), d, m),
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bb)), d, m),
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(bb, 8))), d, m),
                    ]
                }
            };
            for r in 0..R {
                let xr = xp.add(r * k + b * QK);
                lo[r] = _mm256_fmadd_ps(q[0], _mm256_loadu_ps(xr), lo[r]);
                hi[r] = _mm256_fmadd_ps(q[1], _mm256_loadu_ps(xr.add(8)), hi[r]);
                lo[r] = _mm256_fmadd_ps(q[2], _mm256_loadu_ps(xr.add(16)), lo[r]);
                hi[r] = _mm256_fmadd_ps(q[3], _mm256_loadu_ps(xr.add(24)), hi[r]);
            }
        }
        for r in 0..R {
            _mm256_storeu_ps(ap.add(r * LANES), lo[r]);
            _mm256_storeu_ps(ap.add(r * LANES + 8), hi[r]);
        }
    }
}

#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{QKind, QMatrix, LANES, QK, ROWS};

    /// SAFETY (caller): avx512f (and avx2/fma) available. Bounds as in `avx2::dot_rows`.
    pub unsafe fn dot_rows(w: &QMatrix, c: usize, x: &[f32], rr: usize, b0: usize, b1: usize, acc: &mut [f32]) {
        match rr {
            1 => dot_r::<1>(w, c, x, b0, b1, acc),
            2 => dot_r::<2>(w, c, x, b0, b1, acc),
            3 => dot_r::<3>(w, c, x, b0, b1, acc),
            4 => dot_r::<4>(w, c, x, b0, b1, acc),
            5 => dot_r::<5>(w, c, x, b0, b1, acc),
            6 => dot_r::<6>(w, c, x, b0, b1, acc),
            7 => dot_r::<7>(w, c, x, b0, b1, acc),
            _ => dot_r::<{ ROWS }>(w, c, x, b0, b1, acc),
        }
    }

    /// Exactly `R` rows; element j of a block accumulates into lane j mod 16.
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn dot_r<const R: usize>(w: &QMatrix, c: usize, x: &[f32], b0: usize, b1: usize, acc: &mut [f32]) {
        let (k, nb) = (w.k, w.k / QK);
        let ap = acc.as_mut_ptr();
        let mut a = [_mm512_setzero_ps(); R];
        for (r, v) in a.iter_mut().enumerate() {
            *v = _mm512_loadu_ps(ap.add(r * LANES));
        }
        let xp = x.as_ptr();
        let mask = _mm_set1_epi8(0x0F);
        for b in b0..b1 {
            let blk = c * nb + b;
            let d = _mm512_set1_ps(*w.d.get_unchecked(blk));
            let m = _mm512_set1_ps(*w.m.get_unchecked(blk));
            let (q0, q1) = match w.kind {
                QKind::Q4 => {
                    let raw = _mm_loadu_si128(w.qs.as_ptr().add(blk * 16) as *const __m128i);
                    let l = _mm_and_si128(raw, mask);
                    let h = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
                    (
                        _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(l)), d, m),
                        _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(h)), d, m),
                    )
                }
                QKind::Q8 => {
                    let p = w.qs.as_ptr().add(blk * 32);
                    let lo = _mm_loadu_si128(p as *const __m128i);
                    let hi = _mm_loadu_si128(p.add(16) as *const __m128i);
                    (
                        _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo)), d, m),
                        _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi)), d, m),
                    )
                }
            };
            for (r, v) in a.iter_mut().enumerate() {
                let xr = xp.add(r * k + b * QK);
                *v = _mm512_fmadd_ps(q0, _mm512_loadu_ps(xr), *v);
                *v = _mm512_fmadd_ps(q1, _mm512_loadu_ps(xr.add(16)), *v);
            }
        }
        for (r, v) in a.iter().enumerate() {
            _mm512_storeu_ps(ap.add(r * LANES), *v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocks(kind: &str, n: usize, k: usize, seed: u32) -> Vec<u8> {
        let mut s = seed;
        let mut rnd = || {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (s >> 8) as u8
        };
        let mut out = vec![];
        for _ in 0..n * k / 32 {
            let d = half::f16::from_f32(0.01 + (rnd() as f32) / 4000.0).to_le_bytes();
            out.extend(d);
            match kind {
                "q4_1" => {
                    out.extend(half::f16::from_f32(-0.05 + rnd() as f32 / 3000.0).to_le_bytes());
                    (0..16).for_each(|_| out.push(rnd()));
                }
                "q4_0" => (0..16).for_each(|_| out.push(rnd())),
                _ => (0..32).for_each(|_| out.push(rnd())),
            }
        }
        out
    }

    #[test]
    fn matches_the_dequantized_matmul_and_is_batch_invariant() {
        let (n, k) = (37, 96);
        for kind in ["q4_0", "q4_1", "q8_0"] {
            let data = blocks(kind, n, k, 7);
            let w = match kind {
                "q4_0" => QMatrix::from_q4_0(&data, n, k),
                "q4_1" => QMatrix::from_q4_1(&data, n, k),
                _ => QMatrix::from_q8_0(&data, n, k),
            };
            let rows = 7;
            let x: Vec<f32> = (0..rows * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 40.0).collect();
            let y = w.matmul(&x, rows);
            for r in 0..rows {
                for c in 0..n {
                    let want: f64 = (0..k).map(|i| w.value(c, i) as f64 * x[r * k + i] as f64).sum();
                    assert!(
                        (y[r * n + c] as f64 - want).abs() < 1e-4 * (1.0 + want.abs()),
                        "{kind} {r} {c}"
                    );
                }
                let alone = w.matmul(&x[r * k..(r + 1) * k], 1);
                assert_eq!(
                    &y[r * n..(r + 1) * n],
                    alone.as_slice(),
                    "{kind}: row {r} depends on the batch"
                );
            }
            let mut acc = vec![0f32; ROWS * LANES];
            scalar_dot_rows(&w, 3, &x, 4, 0, k / QK, &mut acc);
            for r in 0..4 {
                let s = reduce(&acc[r * LANES..(r + 1) * LANES]);
                assert_eq!(
                    s.to_bits(),
                    y[r * n + 3].to_bits(),
                    "{kind}: the scalar kernel gives the same bits"
                );
            }
        }
    }

    #[test]
    fn decodes_gguf_blocks() {
        // one Q4_1 block: d = 0.5, m = -1, nibbles 0..15 low and 15..0 high
        let mut b = vec![];
        b.extend(half::f16::from_f32(0.5).to_le_bytes());
        b.extend(half::f16::from_f32(-1.0).to_le_bytes());
        for j in 0..16u8 {
            b.push(j | ((15 - j) << 4));
        }
        let w = QMatrix::from_q4_1(&b, 1, 32);
        assert_eq!(w.value(0, 0), -1.0);
        assert_eq!(w.value(0, 3), 0.5);
        assert_eq!(w.value(0, 16), 6.5);
        let mut q0 = vec![];
        q0.extend(half::f16::from_f32(2.0).to_le_bytes());
        q0.extend([0x8Fu8; 16]);
        let w = QMatrix::from_q4_0(&q0, 1, 32);
        assert_eq!(w.value(0, 0), 14.0);
        assert_eq!(w.value(0, 16), 0.0);
    }
}
