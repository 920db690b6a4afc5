//! The forward pass on the device: `kvgate_model`'s layer code (`model.rs`) step for step over one flat
//! batch — embedding, per layer RMSNorm → q/k/v (+ biases, q/k norms) → RoPE → K/V stored into the
//! pages at each row's slot → paged attention of every row over its own range (causal, sliding window,
//! softcap) → output projection (+ sandwich norm) → residual → MLP → residual; then the final norm and
//! the head only for the rows that need it. Only what each output asks for comes back to the host: a
//! [`Want::Logits`] row, a [`Want::Logprobs`] output's few values (reduced on the device), a
//! [`Want::Hidden`] row.
//!
//! Every kernel is per row, so a row's outputs do not depend on the rest of the batch; every row's K/V
//! of a layer is stored before any row of that layer attends.

use cudarc::driver::CudaSlice;
use kvgate_backend::{Batch, KvAmax, StepOutput, Want, RELEASED_BLOCK};
use kvgate_model::{Activation, ModelConfig, RopeStyle};

use super::cache::DevCache;
use super::weights::DevWeights;
use crate::{Attention, BlockTables, CudaError, Gpu, QueryRow};

/// The model on the device: config, weights, RoPE tables.
pub(crate) struct DevModel {
    pub cfg: ModelConfig,
    pub w: DevWeights,
    /// (cos, sin) of full-attention layers.
    pub rope: (CudaSlice<f32>, CudaSlice<f32>),
    /// (cos, sin) of sliding layers, when their base differs.
    pub rope_local: Option<(CudaSlice<f32>, CudaSlice<f32>)>,
    pub max_positions: usize,
}

/// The step's activations, kept between steps and grown to the largest batch seen: no allocation per
/// step. Rows past the batch hold stale values no kernel reads.
#[derive(Default)]
pub(crate) struct Scratch {
    rows: usize,
    x: Option<CudaSlice<f32>>,
    h: Option<CudaSlice<f32>>,
    q: Option<CudaSlice<f32>>,
    k: Option<CudaSlice<f32>>,
    v: Option<CudaSlice<f32>>,
    att: Option<CudaSlice<f32>>,
    o: Option<CudaSlice<f32>>,
    g: Option<CudaSlice<f32>>,
}

/// The scratch buffers of a batch of `n` rows, borrowed out of [`Scratch`].
struct Buffers<'a> {
    x: &'a mut CudaSlice<f32>,
    h: &'a mut CudaSlice<f32>,
    q: &'a mut CudaSlice<f32>,
    k: &'a mut CudaSlice<f32>,
    v: &'a mut CudaSlice<f32>,
    att: &'a mut CudaSlice<f32>,
    o: &'a mut CudaSlice<f32>,
    g: &'a mut CudaSlice<f32>,
}

impl Scratch {
    /// Buffers for `n` rows of model `c` (grown, never shrunk).
    fn reserve<'a>(&'a mut self, gpu: &Gpu, c: &ModelConfig, n: usize) -> Result<Buffers<'a>, CudaError> {
        if n > self.rows || self.x.is_none() {
            let rows = n.max(self.rows);
            let (d, qd, kvd, inter) = (
                c.hidden_size,
                c.num_heads * c.head_dim,
                c.num_kv_heads * c.head_dim,
                c.intermediate_size,
            );
            self.x = Some(gpu.zeros_f32(rows * d)?);
            self.h = Some(gpu.zeros_f32(rows * d)?);
            self.q = Some(gpu.zeros_f32(rows * qd)?);
            self.k = Some(gpu.zeros_f32(rows * kvd)?);
            self.v = Some(gpu.zeros_f32(rows * kvd)?);
            self.att = Some(gpu.zeros_f32(rows * qd)?);
            self.o = Some(gpu.zeros_f32(rows * d)?);
            self.g = Some(gpu.zeros_f32(rows * inter)?);
            self.rows = rows;
        }
        let missing = || CudaError::Invalid("scratch not allocated".into());
        Ok(Buffers {
            x: self.x.as_mut().ok_or_else(missing)?,
            h: self.h.as_mut().ok_or_else(missing)?,
            q: self.q.as_mut().ok_or_else(missing)?,
            k: self.k.as_mut().ok_or_else(missing)?,
            v: self.v.as_mut().ok_or_else(missing)?,
            att: self.att.as_mut().ok_or_else(missing)?,
            o: self.o.as_mut().ok_or_else(missing)?,
            g: self.g.as_mut().ok_or_else(missing)?,
        })
    }
}

/// What a measuring pass saw: per layer the amax of K and V and their per-channel means.
#[derive(Debug, Default)]
pub(crate) struct Measured {
    pub amax: KvAmax,
    pub means: Vec<(Vec<f32>, Vec<f32>)>,
}

fn amax(x: &[f32]) -> f32 {
    x.iter().fold(0f32, |m, v| m.max(v.abs()))
}

/// Per-channel means of `rows` rows of `width` values.
fn means(x: &[f32], width: usize) -> Vec<f32> {
    let rows = (x.len() / width.max(1)).max(1);
    let mut acc = vec![0f64; width];
    for r in x.chunks_exact(width) {
        acc.iter_mut().zip(r).for_each(|(a, &b)| *a += b as f64);
    }
    acc.into_iter().map(|a| (a / rows as f64) as f32).collect()
}

/// The block tables of the batch (`RELEASED_BLOCK` and padding as −1, never read: checked), its
/// rows' ranges under `window` and its tree rows' masks.
fn tables(gpu: &Gpu, b: &Batch, block_size: usize, window: Option<usize>) -> Result<BlockTables, CudaError> {
    let max_blocks = b.tables.iter().map(Vec::len).max().unwrap_or(0).max(1);
    let mut flat = vec![-1i32; b.tables.len() * max_blocks];
    for (i, t) in b.tables.iter().enumerate() {
        for (j, &x) in t.iter().enumerate() {
            flat[i * max_blocks + j] = if x == RELEASED_BLOCK {
                -1
            } else {
                i32::try_from(x).map_err(|_| CudaError::Invalid(format!("block {x} beyond i32")))?
            };
        }
    }
    let rows: Vec<QueryRow> = b
        .seq_of_row
        .iter()
        .zip(&b.positions)
        .map(|(&s, &p)| {
            let end = p as usize + 1;
            QueryRow {
                seq: s as usize,
                first: window.map_or(0, |w| end.saturating_sub(w)),
                end,
            }
        })
        .collect();
    gpu.upload_tree_rows(&flat, max_blocks, &rows, &b.masks, block_size)
}

/// Runs `b` (checked by the caller against the cache, the vocabulary and the positions) over `cache`;
/// with `measure`, also reports what K and V were per layer.
pub(crate) fn run(
    gpu: &Gpu,
    m: &DevModel,
    cache: &mut DevCache,
    scratch: &mut Scratch,
    b: &Batch,
    mut measure: Option<&mut Measured>,
) -> Result<StepOutput, CudaError> {
    let c = &m.cfg;
    let n = b.len();
    let (hd, nh, nkv, d) = (c.head_dim, c.num_heads, c.num_kv_heads, c.hidden_size);
    let mut out = StepOutput {
        vocab: c.vocab_size,
        width: d,
        ..StepOutput::default()
    };
    if n == 0 {
        return Ok(out);
    }
    let (eps, p1) = (c.rms_eps, c.norm_plus_one);
    let interleaved = c.rope_style == RopeStyle::Interleaved;
    let tokens = gpu.upload(&b.tokens)?;
    // RoPE at each row's own position (a tree row's may repeat); K/V at its place in the table
    let pos = gpu.upload(b.rope_positions())?;
    let slots = gpu.upload_slots(&b.slots)?;
    let bs = cache.shape.block_size();
    // one set of ranges per distinct window (full layers: none)
    let window_of = |li: usize| if c.sliding_layers[li] { c.sliding_window } else { None };
    let mut ranges: Vec<(Option<usize>, BlockTables)> = Vec::new();
    for li in 0..c.num_layers {
        let w = window_of(li);
        if !ranges.iter().any(|(x, _)| *x == w) {
            ranges.push((w, tables(gpu, b, bs, w)?));
        }
    }
    let dims = cache.dims(nh);
    let (dtype, quant) = (cache.shape.dtype(), cache.shape.quant());

    let Buffers {
        x,
        h,
        q,
        k,
        v,
        att,
        o,
        g,
    } = scratch.reserve(gpu, c, n)?;
    let scale = if c.scale_embeddings { (d as f32).sqrt() } else { 1.0 };
    gpu.embed(x, &m.w.embed, &tokens, n, scale)?;
    // the first layer's norm; every later one comes with the residual add before it (add_rms_norm)
    if let Some(l) = m.w.layers.first() {
        gpu.rms_norm(h, x, &l.attn_norm, n, eps, p1)?;
    }
    for (li, l) in m.w.layers.iter().enumerate() {
        gpu.matmul3(
            [Some(&mut *q), Some(&mut *k), Some(&mut *v)],
            h,
            [Some(&l.q), Some(&l.k), Some(&l.v)],
            n,
        )?;
        if let Some(w) = &l.q_norm {
            gpu.rms_norm_inplace(q, w, n * nh, eps, p1)?;
        }
        if let Some(w) = &l.k_norm {
            gpu.rms_norm_inplace(k, w, n * nkv, eps, p1)?;
        }
        let (cos, sin) = match (&m.rope_local, c.sliding_layers[li]) {
            (Some(r), true) => (&r.0, &r.1),
            _ => (&m.rope.0, &m.rope.1),
        };
        gpu.rope_qk(q, k, cos, sin, &pos, n, (nh, nkv, hd), interleaved)?;
        if let Some(ms) = measure.as_deref_mut() {
            let (hk, hv) = (gpu.download(k)?, gpu.download(v)?);
            ms.amax.k.push(amax(&hk[..n * nkv * hd]));
            ms.amax.v.push(amax(&hv[..n * nkv * hd]));
            ms.means.push((
                means(&hk[..n * nkv * hd], nkv * hd),
                means(&hv[..n * nkv * hd], nkv * hd),
            ));
        }
        let lc = &mut cache.layers[li];
        let offs = lc.offsets.as_ref();
        gpu.store(dtype, quant, k, &slots, &mut lc.k, dims, lc.k_scale, offs.map(|o| &o.0))?;
        gpu.store(dtype, quant, v, &slots, &mut lc.v, dims, lc.v_scale, offs.map(|o| &o.1))?;
        cache.written = true;
        let lc = &cache.layers[li];
        let a = Attention {
            dtype,
            quant,
            d: dims,
            scale: c.attn_scale,
            k_scale: lc.k_scale,
            v_scale: lc.v_scale,
            softcap: c.attn_logit_softcap,
        };
        let w = window_of(li);
        let rows = ranges
            .iter()
            .find(|(x, _)| *x == w)
            .map(|(_, t)| t)
            .ok_or_else(|| CudaError::Invalid("no ranges for a window".into()))?;
        gpu.attention(&a, lc.offsets.as_ref().map(|o| &o.1), att, q, &lc.k, &lc.v, rows)?;
        gpu.matmul(o, att, &l.o, n)?;
        if let Some(w) = &l.post_attn_norm {
            gpu.rms_norm_inplace(o, w, n, eps, p1)?;
        }
        gpu.add_rms_norm(x, o, h, &l.ffn_norm, n, eps, p1)?;
        gpu.matmul_gated(g, h, &l.gate, &l.up, n, c.activation == Activation::GeluTanh)?;
        gpu.matmul(o, g, &l.down, n)?;
        if let Some(w) = &l.post_ffn_norm {
            gpu.rms_norm_inplace(o, w, n, eps, p1)?;
        }
        match m.w.layers.get(li + 1) {
            Some(next) => gpu.add_rms_norm(x, o, h, &next.attn_norm, n, eps, p1)?,
            None => gpu.add(x, o, n * d)?,
        }
    }
    // the final norm per row; the head only for the rows that need it
    let hidden_rows: Vec<u32> = b
        .outputs
        .iter()
        .filter(|o| o.want == Want::Hidden)
        .map(|o| o.row as u32)
        .collect();
    if !hidden_rows.is_empty() {
        let mut hs = gpu.zeros_f32(hidden_rows.len() * d)?;
        gpu.gather_rows(&mut hs, x, n, &hidden_rows, d)?;
        gpu.rms_norm_inplace(&mut hs, &m.w.final_norm, hidden_rows.len(), eps, p1)?;
        out.hidden = gpu.download(&hs)?;
        out.hidden.truncate(hidden_rows.len() * d);
    }
    let head: Vec<&kvgate_backend::Output> = b.outputs.iter().filter(|o| o.want != Want::Hidden).collect();
    if head.is_empty() {
        return Ok(out);
    }
    let rows: Vec<u32> = head.iter().map(|o| o.row as u32).collect();
    let kr = rows.len();
    let vocab = c.vocab_size;
    let mut sel = gpu.zeros_f32(kr * d)?;
    gpu.gather_rows(&mut sel, x, n, &rows, d)?;
    gpu.rms_norm_inplace(&mut sel, &m.w.final_norm, kr, eps, p1)?;
    let mut logits = gpu.zeros_f32(kr * vocab)?;
    gpu.matmul(&mut logits, &sel, m.w.head(), kr)?;
    if let Some(cap) = c.final_logit_softcap {
        gpu.softcap(&mut logits, kr * vocab, cap)?;
    }
    let ids: Vec<Vec<u32>> = head
        .iter()
        .map(|o| match &o.want {
            Want::Logprobs(ids) => ids.clone(),
            _ => Vec::new(),
        })
        .collect();
    if head.iter().any(|o| matches!(o.want, Want::Logprobs(_))) {
        let lp = gpu.logprobs(&logits, vocab, &ids)?;
        out.logprobs = head
            .iter()
            .zip(lp)
            .filter(|(o, _)| matches!(o.want, Want::Logprobs(_)))
            .map(|(_, v)| v)
            .collect();
    }
    let want_logits: Vec<u32> = head
        .iter()
        .enumerate()
        .filter(|(_, o)| o.want == Want::Logits)
        .map(|(i, _)| i as u32)
        .collect();
    if want_logits.len() == kr {
        out.logits = gpu.download(&logits)?;
    } else if !want_logits.is_empty() {
        let mut lg = gpu.zeros_f32(want_logits.len() * vocab)?;
        gpu.gather_rows(&mut lg, &logits, kr, &want_logits, vocab)?;
        out.logits = gpu.download(&lg)?;
    }
    out.logits.truncate(want_logits.len() * vocab);
    Ok(out)
}
