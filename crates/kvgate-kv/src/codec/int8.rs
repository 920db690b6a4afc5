//! Decoding the int8 cache format (symmetric codes, an f16 scale per [`INT8_GROUP`] elements) for
//! many stored vectors at once: what attention reads a block through.
//!
//! Guarantee: every element is `f32::from(code as i8) · scale`, one rounding, whatever the path — the
//! AVX-512 kernel (16 codes widened per instruction) gives the scalar loop's bits.

use half::f16;

use crate::dtype::INT8_GROUP;

/// Decodes `n` consecutive vectors of `hd` elements: `data` holds their codes (`hd` bytes each),
/// `scales` their little-endian f16 scales (`stride` bytes per vector, the group's scale at `2·g`);
/// `out[t·hd ..][..hd]` receives vector `t`. Panics if a slice is too short.
pub fn decode_vectors(data: &[u8], scales: &[u8], stride: usize, hd: usize, n: usize, out: &mut [f32]) {
    let groups = hd.div_ceil(INT8_GROUP);
    assert!(data.len() >= n * hd && out.len() >= n * hd && stride >= 2 * groups);
    assert!(n == 0 || scales.len() >= (n - 1) * stride + 2 * groups);
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
    if hd.is_multiple_of(INT8_GROUP) && *crate::attention::AVX512 {
        // SAFETY: AVX-512F detected at run time; the lengths asserted above cover every load and store
        // (whole groups of 32: `hd` is a multiple of it).
        unsafe { avx512::decode(data, scales, stride, hd, n, out) };
        return;
    }
    for t in 0..n {
        let (codes, o) = (&data[t * hd..(t + 1) * hd], &mut out[t * hd..(t + 1) * hd]);
        for (g, (o, q)) in o.chunks_mut(INT8_GROUP).zip(codes.chunks(INT8_GROUP)).enumerate() {
            let at = t * stride + 2 * g;
            let s = f16::from_le_bytes([scales[at], scales[at + 1]]).to_f32();
            for (y, &q) in o.iter_mut().zip(q) {
                *y = f32::from(q as i8) * s;
            }
        }
    }
}

#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
mod avx512 {
    use std::arch::x86_64::*;

    use half::f16;

    use crate::dtype::INT8_GROUP;

    /// SAFETY (caller): avx512f available; `hd % 32 == 0`; the slices as `decode_vectors` asserts.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn decode(data: &[u8], scales: &[u8], stride: usize, hd: usize, n: usize, out: &mut [f32]) {
        let (d, o) = (data.as_ptr(), out.as_mut_ptr());
        for t in 0..n {
            for g in 0..hd / INT8_GROUP {
                let at = t * stride + 2 * g;
                let s = _mm512_set1_ps(f16::from_le_bytes([scales[at], scales[at + 1]]).to_f32());
                let e = t * hd + g * INT8_GROUP;
                for half in 0..2 {
                    let codes = _mm_loadu_si128(d.add(e + 16 * half) as *const __m128i);
                    let x = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(codes));
                    _mm512_storeu_ps(o.add(e + 16 * half), _mm512_mul_ps(x, s));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's bits are the scalar loop's, for every code and a spread of scales.
    #[test]
    fn vectors_decode_to_code_times_scale() {
        let (hd, n, stride) = (64usize, 5usize, 6usize);
        let data: Vec<u8> = (0..n * hd).map(|i| (i * 37 % 256) as u8).collect();
        let mut scales = vec![0u8; n * stride];
        for t in 0..n {
            for g in 0..2 {
                let s = f16::from_f32(0.0123 * (t * 2 + g + 1) as f32 * if g == 1 { -1.0 } else { 1.0 });
                scales[t * stride + 2 * g..t * stride + 2 * g + 2].copy_from_slice(&s.to_le_bytes());
            }
        }
        let mut out = vec![0f32; n * hd];
        decode_vectors(&data, &scales, stride, hd, n, &mut out);
        for t in 0..n {
            for e in 0..hd {
                let at = t * stride + 2 * (e / 32);
                let s = f16::from_le_bytes([scales[at], scales[at + 1]]).to_f32();
                let want = f32::from(data[t * hd + e] as i8) * s;
                assert_eq!(out[t * hd + e].to_bits(), want.to_bits(), "t {t} e {e}");
            }
        }
    }
}
