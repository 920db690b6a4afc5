//! From label probabilities to the wire answer: renormalise over the labels, round each distribution
//! so it sums to exactly 1 (largest remainder, in millionths), then Jev's formulas, computed from the
//! rounded values (and themselves rounded to millionths) so a client recomputing them from the response
//! gets the same numbers to 1e-6.
//!
//! - choice: `confidence = clip((p_max − 1/n) / (1 − 1/n), 0, 1)`, 1 when n = 1; ties pick the first.
//! - score: `score = Σ i·p_i`; `confidence = max(0, 1 − Σ p_i·|i − m| / MAD)` with `m` the most probable
//!   level (first on ties) and `MAD = (1/n)·Σ_i |i − (n−1)/2|`; 1 when n = 1.

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::Value;

/// Units a distribution is rounded to (millionths).
const UNITS: u64 = 1_000_000;

/// Renormalises `raw` and rounds it to millionths with the largest-remainder method: the result sums to
/// exactly 1 (in units), every value in [0, 1]. A distribution with no mass becomes uniform.
pub fn round_distribution(raw: &[f64]) -> Vec<f64> {
    let n = raw.len();
    if n == 0 {
        return vec![];
    }
    let total: f64 = raw.iter().filter(|x| x.is_finite() && **x > 0.0).sum();
    let p: Vec<f64> = if total > 0.0 {
        raw.iter()
            .map(|x| if x.is_finite() && *x > 0.0 { x / total } else { 0.0 })
            .collect()
    } else {
        vec![1.0 / n as f64; n]
    };
    let scaled: Vec<f64> = p.iter().map(|x| x * UNITS as f64).collect();
    let mut units: Vec<u64> = scaled.iter().map(|x| x.floor() as u64).collect();
    let assigned: u64 = units.iter().sum();
    let mut order: Vec<usize> = (0..n).collect();
    // Largest remainder first; ties to the earlier label.
    order.sort_by(|&a, &b| {
        let ra = scaled[a] - scaled[a].floor();
        let rb = scaled[b] - scaled[b].floor();
        rb.total_cmp(&ra).then(a.cmp(&b))
    });
    for &i in order.iter().take(UNITS.saturating_sub(assigned) as usize) {
        units[i] += 1;
    }
    units.into_iter().map(|u| u as f64 / UNITS as f64).collect()
}

/// Rounds a derived value (score, confidence) to millionths, like the distributions.
fn wire(x: f64) -> f64 {
    (x * UNITS as f64).round() / UNITS as f64
}

/// Index of the largest value, first on ties.
pub fn argmax_first(p: &[f64]) -> usize {
    let mut best = 0;
    for (i, &x) in p.iter().enumerate() {
        if x > p[best] {
            best = i;
        }
    }
    best
}

/// Choice confidence.
pub fn choice_confidence(p: &[f64]) -> f64 {
    let n = p.len();
    if n <= 1 {
        return 1.0;
    }
    let pmax = p[argmax_first(p)];
    let u = 1.0 / n as f64;
    ((pmax - u) / (1.0 - u)).clamp(0.0, 1.0)
}

/// Expected level.
pub fn score_value(p: &[f64]) -> f64 {
    p.iter().enumerate().map(|(i, x)| i as f64 * x).sum()
}

/// Score confidence.
pub fn score_confidence(p: &[f64]) -> f64 {
    let n = p.len();
    if n <= 1 {
        return 1.0;
    }
    let m = argmax_first(p) as f64;
    let mid = (n as f64 - 1.0) / 2.0;
    let mad: f64 = (0..n).map(|i| (i as f64 - mid).abs()).sum::<f64>() / n as f64;
    let spread: f64 = p.iter().enumerate().map(|(i, x)| x * (i as f64 - m).abs()).sum();
    (1.0 - spread / mad).max(0.0)
}

/// A question's answer, serialised as Jev's wire shape (`type` first, then the fields in this order).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Answer {
    /// Yes/no: P(yes).
    Noul {
        /// P(yes), rounded.
        noul: f64,
    },
    /// One of several options.
    Choice {
        /// The most probable option (the first on ties).
        choice: String,
        /// Per option, in the order the question listed them.
        probabilities: Keyed<f64>,
        /// Jev's choice confidence.
        confidence: f64,
    },
    /// A level on a scale.
    Score {
        /// The expected level.
        score: f64,
        /// Per level index, the level exactly as sent.
        legend: Keyed<Value>,
        /// Per level index.
        probabilities: Keyed<f64>,
        /// Jev's score confidence.
        confidence: f64,
    },
}

/// Named values in a fixed order, serialised as a JSON object with keys in that order.
#[derive(Debug, Clone, PartialEq)]
pub struct Keyed<T>(pub Vec<(String, T)>);

impl<T: Serialize> Serialize for Keyed<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

/// A noul answer from P(yes), P(no) (raw).
pub fn noul(raw: &[f64]) -> Answer {
    let p = round_distribution(raw);
    Answer::Noul { noul: p[0] }
}

/// A choice answer.
pub fn choice(options: &[String], raw: &[f64]) -> Answer {
    let p = round_distribution(raw);
    let best = argmax_first(&p);
    Answer::Choice {
        choice: options[best].clone(),
        probabilities: Keyed(options.iter().cloned().zip(p.iter().copied()).collect()),
        confidence: wire(choice_confidence(&p)),
    }
}

/// A score answer; `levels` are echoed in `legend` exactly as sent.
pub fn score(levels: &[Value], raw: &[f64]) -> Answer {
    let p = round_distribution(raw);
    Answer::Score {
        score: wire(score_value(&p)),
        legend: Keyed(
            levels
                .iter()
                .enumerate()
                .map(|(i, l)| (i.to_string(), l.clone()))
                .collect(),
        ),
        probabilities: Keyed(p.iter().enumerate().map(|(i, x)| (i.to_string(), *x)).collect()),
        confidence: wire(score_confidence(&p)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) {
        assert!((a - b).abs() < 1e-9, "{a} vs {b}");
    }

    #[test]
    fn the_spec_formula_vectors() {
        close(choice_confidence(&[0.91, 0.02, 0.03, 0.04]), 0.88);
        close(choice_confidence(&[0.25; 4]), 0.0);
        close(choice_confidence(&[0.1, 0.9]), 0.8);
        close(choice_confidence(&[0.98, 0.02]), 0.96);
        close(choice_confidence(&[1.0]), 1.0);
        assert!((score_confidence(&[0.0, 0.14, 0.86, 0.0, 0.0]) - 0.8833).abs() < 1e-4);
        close(score_confidence(&[0.0, 0.0, 0.48, 0.52]), 0.52);
        close(score_confidence(&[0.5, 0.0, 0.0, 0.0, 0.5]), 0.0);
        close(score_value(&[0.25, 0.75]), 0.75);
        close(score_confidence(&[0.25, 0.75]), 0.5);
        close(score_confidence(&[0.0, 0.95, 0.05]), 0.925);
    }

    #[test]
    fn rounding_sums_to_exactly_one() {
        for raw in [
            vec![1.0, 1.0, 1.0],
            vec![0.2, 0.3, 0.1],
            vec![1e-9, 0.5, 0.25],
            vec![0.0, 0.0],
            vec![7.0],
        ] {
            let p = round_distribution(&raw);
            let units: u64 = p.iter().map(|x| (x * 1e6).round() as u64).sum();
            assert_eq!(units, 1_000_000, "{raw:?} → {p:?}");
            assert!(p.iter().all(|x| (0.0..=1.0).contains(x)));
        }
        assert_eq!(round_distribution(&[1.0, 1.0, 1.0]), vec![0.333334, 0.333333, 0.333333]);
        assert_eq!(round_distribution(&[0.0, 0.0]), vec![0.5, 0.5]);
    }

    #[test]
    fn answer_shapes_and_key_order() {
        use serde_json::json;
        let wire = |a: Answer| serde_json::to_value(a).unwrap();
        let c = wire(choice(&["billing".into(), "technical".into()], &[0.2, 0.6]));
        let keys: Vec<&String> = c.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["type", "choice", "probabilities", "confidence"]);
        assert_eq!(c["choice"], "technical");
        let s = wire(score(&[json!("Calm"), json!({"x": 1})], &[0.25, 0.75]));
        let keys: Vec<&String> = s.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["type", "score", "legend", "probabilities", "confidence"]);
        assert_eq!(s["legend"]["1"], json!({"x": 1}));
        let n = wire(noul(&[0.3, 0.1]));
        assert_eq!(n, json!({"type": "noul", "noul": 0.75}));
    }
}
