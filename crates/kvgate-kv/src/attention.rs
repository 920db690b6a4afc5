//! Paged attention on the CPU: each query row attends to the K/V of its own sequence, read through the
//! sequence's block table, up to and including its own position (causal), optionally within a sliding
//! window.
//!
//! Guarantees: rows are independent and each is reduced in a fixed order (positions ascending, fixed
//! SIMD lane structure), so a row's output is bitwise the same whatever else is in the batch and however
//! the work is split across threads. The caller writes a step's new K/V into the cache before calling
//! [`AttentionBackend::attend`], so rows of a prefill chunk see their own and earlier tokens.

use rayon::prelude::*;

use crate::storage::{KvCache, Which};

/// One query row: which block table it reads and the position of its token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnRow {
    /// Index into the `tables` slice passed with the rows.
    pub table: u32,
    /// Position of the query token; the row attends to positions `0..=pos` (or the window's tail).
    pub pos: u32,
}

/// Per-layer attention parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnParams {
    /// Query heads.
    pub num_heads: usize,
    /// KV heads (query heads are grouped onto them, GQA).
    pub num_kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Multiplier of q·k (usually `1/sqrt(head_dim)`).
    pub scale: f32,
    /// Sliding window: attend only to the last `w` positions (including the row's own).
    pub window: Option<usize>,
    /// Soft-capping of the scores: `cap · tanh(s / cap)`.
    pub softcap: Option<f32>,
}

/// The query side of one attention call: `q` is `rows × heads × head_dim`; each row reads the block
/// table `tables[row.table]`.
#[derive(Debug, Clone, Copy)]
pub struct AttnQuery<'a> {
    /// Queries.
    pub q: &'a [f32],
    /// One entry per query row.
    pub rows: &'a [AttnRow],
    /// Block tables of the sequences in the batch.
    pub tables: &'a [&'a [u32]],
}

/// What an attention implementation (CPU here, CUDA in `kvgate-cuda`) provides to the model.
pub trait AttentionBackend: Send + Sync {
    /// Stores the step's new K and V rows (`slots.len() × kv_heads × head_dim`) for `layer`.
    fn write_kv(&self, cache: &mut KvCache, layer: usize, slots: &[usize], k: &[f32], v: &[f32]) {
        cache.write(layer, slots, k, v);
    }

    /// Computes attention for every query row; `out` has the shape of `query.q`.
    fn attend(&self, cache: &KvCache, layer: usize, query: &AttnQuery, p: &AttnParams, out: &mut [f32]);
}

/// The CPU implementation, parallel over (row, KV head) pairs with rayon.
#[derive(Debug, Default, Clone, Copy)]
pub struct CpuAttention;

/// Dot product with a fixed 8-lane reduction order (vectorizes; deterministic for a given length).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut tail = 0f32;
    for (x, y) in ra.iter().zip(rb) {
        tail += x * y;
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

#[inline]
fn axpy(acc: &mut [f32], w: f32, x: &[f32]) {
    for (a, b) in acc.iter_mut().zip(x) {
        *a += w * b;
    }
}

impl AttentionBackend for CpuAttention {
    fn attend(&self, cache: &KvCache, layer: usize, query: &AttnQuery, p: &AttnParams, out: &mut [f32]) {
        let (q, rows, tables) = (query.q, query.rows, query.tables);
        let hd = p.head_dim;
        let group = p.num_heads / p.num_kv_heads;
        let row_len = p.num_heads * hd;
        debug_assert_eq!(q.len(), rows.len() * row_len);
        debug_assert_eq!(out.len(), rows.len() * row_len);
        let lc = cache.layer(layer);
        let bs = cache.shape().block_size;
        // One task per (row, kv head): the group's query heads are contiguous in `out`.
        out.par_chunks_mut(group * hd).enumerate().for_each_init(
            || (vec![0f32; hd], Vec::<f32>::new()),
            |(scratch, scores), (task, o)| {
                let (r, kvh) = (task / p.num_kv_heads, task % p.num_kv_heads);
                let row = rows[r];
                let table = tables[row.table as usize];
                let pos = row.pos as usize;
                let start = match p.window {
                    Some(w) if pos + 1 > w => pos + 1 - w,
                    _ => 0,
                };
                let n = pos + 1 - start;
                let qs = &q[r * row_len + kvh * group * hd..r * row_len + (kvh + 1) * group * hd];
                scores.clear();
                scores.resize(group * n, 0.0);
                for (i, t) in (start..=pos).enumerate() {
                    let k = lc.vector(Which::K, table[t / bs] as usize, kvh, t % bs, scratch);
                    for g in 0..group {
                        let mut s = dot(&qs[g * hd..(g + 1) * hd], k) * p.scale;
                        if let Some(cap) = p.softcap {
                            s = cap * (s / cap).tanh();
                        }
                        scores[g * n + i] = s;
                    }
                }
                for g in 0..group {
                    let sc = &mut scores[g * n..(g + 1) * n];
                    let max = sc.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
                    let mut sum = 0f32;
                    for x in sc.iter_mut() {
                        *x = (*x - max).exp();
                        sum += *x;
                    }
                    let inv = 1.0 / sum;
                    for x in sc.iter_mut() {
                        *x *= inv;
                    }
                }
                o.fill(0.0);
                for (i, t) in (start..=pos).enumerate() {
                    let v = lc.vector(Which::V, table[t / bs] as usize, kvh, t % bs, scratch);
                    for g in 0..group {
                        axpy(&mut o[g * hd..(g + 1) * hd], scores[g * n + i], v);
                    }
                }
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::KvDtype;
    use crate::layout::CacheShape;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Dense causal attention over explicit K/V, the oracle.
    fn naive(q: &[f32], k: &[Vec<f32>], v: &[Vec<f32>], pos: usize, p: &AttnParams) -> Vec<f32> {
        let hd = p.head_dim;
        let group = p.num_heads / p.num_kv_heads;
        let mut out = vec![0f32; p.num_heads * hd];
        let start = p.window.map_or(0, |w| (pos + 1).saturating_sub(w));
        for h in 0..p.num_heads {
            let kvh = h / group;
            let qh = &q[h * hd..(h + 1) * hd];
            let s: Vec<f64> = (start..=pos)
                .map(|t| {
                    let kk = &k[t][kvh * hd..(kvh + 1) * hd];
                    qh.iter().zip(kk).map(|(a, b)| (*a as f64) * (*b as f64)).sum::<f64>() * p.scale as f64
                })
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = e.iter().sum();
            for (i, t) in (start..=pos).enumerate() {
                for d in 0..hd {
                    out[h * hd + d] += (e[i] / z * v[t][kvh * hd + d] as f64) as f32;
                }
            }
        }
        out
    }

    fn setup(dtype: KvDtype, window: Option<usize>) -> (CacheShape, AttnParams) {
        let shape = CacheShape {
            num_layers: 1,
            num_kv_heads: 2,
            head_dim: 32,
            block_size: 4,
            dtype,
        };
        let p = AttnParams {
            num_heads: 6,
            num_kv_heads: 2,
            head_dim: 32,
            scale: 1.0 / (32f32).sqrt(),
            window,
            softcap: None,
        };
        (shape, p)
    }

    /// Two sequences with scattered block tables; every row matches dense attention over the values the
    /// cache holds (decoded), for every dtype.
    #[test]
    fn matches_dense_attention_over_the_decoded_cache() {
        for dtype in KvDtype::ALL {
            for window in [None, Some(5)] {
                let (shape, p) = setup(dtype, window);
                let mut rng = ChaCha8Rng::seed_from_u64(7);
                let mut cache = KvCache::new(shape, 16);
                let tables: Vec<Vec<u32>> = vec![vec![5, 2, 9, 11], vec![3, 0, 14]];
                let lens = [13usize, 10];
                type Decoded = (Vec<Vec<f32>>, Vec<Vec<f32>>);
                let mut decoded: Vec<Decoded> = vec![];
                for (s, table) in tables.iter().enumerate() {
                    let (mut ks, mut vs) = (vec![], vec![]);
                    for t in 0..lens[s] {
                        let k: Vec<f32> = (0..64).map(|_| rng.random_range(-2.0..2.0)).collect();
                        let v: Vec<f32> = (0..64).map(|_| rng.random_range(-2.0..2.0)).collect();
                        let slot = table[t / 4] as usize * 4 + t % 4;
                        cache.write(0, &[slot], &k, &v);
                        let mut scratch = vec![0f32; 32];
                        let mut dk = vec![];
                        let mut dv = vec![];
                        for h in 0..2 {
                            dk.extend_from_slice(cache.layer(0).vector(
                                Which::K,
                                table[t / 4] as usize,
                                h,
                                t % 4,
                                &mut scratch,
                            ));
                            dv.extend_from_slice(cache.layer(0).vector(
                                Which::V,
                                table[t / 4] as usize,
                                h,
                                t % 4,
                                &mut scratch,
                            ));
                        }
                        ks.push(dk);
                        vs.push(dv);
                    }
                    decoded.push((ks, vs));
                }
                let rows = vec![
                    AttnRow { table: 0, pos: 12 },
                    AttnRow { table: 1, pos: 0 },
                    AttnRow { table: 0, pos: 3 },
                    AttnRow { table: 1, pos: 9 },
                ];
                let q: Vec<f32> = (0..rows.len() * 6 * 32).map(|_| rng.random_range(-1.0..1.0)).collect();
                let mut out = vec![0f32; q.len()];
                let trefs: Vec<&[u32]> = tables.iter().map(|t| t.as_slice()).collect();
                let query = AttnQuery {
                    q: &q,
                    rows: &rows,
                    tables: &trefs,
                };
                CpuAttention.attend(&cache, 0, &query, &p, &mut out);
                for (r, row) in rows.iter().enumerate() {
                    let (ks, vs) = &decoded[row.table as usize];
                    let want = naive(&q[r * 192..(r + 1) * 192], ks, vs, row.pos as usize, &p);
                    for (a, b) in out[r * 192..(r + 1) * 192].iter().zip(&want) {
                        assert!((a - b).abs() < 1e-5, "{dtype} {window:?} row {r}: {a} vs {b}");
                    }
                }
            }
        }
    }

    /// A row's output does not depend on the other rows of the batch.
    #[test]
    fn batch_invariant() {
        let (shape, p) = setup(KvDtype::F32, None);
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut cache = KvCache::new(shape, 8);
        for slot in 0..32 {
            let k: Vec<f32> = (0..64).map(|_| rng.random_range(-2.0..2.0)).collect();
            cache.write(0, &[slot], &k, &k);
        }
        let table: Vec<u32> = (0..8).collect();
        let tables = [table.as_slice()];
        let q: Vec<f32> = (0..192).map(|_| rng.random_range(-1.0..1.0)).collect();
        let mut alone = vec![0f32; 192];
        let one = [AttnRow { table: 0, pos: 30 }];
        CpuAttention.attend(
            &cache,
            0,
            &AttnQuery {
                q: &q,
                rows: &one,
                tables: &tables,
            },
            &p,
            &mut alone,
        );
        let mut big_q = vec![];
        let mut rows = vec![];
        for i in 0..9 {
            big_q.extend(q.iter().map(|x| x * (i as f32 + 1.0) / 3.0));
            rows.push(AttnRow {
                table: 0,
                pos: 3 * i as u32,
            });
        }
        big_q[4 * 192..5 * 192].copy_from_slice(&q);
        rows[4].pos = 30;
        let mut out = vec![0f32; big_q.len()];
        CpuAttention.attend(
            &cache,
            0,
            &AttnQuery {
                q: &big_q,
                rows: &rows,
                tables: &tables,
            },
            &p,
            &mut out,
        );
        assert_eq!(&out[4 * 192..5 * 192], alone.as_slice());
    }
}
