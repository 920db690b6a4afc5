//! A linear layer `y = x · Wᵀ (+ b)` whose weight stays in its storage format: Q4_0 / Q4_1 / Q8_0, F16
//! and BF16, and Q5_0 / Q5_1 / Q4_K / Q5_K / Q6_K repacked at load ([`crate::repack`]), through
//! kvgate's own kernel ([`crate::qmatmul`]: packed weights, f32 activations, or 8-bit ones for the
//! rows flagged in [`Linear::forward_rows`]), the other GGUF formats
//! (Q2_K, Q3_K) through candle's quantized matmul (the weight never dequantized), f32 weights through kvgate's own
//! fixed-order matmul ([`crate::dense`]).
//!
//! Batch invariance: candle's quantized CPU matmul computes every output as one dot product over the
//! full row, independent of how many rows are in the call, and so does the dense path; a row's output
//! never depends on the batch.

use std::sync::Arc;

use candle_core::quantized::{QMatMul, QTensor};
use candle_core::{DType, Device, Module, Tensor};

use crate::qmatmul::{QKind, QMatrix};
use kvgate_model::{GgufTensor, Result};

/// The weight of a linear layer.
#[derive(Debug, Clone)]
pub enum Weight {
    /// Q4_0 / Q4_1 / Q8_0 / Q5_0 / Q5_1 / Q4_K / Q5_K / Q6_K / F16 / BF16, repacked for kvgate's own
    /// kernel (f32 activations).
    Packed(QMatrix),
    /// Another GGUF-quantized matrix (Q2_K, Q3_K), through candle's quantized matmul.
    Quant(QMatMul),
    /// An f32 matrix, `out × in`, row-major.
    Dense(Vec<f32>),
}

fn dense_rows(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.to_dtype(candle_core::DType::F32)?.flatten_all()?.to_vec1::<f32>()?)
}

/// One part of [`Linear::stacked_gguf`]: a stored tensor and its bias.
pub type StackPart<'a> = (&'a GgufTensor, Option<&'a [f32]>);

/// A linear layer.
#[derive(Debug, Clone)]
pub struct Linear {
    weight: Weight,
    bias: Option<Vec<f32>>,
    in_dim: usize,
    out_dim: usize,
}

impl Linear {
    /// Whether its weight has the 8-bit-activation kernel ([`QMatrix::has_int8`]).
    pub fn has_int8(&self) -> bool {
        matches!(&self.weight, Weight::Packed(p) if p.has_int8())
    }

    /// A layer over a quantized tensor of shape `(out, in)` (an in-memory candle tensor).
    pub fn quantized(q: Arc<QTensor>, bias: Option<Vec<f32>>) -> Result<Linear> {
        Self::quantized_for(&GgufTensor::from_qtensor(&q)?, bias, false)
    }

    /// A layer over a GGUF tensor of shape `(out, in)`; `five_bit` keeps 5-bit formats (Q5_0, Q5_1,
    /// Q5_K) at 5 bits, the layout the 8-bit-activation mode streams best (f32 activations read it more
    /// slowly than the widened 8-bit layout).
    pub fn quantized_for(q: &GgufTensor, bias: Option<Vec<f32>>, five_bit: bool) -> Result<Linear> {
        let (out_dim, in_dim) = q.dims2()?;
        if in_dim % crate::qmatmul::QK == 0 {
            let packed = QMatrix::from_ggml(q.dtype(), q.data(), out_dim, in_dim, five_bit);
            if let Some(p) = packed {
                return Ok(Linear {
                    weight: Weight::Packed(p),
                    bias,
                    in_dim,
                    out_dim,
                });
            }
        }
        let weight = match QMatMul::from_arc(Arc::new(q.qtensor()?))? {
            // F32/F16 GGUF tensors come back dequantized: keep them on the dense path.
            QMatMul::Tensor(t) | QMatMul::TensorF16(t) => Weight::Dense(dense_rows(&t)?),
            q => Weight::Quant(q),
        };
        Ok(Linear {
            weight,
            bias,
            in_dim,
            out_dim,
        })
    }

    /// One layer computing the outputs of several GGUF tensors of the same format and width (their
    /// rows stacked, as [`Linear::fuse`] stacks packed matrices), repacked once from the stored blocks
    /// side by side; `None` when their formats or widths differ or the kernels do not take the format.
    pub fn stacked_gguf(parts: &[StackPart<'_>], five_bit: bool) -> Result<Option<Linear>> {
        let Some(&(first, _)) = parts.first() else {
            return Ok(None);
        };
        let (_, in_dim) = first.dims2()?;
        let mut out_dims = Vec::with_capacity(parts.len());
        for (t, _) in parts {
            let (o, i) = t.dims2()?;
            if t.dtype() != first.dtype() || i != in_dim {
                return Ok(None);
            }
            out_dims.push(o);
        }
        if in_dim % crate::qmatmul::QK != 0 {
            return Ok(None);
        }
        let out_dim = out_dims.iter().sum();
        // output `c`'s stored row: the part it falls in, and its row there
        let dtype = first.dtype();
        let row = in_dim / dtype.block_size() * dtype.type_size();
        let at: Vec<(usize, usize)> = out_dims
            .iter()
            .enumerate()
            .flat_map(|(i, &o)| (0..o).map(move |r| (i, r)))
            .collect();
        let rows = |c: usize| {
            let (i, r) = at[c];
            &parts[i].0.data()[r * row..(r + 1) * row]
        };
        let Some(p) = QMatrix::from_ggml_rows(dtype, out_dim, in_dim, five_bit, rows) else {
            return Ok(None);
        };
        let bias = parts.iter().any(|(_, b)| b.is_some()).then(|| {
            parts
                .iter()
                .zip(&out_dims)
                .flat_map(|((_, b), &o)| b.map_or_else(|| vec![0.0; o], <[f32]>::to_vec))
                .collect()
        });
        Ok(Some(Linear {
            weight: Weight::Packed(p),
            bias,
            in_dim,
            out_dim,
        }))
    }

    /// A layer over a tensor of shape `(out, in)`: f16 and bf16 stay 16-bit in the packed kernel (when
    /// `in` is a multiple of 32), other dtypes become f32.
    pub fn dense(w: Tensor, bias: Option<Vec<f32>>) -> Result<Linear> {
        let (out_dim, in_dim) = w.dims2()?;
        let kind = match w.dtype() {
            DType::F16 => Some(QKind::F16),
            DType::BF16 => Some(QKind::Bf16),
            _ => None,
        };
        if let Some(kind) = kind.filter(|_| in_dim % crate::qmatmul::QK == 0) {
            let bits: Vec<u16> = match kind {
                QKind::F16 => w
                    .flatten_all()?
                    .to_vec1::<half::f16>()?
                    .iter()
                    .map(|v| v.to_bits())
                    .collect(),
                _ => w
                    .flatten_all()?
                    .to_vec1::<half::bf16>()?
                    .iter()
                    .map(|v| v.to_bits())
                    .collect(),
            };
            if let Some(p) = QMatrix::from_halves(kind, &bits, out_dim, in_dim) {
                return Ok(Linear {
                    weight: Weight::Packed(p),
                    bias,
                    in_dim,
                    out_dim,
                });
            }
        }
        Ok(Linear {
            weight: Weight::Dense(dense_rows(&w)?),
            bias,
            in_dim,
            out_dim,
        })
    }

    /// One layer computing the outputs of several (same input, stacked outputs), when their weights can
    /// be stacked (packed formats of one kind); `None` otherwise.
    pub fn fuse(parts: &[&Linear]) -> Option<Linear> {
        let packed: Vec<&QMatrix> = parts
            .iter()
            .map(|l| match &l.weight {
                Weight::Packed(p) => Some(p),
                _ => None,
            })
            .collect::<Option<_>>()?;
        let w = QMatrix::concat(&packed)?;
        let bias = if parts.iter().any(|l| l.bias.is_some()) {
            let mut b = Vec::new();
            for l in parts {
                match &l.bias {
                    Some(x) => b.extend_from_slice(x),
                    None => b.extend(std::iter::repeat_n(0.0, l.out_dim)),
                }
            }
            Some(b)
        } else {
            None
        };
        Some(Linear {
            in_dim: parts[0].in_dim,
            out_dim: w.rows(),
            weight: Weight::Packed(w),
            bias,
        })
    }

    /// Whether the layer adds a bias.
    pub fn has_bias(&self) -> bool {
        self.bias.is_some()
    }

    /// Input width.
    pub fn in_dim(&self) -> usize {
        self.in_dim
    }

    /// Output width.
    pub fn out_dim(&self) -> usize {
        self.out_dim
    }

    /// Bytes of weight data (for the memory report).
    pub fn weight_bytes(&self) -> usize {
        match &self.weight {
            Weight::Packed(p) => p.bytes(),
            Weight::Quant(QMatMul::QTensor(q)) => q.storage_size_in_bytes(),
            Weight::Quant(_) => 0,
            Weight::Dense(w) => w.len() * 4,
        }
    }

    /// `x` is `rows × in`; returns `rows × out`.
    pub fn forward(&self, x: &[f32], rows: usize) -> Result<Vec<f32>> {
        self.forward_rows(x, rows, &[])
    }

    /// As [`Linear::forward`], with the rows flagged in `int8` (one flag per row, or empty) through the
    /// 8-bit-activation kernel where the weight has one ([`QMatrix::has_int8`]); other weights
    /// and unflagged rows compute exactly as `forward` does.
    pub fn forward_rows(&self, x: &[f32], rows: usize, int8: &[bool]) -> Result<Vec<f32>> {
        debug_assert_eq!(x.len(), rows * self.in_dim);
        let mut y = match &self.weight {
            Weight::Packed(p) => p.matmul_rows(x, rows, int8),
            Weight::Quant(q) => {
                let t = Tensor::from_slice(x, (rows, self.in_dim), &Device::Cpu)?;
                q.forward(&t)?.flatten_all()?.to_vec1::<f32>()?
            }
            Weight::Dense(w) => crate::dense::matmul(x, rows, self.in_dim, w, self.out_dim),
        };
        if let Some(b) = &self.bias {
            for row in y.chunks_exact_mut(self.out_dim) {
                for (v, bb) in row.iter_mut().zip(b) {
                    *v += bb;
                }
            }
        }
        Ok(y)
    }
}
