//! How a quantized cache is written, beyond its dtype: an optional rotation of every K, V and Q head
//! vector before quantization, and the choice of scales. The method is part of [`crate::CacheShape`],
//! fixed when the cache is made and frozen once anything is written, so every block is read with the
//! transform and scales it was written with (prefix-cache hits included).
//!
//! - **Rotation** (`hadamard`): `R = H·D/√b` applied to each block of `b` elements of a head vector
//!   (`b` the largest power of two dividing `head_dim`, at least 16), `D` a fixed ±1 diagonal (a
//!   splitmix64 bit per element index, the same on every layer and head) and `H` the Walsh–Hadamard
//!   matrix. K and Q are rotated alike, so `q·k` is unchanged; V is rotated on store and the attention
//!   output rotated back with `Rᵀ = D·H/√b`. Outlier channels are spread over the whole block, which
//!   shrinks the error of products concentrated on a few channels and evens out NVFP4's groups.
//! - **Scales** (`fine`): fp8 stores one power-of-two scale per (token, head) vector (an E8M0 exponent
//!   byte, dynamic: the vector's amax is mapped into the format's top binade) instead of using the
//!   per-layer calibrated scale; nvfp4 keeps NVIDIA's format (E4M3 scale per 16 elements, per-layer f32
//!   global scale) and chooses each group's scale byte by least squared error among the codes from
//!   one below `amax/6` up to `amax/4` (the decoder is unchanged; never worse than `amax/6` alone).
//! - **Smoothing** (`smooth`): per-(layer, KV head, channel) offsets — the means of K and V over the
//!   first prefill — are subtracted before rotation and quantization. `q·(k − μ)` differs from `q·k` by
//!   a constant per query, which softmax ignores; `Σ p (v − μ) + μ = Σ p v` because the weights sum to
//!   one. Exact whatever the offsets are, so a poor first prefill costs precision, never correctness.
//!
//! The arithmetic here is the reference for `kernels/kv_cache.cu`: the butterflies, the sign bits, the
//! exponent rule and the search order are the same there, so stores agree byte for byte.

use crate::codec::fp8::{f32_to_e4m3, E4M3_LUT};
use crate::codec::nvfp4::{f32_to_e2m1, E2M1_VALUES};
use crate::dtype::KvDtype;
use crate::error::KvError;

/// The rotation applied before quantization.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Rotation {
    /// Stored as computed.
    #[default]
    None,
    /// Blockwise Walsh–Hadamard with fixed random signs.
    Hadamard,
}

/// Which scales quantized values use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Scales {
    /// fp8: the per-layer `k_scale`/`v_scale`; nvfp4: `sf = e4m3(gs·amax/6)` per group.
    #[default]
    Layer,
    /// fp8: a dynamic power-of-two scale per vector; nvfp4: least-squares group scales.
    Fine,
}

/// The quantization method of a cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct KvQuant {
    /// Rotation before quantization.
    pub rotation: Rotation,
    /// Scale granularity.
    pub scales: Scales,
    /// Per-channel offsets (the K and V means of the first prefill) subtracted before quantization:
    /// K's drop out of softmax, V's are added back to the attention output (its weights sum to one).
    pub smooth: bool,
}

const fn method(rotation: Rotation, scales: Scales, smooth: bool) -> KvQuant {
    KvQuant {
        rotation,
        scales,
        smooth,
    }
}

impl KvQuant {
    /// Plain per-layer scales, no rotation, no offsets (the format as the spec's table defines it).
    pub const PLAIN: KvQuant = method(Rotation::None, Scales::Layer, false);

    /// Every method, in the order reports list them.
    pub const ALL: [KvQuant; 8] = [
        KvQuant::PLAIN,
        method(Rotation::Hadamard, Scales::Layer, false),
        method(Rotation::None, Scales::Fine, false),
        method(Rotation::Hadamard, Scales::Fine, false),
        method(Rotation::None, Scales::Layer, true),
        method(Rotation::Hadamard, Scales::Layer, true),
        method(Rotation::None, Scales::Fine, true),
        method(Rotation::Hadamard, Scales::Fine, true),
    ];

    /// The methods of an int8 cache: its scales are always its own (an f16 per 32 elements), so only
    /// rotation and offsets vary (`plain`, `rotation`, `smooth`, `rotation+smooth`).
    pub const INT8: [KvQuant; 4] = [
        KvQuant::PLAIN,
        method(Rotation::Hadamard, Scales::Layer, false),
        method(Rotation::None, Scales::Layer, true),
        method(Rotation::Hadamard, Scales::Layer, true),
    ];

    /// The methods a cache of `dtype` can be written with: all eight for fp8 and nvfp4, the four of
    /// [`KvQuant::INT8`] for int8, plain for the float ones.
    pub fn methods_for(dtype: KvDtype) -> &'static [KvQuant] {
        if dtype.is_scaled() {
            &KvQuant::ALL
        } else if dtype == KvDtype::Int8 {
            &KvQuant::INT8
        } else {
            &KvQuant::ALL[..1]
        }
    }

    /// The method `--kv-cache-method auto` picks for `dtype`, chosen by `cargo bench --bench kv_report`
    /// (README, "KV cache"): fp8 and int8 `rotation+smooth`, nvfp4 `both+smooth` (the least drift of
    /// their rows), plain for the float dtypes, which have nothing to gain.
    pub fn default_for(dtype: KvDtype) -> KvQuant {
        match dtype {
            KvDtype::Fp8E4m3 | KvDtype::Fp8E5m2 => KvQuant::ALL[5],
            KvDtype::Nvfp4 => KvQuant::ALL[7],
            KvDtype::Int8 => KvQuant::INT8[3],
            _ => KvQuant::PLAIN,
        }
    }

    /// Parses a method name (see [`KvQuant::name`]).
    pub fn parse(s: &str) -> Option<KvQuant> {
        KvQuant::ALL
            .into_iter()
            .find(|q| q.name() == s.trim().to_ascii_lowercase())
    }

    /// The method's short name, as reports and metrics print it: `plain`, `rotation`, `fine`, `both`
    /// (rotation and fine), `smooth`, and the first three with `+smooth`.
    pub fn name(self) -> &'static str {
        match (self.rotation, self.scales, self.smooth) {
            (Rotation::None, Scales::Layer, false) => "plain",
            (Rotation::Hadamard, Scales::Layer, false) => "rotation",
            (Rotation::None, Scales::Fine, false) => "fine",
            (Rotation::Hadamard, Scales::Fine, false) => "both",
            (Rotation::None, Scales::Layer, true) => "smooth",
            (Rotation::Hadamard, Scales::Layer, true) => "rotation+smooth",
            (Rotation::None, Scales::Fine, true) => "fine+smooth",
            (Rotation::Hadamard, Scales::Fine, true) => "both+smooth",
        }
    }

    /// Checks that `dtype` at `head_dim` and `block_size` can be written with this method: anything but
    /// plain needs a quantized dtype, rotation a power-of-two block of at least 16 in `head_dim`, and fp8
    /// with per-vector scales a block size that is a multiple of 4 (the data stays 4-byte aligned).
    pub fn check(self, dtype: KvDtype, head_dim: usize, block_size: usize) -> Result<(), KvError> {
        if self == KvQuant::PLAIN {
            return Ok(());
        }
        if !dtype.is_quantized() {
            return Err(KvError::Unsupported {
                dtype: dtype.name(),
                reason: format!("the {} method applies to fp8, nvfp4 and int8 caches only", self.name()),
            });
        }
        if dtype == KvDtype::Int8 && self.scales == Scales::Fine {
            return Err(KvError::Unsupported {
                dtype: dtype.name(),
                reason: format!(
                    "the {} method: int8 always has its own scales (an f16 per 32 elements; use plain, rotation, smooth or rotation+smooth)",
                    self.name()
                ),
            });
        }
        if self.rotation == Rotation::Hadamard && hadamard_block(head_dim) < 16 {
            return Err(KvError::Unsupported {
                dtype: dtype.name(),
                reason: format!("rotation needs head_dim divisible by 16 (head_dim {head_dim})"),
            });
        }
        if self.extra_scale_bytes(dtype) > 0 && !block_size.is_multiple_of(4) {
            return Err(KvError::Unsupported {
                dtype: dtype.name(),
                reason: format!("fine scales need a block size that is a multiple of 4 (block size {block_size})"),
            });
        }
        Ok(())
    }

    /// Extra bytes per stored vector: fp8 `fine` keeps one exponent byte.
    pub fn extra_scale_bytes(self, dtype: KvDtype) -> usize {
        match (dtype, self.scales) {
            (KvDtype::Fp8E4m3 | KvDtype::Fp8E5m2, Scales::Fine) => 1,
            _ => 0,
        }
    }
}

/// The Hadamard block size for `head_dim`: its largest power-of-two divisor.
pub fn hadamard_block(head_dim: usize) -> usize {
    if head_dim == 0 {
        0
    } else {
        head_dim & head_dim.wrapping_neg()
    }
}

/// `1/√b` as an f32 (the CUDA kernels receive this value, so both sides scale by the same constant).
pub fn hadamard_norm(block: usize) -> f32 {
    (1.0 / (block as f64).sqrt()) as f32
}

/// Whether element `i`'s sign is flipped by `D`: the top bit of splitmix64(seed + i).
#[inline]
pub fn sign_flipped(i: usize) -> bool {
    let mut z = 0x6b76_6761_7465_0001u64.wrapping_add((i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    z >> 63 == 1
}

/// The sign pattern of a head vector: per element the bit XORed into it (`0x8000_0000` where `D`
/// flips the sign, 0 elsewhere).
pub fn sign_mask(head_dim: usize) -> Vec<u32> {
    (0..head_dim)
        .map(|i| if sign_flipped(i) { 0x8000_0000 } else { 0 })
        .collect()
}

/// The butterflies, stage by stage: `(a, c) ← (a + c, a − c)` on the pairs `h` apart (split slices, so
/// the wider stages vectorise; every element sees the same operations in the same order as the CUDA
/// kernel's).
fn butterflies(x: &mut [f32], block: usize) {
    for chunk in x.chunks_exact_mut(block) {
        let mut h = 1;
        while h < block {
            for pair in chunk.chunks_exact_mut(2 * h) {
                let (lo, hi) = pair.split_at_mut(h);
                for (a, c) in lo.iter_mut().zip(hi.iter_mut()) {
                    let (x, y) = (*a, *c);
                    *a = x + y;
                    *c = x - y;
                }
            }
            h *= 2;
        }
    }
}

/// `x ← H·D·x/√b` blockwise (a head vector; `signs` from [`sign_mask`]).
pub fn rotate(x: &mut [f32], signs: &[u32]) {
    let b = hadamard_block(x.len());
    for (v, &s) in x.iter_mut().zip(signs) {
        *v = f32::from_bits(v.to_bits() ^ s);
    }
    butterflies(x, b);
    let n = hadamard_norm(b);
    x.iter_mut().for_each(|v| *v *= n);
}

/// The inverse: `x ← D·H·x/√b`.
pub fn unrotate(x: &mut [f32], signs: &[u32]) {
    let b = hadamard_block(x.len());
    butterflies(x, b);
    let n = hadamard_norm(b);
    for (v, &s) in x.iter_mut().zip(signs) {
        *v = f32::from_bits((*v * n).to_bits() ^ s);
    }
}

/// int8: encodes one group into `q` and returns its f16 scale: among the scales `amax·c/127` for a few
/// clipping factors `c` ≤ 1 (each rounded to f16, as the decoder reads it), the one of least squared
/// error (ties: the larger). A zero or non-finite group stores scale 0 and codes 0.
pub fn int8_encode_group(x: &[f32], q: &mut [u8]) -> half::f16 {
    let amax = x.iter().fold(0f32, |m, v| if v.abs() > m { v.abs() } else { m });
    if !(amax > 0.0 && amax.is_finite()) {
        q.iter_mut().for_each(|c| *c = 0);
        return half::f16::ZERO;
    }
    // to the nearest code (ties to even: adding and removing 1.5·2²³ rounds in the FPU's mode), kept
    // within ±127; branch-free f32, so the loops vectorise
    const MAGIC: f32 = 12_582_912.0;
    let code = |v: f32, inv: f32| ((v * inv + MAGIC) - MAGIC).clamp(-127.0, 127.0);
    let mut best = (f32::INFINITY, half::f16::ZERO);
    for c in [1.0f32, 0.95, 0.9, 0.85, 0.8] {
        let s = half::f16::from_f32(amax * c / 127.0);
        let sf = s.to_f32();
        if !(sf > 0.0 && sf.is_finite()) {
            continue;
        }
        let inv = 1.0 / sf;
        // eight partial sums (independent lanes), folded in a fixed order
        let mut lanes = [0f32; 8];
        let chunks = x.chunks_exact(8);
        let rest = chunks.remainder();
        for ch in chunks {
            for (l, &v) in lanes.iter_mut().zip(ch) {
                let e = code(v, inv) * sf - v;
                *l += e * e;
            }
        }
        for (l, &v) in lanes.iter_mut().zip(rest) {
            let e = code(v, inv) * sf - v;
            *l += e * e;
        }
        let err = lanes.iter().sum::<f32>();
        if err < best.0 {
            best = (err, s);
        }
    }
    let sf = best.1.to_f32();
    let inv = if sf > 0.0 { 1.0 / sf } else { 0.0 };
    for (c, &v) in q.iter_mut().zip(x) {
        *c = code(v, inv) as i8 as u8;
    }
    best.1
}

/// fp8 `fine`: the exponent `e` of the vector's scale `2^e`, the least with `amax ≤ max·2^e` (`max` =
/// 448 for e4m3, 57344 for e5m2, both `1.75·2^m`), from the bits alone; 0 for a zero, subnormal or
/// non-finite amax. Stored as the byte `e + 127`.
pub fn fp8_vector_exponent(amax: f32, dtype: KvDtype) -> i32 {
    let m = if dtype == KvDtype::Fp8E5m2 { 15 } else { 8 };
    let bits = amax.to_bits() & 0x7FFF_FFFF;
    let field = (bits >> 23) as i32;
    if field == 0 || field == 0xFF {
        return 0;
    }
    let k = field - 127;
    // amax = 1.f · 2^k exceeds 1.75 · 2^k when the mantissa is above 0x600000
    k - m + i32::from(bits & 0x7F_FFFF > 0x60_0000)
}

/// `2^e` as an f32 for `e` in `-126..=127`.
#[inline]
pub fn pow2(e: i32) -> f32 {
    f32::from_bits(((e + 127) as u32) << 23)
}

/// nvfp4 `fine`: the scale byte of one group of 16 (global scale `gs`) with the least squared error
/// `Σ (x·gs − e2m1(q)·sf)²`, searched from the code below `e4m3(gs·amax/6)` up to `e4m3(gs·amax/4)`;
/// the standard code wins ties, then the lowest.
pub fn nvfp4_best_scale(x: &[f32], gs: f32) -> u8 {
    let amax = x.iter().fold(0f32, |m, v| if v.abs() > m { v.abs() } else { m });
    let standard = f32_to_e4m3(gs * amax / 6.0);
    let top = f32_to_e4m3(gs * amax / 4.0).min(0x7E);
    debug_assert_eq!(x.len(), 16);
    let xg: [f32; 16] = std::array::from_fn(|i| x[i] * gs);
    let err = |code: u8| -> f32 {
        let sf = E4M3_LUT[code as usize];
        let mut d2 = [0f32; 16];
        if sf == 0.0 || !sf.is_finite() {
            // every element stored as 0
            for (d, &v) in d2.iter_mut().zip(&xg) {
                *d = v * v;
            }
        } else {
            let mul = gs / sf;
            for ((d, &v), &g) in d2.iter_mut().zip(x).zip(&xg) {
                let e = g - E2M1_VALUES[f32_to_e2m1(v * mul) as usize] * sf;
                *d = e * e;
            }
        }
        // summed in element order (the CUDA kernel's order)
        d2.iter().fold(0f32, |e, &d| e + d)
    };
    let (mut best, mut best_err) = (standard, err(standard));
    for code in standard.saturating_sub(1)..=top.max(standard) {
        if code == standard {
            continue;
        }
        let e = err(code);
        if e < best_err {
            best = code;
            best_err = e;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::nvfp4::{nvfp4_decode_group, nvfp4_encode_group, nvfp4_encode_with_scale};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn rotation_is_orthogonal_and_undone() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        for hd in [16usize, 32, 64, 80, 96, 128, 256] {
            let signs = sign_mask(hd);
            let x: Vec<f32> = (0..hd).map(|_| rng.random_range(-4.0..4.0)).collect();
            let y: Vec<f32> = (0..hd).map(|_| rng.random_range(-4.0..4.0)).collect();
            let (mut rx, mut ry) = (x.clone(), y.clone());
            rotate(&mut rx, &signs);
            rotate(&mut ry, &signs);
            let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(p, q)| *p as f64 * *q as f64).sum::<f64>();
            assert!((dot(&x, &y) - dot(&rx, &ry)).abs() < 1e-3, "hd {hd}: q·k kept");
            assert!((dot(&x, &x) - dot(&rx, &rx)).abs() < 1e-3, "hd {hd}: norm kept");
            unrotate(&mut rx, &signs);
            for (a, b) in rx.iter().zip(&x) {
                assert!((a - b).abs() < 1e-5, "hd {hd}: {a} vs {b}");
            }
        }
        assert_eq!(hadamard_block(64), 64);
        assert_eq!(hadamard_block(96), 32);
        assert_eq!(hadamard_block(80), 16);
    }

    #[test]
    fn rotation_spreads_an_outlier() {
        let signs = sign_mask(64);
        let mut x = vec![0f32; 64];
        x[5] = 16.0;
        rotate(&mut x, &signs);
        assert!(x.iter().all(|v| v.abs() == 2.0), "{x:?}");
        // the sign pattern is fixed and not trivial
        let flipped = signs.iter().filter(|&&s| s != 0).count();
        assert!((20..44).contains(&flipped), "{flipped}");
    }

    #[test]
    fn fp8_exponent_maps_amax_into_the_top_binade() {
        for dtype in [KvDtype::Fp8E4m3, KvDtype::Fp8E5m2] {
            let max = if dtype == KvDtype::Fp8E4m3 { 448.0 } else { 57344.0 };
            let mut rng = ChaCha8Rng::seed_from_u64(1);
            for _ in 0..10_000 {
                let amax: f32 = 2f32.powf(rng.random_range(-40.0..40.0));
                let e = fp8_vector_exponent(amax, dtype);
                assert!(amax <= max * pow2(e), "{amax} e {e}");
                assert!(amax > max * pow2(e - 1), "{amax} e {e}: not the least");
            }
            // the boundary itself: amax = max·2^e exactly
            assert_eq!(fp8_vector_exponent(max, dtype), 0);
            assert_eq!(fp8_vector_exponent(max * 4.0, dtype), 2);
            assert_eq!(fp8_vector_exponent(f32::from_bits(max.to_bits() + 1), dtype), 1);
            assert_eq!(fp8_vector_exponent(0.0, dtype), 0);
            assert_eq!(fp8_vector_exponent(f32::NAN, dtype), 0);
        }
    }

    #[test]
    fn nvfp4_search_is_never_worse_than_the_standard_scale() {
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        let (mut plain_total, mut fine_total) = (0f64, 0f64);
        for _ in 0..5_000 {
            let spread: f32 = rng.random_range(0.01..20.0);
            let x: Vec<f32> = (0..16)
                .map(|_| {
                    let g: f32 = (0..4).map(|_| rng.random_range(-1.0f32..1.0)).sum();
                    g * spread
                })
                .collect();
            let gs = 448.0 * 6.0 / 80.0;
            let mse = |sf: u8| {
                let mut data = [0u8; 8];
                nvfp4_encode_with_scale(&x, gs, sf, &mut data);
                let mut out = [0f32; 16];
                nvfp4_decode_group(&data, sf, gs, &mut out);
                out.iter().zip(&x).map(|(a, b)| ((a - b) as f64).powi(2)).sum::<f64>()
            };
            let (mut data, mut standard) = ([0u8; 8], 0u8);
            nvfp4_encode_group(&x, gs, &mut data, &mut standard);
            let best = nvfp4_best_scale(&x, gs);
            let (e_plain, e_fine) = (mse(standard), mse(best));
            assert!(e_fine <= e_plain * (1.0 + 1e-5) + 1e-12, "{e_fine} > {e_plain}");
            plain_total += e_plain;
            fine_total += e_fine;
        }
        assert!(fine_total < 0.9 * plain_total, "{fine_total} vs {plain_total}");
    }

    #[test]
    fn int8_search_is_never_worse_than_amax_and_zero_stays_zero() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        for trial in 0..200 {
            let x: Vec<f32> = (0..32)
                .map(|i| rng.random_range(-1.0f32..1.0) * if i == trial % 32 { 9.0 } else { 1.0 })
                .collect();
            let mut q = [0u8; 32];
            let s = int8_encode_group(&x, &mut q).to_f32();
            let err: f32 = q
                .iter()
                .zip(&x)
                .map(|(&c, &v)| (f32::from(c as i8) * s - v).powi(2))
                .sum();
            let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
            let s1 = half::f16::from_f32(amax / 127.0).to_f32();
            let err1: f32 = x
                .iter()
                .map(|&v| ((v / s1).round().clamp(-127.0, 127.0) * s1 - v).powi(2))
                .sum();
            assert!(err <= err1, "{err} > {err1}");
            // every element within one step of its value
            for (&c, &v) in q.iter().zip(&x) {
                assert!((f32::from(c as i8) * s - v).abs() <= s.max(amax - 127.0 * s) + 1e-6);
            }
        }
        let mut q = [7u8; 4];
        assert_eq!(int8_encode_group(&[0.0; 4], &mut q), half::f16::ZERO);
        assert_eq!(q, [0; 4]);
    }
}
