//! The forward pass over one flat, variable-length batch: prefill chunks and decode tokens of many
//! sequences mixed in one list of token rows, each row carrying its position, the cache slot its K/V go
//! to, and the block table it reads; logits are computed only for the rows that ask for them.
//!
//! Every operation is per row (norms, RoPE, batch-invariant matmuls, per-row attention), so a row's
//! logits are bitwise the same whatever else is in the batch and whether its prefix was computed in
//! this step, an earlier chunk, or found in the prefix cache.

use kvgate_backend::{Batch, KvAmax, Want};
use kvgate_kv::{AttentionBackend, AttnParams, AttnQuery, AttnRow};

use crate::ops::{
    add_inplace, gated_activation, gated_from_fused, rms_norm, rms_norm_inplace, softcap_inplace, split_cols, RopeApply,
};
use crate::weights::{Stack, Weights};
use kvgate_model::{ModelConfig, Rope};
use kvgate_model::{ModelError, Result};

/// What one forward pass computed for a batch's outputs, split by kind.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ForwardOut {
    /// Logits of every output that runs the head (all but [`Want::Hidden`]), `vocab` each, in output
    /// order.
    pub logits: Vec<f32>,
    /// The final normed hidden state of every [`Want::Hidden`] output, `hidden_size` each, in output
    /// order.
    pub hidden: Vec<f32>,
}

/// A loaded model ready to run.
#[derive(Debug)]
pub struct Model {
    cfg: ModelConfig,
    w: Weights,
    rope: Rope,
    rope_local: Option<Rope>,
}

fn amax(x: &[f32]) -> f32 {
    x.iter().fold(0f32, |m, v| m.max(v.abs()))
}

impl Model {
    /// Wraps loaded weights; RoPE tables cover `max_positions` positions.
    pub fn new(cfg: ModelConfig, w: Weights, max_positions: usize) -> Result<Model> {
        cfg.validate()?;
        if w.layers.len() != cfg.num_layers {
            return Err(ModelError::Invalid(format!(
                "{} layers loaded for a config of {}",
                w.layers.len(),
                cfg.num_layers
            )));
        }
        let rope = Rope::new(
            cfg.head_dim,
            cfg.rope_theta,
            cfg.rope_scaling,
            max_positions,
            cfg.rope_style,
        );
        let rope_local = cfg.rope_local_theta.map(|t| {
            Rope::new(
                cfg.head_dim,
                t,
                kvgate_model::RopeScaling::None,
                max_positions,
                cfg.rope_style,
            )
        });
        for (i, l) in w.layers.iter().enumerate() {
            let (qkv, gu) = (l.qkv.widths(), l.gate_up.widths());
            if qkv.len() != 3 || gu.len() != 2 {
                return Err(ModelError::Invalid(format!(
                    "layer {i}: {} q/k/v and {} gate/up projections",
                    qkv.len(),
                    gu.len()
                )));
            }
        }
        Ok(Model {
            cfg,
            w,
            rope,
            rope_local,
        })
    }

    /// The architecture.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// The weights.
    pub fn weights(&self) -> &Weights {
        &self.w
    }

    /// Positions the RoPE tables cover (the longest sequence this model instance can run).
    pub fn max_positions(&self) -> usize {
        self.rope.max_pos()
    }

    /// Runs the batch: writes every row's K/V into `cache` (through `attn`, whose cache it is), returns
    /// the logits of every output row (`outputs.len() × vocab`, in output order, whatever each output
    /// wants: reducing them is the backend's job), every row computed exactly.
    pub fn forward<A: AttentionBackend>(&self, b: &Batch, cache: &mut A::Cache, attn: &A) -> Result<Vec<f32>> {
        Ok(self.forward_inner(b, cache, attn, false, None)?.logits)
    }

    /// Runs the batch as [`Model::forward`] (or [`Model::forward_int8`] when `int8`), the head only
    /// for the outputs that need it: a [`Want::Hidden`] output returns its final normed hidden state
    /// instead of logits.
    pub fn forward_split<A: AttentionBackend>(
        &self,
        b: &Batch,
        cache: &mut A::Cache,
        attn: &A,
        int8: bool,
    ) -> Result<ForwardOut> {
        self.forward_inner(b, cache, attn, int8, None)
    }

    /// As [`Model::forward`], with the rows of [`kvgate_backend::Precision::Fast`] sequences through
    /// the 8-bit-activation kernels (see [`crate::QMatrix::matmul_rows`]); every other row as
    /// `forward` computes it, bit for bit.
    pub fn forward_int8<A: AttentionBackend>(&self, b: &Batch, cache: &mut A::Cache, attn: &A) -> Result<Vec<f32>> {
        Ok(self.forward_inner(b, cache, attn, true, None)?.logits)
    }

    /// Like [`Model::forward`], also reporting the per-layer amax of K and V (calibration).
    pub fn forward_with_amax<A: AttentionBackend>(
        &self,
        b: &Batch,
        cache: &mut A::Cache,
        attn: &A,
    ) -> Result<(Vec<f32>, KvAmax)> {
        let mut a = KvAmax::default();
        let out = self.forward_inner(b, cache, attn, false, Some(&mut a))?;
        Ok((out.logits, a))
    }

    fn forward_inner<A: AttentionBackend>(
        &self,
        b: &Batch,
        cache: &mut A::Cache,
        attn: &A,
        int8_fast: bool,
        mut amax_out: Option<&mut KvAmax>,
    ) -> Result<ForwardOut> {
        let c = &self.cfg;
        let n = b.len();
        if n == 0 {
            return Ok(ForwardOut::default());
        }
        let (hd, nh, nkv, d) = (c.head_dim, c.num_heads, c.num_kv_heads, c.hidden_size);
        for (&t, &p) in b.tokens.iter().zip(b.rope_positions()) {
            if t as usize >= c.vocab_size {
                return Err(ModelError::Invalid(format!(
                    "token id {t} is outside the vocabulary of {}",
                    c.vocab_size
                )));
            }
            if p as usize >= self.max_positions() {
                return Err(ModelError::Invalid(format!(
                    "position {p} is beyond {}",
                    self.max_positions()
                )));
            }
        }
        let mut x = Vec::with_capacity(n * d);
        for &t in &b.tokens {
            self.w.embed.lookup(t, &mut x)?;
        }
        if c.scale_embeddings {
            let s = (d as f32).sqrt();
            x.iter_mut().for_each(|v| *v *= s);
        }
        let rows: Vec<AttnRow> = b
            .seq_of_row
            .iter()
            .zip(&b.positions)
            .map(|(&s, &p)| AttnRow { table: s, pos: p })
            .collect();
        let tables: Vec<&[u32]> = b.tables.iter().map(|t| t.as_slice()).collect();
        // Per row: the 8-bit-activation flag of its sequence (empty when no row takes it).
        let int8: Vec<bool> = if int8_fast { b.fast_rows() } else { Vec::new() };
        let mut h = vec![0f32; n * d];
        let mut attn_out = vec![0f32; n * nh * hd];
        for (li, l) in self.w.layers.iter().enumerate() {
            rms_norm(&x, &l.attn_norm, c.rms_eps, c.norm_plus_one, &mut h);
            let mut qkv = stacked(&l.qkv, &h, n, &int8)?.into_iter();
            let (mut q, mut k, v) = (
                qkv.next().unwrap_or_default(),
                qkv.next().unwrap_or_default(),
                qkv.next().unwrap_or_default(),
            );
            if let Some(w) = &l.q_norm {
                rms_norm_inplace(&mut q, w, c.rms_eps, c.norm_plus_one);
            }
            if let Some(w) = &l.k_norm {
                rms_norm_inplace(&mut k, w, c.rms_eps, c.norm_plus_one);
            }
            let sliding = c.sliding_layers[li];
            let rope = match (&self.rope_local, sliding) {
                (Some(r), true) => r,
                _ => &self.rope,
            };
            rope.apply(&mut q, b.rope_positions(), nh);
            rope.apply(&mut k, b.rope_positions(), nkv);
            if let Some(a) = amax_out.as_deref_mut() {
                a.k.push(amax(&k));
                a.v.push(amax(&v));
            }
            attn.write_kv(cache, li, &b.slots, &k, &v);
            let params = AttnParams {
                num_heads: nh,
                num_kv_heads: nkv,
                head_dim: hd,
                scale: c.attn_scale,
                window: if sliding { c.sliding_window } else { None },
                softcap: c.attn_logit_softcap,
            };
            let query = AttnQuery {
                q: &q,
                rows: &rows,
                tables: &tables,
                masks: &b.masks,
            };
            attn.attend(cache, li, &query, &params, &mut attn_out);
            let mut o = l.o.forward_rows(&attn_out, n, &int8)?;
            if let Some(w) = &l.post_attn_norm {
                rms_norm_inplace(&mut o, w, c.rms_eps, c.norm_plus_one);
            }
            add_inplace(&mut x, &o);
            rms_norm(&x, &l.ffn_norm, c.rms_eps, c.norm_plus_one, &mut h);
            let g = match &l.gate_up {
                Stack::One { w, widths } if widths[0] == widths[1] => {
                    gated_from_fused(&w.forward_rows(&h, n, &int8)?, n, widths[0], c.activation)
                }
                gu => {
                    let mut parts = stacked(gu, &h, n, &int8)?.into_iter();
                    let (mut g, u) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
                    gated_activation(&mut g, &u, c.activation);
                    g
                }
            };
            let mut m = l.down.forward_rows(&g, n, &int8)?;
            if let Some(w) = &l.post_ffn_norm {
                rms_norm_inplace(&mut m, w, c.rms_eps, c.norm_plus_one);
            }
            add_inplace(&mut x, &m);
        }
        if b.outputs.is_empty() {
            return Ok(ForwardOut::default());
        }
        // the final norm is per row: the head's rows and the hidden rows are normed apart
        let mut out = ForwardOut::default();
        let mut sel = Vec::with_capacity(b.outputs.len() * d);
        let mut head_int8 = Vec::new();
        for o in &b.outputs {
            let row = &x[o.row * d..(o.row + 1) * d];
            if o.want == Want::Hidden {
                out.hidden.extend_from_slice(row);
            } else {
                sel.extend_from_slice(row);
                if !int8.is_empty() {
                    head_int8.push(int8[o.row]);
                }
            }
        }
        rms_norm_inplace(&mut out.hidden, &self.w.final_norm, c.rms_eps, c.norm_plus_one);
        if sel.is_empty() {
            return Ok(out);
        }
        rms_norm_inplace(&mut sel, &self.w.final_norm, c.rms_eps, c.norm_plus_one);
        out.logits = self.w.lm_head.forward_rows(&sel, sel.len() / d, &head_int8)?;
        if let Some(cap) = c.final_logit_softcap {
            softcap_inplace(&mut out.logits, cap);
        }
        Ok(out)
    }
}

/// The outputs of each part of a stack of projections (one matmul split by columns, or each part's
/// own): the same bits either way.
fn stacked(s: &Stack, x: &[f32], n: usize, int8: &[bool]) -> Result<Vec<Vec<f32>>> {
    match s {
        Stack::One { w, widths } => Ok(split_cols(&w.forward_rows(x, n, int8)?, n, widths)),
        Stack::Apart(parts) => parts.iter().map(|p| p.forward_rows(x, n, int8)).collect(),
    }
}
