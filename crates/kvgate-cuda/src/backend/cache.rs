//! The paged KV cache on the device: per layer one K and one V buffer in exactly
//! `kvgate_kv::CacheShape`'s layout (so a block's bytes are the CPU cache's bytes for the same
//! values, and [`DevCache::read_block`] / [`DevCache::write_block`] move the same bytes the CPU cache
//! does), the per-layer scales and `smooth` offsets, and block copies. Scales and offsets are refused
//! once anything has been written, as on the CPU: a block is always read with what it was written with.

use cudarc::driver::CudaSlice;
use kvgate_backend::BackendError;
use kvgate_kv::{CacheShape, KvError};

use crate::{drv, CudaError, Dims, Gpu};

/// One layer's K and V, scales and offsets.
pub(crate) struct DevLayerCache {
    pub k: CudaSlice<u8>,
    pub v: CudaSlice<u8>,
    pub k_scale: f32,
    pub v_scale: f32,
    /// `smooth` offsets (K, V), `kv_heads × head_dim` each.
    pub offsets: Option<(CudaSlice<f32>, CudaSlice<f32>)>,
    /// The offsets' host copy (for the fingerprint).
    pub host_offsets: Vec<f32>,
}

/// The whole cache.
pub(crate) struct DevCache {
    pub shape: CacheShape,
    pub num_blocks: usize,
    pub layers: Vec<DevLayerCache>,
    pub written: bool,
}

impl DevCache {
    /// A zeroed cache of `num_blocks` blocks of `shape`.
    pub fn new(gpu: &Gpu, shape: CacheShape, num_blocks: usize) -> Result<DevCache, CudaError> {
        let bytes = shape.layer_block_bytes() * num_blocks;
        let layers = (0..shape.num_layers())
            .map(|_| {
                Ok(DevLayerCache {
                    k: gpu.zeros(bytes)?,
                    v: gpu.zeros(bytes)?,
                    k_scale: 1.0,
                    v_scale: 1.0,
                    offsets: None,
                    host_offsets: Vec::new(),
                })
            })
            .collect::<Result<Vec<_>, CudaError>>()?;
        Ok(DevCache {
            shape,
            num_blocks,
            layers,
            written: false,
        })
    }

    /// The kernels' shape arguments for a model of `num_heads` query heads.
    pub fn dims(&self, num_heads: usize) -> Dims {
        Dims {
            num_kv_heads: self.shape.num_kv_heads(),
            num_heads,
            head_dim: self.shape.head_dim(),
            block_size: self.shape.block_size(),
        }
    }

    fn check_block(&self, b: usize, got: usize) -> Result<(), BackendError> {
        let expected = self.shape.bytes_per_block();
        if b >= self.num_blocks || got != expected {
            return Err(KvError::BlockBytes {
                block: b,
                num_blocks: self.num_blocks,
                expected,
                got,
            }
            .into());
        }
        Ok(())
    }

    /// Sets a layer's scales (before anything is written).
    pub fn set_scales(&mut self, layer: usize, k: f32, v: f32) -> Result<(), BackendError> {
        if self.written {
            return Err(KvError::Frozen { layer }.into());
        }
        let l = self.layers.get_mut(layer).ok_or(KvError::NoLayer(layer))?;
        l.k_scale = k;
        l.v_scale = v;
        Ok(())
    }

    /// Sets a layer's `smooth` offsets (before anything is written).
    pub fn set_offsets(&mut self, gpu: &Gpu, layer: usize, k: &[f32], v: &[f32]) -> Result<(), BackendError> {
        if self.written {
            return Err(KvError::Frozen { layer }.into());
        }
        let sh = self.shape;
        let n = sh.num_kv_heads() * sh.head_dim();
        if !sh.quant().smooth || k.len() != n || v.len() != n {
            return Err(KvError::Unsupported {
                dtype: sh.dtype().name(),
                reason: format!(
                    "offsets ({} and {} for {n} channels) with the {} method",
                    k.len(),
                    v.len(),
                    sh.quant().name()
                ),
            }
            .into());
        }
        let up = |x: &[f32]| gpu.upload(x).map_err(|e| compute(gpu, e));
        let pair = (up(k)?, up(v)?);
        let l = self.layers.get_mut(layer).ok_or(KvError::NoLayer(layer))?;
        l.offsets = Some(pair);
        l.host_offsets = k.iter().chain(v).copied().collect();
        Ok(())
    }

    /// Copies block `src` over `dst` in every layer.
    pub fn copy_block(&mut self, gpu: &Gpu, src: usize, dst: usize) -> Result<(), CudaError> {
        let n = self.shape.layer_block_bytes();
        let stream = gpu.stream();
        // through one scratch block: a buffer cannot be borrowed as source and destination at once
        let mut tmp = stream.alloc_zeros::<u8>(n).map_err(drv)?;
        for l in &mut self.layers {
            for buf in [&mut l.k, &mut l.v] {
                stream
                    .memcpy_dtod(&buf.slice(src * n..(src + 1) * n), &mut tmp)
                    .map_err(drv)?;
                stream
                    .memcpy_dtod(&tmp, &mut buf.slice_mut(dst * n..(dst + 1) * n))
                    .map_err(drv)?;
            }
        }
        Ok(())
    }

    /// Appends block `b`'s bytes: every layer's K block then V block.
    pub fn read_block(&self, gpu: &Gpu, b: usize, out: &mut Vec<u8>) -> Result<(), BackendError> {
        self.check_block(b, self.shape.bytes_per_block())?;
        let n = self.shape.layer_block_bytes();
        for l in &self.layers {
            for buf in [&l.k, &l.v] {
                let host = gpu
                    .stream()
                    .clone_dtoh(&buf.slice(b * n..(b + 1) * n))
                    .map_err(|e| compute(gpu, drv(e)))?;
                out.extend_from_slice(&host);
            }
        }
        gpu.synchronize().map_err(|e| compute(gpu, e))?;
        Ok(())
    }

    /// Overwrites block `b` with bytes [`DevCache::read_block`] gave.
    pub fn write_block(&mut self, gpu: &Gpu, b: usize, bytes: &[u8]) -> Result<(), BackendError> {
        self.check_block(b, bytes.len())?;
        self.written = true;
        let n = self.shape.layer_block_bytes();
        let mut src = bytes.chunks_exact(n);
        for l in &mut self.layers {
            for buf in [&mut l.k, &mut l.v] {
                let part = src.next().unwrap_or_default();
                gpu.stream()
                    .memcpy_htod(part, &mut buf.slice_mut(b * n..(b + 1) * n))
                    .map_err(|e| compute(gpu, drv(e)))?;
            }
        }
        gpu.synchronize().map_err(|e| compute(gpu, e))?;
        Ok(())
    }

    /// What a block's bytes depend on besides tokens and model: shape, scales, offsets.
    pub fn params_bytes(&self) -> Vec<u8> {
        let mut out = format!("{:?}", self.shape).into_bytes();
        for l in &self.layers {
            for x in [l.k_scale, l.v_scale].iter().chain(&l.host_offsets) {
                out.extend_from_slice(&x.to_le_bytes());
            }
        }
        out
    }
}

/// A device failure as the backend reports it.
pub(crate) fn compute(gpu: &Gpu, e: CudaError) -> BackendError {
    BackendError::Compute {
        device: kvgate_backend::Device::Cuda(gpu.ordinal() as u32),
        message: e.to_string(),
    }
}
