//! The plain scores' scaling and masking, and the exps, in 16-lane registers (`lanes.rs`'s AVX-512
//! path): the same IEEE operations per lane as the 8-lane path, so the same bits.

use std::arch::x86_64::*;

/// `simd::avx2::exp8`'s arithmetic in 16 lanes (each step the same IEEE operation per lane, the
/// below-range lanes zeroed by a mask instead of an `and`): the same bits.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
fn exp16(x_in: __m512) -> __m512 {
    let floor = _mm512_set1_ps(-87.3);
    let keep = _mm512_cmp_ps_mask(x_in, floor, _CMP_GE_OQ);
    let x = _mm512_max_ps(x_in, floor);
    let n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)), 0x08);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_145_75), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428_606_8e-6), r);
    let mut p = _mm512_set1_ps(1.987_569_1e-4);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.398_199_9e-3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.333_452e-3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.166_579_6e-2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.666_666_5e-1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r);
    p = _mm512_add_ps(p, _mm512_set1_ps(1.0));
    let e = _mm512_slli_epi32::<23>(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)));
    _mm512_maskz_mov_ps(keep, _mm512_mul_ps(p, _mm512_castsi512_ps(e)))
}

/// Each row `j` of `w` (position `lo + j`) scaled, −∞ in the lanes whose range `st..=en` does not
/// hold the position, and the lanes' maxima into `m`. SAFETY (caller): avx512f available,
/// `nqp % 16 == 0`, `st`, `en` and `m` of `nqp`, `w.len() % nqp == 0`.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn scale_mask_max(
    w: &mut [f32],
    nqp: usize,
    scale: f32,
    st: &[i32],
    en: &[i32],
    lo: i32,
    m: &mut [f32],
) {
    let (wp, mp) = (w.as_mut_ptr(), m.as_mut_ptr());
    let (sc, ninf) = (_mm512_set1_ps(scale), _mm512_set1_ps(f32::NEG_INFINITY));
    let mut q = 0;
    while q < nqp {
        let s = _mm512_loadu_si512(st.as_ptr().add(q).cast());
        let e = _mm512_loadu_si512(en.as_ptr().add(q).cast());
        let mut mx = _mm512_loadu_ps(mp.add(q));
        for j in 0..w.len() / nqp {
            let pos = _mm512_set1_epi32(lo + j as i32);
            let valid = _mm512_cmpge_epi32_mask(pos, s) & _mm512_cmple_epi32_mask(pos, e);
            let at = wp.add(j * nqp + q);
            let v = _mm512_mask_blend_ps(valid, ninf, _mm512_mul_ps(_mm512_loadu_ps(at), sc));
            _mm512_storeu_ps(at, v);
            mx = _mm512_max_ps(mx, v);
        }
        _mm512_storeu_ps(mp.add(q), mx);
        q += 16;
    }
}

/// SAFETY (caller): avx512f available, `nqp % 16 == 0`, `m.len() == nqp`, `sums.len() == 8·nqp`,
/// `w.len() % nqp == 0`.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn exps(w: &mut [f32], nqp: usize, m: &[f32], sums: &mut [f32], lo: usize) {
    let (wp, mp, sp) = (w.as_mut_ptr(), m.as_ptr(), sums.as_mut_ptr());
    for j in 0..w.len() / nqp {
        let srow = sp.add((lo + j) % 8 * nqp);
        let mut q = 0;
        while q < nqp {
            let at = wp.add(j * nqp + q);
            let e = exp16(_mm512_sub_ps(_mm512_loadu_ps(at), _mm512_loadu_ps(mp.add(q))));
            _mm512_storeu_ps(at, e);
            _mm512_storeu_ps(srow.add(q), _mm512_add_ps(_mm512_loadu_ps(srow.add(q)), e));
            q += 16;
        }
    }
}
