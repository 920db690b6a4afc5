//! Tree rows ([`RowMask`]) against dense masked attention over the decoded cache, for every KV dtype
//! and method, on short and long (several partitions) sequences, in tiles mixed with causal rows; and
//! a mask that sees everything gives a causal row's very bits.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;
use crate::dtype::KvDtype;
use crate::layout::CacheShape;
use crate::quant::{KvQuant, Rotation};
use crate::storage::{KvCache, Which};

const HD: usize = 32;
const BS: usize = 4;

/// Dense attention of one row over the positions `0..=pos` it sees.
fn dense(q: &[f32], k: &[Vec<f32>], v: &[Vec<f32>], pos: usize, mask: Option<&RowMask>, p: &AttnParams) -> Vec<f32> {
    let group = p.num_heads / p.num_kv_heads;
    let mut out = vec![0f32; p.num_heads * HD];
    let seen: Vec<usize> = (0..=pos).filter(|&t| mask.is_none_or(|m| m.sees(t))).collect();
    for h in 0..p.num_heads {
        let kvh = h / group;
        let qh = &q[h * HD..(h + 1) * HD];
        let s: Vec<f64> = seen
            .iter()
            .map(|&t| {
                let kk = &k[t][kvh * HD..(kvh + 1) * HD];
                qh.iter().zip(kk).map(|(a, b)| (*a as f64) * (*b as f64)).sum::<f64>() * p.scale as f64
            })
            .collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let z: f64 = e.iter().sum();
        for (i, &t) in seen.iter().enumerate() {
            for d in 0..HD {
                out[h * HD + d] += (e[i] / z * v[t][kvh * HD + d] as f64) as f32;
            }
        }
    }
    out
}

/// A random mask from `base` for a row at `pos`: each earlier tree position seen with probability ½,
/// its own always.
fn random_mask(rng: &mut ChaCha8Rng, base: usize, pos: usize) -> RowMask {
    let n = pos + 1 - base;
    let mut seen = vec![0u64; n.div_ceil(64)];
    for i in 0..n {
        if i + 1 == n || rng.random_bool(0.5) {
            seen[i / 64] |= 1 << (i % 64);
        }
    }
    RowMask {
        base: base as u32,
        seen,
    }
}

/// A cache of one sequence of `len` tokens over a scattered table, and the decoded K/V.
type Decoded = (Vec<Vec<f32>>, Vec<Vec<f32>>);
fn filled(shape: CacheShape, len: usize, rng: &mut ChaCha8Rng) -> (KvCache, Vec<u32>, Decoded) {
    let blocks = len.div_ceil(BS);
    let mut cache = KvCache::new(shape, blocks + 3);
    // blocks in a scrambled order
    let table: Vec<u32> = (0..blocks as u32).map(|b| (b * 7 + 2) % (blocks as u32 + 3)).collect();
    let (mut ks, mut vs) = (vec![], vec![]);
    let mut scratch = vec![0f32; HD];
    for t in 0..len {
        let k: Vec<f32> = (0..2 * HD).map(|_| rng.random_range(-2.0..2.0)).collect();
        let v: Vec<f32> = (0..2 * HD).map(|_| rng.random_range(-2.0..2.0)).collect();
        let blk = table[t / BS] as usize;
        cache.write(0, &[blk * BS + t % BS], &k, &v);
        let (mut dk, mut dv) = (vec![], vec![]);
        for h in 0..2 {
            dk.extend_from_slice(cache.layer(0).vector(Which::K, blk, h, t % BS, &mut scratch));
            dv.extend_from_slice(cache.layer(0).vector(Which::V, blk, h, t % BS, &mut scratch));
        }
        ks.push(dk);
        vs.push(dv);
    }
    (cache, table, (ks, vs))
}

fn params() -> AttnParams {
    AttnParams {
        num_heads: 6,
        num_kv_heads: 2,
        head_dim: HD,
        scale: 1.0 / (HD as f32).sqrt(),
        window: None,
        softcap: None,
    }
}

#[test]
fn tree_rows_match_dense_masked_attention_for_every_kv_dtype() {
    let p = params();
    let cases = KvDtype::ALL
        .into_iter()
        .flat_map(|d| KvQuant::methods_for(d).iter().map(move |&m| (d, m)));
    for (dtype, method) in cases {
        for (len, base) in [(40usize, 23usize), (700, 300)] {
            let shape = CacheShape::new(1, 2, HD, BS, dtype)
                .unwrap()
                .with_quant(method)
                .unwrap();
            let mut rng = ChaCha8Rng::seed_from_u64(len as u64 * 31 + base as u64);
            let (cache, table, (ks, vs)) = filled(shape, len, &mut rng);
            // a prefill tile: the tree's rows (and a causal one among them), then a lone tree row
            // (a decode-sized tile, its partitions spread over tasks)
            let mut rows = vec![];
            let mut masks = vec![];
            for pos in base..len.min(base + 20) {
                rows.push(AttnRow {
                    table: 0,
                    pos: pos as u32,
                });
                masks.push(if pos == base + 3 {
                    None
                } else {
                    Some(random_mask(&mut rng, base, pos))
                });
            }
            let tables = [table.as_slice()];
            let q: Vec<f32> = (0..rows.len() * 6 * HD).map(|_| rng.random_range(-1.0..1.0)).collect();
            let mut out = vec![0f32; q.len()];
            let query = AttnQuery {
                q: &q,
                rows: &rows,
                tables: &tables,
                masks: &masks,
            };
            CpuAttention.attend(&cache, 0, &query, &p, &mut out);
            let signs = crate::quant::sign_mask(HD);
            for (r, row) in rows.iter().enumerate() {
                let mut qr = q[r * 192..(r + 1) * 192].to_vec();
                let rotates = method.rotation == Rotation::Hadamard;
                if rotates {
                    qr.chunks_exact_mut(HD).for_each(|x| crate::quant::rotate(x, &signs));
                }
                let mut want = dense(&qr, &ks, &vs, row.pos as usize, masks[r].as_ref(), &p);
                if rotates {
                    want.chunks_exact_mut(HD)
                        .for_each(|x| crate::quant::unrotate(x, &signs));
                }
                for (a, b) in out[r * 192..(r + 1) * 192].iter().zip(&want) {
                    assert!(
                        (a - b).abs() < 1e-4,
                        "{dtype} {} len {len} row {r}: {a} vs {b}",
                        method.name()
                    );
                }
            }
        }
    }
}

#[test]
fn a_mask_that_sees_everything_is_a_causal_row_to_the_bit() {
    let p = params();
    let shape = CacheShape::new(1, 2, HD, BS, KvDtype::F32).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let (cache, table, _) = filled(shape, 600, &mut rng);
    let tables = [table.as_slice()];
    for n in [1usize, 2, 12] {
        let rows: Vec<AttnRow> = (0..n)
            .map(|i| AttnRow {
                table: 0,
                pos: (580 + i) as u32,
            })
            .collect();
        let q: Vec<f32> = (0..n * 6 * HD).map(|_| rng.random_range(-1.0..1.0)).collect();
        let all: Vec<Option<RowMask>> = rows
            .iter()
            .map(|r| {
                Some(RowMask {
                    base: 570,
                    seen: vec![(1u64 << (r.pos - 570 + 1)) - 1],
                })
            })
            .collect();
        let (mut causal, mut masked) = (vec![0f32; q.len()], vec![0f32; q.len()]);
        let query = |masks| AttnQuery {
            q: &q,
            rows: &rows,
            tables: &tables,
            masks,
        };
        CpuAttention.attend(&cache, 0, &query(&[]), &p, &mut causal);
        CpuAttention.attend(&cache, 0, &query(&all), &p, &mut masked);
        assert!(
            causal.iter().zip(&masked).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{n} rows"
        );
    }
}

/// A token tree's row computes its plain row's very bits when it sits in the lane ([`LANES`]) and
/// the partition ([`PARTITION`]) of its plain position and sees the prefix and its ancestors only:
/// for every dtype, near a partition's end and past several, in tiles of one row and of many. And a
/// path's K/V copied to its plain slots ([`KvCache::copy_slot`]) is read as if written there.
#[test]
fn a_tree_row_in_its_lane_and_partition_is_its_plain_row_to_the_bit() {
    let p = params();
    let cases = KvDtype::ALL
        .into_iter()
        .flat_map(|d| KvQuant::methods_for(d).iter().map(move |&m| (d, m)));
    for (dtype, method) in cases {
        for (prefix, depth, shift) in [(37usize, 5usize, 8usize), (229, 6, 16), (600, 4, 24)] {
            let shape = CacheShape::new(1, 2, HD, BS, dtype)
                .unwrap()
                .with_quant(method)
                .unwrap();
            let mut rng = ChaCha8Rng::seed_from_u64((prefix * 13 + depth) as u64);
            let len = prefix + shift + depth;
            let blocks = len.div_ceil(BS);
            // blocks in reverse order, the first two unused
            let table: Vec<u32> = (0..blocks as u32).map(|b| blocks as u32 + 1 - b).collect();
            let vecs: Vec<(Vec<f32>, Vec<f32>)> = (0..len)
                .map(|_| {
                    let k = (0..2 * HD).map(|_| rng.random_range(-2.0..2.0)).collect();
                    let v = (0..2 * HD).map(|_| rng.random_range(-2.0..2.0)).collect();
                    (k, v)
                })
                .collect();
            let slot = |t: usize| table[t / BS] as usize * BS + t % BS;
            // the tree's layout: prefix, another branch's rows (never seen), the path `shift` later
            let mut tree = KvCache::new(shape, blocks + 2);
            for (t, (k, v)) in vecs.iter().enumerate() {
                tree.write(0, &[slot(t)], k, v);
            }
            // the plain layout: the path right after the prefix
            let mut plain = tree.clone();
            for j in 0..depth {
                let (k, v) = &vecs[prefix + shift + j];
                plain.write(0, &[slot(prefix + j)], k, v);
            }
            let tables = [table.as_slice()];
            let q: Vec<f32> = (0..depth * 6 * HD).map(|_| rng.random_range(-1.0..1.0)).collect();
            let rows = |at: usize| -> Vec<AttnRow> {
                (0..depth)
                    .map(|j| AttnRow {
                        table: 0,
                        pos: (at + j) as u32,
                    })
                    .collect()
            };
            let masks: Vec<Option<RowMask>> = (0..depth)
                .map(|j| {
                    let mut seen = vec![0u64; (shift + depth).div_ceil(64)];
                    for i in shift..=shift + j {
                        seen[i / 64] |= 1 << (i % 64);
                    }
                    Some(RowMask {
                        base: prefix as u32,
                        seen,
                    })
                })
                .collect();
            let (plain_rows, tree_rows) = (rows(prefix), rows(prefix + shift));
            assert!((0..depth).all(|j| (prefix + j) / PARTITION == (prefix + shift + j) / PARTITION));
            let run = |cache: &KvCache, rows: &[AttnRow], masks: &[Option<RowMask>], n: usize| {
                // `n` rows a call: a decode-sized tile, or the whole path in one
                let mut out = vec![0f32; q.len()];
                for (c, chunk) in rows.chunks(n).enumerate() {
                    let r0 = c * n;
                    let query = AttnQuery {
                        q: &q[r0 * 192..(r0 + chunk.len()) * 192],
                        rows: chunk,
                        tables: &tables,
                        masks: masks.get(r0..r0 + chunk.len()).unwrap_or(&[]),
                    };
                    CpuAttention.attend(cache, 0, &query, &p, &mut out[r0 * 192..(r0 + chunk.len()) * 192]);
                }
                out
            };
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
            for n in [1, depth] {
                let want = run(&plain, &plain_rows, &[], n);
                let got = run(&tree, &tree_rows, &masks, n);
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "{dtype} {} prefix {prefix}, {n} a tile",
                    method.name()
                );
            }
            // the kept path copied to its plain slots reads as the plain layout
            let mut moved = tree.clone();
            for j in 0..depth {
                moved.copy_slot(slot(prefix + shift + j), slot(prefix + j)).unwrap();
            }
            let want = run(&plain, &plain_rows, &[], depth);
            assert_eq!(bits(&run(&moved, &plain_rows, &[], depth)), bits(&want));
            assert!(moved.copy_slot(0, (blocks + 2) * BS).is_err());
        }
    }
}
