//! How questions are read (`x_read`, a kvgate extension): `plain` reads a choice's options once, in the
//! order listed; `ordered` makes the answer independent of that order and balances the model's position
//! bias; `calibrated` adds content-free calibration (see `crate::reads`): every question is also read
//! over three content-free states and their mean label prior divided out; `ordered+calibrated` is both; `cloze`
//! answers a choice by option name in one canonical read, and `cloze+calibrated` is the default of
//! every model measured and of models not fitted (`crate::temperature`): on the 200-item benchmark
//! (`benches/decision_quality.rs`) it beat the generative routing call by 7.5–9.5 points on three
//! models in one read, where `ordered+calibrated` needs one read per option order.
//!
//! The options are put in one canonical order (by name, case-folded), then read in `x_orders` (1 to
//! [`MAX_ORDERS`]; default: the number fitted for the served model, else all) orders of it: evenly spaced rotations, or for 2 the canonical order
//! and its reverse; each is one more forked read of the question (the state is computed once for
//! all), and the per-option probabilities of the reads are averaged. Two requests that list the same
//! options in different orders read exactly the same texts, so their answers are identical, not
//! merely close. All rotations by default, though they cost one read of the options each: with 2
//! orders choice accuracy fell from 0.325 to 0.263 (default model) and from 0.688 to 0.525 (Qwen2.5
//! 0.5B). Choices beyond 26 options (numbered labels) are read in the canonical order once.

/// Orders read per choice question at most (`x_orders` may ask for 1 to this many).
pub const MAX_ORDERS: usize = 8;

/// Orders read per choice question by default for a model without a fitted number
/// (`crate::temperature::fitted_for`; `--decision-orders` overrides both).
pub const DEFAULT_ORDERS: usize = MAX_ORDERS;

/// A request's read method (serialised as its wire name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ReadMethod {
    /// Choices in canonical order, averaged over rotations (else one read as listed).
    pub ordered: bool,
    /// Content-free calibration of every question's label prior.
    pub calibrated: bool,
    /// The options (a choice's, up to 26; a score's levels) read once as parallel branches of one
    /// read — each attends to the state and the question and to itself, not to the others, all
    /// starting at one position — so no option comes first (tree attention; on a backend without
    /// it, read `ordered` instead).
    pub set: bool,
    /// A choice answered by option name (cloze) instead of by letter: the options listed once in the
    /// canonical order as `- name: description`, the read's labels each option's name tokens (through
    /// a [`crate::trie::LabelTrie`] where names share first tokens). Small models answer a choice by
    /// its content far better than by a letter they must map back (`benches/decision_quality.rs`:
    /// Qwen2.5-0.5B 50/80 in one read, calibrated, against 34/80 by letter); yes/no and score
    /// questions read as without it.
    pub cloze: bool,
}

/// The wire names, in `(ordered, calibrated, set, cloze)` order.
const NAMES: [(&str, bool, bool, bool, bool); 8] = [
    ("plain", false, false, false, false),
    ("ordered", true, false, false, false),
    ("calibrated", false, true, false, false),
    ("ordered+calibrated", true, true, false, false),
    ("set", false, false, true, false),
    ("set+calibrated", false, true, true, false),
    ("cloze", false, false, false, true),
    ("cloze+calibrated", false, true, false, true),
];

impl ReadMethod {
    /// One read as listed, no calibration.
    pub const PLAIN: ReadMethod = ReadMethod {
        ordered: false,
        calibrated: false,
        set: false,
        cloze: false,
    };
    /// `ordered+calibrated`: every option order averaged, calibrated (the default before cloze reads).
    pub const ORDERED_CALIBRATED: ReadMethod = ReadMethod {
        ordered: true,
        calibrated: true,
        set: false,
        cloze: false,
    };
    /// The default of a model nothing was fitted for.
    pub const UNFITTED: ReadMethod = ReadMethod::CLOZE;
    /// Choices by name in one canonical read, calibrated.
    pub const CLOZE: ReadMethod = ReadMethod {
        ordered: false,
        calibrated: true,
        set: false,
        cloze: true,
    };

    /// The wire name.
    pub fn name(self) -> &'static str {
        NAMES
            .iter()
            .find(|n| (n.1, n.2, n.3, n.4) == (self.ordered, self.calibrated, self.set, self.cloze))
            .map_or("plain", |n| n.0)
    }

    /// The method of a wire name (`plain`, `ordered`, `calibrated`, `ordered+calibrated`, `set`,
    /// `set+calibrated`, `cloze`, `cloze+calibrated`).
    pub fn from_name(name: &str) -> Option<ReadMethod> {
        NAMES.iter().find(|n| n.0 == name).map(|n| ReadMethod {
            ordered: n.1,
            calibrated: n.2,
            set: n.3,
            cloze: n.4,
        })
    }

    /// Every wire name.
    pub fn names() -> impl Iterator<Item = &'static str> {
        NAMES.iter().map(|n| n.0)
    }

    /// The method a backend without tree attention reads instead (`set` → `ordered`).
    pub fn without_trees(self) -> ReadMethod {
        ReadMethod {
            ordered: self.ordered || self.set,
            set: false,
            ..self
        }
    }
}

impl TryFrom<String> for ReadMethod {
    type Error = String;
    fn try_from(s: String) -> Result<ReadMethod, String> {
        ReadMethod::from_name(&s).ok_or_else(|| {
            let names: Vec<&str> = ReadMethod::names().collect();
            format!("unknown read method '{s}': expected one of {}", names.join(", "))
        })
    }
}

impl From<ReadMethod> for String {
    fn from(m: ReadMethod) -> String {
        m.name().to_string()
    }
}

/// The option orders to read a choice of `names` in (at most `k` of them, `method.ordered`): each a
/// permutation (indices into `names`). Two orders are the canonical one and its reverse (every option's
/// mean position is the middle); more are evenly spaced rotations (every option at every position, when
/// `k ≥ n`).
pub fn option_orders(names: &[String], method: ReadMethod, k: usize) -> Vec<Vec<usize>> {
    let n = names.len();
    if !(method.ordered || method.set || method.cloze) || n <= 1 {
        return vec![(0..n).collect()];
    }
    let mut canon: Vec<usize> = (0..n).collect();
    canon.sort_by(|&a, &b| {
        let (x, y) = (names[a].trim().to_lowercase(), names[b].trim().to_lowercase());
        x.cmp(&y).then_with(|| names[a].cmp(&names[b]))
    });
    let k = if n > 26 || method.set || method.cloze {
        1
    } else {
        n.min(k.clamp(1, MAX_ORDERS))
    };
    if k == 2 {
        let rev = canon.iter().rev().copied().collect();
        return vec![canon, rev];
    }
    (0..k)
        .map(|j| {
            let shift = j * n / k;
            (0..n).map(|i| canon[(i + shift) % n]).collect()
        })
        .collect()
}

/// Averages per-read label probabilities (each over its order's labels, renormalised) back onto the
/// options: `reads[r][i]` is the probability of the option at position `i` of `orders[r]`.
pub fn combine(orders: &[Vec<usize>], reads: &[Vec<f64>]) -> Vec<f64> {
    let n = orders.first().map_or(0, Vec::len);
    let mut out = vec![0.0; n];
    for (order, p) in orders.iter().zip(reads) {
        let total: f64 = p.iter().filter(|x| x.is_finite() && **x > 0.0).sum();
        for (pos, &opt) in order.iter().enumerate() {
            let x = p.get(pos).copied().unwrap_or(0.0);
            out[opt] += if total > 0.0 && x.is_finite() && x > 0.0 {
                x / total
            } else {
                0.0
            };
        }
    }
    let k = orders.len().max(1) as f64;
    out.iter_mut().for_each(|x| *x /= k);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn orders_are_rotations_of_one_canonical_order() {
        let a = names(&["sales", "Billing", "tech"]);
        let o = option_orders(&a, ReadMethod::ORDERED_CALIBRATED, MAX_ORDERS);
        assert_eq!(o, vec![vec![1, 0, 2], vec![0, 2, 1], vec![2, 1, 0]]);
        // every option at every position once
        for pos in 0..3 {
            let mut seen: Vec<usize> = o.iter().map(|ord| ord[pos]).collect();
            seen.sort();
            assert_eq!(seen, [0, 1, 2]);
        }
        assert_eq!(option_orders(&a, ReadMethod::PLAIN, MAX_ORDERS), vec![vec![0, 1, 2]]);
        for name in ReadMethod::names() {
            assert_eq!(ReadMethod::from_name(name).unwrap().name(), name);
        }
        assert!(ReadMethod::from_name("shuffled").is_none());
        let many: Vec<String> = (0..20).map(|i| format!("o{i:02}")).collect();
        let o = option_orders(&many, ReadMethod::ORDERED_CALIBRATED, MAX_ORDERS);
        assert_eq!(o.len(), MAX_ORDERS);
        assert_eq!(
            option_orders(
                &(0..30).map(|i| format!("o{i}")).collect::<Vec<_>>(),
                ReadMethod::ORDERED_CALIBRATED,
                MAX_ORDERS
            )
            .len(),
            1
        );
    }

    #[test]
    fn fewer_orders() {
        let a = names(&["sales", "Billing", "tech", "ads"]);
        // canonical: ads(3), Billing(1), sales(0), tech(2)
        assert_eq!(
            option_orders(&a, ReadMethod::ORDERED_CALIBRATED, 1),
            vec![vec![3, 1, 0, 2]]
        );
        assert_eq!(
            option_orders(&a, ReadMethod::ORDERED_CALIBRATED, 2),
            vec![vec![3, 1, 0, 2], vec![2, 0, 1, 3]]
        );
        assert_eq!(option_orders(&a, ReadMethod::ORDERED_CALIBRATED, 3).len(), 3);
        assert_eq!(option_orders(&a, ReadMethod::ORDERED_CALIBRATED, 8).len(), 4);
    }

    #[test]
    fn the_same_options_listed_differently_read_the_same_texts() {
        let a = names(&["red", "Green", "blue", "amber"]);
        let b = names(&["amber", "blue", "red", "Green"]);
        let as_names = |v: &[String], o: Vec<Vec<usize>>| -> Vec<Vec<String>> {
            o.into_iter()
                .map(|ord| ord.into_iter().map(|i| v[i].clone()).collect())
                .collect()
        };
        assert_eq!(
            as_names(&a, option_orders(&a, ReadMethod::ORDERED_CALIBRATED, MAX_ORDERS)),
            as_names(&b, option_orders(&b, ReadMethod::ORDERED_CALIBRATED, MAX_ORDERS))
        );
    }

    #[test]
    fn combine_maps_positions_back_to_options() {
        // option 0 is always the one the model likes, wherever it is listed
        let orders = vec![vec![0, 1], vec![1, 0]];
        let p = combine(&orders, &[vec![0.6, 0.2], vec![0.1, 0.3]]);
        assert!((p[0] - (0.75 + 0.75) / 2.0).abs() < 1e-12);
        assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-12);
    }
}
