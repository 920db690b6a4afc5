//! NVFP4: E2M1 4-bit values (magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 is the sign), one E4M3 scale
//! byte per group of 16 consecutive elements, and a per-layer f32 global scale `gs`.
//!
//! Per group: `sf = e4m3(gs · amax / 6)` (the stored byte), `q_i = e2m1(x_i · gs / f32(sf))` (0 when
//! `sf` decodes to 0), and `x_i ≈ e2m1(q_i) · f32(sf) / gs`. Packing: element 2i in the low nibble,
//! element 2i+1 in the high nibble. Matches vLLM's `ref_nvfp4_quant` (the rounded scale is used for the
//! elements).

use super::fp8::{f32_to_e4m3, E4M3_LUT};

/// Largest E2M1 magnitude.
pub const E2M1_MAX: f32 = 6.0;

/// E2M1 magnitudes by code 0..7 (codes 8..15 are the negatives).
pub const E2M1_VALUES: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// f32 → E2M1 nibble, round-half-even, saturating at ±6; NaN → 0.
pub fn f32_to_e2m1(x: f32) -> u8 {
    if x.is_nan() {
        return 0;
    }
    let sign = ((x.to_bits() >> 28) & 8) as u8;
    let a = x.abs();
    // the number of rounding boundaries at or below `a`: the same thresholds (and ties) as the chain
    // `a ≤ 0.25 → 0, < 0.75 → 1, ≤ 1.25 → 2, < 1.75 → 3, ≤ 2.5 → 4, < 3.5 → 5, ≤ 5 → 6, else 7`,
    // without branches
    let m = u8::from(a > 0.25)
        + u8::from(a >= 0.75)
        + u8::from(a > 1.25)
        + u8::from(a >= 1.75)
        + u8::from(a > 2.5)
        + u8::from(a >= 3.5)
        + u8::from(a > 5.0);
    sign | m
}

/// E2M1 nibble → f32 (exact).
pub fn e2m1_to_f32(q: u8) -> f32 {
    E2M1_VALUES[(q & 0xF) as usize]
}

/// Encodes one group of 16 values with global scale `gs`: 8 packed data bytes and one scale byte.
pub fn nvfp4_encode_group(x: &[f32], gs: f32, data: &mut [u8], scale: &mut u8) {
    debug_assert_eq!(x.len(), 16);
    debug_assert_eq!(data.len(), 8);
    let amax = x.iter().fold(0f32, |m, v| if v.abs() > m { v.abs() } else { m });
    let sf = f32_to_e4m3(gs * amax / E2M1_MAX);
    *scale = sf;
    nvfp4_encode_with_scale(x, gs, sf, data);
}

/// Encodes one group of 16 values with global scale `gs` and the given scale byte `sf`:
/// `q_i = e2m1(x_i · gs / f32(sf))` (0 when `sf` decodes to 0).
pub fn nvfp4_encode_with_scale(x: &[f32], gs: f32, sf: u8, data: &mut [u8]) {
    let sf_f = E4M3_LUT[sf as usize];
    let mul = if sf_f == 0.0 || !sf_f.is_finite() {
        0.0
    } else {
        gs / sf_f
    };
    for (i, d) in data.iter_mut().enumerate() {
        let lo = f32_to_e2m1(x[2 * i] * mul);
        let hi = f32_to_e2m1(x[2 * i + 1] * mul);
        *d = lo | (hi << 4);
    }
}

/// Decodes one group: `out[i] = e2m1(q_i) · f32(sf) / gs`.
#[inline]
pub fn nvfp4_decode_group(data: &[u8], scale: u8, gs: f32, out: &mut [f32]) {
    let s = E4M3_LUT[scale as usize] / gs;
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2"))]
    if data.len() == 8 && out.len() >= 16 {
        // SAFETY: avx2 is enabled at compile time; `data` has 8 bytes and `out` at least 16 floats.
        unsafe { avx2::decode16(data, s, out) };
        return;
    }
    // The 16 scaled values once, then a table lookup per nibble.
    let table: [f32; 16] = std::array::from_fn(|i| E2M1_VALUES[i] * s);
    for (pair, d) in out.chunks_exact_mut(2).zip(data) {
        pair[0] = table[(d & 0xF) as usize];
        pair[1] = table[(d >> 4) as usize];
    }
}

#[cfg(all(target_arch = "x86_64", target_feature = "avx2"))]
mod avx2 {
    use std::arch::x86_64::*;

    /// Decodes 16 packed E2M1 values times `s`: the magnitude through a register table, the sign moved
    /// to bit 31 (the same products as the scalar table, so the same bits).
    ///
    /// SAFETY (caller): avx2 available, `data.len() == 8`, `out.len() >= 16`.
    #[target_feature(enable = "avx2")]
    pub unsafe fn decode16(data: &[u8], s: f32, out: &mut [f32]) {
        let raw = _mm_loadl_epi64(data.as_ptr() as *const __m128i);
        let m = _mm_set1_epi8(0x0F);
        let lo = _mm_and_si128(raw, m);
        let hi = _mm_and_si128(_mm_srli_epi16(raw, 4), m);
        let nib = _mm_unpacklo_epi8(lo, hi); // element 2i = low nibble of byte i, 2i+1 = high
        let table = _mm256_mul_ps(
            _mm256_setr_ps(0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0),
            _mm256_set1_ps(s),
        );
        for half in 0..2 {
            let v = _mm256_cvtepu8_epi32(if half == 0 { nib } else { _mm_srli_si128(nib, 8) });
            let mag = _mm256_and_si256(v, _mm256_set1_epi32(7));
            let sign = _mm256_slli_epi32(_mm256_and_si256(v, _mm256_set1_epi32(8)), 28);
            let val = _mm256_permutevar8x32_ps(table, mag);
            let r = _mm256_or_ps(val, _mm256_castsi256_ps(sign));
            _mm256_storeu_ps(out.as_mut_ptr().add(8 * half), r);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::fp8::e4m3_to_f32;

    #[test]
    fn every_code_round_trips() {
        for q in 0..16u8 {
            let v = e2m1_to_f32(q);
            assert_eq!(f32_to_e2m1(v), q, "code {q}");
        }
    }

    #[test]
    fn ties_go_to_even_and_saturate() {
        let cases = [
            (0.25, 0),
            (0.2500001, 1),
            (0.75, 2),
            (0.7499999, 1),
            (1.25, 2),
            (1.2500001, 3),
            (1.75, 4),
            (2.5, 4),
            (2.5000002, 5),
            (3.5, 6),
            (3.4999998, 5),
            (5.0, 6),
            (5.0000005, 7),
            (6.0, 7),
            (7.0, 7),
            (1e30, 7),
            (f32::INFINITY, 7),
        ];
        for (x, q) in cases {
            assert_eq!(f32_to_e2m1(x), q, "{x}");
            assert_eq!(f32_to_e2m1(-x), q | 8, "-{x}");
        }
        assert_eq!(f32_to_e2m1(-0.0), 8);
        assert_eq!(f32_to_e2m1(0.0), 0);
        assert_eq!(f32_to_e2m1(f32::NAN), 0);
    }

    #[test]
    fn group_packs_low_nibble_first_and_uses_the_rounded_scale() {
        let mut x = [0f32; 16];
        x[0] = 6.0; // amax 6 → sf = e4m3(1.0) = 0x38
        x[1] = -3.0;
        x[2] = 0.5;
        let mut data = [0u8; 8];
        let mut sf = 0u8;
        nvfp4_encode_group(&x, 1.0, &mut data, &mut sf);
        assert_eq!(sf, 0x38);
        assert_eq!(e4m3_to_f32(sf), 1.0);
        assert_eq!(data[0], 0x7 | (0xD << 4)); // 6 low, -3 high
        assert_eq!(data[1], 0x1); // 0.5 low, 0 high
        let mut out = [0f32; 16];
        nvfp4_decode_group(&data, sf, 1.0, &mut out);
        assert_eq!(&out[..3], &[6.0, -3.0, 0.5]);
    }

    #[test]
    fn vector_decode_equals_the_table_decode() {
        for seed in 0..64u32 {
            let data: Vec<u8> = (0..8)
                .map(|i| (seed.wrapping_mul(2654435761).rotate_left(i * 4) >> 3) as u8)
                .collect();
            let mut a = [0f32; 16];
            nvfp4_decode_group(&data, (seed * 7) as u8 & 0x7E, 1.7, &mut a);
            let s = E4M3_LUT[((seed * 7) as u8 & 0x7E) as usize] / 1.7;
            for (i, d) in data.iter().enumerate() {
                assert_eq!(a[2 * i].to_bits(), (E2M1_VALUES[(d & 0xF) as usize] * s).to_bits());
                assert_eq!(a[2 * i + 1].to_bits(), (E2M1_VALUES[(d >> 4) as usize] * s).to_bits());
            }
        }
    }

    #[test]
    fn zero_group_and_global_scale() {
        let x = [0f32; 16];
        let mut data = [0xFFu8; 8];
        let mut sf = 0xFF;
        nvfp4_encode_group(&x, 2.0, &mut data, &mut sf);
        assert_eq!(sf, 0);
        assert!(data.iter().all(|&d| d == 0));
        // gs scales into range: values of amax 0.06 with gs = 100 use a scale of e4m3(1.0)
        let mut y = [0f32; 16];
        y[3] = 0.06;
        y[4] = -0.03;
        nvfp4_encode_group(&y, 100.0, &mut data, &mut sf);
        let mut out = [0f32; 16];
        nvfp4_decode_group(&data, sf, 100.0, &mut out);
        assert!((out[3] - 0.06).abs() < 1e-6 && (out[4] + 0.03).abs() < 1e-6, "{out:?}");
    }
}
