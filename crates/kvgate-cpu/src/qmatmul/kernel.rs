//! The panel microkernel of [`super::QMatrix::matmul`]: for a group of rows and the [`TILE_PANELS`]
//! panels of one task, every output as the fixed sequence of f32 operations the module doc defines.
//! Three implementations of that one sequence: AVX2 (16 registers: up to 4 rows × 2 panels of
//! accumulators), AVX-512 (`kernel_wide`: 512-bit registers, up to 8 rows × 4 panels), chosen once at
//! run time, and a portable scalar loop. Each lane of a vector is one output's own chain, so
//! the vector width and the register blocking change the speed, never the bits.

use super::{QKind, QMatrix, P, TILE_PANELS};

/// The most rows one call takes on any path (the size of the caller's accumulator array).
pub(super) const MAX_ROWS: usize = 8;

/// The instruction set this machine's calls take (detected once at run time, so a build without
/// `-C target-feature` flags still takes the SIMD path; a machine always takes the same path).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Path {
    Avx512,
    Avx2,
    Scalar,
}

pub(super) static PATH: std::sync::LazyLock<Path> = std::sync::LazyLock::new(|| {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx2") && has!("fma") && has!("f16c") {
            if std::env::var_os("KVGATE_NO_AVX512").is_none() && has!("avx512f") && has!("avx512vl") {
                return Path::Avx512;
            }
            return Path::Avx2;
        }
    }
    Path::Scalar
});

/// Rows per call on this machine's path.
pub(super) fn max_rows() -> usize {
    match *PATH {
        Path::Avx512 => 8,
        Path::Avx2 => 4,
        Path::Scalar => 8,
    }
}

/// Whether long calls on this path expand each tile's K-quant factors once ([`QMatrix::expand_heads`])
/// for its kernels to load: only the AVX2 kernels (4 rows a call) gain from it. The 8-row AVX-512
/// kernels form the factors as fast as they would load them, and the expanded heads (3.4 MB for a
/// 8960 × 1536 matrix) only add traffic; the scalar kernel reads the records' own. Qwen2.5-Coder-1.5B,
/// one forward pass of 96 / 256 / 512 rows, 2 cores, Intel Xeon, expanded → not, ms: AVX-512 VNNI
/// 566 / 1,420 / 2,955 → 505 / 1,296 / 2,885; AVX-512 without VNNI 942 / 2,468 / 4,986 → 884 / 2,379
/// / 4,884; exact rows 1,006 / 2,611 → 967 / 2,602; AVX2 + AVX-VNNI 2,250 / 4,628 → 2,481 / 5,208
/// at 256 / 512 (kept).
pub(super) fn prepared_heads_pay() -> bool {
    *PATH == Path::Avx2
}

/// Whether long calls on this path widen each 6-bit tile once for its integer rows
/// ([`QMatrix::tile_as_bytes`]) instead of each kernel call expanding it: only the AVX2 kernels (4
/// rows a call) gain. A 65536 × 1024 Q6_K matrix, 512 rows, 2 cores, Intel Xeon, widened → not, ms:
/// AVX2 + AVX-VNNI 281 / 264 → 296 / 297, AVX2 361 / 355 → 393 / 420; AVX-512 VNNI 173 / 177 →
/// 174 / 167 (its 8-row calls expand a chunk for 16 `vpdpbusd`; the wider records only add traffic).
pub(super) fn widened_bytes_pay() -> bool {
    *PATH == Path::Avx2
}

/// How a kernel call whose registers hold two of a tile's four panels walks the tile's records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Walk {
    /// Once, block by block, each block's panels in their stored order: the prefetch runs ahead of one
    /// stream (a decode step's few rows: the tile comes from memory; see [`prefetch_ahead`]).
    Stream,
    /// Two passes of two panels each: a prefill's call, whose tile every row group but the first finds
    /// in cache; the loop body half the size measured faster there (AVX2 integer rows, SmolLM2
    /// prefill, one pass → two: 724–780 → 814–842 tok/s, 1.5B: 76.4 → 79.0).
    Cached,
}

/// Accumulators of one call: `[row][panel]`, row stride [`TILE_PANELS`].
pub(super) type Acc = [[f32; P]; MAX_ROWS * TILE_PANELS];

/// Outputs of rows `0..rr` (at most [`max_rows`]) of `x` (`rr × k`, block sums `xs`: `rr × k/32`) for
/// panels `p0 .. p0 + TILE_PANELS`, written to `y` (which must start at zero).
/// `heads`: the tile's scales and offsets as [`QMatrix::expand_heads`] gives them, read instead of the
/// records' (the same values). `walk`: see [`Walk`] (the same bits either way).
#[allow(clippy::too_many_arguments)]
pub(super) fn run(
    w: &QMatrix,
    p0: usize,
    x: &[f32],
    xs: &[f32],
    heads: Option<&[f32]>,
    rr: usize,
    walk: Walk,
    y: &mut Acc,
) {
    assert!(rr >= 1 && rr <= max_rows() && x.len() >= rr * w.k && xs.len() >= rr * w.nb());
    assert!(p0 + TILE_PANELS <= w.np);
    assert!(w.kind != QKind::Q6 || w.bl == 16, "6-bit records hold blocks of 16");
    assert!(w.kind != QKind::Q6x, "widened 6-bit tiles are for the integer kernel");
    let hd = w.heads_ptr(heads);
    match *PATH {
        // SAFETY: the features were detected at run time (`PATH`); bounds as asserted above and
        // argued in `simd!`.
        #[cfg(target_arch = "x86_64")]
        Path::Avx512 => unsafe { super::kernel_wide::dispatch(w, p0, x.as_ptr(), xs.as_ptr(), hd, rr, y) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 => unsafe { avx2::dispatch(w, p0, x.as_ptr(), xs.as_ptr(), hd, rr, walk, y) },
        _ => {
            let _ = (hd, walk); // the scalar kernel reads the records' own heads, its tile once
            scalar(w, p0, x, xs, rr, y)
        }
    }
}

/// [`run`] on every SIMD kernel this machine has (AVX2, AVX-512), each by name: the tests hold each
/// to the scalar kernel's bits whichever path this machine's calls take, so a change to one ISA's
/// kernel is caught on a host that has both.
#[cfg(test)]
pub(super) fn run_each(
    w: &QMatrix,
    p0: usize,
    x: &[f32],
    xs: &[f32],
    heads: Option<&[f32]>,
    rr: usize,
) -> Vec<(&'static str, Acc)> {
    let mut out = vec![];
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        assert!(x.len() >= rr * w.k && xs.len() >= rr * w.nb() && p0 + TILE_PANELS <= w.np);
        let hd = w.heads_ptr(heads);
        let zero = || -> Acc { [[0.0; P]; MAX_ROWS * TILE_PANELS] };
        if has!("avx2") && has!("fma") && has!("f16c") && rr <= 4 {
            for (walk, name) in [(Walk::Stream, "avx2"), (Walk::Cached, "avx2, two passes")] {
                let mut y = zero();
                // SAFETY: features detected just above; bounds as `run` asserts (checked above).
                unsafe { avx2::dispatch(w, p0, x.as_ptr(), xs.as_ptr(), hd, rr, walk, &mut y) };
                out.push((name, y));
            }
        }
        if has!("avx2") && has!("fma") && has!("f16c") && has!("avx512f") && has!("avx512vl") {
            let mut y = zero();
            // SAFETY: as above.
            unsafe { super::kernel_wide::dispatch(w, p0, x.as_ptr(), xs.as_ptr(), hd, rr, &mut y) };
            out.push(("avx512", y));
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (w, p0, x, xs, heads, rr);
    out
}

/// The portable kernel: the same operations in the same order as the SIMD ones (what a CPU without
/// AVX2/FMA/F16C runs, and the tests' reference).
pub(super) fn scalar(w: &QMatrix, p0: usize, x: &[f32], xs: &[f32], rr: usize, y: &mut Acc) {
    let (k, nb, bl) = (w.k, w.nb(), w.bl);
    for r in 0..rr {
        for v in 0..TILE_PANELS {
            for (j, out) in y[r * TILE_PANELS + v].iter_mut().enumerate() {
                let c = (p0 + v) * P + j;
                let mut acc = 0f32;
                for b in 0..nb {
                    let mut s = 0f32;
                    for e in 0..bl {
                        s = w.weight(c, b, e).mul_add(x[r * k + b * bl + e], s);
                    }
                    let (d, m) = w.scale_offset(c, b);
                    acc = d.mul_add(s, acc);
                    if w.offsets {
                        acc = m.mul_add(xs[r * nb + b], acc);
                    }
                }
                *out = acc;
            }
        }
    }
}

/// Record groups (one block of all a tile's panels) ahead that [`prefetch_ahead`] fetches.
const AHEAD: usize = 16;

/// A kernel call that starts at a tile's first panel fetches ahead: the whole record group `AHEAD`
/// groups past block `b` (at single-stream decode on the AVX2 path, Qwen2.5-0.5B: integer kernel 41.7 →
/// 49.2 tok/s, f32 kernel 25.6 → 36 tok/s). The kernels walk a tile's records once, block by block,
/// each block's panels in their stored order (several at a time where registers hold fewer than
/// four), so the fetches run ahead of one stream: two passes of two panels each, as they were, read
/// every other half-group from memory and left it idle during the second pass (from DRAM, AVX2
/// integer rows, Q4_K 0.64 GB, ms: 2 / 4 rows 34.2–34.8 → 28.7–29.0, 43.1–43.6 → 37.1–41.0; one row
/// 26–28 either way). A prefill's
/// calls still make two passes ([`Walk::Cached`]: their tile is in cache, and a second pass at panel 2
/// fetches nothing). The records are stored tile after tile, so near a tile's end the
/// groups fetched are the next tile's first ones: a task that goes on to the next tile (rayon hands a
/// thread consecutive tiles) finds them on its way instead of waiting for memory at each tile's start
/// (a Q8_0 896-input tile is only 28 groups). Into L2 (`T1`): an L1 prefetch holds one of the core's
/// few L1 miss buffers (Qwen2.5 decode ~6% faster on AMD Zen 4).
#[inline]
pub(super) fn prefetch_ahead(w: &QMatrix, p0: usize, b: usize) {
    #[cfg(target_arch = "x86_64")]
    if p0.is_multiple_of(TILE_PANELS) {
        // The group `AHEAD` blocks on (past the tile's end: the next tile's, as `record` extends), with
        // the K-quant header in front of it when it starts a super-block.
        let ahead = b + AHEAD;
        let (from, group) = match w.sub {
            // the kernel's own `record(p0, b)` and a constant: the plain formats' records are uniform
            None => (w.record(p0, b) + AHEAD * TILE_PANELS * w.rec, TILE_PANELS * w.rec),
            Some(g) => {
                let header = if ahead.trailing_zeros() >= g { w.sh } else { 0 };
                (w.record(p0, ahead) - header, TILE_PANELS * w.rec + header)
            }
        };
        if from + group <= w.data.len() * 64 {
            let at = w.base().wrapping_add(from);
            for line in (0..group).step_by(64) {
                // SAFETY: a prefetch never faults; the addresses are inside `w`'s records anyway.
                unsafe {
                    std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(
                        at.wrapping_add(line) as *const i8
                    )
                };
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (w, p0, b);
}

/// One SIMD implementation, compiled for the target features given.
macro_rules! simd {
    ($name:ident, $features:literal, $max_rows:literal) => {
        #[cfg(target_arch = "x86_64")]
        mod $name {
            use std::arch::x86_64::*;

            use super::{Acc, QKind, QMatrix, Walk, P, TILE_PANELS};

            /// SAFETY (caller): the features are available; `x` holds `rr` rows of `k`, `xs` `rr` rows of
            /// `k / 32`, and panels `p0 .. p0 + TILE_PANELS` exist (checked in `run`).
            #[target_feature(enable = $features)]
            #[allow(clippy::too_many_arguments)]
            pub(super) unsafe fn dispatch(
                w: &QMatrix,
                p0: usize,
                x: *const f32,
                xs: *const f32,
                hd: *const f32,
                rr: usize,
                walk: Walk,
                y: &mut Acc,
            ) {
                let y = y.as_mut_ptr();
                macro_rules! pairs {
                    ($r:literal) => {{
                        if walk == Walk::Stream {
                            panels::<$r, 2, 2>(w, p0, x, xs, hd, y)
                        } else {
                            panels::<$r, 2, 1>(w, p0, x, xs, hd, y);
                            panels::<$r, 2, 1>(w, p0 + 2, x, xs, hd, y.add(2));
                        }
                    }};
                }
                match rr.min($max_rows) {
                    1 => panels::<1, 4, 1>(w, p0, x, xs, hd, y),
                    2 => pairs!(2),
                    3 => pairs!(3),
                    4 => pairs!(4),
                    5 => pairs!(5),
                    6 => pairs!(6),
                    7 => pairs!(7),
                    _ => pairs!(8),
                }
            }

            /// `R` rows × the tile's `G · V` panels from panel `p0`, `V` at a time within each block
            /// (the records read once, in their stored order, as `kernel_int`'s do); accumulators
            /// `y[r · TILE_PANELS + v]`. Bounds: panel `p0 + v < np`, block `b < nb`, so every quant,
            /// scale and offset read is inside `w`'s vectors; row `r < R ≤ rr` reads `x[r·k + b·32 + e]`
            /// with `e < 32`.
            #[target_feature(enable = $features)]
            unsafe fn panels<const R: usize, const V: usize, const G: usize>(
                w: &QMatrix,
                p0: usize,
                x: *const f32,
                xs: *const f32,
                hd: *const f32,
                y: *mut [f32; P],
            ) {
                let (k, nb, bl) = (w.k, w.nb(), w.bl);
                let mask = _mm256_set1_epi32(0x0F);
                let (byte, bias) = (_mm256_set1_epi32(0xFF), _mm256_set1_epi32(32));
                let (q4, q5) = (w.kind == QKind::Q4, w.kind == QKind::Q5);
                let b4 = _mm256_set1_epi32(0x10);
                let (base, head, offsets) = (w.base(), w.head, w.offsets);
                for b in 0..nb {
                    // every call that starts a tile fetches ahead (all four panels in registers too), as the
                    // integer and 512-bit kernels do
                    super::prefetch_ahead(w, p0, b);
                    for grp in 0..G {
                        let (pg, yg) = (p0 + grp * V, y.add(grp * V));
                        let mut s = [[_mm256_setzero_ps(); V]; R];
                        let mut qp = [std::ptr::null::<u8>(); V];
                        for (v, p) in qp.iter_mut().enumerate() {
                            *p = base.add(w.record(pg + v, b) + head);
                        }
                        let xb = x.add(b * bl);
                        if q4 || q5 {
                            // One 32-byte chunk per 8 inputs (see `QMatrix::q4_at`): input `8c + e` of the
                            // 8 columns is one shift and mask of the chunk's lanes; a 5-bit quant's fifth
                            // bit (`QMatrix::q5_high_at`) one more shift and mask of the high plane.
                            let mut hp = [_mm256_setzero_si256(); V];
                            if q5 {
                                for v in 0..V {
                                    hp[v] = _mm256_loadu_si256(qp[v].add(128) as *const __m256i);
                                }
                            }
                            for c in 0..bl / 8 {
                                let mut wv = [_mm256_setzero_si256(); V];
                                for v in 0..V {
                                    wv[v] = _mm256_loadu_si256(qp[v].add(32 * c) as *const __m256i);
                                }
                                for e in 0..8 {
                                    let sh = _mm_cvtsi32_si128((8 * (e % 4) + 4 * (e / 4)) as i32);
                                    // the fifth bit's position in the lane
                                    let at = (8 * (e % 4) + c + 4 * (e / 4)) as i32;
                                    let mut q = [_mm256_setzero_ps(); V];
                                    for v in 0..V {
                                        let mut qi = _mm256_and_si256(_mm256_srl_epi32(wv[v], sh), mask);
                                        if q5 {
                                            let h = if at >= 4 {
                                                _mm256_srl_epi32(hp[v], _mm_cvtsi32_si128(at - 4))
                                            } else {
                                                _mm256_sll_epi32(hp[v], _mm_cvtsi32_si128(4 - at))
                                            };
                                            qi = _mm256_or_si256(qi, _mm256_and_si256(h, b4));
                                        }
                                        q[v] = _mm256_cvtepi32_ps(qi);
                                    }
                                    for r in 0..R {
                                        let xv = _mm256_broadcast_ss(&*xb.add(r * k + 8 * c + e));
                                        for v in 0..V {
                                            s[r][v] = _mm256_fmadd_ps(q[v], xv, s[r][v]);
                                        }
                                    }
                                }
                            }
                        } else if w.kind == QKind::Q6 {
                            // 6-bit: each chunk expanded in registers (`six::grouped`: input `4c + t` of a
                            // column is byte t of its lane), each input its byte (a shift by 8t and a
                            // mask, as needed) less 32 — the 8-bit layout's values in the same order, so
                            // its bits (vector shifts share their ports with the FMAs: one at most)
                            for c in 0..bl / 4 {
                                let mut g = [_mm256_setzero_si256(); V];
                                for v in 0..V {
                                    g[v] = super::super::six::grouped(qp[v], c);
                                }
                                for t in 0..4 {
                                    let mut q = [_mm256_setzero_ps(); V];
                                    for v in 0..V {
                                        let qi = match t {
                                            0 => _mm256_and_si256(g[v], byte),
                                            1 => _mm256_and_si256(_mm256_srli_epi32::<8>(g[v]), byte),
                                            2 => _mm256_and_si256(_mm256_srli_epi32::<16>(g[v]), byte),
                                            _ => _mm256_srli_epi32::<24>(g[v]),
                                        };
                                        q[v] = _mm256_cvtepi32_ps(_mm256_sub_epi32(qi, bias));
                                    }
                                    for r in 0..R {
                                        let xv = _mm256_broadcast_ss(&*xb.add(r * k + 4 * c + t));
                                        for v in 0..V {
                                            s[r][v] = _mm256_fmadd_ps(q[v], xv, s[r][v]);
                                        }
                                    }
                                }
                            }
                        } else if w.kind == QKind::Q8 {
                            for e in 0..bl {
                                let mut q = [_mm256_setzero_ps(); V];
                                for v in 0..V {
                                    let raw = _mm_loadl_epi64(qp[v].add(e * P) as *const __m128i);
                                    q[v] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(raw));
                                }
                                for r in 0..R {
                                    let xv = _mm256_broadcast_ss(&*xb.add(r * k + e));
                                    for v in 0..V {
                                        s[r][v] = _mm256_fmadd_ps(q[v], xv, s[r][v]);
                                    }
                                }
                            }
                        } else {
                            // 16-bit floats: 8 columns' weights at one input are 16 bytes.
                            let f16 = w.kind == QKind::F16;
                            for e in 0..bl {
                                let mut q = [_mm256_setzero_ps(); V];
                                for v in 0..V {
                                    let raw = _mm_loadu_si128(qp[v].add(2 * e * P) as *const __m128i);
                                    q[v] = if f16 {
                                        _mm256_cvtph_ps(raw)
                                    } else {
                                        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16))
                                    };
                                }
                                for r in 0..R {
                                    let xv = _mm256_broadcast_ss(&*xb.add(r * k + e));
                                    for v in 0..V {
                                        s[r][v] = _mm256_fmadd_ps(q[v], xv, s[r][v]);
                                    }
                                }
                            }
                        }
                        for v in 0..V {
                            let (dv, mv) = super::super::heads::dm8(w, qp[v].sub(head), pg + v, b, hd);
                            if offsets {
                                for r in 0..R {
                                    let yp = yg.add(r * TILE_PANELS + v) as *mut f32;
                                    let xsv = _mm256_broadcast_ss(&*xs.add(r * nb + b));
                                    let t = _mm256_fmadd_ps(dv, s[r][v], _mm256_loadu_ps(yp));
                                    _mm256_storeu_ps(yp, _mm256_fmadd_ps(mv, xsv, t));
                                }
                            } else {
                                for r in 0..R {
                                    let yp = yg.add(r * TILE_PANELS + v) as *mut f32;
                                    _mm256_storeu_ps(yp, _mm256_fmadd_ps(dv, s[r][v], _mm256_loadu_ps(yp)));
                                }
                            }
                        }
                    }
                }
            }
        }
    };
}

simd!(avx2, "avx2,fma,f16c", 4);
