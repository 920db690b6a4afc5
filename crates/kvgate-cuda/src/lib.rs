//! kvgate's CUDA side: the kernels of `kernels/*.cu` (quantize-on-store and paged-attention decode over
//! bf16, fp8 and nvfp4 KV blocks), compiled at run time by NVRTC to an sm_90 CUBIN and launched through
//! cudarc.
//!
//! Nothing here needs CUDA at build time: cudarc loads `libcuda` and `libnvrtc` with `dlopen` when first
//! used. Before any call into them this crate checks that the libraries can be loaded, so a machine
//! without a driver gets [`CudaError::NoDriver`] ("no CUDA device") instead of a crash, and one without
//! NVRTC gets [`CudaError::NoNvrtc`]. Compiled kernels are cached per process.
//!
//! The device layout of a cache layer is exactly `kvgate_kv::CacheShape`'s, so bytes written by
//! [`Gpu::store`] can be compared with the CPU codecs byte for byte.

mod checked;
pub mod nvrtc;

pub use checked::{BlockTables, Slots};

use std::sync::{Arc, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use kvgate_kv::{quant, KvDtype, KvQuant, Rotation, Scales};
use thiserror::Error;

/// The kernel sources, embedded.
pub const SOURCES: &[(&str, &str)] = &[("kv_cache.cu", include_str!("../../../kernels/kv_cache.cu"))];

/// The architecture kernels are built for (the H200).
pub const ARCH: &str = "sm_90";

/// What can go wrong.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum CudaError {
    /// `libnvrtc` cannot be loaded.
    #[error("NVRTC is not available (libnvrtc.so.13 not found on the library path)")]
    NoNvrtc,
    /// `libcuda` cannot be loaded.
    #[error("no CUDA device: the CUDA driver (libcuda.so.1) is not available")]
    NoDriver,
    /// The driver reports no device.
    #[error("no CUDA device: {0}")]
    NoDevice(String),
    /// A kernel failed to compile.
    #[error("NVRTC compile of {file} for {arch} failed: {log}")]
    Compile {
        /// Source file.
        file: String,
        /// Target.
        arch: String,
        /// Compiler log.
        log: String,
    },
    /// A driver call failed.
    #[error("CUDA driver error: {0}")]
    Driver(String),
    /// Caller-supplied slots, tables or buffers that do not fit the cache or each other.
    #[error("invalid kernel arguments: {0}")]
    Invalid(String),
    /// A dtype without a GPU kernel.
    #[error("no CUDA kernel for the {0} KV cache")]
    Unsupported(&'static str),
}

fn drv(e: impl std::fmt::Debug) -> CudaError {
    CudaError::Driver(format!("{e:?}"))
}

/// Whether the CUDA driver library can be loaded (no call into it is made otherwise).
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library; makes no driver call.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Number of CUDA devices, or why there are none.
pub fn device_count() -> Result<usize, CudaError> {
    if !driver_present() {
        return Err(CudaError::NoDriver);
    }
    match CudaContext::device_count() {
        Ok(n) if n > 0 => Ok(n as usize),
        Ok(_) => Err(CudaError::NoDevice("the driver reports 0 devices".into())),
        Err(e) => Err(CudaError::NoDevice(format!("{e:?}"))),
    }
}

/// A compiled source: its file name and CUBIN.
pub type Cubin = (String, Vec<u8>);

/// The CUBIN of every source for [`ARCH`], compiled once per process.
pub fn cubins() -> Result<&'static [Cubin], CudaError> {
    static CACHE: OnceLock<Result<Vec<Cubin>, CudaError>> = OnceLock::new();
    CACHE
        .get_or_init(|| {
            SOURCES
                .iter()
                .map(|(name, src)| nvrtc::compile_cubin(name, src, ARCH).map(|c| (name.to_string(), c)))
                .collect()
        })
        .as_ref()
        .map(|v| v.as_slice())
        .map_err(Clone::clone)
}

/// A device with the kernels loaded.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    module: Arc<CudaModule>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu").field("ordinal", &self.ctx.ordinal()).finish()
    }
}

/// Shape arguments shared by the kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    /// KV heads.
    pub num_kv_heads: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Tokens per block.
    pub block_size: usize,
}

fn grid_for(n: usize, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: ((n as u32).div_ceil(threads).max(1), 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl Gpu {
    /// Opens device `ordinal` and loads the kernels (compiling them on first use).
    pub fn new(ordinal: usize) -> Result<Gpu, CudaError> {
        let n = device_count()?;
        if ordinal >= n {
            return Err(CudaError::NoDevice(format!("device {ordinal} requested, {n} present")));
        }
        let cubins = cubins()?;
        let ctx = CudaContext::new(ordinal).map_err(drv)?;
        let stream = ctx.default_stream();
        let module = ctx
            .load_module(cudarc::nvrtc::Ptx::from_binary(cubins[0].1.clone()))
            .map_err(drv)?;
        Ok(Gpu { ctx, stream, module })
    }

    /// The device's name.
    pub fn name(&self) -> String {
        self.ctx.name().unwrap_or_else(|_| "unknown".into())
    }

    /// The stream kernels run on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    fn func(&self, name: &str) -> Result<CudaFunction, CudaError> {
        self.module.load_function(name).map_err(drv)
    }

    /// Uploads a host slice.
    pub fn upload<T: cudarc::driver::DeviceRepr>(&self, x: &[T]) -> Result<CudaSlice<T>, CudaError> {
        self.stream.clone_htod(x).map_err(drv)
    }

    /// Downloads a device slice.
    pub fn download<T: cudarc::driver::DeviceRepr>(&self, x: &CudaSlice<T>) -> Result<Vec<T>, CudaError> {
        self.stream.clone_dtoh(x).map_err(drv)
    }

    /// A zeroed device buffer of `n` bytes.
    pub fn zeros(&self, n: usize) -> Result<CudaSlice<u8>, CudaError> {
        self.stream.alloc_zeros::<u8>(n).map_err(drv)
    }

    /// Uploads cache slots (`block · block_size + offset`), remembering the largest for the checks.
    pub fn upload_slots(&self, slots: &[usize]) -> Result<Slots, CudaError> {
        let max = checked::max_slot(slots)?;
        let host: Vec<i64> = slots.iter().map(|&s| s as i64).collect();
        Ok(Slots {
            dev: self.upload(&host)?,
            len: slots.len(),
            max,
        })
    }

    /// Uploads block tables (`ctx_lens.len() × max_blocks` ids, row-major) and context lengths,
    /// checking that each sequence's context fits its table and remembering the largest block in use.
    pub fn upload_tables(
        &self,
        tables: &[i32],
        max_blocks: usize,
        ctx_lens: &[usize],
        block_size: usize,
    ) -> Result<BlockTables, CudaError> {
        let max_block = checked::max_table_block(tables, max_blocks, ctx_lens, block_size)?;
        let lens: Vec<i32> = ctx_lens.iter().map(|&l| l as i32).collect();
        Ok(BlockTables {
            tables: self.upload(tables)?,
            ctx_lens: self.upload(&lens)?,
            seqs: ctx_lens.len(),
            max_blocks,
            block_size,
            max_block,
        })
    }

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
        let mut dummy = None;
        let (offsets, has_offsets) = self.offsets_arg(quant, offsets, d, &mut dummy)?;
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
        if tables.block_size != d.block_size {
            return Err(CudaError::Invalid(format!(
                "tables of block size {} for a cache of block size {}",
                tables.block_size, d.block_size
            )));
        }
        quant
            .check(dtype, d.head_dim, d.block_size)
            .map_err(|e| CudaError::Invalid(e.to_string()))?;
        let mut dummy = None;
        let (v_offsets, has_offsets) = self.offsets_arg(quant, v_offsets, d, &mut dummy)?;
        let blocks = checked::cache_blocks(k_cache.len(), dtype, quant, d)?;
        if checked::cache_blocks(v_cache.len(), dtype, quant, d)? != blocks {
            return Err(CudaError::Invalid("K and V caches of different sizes".into()));
        }
        checked::check_below("block", tables.max_block, blocks)?;
        let (seqs, max_blocks) = (tables.seqs, tables.max_blocks);
        let rows = seqs * d.num_heads * d.head_dim;
        checked::check_len("q", q.len(), rows)?;
        checked::check_len("out", out.len(), rows)?;
        let (tables, ctx_lens) = (&tables.tables, &tables.ctx_lens);
        let name = match dtype {
            KvDtype::BF16 => "paged_attention_bf16",
            KvDtype::Fp8E4m3 => "paged_attention_e4m3",
            KvDtype::Fp8E5m2 => "paged_attention_e5m2",
            KvDtype::Nvfp4 => "paged_attention_nvfp4",
            other => return Err(CudaError::Unsupported(other.name())),
        };
        if !d.head_dim.is_multiple_of(32) || d.head_dim > 256 {
            return Err(CudaError::Driver(format!(
                "head_dim {} must be a multiple of 32 up to 256",
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
        let cfg = LaunchConfig {
            grid_dim: (d.num_heads as u32, seqs as u32, 1),
            block_dim: ((WARPS * 32) as u32, 1, 1),
            shared_mem_bytes: ((d.head_dim + WARPS * (d.head_dim + 2)) * 4) as u32,
        };
        let mut b = self.stream.launch_builder(&f);
        b.arg(out)
            .arg(q)
            .arg(k_cache)
            .arg(v_cache)
            .arg(tables)
            .arg(&mb)
            .arg(ctx_lens)
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
            .arg(&has_offsets);
        // SAFETY: arguments match the kernel's signature; every block in use was checked above to be
        // inside both caches, and q/out hold every row.
        unsafe { b.launch(cfg) }.map_err(drv)?;
        Ok(())
    }

    /// The offsets argument of a kernel: the given buffer (checked: a `smooth` method, `kv_heads ×
    /// head_dim` values) and 1, or a one-float stand-in (kept alive in `dummy`) and 0.
    fn offsets_arg<'a>(
        &self,
        quant: KvQuant,
        offsets: Option<&'a CudaSlice<f32>>,
        d: Dims,
        dummy: &'a mut Option<CudaSlice<f32>>,
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
            None => Ok((dummy.insert(self.upload(&[0f32])?), 0)),
        }
    }

    /// Waits for the stream.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.stream.synchronize().map_err(drv)
    }

    /// Milliseconds `f` takes on the stream (CUDA events), averaged over `reps` runs after one warm-up.
    pub fn time_ms(&self, reps: usize, mut f: impl FnMut() -> Result<(), CudaError>) -> Result<f64, CudaError> {
        f()?;
        let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = self.ctx.new_event(flags).map_err(drv)?;
        let end = self.ctx.new_event(flags).map_err(drv)?;
        start.record(&self.stream).map_err(drv)?;
        for _ in 0..reps {
            f()?;
        }
        end.record(&self.stream).map_err(drv)?;
        Ok(start.elapsed_ms(&end).map_err(drv)? as f64 / reps as f64)
    }

    /// Device-to-device copy of `src` into `dst` (for the bandwidth reference).
    pub fn copy(&self, src: &CudaSlice<u8>, dst: &mut CudaSlice<u8>) -> Result<(), CudaError> {
        self.stream.memcpy_dtod(src, dst).map_err(drv)
    }
}
