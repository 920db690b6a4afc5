//! The KV-cache launches of `kernels/kv_cache.cu`: quantize-on-store into the pages at given slots, and
//! paged attention of query rows over their own ranges. Every launch checks its slots, tables and
//! buffers against the cache it is given first (a [`CudaError::Invalid`], never an out-of-bounds
//! access).

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use kvgate_kv::{quant, KvDtype, KvQuant, Rotation, Scales};

use crate::{checked, drv, grid_for, Attention, BlockTables, CudaError, Dims, Gpu, Slots};

/// Positions one attention CTA takes of a longer row (split-K, flash-decoding): a long decode row is
/// read by ⌈span / SPLIT_TOKENS⌉ CTAs per head instead of one.
pub const SPLIT_TOKENS: usize = 512;

impl Gpu {
    /// Quantize-on-store: writes `x` (`slots.len() × kv_heads × head_dim` f32) into the cache layer
    /// `cache` (bytes, `kvgate_kv` layout) at `slots`, with the layer's `scale` (fp8: stored
    /// `x / scale`; nvfp4: global scale `1 / scale`) and the method `quant` (rotation, fine scales: as
    /// `kvgate_kv::quant`), after subtracting `offsets` (`kv_heads × head_dim`, `smooth` methods only).
    /// Refused unless every slot is inside `cache`, `x` holds every row, the offsets every channel and
    /// the method fits the dtype and shape.
    #[allow(clippy::too_many_arguments)]
    pub fn store(
        &self,
        dtype: KvDtype,
        quant: KvQuant,
        x: &CudaSlice<f32>,
        slots: &Slots,
        cache: &mut CudaSlice<u8>,
        d: Dims,
        scale: f32,
        offsets: Option<&CudaSlice<f32>>,
    ) -> Result<(), CudaError> {
        quant
            .check(dtype, d.head_dim, d.block_size)
            .map_err(|e| CudaError::Invalid(e.to_string()))?;
        let (offsets, has_offsets) = self.offsets_arg(quant, offsets, d)?;
        let tokens = slots.len;
        let blocks = checked::cache_blocks(cache.len(), dtype, quant, d)?;
        checked::check_below("slot", slots.max, blocks * d.block_size)?;
        checked::check_len("x", x.len(), tokens * d.num_kv_heads * d.head_dim)?;
        let slots = &slots.dev;
        let (nt, nkv, hd, bs) = (
            tokens as i32,
            d.num_kv_heads as i32,
            d.head_dim as i32,
            d.block_size as i32,
        );
        let elems = tokens * d.num_kv_heads * d.head_dim;
        if quant != KvQuant::PLAIN {
            let f = self.func("store_quant")?;
            let (fmt, layer): (i32, f32) = match dtype {
                KvDtype::Fp8E4m3 => (0, 1.0 / scale),
                KvDtype::Fp8E5m2 => (1, 1.0 / scale),
                KvDtype::Nvfp4 => (2, 1.0 / scale),
                other => return Err(CudaError::Unsupported(other.name())),
            };
            let rotate = i32::from(quant.rotation == Rotation::Hadamard);
            let fine = i32::from(quant.scales == Scales::Fine);
            let norm = quant::hadamard_norm(quant::hadamard_block(d.head_dim));
            // 4 warps per block, one vector per warp, each with head_dim floats of shared memory
            const WARPS: u32 = 4;
            let vectors = (tokens * d.num_kv_heads) as u32;
            let cfg = LaunchConfig {
                grid_dim: (vectors.div_ceil(WARPS).max(1), 1, 1),
                block_dim: (32 * WARPS, 1, 1),
                shared_mem_bytes: WARPS * d.head_dim as u32 * 4,
            };
            let mut b = self.stream.launch_builder(&f);
            b.arg(x)
                .arg(slots)
                .arg(cache)
                .arg(&layer)
                .arg(&fmt)
                .arg(&rotate)
                .arg(&fine)
                .arg(&norm)
                .arg(offsets)
                .arg(&has_offsets)
                .arg(&nt)
                .arg(&nkv)
                .arg(&hd)
                .arg(&bs);
            // SAFETY: arguments match the kernel's signature; writes stay inside the slots' blocks,
            // checked above to be inside the cache, laid out for this method.
            unsafe { b.launch(cfg) }.map_err(drv)?;
            return Ok(());
        }
        match dtype {
            KvDtype::F32 | KvDtype::F16 => {
                let f = self.func(if dtype == KvDtype::F32 {
                    "store_f32"
                } else {
                    "store_f16"
                })?;
                let mut b = self.stream.launch_builder(&f);
                b.arg(x).arg(slots).arg(cache).arg(&nt).arg(&nkv).arg(&hd).arg(&bs);
                // SAFETY: the cache is reinterpreted through its byte length; the kernel writes only
                // inside the slots' blocks, checked above to be inside the cache.
                unsafe { b.launch(grid_for(elems, 256)) }.map_err(drv)?;
            }
            KvDtype::BF16 => {
                let f = self.func("store_bf16")?;
                // SAFETY: the cache is reinterpreted as u16 through its byte length; the kernel writes
                // only inside the slots' blocks, checked above to be inside the cache.
                let mut b = self.stream.launch_builder(&f);
                b.arg(x).arg(slots).arg(cache).arg(&nt).arg(&nkv).arg(&hd).arg(&bs);
                unsafe { b.launch(grid_for(elems, 256)) }.map_err(drv)?;
            }
            KvDtype::Fp8E4m3 | KvDtype::Fp8E5m2 => {
                let f = self.func("store_fp8")?;
                let inv = 1.0f32 / scale;
                let fmt: i32 = if dtype == KvDtype::Fp8E4m3 { 0 } else { 1 };
                let mut b = self.stream.launch_builder(&f);
                b.arg(x)
                    .arg(slots)
                    .arg(cache)
                    .arg(&inv)
                    .arg(&fmt)
                    .arg(&nt)
                    .arg(&nkv)
                    .arg(&hd)
                    .arg(&bs);
                // SAFETY: arguments match the kernel's signature; writes stay inside the slots' blocks.
                unsafe { b.launch(grid_for(elems, 256)) }.map_err(drv)?;
            }
            KvDtype::Nvfp4 => {
                let f = self.func("store_nvfp4")?;
                let gs = 1.0f32 / scale;
                let mut b = self.stream.launch_builder(&f);
                b.arg(x)
                    .arg(slots)
                    .arg(cache)
                    .arg(&gs)
                    .arg(&nt)
                    .arg(&nkv)
                    .arg(&hd)
                    .arg(&bs);
                // SAFETY: arguments match the kernel's signature; writes stay inside the slots' blocks.
                unsafe { b.launch(grid_for(elems / 16, 128)) }.map_err(drv)?;
            }
            other => return Err(CudaError::Unsupported(other.name())),
        }
        Ok(())
    }

    /// Paged-attention decode: one query row per sequence (`q`: `seqs × heads × head_dim`), attending to
    /// the first `ctx_lens[s]` tokens through `tables`, over caches written with `quant` (a rotating
    /// method rotates `q` and rotates the output back; fp8 fine scales are read per vector). Refused
    /// unless every block in use is inside both caches and `q`/`out` hold every row.
    #[allow(clippy::too_many_arguments)]
    pub fn paged_attention(
        &self,
        dtype: KvDtype,
        quant: KvQuant,
        v_offsets: Option<&CudaSlice<f32>>,
        out: &mut CudaSlice<f32>,
        q: &CudaSlice<f32>,
        k_cache: &CudaSlice<u8>,
        v_cache: &CudaSlice<u8>,
        tables: &BlockTables,
        d: Dims,
        scale: f32,
        k_scale: f32,
        v_scale: f32,
    ) -> Result<(), CudaError> {
        let a = Attention {
            dtype,
            quant,
            d,
            scale,
            k_scale,
            v_scale,
            softcap: None,
        };
        self.attention(&a, v_offsets, out, q, k_cache, v_cache, tables)
    }

    /// Paged attention for every query row of `tables` (`q`, `out`: `rows × heads × head_dim`), each
    /// over positions `first .. end` of its sequence, with the scores soft-capped when `a.softcap`
    /// is set; otherwise as [`Gpu::paged_attention`].
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &self,
        a: &Attention,
        v_offsets: Option<&CudaSlice<f32>>,
        out: &mut CudaSlice<f32>,
        q: &CudaSlice<f32>,
        k_cache: &CudaSlice<u8>,
        v_cache: &CudaSlice<u8>,
        tables: &BlockTables,
    ) -> Result<(), CudaError> {
        let (dtype, quant, d, scale, k_scale, v_scale) = (a.dtype, a.quant, a.d, a.scale, a.k_scale, a.v_scale);
        let softcap = a.softcap.unwrap_or(0.0);
        if a.softcap.is_some() && quant.smooth {
            // K offsets drop out of a softmax but not out of a softcap; the kernel keeps no K bias
            return Err(CudaError::Unsupported("smooth method with an attention softcap"));
        }
        if tables.block_size != d.block_size {
            return Err(CudaError::Invalid(format!(
                "tables of block size {} for a cache of block size {}",
                tables.block_size, d.block_size
            )));
        }
        quant
            .check(dtype, d.head_dim, d.block_size)
            .map_err(|e| CudaError::Invalid(e.to_string()))?;
        let (v_offsets, has_offsets) = self.offsets_arg(quant, v_offsets, d)?;
        let blocks = checked::cache_blocks(k_cache.len(), dtype, quant, d)?;
        if checked::cache_blocks(v_cache.len(), dtype, quant, d)? != blocks {
            return Err(CudaError::Invalid("K and V caches of different sizes".into()));
        }
        checked::check_below("block", tables.max_block, blocks)?;
        let (num_rows, max_blocks) = (tables.num_rows, tables.max_blocks);
        let rows = num_rows * d.num_heads * d.head_dim;
        checked::check_len("q", q.len(), rows)?;
        checked::check_len("out", out.len(), rows)?;
        if num_rows == 0 {
            return Ok(());
        }
        let max_span = tables.max_span;
        let masks = tables.masks.as_ref();
        let has_masks = i32::from(masks.is_some());
        let (tables, row_info) = (&tables.tables, &tables.rows);
        let name = match dtype {
            KvDtype::F32 => "paged_attention_f32",
            KvDtype::F16 => "paged_attention_f16",
            KvDtype::BF16 => "paged_attention_bf16",
            KvDtype::Fp8E4m3 => "paged_attention_e4m3",
            KvDtype::Fp8E5m2 => "paged_attention_e5m2",
            KvDtype::Nvfp4 => "paged_attention_nvfp4",
            other => return Err(CudaError::Unsupported(other.name())),
        };
        if !(d.head_dim < 32 || d.head_dim.is_multiple_of(32) && d.head_dim <= 256) {
            return Err(CudaError::Invalid(format!(
                "head_dim {} must be below 32 or a multiple of 32 up to 256",
                d.head_dim
            )));
        }
        let f = self.func(name)?;
        let rotate = i32::from(quant.rotation == Rotation::Hadamard);
        let fine = i32::from(quant.scales == Scales::Fine && dtype != KvDtype::Nvfp4);
        let norm = quant::hadamard_norm(quant::hadamard_block(d.head_dim));
        let (mb, nh, nkv, hd, bs) = (
            max_blocks as i32,
            d.num_heads as i32,
            d.num_kv_heads as i32,
            d.head_dim as i32,
            d.block_size as i32,
        );
        // Must match WARPS in kernels/kv_cache.cu.
        const WARPS: usize = 8;
        // split-K: rows longer than SPLIT_TOKENS positions are cut into pieces of that many, one CTA
        // each, merged after (a fixed length: a row's split, so its bits, never depends on the batch)
        let nsplit = max_span.div_ceil(SPLIT_TOKENS).max(1);
        let split_len = if nsplit > 1 { SPLIT_TOKENS as i32 } else { 0 };
        // the splits' partial results; a single pass writes none (the stand-in is never touched)
        let mut partial = if nsplit > 1 {
            let n = rows / d.head_dim * nsplit * (d.head_dim + 2);
            Some(self.stream.alloc_zeros::<f32>(n).map_err(drv)?)
        } else {
            None
        };
        let cfg = LaunchConfig {
            grid_dim: (d.num_heads as u32, num_rows as u32, nsplit as u32),
            block_dim: ((WARPS * 32) as u32, 1, 1),
            shared_mem_bytes: ((d.head_dim + WARPS * (d.head_dim + 2)) * 4) as u32,
        };
        let mut b = self.stream.launch_builder(&f);
        b.arg(&mut *out)
            .arg(q)
            .arg(k_cache)
            .arg(v_cache)
            .arg(tables)
            .arg(&mb)
            .arg(row_info)
            .arg(&nh)
            .arg(&nkv)
            .arg(&hd)
            .arg(&bs)
            .arg(&scale)
            .arg(&k_scale)
            .arg(&v_scale)
            .arg(&rotate)
            .arg(&fine)
            .arg(&norm)
            .arg(v_offsets)
            .arg(&has_offsets)
            .arg(&softcap)
            .arg(&split_len);
        match partial.as_mut() {
            Some(p) => b.arg(p),
            None => b.arg(&self.absent),
        };
        b.arg(&has_masks);
        // a causal batch passes stand-ins the kernel never reads
        match masks {
            Some((desc, words)) => b.arg(desc).arg(words),
            None => b.arg(&self.absent).arg(&self.absent),
        };
        // SAFETY: arguments match the kernel's signature; every block in use was checked above to be
        // inside both caches, q/out hold every row, partial every (row, head, split) when splitting,
        // and the masks a word for every position a tree row's range holds from its base.
        unsafe { b.launch(cfg) }.map_err(drv)?;
        if let Some(partial) = &partial {
            let merge = self.func("attention_merge")?;
            let ns = nsplit as i32;
            let cfg = LaunchConfig {
                grid_dim: (d.num_heads as u32, num_rows as u32, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: (d.head_dim * 4) as u32,
            };
            let mut b = self.stream.launch_builder(&merge);
            b.arg(out)
                .arg(partial)
                .arg(row_info)
                .arg(&nh)
                .arg(&nkv)
                .arg(&hd)
                .arg(&ns)
                .arg(&split_len)
                .arg(&rotate)
                .arg(&norm)
                .arg(v_offsets)
                .arg(&has_offsets);
            // SAFETY: partial holds every split the first launch wrote; out holds every row.
            unsafe { b.launch(cfg) }.map_err(drv)?;
        }
        Ok(())
    }

    /// The offsets argument of a kernel: the given buffer (checked: a `smooth` method, `kv_heads ×
    /// head_dim` values) and 1, or the one-float stand-in and 0.
    fn offsets_arg<'a>(
        &'a self,
        quant: KvQuant,
        offsets: Option<&'a CudaSlice<f32>>,
        d: Dims,
    ) -> Result<(&'a CudaSlice<f32>, i32), CudaError> {
        match offsets {
            Some(o) => {
                if !quant.smooth {
                    return Err(CudaError::Invalid(format!(
                        "the {} method keeps no offsets",
                        quant.name()
                    )));
                }
                checked::check_len("offsets", o.len(), d.num_kv_heads * d.head_dim)?;
                Ok((o, 1))
            }
            None => Ok((&self.absent, 0)),
        }
    }
}
