//! How sure the draft model is of its proposal: the softmax probability of a row's best logit, summed
//! in one pass over a 150,000-token row with an exponential accurate to about 0.2% (a cut-off,
//! `draft_p_min`, never a sampled value: that rounding is immaterial).

/// The softmax probability of `row[best]` (`best` its largest logit): `1 / Σ exp(l − l_best)`, the
/// sum in f32 over the row (a proposal's cut-off, not a sampled value: the rounding is immaterial).
pub(super) fn top_probability(row: &[f32], best: u32) -> f32 {
    let Some(&top) = row.get(best as usize) else { return 0.0 };
    if !top.is_finite() {
        return 0.0;
    }
    let sum: f32 = row.iter().map(|&l| fast_exp(l - top)).sum();
    if sum > 0.0 {
        1.0 / sum
    } else {
        0.0
    }
}

/// `e^x` for `x ≤ 0` to about 0.2% relative (a 2^(x·log2 e) split into an integer power, set in the
/// exponent bits, and a degree-4 polynomial of the fraction), 0 below −87; the vectorizable form of
/// a loop over a 150,000-token row.
#[inline]
fn fast_exp(x: f32) -> f32 {
    if x < -87.0 || x.is_nan() {
        return 0.0;
    }
    let t = x * std::f32::consts::LOG2_E;
    let i = t.floor();
    let f = t - i;
    // 2^f on [0, 1)
    let p = 1.0 + f * (std::f32::consts::LN_2 + f * (0.240_226_5 + f * (0.055_504_1 + f * 0.009_618_1)));
    f32::from_bits(((i as i32 + 127) as u32) << 23) * p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_top_probability_is_the_softmax_of_the_best_logit() {
        let row = [1.0f32, 3.0, 0.5, -2.0, 2.9];
        let exact = 1.0 / row.iter().map(|&l| (l - 3.0f32).exp()).sum::<f32>();
        assert!(
            (top_probability(&row, 1) - exact).abs() < 1e-3,
            "{}",
            top_probability(&row, 1)
        );
        assert_eq!(top_probability(&[f32::NEG_INFINITY], 0), 0.0);
        for x in [0.0f32, -0.3, -1.0, -5.5, -20.0, -86.0] {
            assert!((fast_exp(x) - x.exp()).abs() <= 3e-3 * x.exp(), "{x}");
        }
        assert_eq!(fast_exp(-100.0), 0.0);
    }
}
