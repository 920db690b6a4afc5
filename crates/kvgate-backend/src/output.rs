//! What a forward pass returns: the full logits rows that were asked for, contiguous, the
//! log-probabilities of the few ids each decision read asked for, and the final hidden states asked for
//! (embeddings) — and [`logprobs_of`], the reduction a backend runs on its side so that no
//! full-vocabulary row crosses the seam for a read.

use crate::batch::{Batch, Want};

/// One step's results, in the order of `batch.outputs`, split by kind.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepOutput {
    /// Width of a logits row.
    pub vocab: usize,
    /// The [`Want::Logits`] outputs' rows, `vocab` values each, in output order.
    pub logits: Vec<f32>,
    /// One entry per [`Want::Logprobs`] output, in output order: the log-probabilities of its ids.
    pub logprobs: Vec<Vec<f32>>,
    /// Width of a hidden row (the model's hidden size).
    pub width: usize,
    /// The [`Want::Hidden`] outputs' rows, `width` values each, in output order.
    pub hidden: Vec<f32>,
}

impl StepOutput {
    /// Builds the output of `batch` from the logits of every output row that runs the head (every
    /// output but the [`Want::Hidden`] ones: `× vocab`, in output order), reducing each
    /// [`Want::Logprobs`] row to its ids, and the hidden rows of the [`Want::Hidden`] outputs (`width`
    /// each, in output order) — for backends that compute the head on the host.
    pub fn from_rows(batch: &Batch, rows: Vec<f32>, vocab: usize, hidden: Vec<f32>, width: usize) -> StepOutput {
        if batch.outputs.iter().all(|o| o.want == Want::Logits) {
            return StepOutput {
                vocab,
                logits: rows,
                logprobs: vec![],
                width,
                hidden,
            };
        }
        let mut out = StepOutput {
            vocab,
            width,
            hidden,
            ..StepOutput::default()
        };
        let head = batch.outputs.iter().filter(|o| o.want != Want::Hidden);
        for (o, row) in head.zip(rows.chunks_exact(vocab.max(1))) {
            match &o.want {
                Want::Logits => out.logits.extend_from_slice(row),
                Want::Logprobs(ids) => out.logprobs.push(logprobs_of(row, ids)),
                Want::Hidden => {}
            }
        }
        out
    }

    /// Rows of logits held.
    pub fn logit_rows(&self) -> usize {
        self.logits.len() / self.vocab.max(1)
    }
}

/// The log of the softmax normaliser of `row`: its max plus the log of the f64 sum of `exp` relative
/// to it, in row order. The engine's `log_softmax` and [`logprobs_of`] both subtract this one value,
/// so their results agree bit for bit.
pub fn log_sum_exp(row: &[f32]) -> f32 {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    (row.iter().map(|&v| ((v - max) as f64).exp()).sum::<f64>()).ln() as f32 + max
}

/// The log-probabilities of `ids` under the softmax of `row`, without building the log-softmax row
/// (each equals `log_softmax(row)[id]` bit for bit).
pub fn logprobs_of(row: &[f32], ids: &[u32]) -> Vec<f32> {
    let lse = log_sum_exp(row);
    ids.iter().map(|&t| row[t as usize] - lse).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::Output;

    fn log_softmax(x: &[f32]) -> Vec<f32> {
        let lse = log_sum_exp(x);
        x.iter().map(|&v| v - lse).collect()
    }

    #[test]
    fn logprobs_equal_the_log_softmax_entries() {
        let row: Vec<f32> = (0..1000).map(|i| ((i * 7919) % 997) as f32 / 50.0 - 9.0).collect();
        let full = log_softmax(&row);
        let ids = [3u32, 999, 0, 3, 512];
        let got = logprobs_of(&row, &ids);
        for (g, &i) in got.iter().zip(&ids) {
            assert_eq!(g.to_bits(), full[i as usize].to_bits());
        }
    }

    #[test]
    fn rows_split_by_kind_in_order() {
        let mut b = Batch::single_sequence(&[1, 2, 3], 4);
        b.outputs = vec![
            Output {
                row: 0,
                want: Want::Logits,
            },
            Output {
                row: 1,
                want: Want::Logprobs(vec![2, 0]),
            },
            Output {
                row: 2,
                want: Want::Logits,
            },
        ];
        b.outputs.insert(
            1,
            Output {
                row: 1,
                want: Want::Hidden,
            },
        );
        let rows = vec![0.0, 1.0, 2.0, 5.0, 5.0, 5.0, 6.0, 7.0, 8.0];
        let out = StepOutput::from_rows(&b, rows, 3, vec![0.5, -0.5], 2);
        assert_eq!(out.logits, [0.0, 1.0, 2.0, 6.0, 7.0, 8.0]);
        assert_eq!(out.logit_rows(), 2);
        let third = -(3f32).ln();
        assert_eq!(out.logprobs.len(), 1);
        assert!(out.logprobs[0].iter().all(|v| (v - third).abs() < 1e-6));
        assert_eq!((out.hidden.as_slice(), out.width), (&[0.5, -0.5][..], 2));
    }
}
