//! The one backend factory: `--device` and the cache asked for in, a [`Backend`] out. The CPU backend
//! is the model over a host cache; a device this build has no backend for is refused with a
//! [`BackendError::Unavailable`] that names it (the CUDA kernels in `kvgate-cuda` are not yet a
//! backend). A new backend is one arm here plus its crate.

use kvgate_backend::{Backend, BackendError, Device, KvMemory};
use kvgate_kv::CacheShape;
use kvgate_model::{CpuBackend, CpuSettings, Model};

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

/// Opens the backend `spec` names, running `model`.
pub fn open_backend(model: Model, spec: &BackendSpec) -> Result<Box<dyn Backend>, BackendError> {
    match spec.device {
        Device::Cpu => {
            let settings = CpuSettings {
                int8_activations: spec.int8_activations,
            };
            Ok(Box::new(CpuBackend::open(model, spec.shape, spec.memory, settings)?))
        }
        device @ Device::Cuda(_) => Err(no_backend(device)),
    }
}
