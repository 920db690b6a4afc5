//! Tests of the `--device` factory: it sizes the CPU cache from blocks or bytes, keys the fast path only
//! where a weight has the integer kernel, refuses a cache too small and a device with no backend by
//! name, and a backend opened on stored weights computes exactly what one opened on weights laid out
//! beforehand does.

use kvgate_backend::{Batch, Capacity};
use kvgate_cpu::tiny::{tiny_model, TinySpec};
use kvgate_kv::KvDtype;
use kvgate_model::LoadedModel;

use super::*;

fn tiny() -> LoadedModel<Model> {
    tiny_model(TinySpec::default()).unwrap()
}

fn spec(m: &LoadedModel<Model>, blocks: usize) -> BackendSpec {
    BackendSpec {
        device: Device::Cpu,
        shape: m.model.config().cache_shape(4, KvDtype::F32).unwrap(),
        memory: KvMemory::Blocks(blocks),
        int8_activations: false,
        gpu_memory_utilization: 0.9,
    }
}

#[test]
fn the_factory_sizes_the_cache_and_refuses_devices_without_a_backend() {
    let m = tiny();
    let s = spec(&m, 10);
    let per = s.shape.bytes_per_block();
    let b = open_backend(tiny().model, &s).unwrap();
    assert_eq!(b.device(), Device::Cpu);
    assert_eq!(
        b.capacity(),
        Capacity {
            num_blocks: 10,
            bytes_per_block: per,
            budget_bytes: 10 * per as u64
        }
    );
    assert_eq!(b.fast_path(), None);
    let bytes = BackendSpec {
        memory: KvMemory::Bytes(3 * per as u64 + 5),
        int8_activations: true,
        ..s.clone()
    };
    let b = open_backend(tiny().model, &bytes).unwrap();
    assert_eq!(b.capacity().num_blocks, 3);
    assert_eq!(
        b.fast_path(),
        None,
        "f32 weights have no integer kernel: nothing to key apart"
    );
    let quantized = tiny_model(TinySpec {
        quantized: true,
        ..Default::default()
    })
    .unwrap();
    let b = open_backend(quantized.model, &bytes).unwrap();
    assert_eq!(b.fast_path(), Some("int8-activations"));
    let small = BackendSpec {
        memory: KvMemory::Bytes(1),
        ..s.clone()
    };
    assert!(matches!(
        open_backend(tiny().model, &small),
        Err(BackendError::Cache(kvgate_kv::KvError::TooSmall { bytes: 1, .. }))
    ));
    let cuda = BackendSpec {
        device: Device::Cuda(0),
        ..s
    };
    // a model laid out for the CPU cannot move to a GPU; without a GPU the refusal says what is missing
    let err = open_backend(tiny().model, &cuda).err().unwrap();
    assert!(
        matches!(
            err,
            BackendError::Unavailable {
                device: Device::Cuda(0),
                ..
            }
        ),
        "{err}"
    );
    if device_available(Device::Cuda(0)).is_err() {
        let msg = err.to_string();
        assert!(
            msg.starts_with("--device cuda:0: ")
                && (msg.contains("libcuda.so.1") || msg.contains("no usable CUDA device") || msg.contains("libnvrtc")),
            "{msg}"
        );
    }
}

/// A backend opened on weights as stored lays them out itself and computes exactly what a model laid
/// out for the CPU beforehand computes (the tiny Llama and Qwen3 fixtures, safetensors, both
/// activation modes): the stored form is what `serve` hands the factory.
#[test]
fn a_backend_prepares_stored_weights_itself() {
    for arch in ["llama", "qwen3"] {
        let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/tiny")
            .join(arch);
        for int8 in [false, true] {
            let (config, weights) = kvgate_model::load_stored(&dir).unwrap();
            let layout = CpuLayout {
                five_bit: int8,
                f32_weights: false,
            };
            let cpu = Model::new(config.clone(), prepare::weights(weights.clone(), layout).unwrap(), 64).unwrap();
            let stored = kvgate_model::StoredModel {
                config,
                weights,
                max_positions: 64,
            };
            let spec = BackendSpec {
                device: Device::Cpu,
                shape: cpu.config().cache_shape(4, KvDtype::F32).unwrap(),
                memory: KvMemory::Blocks(16),
                int8_activations: int8,
                gpu_memory_utilization: 0.9,
            };
            let ids: Vec<u32> = (1..20).collect();
            let batch = Batch::single_sequence(&ids, 4);
            let a = open_backend(stored, &spec).unwrap().forward(&batch).unwrap();
            let b = open_backend(cpu, &spec).unwrap().forward(&batch).unwrap();
            assert_eq!(a.logits.len(), ids.len() * a.vocab, "{arch}");
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a.logits), bits(&b.logits), "{arch} int8 {int8}");
        }
    }
}
