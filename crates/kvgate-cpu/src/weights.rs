//! The weights of a decoder-only transformer as the CPU holds them, in the one shape every architecture
//! and file format is loaded into: the embedding table (a GGUF's as stored, one row dequantized per
//! lookup, or f32 rows), each layer's projections — those that read the same input stacked into one
//! matrix where their formats allow it ([`Stack`]: q·k·v, gate·up), each held once — and the output
//! projection. Optional parts (biases, q/k norms, sandwich norms) are `None` where an architecture
//! has none.

use std::sync::Arc;

use kvgate_model::{GgufTensor, Result};

use crate::linear::Linear;

/// The token embedding table.
#[derive(Debug, Clone)]
pub enum Embedding {
    /// `vocab × dim` f32 values, row-major (safetensors tables, in-memory models).
    Rows {
        /// The values.
        rows: Vec<f32>,
        /// Row width.
        dim: usize,
    },
    /// A GGUF table as the file stores it (in place in its map): a lookup dequantizes one row, the
    /// same f32 values the whole table's dequantization holds.
    Stored(Arc<GgufTensor>),
}

impl Embedding {
    /// Row width.
    pub fn dim(&self) -> usize {
        match self {
            Embedding::Rows { dim, .. } => *dim,
            Embedding::Stored(t) => t.dims().get(1).copied().unwrap_or(0),
        }
    }

    /// Number of rows.
    pub fn vocab(&self) -> usize {
        match self {
            Embedding::Rows { rows, dim } => rows.len() / (*dim).max(1),
            Embedding::Stored(t) => t.dims().first().copied().unwrap_or(0),
        }
    }

    /// Appends the row of `token` to `out` (the caller checks `token` against the vocabulary).
    pub fn lookup(&self, token: u32, out: &mut Vec<f32>) -> Result<()> {
        let t = token as usize;
        match self {
            Embedding::Rows { rows, dim } => {
                out.extend_from_slice(&rows[t * dim..(t + 1) * dim]);
                Ok(())
            }
            Embedding::Stored(table) => table.row_into(t, out),
        }
    }

    /// Bytes the table takes (as stored, or as f32).
    pub fn bytes(&self) -> usize {
        match self {
            Embedding::Rows { rows, .. } => rows.len() * 4,
            Embedding::Stored(t) => t.storage_size_in_bytes(),
        }
    }

    /// The table's bytes as held (the model's fingerprint hashes them).
    pub fn raw(&self) -> &[u8] {
        match self {
            // SAFETY: f32 is plain data without padding; the length is the slice's byte size.
            Embedding::Rows { rows, .. } => unsafe {
                std::slice::from_raw_parts(rows.as_ptr() as *const u8, std::mem::size_of_val(rows.as_slice()))
            },
            Embedding::Stored(t) => t.data(),
        }
    }
}

/// Projections that read the same input: one stacked matrix (the outputs side by side, `widths` each)
/// where the parts' formats allow, else each apart. Either way a part's outputs are the same bits
/// (every output is its own column's fixed sequence).
#[derive(Debug, Clone)]
pub enum Stack {
    /// One matrix whose outputs are the parts' outputs side by side.
    One {
        /// The stacked matrix.
        w: Linear,
        /// Each part's output width, in order.
        widths: Vec<usize>,
    },
    /// The parts, each its own matrix.
    Apart(Vec<Linear>),
}

impl Stack {
    /// The parts as one matrix when they stack ([`Linear::fuse`]), else apart.
    pub fn of(parts: Vec<Linear>) -> Stack {
        let refs: Vec<&Linear> = parts.iter().collect();
        match Linear::fuse(&refs) {
            Some(w) => Stack::One {
                widths: parts.iter().map(Linear::out_dim).collect(),
                w,
            },
            None => Stack::Apart(parts),
        }
    }

    /// Each part's output width.
    pub fn widths(&self) -> Vec<usize> {
        match self {
            Stack::One { widths, .. } => widths.clone(),
            Stack::Apart(p) => p.iter().map(Linear::out_dim).collect(),
        }
    }

    /// The matrices held (one, or each part).
    pub fn matrices(&self) -> Vec<&Linear> {
        match self {
            Stack::One { w, .. } => vec![w],
            Stack::Apart(p) => p.iter().collect(),
        }
    }
}

/// One layer as the CPU holds it.
#[derive(Debug, Clone)]
pub struct Layer {
    /// Norm before attention.
    pub attn_norm: Vec<f32>,
    /// The query, key and value projections.
    pub qkv: Stack,
    /// Output projection.
    pub o: Linear,
    /// Per-head query norm (Qwen3, Gemma 3).
    pub q_norm: Option<Vec<f32>>,
    /// Per-head key norm (Qwen3, Gemma 3).
    pub k_norm: Option<Vec<f32>>,
    /// Norm of the attention output before the residual add (Gemma 3).
    pub post_attn_norm: Option<Vec<f32>>,
    /// Norm before the MLP.
    pub ffn_norm: Vec<f32>,
    /// Norm of the MLP output before the residual add (Gemma 3).
    pub post_ffn_norm: Option<Vec<f32>>,
    /// The MLP's gate and up projections.
    pub gate_up: Stack,
    /// MLP down.
    pub down: Linear,
}

impl Layer {
    /// Every matrix the layer holds.
    pub fn matrices(&self) -> Vec<&Linear> {
        let mut m = self.qkv.matrices();
        m.push(&self.o);
        m.extend(self.gate_up.matrices());
        m.push(&self.down);
        m
    }
}

/// All weights.
#[derive(Debug, Clone)]
pub struct Weights {
    /// Token embeddings.
    pub embed: Embedding,
    /// The layers.
    pub layers: Vec<Layer>,
    /// Final norm.
    pub final_norm: Vec<f32>,
    /// Output projection (the embedding matrix itself when tied, laid out for the kernels).
    pub lm_head: Linear,
}

impl Weights {
    /// Whether any matmul has the 8-bit-activation kernel (so the fast path computes differently).
    pub fn has_int8(&self) -> bool {
        self.lm_head.has_int8() || self.layers.iter().any(|l| l.matrices().iter().any(|m| m.has_int8()))
    }

    /// Bytes of weight data held (the embedding as it is held).
    pub fn bytes(&self) -> usize {
        self.embed.bytes() + self.matmul_bytes()
    }

    /// Bytes of the matrices a forward pass streams: every layer's and the output projection.
    pub fn matmul_bytes(&self) -> usize {
        self.lm_head.weight_bytes()
            + self
                .layers
                .iter()
                .flat_map(|l| l.matrices())
                .map(Linear::weight_bytes)
                .sum::<usize>()
    }
}
