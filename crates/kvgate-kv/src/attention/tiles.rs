//! [`CpuAttention`]'s `attend`: rows are gathered into tiles of up to [`TILE_ROWS`] consecutive rows
//! reading the same block table (the rows of one sequence in a prefill chunk), and each (tile, KV head)
//! task reads every K and V block it needs once for the whole tile instead of once per row: a
//! 2,500-token prompt re-read its whole K/V for every row before.
//!
//! Each row's arithmetic is exactly the untiled one: its scores by [`dot2x4`] (each score by
//! [`super::dot8`]'s arithmetic, whichever keys and heads share the call), its softmax over its own scores, its output accumulated over positions in
//! ascending order. So a row's output does not depend on its tile, its batch or the thread split.

use rayon::prelude::*;

use super::{axpy_many, dot2x4, softmax_inplace, AttentionBackend, AttnParams, AttnQuery, CpuAttention};
use crate::quant;
use crate::storage::{KvCache, LayerCache, Which};

/// Rows per tile.
const TILE_ROWS: usize = 16;

/// Rows `lo..hi` of the batch that read one block table.
fn tiles(query: &AttnQuery) -> Vec<(usize, usize)> {
    let mut out = vec![];
    let mut lo = 0;
    for r in 1..=query.rows.len() {
        if r == query.rows.len() || r - lo == TILE_ROWS || query.rows[r].table != query.rows[lo].table {
            out.push((lo, r));
            lo = r;
        }
    }
    out
}

/// The blocks covering positions `lo..=hi`: `(block index, first, last)` with `first..=last` the
/// offsets inside the block.
fn blocks(lo: usize, hi: usize, bs: usize) -> impl Iterator<Item = (usize, usize, usize)> {
    (lo / bs..=hi / bs).map(move |blk| {
        let first = if blk == lo / bs { lo % bs } else { 0 };
        (blk, first, (hi - blk * bs).min(bs - 1))
    })
}

/// Per-task buffers, kept per thread across tasks and calls: a long prompt's scores are megabytes,
/// and a fresh allocation of that size costs page faults on every call.
#[derive(Default)]
struct Scratch {
    decoded: Vec<f32>,
    zeros: Vec<f32>,
    scores: Vec<f32>,
}

/// One (tile, KV head) task: the outputs of the tile's rows for the group of query heads on `kvh`,
/// `rows × group × head_dim`.
#[allow(clippy::too_many_arguments)]
fn tile_head(
    lc: &LayerCache,
    bs: usize,
    query: &AttnQuery,
    kbias: Option<&[f32]>,
    p: &AttnParams,
    (r0, r1): (usize, usize),
    kvh: usize,
    sc: &mut Scratch,
) -> Vec<f32> {
    let hd = p.head_dim;
    let group = p.num_heads / p.num_kv_heads;
    let row_len = p.num_heads * hd;
    let table = query.tables[query.rows[r0].table as usize];
    // Each row attends to positions start..=pos.
    let span: Vec<(usize, usize)> = query.rows[r0..r1]
        .iter()
        .map(|row| {
            let pos = row.pos as usize;
            let start = match p.window {
                Some(w) if pos + 1 > w => pos + 1 - w,
                _ => 0,
            };
            (start, pos)
        })
        .collect();
    let lo = span.iter().map(|s| s.0).min().unwrap_or(0);
    let hi = span.iter().map(|s| s.1).max().unwrap_or(0);
    // Scores of row i, query head g: scores[at[i] + g·n_i ..][..n_i].
    let mut at = Vec::with_capacity(span.len());
    let mut total = 0;
    for &(start, pos) in &span {
        at.push(total);
        total += group * (pos + 1 - start);
    }
    sc.decoded.resize(bs * hd, 0.0);
    sc.zeros.resize(hd, 0.0);
    sc.scores.clear();
    sc.scores.resize(total, 0.0);
    let Scratch { decoded, zeros, scores } = sc;
    let qrow = |i: usize, g: usize| {
        let o = (r0 + i) * row_len + (kvh * group + g) * hd;
        &query.q[o..o + hd]
    };
    // The part of block `blk` (first..=last within it) that row i reads, if any.
    let part = |i: usize, blk: usize, first: usize, last: usize| {
        let (start, pos) = span[i];
        let a = (blk * bs + first).max(start);
        let b = (blk * bs + last).min(pos);
        (a <= b).then(|| (a - blk * bs, b - blk * bs))
    };
    for (blk, first, last) in blocks(lo, hi, bs) {
        let keys = lc.block_vectors(Which::K, table[blk] as usize, kvh, first, last + 1, decoded);
        for (i, &(start, pos)) in span.iter().enumerate() {
            let Some((f, l)) = part(i, blk, first, last) else {
                continue;
            };
            let n = pos + 1 - start;
            // Keys four at a time (a short group padded with zero keys) against query heads two at a
            // time (an odd last head paired with itself, its copy discarded).
            let mut j0 = f;
            while j0 <= l {
                let cnt = (l + 1 - j0).min(4);
                let mut ks: [&[f32]; 4] = [zeros.as_slice(); 4];
                for (j, k) in ks.iter_mut().enumerate().take(cnt) {
                    *k = &keys[(j0 + j) * hd..(j0 + j + 1) * hd];
                }
                let idx = blk * bs + j0 - start;
                for g in (0..group).step_by(2) {
                    let g1 = (g + 1).min(group - 1);
                    let s8 = dot2x4(qrow(i, g), qrow(i, g1), &ks);
                    for (h, half) in [(g, &s8[..4]), (g + 1, &s8[4..])] {
                        if h >= group {
                            continue;
                        }
                        for (j, &v) in half.iter().enumerate().take(cnt) {
                            let mut s = v * p.scale;
                            if let Some(b) = kbias {
                                s += b[(r0 + i) * p.num_heads + kvh * group + h];
                            }
                            if let Some(cap) = p.softcap {
                                s = cap * (s / cap).tanh();
                            }
                            scores[at[i] + h * n + idx + j] = s;
                        }
                    }
                }
                j0 += cnt;
            }
        }
    }
    for (i, &(start, pos)) in span.iter().enumerate() {
        let n = pos + 1 - start;
        for g in 0..group {
            softmax_inplace(&mut scores[at[i] + g * n..at[i] + (g + 1) * n]);
        }
    }
    let mut out = vec![0f32; span.len() * group * hd];
    for (blk, first, last) in blocks(lo, hi, bs) {
        let vals = lc.block_vectors(Which::V, table[blk] as usize, kvh, first, last + 1, decoded);
        for (i, &(start, pos)) in span.iter().enumerate() {
            let Some((f, l)) = part(i, blk, first, last) else {
                continue;
            };
            let n = pos + 1 - start;
            let o = &mut out[i * group * hd..(i + 1) * group * hd];
            let idx = blk * bs + f - start;
            for g in 0..group {
                let ws = &scores[at[i] + g * n + idx..at[i] + g * n + idx + (l + 1 - f)];
                axpy_many(&mut o[g * hd..(g + 1) * hd], ws, &vals[f * hd..(l + 1) * hd]);
            }
        }
    }
    out
}

impl AttentionBackend for CpuAttention {
    type Cache = KvCache;

    fn write_kv(&self, cache: &mut KvCache, layer: usize, slots: &[usize], k: &[f32], v: &[f32]) {
        cache.write(layer, slots, k, v);
    }

    fn attend(&self, cache: &KvCache, layer: usize, query: &AttnQuery, p: &AttnParams, out: &mut [f32]) {
        let hd = p.head_dim;
        let group = p.num_heads / p.num_kv_heads;
        let lc = cache.layer(layer);
        // K offsets take q·offset from every score of a query: softmax does not see it, a softcap does,
        // so then it is added back (scaled, before the cap).
        let kbias: Option<Vec<f32>> = match (p.softcap, lc.offsets(Which::K)) {
            (Some(_), Some(mu)) => Some(
                query
                    .q
                    .chunks_exact(hd)
                    .enumerate()
                    .map(|(i, q)| {
                        let kvh = (i % p.num_heads) / group;
                        super::dot(q, &mu[kvh * hd..(kvh + 1) * hd]) * p.scale
                    })
                    .collect(),
            ),
            _ => None,
        };
        match cache.rotation_signs() {
            None => attend_in_cache_basis(cache, layer, query, kbias.as_deref(), p, out),
            Some(signs) => {
                // The cache holds R·k and R·v: scores from R·q (q·k = Rq·Rk), outputs rotated back.
                let mut q = query.q.to_vec();
                q.chunks_exact_mut(hd).for_each(|x| quant::rotate(x, signs));
                let rotated = AttnQuery { q: &q, ..*query };
                attend_in_cache_basis(cache, layer, &rotated, kbias.as_deref(), p, out);
                out.chunks_exact_mut(hd).for_each(|x| quant::unrotate(x, signs));
            }
        }
        // V offsets: a row's weights sum to one, so its offset comes back whole.
        if let Some(mu) = lc.offsets(Which::V) {
            for (i, o) in out.chunks_exact_mut(hd).enumerate() {
                let kvh = (i % p.num_heads) / group;
                o.iter_mut()
                    .zip(&mu[kvh * hd..(kvh + 1) * hd])
                    .for_each(|(a, b)| *a += b);
            }
        }
    }
}

/// [`CpuAttention::attend`] with queries and outputs in the basis the cache stores.
fn attend_in_cache_basis(
    cache: &KvCache,
    layer: usize,
    query: &AttnQuery,
    kbias: Option<&[f32]>,
    p: &AttnParams,
    out: &mut [f32],
) {
    let hd = p.head_dim;
    let group = p.num_heads / p.num_kv_heads;
    let row_len = p.num_heads * hd;
    debug_assert_eq!(query.q.len(), query.rows.len() * row_len);
    debug_assert_eq!(out.len(), query.rows.len() * row_len);
    let lc = cache.layer(layer);
    let bs = cache.shape().block_size;
    let tiles = tiles(query);
    let tasks: Vec<((usize, usize), usize)> = tiles
        .iter()
        .flat_map(|&t| (0..p.num_kv_heads).map(move |h| (t, h)))
        .collect();
    let parts: Vec<Vec<f32>> = tasks
        .par_iter()
        .map_init(Scratch::default, |sc, &(tile, kvh)| {
            tile_head(lc, bs, query, kbias, p, tile, kvh, sc)
        })
        .collect();
    for (&((r0, _), kvh), part) in tasks.iter().zip(&parts) {
        for (i, o) in part.chunks_exact(group * hd).enumerate() {
            let at = (r0 + i) * row_len + kvh * group * hd;
            out[at..at + group * hd].copy_from_slice(o);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::AttnRow;
    use crate::dtype::KvDtype;
    use crate::layout::CacheShape;
    use crate::quant::KvQuant;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// A prefill-like batch (two sequences, 37 and 5 consecutive rows: several tiles, a partial one, a
    /// table change mid-tile) gives each row exactly its output alone, for every dtype, with and
    /// without a sliding window.
    #[test]
    fn tiled_rows_equal_rows_alone() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let cases = KvDtype::ALL
            .into_iter()
            .flat_map(|d| KvQuant::methods_for(d).iter().map(move |&m| (d, m)));
        for (dtype, method) in cases {
            for window in [None, Some(7)] {
                let shape = CacheShape::new(1, 2, 32, 4, dtype).unwrap().with_quant(method).unwrap();
                let p = AttnParams {
                    num_heads: 6,
                    num_kv_heads: 2,
                    head_dim: 32,
                    scale: 0.2,
                    window,
                    softcap: Some(30.0),
                };
                let mut cache = KvCache::new(shape, 16);
                for slot in 0..64 {
                    let k: Vec<f32> = (0..64).map(|_| rng.random_range(-2.0..2.0)).collect();
                    let v: Vec<f32> = (0..64).map(|_| rng.random_range(-2.0..2.0)).collect();
                    cache.write(0, &[slot], &k, &v);
                }
                let (t0, t1): (Vec<u32>, Vec<u32>) = ((0..10).collect(), (10..16).collect());
                let tables = [t0.as_slice(), t1.as_slice()];
                let mut rows: Vec<AttnRow> = (0..37).map(|i| AttnRow { table: 0, pos: 2 + i }).collect();
                rows.extend((0..5).map(|i| AttnRow { table: 1, pos: 10 + i }));
                let row_len = 6 * 32;
                let q: Vec<f32> = (0..rows.len() * row_len).map(|_| rng.random_range(-1.0..1.0)).collect();
                let mut out = vec![0f32; q.len()];
                let query = AttnQuery {
                    q: &q,
                    rows: &rows,
                    tables: &tables,
                };
                CpuAttention.attend(&cache, 0, &query, &p, &mut out);
                for (r, row) in rows.iter().enumerate() {
                    let one = [*row];
                    let qr = &q[r * row_len..(r + 1) * row_len];
                    let mut alone = vec![0f32; row_len];
                    let query = AttnQuery {
                        q: qr,
                        rows: &one,
                        tables: &tables,
                    };
                    CpuAttention.attend(&cache, 0, &query, &p, &mut alone);
                    assert_eq!(
                        &out[r * row_len..(r + 1) * row_len],
                        alone.as_slice(),
                        "{dtype:?} {} {window:?} row {r}",
                        method.name()
                    );
                }
            }
        }
    }
}
