//! What crosses the seam for a token tree of speculation: where its rows may sit ([`TreeGrain`]) and
//! the slot moves that put a kept path where its sequence reads it ([`SlotCopy`], [`splice_slot`]).
//!
//! A tree row attends to the shared prefix and to its ancestors, which sit at other slots than a
//! plain sequence would give them. A backend whose attention reduces each row in a fixed order over
//! positions — sums in lane `position mod lanes`, partials per aligned partition of `partition`
//! positions, folded in order; an unseen position contributing an exact zero — computes such a row
//! bitwise as the plain sequence would when every visible row sits in the lane and the partition its
//! plain position has ([`TreeGrain::fits`]). The engine lays trees out that way, or not at all.

use kvgate_kv::CacheShape;

/// The layout rule of a backend's exact token trees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeGrain {
    /// Positions `p` and `q` reduce alike when `p ≡ q` modulo this.
    pub lanes: usize,
    /// … and lie in the same aligned run of this many positions.
    pub partition: usize,
}

impl TreeGrain {
    /// Whether a row whose plain position is `plain` may sit at position `at` (`at ≥ plain`).
    pub fn fits(&self, plain: usize, at: usize) -> bool {
        at >= plain && (at - plain).is_multiple_of(self.lanes) && at / self.partition == plain / self.partition
    }
}

/// Copy token slot `src` over slot `dst` (`block · block_size + offset`) in every layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotCopy {
    /// Source slot.
    pub src: usize,
    /// Destination slot.
    pub dst: usize,
}

/// Copies token `src_tok`'s bytes of block bytes `from` over token `dst_tok`'s in `to` (both as
/// [`crate::Backend::read_block`] gives them: every layer's K block then V block, in `shape`'s
/// layout): every head's data and scales.
pub fn splice_slot(shape: &CacheShape, from: &[u8], src_tok: usize, to: &mut [u8], dst_tok: usize) {
    let n = shape.layer_block_bytes();
    let (data, scales) = (shape.dtype().data_bytes(shape.head_dim()), shape.scale_bytes());
    for (a, b) in from.chunks_exact(n).zip(to.chunks_exact_mut(n)) {
        for h in 0..shape.num_kv_heads() {
            let (ds, ss) = shape.byte_offsets(0, h, src_tok);
            let (dd, sd) = shape.byte_offsets(0, h, dst_tok);
            b[dd..dd + data].copy_from_slice(&a[ds..ds + data]);
            b[sd..sd + scales].copy_from_slice(&a[ss..ss + scales]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_fits_in_its_lane_and_partition() {
        let g = TreeGrain {
            lanes: 8,
            partition: 256,
        };
        assert!(g.fits(10, 10));
        assert!(g.fits(10, 18));
        assert!(!g.fits(10, 17));
        assert!(!g.fits(10, 2));
        // 250 → 258 crosses into the next partition
        assert!(!g.fits(250, 258));
        assert!(g.fits(256, 264));
    }

    /// [`splice_slot`] over a block's bytes does what the cache's own slot copy does, for every dtype.
    #[test]
    fn a_spliced_slot_is_the_caches_own_copy() {
        use kvgate_kv::{KvCache, KvDtype, KvQuant};
        for dtype in KvDtype::ALL {
            for &method in KvQuant::methods_for(dtype) {
                let shape = CacheShape::new(2, 2, 32, 4, dtype).unwrap().with_quant(method).unwrap();
                let mut cache = KvCache::new(shape, 3);
                for slot in 0..12 {
                    let k: Vec<f32> = (0..64).map(|i| ((slot * 64 + i) as f32 * 0.37).sin()).collect();
                    let v: Vec<f32> = (0..64).map(|i| ((slot * 64 + i) as f32 * 0.11).cos()).collect();
                    for layer in 0..2 {
                        cache.write(layer, &[slot], &k, &v);
                    }
                }
                let mut own = cache.clone();
                own.copy_slot(9, 2).unwrap();
                let (mut from, mut to) = (vec![], vec![]);
                cache.read_block(2, &mut from).unwrap();
                cache.read_block(0, &mut to).unwrap();
                splice_slot(&shape, &from, 1, &mut to, 2);
                let mut want = vec![];
                own.read_block(0, &mut want).unwrap();
                assert_eq!(to, want, "{dtype} {}", method.name());
                // the source block is untouched, and the copy changed the destination
                let mut before = vec![];
                cache.read_block(0, &mut before).unwrap();
                assert_ne!(before, want);
            }
        }
    }
}
