//! The CUDA backend: the model's weights uploaded as stored, the paged KV cache in device memory (f32,
//! f16, bf16, fp8 e4m3/e5m2 or nvfp4, every quantization method the CPU has), and the forward pass of
//! [`forward`] behind the `kvgate_backend` seam — the engine drives it exactly as it drives the CPU
//! backend. It sizes its cache from the device's free memory (`--gpu-memory-utilization`, as vLLM's),
//! and a machine without a driver, a device or NVRTC gets a start-up error that says what to install.
//!
//! Guarantees (the seam's): every batch is checked before anything runs; a row's outputs do not
//! depend on the other rows; only what each output asks for crosses back to the host.

mod cache;
mod forward;
mod weights;

use kvgate_backend::{
    check_batch, Backend, BackendError, Batch, BatchError, BlockCopy, CalibrationReport, Capacity, Device,
    KvCalibration, KvMemory, KvStats, StepOutput,
};
use kvgate_kv::{CacheShape, KvDtype, KvError};
use kvgate_model::{ModelConfig, Rope, RopeScaling, StoredModel, StoredTensor};

use crate::{CudaError, Gpu};
use cache::{compute, DevCache};
use forward::{DevModel, Measured, Scratch};

/// Device memory kept out of the KV cache for the step's activations and the kernels' modules.
const ACTIVATION_RESERVE: u64 = 1 << 30;

/// The CUDA backend's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CudaSettings {
    /// The device's ordinal (`--device cuda:N`).
    pub ordinal: usize,
    /// The share of the device's memory kvgate may take in all (weights, cache, activations), as
    /// vLLM's `--gpu-memory-utilization`; the cache gets what is left of it after the weights.
    pub gpu_memory_utilization: f64,
}

impl Default for CudaSettings {
    fn default() -> Self {
        CudaSettings {
            ordinal: 0,
            gpu_memory_utilization: 0.9,
        }
    }
}

/// Why the device cannot be used, as a start-up message that says what to install or change.
pub fn explain(e: &CudaError) -> String {
    match e {
        CudaError::NoDriver => "the NVIDIA driver library (libcuda.so.1) cannot be loaded: install the NVIDIA \
             driver (CUDA 13, driver 580 or newer) or put its folder on LD_LIBRARY_PATH; or use --device cpu"
            .into(),
        CudaError::NoNvrtc => "NVRTC (libnvrtc.so.13) cannot be loaded: kvgate compiles its kernels at start-up \
             with it — install the CUDA 13 toolkit or `pip install nvidia-cuda-nvrtc==13.0.88` and put its lib \
             folder on LD_LIBRARY_PATH"
            .into(),
        CudaError::NoDevice(m) => format!("no usable CUDA device: {m}"),
        other => other.to_string(),
    }
}

/// Checks, without loading a model, that device `ordinal` can be opened: the driver, the device and
/// NVRTC are there.
pub fn probe(ordinal: usize) -> Result<(), String> {
    let n = crate::device_count().map_err(|e| explain(&e))?;
    if ordinal >= n {
        return Err(format!(
            "no CUDA device {ordinal}: {n} present (cuda:0 .. cuda:{})",
            n - 1
        ));
    }
    if !crate::nvrtc::present() {
        return Err(explain(&CudaError::NoNvrtc));
    }
    Ok(())
}

/// The dtypes the CUDA kernels store and read.
pub const DTYPES: [KvDtype; 6] = [
    KvDtype::F32,
    KvDtype::F16,
    KvDtype::BF16,
    KvDtype::Fp8E4m3,
    KvDtype::Fp8E5m2,
    KvDtype::Nvfp4,
];

/// Refuses a cache or model the kernels cannot run, naming what would work.
fn supported(cfg: &ModelConfig, shape: &CacheShape) -> Result<(), BackendError> {
    let dtype = shape.dtype();
    let refuse = |reason: String| {
        BackendError::Cache(KvError::Unsupported {
            dtype: dtype.name(),
            reason,
        })
    };
    if !DTYPES.contains(&dtype) {
        let names: Vec<&str> = DTYPES.iter().map(|d| d.name()).collect();
        return Err(refuse(format!(
            "no CUDA kernel for it; use one of {}",
            names.join(", ")
        )));
    }
    let hd = cfg.head_dim;
    if !(hd < 32 || hd.is_multiple_of(32) && hd <= 256) || hd % 2 == 1 {
        return Err(refuse(format!(
            "head_dim {hd}: the CUDA attention takes an even head_dim below 32 or a multiple of 32 up to 256"
        )));
    }
    if cfg.attn_logit_softcap.is_some() && shape.quant().smooth {
        return Err(refuse(
            "the smooth methods with an attention softcap have no CUDA kernel (K offsets do not cancel under a softcap)"
                .into(),
        ));
    }
    Ok(())
}

/// A fingerprint of the model: config, stored embedding bytes, final norm.
fn model_fingerprint(m: &StoredModel) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(format!("{:?}", m.config).as_bytes());
    match &m.weights.embed {
        StoredTensor::Gguf(q) => h.update(q.data()),
        StoredTensor::Dense(t) => {
            if let Ok(v) = t
                .to_dtype(candle_core::DType::F32)
                .and_then(|x| x.flatten_all())
                .and_then(|x| x.to_vec1::<f32>())
            {
                v.iter().for_each(|x| h.update(&x.to_le_bytes()));
            }
        }
    }
    m.weights.final_norm.iter().for_each(|x| h.update(&x.to_le_bytes()));
    h.digest()
}

/// Model + device cache.
pub struct CudaBackend {
    gpu: Gpu,
    model: DevModel,
    cache: DevCache,
    scratch: Scratch,
    budget_bytes: u64,
    model_fingerprint: u64,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("gpu", &self.gpu)
            .field("num_blocks", &self.cache.num_blocks)
            .finish()
    }
}

impl CudaBackend {
    /// Opens the device, uploads `model`'s weights as stored and allocates a cache of `shape` holding
    /// what `memory` asks for ([`KvMemory::Auto`]: what `gpu_memory_utilization` leaves after the
    /// weights and a 1 GiB reserve for activations).
    pub fn open(
        model: StoredModel,
        shape: CacheShape,
        memory: KvMemory,
        settings: CudaSettings,
    ) -> Result<CudaBackend, BackendError> {
        let device = Device::Cuda(settings.ordinal as u32);
        supported(&model.config, &shape)?;
        let gpu = Gpu::new(settings.ordinal).map_err(|e| BackendError::Unavailable {
            device,
            reason: explain(&e),
        })?;
        let weights_error = |e: CudaError| BackendError::Weights {
            device,
            message: e.to_string(),
        };
        let model_fingerprint = model_fingerprint(&model);
        let StoredModel {
            config: cfg,
            weights,
            max_positions,
        } = model;
        cfg.validate().map_err(|e| BackendError::Weights {
            device,
            message: e.to_string(),
        })?;
        let w = weights::upload(&gpu, weights).map_err(weights_error)?;
        let table = |theta: f32, scaling: RopeScaling| -> Result<_, CudaError> {
            let r = Rope::new(cfg.head_dim, theta, scaling, max_positions, cfg.rope_style);
            let (c, s) = r.cos_sin();
            Ok((gpu.upload(c)?, gpu.upload(s)?))
        };
        let rope = table(cfg.rope_theta, cfg.rope_scaling).map_err(weights_error)?;
        let rope_local = cfg
            .rope_local_theta
            .map(|t| table(t, RopeScaling::None))
            .transpose()
            .map_err(weights_error)?;
        let (total, free) = gpu.memory().map_err(weights_error)?;
        let util = settings.gpu_memory_utilization;
        let auto = || {
            let budget = (total as f64 * util) as u64;
            let used = (total - free) as u64;
            budget.saturating_sub(used).saturating_sub(ACTIVATION_RESERVE)
        };
        let (num_blocks, budget_bytes) = memory.resolve(&shape, auto).map_err(|e| BackendError::Unavailable {
            device,
            reason: format!(
                "--gpu-memory-utilization {util} of {:.1} GiB, with {:.1} GiB in use after the weights, leaves no room \
                 for the KV cache ({e}); raise it or give --kv-cache-memory",
                total as f64 / (1u64 << 30) as f64,
                (total - free) as f64 / (1u64 << 30) as f64
            ),
        })?;
        let cache = DevCache::new(&gpu, shape, num_blocks).map_err(|e| BackendError::Unavailable {
            device,
            reason: format!("allocating {num_blocks} KV blocks: {e}"),
        })?;
        Ok(CudaBackend {
            model: DevModel {
                cfg,
                w,
                rope,
                rope_local,
                max_positions,
            },
            gpu,
            cache,
            scratch: Scratch::default(),
            budget_bytes,
            model_fingerprint,
        })
    }

    /// Bytes of weights on the device, and how many matrices were widened to f32 on the way (a
    /// GGUF format without a device kernel).
    pub fn weight_bytes(&self) -> (usize, usize) {
        (self.model.w.bytes, self.model.w.widened)
    }

    /// The device's name.
    pub fn device_name(&self) -> String {
        self.gpu.name()
    }

    fn check(&self, b: &Batch) -> Result<(), BackendError> {
        check_batch(
            b,
            self.cache.num_blocks,
            self.cache.shape.block_size(),
            self.model.cfg.vocab_size,
            self.attention_span(),
        )?;
        if let Some(&p) = b.positions.iter().find(|&&p| p as usize >= self.model.max_positions) {
            return Err(BatchError::Beyond {
                position: p as usize,
                max: self.model.max_positions,
            }
            .into());
        }
        if let Some(&p) = b.rope.iter().find(|&&p| p as usize >= self.model.max_positions) {
            return Err(BatchError::Beyond {
                position: p as usize,
                max: self.model.max_positions,
            }
            .into());
        }
        Ok(())
    }

    fn err(&self, e: CudaError) -> BackendError {
        compute(&self.gpu, e)
    }

    /// Runs `batch` on a scratch f32 cache (the real one untouched) and reports what K and V were.
    fn measure(&mut self, batch: &Batch) -> Result<KvStats, BackendError> {
        self.check(batch)?;
        let shape = self.cache.shape.with_dtype(KvDtype::F32)?;
        let blocks = batch
            .tables
            .iter()
            .flat_map(|t| t.iter().filter(|&&b| b != kvgate_backend::RELEASED_BLOCK))
            .max()
            .map_or(1, |&m| m as usize + 1);
        let mut scratch = DevCache::new(&self.gpu, shape, blocks).map_err(|e| self.err(e))?;
        let mut ms = Measured::default();
        forward::run(
            &self.gpu,
            &self.model,
            &mut scratch,
            &mut self.scratch,
            batch,
            Some(&mut ms),
        )
        .map_err(|e| compute(&self.gpu, e))?;
        Ok(KvStats {
            amax: ms.amax,
            means: ms.means,
        })
    }
}

impl Backend for CudaBackend {
    fn device(&self) -> Device {
        Device::Cuda(self.gpu.ordinal() as u32)
    }

    fn cache_shape(&self) -> CacheShape {
        self.cache.shape
    }

    fn capacity(&self) -> Capacity {
        Capacity {
            num_blocks: self.cache.num_blocks,
            bytes_per_block: self.cache.shape.bytes_per_block(),
            budget_bytes: self.budget_bytes,
        }
    }

    fn vocab_size(&self) -> usize {
        self.model.cfg.vocab_size
    }

    fn hidden_size(&self) -> usize {
        self.model.cfg.hidden_size
    }

    fn max_positions(&self) -> usize {
        self.model.max_positions
    }

    fn attention_span(&self) -> Option<usize> {
        self.model.cfg.attention_span()
    }

    fn fast_path(&self) -> Option<&'static str> {
        None
    }

    fn tree_attention(&self) -> bool {
        true
    }

    fn copy_blocks(&mut self, copies: &[BlockCopy]) -> Result<(), BackendError> {
        let num_blocks = self.cache.num_blocks;
        if let Some(b) = copies
            .iter()
            .flat_map(|c| [c.src, c.dst])
            .find(|&b| b as usize >= num_blocks)
        {
            return Err(BackendError::BlockOutOfRange {
                block: b as usize,
                num_blocks,
            });
        }
        for c in copies {
            self.cache
                .copy_block(&self.gpu, c.src as usize, c.dst as usize)
                .map_err(|e| compute(&self.gpu, e))?;
        }
        Ok(())
    }

    fn read_block(&self, block: u32, out: &mut Vec<u8>) -> Result<(), BackendError> {
        self.cache.read_block(&self.gpu, block as usize, out)
    }

    fn write_block(&mut self, block: u32, bytes: &[u8]) -> Result<(), BackendError> {
        self.cache.write_block(&self.gpu, block as usize, bytes)
    }

    fn kv_fingerprint(&self) -> u64 {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        h.update(&self.model_fingerprint.to_le_bytes());
        h.update(&self.cache.params_bytes());
        h.digest()
    }

    fn forward(&mut self, batch: &Batch) -> Result<StepOutput, BackendError> {
        self.check(batch)?;
        forward::run(&self.gpu, &self.model, &mut self.cache, &mut self.scratch, batch, None)
            .map_err(|e| compute(&self.gpu, e))
    }

    fn calibrate(&mut self, how: &KvCalibration, first: Option<&Batch>) -> Result<CalibrationReport, BackendError> {
        let stats = how.batch_to_measure(first)?.map(|b| self.measure(b)).transpose()?;
        let layers = self.cache.shape.num_layers();
        let plan = how.plan(self.cache.shape.dtype(), layers, stats, first.map_or(0, Batch::len))?;
        for (l, &(k, v)) in plan.scales.iter().enumerate().take(layers) {
            self.cache.set_scales(l, k, v)?;
        }
        for (l, (k, v)) in plan.offsets.iter().enumerate() {
            self.cache.set_offsets(&self.gpu, l, k, v)?;
        }
        Ok(plan.report())
    }
}
