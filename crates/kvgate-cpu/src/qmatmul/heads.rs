//! A record's scales and offsets as f32 vectors for the SIMD kernels, whatever the head format: f16 or
//! f32 values in the record, offsets implied (`ratio · d`), or K-quant factors (8-bit integers times
//! f32 super-block factors, both in the tile's header, see `QMatrix::sub`). Each format
//! gives exactly the f32 the loader's value was, so a kernel's bits never depend on it.

use std::arch::x86_64::*;

use super::{QMatrix, HEADS, P, TILE_PANELS};

/// The scales and offsets (zero without offsets) of panel `p`'s 8 columns in block `b`, from `hd`
/// (the tile's [`QMatrix::expand_heads`]) unless it is null.
/// SAFETY (caller): avx2, fma and f16c available; panel `p` and block `b` exist, `rec` is
/// `w.base() + w.record(p, b)`, and `hd` is null or holds the tile's expanded heads.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dm8(w: &QMatrix, rec: *const u8, p: usize, b: usize, hd: *const f32) -> (__m256, __m256) {
    // SAFETY: the record's head and (with `sub`) the tile's header are inside `w`, and `hd` holds
    // block `b`'s (by the caller).
    unsafe {
        if w.sub.is_none() {
            let load = |at: *const u8| {
                if w.half {
                    _mm256_cvtph_ps(_mm_loadu_si128(at as *const __m128i))
                } else {
                    _mm256_loadu_ps(at as *const f32)
                }
            };
            let d = load(rec);
            let m = match (w.offsets, w.ratio) {
                (false, _) => _mm256_setzero_ps(),
                (true, None) => load(rec.add(if w.half { 16 } else { 32 })),
                (true, Some(r)) => _mm256_mul_ps(d, _mm256_set1_ps(r)),
            };
            return (d, m);
        }
        if !hd.is_null() {
            let at = hd.add(b * HEADS + P * (p % TILE_PANELS));
            let m = if w.offsets {
                _mm256_loadu_ps(at.add(HEADS / 2))
            } else {
                _mm256_setzero_ps()
            };
            return (_mm256_loadu_ps(at), m);
        }
        factors8(w, p, b)
    }
}

/// [`dm8`] of panels `p0 + 2h` and `p0 + 2h + 1` side by side, for the 512-bit kernels.
/// SAFETY (caller): avx512f, avx2, fma and f16c available; `tile` is `w.base() + w.record(p0, b)`,
/// panels `p0 .. p0 + TILE_PANELS` exist, and `hd` is as [`dm8`]'s.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(super) unsafe fn pair_dm(
    w: &QMatrix,
    tile: *const u8,
    p0: usize,
    b: usize,
    h: usize,
    hd: *const f32,
) -> (__m512, __m512) {
    let join = |a: __m256, c: __m256| {
        _mm512_castpd_ps(_mm512_insertf64x4::<1>(
            _mm512_castpd256_pd512(_mm256_castps_pd(a)),
            _mm256_castps_pd(c),
        ))
    };
    // SAFETY: a tile's records of one block are consecutive, `rec` bytes each, and with `sub` the two
    // panels' factors and integers are consecutive in the tile's header (by the caller).
    unsafe {
        if w.sub.is_none() {
            let (d0, m0) = dm8(w, tile.add(2 * h * w.rec), p0 + 2 * h, b, hd);
            let (d1, m1) = dm8(w, tile.add((2 * h + 1) * w.rec), p0 + 2 * h + 1, b, hd);
            return (join(d0, d1), join(m0, m1));
        }
        if !hd.is_null() {
            let at = hd.add(b * HEADS + 2 * h * P);
            let m = if w.offsets {
                _mm512_loadu_ps(at.add(HEADS / 2))
            } else {
                _mm512_setzero_ps()
            };
            return (_mm512_loadu_ps(at), m);
        }
        let ((f, i), (df, di)) = (w.factor_at(p0 + 2 * h, b, false), w.offset_factors());
        let product = |f: usize, i: usize| {
            let i = _mm_loadu_si128(w.base().add(i) as *const __m128i);
            _mm512_mul_ps(
                _mm512_loadu_ps(w.base().add(f) as *const f32),
                _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(i)),
            )
        };
        let m = if w.offsets {
            product(f + df, i + di)
        } else {
            _mm512_setzero_ps()
        };
        (product(f, i), m)
    }
}

/// [`dm8`] of a matrix with K-quant factors (the 512-bit kernels form both panels' at once in
/// [`pair_dm`]). Out of line, so the f32 kernels' inlined head load stays the plain formats' one.
/// SAFETY (caller): as [`dm8`], and `w.sub` is set.
#[inline(never)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn factors8(w: &QMatrix, p: usize, b: usize) -> (__m256, __m256) {
    // SAFETY: as the caller's.
    unsafe { factors8_inline(w, p, b) }
}

/// [`dm8`] of a matrix with K-quant factors (`w.sub` set) and no expanded heads, inlined: the body of
/// [`factors8`], which the integer kernels' K-quant instances (`kernel_int`: AVX2, AVX-VNNI, AVX-512
/// without VNNI) call directly — the call per panel and block was ~11% of a 1.5B decode step on AVX2
/// — while their plain formats' and prepared-heads instances keep their lean head load.
/// SAFETY (caller): as [`dm8`], and `w.sub` is set.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn factors8_inline(w: &QMatrix, p: usize, b: usize) -> (__m256, __m256) {
    let ((f, i), (df, di)) = (w.factor_at(p, b, false), w.offset_factors());
    let product = |f: usize, i: usize| {
        // SAFETY: both offsets are inside the tile's header (by the caller).
        unsafe {
            let i = _mm_loadl_epi64(w.base().add(i) as *const __m128i);
            _mm256_mul_ps(
                _mm256_loadu_ps(w.base().add(f) as *const f32),
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(i)),
            )
        }
    };
    let m = if w.offsets {
        product(f + df, i + di)
    } else {
        _mm256_setzero_ps()
    };
    (product(f, i), m)
}
