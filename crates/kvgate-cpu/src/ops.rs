//! Layer code shared by every architecture: RMSNorm (plain or `1 + w`), rotary embeddings (interleaved or
//! half-split pairs, with scaling), the MLP activations, soft-capping.
//!
//! Every function works row by row on flat `f32` slices, so each row's result depends only on that row:
//! the forward pass is batch-invariant by construction.

use kvgate_model::{Activation, Rope, RopeStyle};

/// Rows per parallel task of the row-wise ops below; a call with fewer than twice as many rows (a
/// decode step) runs on the calling thread. Each row is computed alone whatever the split, so the bits
/// do not depend on it; serial, a 450-token Qwen2.5 prefill left the second core idle ~20% of the time
/// (perf, per thread) in these ops and the copies between matmuls.
const ROW_TASK: usize = 16;

/// `f` on each `d`-wide row of `x` (with the matching `d_out`-wide row of `out`), in parallel tasks of
/// [`ROW_TASK`] rows when there are enough rows.
fn each_row<F>(x: &[f32], d: usize, out: &mut [f32], d_out: usize, f: F)
where
    F: Fn(&[f32], &mut [f32]) + Sync,
{
    use rayon::prelude::*;
    if x.len() < 2 * ROW_TASK * d {
        x.chunks_exact(d)
            .zip(out.chunks_exact_mut(d_out))
            .for_each(|(a, b)| f(a, b));
    } else {
        x.par_chunks_exact(d)
            .zip(out.par_chunks_exact_mut(d_out))
            .with_min_len(ROW_TASK)
            .for_each(|(a, b)| f(a, b));
    }
}

/// `f` on each `d`-wide row of `x` in place, as [`each_row`].
fn each_row_mut<F>(x: &mut [f32], d: usize, f: F)
where
    F: Fn(usize, &mut [f32]) + Sync,
{
    use rayon::prelude::*;
    if x.len() < 2 * ROW_TASK * d {
        x.chunks_exact_mut(d).enumerate().for_each(|(r, a)| f(r, a));
    } else {
        x.par_chunks_exact_mut(d)
            .enumerate()
            .with_min_len(ROW_TASK)
            .for_each(|(r, a)| f(r, a));
    }
}

/// RMSNorm of each `w.len()`-wide row of `x` into `out`: `x · rsqrt(mean(x²) + eps) · w` (or `· (1 + w)`).
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, plus_one: bool, out: &mut [f32]) {
    let d = w.len();
    each_row(x, d, out, d, |xr, or| {
        let ss: f32 = xr.iter().map(|v| v * v).sum();
        let r = 1.0 / (ss / d as f32 + eps).sqrt();
        if plus_one {
            for ((o, v), g) in or.iter_mut().zip(xr).zip(w) {
                *o = v * r * (1.0 + g);
            }
        } else {
            for ((o, v), g) in or.iter_mut().zip(xr).zip(w) {
                *o = v * r * g;
            }
        }
    });
}

/// In-place RMSNorm of each `w.len()`-wide row.
pub fn rms_norm_inplace(x: &mut [f32], w: &[f32], eps: f32, plus_one: bool) {
    let d = w.len();
    each_row_mut(x, d, |_, xr| {
        let ss: f32 = xr.iter().map(|v| v * v).sum();
        let r = 1.0 / (ss / d as f32 + eps).sqrt();
        for (v, g) in xr.iter_mut().zip(w) {
            *v *= r * if plus_one { 1.0 + g } else { *g };
        }
    });
}

/// The columns of a `rows × Σ widths` matrix split into one `rows × width` matrix per width (a fused
/// layer's outputs), row-parallel as [`each_row`].
pub fn split_cols(y: &[f32], rows: usize, widths: &[usize]) -> Vec<Vec<f32>> {
    let total: usize = widths.iter().sum();
    let mut off = 0;
    widths
        .iter()
        .map(|&w| {
            let mut out = vec![0f32; rows * w];
            let at = off;
            each_row(&y[..rows * total], total, &mut out, w, |src, dst| {
                dst.copy_from_slice(&src[at..at + w])
            });
            off += w;
            out
        })
        .collect()
}

/// The CPU's rotation by a [`Rope`] table (the table is `kvgate_model`'s, shared with every backend so
/// that their angles are the same numbers).
pub trait RopeApply {
    /// Rotates every head of every row of `x` (`rows × heads × head_dim`) by its row's position.
    fn apply(&self, x: &mut [f32], positions: &[u32], heads: usize);
}

impl RopeApply for Rope {
    fn apply(&self, x: &mut [f32], positions: &[u32], heads: usize) {
        let (half, (cos, sin)) = (self.half(), self.cos_sin());
        let hd = 2 * half;
        let rows = positions.len().min(x.len() / (heads * hd));
        each_row_mut(&mut x[..rows * heads * hd], heads * hd, |r, row| {
            let p = positions[r] as usize;
            let (c, s) = (&cos[p * half..(p + 1) * half], &sin[p * half..(p + 1) * half]);
            for h in row.chunks_exact_mut(hd) {
                match self.style() {
                    RopeStyle::Interleaved => {
                        for i in 0..half {
                            let (a, b) = (h[2 * i], h[2 * i + 1]);
                            h[2 * i] = a * c[i] - b * s[i];
                            h[2 * i + 1] = a * s[i] + b * c[i];
                        }
                    }
                    RopeStyle::Half => {
                        let (lo, hi) = h.split_at_mut(half);
                        for i in 0..half {
                            let (a, b) = (lo[i], hi[i]);
                            lo[i] = a * c[i] - b * s[i];
                            hi[i] = b * c[i] + a * s[i];
                        }
                    }
                }
            }
        });
    }
}

/// Elements per parallel task of [`gated_activation`] (a decode row's 4,864 of Qwen2.5 are two tasks).
const ACT_CHUNK: usize = 2048;

/// `gate = act(gate) · up`, element-wise, in parallel chunks: each element goes through the same
/// arithmetic wherever it sits (SiLU's `exp` is [`kvgate_kv::exp_in_place`], whose lanes give an element
/// the same bits in any slice; GELU's `tanh` libm's), so the bits do not depend on the split. Serial, a
/// 673-token Qwen2.5 prefill spent ~13% of its time here (78M `exp` calls on one thread); libm's
/// scalar `exp` was still ~6% of a prefill's samples before the vector one.
pub fn gated_activation(gate: &mut [f32], up: &[f32], act: Activation) {
    use rayon::prelude::*;
    if gate.len() < 2 * ACT_CHUNK {
        return activate(gate, up, act);
    }
    gate.par_chunks_mut(ACT_CHUNK)
        .zip(up.par_chunks(ACT_CHUNK))
        .for_each(|(g, u)| activate(g, u, act));
}

/// [`gated_activation`] on the calling thread.
fn activate(gate: &mut [f32], up: &[f32], act: Activation) {
    match act {
        Activation::Silu => {
            let mut e = [0f32; 64];
            for (g, u) in gate.chunks_mut(64).zip(up.chunks(64)) {
                let e = &mut e[..g.len()];
                for (e, g) in e.iter_mut().zip(g.iter()) {
                    *e = -*g;
                }
                kvgate_kv::exp_in_place(e);
                for ((g, u), e) in g.iter_mut().zip(u).zip(e.iter()) {
                    *g = *g / (1.0 + e) * u;
                }
            }
        }
        Activation::GeluTanh => {
            const C: f32 = 0.797_884_6; // sqrt(2/pi)
            for (g, u) in gate.iter_mut().zip(up) {
                let x = *g;
                *g = 0.5 * x * (1.0 + (C * (x + 0.044715 * x * x * x)).tanh()) * u;
            }
        }
    }
}

/// [`gated_activation`] of a fused gate-and-up layer's output (`rows × 2g`: each row its `g` gate
/// columns, then its `g` up columns) into a new `rows × g` matrix: each row's gate copied and activated
/// in one parallel task (one row: the activation's own parallel pieces), with the same per-element
/// arithmetic (so the same bits as splitting the columns first), instead of a serial copy of both
/// halves before the activation.
pub fn gated_from_fused(y: &[f32], rows: usize, g: usize, act: Activation) -> Vec<f32> {
    use rayon::prelude::*;
    let mut out = vec![0f32; rows * g];
    let row = |r: usize, o: &mut [f32]| {
        let src = &y[r * 2 * g..(r + 1) * 2 * g];
        o.copy_from_slice(&src[..g]);
        activate(o, &src[g..], act);
    };
    if rows == 1 {
        out.copy_from_slice(&y[..g]);
        gated_activation(&mut out, &y[g..2 * g], act);
    } else if rows * g >= 2 * ACT_CHUNK {
        out.par_chunks_mut(g.max(1)).enumerate().for_each(|(r, o)| row(r, o));
    } else {
        out.chunks_mut(g.max(1)).enumerate().for_each(|(r, o)| row(r, o));
    }
    out
}

/// `x += y`.
pub fn add_inplace(x: &mut [f32], y: &[f32]) {
    use rayon::prelude::*;
    let add = |x: &mut [f32], y: &[f32]| x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
    if x.len() < 8 * ACT_CHUNK {
        return add(x, y);
    }
    x.par_chunks_mut(4 * ACT_CHUNK)
        .zip(y.par_chunks(4 * ACT_CHUNK))
        .for_each(|(a, b)| add(a, b));
}

/// `x = cap · tanh(x / cap)`.
pub fn softcap_inplace(x: &mut [f32], cap: f32) {
    for v in x.iter_mut() {
        *v = cap * (*v / cap).tanh();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvgate_model::RopeScaling;

    #[test]
    fn gated_activation_in_chunks_is_each_element_alone() {
        // long enough for the parallel chunks, with a ragged tail
        let n = 3 * ACT_CHUNK + 5;
        let g: Vec<f32> = (0..n).map(|i| ((i * 7919) % 2001) as f32 / 250.0 - 4.0).collect();
        let u: Vec<f32> = (0..n).map(|i| ((i * 104_729) % 997) as f32 / 300.0 - 1.5).collect();
        for act in [Activation::Silu, Activation::GeluTanh] {
            let mut got = g.clone();
            gated_activation(&mut got, &u, act);
            for i in 0..n {
                let mut one = [g[i]];
                gated_activation(&mut one, &u[i..i + 1], act);
                assert_eq!(got[i].to_bits(), one[0].to_bits(), "{act:?} element {i}");
            }
        }
    }

    #[test]
    fn row_parallel_ops_are_each_row_alone() {
        // enough rows for the parallel path, a ragged fused gate, both norms, rope, the split
        let (rows, d, g) = (3 * ROW_TASK + 1, 24, ACT_CHUNK + 7);
        let val = |i: usize| ((i * 7919) % 2001) as f32 / 250.0 - 4.0;
        let x: Vec<f32> = (0..rows * d).map(val).collect();
        let w: Vec<f32> = (0..d).map(|i| val(i * 13) / 4.0).collect();
        let mut all = vec![0f32; rows * d];
        rms_norm(&x, &w, 1e-6, true, &mut all);
        let mut inplace = x.clone();
        rms_norm_inplace(&mut inplace, &w, 1e-6, false);
        let rope = Rope::new(8, 10000.0, RopeScaling::None, 4 * rows, RopeStyle::Half);
        let pos: Vec<u32> = (0..rows as u32).map(|r| 3 * r).collect();
        let mut rot = x.clone();
        rope.apply(&mut rot, &pos, d / 8);
        let parts = split_cols(&x, rows, &[5, 16, 3]);
        for r in 0..rows {
            let xr = &x[r * d..(r + 1) * d];
            let mut one = vec![0f32; d];
            rms_norm(xr, &w, 1e-6, true, &mut one);
            assert_eq!(bits(&one), bits(&all[r * d..(r + 1) * d]), "rms_norm row {r}");
            let mut one = xr.to_vec();
            rms_norm_inplace(&mut one, &w, 1e-6, false);
            assert_eq!(
                bits(&one),
                bits(&inplace[r * d..(r + 1) * d]),
                "rms_norm_inplace row {r}"
            );
            let mut one = xr.to_vec();
            rope.apply(&mut one, &pos[r..r + 1], d / 8);
            assert_eq!(bits(&one), bits(&rot[r * d..(r + 1) * d]), "rope row {r}");
            assert_eq!(bits(&parts[0][r * 5..(r + 1) * 5]), bits(&xr[..5]));
            assert_eq!(bits(&parts[1][r * 16..(r + 1) * 16]), bits(&xr[5..21]));
            assert_eq!(bits(&parts[2][r * 3..(r + 1) * 3]), bits(&xr[21..]));
        }
        for rows in [1, 2, rows] {
            let y: Vec<f32> = (0..rows * 2 * g).map(|i| val(i) / 2.0).collect();
            for act in [Activation::Silu, Activation::GeluTanh] {
                let got = gated_from_fused(&y, rows, g, act);
                for r in 0..rows {
                    let mut want = y[r * 2 * g..r * 2 * g + g].to_vec();
                    gated_activation(&mut want, &y[r * 2 * g + g..(r + 1) * 2 * g], act);
                    assert_eq!(
                        bits(&want),
                        bits(&got[r * g..(r + 1) * g]),
                        "{act:?} {rows} rows, row {r}"
                    );
                }
            }
        }
        let (mut a, b) = (x.repeat(400), x.repeat(400).iter().map(|v| v * 0.5).collect::<Vec<_>>());
        let want: Vec<f32> = a.iter().zip(&b).map(|(p, q)| p + q).collect();
        add_inplace(&mut a, &b);
        assert_eq!(bits(&a), bits(&want));
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn rope_styles_agree_up_to_a_permutation() {
        let hd = 8;
        let a = Rope::new(hd, 10000.0, RopeScaling::None, 16, RopeStyle::Half);
        let b = Rope::new(hd, 10000.0, RopeScaling::None, 16, RopeStyle::Interleaved);
        let x: Vec<f32> = (0..hd).map(|i| i as f32 + 1.0).collect();
        // interleaved layout of the same vector: pairs (i, i + half) → (2i, 2i + 1)
        let mut xi = vec![0f32; hd];
        for i in 0..hd / 2 {
            xi[2 * i] = x[i];
            xi[2 * i + 1] = x[i + hd / 2];
        }
        let mut xa = x.clone();
        a.apply(&mut xa, &[5], 1);
        b.apply(&mut xi, &[5], 1);
        for i in 0..hd / 2 {
            assert!((xa[i] - xi[2 * i]).abs() < 1e-6);
            assert!((xa[i + hd / 2] - xi[2 * i + 1]).abs() < 1e-6);
        }
        // position 0 is the identity
        let mut x0 = x.clone();
        a.apply(&mut x0, &[0], 1);
        assert_eq!(x0, x);
    }

    #[test]
    fn rms_norm_unit_rows() {
        let x = [3.0, 4.0, 0.0, 0.0];
        let mut out = [0f32; 4];
        rms_norm(&x, &[1.0; 4], 0.0, false, &mut out);
        assert!((out[0] - 1.2).abs() < 1e-6 && (out[1] - 1.6).abs() < 1e-6);
        let mut y = x;
        rms_norm_inplace(&mut y, &[0.0; 4], 0.0, true);
        assert_eq!(y, out);
    }
}
