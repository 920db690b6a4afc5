//! FP8 E4M3 (OCP "fn" variant: bias 7, max ±448, no infinities, NaN = `S.1111.111`) and FP8 E5M2
//! (bias 15, max ±57344, IEEE-like infinities and NaNs) encoders and decoders.
//!
//! Encoding is round-to-nearest-even with saturation to the largest finite magnitude (what PTX
//! `cvt.rn.satfinite.e4m3x2.f32` does); infinities saturate too; every NaN encodes to `0x7F`, whatever its sign
//! bit (a GPU's arithmetic returns the canonical, positive NaN, and the hardware `cvt` drops the sign: a
//! sign-keeping rule would make CPU and CUDA caches differ on `-NaN · scale`, as the first H200 run showed). The E4M3
//! encoder is the reference encoder of `shared/notes/gpu-build.md` §7.3, which was checked against
//! `ml_dtypes` on three million inputs.

/// Largest finite E4M3 magnitude.
pub const E4M3_MAX: f32 = 448.0;
/// Largest finite E5M2 magnitude.
pub const E5M2_MAX: f32 = 57344.0;

/// f32 → E4M3, round-half-even, saturating to ±448; NaN (either sign) → `0x7F`.
pub fn f32_to_e4m3(x: f32) -> u8 {
    let sign = ((x.to_bits() >> 24) & 0x80) as u8;
    if x.is_nan() {
        return 0x7F;
    }
    let ax = x.abs();
    if ax >= E4M3_MAX {
        return sign | 0x7E;
    }
    if ax < 0.015625 {
        // Subnormals: step 2^-9; a result of 8 is the smallest normal, which is the right code.
        return sign | (ax * 512.0).round_ties_even() as u8;
    }
    let u = ax.to_bits();
    let e = (u >> 23) as i32 - 127; // -6..=8
    let mant = u & 0x7F_FFFF;
    let mut code = (((e + 7) as u32) << 3) | (mant >> 20);
    let rem = mant & 0xF_FFFF;
    if rem > 0x8_0000 || (rem == 0x8_0000 && code & 1 == 1) {
        code += 1; // a carry into the exponent is the correct next value
    }
    sign | code.min(0x7E) as u8
}

/// E4M3 → f32 (exact).
pub fn e4m3_to_f32(b: u8) -> f32 {
    let exp = ((b >> 3) & 0xF) as i32;
    let man = (b & 0x7) as f32;
    let v = if exp == 0xF && (b & 0x7) == 0x7 {
        f32::NAN
    } else if exp == 0 {
        man * (1.0 / 512.0)
    } else {
        (1.0 + man * 0.125) * 2f32.powi(exp - 7)
    };
    if b & 0x80 != 0 {
        -v
    } else {
        v
    }
}

/// f32 → E5M2, round-half-even, saturating to ±57344; NaN (either sign) → `0x7F`.
pub fn f32_to_e5m2(x: f32) -> u8 {
    let sign = ((x.to_bits() >> 24) & 0x80) as u8;
    if x.is_nan() {
        return 0x7F;
    }
    let ax = x.abs();
    if ax >= E5M2_MAX {
        return sign | 0x7B;
    }
    if ax < 6.103_515_6e-5 {
        // Subnormals below 2^-14: step 2^-16; a result of 4 is the smallest normal.
        return sign | (ax * 65536.0).round_ties_even() as u8;
    }
    let u = ax.to_bits();
    let e = (u >> 23) as i32 - 127; // -14..=15
    let mant = u & 0x7F_FFFF;
    let mut code = (((e + 15) as u32) << 2) | (mant >> 21);
    let rem = mant & 0x1F_FFFF;
    if rem > 0x10_0000 || (rem == 0x10_0000 && code & 1 == 1) {
        code += 1;
    }
    sign | code.min(0x7B) as u8
}

/// E5M2 → f32 (exact): an E5M2 byte is the high byte of an IEEE half.
pub fn e5m2_to_f32(b: u8) -> f32 {
    half::f16::from_bits((b as u16) << 8).to_f32()
}

/// All 256 E4M3 codes decoded, for table lookups in the attention inner loop.
pub static E4M3_LUT: std::sync::LazyLock<[f32; 256]> =
    std::sync::LazyLock::new(|| std::array::from_fn(|i| e4m3_to_f32(i as u8)));

/// All 256 E5M2 codes decoded.
pub static E5M2_LUT: std::sync::LazyLock<[f32; 256]> =
    std::sync::LazyLock::new(|| std::array::from_fn(|i| e5m2_to_f32(i as u8)));

#[cfg(test)]
mod tests {
    use super::*;

    fn finite_codes(decode: fn(u8) -> f32) -> Vec<(u8, f32)> {
        (0..=255u8)
            .map(|c| (c, decode(c)))
            .filter(|(_, v)| v.is_finite())
            .collect()
    }

    #[test]
    fn e4m3_every_code_round_trips() {
        let codes = finite_codes(e4m3_to_f32);
        assert_eq!(codes.len(), 254); // 256 minus the two NaNs
        for (c, v) in codes {
            let back = f32_to_e4m3(v);
            if v == 0.0 {
                assert_eq!(back, c, "signed zero {c:#x}");
            } else {
                assert_eq!(back, c, "code {c:#x} value {v}");
            }
        }
        assert!(e4m3_to_f32(0x7F).is_nan() && e4m3_to_f32(0xFF).is_nan());
    }

    #[test]
    fn e5m2_every_code_round_trips() {
        let codes = finite_codes(e5m2_to_f32);
        assert_eq!(codes.len(), 256 - 8); // ±inf and 6 NaNs
        for (c, v) in codes {
            assert_eq!(f32_to_e5m2(v), c, "code {c:#x} value {v}");
        }
    }

    /// Every midpoint between neighbouring positive finite values goes to the even code, and one ulp either
    /// side goes to the nearer one.
    fn check_ties(decode: fn(u8) -> f32, encode: fn(f32) -> u8, max_code: u8) {
        for c in 0..max_code {
            let (lo, hi) = (decode(c), decode(c + 1));
            let mid = (lo + hi) / 2.0;
            let even = if c % 2 == 0 { c } else { c + 1 };
            assert_eq!(encode(mid), even, "tie between {c:#x} and {:#x}", c + 1);
            assert_eq!(encode(f32::from_bits(mid.to_bits() - 1)), c, "below tie {c:#x}");
            assert_eq!(encode(f32::from_bits(mid.to_bits() + 1)), c + 1, "above tie {c:#x}");
            assert_eq!(encode(-mid), 0x80 | even);
        }
    }

    #[test]
    fn e4m3_ties_to_even() {
        check_ties(e4m3_to_f32, f32_to_e4m3, 0x7E);
    }

    #[test]
    fn e5m2_ties_to_even() {
        check_ties(e5m2_to_f32, f32_to_e5m2, 0x7B);
    }

    #[test]
    fn saturation_zero_and_nan() {
        for x in [448.0, 449.0, 464.0, 1000.0, 1e9, f32::INFINITY] {
            assert_eq!(f32_to_e4m3(x), 0x7E);
            assert_eq!(f32_to_e4m3(-x), 0xFE);
        }
        for x in [57344.0, 61440.0, 1e9, f32::INFINITY] {
            assert_eq!(f32_to_e5m2(x), 0x7B);
            assert_eq!(f32_to_e5m2(-x), 0xFB);
        }
        assert_eq!(f32_to_e4m3(0.0), 0x00);
        assert_eq!(f32_to_e4m3(-0.0), 0x80);
        assert_eq!(f32_to_e5m2(-0.0), 0x80);
        assert_eq!(f32_to_e4m3(f32::NAN), 0x7F);
        assert_eq!(f32_to_e4m3(-f32::NAN), 0x7F);
        assert_eq!(f32_to_e5m2(-f32::NAN), 0x7F);
        assert_eq!(f32_to_e5m2(f32::NAN), 0x7F);
    }

    #[test]
    fn subnormals() {
        // E4M3: smallest subnormal 2^-9, largest 7·2^-9, smallest normal 2^-6.
        assert_eq!(f32_to_e4m3(1.0 / 512.0), 0x01);
        assert_eq!(f32_to_e4m3(7.0 / 512.0), 0x07);
        assert_eq!(f32_to_e4m3(1.0 / 64.0), 0x08);
        assert_eq!(f32_to_e4m3(0.5 / 512.0), 0x00); // tie to even (0)
        assert_eq!(f32_to_e4m3(1.5 / 512.0), 0x02); // tie to even (2)
        assert_eq!(e4m3_to_f32(0x01), 1.0 / 512.0);
        // E5M2: smallest subnormal 2^-16, smallest normal 2^-14.
        assert_eq!(f32_to_e5m2(2f32.powi(-16)), 0x01);
        assert_eq!(f32_to_e5m2(3.0 * 2f32.powi(-16)), 0x03);
        assert_eq!(f32_to_e5m2(2f32.powi(-14)), 0x04);
        assert_eq!(f32_to_e5m2(0.5 * 2f32.powi(-16)), 0x00);
        assert_eq!(e5m2_to_f32(0x01), 2f32.powi(-16));
    }

    #[test]
    fn luts_match_decoders() {
        for c in 0..=255u8 {
            let (a, b) = (E4M3_LUT[c as usize], e4m3_to_f32(c));
            assert!(a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()));
            let (a, b) = (E5M2_LUT[c as usize], e5m2_to_f32(c));
            assert!(a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()));
        }
    }
}
