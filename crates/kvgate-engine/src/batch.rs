//! The batch builder: one step's [`Plan`] flattened into the device-neutral [`Batch`] a backend runs —
//! token rows with their positions and cache slots, one block table per sequence, and the rows whose
//! logits are wanted, in chunk order.

use kvgate_model::Batch;

use crate::scheduler::{Chunk, Logits};

/// Rows of logits a chunk produces.
pub(crate) fn logit_rows(c: &Chunk) -> usize {
    match c.logits {
        Logits::None => 0,
        Logits::Last => 1,
        Logits::All => c.len,
    }
}

/// Flattens the chunks of a plan into one batch.
pub(crate) fn build(chunks: &[Chunk]) -> Batch {
    let rows: usize = chunks.iter().map(|c| c.len).sum();
    let mut b = Batch {
        tokens: Vec::with_capacity(rows),
        positions: Vec::with_capacity(rows),
        slots: Vec::with_capacity(rows),
        seq_of_row: Vec::with_capacity(rows),
        tables: Vec::with_capacity(chunks.len()),
        logit_rows: Vec::new(),
        int8: Vec::new(),
    };
    for c in chunks {
        let t = b.tables.len() as u32;
        // A released block is outside every query's window, so attention never reads its entry.
        b.tables.push(
            c.table
                .iter()
                .map(|blk| blk.map_or(kvgate_model::RELEASED_BLOCK, u32::from))
                .collect(),
        );
        let first_logit = c.len - logit_rows(c);
        for i in 0..c.len {
            if i >= first_logit {
                b.logit_rows.push(b.tokens.len());
            }
            b.tokens.push(c.tokens[i]);
            b.positions.push((c.start + i) as u32);
            b.slots.push(c.slots[i]);
            b.seq_of_row.push(t);
        }
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::{Scheduler, SchedulerConfig};

    #[test]
    fn batch_rows_come_from_the_plan() {
        let cfg = SchedulerConfig {
            max_num_seqs: 8,
            max_num_batched_tokens: 64,
            block_size: 4,
            prefix_caching: true,
            release_window: None,
        };
        let mut s = Scheduler::new(cfg, 16);
        let (_, a) = s.add_generate((10..16).collect(), "", false);
        let (_, b) = s.add_generate((20..23).collect(), "", true);
        let plan = s.schedule().unwrap();
        let batch = build(&plan.chunks);
        assert_eq!(batch.tokens, [10, 11, 12, 13, 14, 15, 20, 21, 22]);
        assert_eq!(batch.positions, [0, 1, 2, 3, 4, 5, 0, 1, 2]);
        assert_eq!(batch.seq_of_row, [0, 0, 0, 0, 0, 0, 1, 1, 1]);
        // the first sequence wants its last row, the second (prompt logprobs) every row
        assert_eq!(batch.logit_rows, [5, 6, 7, 8]);
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
}
