//! The integer microkernel in 512-bit registers (machines with AVX-512 VNNI): two panels per register,
//! so each weight unpack (4-bit: `and`, shift, the 5-bit plane; 8-bit: byte shuffle, widening) and each
//! `vpdpbusd` / `vpdpwssd` covers 16 columns instead of 8 — half the instructions per multiply of
//! `kernel_int`'s 256-bit kernels, for prefill (up to 8 rows) and decode (1 row) alike.
//!
//! Guarantee: the same integer sums (exact in any order: four 8-bit or two 16-bit products per 32-bit
//! lane, no saturation, no 16-bit stage) and the same f32 sequence per block (`t = S · sx; y = fma(d, t, y); y = fma(m, X,
//! y)`, one lane per output) as `kernel_int`, so the same bits as its scalar kernel (tested).

use std::arch::x86_64::*;

use super::heads::pair_dm;
use super::kernel::{prefetch_ahead, Acc};
use super::kernel_wide::pair_bytes;
use super::six;
use super::{QKind, QMatrix, P, QK, TILE_PANELS};

// A tile's four panels are two registers of sixteen columns.
const _: () = assert!(TILE_PANELS == 4 && P == 8);

/// The target features this kernel needs (all detected by the caller).
pub(super) fn available() -> bool {
    use std::arch::is_x86_feature_detected as has;
    has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512vnni") && has!("f16c")
}

/// SAFETY (caller): [`available`]; `q8` (4/5/6-bit weights) or `q16` (8-bit) holds `rr` rows of `k` activation codes,
/// `sx` `rr` rows of `k / 32` scales, `s16` (6-bit) `rr` rows of `k / 16` code sums, `xs` `rr` rows of
/// `nb` block sums; panels `p0 .. p0 + TILE_PANELS` exist (as `kernel_int::run_int` checks).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
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
    y: &mut Acc,
) {
    let y = y.as_mut_ptr();
    // One instantiation per weight kind and block length: the chunk loops unroll (constant shifts,
    // the 6-bit plane loaded once a block instead of a jump table per chunk).
    // SAFETY (all arms): as the caller guarantees.
    unsafe {
        match (w.kind, w.bl) {
            (QKind::Q4, QK) => rows::<0, QK>(w, p0, q8, q16, sx, s16, xs, hd, rr, y),
            (QKind::Q5, QK) => rows::<1, QK>(w, p0, q8, q16, sx, s16, xs, hd, rr, y),
            (QKind::Q8, QK) => rows::<2, QK>(w, p0, q8, q16, sx, s16, xs, hd, rr, y),
            (QKind::Q8, 16) => rows::<2, 16>(w, p0, q8, q16, sx, s16, xs, hd, rr, y),
            (QKind::Q6, 16) => rows::<3, 16>(w, p0, q8, q16, sx, s16, xs, hd, rr, y),
            (QKind::Q6x, 16) => rows::<4, 16>(w, p0, q8, q16, sx, s16, xs, hd, rr, y),
            (kind, bl) => unreachable!("no integer kernel for {kind:?} in blocks of {bl}"),
        }
    }
}

/// SAFETY (caller): as [`dispatch`]. Out of line: one function per weight kind with its own register
/// allocation, as the compiler laid it out before the head loads moved to `heads` (after that move it
/// inlined all three into `dispatch`; prefill A/Bs then read a few percent slower, within this VM's noise).
#[inline(never)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn rows<const K: u8, const BL: usize>(
    w: &QMatrix,
    p0: usize,
    q8: *const i8,
    q16: *const i16,
    sx: *const f32,
    s16: *const i32,
    xs: *const f32,
    hd: *const f32,
    rr: usize,
    y: *mut [f32; P],
) {
    // SAFETY (all arms): as the caller guarantees.
    unsafe {
        match rr.min(8) {
            1 => panels::<1, K, BL>(w, p0, q8, q16, sx, s16, xs, hd, y),
            2 => panels::<2, K, BL>(w, p0, q8, q16, sx, s16, xs, hd, y),
            3 => panels::<3, K, BL>(w, p0, q8, q16, sx, s16, xs, hd, y),
            4 => panels::<4, K, BL>(w, p0, q8, q16, sx, s16, xs, hd, y),
            5 => panels::<5, K, BL>(w, p0, q8, q16, sx, s16, xs, hd, y),
            6 => panels::<6, K, BL>(w, p0, q8, q16, sx, s16, xs, hd, y),
            7 => panels::<7, K, BL>(w, p0, q8, q16, sx, s16, xs, hd, y),
            _ => panels::<8, K, BL>(w, p0, q8, q16, sx, s16, xs, hd, y),
        }
    }
}

/// `R` rows × the tile's four panels from `p0`, weight kind `K` (0: 4-bit, 1: 5-bit, 2: 8-bit, 3: 6-bit
/// as unsigned bytes, [`super::six::grouped_pair`]).
/// Bounds: panels `p0 .. p0 + 4` and blocks `b < nb` keep every record read inside `w`; row `r < R`
/// reads inputs `r·k + b·bl + e`, `e < bl`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn panels<const R: usize, const K: u8, const BL: usize>(
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
    let (base, head, offsets, rec) = (w.base(), w.head, w.offsets, w.rec);
    let m4 = _mm512_set1_epi8(0x0F);
    let b4 = _mm512_set1_epi8(0x10);
    for b in 0..nb {
        prefetch_ahead(w, p0, b);
        // The tile's four records of block `b` are consecutive, `rec` bytes each.
        // SAFETY: inside `w` (the caller's bounds).
        let tile = unsafe { base.add(w.record(p0, b)) };
        let mut acc = [[_mm512_setzero_si512(); 2]; R];
        if K == 3 || K == 4 {
            // 6-bit: the unsigned quants q + 32 of panels 2h, 2h + 1 (four inputs of a column per
            // lane) against the byte codes, then 32 · Σ x of the block off
            for c in 0..bl / 4 {
                // SAFETY: the tile's records are 6-bit records of blocks of 16, or their widened
                // bytes (checked in `dispatch`).
                let z = unsafe {
                    if K == 4 {
                        [
                            pair_bytes(tile, rec, head, 0, 32 * c),
                            pair_bytes(tile, rec, head, 1, 32 * c),
                        ]
                    } else {
                        [
                            six::grouped_pair(tile, rec, head, c),
                            six::grouped_pair(tile.add(2 * rec), rec, head, c),
                        ]
                    }
                };
                for (r, a) in acc.iter_mut().enumerate() {
                    // SAFETY: row r's inputs b·bl + 4c .. + 4 (the caller's bounds).
                    let xv =
                        unsafe { _mm512_set1_epi32((q8.add(r * k + b * bl + 4 * c) as *const i32).read_unaligned()) };
                    for h in 0..2 {
                        a[h] = _mm512_dpbusd_epi32(a[h], z[h], xv);
                    }
                }
            }
            for (r, a) in acc.iter_mut().enumerate() {
                // SAFETY: row r's sums of 16 (the caller's bounds).
                let off = _mm512_set1_epi32(32 * unsafe { *s16.add(r * (k / 16) + b * bl / 16) });
                for h in a.iter_mut() {
                    *h = _mm512_sub_epi32(*h, off);
                }
            }
        }
        if K == 2 {
            // Per 128-bit half: the 8 columns' bytes of two inputs, interleaved column by column.
            let shuf = _mm256_setr_epi8(
                0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15, 0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7,
                15,
            );
            // Inputs 2j, 2j + 1 of chunk `c` (j = 0: bytes 0..16, j = 1: 16..32) of panels 2h and
            // 2h + 1, each column's pair as two 16-bit lanes.
            let half16 = |h: usize, off: usize| -> __m512i {
                // SAFETY: `off + 16` stays inside a record's 8-bit data (8 columns × bl bytes).
                unsafe {
                    let a = _mm_loadu_si128(tile.add(2 * h * rec + head + off) as *const __m128i);
                    let c = _mm_loadu_si128(tile.add((2 * h + 1) * rec + head + off) as *const __m128i);
                    let both = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(a), c);
                    _mm512_cvtepi8_epi16(_mm256_shuffle_epi8(both, shuf))
                }
            };
            for c in 0..bl / 4 {
                let (w01, w23) = (
                    [half16(0, 32 * c), half16(1, 32 * c)],
                    [half16(0, 32 * c + 16), half16(1, 32 * c + 16)],
                );
                for (r, a) in acc.iter_mut().enumerate() {
                    // SAFETY: row r's inputs b·bl + 4c .. + 4 (the caller's bounds).
                    let (x01, x23) = unsafe {
                        let xp = q16.add(r * k + b * bl + 4 * c);
                        (
                            _mm512_set1_epi32((xp as *const i32).read_unaligned()),
                            _mm512_set1_epi32((xp.add(2) as *const i32).read_unaligned()),
                        )
                    };
                    for h in 0..2 {
                        a[h] = dpwssd!("", zmm_reg, a[h], w01[h], x01);
                        a[h] = dpwssd!("", zmm_reg, a[h], w23[h], x23);
                    }
                }
            }
        }
        let (q4, q5) = (K == 0, K == 1);
        // 5-bit: the high plane (see `QMatrix::q5_high_at`); chunk `c`'s fifth bits are bit `c` (low
        // nibbles) and `4 + c` (high) of each byte, moved to bit 4.
        let hp = if q5 {
            // SAFETY: a 5-bit record's data holds the 32-byte high plane at 128.
            unsafe { [pair_bytes(tile, rec, head, 0, 128), pair_bytes(tile, rec, head, 1, 128)] }
        } else {
            [_mm512_setzero_si512(); 2]
        };
        for c in 0..if q4 || q5 { bl / 8 } else { 0 } {
            let mut lo = [_mm512_setzero_si512(); 2];
            let mut hi = [_mm512_setzero_si512(); 2];
            for h in 0..2 {
                // SAFETY: chunk c of a 4/5-bit record's data (128 bytes).
                let raw = unsafe { pair_bytes(tile, rec, head, h, 32 * c) };
                lo[h] = _mm512_and_si512(raw, m4);
                hi[h] = _mm512_and_si512(_mm512_srli_epi16::<4>(raw), m4);
                if q5 {
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
            // SAFETY: the tile's records are inside `w`.
            let (dv, mv) = unsafe { pair_dm(w, tile, p0, b, h, hd) };
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
