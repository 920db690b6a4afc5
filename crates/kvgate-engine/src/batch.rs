//! The batch builder: one step's [`Plan`](crate::scheduler::Plan) flattened into the device-neutral
//! [`Batch`] a backend runs — token rows with their positions and cache slots, one block table per
//! sequence, what each chunk needs back ([`ChunkWant`]: logits rows for completions, the log-probs of a
//! read's label ids for decisions, hidden states for embeddings, nothing for prefill) and how exactly each sequence is computed, in
//! chunk order.

use kvgate_backend::{Batch, Output, Precision, Want};

use crate::request::ReadTree;
use crate::scheduler::{Chunk, Logits};

/// What one chunk needs back from the forward pass.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ChunkWant {
    /// Nothing (a prefill chunk, a decision's shared prefix).
    Nothing,
    /// Full logits rows: the last row, or every row (prompt logprobs).
    Logits(Logits),
    /// The log-probs of these ids at the last row (a decision read's label aliases, flattened).
    Logprobs(Vec<u32>),
    /// Final hidden states (embeddings): the last row, or every row (mean pooling).
    Hidden(Logits),
}

impl ChunkWant {
    /// Rows of full logits it produces for a chunk of `len` rows.
    pub(crate) fn logit_rows(&self, len: usize) -> usize {
        match self {
            ChunkWant::Logits(l) => l.rows(len),
            _ => 0,
        }
    }

    /// Hidden rows it produces for a chunk of `len` rows.
    pub(crate) fn hidden_rows(&self, len: usize) -> usize {
        match self {
            ChunkWant::Hidden(l) => l.rows(len),
            _ => 0,
        }
    }
}

/// Flattens the chunks of a plan into one batch; `wants`, `precision` and `trees` (the tree a
/// chunk's rows belong to: their RoPE positions and masks) are per chunk. A decode chunk's token
/// tree ([`Chunk::tree`]) gives its rows' slots, RoPE positions and masks.
pub(crate) fn build(
    chunks: &[Chunk],
    wants: &[ChunkWant],
    precision: &[Precision],
    trees: &[Option<&ReadTree>],
) -> Batch {
    let rows: usize = chunks.iter().map(|c| c.len).sum();
    let mut b = Batch {
        tokens: Vec::with_capacity(rows),
        positions: Vec::with_capacity(rows),
        slots: Vec::with_capacity(rows),
        seq_of_row: Vec::with_capacity(rows),
        tables: Vec::with_capacity(chunks.len()),
        outputs: Vec::new(),
        precision: if precision.contains(&Precision::Fast) {
            precision.to_vec()
        } else {
            Vec::new()
        },
        rope: Vec::new(),
        masks: Vec::new(),
    };
    let mut tree_rows = vec![];
    for (c, want) in chunks.iter().zip(wants) {
        let t = b.tables.len() as u32;
        // A released block is outside every query's window, so attention never reads its entry.
        b.tables.push(
            c.table
                .iter()
                .map(|blk| blk.map_or(kvgate_backend::RELEASED_BLOCK, u32::from))
                .collect(),
        );
        let first = b.tokens.len();
        match want {
            ChunkWant::Nothing => {}
            ChunkWant::Logits(_) => {
                let n = want.logit_rows(c.len);
                b.outputs.extend((first + c.len - n..first + c.len).map(|row| Output {
                    row,
                    want: Want::Logits,
                }));
            }
            ChunkWant::Logprobs(ids) if c.len > 0 => b.outputs.push(Output {
                row: first + c.len - 1,
                want: Want::Logprobs(ids.clone()),
            }),
            ChunkWant::Logprobs(_) => {}
            ChunkWant::Hidden(_) => {
                let n = want.hidden_rows(c.len);
                b.outputs.extend((first + c.len - n..first + c.len).map(|row| Output {
                    row,
                    want: Want::Hidden,
                }));
            }
        }
        let tree = trees.get(b.tables.len() - 1).copied().flatten();
        for i in 0..c.len {
            let row = match tree {
                Some(t) => t.row(c.start + i),
                None => crate::token_tree::row(&c.tree, c.start, i),
            };
            if let Some(row) = row {
                tree_rows.push((b.tokens.len(), row));
            }
            b.tokens.push(c.tokens[i]);
            b.positions.push(c.slot_position(i) as u32);
            b.slots.push(c.slots[i]);
            b.seq_of_row.push(t);
        }
    }
    if !tree_rows.is_empty() {
        b.rope = b.positions.clone();
        b.masks = vec![None; b.tokens.len()];
        for (r, (rope, mask)) in tree_rows {
            b.rope[r] = rope;
            b.masks[r] = Some(mask);
        }
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::{Caps, Scheduler, SchedulerConfig};

    #[test]
    fn batch_rows_come_from_the_plan() {
        let cfg = SchedulerConfig::new(8, 64, 4);
        let mut s = Scheduler::new(cfg, 16);
        let (_, a) = s.add_generate((10..16).collect(), "", false);
        let (_, b) = s.add_generate((20..23).collect(), "", true);
        let plan = s.schedule().unwrap();
        let wants: Vec<ChunkWant> = plan.chunks.iter().map(|c| ChunkWant::Logits(c.logits)).collect();
        let batch = build(&plan.chunks, &wants, &[Precision::Exact; 2], &[]);
        assert_eq!(batch.tokens, [10, 11, 12, 13, 14, 15, 20, 21, 22]);
        assert_eq!(batch.positions, [0, 1, 2, 3, 4, 5, 0, 1, 2]);
        assert_eq!(batch.seq_of_row, [0, 0, 0, 0, 0, 0, 1, 1, 1]);
        // the first sequence wants its last row, the second (prompt logprobs) every row
        assert_eq!(batch.output_rows().collect::<Vec<_>>(), [5, 6, 7, 8]);
        assert!(batch.precision.is_empty(), "all exact");
        // a read wants its label ids at its last row, a prefix nothing
        let wants = [ChunkWant::Logprobs(vec![7, 9]), ChunkWant::Nothing];
        let read = build(&plan.chunks, &wants, &[Precision::Fast, Precision::Exact], &[]);
        assert_eq!(
            read.outputs,
            [Output {
                row: 5,
                want: Want::Logprobs(vec![7, 9])
            }]
        );
        assert_eq!(read.precision, [Precision::Fast, Precision::Exact]);
        assert_eq!((plan.chunks[0].seq, plan.chunks[1].seq), (a, b));
        for (c, table) in plan.chunks.iter().zip(&batch.tables) {
            assert_eq!(
                *table,
                c.table.iter().map(|x| u32::from(x.unwrap())).collect::<Vec<_>>()
            );
        }
        // each slot is block · block_size + offset in the row's own table
        for r in 0..batch.len() {
            let t = &batch.tables[batch.seq_of_row[r] as usize];
            let p = batch.positions[r] as usize;
            assert_eq!(batch.slots[r], t[p / 4] as usize * 4 + p % 4);
        }
    }

    #[test]
    fn a_sequence_wanting_every_row_runs_in_capped_chunks() {
        let cfg = SchedulerConfig {
            caps: Caps {
                all_rows_cap: 5,
                ..Caps::default()
            },
            ..SchedulerConfig::new(8, 64, 4)
        };
        let mut s = Scheduler::new(cfg, 16);
        let (_, all) = s.add_generate((10..22).collect(), "", true);
        let (_, last) = s.add_generate((30..42).collect(), "", false);
        let mut rows = vec![];
        for _ in 0..3 {
            let plan = s.schedule().unwrap();
            let wants: Vec<ChunkWant> = plan.chunks.iter().map(|c| ChunkWant::Logits(c.logits)).collect();
            let b = build(&plan.chunks, &wants, &[Precision::Exact; 2][..plan.chunks.len()], &[]);
            let c = plan.chunks.iter().find(|c| c.seq == all).unwrap();
            rows.push((c.len, b.outputs.len()));
            // the other sequence is not capped: its whole prompt runs in the first step
            assert!(plan.chunks.iter().all(|c| c.seq != last || c.len == 12));
            s.advance_step(&plan.chunks).unwrap();
            let mut u = crate::scheduler::StepUpdate::default();
            for c in plan.chunks.iter().filter(|c| c.at_end) {
                u.finish(c.seq);
            }
            s.update_from_output(u).unwrap();
        }
        assert_eq!(rows.iter().map(|r| r.0).collect::<Vec<_>>(), [5, 5, 2]);
    }
}
