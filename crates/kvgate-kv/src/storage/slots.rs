//! Token-slot copies: one token's stored K and V vectors (with their scales) moved to another slot
//! of the cache, bitwise, in every layer — how a token tree's kept path ends up where the sequence
//! reads it ([`KvCache::copy_slot`]).

use super::{Buf, KvCache, LayerCache};
use crate::error::KvError;

impl LayerCache {
    /// Copies the stored vectors (and scales) of token slot `src` over slot `dst`, every head, K and V.
    pub(super) fn copy_slot(&mut self, src: usize, dst: usize) {
        let s = self.shape;
        let bs = s.block_size;
        let (hd, data, scales) = (s.head_dim, s.dtype.data_bytes(s.head_dim), s.scale_bytes());
        for buf in [&mut self.k, &mut self.v] {
            for h in 0..s.num_kv_heads {
                let (a, b) = (
                    s.elem_offset(src / bs, h, src % bs),
                    s.elem_offset(dst / bs, h, dst % bs),
                );
                match buf {
                    Buf::F32(v) => v.copy_within(a..a + hd, b),
                    Buf::F16(v) => v.copy_within(a..a + hd, b),
                    Buf::BF16(v) => v.copy_within(a..a + hd, b),
                    Buf::Bytes(v) => {
                        let (da, sa) = s.byte_offsets(src / bs, h, src % bs);
                        let (db, sb) = s.byte_offsets(dst / bs, h, dst % bs);
                        v.copy_within(da..da + data, db);
                        v.copy_within(sa..sa + scales, sb);
                    }
                }
            }
        }
    }
}

impl KvCache {
    /// Copies token slot `src` (`block · block_size + offset`) over slot `dst` in every layer, bitwise
    /// (a token tree's kept row moved to where the sequence reads it); both must be below
    /// `num_blocks · block_size`.
    pub fn copy_slot(&mut self, src: usize, dst: usize) -> Result<(), KvError> {
        let slots = self.num_blocks * self.shape.block_size;
        if let Some(&bad) = [src, dst].iter().find(|&&x| x >= slots) {
            return Err(KvError::SlotOutOfRange { slot: bad, slots });
        }
        for l in &mut self.layers {
            l.copy_slot(src, dst);
        }
        Ok(())
    }
}
