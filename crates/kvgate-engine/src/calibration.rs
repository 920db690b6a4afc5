//! `--calculate-kv-scales`: per-layer k/v scales for the scaled KV dtypes from the amax of K and V seen
//! in the first prefill.

use kvgate_kv::KvDtype;
use kvgate_model::KvAmax;

/// The calibrated scale for an observed amax: the power of two at or above `amax / range`, times two.
/// A power of two scales values exactly, so values in the format's normal range round exactly as with
/// scale 1 and only the range moves (away from underflow); the factor two leaves headroom for later
/// prompts that reach further than the first one.
pub fn kv_scale(amax: f32, range: f32) -> f32 {
    if !(amax > 0.0 && amax.is_finite()) {
        return 1.0;
    }
    2f32.powi((amax / range).log2().ceil() as i32 + 1)
}

/// The largest value a dtype stores at scale 1 (nvfp4: its e2m1 maximum times the largest e4m3 group
/// scale).
pub fn dtype_range(dtype: KvDtype) -> f32 {
    match dtype {
        KvDtype::Fp8E4m3 => 448.0,
        KvDtype::Fp8E5m2 => 57344.0,
        KvDtype::Nvfp4 => 448.0 * 6.0,
        _ => 1.0,
    }
}

/// Per-layer (k_scale, v_scale) for `dtype` from measured amax.
pub fn scales_from_amax(dtype: KvDtype, amax: &KvAmax) -> Vec<(f32, f32)> {
    let range = dtype_range(dtype);
    amax.k
        .iter()
        .zip(&amax.v)
        .map(|(&k, &v)| (kv_scale(k, range), kv_scale(v, range)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_are_powers_of_two_with_headroom() {
        assert_eq!(kv_scale(0.0, 448.0), 1.0);
        assert_eq!(kv_scale(f32::NAN, 448.0), 1.0);
        // amax 18 over range 448 → 2^ceil(log2(0.04)) · 2 = 2^-4 · 2
        assert_eq!(kv_scale(18.0, 448.0), 0.125);
        let s = scales_from_amax(
            KvDtype::Fp8E4m3,
            &KvAmax {
                k: vec![18.0],
                v: vec![448.0],
            },
        );
        assert_eq!(s, vec![(0.125, 2.0)]);
    }
}
