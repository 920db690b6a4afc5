//! Caller-supplied slots and block tables, checked before any kernel reads them. A [`Slots`] or
//! [`BlockTables`] is made only by [`crate::Gpu::upload_slots`] / [`crate::Gpu::upload_tables`], which
//! validate the host values and remember the largest block they name; every launch then checks that
//! block against the cache it is given. So no caller can make a kernel read or write outside a cache
//! through a bad id (the contract the safe API promises).

use cudarc::driver::CudaSlice;
use kvgate_kv::{KvDtype, KvQuant, RowMask};

use crate::{CudaError, Dims};

/// Cache slots (`block · block_size + offset`) on the device.
pub struct Slots {
    pub(crate) dev: CudaSlice<i64>,
    pub(crate) len: usize,
    pub(crate) max: Option<usize>,
}

impl Slots {
    /// Number of slots (tokens).
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when there are no slots.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Block tables (`seqs × max_blocks` ids) and the query rows that read them on the device: per row,
/// its sequence and the positions `first .. end` it attends to.
pub struct BlockTables {
    pub(crate) tables: CudaSlice<i32>,
    pub(crate) rows: CudaSlice<i32>,
    pub(crate) seqs: usize,
    pub(crate) num_rows: usize,
    pub(crate) max_blocks: usize,
    pub(crate) block_size: usize,
    pub(crate) max_block: Option<usize>,
    /// The most positions any row attends to (what split-K divides).
    pub(crate) max_span: usize,
    /// Tree rows: per row `(base, first mask word or −1)`, and the mask words; `None` when every row
    /// is causal.
    pub(crate) masks: Option<(CudaSlice<i32>, CudaSlice<u64>)>,
}

impl BlockTables {
    /// Sequences.
    pub fn seqs(&self) -> usize {
        self.seqs
    }

    /// Query rows.
    pub fn rows(&self) -> usize {
        self.num_rows
    }
}

/// One query row of an attention launch: its sequence (a table index) and the positions
/// `first .. end` of that sequence it attends to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueryRow {
    /// Table index.
    pub seq: usize,
    /// First position read.
    pub first: usize,
    /// One past the last position read (the row's own position + 1).
    pub end: usize,
}

/// Checks query rows against the tables and returns the largest block a kernel will read: the
/// entries holding positions `first .. end` of each row (the others — padding, or blocks released
/// before a window — are never read, whatever they hold).
pub(crate) fn max_row_block(
    tables: &[i32],
    max_blocks: usize,
    rows: &[QueryRow],
    block_size: usize,
) -> Result<Option<usize>, CudaError> {
    if block_size == 0 || max_blocks == 0 || !tables.len().is_multiple_of(max_blocks) {
        return Err(bad(format!(
            "{} table entries are not whole tables of {max_blocks} blocks (block size {block_size})",
            tables.len()
        )));
    }
    let seqs = tables.len() / max_blocks;
    let mut max = None;
    for (r, q) in rows.iter().enumerate() {
        if q.seq >= seqs || q.first >= q.end || q.end > max_blocks * block_size || q.end > i32::MAX as usize {
            return Err(bad(format!(
                "row {r}: positions {}..{} of sequence {} do not fit {seqs} tables of {max_blocks} blocks of {block_size}",
                q.first, q.end, q.seq
            )));
        }
        let t = &tables[q.seq * max_blocks..(q.seq + 1) * max_blocks];
        for &b in &t[q.first / block_size..q.end.div_ceil(block_size)] {
            let b = usize::try_from(b).map_err(|_| bad(format!("row {r}: negative block id {b}")))?;
            max = max.max(Some(b));
        }
    }
    Ok(max)
}

/// The tree masks of `rows` as the kernel reads them: per row `(base, first word or −1)` and the
/// words; each mask checked to decide only positions inside its row's range (`base < end`) and to
/// hold a bit for every one of them (the kernel reads no word past them).
pub(crate) fn tree_masks(rows: &[QueryRow], masks: &[Option<RowMask>]) -> Result<(Vec<i32>, Vec<u64>), CudaError> {
    if masks.len() != rows.len() {
        return Err(bad(format!("{} masks for {} rows", masks.len(), rows.len())));
    }
    let mut desc = Vec::with_capacity(2 * rows.len());
    let mut words = vec![];
    for (r, (q, m)) in rows.iter().zip(masks).enumerate() {
        let Some(m) = m else {
            desc.extend([0, -1]);
            continue;
        };
        let base = m.base as usize;
        if base >= q.end || m.seen.len() * 64 < q.end - base || words.len() > i32::MAX as usize {
            return Err(bad(format!(
                "row {r}: a mask from position {base} of {} words does not cover positions up to {}",
                m.seen.len(),
                q.end
            )));
        }
        desc.extend([m.base as i32, words.len() as i32]);
        words.extend_from_slice(&m.seen);
    }
    if words.is_empty() {
        words.push(0);
    }
    Ok((desc, words))
}

fn bad(msg: String) -> CudaError {
    CudaError::Invalid(msg)
}

/// Blocks in a cache layer of `bytes` bytes for `dtype` and `d` (the length must be a whole number of
/// blocks).
pub(crate) fn cache_blocks(bytes: usize, dtype: KvDtype, quant: KvQuant, d: Dims) -> Result<usize, CudaError> {
    let per = d.num_kv_heads * d.block_size * (dtype.bytes_per_vector(d.head_dim) + quant.extra_scale_bytes(dtype));
    if per == 0 || !bytes.is_multiple_of(per) {
        return Err(bad(format!(
            "a cache layer of {bytes} bytes is not a whole number of {per}-byte blocks"
        )));
    }
    Ok(bytes / per)
}

/// The largest slot, after checking none is beyond `i64`.
pub(crate) fn max_slot(slots: &[usize]) -> Result<Option<usize>, CudaError> {
    match slots.iter().copied().max() {
        Some(m) if m > i64::MAX as usize => Err(bad(format!("slot {m} does not fit the kernel's i64"))),
        m => Ok(m),
    }
}

/// Checks tables against their context lengths and returns the largest block a kernel will read: the
/// first `ceil(ctx / block_size)` entries of each sequence (the rest is padding and never read).
pub(crate) fn max_table_block(
    tables: &[i32],
    max_blocks: usize,
    ctx_lens: &[usize],
    block_size: usize,
) -> Result<Option<usize>, CudaError> {
    if block_size == 0 || tables.len() != ctx_lens.len() * max_blocks {
        return Err(bad(format!(
            "{} table entries for {} sequences of {max_blocks} blocks (block size {block_size})",
            tables.len(),
            ctx_lens.len()
        )));
    }
    let mut max = None;
    for (s, &ctx) in ctx_lens.iter().enumerate() {
        let used = ctx.div_ceil(block_size);
        if ctx == 0 || used > max_blocks || ctx > i32::MAX as usize {
            return Err(bad(format!(
                "sequence {s}: context of {ctx} tokens does not fit its table of {max_blocks} blocks of {block_size}"
            )));
        }
        for &b in &tables[s * max_blocks..s * max_blocks + used] {
            let b = usize::try_from(b).map_err(|_| bad(format!("sequence {s}: negative block id {b}")))?;
            max = max.max(Some(b));
        }
    }
    Ok(max)
}

/// Checks that the largest id (block or slot) is below the limit.
pub(crate) fn check_below(what: &str, max: Option<usize>, limit: usize) -> Result<(), CudaError> {
    match max {
        Some(m) if m >= limit => Err(bad(format!("{what} {m} is outside the cache ({limit} in all)"))),
        _ => Ok(()),
    }
}

/// Checks that a device buffer holds at least `need` elements.
pub(crate) fn check_len(what: &str, have: usize, need: usize) -> Result<(), CudaError> {
    if have < need {
        return Err(bad(format!("{what} holds {have} elements, {need} needed")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: Dims = Dims {
        num_kv_heads: 2,
        num_heads: 4,
        head_dim: 64,
        block_size: 16,
    };

    #[test]
    fn cache_must_be_whole_blocks() {
        let per = 2 * 16 * 64; // fp8: one byte per element
        assert_eq!(cache_blocks(3 * per, KvDtype::Fp8E4m3, KvQuant::PLAIN, D), Ok(3));
        assert!(cache_blocks(3 * per + 1, KvDtype::Fp8E4m3, KvQuant::PLAIN, D).is_err());
    }

    #[test]
    fn tables_are_checked_up_to_the_context() {
        // two sequences of 3 blocks; the second uses one block, its padding may hold anything
        let t = [0, 1, 2, 5, -1, 99];
        assert_eq!(max_table_block(&t, 3, &[40, 10], 16), Ok(Some(5)));
        assert!(max_table_block(&t, 3, &[40, 20], 16).is_err(), "a negative id in use");
        assert!(
            max_table_block(&t, 3, &[49, 10], 16).is_err(),
            "context beyond the table"
        );
        assert!(max_table_block(&t, 3, &[0, 10], 16).is_err(), "empty context");
        assert!(max_table_block(&t[..5], 3, &[40, 10], 16).is_err(), "ragged tables");
        assert!(check_below("block", Some(5), 5).is_err());
        assert!(check_below("block", Some(4), 5).is_ok());
        assert!(check_below("slot", None, 0).is_ok());
    }

    #[test]
    fn rows_are_checked_over_what_they_read() {
        // sequence 0 released its first block (-1) before a window; sequence 1 is one block
        let t = [-1, 1, 2, 5, -1, 99];
        let row = |seq, first, end| QueryRow { seq, first, end };
        assert_eq!(max_row_block(&t, 3, &[row(0, 20, 40), row(1, 0, 10)], 16), Ok(Some(5)));
        assert!(
            max_row_block(&t, 3, &[row(0, 0, 40)], 16).is_err(),
            "reads the released block"
        );
        assert!(
            max_row_block(&t, 3, &[row(1, 0, 20)], 16).is_err(),
            "reads a negative id"
        );
        assert!(max_row_block(&t, 3, &[row(2, 0, 1)], 16).is_err(), "no such sequence");
        assert!(max_row_block(&t, 3, &[row(0, 5, 5)], 16).is_err(), "empty range");
        assert!(max_row_block(&t, 3, &[row(0, 0, 49)], 16).is_err(), "beyond the table");
        assert!(max_row_block(&t[..5], 3, &[], 16).is_err(), "ragged tables");
    }
}
