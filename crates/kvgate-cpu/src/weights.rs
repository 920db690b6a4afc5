//! The weights of a decoder-only transformer, in the one shape every architecture and file format is
//! loaded into. Optional parts (biases, q/k norms, sandwich norms) are `None` where an architecture has
//! none.

pub use kvgate_model::LayerWeights;

use crate::linear::Linear;

/// The token embedding table, kept as f32 rows.
#[derive(Debug, Clone)]
pub struct Embedding {
    /// `vocab × dim`, row-major.
    pub rows: Vec<f32>,
    /// Row width.
    pub dim: usize,
}

impl Embedding {
    /// Number of rows.
    pub fn vocab(&self) -> usize {
        self.rows.len() / self.dim
    }

    /// Appends the row of `token` to `out`.
    pub fn lookup(&self, token: u32, out: &mut Vec<f32>) {
        let t = token as usize;
        out.extend_from_slice(&self.rows[t * self.dim..(t + 1) * self.dim]);
    }
}

/// All weights.
#[derive(Debug, Clone)]
pub struct Weights {
    /// Token embeddings.
    pub embed: Embedding,
    /// The layers.
    pub layers: Vec<LayerWeights<Linear>>,
    /// Final norm.
    pub final_norm: Vec<f32>,
    /// Output projection (the embedding matrix itself when tied).
    pub lm_head: Linear,
}

impl Weights {
    /// Whether any matmul has the 8-bit-activation kernel (so the fast path computes differently).
    pub fn has_int8(&self) -> bool {
        self.lm_head.has_int8()
            || self.layers.iter().any(|l| {
                [&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down]
                    .iter()
                    .any(|m| m.has_int8())
            })
    }

    /// Bytes of weight data held.
    pub fn bytes(&self) -> usize {
        let lin = |l: &Linear| l.weight_bytes();
        self.embed.rows.len() * 4
            + lin(&self.lm_head)
            + self
                .layers
                .iter()
                .map(|l| lin(&l.q) + lin(&l.k) + lin(&l.v) + lin(&l.o) + lin(&l.gate) + lin(&l.up) + lin(&l.down))
                .sum::<usize>()
    }
}
