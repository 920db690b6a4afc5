//! The one backend factory: `--device`, the model (its weights as stored, or already laid out for the
//! CPU) and the cache asked for in, a [`Backend`] out. The CPU backend lays stored weights out for its
//! kernels here and is the model over a host cache; a device this build has no backend for is refused with a
//! [`BackendError::Unavailable`] that names it (the CUDA kernels in `kvgate-cuda` are not yet a
//! backend). A new backend is one arm here plus its crate.

use kvgate_backend::{Backend, BackendError, Device, KvMemory};
use kvgate_kv::CacheShape;
use kvgate_model::{CpuBackend, CpuLayout, CpuSettings, Model, StoredModel};

/// What to open: where, the cache's shape and size, and the device-specific switches.
#[derive(Debug, Clone, PartialEq)]
pub struct BackendSpec {
    /// The device.
    pub device: Device,
    /// The cache's shape (layers, heads, block size, dtype, method).
    pub shape: CacheShape,
    /// How much cache.
    pub memory: KvMemory,
    /// The CPU's 8-bit-activation path for completions (`--activations int8`, serve's default).
    pub int8_activations: bool,
}

/// Whether this build has a backend for `device` (checked before a model is loaded for it).
pub fn device_available(device: Device) -> Result<(), BackendError> {
    match device {
        Device::Cpu => Ok(()),
        Device::Cuda(_) => Err(no_backend(device)),
    }
}

fn no_backend(device: Device) -> BackendError {
    BackendError::Unavailable {
        device,
        reason: "this build has no CUDA backend yet (the CUDA kernels in kvgate-cuda are not wired to a backend); use --device cpu".into(),
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
pub fn open_backend(model: impl Into<ModelWeights>, spec: &BackendSpec) -> Result<Box<dyn Backend>, BackendError> {
    match spec.device {
        Device::Cpu => {
            let settings = CpuSettings {
                int8_activations: spec.int8_activations,
            };
            let model = match model.into() {
                ModelWeights::Cpu(m) => *m,
                ModelWeights::Stored(m) => m
                    .into_cpu(CpuLayout {
                        five_bit: spec.int8_activations,
                        f32_weights: false,
                    })
                    .map_err(|e| BackendError::Weights {
                        device: Device::Cpu,
                        message: e.to_string(),
                    })?,
            };
            Ok(Box::new(CpuBackend::open(model, spec.shape, spec.memory, settings)?))
        }
        device @ Device::Cuda(_) => Err(no_backend(device)),
    }
}
