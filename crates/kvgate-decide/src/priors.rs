//! The content-free label priors of calibration, computed once per question shape and kept: a prior is
//! keyed by everything its reads depend on (the tokens of each content-free read and its labels, and
//! the `cache_salt`), so a question asked again — the usual agent loop asks the same routing question
//! every turn — is calibrated without any engine work. Bounded: the oldest entries go first.

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Mutex;

/// Priors kept at most.
pub const CAPACITY: usize = 4096;

/// A question shape's key (a keyed 64-bit hash of its content-free reads).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shape(u64);

/// The cache (one per server).
#[derive(Debug, Default)]
pub struct PriorCache {
    hasher: RandomState,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    map: HashMap<Shape, Vec<f64>>,
    order: VecDeque<Shape>,
}

impl PriorCache {
    /// The key of a question whose content-free reads are `reads` (prompt tokens, labels).
    pub fn shape<'a>(&self, salt: Option<&str>, reads: impl Iterator<Item = (&'a [u32], &'a [Vec<u32>])>) -> Shape {
        let mut h = self.hasher.build_hasher();
        salt.hash(&mut h);
        for (prompt, labels) in reads {
            prompt.hash(&mut h);
            labels.hash(&mut h);
        }
        Shape(h.finish())
    }

    /// The prior of `shape`, if kept.
    pub fn get(&self, shape: Shape) -> Option<Vec<f64>> {
        self.lock().map.get(&shape).cloned()
    }

    /// Keeps `prior` for `shape`, dropping the oldest beyond [`CAPACITY`].
    pub fn put(&self, shape: Shape, prior: Vec<f64>) {
        let mut g = self.lock();
        if g.map.insert(shape, prior).is_none() {
            g.order.push_back(shape);
        }
        while g.order.len() > CAPACITY {
            if let Some(old) = g.order.pop_front() {
                g.map.remove(&old);
            }
        }
    }

    /// Priors kept.
    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // a panic while holding the lock cannot leave the map half-updated in a way that matters
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// `p` (per option) by listed position of `order` (`order[pos]` is the option there; none: the same).
pub(crate) fn to_positions(p: &[f64], order: Option<Vec<usize>>) -> Vec<f64> {
    match order {
        Some(o) if o.len() == p.len() => o.iter().map(|&i| p[i]).collect(),
        _ => p.to_vec(),
    }
}

/// The inverse of [`to_positions`].
pub(crate) fn from_positions(by_pos: &[f64], order: Option<Vec<usize>>) -> Vec<f64> {
    match order {
        Some(o) if o.len() == by_pos.len() => {
            let mut p = vec![0.0; by_pos.len()];
            for (pos, &i) in o.iter().enumerate() {
                p[i] = by_pos[pos];
            }
            p
        }
        _ => by_pos.to_vec(),
    }
}

/// The mean of a question's label distributions over the content-free states: each read normalised
/// over its labels first (a read's label mass does not weigh it), then each option's probability
/// averaged. Empty for none.
pub(crate) fn mean_prior<'a>(reads: impl Iterator<Item = &'a [f64]>) -> Vec<f64> {
    let mut sum: Vec<f64> = vec![];
    let mut n = 0usize;
    for p in reads {
        if sum.is_empty() {
            sum = vec![0.0; p.len()];
        }
        let total: f64 = p.iter().sum();
        let scale = if total > 0.0 && total.is_finite() {
            1.0 / total
        } else {
            1.0
        };
        for (s, x) in sum.iter_mut().zip(p) {
            *s += x * scale;
        }
        n += 1;
    }
    sum.iter().map(|s| s / n.max(1) as f64).collect()
}

/// `p` divided by the content-free prior, renormalised (unchanged where the prior is unusable).
pub(crate) fn calibrate(p: &[f64], prior: &[f64]) -> Vec<f64> {
    if prior.len() != p.len() || prior.iter().any(|x| !(x.is_finite() && *x > 0.0)) {
        return p.to_vec();
    }
    let q: Vec<f64> = p.iter().zip(prior).map(|(a, b)| a / b).collect();
    let total: f64 = q.iter().sum();
    if total > 0.0 && total.is_finite() {
        q.iter().map(|x| x / total).collect()
    } else {
        p.to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_by_reads_and_salt_and_bounded() {
        let c = PriorCache::default();
        let labels = [vec![1u32], vec![2]];
        let a = c.shape(None, [(&[5u32, 6][..], &labels[..])].into_iter());
        let same = c.shape(None, [(&[5u32, 6][..], &labels[..])].into_iter());
        let salted = c.shape(Some("t"), [(&[5u32, 6][..], &labels[..])].into_iter());
        let other = c.shape(None, [(&[5u32, 7][..], &labels[..])].into_iter());
        assert_eq!(a, same);
        assert_ne!(a, salted);
        assert_ne!(a, other);
        c.put(a, vec![0.3, 0.7]);
        assert_eq!(c.get(same), Some(vec![0.3, 0.7]));
        assert_eq!(c.get(salted), None);
        for i in 0..CAPACITY as u32 + 10 {
            c.put(c.shape(None, [(&[i][..], &labels[..])].into_iter()), vec![1.0]);
        }
        assert_eq!(c.len(), CAPACITY);
        assert_eq!(c.get(a), None, "the oldest went first");
    }

    #[test]
    fn the_prior_is_the_mean_over_content_free_states() {
        // each read normalised first: the second's label mass (0.5) does not weigh it less
        let reads = [vec![0.2, 0.8], vec![0.3, 0.2], vec![0.4, 0.6]];
        let m = mean_prior(reads.iter().map(Vec::as_slice));
        assert!((m[0] - 0.4).abs() < 1e-12 && (m[1] - 0.6).abs() < 1e-12, "{m:?}");
        assert!(mean_prior(std::iter::empty()).is_empty());
    }
}
