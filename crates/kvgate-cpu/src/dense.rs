//! A batch-invariant f32 matmul for dense weights: `y[r][c] = dot(x[r], w[c])`, every output computed by
//! the same fixed-order dot product whatever the number of rows, so a row's result never depends on the
//! batch. Cache-blocked over column tiles (a tile of weight rows stays hot while every activation row
//! passes over it) and parallel over tiles.

use kvgate_kv::dot_fused as dot;
use rayon::prelude::*;

/// Columns per tile: 64 weight rows of a few thousand floats stay in L2.
const TILE: usize = 64;

/// `x` is `m × k`, `w` is `n × k` (row-major, one output column per row); returns `m × n`.
pub fn matmul(x: &[f32], m: usize, k: usize, w: &[f32], n: usize) -> Vec<f32> {
    debug_assert_eq!(x.len(), m * k);
    debug_assert_eq!(w.len(), n * k);
    let tiles = n.div_ceil(TILE);
    let cols: Vec<Vec<f32>> = (0..tiles)
        .into_par_iter()
        .map(|t| {
            let c0 = t * TILE;
            let c1 = (c0 + TILE).min(n);
            let mut out = vec![0f32; m * (c1 - c0)];
            for r in 0..m {
                let xr = &x[r * k..(r + 1) * k];
                for c in c0..c1 {
                    out[r * (c1 - c0) + c - c0] = dot(xr, &w[c * k..(c + 1) * k]);
                }
            }
            out
        })
        .collect();
    let mut y = vec![0f32; m * n];
    for (t, tile) in cols.iter().enumerate() {
        let c0 = t * TILE;
        let width = tile.len() / m.max(1);
        for r in 0..m {
            y[r * n + c0..r * n + c0 + width].copy_from_slice(&tile[r * width..(r + 1) * width]);
        }
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_naive_and_is_batch_invariant() {
        let (m, k, n) = (5, 37, 131);
        let x: Vec<f32> = (0..m * k).map(|i| ((i * 7919) % 97) as f32 / 97.0 - 0.5).collect();
        let w: Vec<f32> = (0..n * k).map(|i| ((i * 104729) % 89) as f32 / 89.0 - 0.5).collect();
        let y = matmul(&x, m, k, &w, n);
        for r in 0..m {
            for c in 0..n {
                let want: f64 = (0..k).map(|i| x[r * k + i] as f64 * w[c * k + i] as f64).sum();
                assert!((y[r * n + c] as f64 - want).abs() < 1e-4);
            }
            let alone = matmul(&x[r * k..(r + 1) * k], 1, k, &w, n);
            assert_eq!(&y[r * n..(r + 1) * n], alone.as_slice());
        }
    }
}
