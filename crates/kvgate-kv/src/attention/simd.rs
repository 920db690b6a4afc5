//! The vector arithmetic of attention, each with one fixed reduction order (so results never depend
//! on batch shape or thread split): dot products (8-lane, plain or fused; eight at once, two queries ×
//! four keys), the exps of a partition of scores with a vectorised `exp`, and the weighted sums of V (AVX2 kernels where
//! compiled in, the same arithmetic otherwise).
//!
//! On a machine with AVX-512 (detected once at run time; `KVGATE_NO_AVX512` turns it off) the weighted
//! sums of V take 16-lane registers, two query heads per pass over the values, with the AVX2 path's
//! per-element arithmetic: the same bits on every x86 machine, as the matmul kernels. Every weighted
//! sum is one fused multiply-add per term, positions ascending, whatever the path (the lanes path of
//! prefill tiles included).

/// Eight dot products `q · ks[j]` at once. Every result is computed by the same arithmetic whichever
/// slot `j` it is in (AVX2: a fixed 8-lane accumulation and a fixed `hadd` tree; otherwise [`dot`]).
/// (The tests' reference for [`dot2x4`].)
#[cfg(test)]
pub fn dot8(q: &[f32], ks: &[&[f32]; 8]) -> [f32; 8] {
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
    if q.len().is_multiple_of(8) {
        // SAFETY: avx2 and fma are enabled at compile time; every `ks[j]` has `q.len()` elements (the
        // caller passes head_dim-long vectors) and loads stay below `q.len()`.
        return unsafe { avx2::dot8(q, ks) };
    }
    std::array::from_fn(|j| dot(q, ks[j]))
}

/// Eight dot products at once, two queries × four keys: `[q0·k0, q0·k1, q0·k2, q0·k3, q1·k0, …, q1·k3]`,
/// each by exactly [`dot8`]'s arithmetic (its own 8-lane FMA chain, the same `hadd` tree), with a
/// quarter fewer loads per multiply-add than two [`dot8`] calls: the score kernel of a tile's rows.
#[inline]
pub fn dot2x4(q0: &[f32], q1: &[f32], ks: &[&[f32]; 4]) -> [f32; 8] {
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
    if q0.len().is_multiple_of(8) {
        // SAFETY: avx2 and fma are enabled at compile time; `q1` and every `ks[j]` have at least
        // `q0.len()` elements (head_dim-long vectors) and loads stay below `q0.len()`.
        return unsafe { avx2::dot2x4(q0, q1, ks) };
    }
    std::array::from_fn(|j| dot(if j < 4 { q0 } else { q1 }, ks[j % 4]))
}

/// Whether this machine takes the AVX-512 kernels (detected once; `KVGATE_NO_AVX512` turns them off).
#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
pub(crate) static AVX512: std::sync::LazyLock<bool> = std::sync::LazyLock::new(|| {
    std::env::var_os("KVGATE_NO_AVX512").is_none() && std::arch::is_x86_feature_detected!("avx512f")
});

#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
mod avx512 {
    use std::arch::x86_64::*;

    /// `avx2::axpy_many`'s arithmetic (per element one fused multiply-add per term, `j` ascending) in
    /// 16-lane registers: the same bits. SAFETY (caller): avx512f available, `acc.len() % 16 == 0`,
    /// `xs.len() >= ws.len() · acc.len()`.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub unsafe fn axpy_many(acc: &mut [f32], ws: &[f32], xs: &[f32]) {
        let len = acc.len();
        let (ap, xp) = (acc.as_mut_ptr(), xs.as_ptr());
        let mut c = 0;
        while c + 64 <= len {
            let mut a = [_mm512_setzero_ps(); 4];
            for (i, v) in a.iter_mut().enumerate() {
                *v = _mm512_loadu_ps(ap.add(c + 16 * i));
            }
            for (j, &w) in ws.iter().enumerate() {
                let wv = _mm512_set1_ps(w);
                for (i, v) in a.iter_mut().enumerate() {
                    let x = _mm512_loadu_ps(xp.add(j * len + c + 16 * i));
                    *v = _mm512_fmadd_ps(wv, x, *v);
                }
            }
            for (i, v) in a.iter().enumerate() {
                _mm512_storeu_ps(ap.add(c + 16 * i), *v);
            }
            c += 64;
        }
        while c < len {
            let mut v = _mm512_loadu_ps(ap.add(c));
            for (j, &w) in ws.iter().enumerate() {
                v = _mm512_fmadd_ps(_mm512_set1_ps(w), _mm512_loadu_ps(xp.add(j * len + c)), v);
            }
            _mm512_storeu_ps(ap.add(c), v);
            c += 16;
        }
    }

    /// [`axpy_many`] for two accumulators over the same vectors (two query heads of one KV head): each
    /// output by exactly the arithmetic of its own call, with eight independent add chains instead of
    /// four and each `xs` vector loaded once for both. SAFETY (caller): as [`axpy_many`], for both,
    /// `len == 64`.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub unsafe fn axpy_many2(a0: &mut [f32], a1: &mut [f32], w0: &[f32], w1: &[f32], xs: &[f32]) {
        let (p0, p1, xp) = (a0.as_mut_ptr(), a1.as_mut_ptr(), xs.as_ptr());
        let mut r0: [__m512; 4] = std::array::from_fn(|i| _mm512_loadu_ps(p0.add(16 * i)));
        let mut r1: [__m512; 4] = std::array::from_fn(|i| _mm512_loadu_ps(p1.add(16 * i)));
        for (j, (&x0, &x1)) in w0.iter().zip(w1).enumerate() {
            let (b0, b1) = (_mm512_set1_ps(x0), _mm512_set1_ps(x1));
            for i in 0..4 {
                let x = _mm512_loadu_ps(xp.add(j * 64 + 16 * i));
                r0[i] = _mm512_fmadd_ps(b0, x, r0[i]);
                r1[i] = _mm512_fmadd_ps(b1, x, r1[i]);
            }
        }
        for i in 0..4 {
            _mm512_storeu_ps(p0.add(16 * i), r0[i]);
            _mm512_storeu_ps(p1.add(16 * i), r1[i]);
        }
    }
}

#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
mod avx2 {
    use std::arch::x86_64::*;

    /// exp(x) for x ≤ 0 (Cephes-style: 2^n · p(r), r = x − n·ln2 in two steps, degree-6 polynomial).
    #[inline(always)]
    unsafe fn exp8(x_in: __m256) -> __m256 {
        let floor = _mm256_set1_ps(-87.3);
        let keep = _mm256_cmp_ps(x_in, floor, _CMP_GE_OQ);
        let x = _mm256_max_ps(x_in, floor);
        let n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)), 0x08);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_145_75), x);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428_606_8e-6), r);
        let mut p = _mm256_set1_ps(1.987_569_1e-4);
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.398_199_9e-3));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.333_452e-3));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.166_579_6e-2));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.666_666_5e-1));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5));
        p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r);
        p = _mm256_add_ps(p, _mm256_set1_ps(1.0));
        let e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
        // Below the float range (and −∞ padding): exactly 0.
        _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), keep)
    }

    /// Replaces each `v` of `x` by `exp(v − max)` and returns their sum (8 lanes, then the lanes in a
    /// fixed order). SAFETY (caller): avx2+fma available. Loads and stores stay inside `x` (full chunks
    /// of 8, then the tail through a padded copy).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn exp_sum(x: &mut [f32], max: f32) -> f32 {
        let m = _mm256_set1_ps(max);
        let mut sum = _mm256_setzero_ps();
        let full = x.len() / 8 * 8;
        let mut i = 0;
        while i < full {
            let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x.as_ptr().add(i)), m));
            _mm256_storeu_ps(x.as_mut_ptr().add(i), e);
            sum = _mm256_add_ps(sum, e);
            i += 8;
        }
        if full < x.len() {
            // The tail goes through the same vector code, padded with −∞ (exp → 0).
            let mut pad = [f32::NEG_INFINITY; 8];
            pad[..x.len() - full].copy_from_slice(&x[full..]);
            let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(pad.as_ptr()), m));
            _mm256_storeu_ps(pad.as_mut_ptr(), e);
            sum = _mm256_add_ps(sum, e);
            let tail = x.len() - full;
            x[full..].copy_from_slice(&pad[..tail]);
        }
        let lo = _mm256_castps256_ps128(sum);
        let hi = _mm256_extractf128_ps(sum, 1);
        let s4 = _mm_add_ps(lo, hi);
        let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)))
    }

    /// [`super::exp_in_place`]'s kernel: [`exp8`] of `min(88.3, v)`, +∞ above 88.3. SAFETY (caller):
    /// avx2+fma available. Loads and stores stay inside `x` (full chunks of 8, then the tail through a
    /// padded copy).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn exp_all(x: &mut [f32]) {
        let (top, inf) = (_mm256_set1_ps(88.3), _mm256_set1_ps(f32::INFINITY));
        // `min(top, v)` keeps a NaN `v` (which `exp8` sends to 0)
        let one = |v: __m256| {
            let e = exp8(_mm256_min_ps(top, v));
            _mm256_blendv_ps(e, inf, _mm256_cmp_ps(v, top, _CMP_GT_OQ))
        };
        let full = x.len() / 8 * 8;
        let mut i = 0;
        while i < full {
            let p = x.as_mut_ptr().add(i);
            _mm256_storeu_ps(p, one(_mm256_loadu_ps(p)));
            i += 8;
        }
        if full < x.len() {
            let tail = x.len() - full;
            let mut pad = [0f32; 8];
            pad[..tail].copy_from_slice(&x[full..]);
            _mm256_storeu_ps(pad.as_mut_ptr(), one(_mm256_loadu_ps(pad.as_ptr())));
            x[full..].copy_from_slice(&pad[..tail]);
        }
    }

    /// SAFETY (caller): avx2 available.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn max_of(x: &[f32]) -> f32 {
        let mut m = _mm256_set1_ps(f32::NEG_INFINITY);
        let full = x.len() / 8 * 8;
        let mut i = 0;
        while i < full {
            m = _mm256_max_ps(m, _mm256_loadu_ps(x.as_ptr().add(i)));
            i += 8;
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), m);
        lanes.iter().chain(&x[full..]).fold(f32::NEG_INFINITY, |a, &b| a.max(b))
    }

    /// SAFETY (caller): avx2+fma available, `x.len() % 8 == 0`, `m.len() >= x.len()`.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn exp_sub(x: &mut [f32], m: &[f32]) {
        let mut i = 0;
        while i < x.len() {
            let e = exp8(_mm256_sub_ps(
                _mm256_loadu_ps(x.as_ptr().add(i)),
                _mm256_loadu_ps(m.as_ptr().add(i)),
            ));
            _mm256_storeu_ps(x.as_mut_ptr().add(i), e);
            i += 8;
        }
    }

    /// SAFETY (caller): avx2 available, `acc.len() % 8 == 0`, `xs.len() >= ws.len() · acc.len()`.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn axpy_many(acc: &mut [f32], ws: &[f32], xs: &[f32]) {
        let len = acc.len();
        let (ap, xp) = (acc.as_mut_ptr(), xs.as_ptr());
        let mut c = 0;
        // 32 elements (four registers) at a time, then 8.
        while c + 32 <= len {
            let mut a = [_mm256_setzero_ps(); 4];
            for (i, v) in a.iter_mut().enumerate() {
                *v = _mm256_loadu_ps(ap.add(c + 8 * i));
            }
            for (j, &w) in ws.iter().enumerate() {
                let wv = _mm256_set1_ps(w);
                for (i, v) in a.iter_mut().enumerate() {
                    let x = _mm256_loadu_ps(xp.add(j * len + c + 8 * i));
                    *v = _mm256_fmadd_ps(wv, x, *v);
                }
            }
            for (i, v) in a.iter().enumerate() {
                _mm256_storeu_ps(ap.add(c + 8 * i), *v);
            }
            c += 32;
        }
        while c < len {
            let mut v = _mm256_loadu_ps(ap.add(c));
            for (j, &w) in ws.iter().enumerate() {
                v = _mm256_fmadd_ps(_mm256_set1_ps(w), _mm256_loadu_ps(xp.add(j * len + c)), v);
            }
            _mm256_storeu_ps(ap.add(c), v);
            c += 8;
        }
    }

    /// SAFETY (caller): avx2+fma available, `q0.len() % 8 == 0`, `q1` and every `ks[j]` at least as long.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot2x4(q0: &[f32], q1: &[f32], ks: &[&[f32]; 4]) -> [f32; 8] {
        let mut acc = [_mm256_setzero_ps(); 8];
        let mut c = 0;
        while c < q0.len() {
            let (a, b) = (_mm256_loadu_ps(q0.as_ptr().add(c)), _mm256_loadu_ps(q1.as_ptr().add(c)));
            for (j, k) in ks.iter().enumerate() {
                let kv = _mm256_loadu_ps(k.as_ptr().add(c));
                acc[j] = _mm256_fmadd_ps(a, kv, acc[j]);
                acc[4 + j] = _mm256_fmadd_ps(b, kv, acc[4 + j]);
            }
            c += 8;
        }
        reduce8(&acc)
    }

    /// SAFETY (caller): avx2+fma available, `q.len() % 8 == 0`, every `ks[j].len() >= q.len()`.
    #[cfg(test)]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot8(q: &[f32], ks: &[&[f32]; 8]) -> [f32; 8] {
        let mut acc = [_mm256_setzero_ps(); 8];
        let mut c = 0;
        while c < q.len() {
            let qv = _mm256_loadu_ps(q.as_ptr().add(c));
            for (a, k) in acc.iter_mut().zip(ks) {
                *a = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k.as_ptr().add(c)), *a);
            }
            c += 8;
        }
        reduce8(&acc)
    }

    /// Lane `j` of the result is the sum of `acc[j]`'s eight lanes by a fixed tree:
    /// `((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn reduce8(acc: &[__m256; 8]) -> [f32; 8] {
        let t0 = _mm256_hadd_ps(acc[0], acc[1]);
        let t1 = _mm256_hadd_ps(acc[2], acc[3]);
        let t2 = _mm256_hadd_ps(acc[4], acc[5]);
        let t3 = _mm256_hadd_ps(acc[6], acc[7]);
        let u0 = _mm256_hadd_ps(t0, t1);
        let u1 = _mm256_hadd_ps(t2, t3);
        let r = _mm256_add_ps(
            _mm256_permute2f128_ps(u0, u1, 0x20),
            _mm256_permute2f128_ps(u0, u1, 0x31),
        );
        let mut out = [0f32; 8];
        _mm256_storeu_ps(out.as_mut_ptr(), r);
        out
    }
}

/// Replaces each `v` of `x` by `exp(v − max)` and returns their sum, in a fixed order (a vectorised
/// `exp` — AVX2: a degree-6 polynomial after range reduction, within 2 ulp of `f32::exp`; every
/// element goes through the same code path): the unnormalized softmax of a partition of scores.
pub(crate) fn exp_sum_inplace(x: &mut [f32], max: f32) -> f32 {
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
    {
        // SAFETY: avx2 and fma are enabled at compile time; the kernel only touches `x`.
        unsafe { avx2::exp_sum(x, max) }
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma")))]
    {
        let mut sum = 0f32;
        for v in x.iter_mut() {
            *v = (*v - max).exp();
            sum += *v;
        }
        sum
    }
}

/// `exp(v)` of each element of `x` in place, by the attention's vector `exp` (Cephes-style: `2^n · p(r)`,
/// a degree-6 polynomial) where AVX2 is compiled in: every element goes through the same lane
/// arithmetic wherever it sits (whole chunks of 8, then the tail in a padded copy), so its bits never
/// depend on the slice around it. Below −87.3 exactly 0; above 88.3 (where the polynomial's power of
/// two would overflow) +∞; NaN gives 0. Without AVX2: libm's `exp` per element.
pub fn exp_in_place(x: &mut [f32]) {
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
    // SAFETY: avx2 and fma are enabled at compile time; the kernel only touches `x`.
    unsafe {
        avx2::exp_all(x)
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma")))]
    for v in x.iter_mut() {
        *v = v.exp();
    }
}

/// The largest of `x` (−∞ when empty): exact, so the same value whatever the order it is taken in
/// (NaN scores, which no finite inputs give, may be ignored or returned depending on the path).
pub(crate) fn max_of(x: &[f32]) -> f32 {
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
    {
        // SAFETY: avx2 is enabled at compile time; loads stay inside `x` (whole chunks of 8, then the
        // tail one by one).
        unsafe { avx2::max_of(x) }
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma")))]
    x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v))
}

/// `x[i] = exp(x[i] − m[i])`, element by element, by exactly [`exp_sum_inplace`]'s `exp` (the lanes
/// path's exps of a position's scores, one per query). `x.len() % 8 == 0`, `m` at least as long.
#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
pub(super) fn exp_sub(x: &mut [f32], m: &[f32]) {
    assert!(x.len().is_multiple_of(8) && m.len() >= x.len());
    // SAFETY: avx2 and fma are enabled at compile time; lengths asserted above.
    unsafe { avx2::exp_sub(x, m) }
}

/// Dot product with a fixed 8-lane reduction order (vectorizes; deterministic for a given length);
/// each lane multiplies then adds (unfused).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    dot_lanes::<false>(a, b)
}

/// [`dot`] with each lane's multiply-add fused (one rounding): the dense matmul's order.
#[inline]
pub fn dot_fused(a: &[f32], b: &[f32]) -> f32 {
    dot_lanes::<true>(a, b)
}

/// The one 8-lane dot product: lanes `i mod 8` accumulate in order, then a fixed tree, then the tail.
#[inline]
fn dot_lanes<const FUSED: bool>(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] = if FUSED {
                x[i].mul_add(y[i], acc[i])
            } else {
                acc[i] + x[i] * y[i]
            };
        }
    }
    let mut tail = 0f32;
    for (x, y) in ra.iter().zip(rb) {
        tail += x * y;
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// `acc += Σ_j ws[j] · xs[j·len .. (j+1)·len]` for `j` ascending, with `len = acc.len()`: per element
/// exactly the sequence of [`axpy`] calls (one fused multiply-add per term), with the accumulator kept
/// in registers across the `j`s (AVX2) instead of loaded and stored for each; on AVX-512 machines (a
/// `len` that is a multiple of 16) in 16-lane registers, the same bits.
pub(crate) fn axpy_many(acc: &mut [f32], ws: &[f32], xs: &[f32]) {
    let len = acc.len();
    debug_assert!(xs.len() >= ws.len() * len);
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
    if len.is_multiple_of(16) && *AVX512 {
        // SAFETY: AVX-512F was detected at run time; `xs` as below.
        return unsafe { avx512::axpy_many(acc, ws, xs) };
    }
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
    if len.is_multiple_of(8) {
        // SAFETY: avx2 is enabled at compile time; `xs` holds `ws.len()` vectors of `len` (asserted
        // in debug builds and guaranteed by the callers, which pass whole decoded blocks).
        return unsafe { avx2::axpy_many(acc, ws, xs) };
    }
    for (j, &w) in ws.iter().enumerate() {
        axpy(acc, w, &xs[j * len..(j + 1) * len]);
    }
}

/// [`axpy_many`] into two accumulators over the same `xs` (`w0`, `w1` of equal length): each result
/// exactly its own [`axpy_many`] call's, bit for bit (one pass over `xs` for both where a kernel has it).
pub(crate) fn axpy_many2(a0: &mut [f32], a1: &mut [f32], w0: &[f32], w1: &[f32], xs: &[f32]) {
    debug_assert_eq!(w0.len(), w1.len());
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
    if a0.len() == 64 && a1.len() == 64 && *AVX512 {
        debug_assert!(xs.len() >= w0.len() * 64);
        // SAFETY: AVX-512F was detected at run time; both accumulators hold 64 elements and `xs` holds
        // `w0.len()` vectors of 64 (whole decoded blocks, guaranteed by the callers).
        return unsafe { avx512::axpy_many2(a0, a1, w0, w1, xs) };
    }
    axpy_many(a0, w0, xs);
    axpy_many(a1, w1, xs);
}

#[inline]
pub(crate) fn axpy(acc: &mut [f32], w: f32, x: &[f32]) {
    for (a, b) in acc.iter_mut().zip(x) {
        *a = w.mul_add(*b, *a);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_in_place_is_accurate_and_alone_per_element() {
        let xs: Vec<f32> = (0..4001)
            .map(|i| -90.0 + i as f32 * 0.04473)
            .chain([
                0.0,
                -0.0,
                1e-30,
                -1e-30,
                88.29,
                88.31,
                100.0,
                f32::INFINITY,
                f32::NEG_INFINITY,
            ])
            .collect();
        let mut all = xs.clone();
        exp_in_place(&mut all);
        for (i, (&x, &e)) in xs.iter().zip(&all).enumerate() {
            // the same bits alone (the tail path) as inside a long slice
            let mut one = [x];
            exp_in_place(&mut one);
            assert_eq!(one[0].to_bits(), e.to_bits(), "element {i}: exp({x})");
            let want = (x as f64).exp();
            if x > 88.3 {
                assert_eq!(e, f32::INFINITY, "exp({x})");
            } else if x < -87.3 {
                assert_eq!(e, 0.0, "exp({x})");
            } else {
                assert!(((e as f64 - want) / want).abs() < 4e-7, "exp({x}) = {e}, want {want}");
            }
        }
        let mut nan = [f32::NAN; 3];
        exp_in_place(&mut nan);
        assert!(nan.iter().all(|v| *v == 0.0 || v.is_nan()));
    }

    #[test]
    fn max_of_is_the_largest() {
        assert_eq!(max_of(&[]), f32::NEG_INFINITY);
        for n in [1usize, 7, 8, 9, 17, 300] {
            let mut x: Vec<f32> = (0..n).map(|i| ((i * 7919) % 101) as f32 - 50.0).collect();
            x[0] = f32::NEG_INFINITY;
            let want = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            assert_eq!(max_of(&x), want, "n {n}");
            // the largest in the tail, past the whole chunks of 8
            x[n - 1] = 1e9;
            assert_eq!(max_of(&x), if n == 1 { 1e9 } else { 1e9f32.max(want) });
        }
    }

    /// The weighted sums of V give the AVX2 path's bits on every path this machine has (AVX-512's one-
    /// and two-head kernels included), for the head_dims kvgate serves.
    #[test]
    fn weighted_sums_give_the_same_bits_on_every_path() {
        let mut seed = 7u32;
        let mut next = || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 8) as f32 / (1 << 24) as f32 - 0.5
        };
        for (len, n) in [(64usize, 16usize), (64, 3), (128, 16), (80, 5), (32, 1)] {
            let xs: Vec<f32> = (0..len * n).map(|_| next()).collect();
            let (w0, w1): (Vec<f32>, Vec<f32>) = (0..n).map(|_| (next(), next())).unzip();
            let a: Vec<f32> = (0..len).map(|_| next()).collect();
            let b: Vec<f32> = (0..len).map(|_| next()).collect();
            // the reference: one axpy per vector, fused, j ascending
            let (mut r0, mut r1) = (a.clone(), b.clone());
            for j in 0..n {
                axpy(&mut r0, w0[j], &xs[j * len..(j + 1) * len]);
                axpy(&mut r1, w1[j], &xs[j * len..(j + 1) * len]);
            }
            let mut one = a.clone();
            axpy_many(&mut one, &w0, &xs);
            let (mut t0, mut t1) = (a.clone(), b.clone());
            axpy_many2(&mut t0, &mut t1, &w0, &w1, &xs);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&one), bits(&r0), "len {len}");
            assert_eq!(bits(&t0), bits(&r0), "len {len}");
            assert_eq!(bits(&t1), bits(&r1), "len {len}");
        }
    }
}
