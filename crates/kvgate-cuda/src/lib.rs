//! kvgate's CUDA side: the kernels of `kernels/*.cu` — the model's layer code over weights as stored
//! (`model.cu`: embedding, dequantize-on-the-fly matmul, norms, RoPE, activations, log-probabilities) and
//! the paged KV cache (`kv_cache.cu`: quantize-on-store and paged attention over f32, f16, bf16, fp8 and
//! nvfp4 blocks) — compiled at run time by NVRTC to an sm_90 CUBIN and launched through cudarc; and
//! [`CudaBackend`], the model on the GPU behind the `kvgate_backend` seam (`--device cuda:N`).
//!
//! Nothing here needs CUDA at build time: cudarc loads `libcuda` and `libnvrtc` with `dlopen` when first
//! used. Before any call into them this crate checks that the libraries can be loaded, so a machine
//! without a driver gets [`CudaError::NoDriver`] ("no CUDA device") instead of a crash, and one without
//! NVRTC gets [`CudaError::NoNvrtc`]; [`explain`] turns either into what to install. Compiled kernels
//! are cached per process.
//!
//! The device layout of a cache layer is exactly `kvgate_kv::CacheShape`'s, so bytes written by
//! [`Gpu::store`] can be compared with the CPU codecs byte for byte.

mod backend;
mod checked;
pub mod cubin_cache;
mod fused;
mod kv;
pub mod nvrtc;
mod ops;

pub use backend::{explain, probe, CudaBackend, CudaSettings, DTYPES};
pub use checked::{BlockTables, QueryRow, Slots};
pub use ops::{DevMatrix, WeightFormat};

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, LaunchConfig};
use kvgate_kv::{KvDtype, KvQuant};
use thiserror::Error;

/// The kernel sources, embedded.
pub const SOURCES: &[(&str, &str)] = &[
    ("kv_cache.cu", include_str!("../../../kernels/kv_cache.cu")),
    ("model.cu", include_str!("../../../kernels/model.cu")),
];

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

pub(crate) fn drv(e: impl std::fmt::Debug) -> CudaError {
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

/// The CUBIN of every source for [`ARCH`], once per process: from the on-disk cache
/// ([`cubin_cache`]) or compiled by NVRTC.
pub fn cubins() -> Result<&'static [Cubin], CudaError> {
    static CACHE: OnceLock<Result<Vec<Cubin>, CudaError>> = OnceLock::new();
    CACHE
        .get_or_init(|| {
            SOURCES
                .iter()
                .map(|(name, src)| cubin_cache::compile_cached(name, src, ARCH).map(|c| (name.to_string(), c)))
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
    /// One module per source of [`SOURCES`], in order.
    modules: Vec<Arc<CudaModule>>,
    /// Kernels already looked up by name: a launch is one map lookup, not a `cuModuleGetFunction`
    /// per module tried (each a driver call, the misses an error built and dropped) and a C string.
    funcs: Mutex<HashMap<&'static str, CudaFunction>>,
    /// A one-float stand-in for an absent optional buffer (bias, offsets), allocated once: not an
    /// upload per launch.
    pub(crate) absent: CudaSlice<f32>,
    /// The same for an absent byte buffer (a matrix `matmul3` does not use).
    pub(crate) absent_bytes: CudaSlice<u8>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu").field("ordinal", &self.ctx.ordinal()).finish()
    }
}

/// The scalar arguments of one attention launch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Attention {
    /// The cache's dtype.
    pub dtype: KvDtype,
    /// The method it was written with.
    pub quant: KvQuant,
    /// Shapes.
    pub d: Dims,
    /// Score multiplier.
    pub scale: f32,
    /// The layer's K scale (fp8 / nvfp4).
    pub k_scale: f32,
    /// The layer's V scale.
    pub v_scale: f32,
    /// Soft cap of the scores.
    pub softcap: Option<f32>,
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

pub(crate) fn grid_for(n: usize, threads: u32) -> LaunchConfig {
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
        let modules = cubins
            .iter()
            .map(|(_, c)| ctx.load_module(cudarc::nvrtc::Ptx::from_binary(c.clone())))
            .collect::<Result<Vec<_>, _>>()
            .map_err(drv)?;
        let absent = stream.alloc_zeros::<f32>(1).map_err(drv)?;
        let absent_bytes = stream.alloc_zeros::<u8>(4).map_err(drv)?;
        Ok(Gpu {
            ctx,
            stream,
            modules,
            funcs: Mutex::default(),
            absent,
            absent_bytes,
        })
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// The device's name.
    pub fn name(&self) -> String {
        self.ctx.name().unwrap_or_else(|_| "unknown".into())
    }

    /// The stream kernels run on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The kernel `name`, from whichever source defines it (looked up once, then kept).
    pub(crate) fn func(&self, name: &'static str) -> Result<CudaFunction, CudaError> {
        let mut funcs = self.funcs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = funcs.get(name) {
            return Ok(f.clone());
        }
        let f = self.find(name)?;
        funcs.insert(name, f.clone());
        Ok(f)
    }

    /// Looks `name` up in each module in turn.
    fn find(&self, name: &str) -> Result<CudaFunction, CudaError> {
        let mut last = None;
        for m in &self.modules {
            match m.load_function(name) {
                Ok(f) => return Ok(f),
                Err(e) => last = Some(e),
            }
        }
        Err(CudaError::Driver(format!("no kernel {name}: {last:?}")))
    }

    /// Total and free bytes of device memory.
    pub fn memory(&self) -> Result<(usize, usize), CudaError> {
        let (free, total) = self.ctx.mem_get_info().map_err(drv)?;
        Ok((total, free))
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
        let rows: Vec<i32> = ctx_lens
            .iter()
            .enumerate()
            .flat_map(|(s, &l)| [s as i32, 0, l as i32])
            .collect();
        Ok(BlockTables {
            tables: self.upload(tables)?,
            rows: self.upload(&rows)?,
            seqs: ctx_lens.len(),
            num_rows: ctx_lens.len(),
            max_blocks,
            block_size,
            max_block,
            max_span: ctx_lens.iter().copied().max().unwrap_or(0),
            masks: None,
        })
    }

    /// Uploads block tables (`max_blocks` ids per sequence, row-major) and the query rows that read
    /// them (each attends to positions `first .. end` of its sequence), checking every entry a row
    /// reads and remembering the largest block in use.
    pub fn upload_rows(
        &self,
        tables: &[i32],
        max_blocks: usize,
        rows: &[QueryRow],
        block_size: usize,
    ) -> Result<BlockTables, CudaError> {
        self.upload_tree_rows(tables, max_blocks, rows, &[], block_size)
    }

    /// [`Gpu::upload_rows`] with a tree mask per row (`masks` empty: every row causal): a tree row
    /// attends only to the positions of its range its mask sees.
    pub fn upload_tree_rows(
        &self,
        tables: &[i32],
        max_blocks: usize,
        rows: &[QueryRow],
        masks: &[Option<kvgate_kv::RowMask>],
        block_size: usize,
    ) -> Result<BlockTables, CudaError> {
        let max_block = checked::max_row_block(tables, max_blocks, rows, block_size)?;
        let masks = match masks.iter().any(Option::is_some) {
            true => {
                let (desc, words) = checked::tree_masks(rows, masks)?;
                Some((self.upload(&desc)?, self.upload(&words)?))
            }
            false => None,
        };
        let flat: Vec<i32> = rows
            .iter()
            .flat_map(|r| [r.seq as i32, r.first as i32, r.end as i32])
            .collect();
        Ok(BlockTables {
            tables: self.upload(tables)?,
            rows: self.upload(&flat)?,
            seqs: tables.len() / max_blocks,
            num_rows: rows.len(),
            max_blocks,
            block_size,
            max_block,
            max_span: rows.iter().map(|r| r.end - r.first).max().unwrap_or(0),
            masks,
        })
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
