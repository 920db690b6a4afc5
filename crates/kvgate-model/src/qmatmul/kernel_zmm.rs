//! The integer microkernel for 4- and 5-bit weights in 512-bit registers (machines with AVX-512 VNNI):
//! two panels per register, so each weight unpack (`and`, shift, the 5-bit plane) and each `vpdpbusd`
//! covers 16 columns instead of 8 — half the instructions per multiply of `kernel_int`'s 256-bit
//! kernels, for prefill (up to 8 rows) and decode (1 row) alike.
//!
//! Guarantee: the same integer sums (exact in any order: four products per 32-bit lane, no saturation,
//! no 16-bit stage) and the same f32 sequence per block (`t = S · sx; y = fma(d, t, y); y = fma(m, X,
//! y)`, one lane per output) as `kernel_int`, so the same bits as its scalar kernel (tested).

use std::arch::x86_64::*;

use super::kernel::{prefetch_ahead, Acc};
use super::{QKind, QMatrix, P, QK, TILE_PANELS};

// A tile's four panels are two registers of sixteen columns.
const _: () = assert!(TILE_PANELS == 4 && P == 8);

/// The target features this kernel needs (all detected by the caller).
pub(super) fn available() -> bool {
    use std::arch::is_x86_feature_detected as has;
    has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512vnni") && has!("f16c")
}

/// SAFETY (caller): [`available`]; `w` is 4- or 5-bit; `q8` holds `rr` rows of `k` activation codes,
/// `sx` `rr` rows of `k / 32` scales, `xs` `rr` rows of `nb` block sums; panels `p0 .. p0 +
/// TILE_PANELS` exist (as `kernel_int::run_int` checks).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn dispatch(
    w: &QMatrix,
    p0: usize,
    q8: *const i8,
    sx: *const f32,
    xs: *const f32,
    rr: usize,
    y: &mut Acc,
) {
    let y = y.as_mut_ptr();
    // SAFETY (all arms): as the caller guarantees.
    unsafe {
        match w.kind {
            QKind::Q4 => rows::<false>(w, p0, q8, sx, xs, rr, y),
            QKind::Q5 => rows::<true>(w, p0, q8, sx, xs, rr, y),
            _ => unreachable!("the 512-bit kernel takes 4- and 5-bit weights only"),
        }
    }
}

/// SAFETY (caller): as [`dispatch`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn rows<const Q5: bool>(
    w: &QMatrix,
    p0: usize,
    q8: *const i8,
    sx: *const f32,
    xs: *const f32,
    rr: usize,
    y: *mut [f32; P],
) {
    // SAFETY (all arms): as the caller guarantees.
    unsafe {
        match rr.min(8) {
            1 => panels::<1, Q5>(w, p0, q8, sx, xs, y),
            2 => panels::<2, Q5>(w, p0, q8, sx, xs, y),
            3 => panels::<3, Q5>(w, p0, q8, sx, xs, y),
            4 => panels::<4, Q5>(w, p0, q8, sx, xs, y),
            5 => panels::<5, Q5>(w, p0, q8, sx, xs, y),
            6 => panels::<6, Q5>(w, p0, q8, sx, xs, y),
            7 => panels::<7, Q5>(w, p0, q8, sx, xs, y),
            _ => panels::<8, Q5>(w, p0, q8, sx, xs, y),
        }
    }
}

/// `R` rows × the tile's four panels from `p0`. Bounds: panels `p0 .. p0 + 4` and blocks `b < nb`
/// keep every record read inside `w`; row `r < R` reads inputs `r·k + b·bl + e`, `e < bl`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn panels<const R: usize, const Q5: bool>(
    w: &QMatrix,
    p0: usize,
    q8: *const i8,
    sx: *const f32,
    xs: *const f32,
    y: *mut [f32; P],
) {
    let (k, nb, bl, groups) = (w.k, w.nb(), w.bl, w.k / QK);
    let (base, head, half, offsets, rec) = (w.base(), w.head, w.half, w.offsets, w.rec);
    let m4 = _mm512_set1_epi8(0x0F);
    let b4 = _mm512_set1_epi8(0x10);
    for b in 0..nb {
        prefetch_ahead(w, p0, 0, b);
        // The tile's four records of block `b` are consecutive, `rec` bytes each.
        // SAFETY: inside `w` (the caller's bounds).
        let tile = unsafe { base.add(w.record(p0, b)) };
        // Bytes `off ..+32` of the quantized data of panels 2h and 2h + 1, side by side.
        let pair = |h: usize, off: usize| -> __m512i {
            // SAFETY: `off + 32` stays inside a record's data (4-bit: 128 bytes, 5-bit: 160).
            unsafe {
                let a = _mm256_loadu_si256(tile.add(2 * h * rec + head + off) as *const __m256i);
                let c = _mm256_loadu_si256(tile.add((2 * h + 1) * rec + head + off) as *const __m256i);
                _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a), c)
            }
        };
        let mut acc = [[_mm512_setzero_si512(); 2]; R];
        // 5-bit: the high plane (see `QMatrix::q5_high_at`); chunk `c`'s fifth bits are bit `c` (low
        // nibbles) and `4 + c` (high) of each byte, moved to bit 4.
        let hp = if Q5 {
            [pair(0, 128), pair(1, 128)]
        } else {
            [_mm512_setzero_si512(); 2]
        };
        for c in 0..bl / 8 {
            let mut lo = [_mm512_setzero_si512(); 2];
            let mut hi = [_mm512_setzero_si512(); 2];
            for h in 0..2 {
                let raw = pair(h, 32 * c);
                lo[h] = _mm512_and_si512(raw, m4);
                hi[h] = _mm512_and_si512(_mm512_srli_epi16::<4>(raw), m4);
                if Q5 {
                    let up = _mm512_sll_epi16(hp[h], _mm_cvtsi32_si128(4 - c as i32));
                    let down = _mm512_srl_epi16(hp[h], _mm_cvtsi32_si128(c as i32));
                    lo[h] = _mm512_or_si512(lo[h], _mm512_and_si512(up, b4));
                    hi[h] = _mm512_or_si512(hi[h], _mm512_and_si512(down, b4));
                }
            }
            for (r, a) in acc.iter_mut().enumerate() {
                // SAFETY: row r's inputs b·bl + 8c .. + 8 (the caller's bounds).
                let (xl, xh) = unsafe {
                    let xp = q8.add(r * k + b * bl + 8 * c);
                    (
                        _mm512_set1_epi32((xp as *const i32).read_unaligned()),
                        _mm512_set1_epi32((xp.add(4) as *const i32).read_unaligned()),
                    )
                };
                for h in 0..2 {
                    a[h] = _mm512_dpbusd_epi32(a[h], lo[h], xl);
                    a[h] = _mm512_dpbusd_epi32(a[h], hi[h], xh);
                }
            }
        }
        for h in 0..2 {
            // The scales (and offsets) of panels 2h and 2h + 1, from their records' heads.
            let two = |at: usize| -> __m512 {
                let one = |p: *const u8| {
                    // SAFETY: a record's head holds 8 scales (then 8 offsets): f16 or f32.
                    unsafe {
                        if half {
                            _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
                        } else {
                            _mm256_loadu_ps(p as *const f32)
                        }
                    }
                };
                // SAFETY: both records are inside `w`.
                let (a, c) = unsafe { (one(tile.add(2 * h * rec + at)), one(tile.add((2 * h + 1) * rec + at))) };
                _mm512_castpd_ps(_mm512_insertf64x4::<1>(
                    _mm512_castpd256_pd512(_mm256_castps_pd(a)),
                    _mm256_castps_pd(c),
                ))
            };
            let dv = two(0);
            let mv = if offsets {
                two(if half { 16 } else { 32 })
            } else {
                _mm512_setzero_ps()
            };
            for (r, a) in acc.iter().enumerate() {
                // SAFETY: outputs of row r, panels 2h and 2h + 1 (16 consecutive floats of `y`);
                // scale and block sum of row r, block b.
                unsafe {
                    let yp = y.add(r * TILE_PANELS + 2 * h) as *mut f32;
                    let sxv = _mm512_set1_ps(*sx.add(r * groups + b * bl / QK));
                    let t = _mm512_mul_ps(_mm512_cvtepi32_ps(a[h]), sxv);
                    let u = _mm512_fmadd_ps(dv, t, _mm512_loadu_ps(yp));
                    let u = if offsets {
                        _mm512_fmadd_ps(mv, _mm512_set1_ps(*xs.add(r * nb + b)), u)
                    } else {
                        u
                    };
                    _mm512_storeu_ps(yp, u);
                }
            }
        }
    }
}
