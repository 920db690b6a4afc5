//! Paged attention on the CPU: each query row attends to the K/V of its own sequence, read through the
//! sequence's block table, up to and including its own position (causal), optionally within a sliding
//! window.
//!
//! Guarantees: rows are independent and each is reduced in a fixed order (positions ascending, fixed
//! SIMD lane structure), so a row's output is bitwise the same whatever else is in the batch, however
//! the rows are tiled ([`tiles`]: consecutive rows of one sequence share each K/V block read) and
//! however the work is split across threads. The caller writes a step's new K/V into the cache before calling
//! [`AttentionBackend::attend`], so rows of a prefill chunk see their own and earlier tokens.

mod tiles;

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

/// Eight dot products `q · ks[j]` at once. Every result is computed by the same arithmetic whichever
/// slot `j` it is in (AVX2: a fixed 8-lane accumulation and a fixed `hadd` tree; otherwise [`dot`]).
/// (The tests' reference for [`dot2x4`].)
#[cfg(test)]
pub fn dot8(q: &[f32], ks: &[&[f32]; 8]) -> [f32; 8] {
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
    if q.len().is_multiple_of(8) {
        // SAFETY: avx2 and fma are enabled at compile time; every `ks[j]` has `q.len()` elements (the
        // caller passes head_dim-long vectors) and loads stay below `q.len()`.
        return unsafe { avx2::dot8(q, ks) };
    }
    std::array::from_fn(|j| dot(q, ks[j]))
}

/// Eight dot products at once, two queries × four keys: `[q0·k0, q0·k1, q0·k2, q0·k3, q1·k0, …, q1·k3]`,
/// each by exactly [`dot8`]'s arithmetic (its own 8-lane FMA chain, the same `hadd` tree), with a
/// quarter fewer loads per multiply-add than two [`dot8`] calls: the score kernel of a tile's rows.
#[inline]
pub fn dot2x4(q0: &[f32], q1: &[f32], ks: &[&[f32]; 4]) -> [f32; 8] {
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
    if q0.len().is_multiple_of(8) {
        // SAFETY: avx2 and fma are enabled at compile time; `q1` and every `ks[j]` have at least
        // `q0.len()` elements (head_dim-long vectors) and loads stay below `q0.len()`.
        return unsafe { avx2::dot2x4(q0, q1, ks) };
    }
    std::array::from_fn(|j| dot(if j < 4 { q0 } else { q1 }, ks[j % 4]))
}

#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
mod avx2 {
    use std::arch::x86_64::*;

    /// exp(x) for x ≤ 0 (Cephes-style: 2^n · p(r), r = x − n·ln2 in two steps, degree-6 polynomial).
    #[inline(always)]
    unsafe fn exp8(x_in: __m256) -> __m256 {
        let floor = _mm256_set1_ps(-87.3);
        let keep = _mm256_cmp_ps(x_in, floor, _CMP_GE_OQ);
        let x = _mm256_max_ps(x_in, floor);
        let n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)), 0x08);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_145_75), x);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428_606_8e-6), r);
        let mut p = _mm256_set1_ps(1.987_569_1e-4);
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.398_199_9e-3));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.333_452e-3));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.166_579_6e-2));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.666_666_5e-1));
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5));
        p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r);
        p = _mm256_add_ps(p, _mm256_set1_ps(1.0));
        let e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
        // Below the float range (and −∞ padding): exactly 0.
        _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), keep)
    }

    /// SAFETY (caller): avx2+fma available. Loads and stores stay inside `x` (full chunks of 8, then the
    /// tail through a padded copy).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn softmax(x: &mut [f32], max: f32) {
        let m = _mm256_set1_ps(max);
        let mut sum = _mm256_setzero_ps();
        let full = x.len() / 8 * 8;
        let mut i = 0;
        while i < full {
            let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x.as_ptr().add(i)), m));
            _mm256_storeu_ps(x.as_mut_ptr().add(i), e);
            sum = _mm256_add_ps(sum, e);
            i += 8;
        }
        if full < x.len() {
            // The tail goes through the same vector code, padded with −∞ (exp → 0).
            let mut pad = [f32::NEG_INFINITY; 8];
            pad[..x.len() - full].copy_from_slice(&x[full..]);
            let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(pad.as_ptr()), m));
            _mm256_storeu_ps(pad.as_mut_ptr(), e);
            sum = _mm256_add_ps(sum, e);
            let tail = x.len() - full;
            x[full..].copy_from_slice(&pad[..tail]);
        }
        let lo = _mm256_castps256_ps128(sum);
        let hi = _mm256_extractf128_ps(sum, 1);
        let s4 = _mm_add_ps(lo, hi);
        let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        let total = _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
        let inv = _mm256_set1_ps(1.0 / total);
        let mut i = 0;
        while i < full {
            let p = x.as_mut_ptr().add(i);
            _mm256_storeu_ps(p, _mm256_mul_ps(_mm256_loadu_ps(p), inv));
            i += 8;
        }
        let inv = 1.0 / total;
        for v in &mut x[full..] {
            *v *= inv;
        }
    }

    /// SAFETY (caller): avx2 available, `acc.len() % 8 == 0`, `xs.len() >= ws.len() · acc.len()`.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn axpy_many(acc: &mut [f32], ws: &[f32], xs: &[f32]) {
        let len = acc.len();
        let (ap, xp) = (acc.as_mut_ptr(), xs.as_ptr());
        let mut c = 0;
        // 32 elements (four registers) at a time, then 8.
        while c + 32 <= len {
            let mut a = [_mm256_setzero_ps(); 4];
            for (i, v) in a.iter_mut().enumerate() {
                *v = _mm256_loadu_ps(ap.add(c + 8 * i));
            }
            for (j, &w) in ws.iter().enumerate() {
                let wv = _mm256_set1_ps(w);
                for (i, v) in a.iter_mut().enumerate() {
                    let x = _mm256_loadu_ps(xp.add(j * len + c + 8 * i));
                    *v = _mm256_add_ps(*v, _mm256_mul_ps(wv, x));
                }
            }
            for (i, v) in a.iter().enumerate() {
                _mm256_storeu_ps(ap.add(c + 8 * i), *v);
            }
            c += 32;
        }
        while c < len {
            let mut v = _mm256_loadu_ps(ap.add(c));
            for (j, &w) in ws.iter().enumerate() {
                v = _mm256_add_ps(
                    v,
                    _mm256_mul_ps(_mm256_set1_ps(w), _mm256_loadu_ps(xp.add(j * len + c))),
                );
            }
            _mm256_storeu_ps(ap.add(c), v);
            c += 8;
        }
    }

    /// SAFETY (caller): avx2+fma available, `q0.len() % 8 == 0`, `q1` and every `ks[j]` at least as long.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot2x4(q0: &[f32], q1: &[f32], ks: &[&[f32]; 4]) -> [f32; 8] {
        let mut acc = [_mm256_setzero_ps(); 8];
        let mut c = 0;
        while c < q0.len() {
            let (a, b) = (_mm256_loadu_ps(q0.as_ptr().add(c)), _mm256_loadu_ps(q1.as_ptr().add(c)));
            for (j, k) in ks.iter().enumerate() {
                let kv = _mm256_loadu_ps(k.as_ptr().add(c));
                acc[j] = _mm256_fmadd_ps(a, kv, acc[j]);
                acc[4 + j] = _mm256_fmadd_ps(b, kv, acc[4 + j]);
            }
            c += 8;
        }
        reduce8(&acc)
    }

    /// SAFETY (caller): avx2+fma available, `q.len() % 8 == 0`, every `ks[j].len() >= q.len()`.
    #[cfg(test)]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot8(q: &[f32], ks: &[&[f32]; 8]) -> [f32; 8] {
        let mut acc = [_mm256_setzero_ps(); 8];
        let mut c = 0;
        while c < q.len() {
            let qv = _mm256_loadu_ps(q.as_ptr().add(c));
            for (a, k) in acc.iter_mut().zip(ks) {
                *a = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k.as_ptr().add(c)), *a);
            }
            c += 8;
        }
        reduce8(&acc)
    }

    /// Lane `j` of the result is the sum of `acc[j]`'s eight lanes by a fixed tree:
    /// `((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))`.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn reduce8(acc: &[__m256; 8]) -> [f32; 8] {
        let t0 = _mm256_hadd_ps(acc[0], acc[1]);
        let t1 = _mm256_hadd_ps(acc[2], acc[3]);
        let t2 = _mm256_hadd_ps(acc[4], acc[5]);
        let t3 = _mm256_hadd_ps(acc[6], acc[7]);
        let u0 = _mm256_hadd_ps(t0, t1);
        let u1 = _mm256_hadd_ps(t2, t3);
        let r = _mm256_add_ps(
            _mm256_permute2f128_ps(u0, u1, 0x20),
            _mm256_permute2f128_ps(u0, u1, 0x31),
        );
        let mut out = [0f32; 8];
        _mm256_storeu_ps(out.as_mut_ptr(), r);
        out
    }
}

/// In-place softmax of one row of scores with a vectorised `exp` (AVX2: a degree-6 polynomial after
/// range reduction, within 2 ulp of `f32::exp`); every element goes through the same code path.
pub fn softmax_inplace(x: &mut [f32]) {
    let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
    {
        // SAFETY: avx2 and fma are enabled at compile time; the kernel only touches `x`.
        unsafe { avx2::softmax(x, max) }
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma")))]
    {
        let mut sum = 0f32;
        for v in x.iter_mut() {
            *v = (*v - max).exp();
            sum += *v;
        }
        let inv = 1.0 / sum;
        x.iter_mut().for_each(|v| *v *= inv);
    }
}

/// Dot product with a fixed 8-lane reduction order (vectorizes; deterministic for a given length);
/// each lane multiplies then adds (unfused).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    dot_lanes::<false>(a, b)
}

/// [`dot`] with each lane's multiply-add fused (one rounding): the dense matmul's order.
#[inline]
pub fn dot_fused(a: &[f32], b: &[f32]) -> f32 {
    dot_lanes::<true>(a, b)
}

/// The one 8-lane dot product: lanes `i mod 8` accumulate in order, then a fixed tree, then the tail.
#[inline]
fn dot_lanes<const FUSED: bool>(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] = if FUSED {
                x[i].mul_add(y[i], acc[i])
            } else {
                acc[i] + x[i] * y[i]
            };
        }
    }
    let mut tail = 0f32;
    for (x, y) in ra.iter().zip(rb) {
        tail += x * y;
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// `acc += Σ_j ws[j] · xs[j·len .. (j+1)·len]` for `j` ascending, with `len = acc.len()`: per element
/// exactly the sequence of [`axpy`] calls (a multiply then an add, unfused), with the accumulator kept
/// in registers across the `j`s (AVX2) instead of loaded and stored for each.
pub(crate) fn axpy_many(acc: &mut [f32], ws: &[f32], xs: &[f32]) {
    let len = acc.len();
    debug_assert!(xs.len() >= ws.len() * len);
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
    if len.is_multiple_of(8) {
        // SAFETY: avx2 is enabled at compile time; `xs` holds `ws.len()` vectors of `len` (asserted
        // in debug builds and guaranteed by the callers, which pass whole decoded blocks).
        return unsafe { avx2::axpy_many(acc, ws, xs) };
    }
    for (j, &w) in ws.iter().enumerate() {
        axpy(acc, w, &xs[j * len..(j + 1) * len]);
    }
}

#[inline]
pub(crate) fn axpy(acc: &mut [f32], w: f32, x: &[f32]) {
    for (a, b) in acc.iter_mut().zip(x) {
        *a += w * b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::KvDtype;
    use crate::layout::CacheShape;
    use crate::quant::KvQuant;
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
    fn softmax_matches_exp() {
        for n in [1usize, 7, 8, 9, 100] {
            let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 30.0 - 5.0).collect();
            let mut y = x.clone();
            softmax_inplace(&mut y);
            let max = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let z: f64 = x.iter().map(|v| ((v - max) as f64).exp()).sum();
            for (a, b) in y.iter().zip(&x) {
                let want = ((b - max) as f64).exp() / z;
                assert!(
                    (*a as f64 - want).abs() <= 1e-6 * want.max(1e-30) + 1e-12,
                    "{a} vs {want}"
                );
            }
        }
        let mut y = vec![-1000.0, 0.0];
        softmax_inplace(&mut y);
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
        for m in KvQuant::ALL {
            let e = err(KvDtype::Fp8E4m3, m);
            assert!(e < 0.05, "fp8 {}: {e}", m.name());
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
