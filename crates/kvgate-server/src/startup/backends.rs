//! The one backend factory, at `serve`'s edge: `--device`, the model (its weights as stored, or already
//! laid out for the CPU) and the cache asked for in, a [`Backend`] out. The CPU backend (`kvgate-cpu`)
//! lays stored weights out for its kernels and is the model over a host cache; the CUDA backend
//! (`kvgate-cuda`) uploads the stored weights as they are. A device that cannot be used (no driver, no
//! device, no NVRTC) is refused with a [`BackendError::Unavailable`] that says what to install. The
//! engine only ever sees the `Backend` it is handed: a new backend is its crate plus one arm here.

use kvgate_backend::{Backend, BackendError, Device, KvMemory};
use kvgate_cpu::{prepare, CpuBackend, CpuLayout, CpuSettings, Model};
use kvgate_cuda::{CudaBackend, CudaSettings};
use kvgate_kv::CacheShape;
use kvgate_model::StoredModel;

/// What to open: where, the cache's shape and size, and the device-specific switches.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct BackendSpec {
    /// The device.
    pub device: Device,
    /// The cache's shape (layers, heads, block size, dtype, method).
    pub shape: CacheShape,
    /// How much cache.
    pub memory: KvMemory,
    /// The CPU's 8-bit-activation path for completions (`--activations int8`, serve's default).
    pub int8_activations: bool,
    /// A GPU's share of its memory kvgate may take (`--gpu-memory-utilization`, as vLLM's).
    pub gpu_memory_utilization: f64,
}

/// Whether `device` can be opened on this machine (checked before a model is loaded for it): for
/// `cuda:N`, that the driver, device N and NVRTC are there.
pub(crate) fn device_available(device: Device) -> Result<(), BackendError> {
    match device {
        Device::Cpu => Ok(()),
        Device::Cuda(n) => {
            kvgate_cuda::probe(n as usize).map_err(|reason| BackendError::Unavailable { device, reason })
        }
    }
}

/// The model a backend opens: as stored (what `serve` loads; each device lays the weights out at its
/// own start) or already laid out for the CPU (a model built in memory, as the tests' tiny ones).
#[derive(Debug)]
pub enum ModelWeights {
    /// Weights as the file stores them.
    Stored(Box<StoredModel>),
    /// The CPU's layout already.
    Cpu(Box<Model>),
}

impl From<StoredModel> for ModelWeights {
    fn from(m: StoredModel) -> ModelWeights {
        ModelWeights::Stored(Box::new(m))
    }
}

impl From<Model> for ModelWeights {
    fn from(m: Model) -> ModelWeights {
        ModelWeights::Cpu(Box::new(m))
    }
}

/// Opens the backend `spec` names, running `model`: the CPU lays stored weights out for its kernels
/// here (5-bit formats kept at 5 bits for the 8-bit-activation path).
pub(crate) fn open_backend(
    model: impl Into<ModelWeights>,
    spec: &BackendSpec,
) -> Result<Box<dyn Backend>, BackendError> {
    match spec.device {
        Device::Cpu => {
            let settings = CpuSettings {
                int8_activations: spec.int8_activations,
            };
            let model = match model.into() {
                ModelWeights::Cpu(m) => *m,
                ModelWeights::Stored(m) => prepare::model(
                    *m,
                    CpuLayout {
                        five_bit: spec.int8_activations,
                        f32_weights: false,
                    },
                )
                .map_err(|e| BackendError::Weights {
                    device: Device::Cpu,
                    message: e.to_string(),
                })?,
            };
            Ok(Box::new(CpuBackend::open(model, spec.shape, spec.memory, settings)?))
        }
        device @ Device::Cuda(n) => {
            device_available(device)?;
            let stored = match model.into() {
                ModelWeights::Stored(m) => *m,
                ModelWeights::Cpu(_) => {
                    return Err(BackendError::Unavailable {
                        device,
                        reason: "the model was laid out for the CPU already; a GPU uploads the weights as stored (load it with load_unprepared)".into(),
                    })
                }
            };
            let settings = CudaSettings {
                ordinal: n as usize,
                gpu_memory_utilization: spec.gpu_memory_utilization,
            };
            Ok(Box::new(CudaBackend::open(stored, spec.shape, spec.memory, settings)?))
        }
    }
}

#[cfg(test)]
#[path = "backends_tests.rs"]
mod tests;
