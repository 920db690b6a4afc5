//! Labels longer than one token: choice options beyond the 26 letters are numbered (`01`…`64`,
//! `001`…`255`, one fixed width per question, so no label is a prefix of another), and a number may be
//! several tokens. Such a question is read as constrained decoding would read it: the first read gives the
//! distribution over the labels' first tokens, one more read per branch point (a token prefix shared by
//! labels that continue differently) gives the next token's, each renormalised over the tokens that
//! continue some label, and a label's probability is the product along its path (a prefix with a
//! single continuation contributes 1). The probabilities sum to 1 over the labels by construction.

use std::collections::HashMap;

/// The token sequences of one question's labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelTrie {
    seqs: Vec<Vec<u32>>,
    /// Branch points (prefixes of ≥ 1 token with ≥ 2 continuations) and their continuations, in order.
    branches: Vec<(Vec<u32>, Vec<u32>)>,
}

fn distinct(it: impl Iterator<Item = u32>) -> Vec<u32> {
    let mut out: Vec<u32> = vec![];
    for t in it {
        if !out.contains(&t) {
            out.push(t);
        }
    }
    out
}

impl LabelTrie {
    /// The trie of `seqs` (one per label, in label order); refused when a label is empty or a prefix of
    /// another (the reads could not tell them apart).
    pub fn new(seqs: Vec<Vec<u32>>) -> Result<LabelTrie, String> {
        for (i, a) in seqs.iter().enumerate() {
            if a.is_empty() {
                return Err(format!("label {} has no tokens", i + 1));
            }
            for (j, b) in seqs.iter().enumerate() {
                if i != j && b.starts_with(a) {
                    return Err(format!("label {} is a token prefix of label {}", i + 1, j + 1));
                }
            }
        }
        let mut branches: Vec<(Vec<u32>, Vec<u32>)> = vec![];
        let max = seqs.iter().map(Vec::len).max().unwrap_or(0);
        for depth in 1..max {
            let mut prefixes: Vec<Vec<u32>> = vec![];
            for s in seqs.iter().filter(|s| s.len() > depth) {
                if !prefixes.contains(&s[..depth].to_vec()) {
                    prefixes.push(s[..depth].to_vec());
                }
            }
            for p in prefixes {
                let next = distinct(
                    seqs.iter()
                        .filter(|s| s.len() > depth && s.starts_with(&p))
                        .map(|s| s[depth]),
                );
                if next.len() > 1 {
                    branches.push((p, next));
                }
            }
        }
        Ok(LabelTrie { seqs, branches })
    }

    /// The labels' distinct first tokens, in label order: the first read's labels.
    pub fn first_tokens(&self) -> Vec<u32> {
        distinct(self.seqs.iter().map(|s| s[0]))
    }

    /// The branch points: (token prefix, its distinct continuations), one more read each.
    pub fn branches(&self) -> &[(Vec<u32>, Vec<u32>)] {
        &self.branches
    }

    /// Each label's probability from the first read's probabilities (over [`LabelTrie::first_tokens`])
    /// and each branch read's (over its continuations), every level renormalised.
    pub fn combine(&self, first: &[f64], branches: &[Vec<f64>]) -> Vec<f64> {
        let norm = |p: &[f64]| -> Vec<f64> {
            let total: f64 = p.iter().filter(|x| x.is_finite() && **x > 0.0).sum();
            if total > 0.0 {
                p.iter()
                    .map(|x| if x.is_finite() && *x > 0.0 { x / total } else { 0.0 })
                    .collect()
            } else {
                vec![1.0 / p.len().max(1) as f64; p.len()]
            }
        };
        let firsts = self.first_tokens();
        let root = norm(first);
        let mut at: HashMap<&[u32], (&[u32], Vec<f64>)> = HashMap::new();
        for ((prefix, next), p) in self.branches.iter().zip(branches) {
            at.insert(prefix.as_slice(), (next.as_slice(), norm(p)));
        }
        self.seqs
            .iter()
            .map(|s| {
                let i = firsts.iter().position(|&t| t == s[0]).unwrap_or(0);
                let mut p = root.get(i).copied().unwrap_or(0.0);
                for d in 1..s.len() {
                    if let Some((next, probs)) = at.get(&s[..d]) {
                        let j = next.iter().position(|&t| t == s[d]).unwrap_or(0);
                        p *= probs.get(j).copied().unwrap_or(0.0);
                    }
                }
                p
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_level_labels_multiply_and_sum_to_one() {
        // labels 01..12 as digit pairs: first token 0 or 1, then the second digit
        let seqs: Vec<Vec<u32>> = (1..=12u32).map(|n| vec![n / 10, 10 + n % 10]).collect();
        let t = LabelTrie::new(seqs).unwrap();
        assert_eq!(t.first_tokens(), [0, 1]);
        assert_eq!(t.branches().len(), 2);
        assert_eq!(t.branches()[0], (vec![0], (11..=19).collect::<Vec<u32>>()));
        assert_eq!(t.branches()[1], (vec![1], vec![10, 11, 12]));
        let first = [0.3, 0.1]; // renormalised to 0.75 / 0.25
        let b0: Vec<f64> = (1..=9).map(f64::from).collect();
        let b1 = vec![2.0, 1.0, 1.0];
        let p = t.combine(&first, &[b0, b1]);
        assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        assert!((p[8] - 0.75 * 9.0 / 45.0).abs() < 1e-12, "label 09");
        assert!((p[9] - 0.25 * 0.5).abs() < 1e-12, "label 10");
    }

    #[test]
    fn single_continuations_need_no_read_and_prefixes_are_refused() {
        // 3-token labels where the middle token is forced
        let t = LabelTrie::new(vec![vec![1, 5, 7], vec![1, 5, 8], vec![2, 5, 7]]).unwrap();
        assert_eq!(t.branches(), [(vec![1, 5], vec![7, 8])]);
        let p = t.combine(&[1.0, 1.0], &[vec![3.0, 1.0]]);
        assert_eq!(p, [0.375, 0.125, 0.5]);
        assert!(LabelTrie::new(vec![vec![1], vec![1, 2]]).is_err());
        assert!(LabelTrie::new(vec![vec![], vec![1]]).is_err());
        // one-token labels: a single read
        let t = LabelTrie::new(vec![vec![4], vec![9]]).unwrap();
        assert!(t.branches().is_empty());
        assert_eq!(t.combine(&[0.25, 0.75], &[]), [0.25, 0.75]);
    }
}
