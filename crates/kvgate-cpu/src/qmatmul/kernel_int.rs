//! The integer microkernel of the 8-bit-activation mode (completions' default) ([`super::QMatrix::matmul_rows`] with
//! rows marked integer): the same panels, records and tiles as [`super::kernel`], with the block's
//! dot products done exactly in integers against activations quantized per 32 inputs
//! ([`super::acts`]), then one fixed f32 sequence per block:
//! `t = S · sx; y = fma(d, t, y); y = fma(m, X, y)`, where `X = sx · Σ q` is the block sum of the
//! quantized activations (the caller's `xs`), so that each weight `d·q + m` meets one quantized input.
//!
//! 4-bit weights: `vpmaddubsw` of the unsigned nibbles (four consecutive inputs of a column per 32-bit
//! lane, see `QMatrix::q4_at`) with the signed activation bytes; a block's 16-bit partial sums stay
//! below `16 · 15 · 127 = 30,480`, so they are exact without widening until the block ends. 6-bit
//! weights (`QMatrix::q6_at`: also four inputs of a column per lane) as their unsigned `q + 32`
//! (`0..64`) against the activation bytes (`vpdpbusd`, or `vpmaddubsw` pairs of at most `2 · 63 · 127`),
//! then `32 · Σ x` of the block taken off in integers: the signed sum exactly. 8-bit weights: a byte
//! shuffle pairs each column's consecutive inputs, `vpmaddwd` against 16-bit activation codes (within
//! ±32767: a block's 32 products stay below 2³¹ in the 32-bit lanes, no saturation possible). Integer
//! sums are exact in any order, so AVX2, AVX-512 and the scalar loop give the same bits (tested), and a
//! row's result depends on that row alone.

use super::acts::QuantRows;
use super::kernel::{max_rows, Acc, Path, Walk, PATH};
use super::{QKind, QMatrix, P, QK, TILE_PANELS};

/// Outputs of rows `r0 .. r0 + rr` of the quantized activations `q` (their block sums in `xs`,
/// `rr × nb`) for panels `p0 .. p0 + TILE_PANELS`, written to `y` (which must start at zero).
/// `heads`, `walk`: as [`super::kernel::run`]'s.
#[allow(clippy::too_many_arguments)]
pub(super) fn run_int(
    w: &QMatrix,
    p0: usize,
    q: &QuantRows,
    r0: usize,
    xs: &[f32],
    heads: Option<&[f32]>,
    rr: usize,
    walk: Walk,
    y: &mut Acc,
) {
    let (k, groups) = (w.k, w.k / QK);
    assert!(rr >= 1 && rr <= max_rows() && xs.len() >= rr * w.nb());
    assert!(p0 + TILE_PANELS <= w.np);
    let hd = w.heads_ptr(heads);
    assert!(q.sx.len() >= (r0 + rr) * groups);
    match w.kind {
        QKind::Q4 | QKind::Q5 => assert!(q.q8.len() >= (r0 + rr) * k),
        QKind::Q6 | QKind::Q6x => assert!(q.q8.len() >= (r0 + rr) * k && q.sums16.len() >= (r0 + rr) * (k / 16)),
        QKind::Q8 => assert!(q.q16.len() >= (r0 + rr) * k),
        QKind::F16 | QKind::Bf16 => panic!("16-bit weights have no integer kernel"),
    }
    let (q8, q16, sx, s16) = (
        q.q8.as_ptr().wrapping_add(r0 * k),
        q.q16.as_ptr().wrapping_add(r0 * k),
        q.sx[r0 * groups..].as_ptr(),
        q.sums16.as_ptr().wrapping_add(r0 * (k / 16)),
    );
    match *PATH {
        // SAFETY: the features were detected at run time (`PATH`); bounds as asserted above (the
        // pointer of the buffer the kind does not use is never read).
        #[cfg(target_arch = "x86_64")]
        Path::Avx512 if *VNNI => unsafe {
            super::kernel_zmm::dispatch(w, p0, q8, q16, sx, s16, xs.as_ptr(), hd, rr, y)
        },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Path::Avx512 => unsafe { avx512::dispatch(w, p0, q8, q16, sx, s16, xs.as_ptr(), hd, rr, walk, y) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 if *AVX_VNNI => unsafe {
            avx2_vnni::dispatch(w, p0, q8, q16, sx, s16, xs.as_ptr(), hd, rr, walk, y)
        },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 => unsafe { avx2::dispatch(w, p0, q8, q16, sx, s16, xs.as_ptr(), hd, rr, walk, y) },
        _ => {
            let _ = (hd, walk); // the scalar kernel reads the records' own heads, its tile once
            scalar_int(w, p0, q, r0, xs, rr, y)
        }
    }
}

/// [`run_int`] on every SIMD kernel this machine has (AVX2, AVX2 with AVX-VNNI, AVX-512, AVX-512 VNNI in 512-bit registers), each by name: the
/// tests hold each to the scalar kernel's bits, whichever one this machine's calls take.
#[cfg(test)]
pub(super) fn run_int_each(
    w: &QMatrix,
    p0: usize,
    q: &QuantRows,
    r0: usize,
    xs: &[f32],
    heads: Option<&[f32]>,
    rr: usize,
) -> Vec<(&'static str, Acc)> {
    let mut out = vec![];
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        let (k, hd) = (w.k, w.heads_ptr(heads));
        let (q8, q16, sx, s16) = (
            q.q8.as_ptr().wrapping_add(r0 * k),
            q.q16.as_ptr().wrapping_add(r0 * k),
            q.sx[r0 * (k / QK)..].as_ptr(),
            q.sums16.as_ptr().wrapping_add(r0 * (k / 16)),
        );
        let zero = || -> Acc { [[0.0; P]; super::kernel::MAX_ROWS * TILE_PANELS] };
        // each instance in both walks, by name: AVX2, AVX2 with AVX-VNNI, AVX-512
        let walks = [
            (Walk::Stream, ["avx2", "avx2 vnni", "avx512"]),
            (
                Walk::Cached,
                ["avx2, two passes", "avx2 vnni, two passes", "avx512, two passes"],
            ),
        ];
        if has!("avx2") && has!("fma") && has!("f16c") && rr <= 4 {
            for (walk, [avx2, vnni, _]) in walks {
                let mut y = zero();
                // SAFETY: features detected just above; bounds as `run_int` asserts (the caller
                // passes what `run_int` accepts).
                unsafe { avx2::dispatch(w, p0, q8, q16, sx, s16, xs.as_ptr(), hd, rr, walk, &mut y) };
                out.push((avx2, y));
                if has!("avxvnni") {
                    let mut y = zero();
                    // SAFETY: as above, and AVX-VNNI detected.
                    unsafe { avx2_vnni::dispatch(w, p0, q8, q16, sx, s16, xs.as_ptr(), hd, rr, walk, &mut y) };
                    out.push((vnni, y));
                }
            }
        }
        if has!("avx512f") && has!("avx512vl") {
            for (walk, [.., avx512]) in walks {
                let mut y = zero();
                // SAFETY: as above.
                unsafe { avx512::dispatch(w, p0, q8, q16, sx, s16, xs.as_ptr(), hd, rr, walk, &mut y) };
                out.push((avx512, y));
            }
            if super::kernel_zmm::available() {
                let mut y = zero();
                // SAFETY: as above.
                unsafe { super::kernel_zmm::dispatch(w, p0, q8, q16, sx, s16, xs.as_ptr(), hd, rr, &mut y) };
                out.push(("avx512 vnni (512-bit)", y));
            }
        }
    }
    out
}

/// The portable integer kernel (the tests' reference): the same integer sums and f32 sequence.
pub(super) fn scalar_int(w: &QMatrix, p0: usize, q: &QuantRows, r0: usize, xs: &[f32], rr: usize, y: &mut Acc) {
    let (k, nb, bl, groups) = (w.k, w.nb(), w.bl, w.k / QK);
    for r in 0..rr {
        for v in 0..TILE_PANELS {
            for (j, out) in y[r * TILE_PANELS + v].iter_mut().enumerate() {
                let c = (p0 + v) * P + j;
                let mut acc = 0f32;
                for b in 0..nb {
                    let s: i32 = (0..bl).map(|e| w.quant(c, b, e) * q.value(k, r0 + r, b * bl + e)).sum();
                    let t = s as f32 * q.sx[(r0 + r) * groups + b * bl / QK];
                    let (d, m) = w.scale_offset(c, b);
                    acc = d.mul_add(t, acc);
                    if w.offsets {
                        acc = m.mul_add(xs[r * nb + b], acc);
                    }
                }
                *out = acc;
            }
        }
    }
}

/// One SIMD implementation, compiled for the target features given.
macro_rules! simd_int {
    ($name:ident, $features:literal, $max_rows:literal, $vnni:literal) => {
        #[cfg(target_arch = "x86_64")]
        mod $name {
            use std::arch::x86_64::*;

            use super::super::kernel::{Acc, Walk};
            use super::super::{QKind, QMatrix, P, QK, TILE_PANELS};

            /// SAFETY (caller): the features are available; `q8` (4-, 5-, 6-bit weights) or `q16`
            /// (8-bit) holds `rr` rows of `k`, `sx` `rr` rows of `k / 32`, `s16` (6-bit) `rr` rows of
            /// `k / 16`, `xs` `rr` rows of `nb`, and panels `p0 .. p0 + TILE_PANELS` exist (checked
            /// in `run_int`).
            #[target_feature(enable = $features)]
            #[allow(clippy::too_many_arguments)]
            pub(super) unsafe fn dispatch(
                w: &QMatrix,
                p0: usize,
                q8: *const i8,
                q16: *const i16,
                sx: *const f32,
                s16: *const i32,
                xs: *const f32,
                hd: *const f32,
                rr: usize,
                walk: Walk,
                y: &mut Acc,
            ) {
                let y = y.as_mut_ptr();
                // One instantiation per weight kind, so each gets its own register allocation.
                // and per block length, so that the chunk loops unroll (constant shift counts, no
                // per-chunk branch: the 5-bit kernel was compute-bound with them)
                // and per head format: K-quant factors formed inline when no prepared heads are
                // given; prepared or plain heads loaded (the prefill path keeps its lean instance:
                // the inline factors' instance cost it ~7% on AVX2)
                let sub = w.sub.is_some() && hd.is_null();
                match (w.kind, w.bl, sub) {
                    (QKind::Q4, QK, false) => rows::<0, QK, false>(w, p0, q8, q16, sx, s16, xs, hd, rr, walk, y),
                    (QKind::Q4, QK, true) => rows::<0, QK, true>(w, p0, q8, q16, sx, s16, xs, hd, rr, walk, y),
                    (QKind::Q5, QK, false) => rows::<1, QK, false>(w, p0, q8, q16, sx, s16, xs, hd, rr, walk, y),
                    (QKind::Q5, QK, true) => rows::<1, QK, true>(w, p0, q8, q16, sx, s16, xs, hd, rr, walk, y),
                    (QKind::Q8, QK, false) => rows::<2, QK, false>(w, p0, q8, q16, sx, s16, xs, hd, rr, walk, y),
                    (QKind::Q8, QK, true) => rows::<2, QK, true>(w, p0, q8, q16, sx, s16, xs, hd, rr, walk, y),
                    (QKind::Q8, 16, false) => rows::<2, 16, false>(w, p0, q8, q16, sx, s16, xs, hd, rr, walk, y),
                    (QKind::Q8, 16, true) => rows::<2, 16, true>(w, p0, q8, q16, sx, s16, xs, hd, rr, walk, y),
                    (QKind::Q6, 16, false) => rows::<3, 16, false>(w, p0, q8, q16, sx, s16, xs, hd, rr, walk, y),
                    (QKind::Q6, 16, true) => rows::<3, 16, true>(w, p0, q8, q16, sx, s16, xs, hd, rr, walk, y),
                    (QKind::Q6x, 16, false) => rows::<4, 16, false>(w, p0, q8, q16, sx, s16, xs, hd, rr, walk, y),
                    (QKind::Q6x, 16, true) => rows::<4, 16, true>(w, p0, q8, q16, sx, s16, xs, hd, rr, walk, y),
                    (kind, bl, _) => unreachable!("no integer kernel for {kind:?} in blocks of {bl}"),
                }
            }

            /// `rr` rows of the tile for weight kind `K` (0: 4-bit, 1: 5-bit, 2: 8-bit, 3: 6-bit expanded
            /// to the 8-bit layout's bytes) in blocks of `BL`.
            #[target_feature(enable = $features)]
            #[allow(clippy::too_many_arguments)]
            unsafe fn rows<const K: u8, const BL: usize, const S: bool>(
                w: &QMatrix,
                p0: usize,
                q8: *const i8,
                q16: *const i16,
                sx: *const f32,
                s16: *const i32,
                xs: *const f32,
                hd: *const f32,
                rr: usize,
                walk: Walk,
                y: *mut [f32; P],
            ) {
                macro_rules! group {
                    ($r:literal) => {{
                        if K == 1 && $max_rows == 4 && $r >= 3 {
                            // 5-bit on 16 registers: one panel at a time (its 16-bit and widened sums
                            // would not fit for two)
                            if walk == Walk::Stream {
                                panels::<$r, 1, 4, K, BL, S>(w, p0, q8, q16, sx, s16, xs, hd, y)
                            } else {
                                for v in 0..TILE_PANELS {
                                    panels::<$r, 1, 1, K, BL, S>(w, p0 + v, q8, q16, sx, s16, xs, hd, y.add(v));
                                }
                            }
                        } else if walk == Walk::Stream {
                            panels::<$r, 2, 2, K, BL, S>(w, p0, q8, q16, sx, s16, xs, hd, y)
                        } else {
                            panels::<$r, 2, 1, K, BL, S>(w, p0, q8, q16, sx, s16, xs, hd, y);
                            panels::<$r, 2, 1, K, BL, S>(w, p0 + 2, q8, q16, sx, s16, xs, hd, y.add(2));
                        }
                    }};
                }
                match rr.min($max_rows) {
                    1 => panels::<1, 4, 1, K, BL, S>(w, p0, q8, q16, sx, s16, xs, hd, y),
                    2 => group!(2),
                    3 => group!(3),
                    4 => group!(4),
                    5 => group!(5),
                    6 => group!(6),
                    7 => group!(7),
                    _ => group!(8),
                }
            }

            /// `R` rows × the tile's `G · V` panels from panel `p0`, `V` panels at a time within each
            /// block: the records are read once, in their stored order (tile, block, panel), so the
            /// prefetch runs ahead of one stream (see `kernel::prefetch_ahead`). Bounds: panel
            /// `p0 + g·V + v < np` and block `b < nb` keep every record read inside `w`; row `r < R`
            /// reads inputs `r·k + b·bl + e`, `e < bl`.
            #[target_feature(enable = $features)]
            #[allow(clippy::too_many_arguments)]
            unsafe fn panels<
                const R: usize,
                const V: usize,
                const G: usize,
                const K: u8,
                const BL: usize,
                const S: bool,
            >(
                w: &QMatrix,
                p0: usize,
                q8: *const i8,
                q16: *const i16,
                sx: *const f32,
                s16: *const i32,
                xs: *const f32,
                hd: *const f32,
                y: *mut [f32; P],
            ) {
                let (k, nb, bl, groups) = (w.k, w.nb(), BL, w.k / QK);
                debug_assert_eq!(w.bl, BL);
                let (base, head, offsets) = (w.base(), w.head, w.offsets);
                let (q4, q5) = (K == 0, K == 1);
                let m4 = _mm256_set1_epi8(0x0F);
                let b4 = _mm256_set1_epi8(0x10);
                let ones = _mm256_set1_epi16(1);
                // Per 128-bit half: the 8 columns' bytes of two inputs, interleaved column by column.
                let pair = _mm256_setr_epi8(
                    0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15, 0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6,
                    14, 7, 15,
                );
                // Several rows on the AVX2 kernels: the outputs stay in registers over every block (the
                // same FMA sequence as through memory; 1.5B prefill +3% on AVX2 + AVX-VNNI). One row
                // keeps them in memory (its four panels' weights fill the registers), as do the 8-row
                // AVX-512 instances (not measured with it).
                let in_regs = R >= 2 && $max_rows == 4 && G == 1;
                let mut yr = [[_mm256_setzero_ps(); TILE_PANELS]; R];
                if in_regs {
                    for r in 0..R {
                        for v in 0..G * V {
                            yr[r][v] = _mm256_loadu_ps(y.add(r * TILE_PANELS + v) as *const f32);
                        }
                    }
                }
                for b in 0..nb {
                    // every call that starts a tile fetches ahead, as the 512-bit kernel does (with all four
                    // panels in registers too: single-stream decode streams each matrix once)
                    super::super::kernel::prefetch_ahead(w, p0, b);
                    for g in 0..G {
                        let pg = p0 + g * V;
                        let mut acc = [[_mm256_setzero_si256(); V]; R];
                        let mut qp = [std::ptr::null::<u8>(); V];
                        for (v, p) in qp.iter_mut().enumerate() {
                            *p = base.add(w.record(pg + v, b) + head);
                        }
                        if q4 || q5 {
                            // 5-bit: the high plane (see `QMatrix::q5_high_at`); chunk `c`'s fifth bits are
                            // bit `c` (low nibbles) and `4 + c` (high) of each byte, moved to bit 4. Their
                            // pair sums reach 2·31·127, so the 16-bit sums are widened every two chunks.
                            let mut hp = [_mm256_setzero_si256(); V];
                            let mut wide = [[_mm256_setzero_si256(); V]; R];
                            if q5 {
                                for v in 0..V {
                                    hp[v] = _mm256_loadu_si256(qp[v].add(128) as *const __m256i);
                                }
                            }
                            for c in 0..bl / 8 {
                                let mut lo = [_mm256_setzero_si256(); V];
                                let mut hi = [_mm256_setzero_si256(); V];
                                for v in 0..V {
                                    let raw = _mm256_loadu_si256(qp[v].add(32 * c) as *const __m256i);
                                    lo[v] = _mm256_and_si256(raw, m4);
                                    hi[v] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
                                    if q5 {
                                        let up = _mm256_sll_epi16(hp[v], _mm_cvtsi32_si128(4 - c as i32));
                                        let down = _mm256_srl_epi16(hp[v], _mm_cvtsi32_si128(c as i32));
                                        lo[v] = _mm256_or_si256(lo[v], _mm256_and_si256(up, b4));
                                        hi[v] = _mm256_or_si256(hi[v], _mm256_and_si256(down, b4));
                                    }
                                }
                                for r in 0..R {
                                    let xp = q8.add(r * k + b * bl + 8 * c);
                                    let xl = _mm256_set1_epi32((xp as *const i32).read_unaligned());
                                    let xh = _mm256_set1_epi32((xp.add(4) as *const i32).read_unaligned());
                                    for v in 0..V {
                                        if $vnni && q4 {
                                            // AVX-VNNI: the four products of a lane summed into 32 bits in
                                            // one instruction, no 16-bit stage to widen at the block's end
                                            acc[r][v] = _mm256_dpbusd_avx_epi32(acc[r][v], lo[v], xl);
                                            acc[r][v] = _mm256_dpbusd_avx_epi32(acc[r][v], hi[v], xh);
                                            continue;
                                        }
                                        let t = _mm256_add_epi16(
                                            _mm256_maddubs_epi16(lo[v], xl),
                                            _mm256_maddubs_epi16(hi[v], xh),
                                        );
                                        if q5 && R == 1 && $max_rows == 4 {
                                            // one row on 16 registers: widen every chunk, so that four
                                            // panels fit in one pass (no 16-bit sums kept; two passes of
                                            // two panels re-read each record group and were compute-bound:
                                            // Qwen2.5-0.5B's Q5_0 layers, single-stream decode 49 → 54
                                            // tok/s); the bits are the same either way
                                            wide[r][v] = _mm256_add_epi32(wide[r][v], _mm256_madd_epi16(t, ones));
                                        } else {
                                            acc[r][v] = _mm256_add_epi16(acc[r][v], t);
                                        }
                                    }
                                }
                                if q5 && !(R == 1 && $max_rows == 4) && c % 2 == 1 {
                                    for r in 0..R {
                                        for v in 0..V {
                                            let t = _mm256_madd_epi16(acc[r][v], ones);
                                            wide[r][v] = _mm256_add_epi32(wide[r][v], t);
                                            acc[r][v] = _mm256_setzero_si256();
                                        }
                                    }
                                }
                            }
                            for r in 0..R {
                                for v in 0..V {
                                    acc[r][v] = if q5 {
                                        wide[r][v]
                                    } else if $vnni {
                                        acc[r][v]
                                    } else {
                                        _mm256_madd_epi16(acc[r][v], ones)
                                    };
                                }
                            }
                        } else if K == 3 || K == 4 {
                            // 6-bit: the unsigned quants q + 32, four inputs of a column per lane, against
                            // the byte codes (`vpdpbusd`; without VNNI `vpmaddubsw` of two chunks, each
                            // pair at most 2 · 63 · 127, so the two chunks' sum fits 16 bits and is widened
                            // once: five instructions a row and panel for 64 products, not six), then
                            // 32 · Σ x of the block off
                            let load = |v: usize, c: usize| {
                                if K == 4 {
                                    _mm256_loadu_si256(qp[v].add(32 * c) as *const __m256i)
                                } else {
                                    super::super::six::grouped(qp[v], c)
                                }
                            };
                            for c in (0..bl / 4).step_by(2) {
                                let mut w0 = [_mm256_setzero_si256(); V];
                                let mut w1 = [_mm256_setzero_si256(); V];
                                for v in 0..V {
                                    w0[v] = load(v, c);
                                    w1[v] = load(v, c + 1);
                                }
                                for r in 0..R {
                                    let xp = q8.add(r * k + b * bl + 4 * c);
                                    let x0 = _mm256_set1_epi32((xp as *const i32).read_unaligned());
                                    let x1 = _mm256_set1_epi32((xp.add(4) as *const i32).read_unaligned());
                                    for v in 0..V {
                                        if $vnni {
                                            acc[r][v] = _mm256_dpbusd_avx_epi32(acc[r][v], w0[v], x0);
                                            acc[r][v] = _mm256_dpbusd_avx_epi32(acc[r][v], w1[v], x1);
                                            continue;
                                        }
                                        let t = _mm256_add_epi16(
                                            _mm256_maddubs_epi16(w0[v], x0),
                                            _mm256_maddubs_epi16(w1[v], x1),
                                        );
                                        acc[r][v] = _mm256_add_epi32(acc[r][v], _mm256_madd_epi16(t, ones));
                                    }
                                }
                            }
                            for r in 0..R {
                                let off = _mm256_set1_epi32(32 * *s16.add(r * (k / 16) + b * bl / 16));
                                for v in 0..V {
                                    acc[r][v] = _mm256_sub_epi32(acc[r][v], off);
                                }
                            }
                        } else {
                            for c in 0..bl / 4 {
                                let mut w01 = [_mm256_setzero_si256(); V];
                                let mut w23 = [_mm256_setzero_si256(); V];
                                for v in 0..V {
                                    let raw = _mm256_loadu_si256(qp[v].add(32 * c) as *const __m256i);
                                    let sh = _mm256_shuffle_epi8(raw, pair);
                                    w01[v] = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(sh));
                                    w23[v] = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(sh, 1));
                                }
                                for r in 0..R {
                                    let xp = q16.add(r * k + b * bl + 4 * c);
                                    let x01 = _mm256_set1_epi32((xp as *const i32).read_unaligned());
                                    let x23 = _mm256_set1_epi32((xp.add(2) as *const i32).read_unaligned());
                                    for v in 0..V {
                                        if $vnni {
                                            acc[r][v] = dpwssd!("{{vex}} ", ymm_reg, acc[r][v], w01[v], x01);
                                            acc[r][v] = dpwssd!("{{vex}} ", ymm_reg, acc[r][v], w23[v], x23);
                                            continue;
                                        }
                                        let t = _mm256_add_epi32(
                                            _mm256_madd_epi16(w01[v], x01),
                                            _mm256_madd_epi16(w23[v], x23),
                                        );
                                        acc[r][v] = _mm256_add_epi32(acc[r][v], t);
                                    }
                                }
                            }
                        }
                        for v in 0..V {
                            let (dv, mv) = if S {
                                super::super::heads::factors8_inline(w, pg + v, b)
                            } else {
                                super::super::heads::dm8(w, qp[v].sub(head), pg + v, b, hd)
                            };
                            for r in 0..R {
                                let yp = y.add(r * TILE_PANELS + g * V + v) as *mut f32;
                                let sxv = _mm256_broadcast_ss(&*sx.add(r * groups + b * bl / QK));
                                let t = _mm256_mul_ps(_mm256_cvtepi32_ps(acc[r][v]), sxv);
                                let prev = if in_regs {
                                    yr[r][g * V + v]
                                } else {
                                    _mm256_loadu_ps(yp)
                                };
                                let u = _mm256_fmadd_ps(dv, t, prev);
                                let u = if offsets {
                                    _mm256_fmadd_ps(mv, _mm256_broadcast_ss(&*xs.add(r * nb + b)), u)
                                } else {
                                    u
                                };
                                if in_regs {
                                    yr[r][g * V + v] = u;
                                } else {
                                    _mm256_storeu_ps(yp, u);
                                }
                            }
                        }
                    }
                }
                if in_regs {
                    for r in 0..R {
                        for v in 0..G * V {
                            _mm256_storeu_ps(y.add(r * TILE_PANELS + v) as *mut f32, yr[r][v]);
                        }
                    }
                }
            }
        }
    };
}

simd_int!(avx2, "avx2,fma,f16c", 4, false);
simd_int!(avx2_vnni, "avx2,fma,f16c,avxvnni", 4, true);
simd_int!(avx512, "avx512f,avx512vl,avx2,fma,f16c", 8, false);

/// Whether the AVX2 path takes `avx2_vnni` (hosts with AVX-VNNI but no AVX-512, such as Intel's client
/// cores since Alder Lake): the 4-bit kernel's `vpmaddubsw` + two 16-bit adds per chunk and the block's
/// widening become two `vpdpbusd`, the same integer sums. `KVGATE_NO_VNNI` turns it off (as it does the
/// 512-bit VNNI kernel), which is how an AVX2 host without VNNI is measured on one with it.
#[cfg(target_arch = "x86_64")]
static AVX_VNNI: std::sync::LazyLock<bool> = std::sync::LazyLock::new(|| {
    std::env::var_os("KVGATE_NO_VNNI").is_none() && std::arch::is_x86_feature_detected!("avxvnni")
});

/// Whether this machine's AVX-512 path takes the VNNI kernel (`kernel_zmm`: 512-bit registers,
/// `vpdpbusd`/`vpdpwssd`, the same integer sums; detected once, `KVGATE_NO_VNNI` turns it off).
#[cfg(target_arch = "x86_64")]
static VNNI: std::sync::LazyLock<bool> =
    std::sync::LazyLock::new(|| std::env::var_os("KVGATE_NO_VNNI").is_none() && super::kernel_zmm::available());
