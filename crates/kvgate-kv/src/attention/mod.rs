//! Paged attention on the CPU: each query row attends to the K/V of its own sequence, read through the
//! sequence's block table, up to and including its own position (causal), optionally within a sliding
//! window.
//!
//! Guarantees: rows are independent and each is reduced in a fixed order (positions ascending, fixed
//! SIMD lane structure), so a row's output is bitwise the same whatever else is in the batch, however
//! the rows are tiled ([`tiles`]: consecutive rows of one sequence share each K/V block read) and
//! however the work is split across threads. The caller writes a step's new K/V into the cache before calling
//! [`AttentionBackend::attend`], so rows of a prefill chunk see their own and earlier tokens. A tree
//! row ([`RowMask`]) sees the positions its mask names instead; its position is where its K/V lives,
//! its RoPE position is the model's business.

mod group;
#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
mod group512;
#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
mod lanes;
mod simd;
mod tiles;

#[cfg(test)]
pub use simd::dot8;
#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
pub(crate) use simd::AVX512;
pub(crate) use simd::{axpy_many, axpy_many2, exp_sum_inplace, max_of};
pub use simd::{dot, dot2x4, dot_fused, exp_in_place};

/// The lane of position `p` in a row's sums is `p mod LANES` ([`tiles`]: exps in lane `pos mod 8`, values
/// one position at a time; a position a tree row does not see adds an exact zero).
pub const LANES: usize = 8;

/// Positions per partition of a row's attention (partials folded in partition order).
pub const PARTITION: usize = tiles::PART;

/// One query row: which block table it reads and the position of its token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnRow {
    /// Index into the `tables` slice passed with the rows.
    pub table: u32,
    /// Position of the query token; the row attends to positions `0..=pos` (or the window's tail).
    pub pos: u32,
}

/// The positions of its own sequence a tree row sees (tree attention: a decision's options read as
/// parallel branches, a token tree of speculation): every position before `base` (the shared
/// prefix), and from `base` on those whose bit is set — bit `p − base` of `seen` (the row's own
/// position is always among them). A row without one sees `0..=pos`, causally.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RowMask {
    /// The first position the mask decides.
    pub base: u32,
    /// From `base` on, one bit per position.
    pub seen: Vec<u64>,
}

impl RowMask {
    /// Whether the row sees position `p`.
    pub fn sees(&self, p: usize) -> bool {
        let Some(i) = p.checked_sub(self.base as usize) else {
            return true;
        };
        self.seen.get(i / 64).is_some_and(|w| (w >> (i % 64)) & 1 == 1)
    }
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
    /// Per row, the tree mask of a tree row (empty when every row is causal).
    pub masks: &'a [Option<RowMask>],
}

/// What an attention implementation provides to the model's layers: store a step's K/V into its cache
/// and attend over it. The cache is the implementation's own type (host blocks here, device memory for
/// a GPU implementation); rows, slots and block tables are plain integers, so the layer code that calls
/// this is the same for every device.
pub trait AttentionBackend: Send + Sync {
    /// The cache storage this implementation reads and writes.
    type Cache;

    /// Stores the step's new K and V rows (`slots.len() × kv_heads × head_dim`) for `layer`.
    fn write_kv(&self, cache: &mut Self::Cache, layer: usize, slots: &[usize], k: &[f32], v: &[f32]);

    /// Computes attention for every query row; `out` has the shape of `query.q`.
    fn attend(&self, cache: &Self::Cache, layer: usize, query: &AttnQuery, p: &AttnParams, out: &mut [f32]);
}

/// The CPU implementation, parallel over (tile of rows, KV head) pairs with rayon.
#[derive(Debug, Default, Clone, Copy)]
pub struct CpuAttention;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::KvDtype;
    use crate::layout::CacheShape;
    use crate::quant::{KvQuant, Rotation};
    use crate::storage::{KvCache, Which};
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
        let shape = CacheShape::new(1, 2, 32, 4, dtype).unwrap();
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
        let cases = KvDtype::ALL
            .into_iter()
            .flat_map(|d| KvQuant::methods_for(d).iter().map(move |&m| (d, m)));
        for (dtype, method) in cases {
            for window in [None, Some(5)] {
                let (shape, p) = setup(dtype, window);
                let shape = shape.with_quant(method).unwrap();
                let signs = crate::quant::sign_mask(32);
                let rotates = method.rotation == crate::quant::Rotation::Hadamard;
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
                    masks: &[],
                };
                CpuAttention.attend(&cache, 0, &query, &p, &mut out);
                for (r, row) in rows.iter().enumerate() {
                    let (ks, vs) = &decoded[row.table as usize];
                    // the decoded vectors are in the cache's (rotated) basis: so is the oracle's query,
                    // and its output is rotated back
                    let mut qr = q[r * 192..(r + 1) * 192].to_vec();
                    if rotates {
                        qr.chunks_exact_mut(32).for_each(|x| crate::quant::rotate(x, &signs));
                    }
                    let mut want = naive(&qr, ks, vs, row.pos as usize, &p);
                    if rotates {
                        want.chunks_exact_mut(32)
                            .for_each(|x| crate::quant::unrotate(x, &signs));
                    }
                    for (a, b) in out[r * 192..(r + 1) * 192].iter().zip(&want) {
                        assert!(
                            (a - b).abs() < 1e-5,
                            "{dtype} {} {window:?} row {r}: {a} vs {b}",
                            method.name()
                        );
                    }
                }
            }
        }
    }

    /// A row's output does not depend on the other rows of the batch.
    #[test]
    fn exp_sum_matches_exp() {
        for n in [1usize, 7, 8, 9, 100] {
            let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 30.0 - 5.0).collect();
            let mut y = x.clone();
            let max = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let sum = exp_sum_inplace(&mut y, max);
            let z: f64 = x.iter().map(|v| ((v - max) as f64).exp()).sum();
            assert!((sum as f64 - z).abs() <= 1e-6 * z, "{sum} vs {z}");
            for (a, b) in y.iter().zip(&x) {
                let want = ((b - max) as f64).exp();
                assert!(
                    (*a as f64 - want).abs() <= 1e-6 * want.max(1e-30) + 1e-12,
                    "{a} vs {want}"
                );
            }
        }
        let mut y = vec![-1000.0, 0.0];
        assert_eq!(exp_sum_inplace(&mut y, 0.0), 1.0);
        assert_eq!(y, vec![0.0, 1.0]);
    }

    #[test]
    fn dot2x4_gives_dot8_bits() {
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        for hd in [32usize, 64, 96, 128] {
            let v = |rng: &mut ChaCha8Rng| -> Vec<f32> { (0..hd).map(|_| rng.random_range(-3.0..3.0)).collect() };
            let (q0, q1) = (v(&mut rng), v(&mut rng));
            let keys: Vec<Vec<f32>> = (0..8).map(|_| v(&mut rng)).collect();
            let k8: [&[f32]; 8] = std::array::from_fn(|j| keys[j].as_slice());
            let (a, b) = (dot8(&q0, &k8), dot8(&q1, &k8));
            for half in 0..2 {
                let k4: [&[f32]; 4] = std::array::from_fn(|j| keys[4 * half + j].as_slice());
                let s = dot2x4(&q0, &q1, &k4);
                for j in 0..4 {
                    assert_eq!(
                        s[j].to_bits(),
                        a[4 * half + j].to_bits(),
                        "hd {hd} q0 k{}",
                        4 * half + j
                    );
                    assert_eq!(
                        s[4 + j].to_bits(),
                        b[4 * half + j].to_bits(),
                        "hd {hd} q1 k{}",
                        4 * half + j
                    );
                }
            }
        }
    }

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
                masks: &[],
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
                masks: &[],
            },
            &p,
            &mut out,
        );
        assert_eq!(&out[4 * 192..5 * 192], alone.as_slice());
    }

    /// On keys and values with outlier channels (as real ones have), rotation and fine scales each
    /// bring nvfp4's attention output closer to the float32 cache's, and fp8's stays within its precision.
    #[test]
    fn methods_shrink_the_error_on_outlier_channels() {
        let (shape, p) = setup(KvDtype::F32, None);
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let n = 64;
        let mut data = vec![];
        for _ in 0..n {
            let mut k: Vec<f32> = (0..64).map(|_| rng.random_range(-1.0..1.0)).collect();
            let mut v: Vec<f32> = (0..64).map(|_| rng.random_range(-1.0..1.0)).collect();
            k[5] += 12.0;
            k[40] -= 9.0;
            v[20] *= 8.0;
            data.push((k, v));
        }
        let q: Vec<f32> = (0..4 * 192).map(|_| rng.random_range(-1.0..1.0)).collect();
        let rows: Vec<AttnRow> = (0..4)
            .map(|i| AttnRow {
                table: i,
                pos: (n - 1) as u32,
            })
            .collect();
        let table: Vec<u32> = (0..(n / 4) as u32).collect();
        let tables = [table.as_slice(); 4];
        let run = |dtype: KvDtype, method: KvQuant| {
            let mut c = KvCache::new(shape.with_dtype(dtype).unwrap().with_quant(method).unwrap(), n / 4);
            c.set_scales(0, 0.05, 0.05).unwrap();
            for (t, (k, v)) in data.iter().enumerate() {
                c.write(0, &[t], k, v);
            }
            let mut out = vec![0f32; q.len()];
            CpuAttention.attend(
                &c,
                0,
                &AttnQuery {
                    q: &q,
                    rows: &rows,
                    tables: &tables,
                    masks: &[],
                },
                &p,
                &mut out,
            );
            out
        };
        let exact = run(KvDtype::F32, KvQuant::PLAIN);
        let err = |dtype, method| {
            let o = run(dtype, method);
            let e: f32 = o.iter().zip(&exact).map(|(a, b)| (a - b) * (a - b)).sum();
            (e / exact.iter().map(|x| x * x).sum::<f32>()).sqrt()
        };
        let [plain, rotation, fine, both] = [0, 1, 2, 3].map(|i| err(KvDtype::Nvfp4, KvQuant::ALL[i]));
        assert!(
            rotation < plain && fine < plain && both < plain,
            "{plain} {rotation} {fine} {both}"
        );
        let mut fp8_best = f32::MAX;
        for m in KvQuant::ALL {
            let e = err(KvDtype::Fp8E4m3, m);
            assert!(e < 0.05, "fp8 {}: {e}", m.name());
            fp8_best = fp8_best.min(e);
        }
        // int8 (a scale per 32 elements, 8 uniform bits) is closer than the best fp8 method, and with the
        // rotation spreading the outliers several times closer (measured: 0.019 plain, 0.0057 rotated,
        // against fp8's best 0.032)
        for m in KvQuant::INT8 {
            let e = err(KvDtype::Int8, m);
            let bound = if m.rotation == Rotation::Hadamard {
                fp8_best / 4.0
            } else {
                fp8_best
            };
            assert!(e < bound, "int8 {}: {e} vs fp8 {fp8_best}", m.name());
        }
    }

    /// Offsets (`smooth`) are exact — the output over a smoothed cache is the output over the
    /// unsmoothed values, with and without a softcap — and, when they are the channel means, they shrink
    /// the quantization error on keys and values that share a large common part.
    #[test]
    fn smoothing_is_exact_and_shrinks_the_error() {
        let mut rng = ChaCha8Rng::seed_from_u64(12);
        let n = 64;
        let k_mu: Vec<f32> = (0..64).map(|_| rng.random_range(-6.0..6.0)).collect();
        let v_mu: Vec<f32> = (0..64).map(|_| rng.random_range(-3.0..3.0)).collect();
        let data: Vec<(Vec<f32>, Vec<f32>)> = (0..n)
            .map(|_| {
                let k = k_mu.iter().map(|m| m + rng.random_range(-1.0..1.0)).collect();
                let v = v_mu.iter().map(|m| m + rng.random_range(-0.5..0.5)).collect();
                (k, v)
            })
            .collect();
        let q: Vec<f32> = (0..2 * 192).map(|_| rng.random_range(-1.0..1.0)).collect();
        let rows = [AttnRow { table: 0, pos: 63 }, AttnRow { table: 0, pos: 40 }];
        let table: Vec<u32> = (0..(n / 4) as u32).collect();
        let tables = [table.as_slice()];
        for softcap in [None, Some(1.0)] {
            let (shape, mut p) = setup(KvDtype::F32, None);
            p.softcap = softcap;
            let run = |dtype: KvDtype, method: KvQuant, offsets: Option<(&[f32], &[f32])>| {
                let mut c = KvCache::new(shape.with_dtype(dtype).unwrap().with_quant(method).unwrap(), n / 4);
                c.set_scales(0, 0.05, 0.05).unwrap();
                if let Some((k, v)) = offsets {
                    c.set_offsets(0, k.to_vec(), v.to_vec()).unwrap();
                }
                for (t, (k, v)) in data.iter().enumerate() {
                    c.write(0, &[t], k, v);
                }
                let mut out = vec![0f32; q.len()];
                let query = AttnQuery {
                    q: &q,
                    rows: &rows,
                    tables: &tables,
                    masks: &[],
                };
                CpuAttention.attend(&c, 0, &query, &p, &mut out);
                out
            };
            let exact = run(KvDtype::F32, KvQuant::PLAIN, None);
            let rel = |o: &[f32]| {
                let e: f32 = o.iter().zip(&exact).map(|(a, b)| (a - b) * (a - b)).sum();
                (e / exact.iter().map(|x| x * x).sum::<f32>()).sqrt()
            };
            let smooth = KvQuant::ALL[4];
            // exact: arbitrary offsets change nothing but rounding
            let odd: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin() * 4.0).collect();
            let plain = rel(&run(KvDtype::Fp8E4m3, KvQuant::PLAIN, None));
            let odd_err = rel(&run(KvDtype::Fp8E4m3, smooth, Some((&odd, &odd))));
            assert!(
                odd_err < 2.0 * plain + 0.01,
                "{softcap:?}: arbitrary offsets {odd_err} vs {plain}"
            );
            let means = rel(&run(KvDtype::Fp8E4m3, smooth, Some((&k_mu, &v_mu))));
            assert!(means < 0.5 * plain, "{softcap:?}: means {means} vs plain {plain}");
            let nv_plain = rel(&run(KvDtype::Nvfp4, KvQuant::PLAIN, None));
            let nv_means = rel(&run(KvDtype::Nvfp4, smooth, Some((&k_mu, &v_mu))));
            assert!(nv_means < 0.5 * nv_plain, "{softcap:?}: nvfp4 {nv_means} vs {nv_plain}");
        }
    }
}

#[cfg(test)]
#[path = "tree_tests.rs"]
mod tree_tests;
