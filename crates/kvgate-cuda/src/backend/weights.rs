//! The model's weights on the device, as the file stores them: GGUF blocks uploaded byte for byte
//! (dequantized on the fly by the matmul and embedding kernels), f32/f16/bf16 safetensors tensors in
//! their own dtype, norms and biases as f32. Only a GGUF format the kernels do not read (Q2_K, Q3_K,
//! …) is widened to f32 on the host first, and [`DevWeights::widened`] counts those matrices.

use candle_core::DType;
use cudarc::driver::CudaSlice;
use kvgate_model::{StoredLinear, StoredTensor, StoredWeights};

use crate::ops::{DevMatrix, WeightFormat};
use crate::{CudaError, Gpu};

/// One layer on the device.
pub(crate) struct DevLayer {
    pub attn_norm: CudaSlice<f32>,
    pub q: DevMatrix,
    pub k: DevMatrix,
    pub v: DevMatrix,
    pub o: DevMatrix,
    pub q_norm: Option<CudaSlice<f32>>,
    pub k_norm: Option<CudaSlice<f32>>,
    pub post_attn_norm: Option<CudaSlice<f32>>,
    pub ffn_norm: CudaSlice<f32>,
    pub post_ffn_norm: Option<CudaSlice<f32>>,
    pub gate: DevMatrix,
    pub up: DevMatrix,
    pub down: DevMatrix,
}

/// Every weight on the device.
pub(crate) struct DevWeights {
    pub embed: DevMatrix,
    pub layers: Vec<DevLayer>,
    pub final_norm: CudaSlice<f32>,
    /// `None`: the head is the embedding matrix (tied).
    pub lm_head: Option<DevMatrix>,
    /// Matrices widened to f32 on the host (a GGUF format without a device kernel).
    pub widened: usize,
    /// Bytes uploaded.
    pub bytes: usize,
}

impl DevWeights {
    /// The output projection.
    pub fn head(&self) -> &DevMatrix {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }
}

fn bad(e: impl std::fmt::Display) -> CudaError {
    CudaError::Invalid(format!("weights: {e}"))
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Uploads one matrix as stored; `widened` counts a format widened to f32.
fn upload_tensor(
    gpu: &Gpu,
    t: &StoredTensor,
    bias: Option<&[f32]>,
    widened: &mut usize,
) -> Result<DevMatrix, CudaError> {
    let (rows, cols) = t.dims().map_err(bad)?;
    match t {
        StoredTensor::Gguf(q) => match WeightFormat::of_gguf(q.dtype()) {
            Some(f) => DevMatrix::upload(gpu, f, rows, cols, q.data(), bias),
            None => {
                *widened += 1;
                let x: Vec<f32> = q.dequantize().map_err(bad)?;
                DevMatrix::upload(gpu, WeightFormat::F32, rows, cols, &f32_bytes(&x), bias)
            }
        },
        StoredTensor::Dense(d) => {
            let flat = d.flatten_all().map_err(bad)?;
            match d.dtype() {
                DType::F16 => {
                    let v: Vec<half::f16> = flat.to_vec1().map_err(bad)?;
                    let b: Vec<u8> = v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect();
                    DevMatrix::upload(gpu, WeightFormat::F16, rows, cols, &b, bias)
                }
                DType::BF16 => {
                    let v: Vec<half::bf16> = flat.to_vec1().map_err(bad)?;
                    let b: Vec<u8> = v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect();
                    DevMatrix::upload(gpu, WeightFormat::BF16, rows, cols, &b, bias)
                }
                _ => {
                    let v: Vec<f32> = flat.to_dtype(DType::F32).and_then(|x| x.to_vec1()).map_err(bad)?;
                    DevMatrix::upload(gpu, WeightFormat::F32, rows, cols, &f32_bytes(&v), bias)
                }
            }
        }
    }
}

fn upload_linear(gpu: &Gpu, l: &StoredLinear, widened: &mut usize) -> Result<DevMatrix, CudaError> {
    upload_tensor(gpu, &l.weight, l.bias.as_deref(), widened)
}

fn upload_opt(gpu: &Gpu, v: &Option<Vec<f32>>) -> Result<Option<CudaSlice<f32>>, CudaError> {
    v.as_ref().map(|x| gpu.upload(x)).transpose()
}

/// Uploads every weight, layer by layer (each layer's host copy is dropped as it goes up).
pub(crate) fn upload(gpu: &Gpu, w: StoredWeights) -> Result<DevWeights, CudaError> {
    let mut widened = 0;
    let embed = upload_tensor(gpu, &w.embed, None, &mut widened)?;
    let lm_head = w
        .lm_head
        .as_ref()
        .map(|l| upload_linear(gpu, l, &mut widened))
        .transpose()?;
    let mut layers = Vec::with_capacity(w.layers.len());
    for l in w.layers {
        layers.push(DevLayer {
            attn_norm: gpu.upload(&l.attn_norm)?,
            q: upload_linear(gpu, &l.q, &mut widened)?,
            k: upload_linear(gpu, &l.k, &mut widened)?,
            v: upload_linear(gpu, &l.v, &mut widened)?,
            o: upload_linear(gpu, &l.o, &mut widened)?,
            q_norm: upload_opt(gpu, &l.q_norm)?,
            k_norm: upload_opt(gpu, &l.k_norm)?,
            post_attn_norm: upload_opt(gpu, &l.post_attn_norm)?,
            ffn_norm: gpu.upload(&l.ffn_norm)?,
            post_ffn_norm: upload_opt(gpu, &l.post_ffn_norm)?,
            gate: upload_linear(gpu, &l.gate, &mut widened)?,
            up: upload_linear(gpu, &l.up, &mut widened)?,
            down: upload_linear(gpu, &l.down, &mut widened)?,
        });
    }
    let bytes = embed.bytes()
        + lm_head.as_ref().map_or(0, DevMatrix::bytes)
        + layers
            .iter()
            .map(|l| {
                [&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down]
                    .iter()
                    .map(|m| m.bytes())
                    .sum::<usize>()
            })
            .sum::<usize>();
    Ok(DevWeights {
        embed,
        layers,
        final_norm: gpu.upload(&w.final_norm)?,
        lm_head,
        widened,
        bytes,
    })
}
