//! Tests of `tiles.rs`: a row's output is the same bits in any tile, batch, path or thread split, and
//! matches dense attention.
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
                masks: &[],
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
                    masks: &[],
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

/// Long rows (several partitions): a row folded inside a prefill tile's task, the same row alone
/// (its partitions spread over tasks) and in a two-row tile give the same bits, and match dense
/// attention computed in f64; with a window and a softcap too.
#[test]
fn partitions_fold_the_same_however_they_are_split() {
    let mut rng = ChaCha8Rng::seed_from_u64(21);
    // 2 query heads per KV head, and 7 (Qwen2.5's)
    for (window, softcap, group) in [
        (None, None, 2),
        (Some(300), Some(20.0), 2),
        (None, None, 7),
        (Some(300), None, 7),
    ] {
        let heads = 2 * group;
        let shape = CacheShape::new(1, 2, 32, 16, KvDtype::F32).unwrap();
        let p = AttnParams {
            num_heads: heads,
            num_kv_heads: 2,
            head_dim: 32,
            scale: 0.25,
            window,
            softcap,
        };
        let n = 900;
        let mut cache = KvCache::new(shape, 64);
        let (mut ks, mut vs) = (vec![], vec![]);
        for slot in 0..n {
            let k: Vec<f32> = (0..64).map(|_| rng.random_range(-2.0..2.0)).collect();
            let v: Vec<f32> = (0..64).map(|_| rng.random_range(-2.0..2.0)).collect();
            cache.write(0, &[slot], &k, &v);
            ks.push(k);
            vs.push(v);
        }
        let table: Vec<u32> = (0..64).collect();
        let tables = [table.as_slice()];
        let row_len = heads * 32;
        let mut rows: Vec<AttnRow> = (0..20).map(|i| AttnRow { table: 0, pos: 600 + i }).collect();
        rows.push(AttnRow { table: 0, pos: 899 });
        let q: Vec<f32> = (0..rows.len() * row_len).map(|_| rng.random_range(-1.0..1.0)).collect();
        let attend = |rows: &[AttnRow], q: &[f32]| {
            let mut out = vec![0f32; q.len()];
            let query = AttnQuery {
                q,
                rows,
                tables: &tables,
                masks: &[],
            };
            CpuAttention.attend(&cache, 0, &query, &p, &mut out);
            out
        };
        let all = attend(&rows, &q);
        for (r, row) in rows.iter().enumerate() {
            let qr = &q[r * row_len..(r + 1) * row_len];
            let alone = attend(&[*row], qr);
            assert_eq!(
                &all[r * row_len..(r + 1) * row_len],
                alone.as_slice(),
                "{window:?} row {r}"
            );
            // in a two-row tile (spread) with another row
            let pair = attend(&[rows[0], *row], &[&q[..row_len], qr].concat());
            assert_eq!(&pair[row_len..], alone.as_slice(), "{window:?} row {r} in a pair");
            // dense attention in f64
            let pos = row.pos as usize;
            let start = window.map_or(0, |w| (pos + 1).saturating_sub(w));
            for h in 0..heads {
                let kvh = h / group;
                let qh = &qr[h * 32..(h + 1) * 32];
                let s: Vec<f64> = (start..=pos)
                    .map(|t| {
                        let d: f64 = qh
                            .iter()
                            .zip(&ks[t][kvh * 32..])
                            .map(|(a, b)| *a as f64 * *b as f64)
                            .sum();
                        let x = d * 0.25;
                        softcap.map_or(x, |c| c as f64 * (x / c as f64).tanh())
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
                for d in 0..32 {
                    let want: f64 = (start..=pos)
                        .zip(&s)
                        .map(|(t, x)| (x - m).exp() / z * vs[t][kvh * 32 + d] as f64)
                        .sum();
                    let got = alone[h * 32 + d] as f64;
                    assert!(
                        (got - want).abs() < 1e-5,
                        "{window:?} row {r} head {h}: {got} vs {want}"
                    );
                }
            }
        }
    }
}
