//! The f32 panel microkernel (`kernel::run`: the exact path, decisions' and `--activations f32`'s) in
//! 512-bit registers on AVX-512 machines: the tile's four panels as two registers of sixteen columns,
//! so each weight decode (nibble shift and mask, the 5-bit plane, widening of 8/16-bit weights) and each
//! FMA covers 16 columns instead of 8.
//!
//! Guarantee: every lane is one output's own chain of the f32 sequence `kernel`'s module doc defines
//! (`s = fma(q, x, s)` over the block's inputs in order, then `y = fma(d, s, y)`, `y = fma(m, X, y)`),
//! so the register width changes the speed, never the bits (tested against the scalar kernel).

use std::arch::x86_64::*;

use super::heads::pair_dm;
use super::kernel::{prefetch_ahead, Acc};
use super::{QKind, QMatrix, P, TILE_PANELS};

// A tile's four panels are two registers of sixteen columns.
const _: () = assert!(TILE_PANELS == 4 && P == 8);

/// Bytes `off .. off + 32` of the data (after the `head`) of panels 2h and 2h + 1 of a tile whose
/// records are consecutive, `rec` bytes each: the two panels side by side in one register.
/// SAFETY (caller): avx512f available; both records' data hold `off + 32` bytes.
#[inline]
#[target_feature(enable = "avx512f,avx2")]
pub(super) unsafe fn pair_bytes(tile: *const u8, rec: usize, head: usize, h: usize, off: usize) -> __m512i {
    // SAFETY: by the caller.
    unsafe {
        let a = _mm256_loadu_si256(tile.add(2 * h * rec + head + off) as *const __m256i);
        let c = _mm256_loadu_si256(tile.add((2 * h + 1) * rec + head + off) as *const __m256i);
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a), c)
    }
}

/// SAFETY (caller): avx512f, avx2, fma and f16c available; `x` holds `rr` rows of `k`, `xs` `rr` rows
/// of `k / 32`, and panels `p0 .. p0 + TILE_PANELS` exist (checked in `kernel::run`).
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(super) unsafe fn dispatch(
    w: &QMatrix,
    p0: usize,
    x: *const f32,
    xs: *const f32,
    hd: *const f32,
    rr: usize,
    y: &mut Acc,
) {
    let y = y.as_mut_ptr();
    // SAFETY (all arms): as the caller guarantees.
    unsafe {
        match rr.min(8) {
            1 => panels::<1>(w, p0, x, xs, hd, y),
            2 => panels::<2>(w, p0, x, xs, hd, y),
            3 => panels::<3>(w, p0, x, xs, hd, y),
            4 => panels::<4>(w, p0, x, xs, hd, y),
            5 => panels::<5>(w, p0, x, xs, hd, y),
            6 => panels::<6>(w, p0, x, xs, hd, y),
            7 => panels::<7>(w, p0, x, xs, hd, y),
            _ => panels::<8>(w, p0, x, xs, hd, y),
        }
    }
}

/// `R` rows × the tile's four panels from `p0`; accumulators `y[r · TILE_PANELS + v]`. Bounds: panels
/// `p0 .. p0 + 4` and blocks `b < nb` keep every record read inside `w`; row `r < R` reads
/// `x[r·k + b·bl + e]` with `e < bl`.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn panels<const R: usize>(
    w: &QMatrix,
    p0: usize,
    x: *const f32,
    xs: *const f32,
    hd: *const f32,
    y: *mut [f32; P],
) {
    let (k, nb, bl) = (w.k, w.nb(), w.bl);
    let mask = _mm512_set1_epi32(0x0F);
    let b4 = _mm512_set1_epi32(0x10);
    let (q4, q5) = (w.kind == QKind::Q4, w.kind == QKind::Q5);
    let (base, head, offsets, rec) = (w.base(), w.head, w.offsets, w.rec);
    for b in 0..nb {
        prefetch_ahead(w, p0, b);
        // The tile's four records of block `b` are consecutive, `rec` bytes each.
        // SAFETY: inside `w` (the caller's bounds).
        let tile = unsafe { base.add(w.record(p0, b)) };
        // SAFETY: row r's inputs of block b (the caller's bounds).
        let xb = unsafe { x.add(b * bl) };
        let mut s = [[_mm512_setzero_ps(); 2]; R];
        macro_rules! rows {
            ($q:expr, $e:expr) => {{
                let q: [__m512; 2] = $q;
                for (r, sr) in s.iter_mut().enumerate() {
                    // SAFETY: input `$e` of row r in block b.
                    let xv = _mm512_set1_ps(unsafe { *xb.add(r * k + $e) });
                    for h in 0..2 {
                        sr[h] = _mm512_fmadd_ps(q[h], xv, sr[h]);
                    }
                }
            }};
        }
        if q4 || q5 {
            // As `kernel`: one 32-byte chunk per 8 inputs; input `8c + e` of a column is one shift and
            // mask of its lane, a 5-bit quant's fifth bit one more of the high plane.
            let hp = if q5 {
                // SAFETY: a 5-bit record's data holds the 32-byte high plane at 128.
                unsafe { [pair_bytes(tile, rec, head, 0, 128), pair_bytes(tile, rec, head, 1, 128)] }
            } else {
                [_mm512_setzero_si512(); 2]
            };
            for c in 0..bl / 8 {
                // SAFETY: chunk c of a 4/5-bit record's data (32·bl/8 = 128 bytes).
                let wv = unsafe {
                    [
                        pair_bytes(tile, rec, head, 0, 32 * c),
                        pair_bytes(tile, rec, head, 1, 32 * c),
                    ]
                };
                for e in 0..8 {
                    let sh = _mm_cvtsi32_si128((8 * (e % 4) + 4 * (e / 4)) as i32);
                    let at = (8 * (e % 4) + c + 4 * (e / 4)) as i32;
                    let mut q = [_mm512_setzero_ps(); 2];
                    for h in 0..2 {
                        let mut qi = _mm512_and_si512(_mm512_srl_epi32(wv[h], sh), mask);
                        if q5 {
                            let hb = if at >= 4 {
                                _mm512_srl_epi32(hp[h], _mm_cvtsi32_si128(at - 4))
                            } else {
                                _mm512_sll_epi32(hp[h], _mm_cvtsi32_si128(4 - at))
                            };
                            qi = _mm512_or_si512(qi, _mm512_and_si512(hb, b4));
                        }
                        q[h] = _mm512_cvtepi32_ps(qi);
                    }
                    rows!(q, 8 * c + e);
                }
            }
        } else if w.kind == QKind::Q6 {
            // 6-bit: each chunk of two panels expanded in registers (`six::grouped_pair`: input
            // `4c + t` of a column is byte t of its lane), each input its byte (a shift by 8t and a
            // mask, as needed) less 32 — the 8-bit layout's values in the same order, so its bits
            // (vector shifts share their ports with the FMAs: one at most)
            let (byte, bias) = (_mm512_set1_epi32(0xFF), _mm512_set1_epi32(32));
            for c in 0..bl / 4 {
                // SAFETY: panels p0 .. p0 + 4's 6-bit records of block b (the caller's bounds).
                let g = unsafe {
                    [
                        super::six::grouped_pair(tile, rec, head, c),
                        super::six::grouped_pair(tile.add(2 * rec), rec, head, c),
                    ]
                };
                for t in 0..4 {
                    let q = g.map(|g| {
                        let qi = match t {
                            0 => _mm512_and_si512(g, byte),
                            1 => _mm512_and_si512(_mm512_srli_epi32::<8>(g), byte),
                            2 => _mm512_and_si512(_mm512_srli_epi32::<16>(g), byte),
                            _ => _mm512_srli_epi32::<24>(g),
                        };
                        _mm512_cvtepi32_ps(_mm512_sub_epi32(qi, bias))
                    });
                    rows!(q, 4 * c + t);
                }
            }
        } else if w.kind == QKind::Q8 {
            let (src, rec, head) = (tile, rec, head);
            for e in 0..bl {
                let mut q = [_mm512_setzero_ps(); 2];
                for (h, qh) in q.iter_mut().enumerate() {
                    // SAFETY: 8 bytes (8 columns at input e) of each record's data.
                    let both = unsafe {
                        let a = _mm_loadl_epi64(src.add(2 * h * rec + head + e * P) as *const __m128i);
                        let c = _mm_loadl_epi64(src.add((2 * h + 1) * rec + head + e * P) as *const __m128i);
                        _mm_unpacklo_epi64(a, c)
                    };
                    *qh = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(both));
                }
                rows!(q, e);
            }
        } else {
            // 16-bit floats: 8 columns' weights at one input are 16 bytes.
            let f16 = w.kind == QKind::F16;
            for e in 0..bl {
                let mut q = [_mm512_setzero_ps(); 2];
                for (h, qh) in q.iter_mut().enumerate() {
                    // SAFETY: 16 bytes (8 columns at input e) of each record's data.
                    let both = unsafe {
                        let a = _mm_loadu_si128(tile.add(2 * h * rec + head + 2 * e * P) as *const __m128i);
                        let c = _mm_loadu_si128(tile.add((2 * h + 1) * rec + head + 2 * e * P) as *const __m128i);
                        _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(a), c)
                    };
                    *qh = if f16 {
                        _mm512_cvtph_ps(both)
                    } else {
                        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(both)))
                    };
                }
                rows!(q, e);
            }
        }
        for h in 0..2 {
            // SAFETY: the tile's records are inside `w`.
            let (dv, mv) = unsafe { pair_dm(w, tile, p0, b, h, hd) };
            for (r, sr) in s.iter().enumerate() {
                // SAFETY: outputs of row r, panels 2h and 2h + 1 (16 consecutive floats of `y`); the
                // block sum of row r, block b.
                unsafe {
                    let yp = y.add(r * TILE_PANELS + 2 * h) as *mut f32;
                    let t = _mm512_fmadd_ps(dv, sr[h], _mm512_loadu_ps(yp));
                    let t = if offsets {
                        _mm512_fmadd_ps(mv, _mm512_set1_ps(*xs.add(r * nb + b)), t)
                    } else {
                        t
                    };
                    _mm512_storeu_ps(yp, t);
                }
            }
        }
    }
}
