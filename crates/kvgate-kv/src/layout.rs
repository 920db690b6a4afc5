//! The shape of the cache: layers × {K, V} × blocks × KV heads × block_size tokens × head_dim, and the
//! byte arithmetic that sizes it.
//!
//! Within one block of one layer's K (or V) the layout is: the element data for every (head, token) in
//! `[head][token]` order, then the scale bytes for every (head, token) in the same order (only NVFP4 has
//! any, and fp8 with per-vector scales one exponent byte per vector). So a block is one contiguous byte range, which is what copy-on-write and the CUDA kernels
//! need.

use crate::dtype::KvDtype;
use crate::error::KvError;
use crate::quant::KvQuant;

/// Everything needed to size and address the cache. Built only by [`CacheShape::new`], which checks
/// that the dtype can store the shape, so every `CacheShape` in the process is a valid one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheShape {
    pub(crate) num_layers: usize,
    pub(crate) num_kv_heads: usize,
    pub(crate) head_dim: usize,
    pub(crate) block_size: usize,
    pub(crate) dtype: KvDtype,
    pub(crate) quant: KvQuant,
}

impl CacheShape {
    /// The shape of a cache of `num_layers` layers × `num_kv_heads` heads × `head_dim` elements, in
    /// blocks of `block_size` tokens stored as `dtype`. Refuses zero sizes and shapes the dtype cannot
    /// store (nvfp4 needs head_dim % 16 == 0 and block_size % 4 == 0).
    pub fn new(
        num_layers: usize,
        num_kv_heads: usize,
        head_dim: usize,
        block_size: usize,
        dtype: KvDtype,
    ) -> Result<CacheShape, KvError> {
        for (what, v) in [
            ("num_layers", num_layers),
            ("num_kv_heads", num_kv_heads),
            ("head_dim", head_dim),
            ("block_size", block_size),
        ] {
            if v == 0 {
                return Err(KvError::ZeroSize(what));
            }
        }
        dtype.check(head_dim, block_size)?;
        Ok(CacheShape {
            num_layers,
            num_kv_heads,
            head_dim,
            block_size,
            dtype,
            quant: KvQuant::PLAIN,
        })
    }

    /// The same shape stored as another dtype (with the plain method).
    pub fn with_dtype(&self, dtype: KvDtype) -> Result<CacheShape, KvError> {
        CacheShape::new(
            self.num_layers,
            self.num_kv_heads,
            self.head_dim,
            self.block_size,
            dtype,
        )
    }

    /// The same shape written with quantization method `quant` (refused where the dtype or head_dim
    /// cannot take it: see [`KvQuant::check`]).
    pub fn with_quant(&self, quant: KvQuant) -> Result<CacheShape, KvError> {
        quant.check(self.dtype, self.head_dim, self.block_size)?;
        Ok(CacheShape { quant, ..*self })
    }

    /// The quantization method.
    pub fn quant(&self) -> KvQuant {
        self.quant
    }

    /// Bytes of one stored vector (one token, one KV head), scales included.
    pub fn bytes_per_vector(&self) -> usize {
        self.dtype.bytes_per_vector(self.head_dim) + self.quant.extra_scale_bytes(self.dtype)
    }

    /// Scale bytes of one stored vector.
    pub fn scale_bytes(&self) -> usize {
        self.dtype.scale_bytes(self.head_dim) + self.quant.extra_scale_bytes(self.dtype)
    }

    /// Transformer layers (each has its own K and V).
    pub fn num_layers(&self) -> usize {
        self.num_layers
    }

    /// KV heads per layer.
    pub fn num_kv_heads(&self) -> usize {
        self.num_kv_heads
    }

    /// Elements per head.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Storage format.
    pub fn dtype(&self) -> KvDtype {
        self.dtype
    }

    /// Bytes of one block of one layer's K (or V).
    pub fn layer_block_bytes(&self) -> usize {
        self.num_kv_heads * self.block_size * self.bytes_per_vector()
    }

    /// Bytes of one block across all layers, K and V: the unit the cache is sized in.
    pub fn bytes_per_block(&self) -> usize {
        2 * self.num_layers * self.layer_block_bytes()
    }

    /// KV bytes one token costs across all layers, K and V.
    pub fn bytes_per_token(&self) -> f64 {
        self.bytes_per_block() as f64 / self.block_size as f64
    }

    /// How many blocks fit in `bytes`.
    pub fn blocks_for_bytes(&self, bytes: u64) -> Result<usize, KvError> {
        let per = self.bytes_per_block() as u64;
        let n = bytes / per;
        if n == 0 {
            return Err(KvError::TooSmall {
                bytes,
                block_bytes: per,
            });
        }
        Ok(n as usize)
    }

    /// Element index of (block, head, token, 0) within one layer's K (or V) for element dtypes.
    #[inline]
    pub fn elem_offset(&self, block: usize, head: usize, token: usize) -> usize {
        ((block * self.num_kv_heads + head) * self.block_size + token) * self.head_dim
    }

    /// Byte range of (block, head, token)'s packed data within one layer's K (or V) for byte dtypes,
    /// and the byte offset of its scales.
    #[inline]
    pub fn byte_offsets(&self, block: usize, head: usize, token: usize) -> (usize, usize) {
        let data = self.dtype.data_bytes(self.head_dim);
        let scales = self.scale_bytes();
        let base = block * self.layer_block_bytes();
        let idx = head * self.block_size + token;
        let data_start = base + idx * data;
        let scale_start = base + self.num_kv_heads * self.block_size * data + idx * scales;
        (data_start, scale_start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(dtype: KvDtype) -> CacheShape {
        CacheShape::new(30, 3, 64, 16, dtype).unwrap()
    }

    #[test]
    fn new_refuses_what_cannot_be_stored() {
        assert_eq!(
            CacheShape::new(1, 1, 64, 0, KvDtype::F32),
            Err(KvError::ZeroSize("block_size"))
        );
        assert!(CacheShape::new(1, 1, 40, 16, KvDtype::Nvfp4).is_err());
        assert!(CacheShape::new(1, 1, 40, 16, KvDtype::F32).is_ok());
    }

    #[test]
    fn capacity_scales_with_bytes_per_block() {
        let mem = 1u64 << 30;
        let bf16 = shape(KvDtype::BF16).blocks_for_bytes(mem).unwrap();
        let fp8 = shape(KvDtype::Fp8E4m3).blocks_for_bytes(mem).unwrap();
        let fp4 = shape(KvDtype::Nvfp4).blocks_for_bytes(mem).unwrap();
        assert!(fp8 >= 2 * bf16 - 1 && fp8 <= 2 * bf16 + 1);
        let ratio = fp4 as f64 / bf16 as f64;
        assert!((3.5..3.6).contains(&ratio), "{ratio}");
        assert_eq!(shape(KvDtype::F32).bytes_per_block(), 2 * 30 * 3 * 16 * 256);
    }

    #[test]
    fn too_small_is_an_error() {
        assert!(shape(KvDtype::F32).blocks_for_bytes(10).is_err());
    }

    #[test]
    fn nvfp4_block_is_data_then_scales() {
        let s = shape(KvDtype::Nvfp4);
        let (d0, s0) = s.byte_offsets(0, 0, 0);
        assert_eq!(d0, 0);
        assert_eq!(s0, 3 * 16 * 32);
        let (d_last, s_last) = s.byte_offsets(0, 2, 15);
        assert_eq!(d_last + 32, s0);
        assert_eq!(s_last + 4, s.layer_block_bytes());
        let (d1, _) = s.byte_offsets(1, 0, 0);
        assert_eq!(d1, s.layer_block_bytes());
    }
}
