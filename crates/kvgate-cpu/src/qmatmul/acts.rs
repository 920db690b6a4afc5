//! Activations quantized for the integer kernels ([`super::kernel_int`]): each row's inputs in groups of
//! 32, each group scaled by its own `amax / M` and rounded to the nearest integer in `-M..=M`. For 4-, 5-
//! and 6-bit weights (whose kernels multiply bytes, four products a lane) M = 127, llama.cpp's `q8_0` for
//! activations (finer than the `q8_K` it gives Q6_K: one scale per 256); for 8-bit weights (Q8_0, whose
//! kernel multiplies 16-bit lanes, `vpmaddwd`) M = 32767 at the same speed, 258× finer, f32-accurate to
//! ~1e-5. Q6_K (the LM heads of Q4_K_M GGUFs, half their `ffn_down`) went from 16-bit codes to bytes
//! when its kernel went to four products a lane: on the four GGUFs of `tests/gguf_real_weights.rs` the
//! 8-bit path's logprobs stay within llama.cpp's own error (pooled max 0.535 / mean 0.056 against its
//! 0.655 / 0.087). A row's quantization depends on that row alone, so the integer path keeps batch
//! invariance; it is not f32 accuracy (the rounding error of a group is up to `amax / 254` per input),
//! which is why decisions never take it.

use rayon::prelude::*;

use super::QK;

/// Quantized rows: values (as bytes for the 4-, 5- and 6-bit kernels, as 16-bit for the 8-bit one;
/// the same integers), one scale per 32 inputs, each group's `sx · Σ q` (the offset term's block sum)
/// and, for the 6-bit kernel ([`QuantRows::with_sums16`]), the integer `Σ q` of every 16 inputs (its
/// unsigned weights `q + 32` meet the codes: `32 · Σ q` comes back off).
#[derive(Debug, Default)]
pub(super) struct QuantRows {
    pub(super) q8: Vec<i8>,
    pub(super) q16: Vec<i16>,
    pub(super) sx: Vec<f32>,
    pub(super) sums: Vec<f32>,
    pub(super) sums16: Vec<i32>,
}

/// An integer code type: bytes (max 127) or 16-bit lanes (max 32767).
pub(super) trait Code: Copy + Default + Send {
    /// The largest code magnitude.
    const MAX: f32;
    /// The code of an integer within ±MAX.
    fn of(v: i32) -> Self;
    /// Stores sixteen 32-bit codes (each within ±MAX) at `out`.
    ///
    /// # Safety
    /// AVX-512F is available; `out` has room for sixteen codes.
    #[cfg(target_arch = "x86_64")]
    unsafe fn store16(out: *mut Self, v: std::arch::x86_64::__m512i);
    /// Stores thirty-two 32-bit codes (each within ±MAX), eight per register, in order, at `out`.
    ///
    /// # Safety
    /// AVX2 is available; `out` has room for thirty-two codes.
    #[cfg(target_arch = "x86_64")]
    unsafe fn store32(out: *mut Self, v: [std::arch::x86_64::__m256i; 4]);
}

impl Code for i8 {
    const MAX: f32 = 127.0;
    fn of(v: i32) -> i8 {
        v as i8
    }
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn store16(out: *mut i8, v: std::arch::x86_64::__m512i) {
        use std::arch::x86_64::*;
        // SAFETY: as the caller guarantees.
        unsafe { _mm_storeu_si128(out as *mut __m128i, _mm512_cvtepi32_epi8(v)) }
    }
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn store32(out: *mut i8, v: [std::arch::x86_64::__m256i; 4]) {
        use std::arch::x86_64::*;
        // packs work per 128-bit lane: dwords come out as q0 q1 q2 q3 (first halves), then the
        // second halves; one permute puts each register's eight bytes back in order (no value
        // saturates: every code is within ±127)
        let a = _mm256_packs_epi32(v[0], v[1]);
        let b = _mm256_packs_epi32(v[2], v[3]);
        let c = _mm256_packs_epi16(a, b);
        let c = _mm256_permutevar8x32_epi32(c, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        // SAFETY: as the caller guarantees.
        unsafe { _mm256_storeu_si256(out as *mut __m256i, c) }
    }
}

impl Code for i16 {
    const MAX: f32 = 32767.0;
    fn of(v: i32) -> i16 {
        v as i16
    }
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn store16(out: *mut i16, v: std::arch::x86_64::__m512i) {
        use std::arch::x86_64::*;
        // SAFETY: as the caller guarantees.
        unsafe { _mm256_storeu_si256(out as *mut __m256i, _mm512_cvtepi32_epi16(v)) }
    }
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn store32(out: *mut i16, v: [std::arch::x86_64::__m256i; 4]) {
        use std::arch::x86_64::*;
        for h in 0..2 {
            // per lane: four of the first register, four of the second; the permute restores order
            let p = _mm256_packs_epi32(v[2 * h], v[2 * h + 1]);
            let p = _mm256_permute4x64_epi64::<0b11_01_10_00>(p);
            // SAFETY: as the caller guarantees (sixteen codes per half).
            unsafe { _mm256_storeu_si256(out.add(16 * h) as *mut __m256i, p) }
        }
    }
}

/// The codes of one group of 32 inputs; returns its scale and `scale · Σ q` (ties round to even, as the
/// vector instructions round).
#[inline]
fn group<T: Code>(x: &[f32], out: &mut [T]) -> (f32, f32) {
    #[cfg(target_arch = "x86_64")]
    if *super::kernel::PATH == super::kernel::Path::Avx512 && x.len() == QK && out.len() == QK {
        // SAFETY: the AVX-512 path implies AVX-512F; 32 inputs and 32 codes (checked).
        return unsafe { group512(x, out) };
    }
    #[cfg(target_arch = "x86_64")]
    if *super::kernel::PATH == super::kernel::Path::Avx2 && x.len() == QK && out.len() == QK {
        // SAFETY: the AVX2 path implies AVX2; 32 inputs and 32 codes (checked).
        return unsafe { group256(x, out) };
    }
    group_scalar(x, out)
}

/// [`group`] one input at a time (machines without AVX-512, and the reference its vector form is
/// tested against).
#[inline]
fn group_scalar<T: Code>(x: &[f32], out: &mut [T]) -> (f32, f32) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let (d, id) = if amax > 0.0 {
        (amax / T::MAX, T::MAX / amax)
    } else {
        (0.0, 0.0)
    };
    let mut sum = 0i32;
    for (o, v) in out.iter_mut().zip(x) {
        let q = (v * id).round_ties_even().clamp(-T::MAX, T::MAX) as i32;
        sum += q;
        *o = T::of(q);
    }
    (d, sum as f32 * d)
}

/// [`group`] in two 16-lane registers, the same bits: the amax of the non-NaN magnitudes (`f32::max`
/// ignores NaN; a max is exact in any order), the same scalar scale, one product per input, rounded to
/// the nearest integer with ties to even (`vrndscaleps`), clamped to ±MAX, NaN to 0 (as Rust's `as
/// i32`), and an integer sum (exact in any order). Tested against the scalar loop.
///
/// # Safety
/// AVX-512F is available; `x` and `out` hold 32 elements.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn group512<T: Code>(x: &[f32], out: &mut [T]) -> (f32, f32) {
    use std::arch::x86_64::*;
    // SAFETY: 32 inputs and 32 codes, as the caller guarantees.
    unsafe {
        let v = [_mm512_loadu_ps(x.as_ptr()), _mm512_loadu_ps(x.as_ptr().add(16))];
        let ord = v.map(|v| _mm512_cmp_ps_mask::<_CMP_ORD_Q>(v, v));
        let mag = [0, 1].map(|h| _mm512_maskz_mov_ps(ord[h], _mm512_abs_ps(v[h])));
        let amax = _mm512_reduce_max_ps(_mm512_max_ps(mag[0], mag[1]));
        let (d, id) = if amax > 0.0 {
            (amax / T::MAX, T::MAX / amax)
        } else {
            (0.0, 0.0)
        };
        let (lo, hi) = (_mm512_set1_ps(-T::MAX), _mm512_set1_ps(T::MAX));
        let mut sum = _mm512_setzero_si512();
        for (h, &v) in v.iter().enumerate() {
            let y = _mm512_mul_ps(v, _mm512_set1_ps(id));
            let r = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(y);
            let c = _mm512_min_ps(_mm512_max_ps(r, lo), hi);
            let q = _mm512_maskz_cvtps_epi32(_mm512_cmp_ps_mask::<_CMP_ORD_Q>(y, y), c);
            sum = _mm512_add_epi32(sum, q);
            T::store16(out.as_mut_ptr().add(16 * h), q);
        }
        (d, _mm512_reduce_add_epi32(sum) as f32 * d)
    }
}

/// [`group512`] in four 8-lane registers (machines with AVX2 only): the same bits by the same steps —
/// the amax of the non-NaN magnitudes, the scalar scale, one product per input, `vroundps` to the
/// nearest with ties to even, the clamp, NaN to 0 (masked after the conversion), an integer sum.
///
/// # Safety
/// AVX2 is available; `x` and `out` hold 32 elements.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn group256<T: Code>(x: &[f32], out: &mut [T]) -> (f32, f32) {
    use std::arch::x86_64::*;
    // SAFETY: 32 inputs and 32 codes, as the caller guarantees.
    unsafe {
        let v: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(x.as_ptr().add(8 * i)));
        let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
        let ord = v.map(|v| _mm256_cmp_ps::<_CMP_ORD_Q>(v, v));
        let mag: [__m256; 4] = std::array::from_fn(|i| _mm256_and_ps(_mm256_and_ps(v[i], abs), ord[i]));
        let m = _mm256_max_ps(_mm256_max_ps(mag[0], mag[1]), _mm256_max_ps(mag[2], mag[3]));
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps::<0b01>(m, m)));
        let (d, id) = if amax > 0.0 {
            (amax / T::MAX, T::MAX / amax)
        } else {
            (0.0, 0.0)
        };
        let (lo, hi, scale) = (_mm256_set1_ps(-T::MAX), _mm256_set1_ps(T::MAX), _mm256_set1_ps(id));
        let mut sum = _mm256_setzero_si256();
        let q: [__m256i; 4] = std::array::from_fn(|i| {
            let y = _mm256_mul_ps(v[i], scale);
            let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(y);
            let c = _mm256_min_ps(_mm256_max_ps(r, lo), hi);
            let keep = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_ORD_Q>(y, y));
            let q = _mm256_and_si256(_mm256_cvtps_epi32(c), keep);
            sum = _mm256_add_epi32(sum, q);
            q
        });
        T::store32(out.as_mut_ptr(), q);
        let s = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256::<1>(sum));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
        (d, _mm_cvtsi128_si32(s) as f32 * d)
    }
}

/// Quantizes the marked rows of `x` into `q` (`rows × k`), `sx` and `sums` (`rows × k/32`).
fn quantize<T: Code>(x: &[f32], k: usize, which: &[bool], sx: &mut [f32], sums: &mut [f32]) -> Vec<T> {
    let groups = k / QK;
    let mut q = vec![T::default(); which.len() * k];
    q.par_chunks_mut(k)
        .zip(sx.par_chunks_mut(groups))
        .zip(sums.par_chunks_mut(groups))
        .zip(x.par_chunks(k))
        .zip(which.par_iter())
        .with_min_len(8)
        .filter(|(_, &w)| w)
        .for_each(|((((q, s), sum), x), _)| {
            let groups = q.chunks_exact_mut(QK).zip(s.iter_mut().zip(sum.iter_mut()));
            for ((q, (s, sum)), x) in groups.zip(x.chunks_exact(QK)) {
                (*s, *sum) = group(x, q);
            }
        });
    q
}

impl QuantRows {
    /// Quantizes the rows of `x` (`rows × k`, `k` a multiple of 32) marked in `which` (others are
    /// left zero and never read); `wide` stores 16-bit codes (within ±32767), otherwise bytes (±127).
    pub(super) fn new(x: &[f32], k: usize, which: &[bool], wide: bool) -> QuantRows {
        let mut sx = vec![0f32; which.len() * (k / QK)];
        let mut sums = sx.clone();
        if wide {
            let q16 = quantize::<i16>(x, k, which, &mut sx, &mut sums);
            QuantRows {
                q8: Vec::new(),
                q16,
                sx,
                sums,
                sums16: Vec::new(),
            }
        } else {
            let q8 = quantize::<i8>(x, k, which, &mut sx, &mut sums);
            QuantRows {
                q8,
                q16: Vec::new(),
                sx,
                sums,
                sums16: Vec::new(),
            }
        }
    }

    /// These byte codes with their integer sums of every 16 (`sums16`, which the 6-bit kernel reads;
    /// the other kinds do not need them).
    pub(super) fn with_sums16(mut self, k: usize, which: &[bool]) -> QuantRows {
        assert!(self.q16.is_empty(), "sums of 16 are of byte codes");
        let mut sums16 = vec![0i32; which.len() * (k / 16)];
        sums16
            .par_chunks_mut(k / 16)
            .zip(self.q8.par_chunks(k))
            .zip(which.par_iter())
            .with_min_len(8)
            .filter(|(_, &w)| w)
            .for_each(|((out, q), _)| {
                for (o, g) in out.iter_mut().zip(q.chunks_exact(16)) {
                    *o = g.iter().map(|&v| v as i32).sum();
                }
            });
        self.sums16 = sums16;
        self
    }

    /// The value of row `r`, input `i` (the scalar kernel).
    pub(super) fn value(&self, k: usize, r: usize, i: usize) -> i32 {
        if self.q16.is_empty() {
            self.q8[r * k + i] as i32
        } else {
            self.q16[r * k + i] as i32
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_scale_by_their_own_amax() {
        let mut x = vec![0f32; 64];
        x[0] = -2.54;
        x[1] = 1.0;
        x[40] = 0.5;
        let q = QuantRows::new(&x, 64, &[true], true);
        assert_eq!(q.sx, vec![2.54 / 32767.0, 0.5 / 32767.0]);
        assert_eq!(
            (q.value(64, 0, 0), q.value(64, 0, 1), q.value(64, 0, 40)),
            (-32767, 12900, 32767)
        );
        assert_eq!(q.value(64, 0, 2), 0);
        let b = QuantRows::new(&x, 64, &[true], false);
        assert_eq!(b.sx, vec![2.54 / 127.0, 0.5 / 127.0]);
        assert_eq!(
            (b.value(64, 0, 0), b.value(64, 0, 1), b.value(64, 0, 40)),
            (-127, 50, 127)
        );
        // an all-zero group has scale 0 and zeros
        assert_eq!(QuantRows::new(&[0.0; 32], 32, &[true], true).sx, vec![0.0]);
    }

    fn same<T: Code + PartialEq + std::fmt::Debug>(x: &[f32]) {
        let (mut a, mut b) = (vec![T::default(); 32], vec![T::default(); 32]);
        let (ga, gb) = (group(x, &mut a), group_scalar(x, &mut b));
        assert_eq!(a, b, "{x:?}");
        assert_eq!(
            (ga.0.to_bits(), ga.1.to_bits()),
            (gb.0.to_bits(), gb.1.to_bits()),
            "{x:?}"
        );
        // every vector form this machine has (the AVX2 one on an AVX-512 host too)
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            let mut c = vec![T::default(); 32];
            // SAFETY: AVX2 detected just above; 32 inputs and codes.
            let gc = unsafe { group256(x, &mut c) };
            assert_eq!(c, b, "avx2 {x:?}");
            assert_eq!(
                (gc.0.to_bits(), gc.1.to_bits()),
                (gb.0.to_bits(), gb.1.to_bits()),
                "avx2 {x:?}"
            );
        }
    }

    #[test]
    fn the_vector_group_is_the_scalar_loop() {
        let mut s = 0x9e37_79b9u32;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            s
        };
        for case in 0..4000 {
            let mut x: Vec<f32> = (0..32)
                .map(|_| (next() as i32 as f32) * 2f32.powi(case % 40 - 50))
                .collect();
            match case % 7 {
                // exact ties: amax 127 (or 32767), inputs at k + 0.5
                0 => {
                    x[0] = 127.0;
                    for (i, v) in x.iter_mut().enumerate().skip(1) {
                        *v = (i as f32 - 16.0) + 0.5;
                    }
                }
                1 => x[(next() % 32) as usize] = f32::NAN,
                2 => x[(next() % 32) as usize] = f32::INFINITY,
                3 => x.iter_mut().for_each(|v| *v = 0.0),
                4 => x.iter_mut().for_each(|v| *v = f32::from_bits(next() % 0x0080_0000)),
                5 => {
                    x[0] = 32767.0;
                    x[1] = -0.5;
                    x[2] = 1.5;
                    x[3] = -0.0;
                }
                _ => {}
            }
            same::<i8>(&x);
            same::<i16>(&x);
        }
    }
}
