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
    };
    for c in chunks {
        let t = b.tables.len() as u32;
        b.tables.push(c.table.iter().map(|&blk| u32::from(blk)).collect());
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
