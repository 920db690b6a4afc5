//! [`CpuAttention`]'s `attend`: rows are gathered into tiles of up to [`TILE_ROWS`] consecutive rows
//! reading the same block table (the rows of one sequence in a prefill chunk), and each task reads every
//! K and V block it needs once for the whole tile instead of once per row.
//!
//! A row's attention runs over partitions of [`PART`] positions (aligned to multiples of it): per
//! partition its scores, their max, the sum of their exps and the exp-weighted sum of the values (an
//! online softmax: no score row longer than a partition, whatever the context), then the partitions
//! folded in ascending order and divided by the sum once. A tile of a few rows (decode) spreads its
//! partitions over the threads — one long stream uses every core (flash-decoding) — and a tile of many
//! rows (prefill) folds them as it goes; both fold the same partials in the same order.
//!
//! On x86 a tile of many rows takes the lanes path (`lanes.rs`: query vectors in the vector lanes); on
//! AVX-512 machines the row path takes `group512.rs`' kernels (a KV head's whole query group per key
//! read, up to four heads per pass over the values), and asks for the next block's cache lines a few
//! at a time while it reads the current one: one long stream's K/V streams from memory, and the
//! hardware prefetcher stops at every 4 KiB block.
//!
//! Each row's arithmetic is fixed: its scores by [`dot2x4`] (each score by [`super::dot8`]'s
//! arithmetic, whichever keys and heads share the call), each partition's exps and sums over its own
//! scores (position `pos` in lane `pos mod 8`), its values accumulated over positions in ascending
//! order (one fused multiply-add each), the fold in partition order. So a row's output does not depend
//! on its tile, its batch, its path, or how the work is split across threads.

use rayon::prelude::*;

use super::group::{group_scores_of, group_sums_of, pack_pairs_of, prefetch_share, wide, Dest};
use super::{
    axpy_many, axpy_many2, dot2x4, exp_sum_inplace, max_of, AttentionBackend, AttnParams, AttnQuery, CpuAttention,
};
use crate::quant;
use crate::storage::{KvCache, LayerCache, Which};

/// Rows per tile.
const TILE_ROWS: usize = 16;

/// Positions per partition of a row's attention.
pub(super) const PART: usize = 256;

/// A tile of at most this many rows spreads its partitions over tasks (decode rows); a larger one
/// folds them in one task per KV head (prefill tiles: enough tasks already).
const SPREAD_ROWS: usize = 2;

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
pub(super) fn blocks(lo: usize, hi: usize, bs: usize) -> impl Iterator<Item = (usize, usize, usize)> {
    (lo / bs..=hi / bs).map(move |blk| {
        let first = if blk == lo / bs { lo % bs } else { 0 };
        (blk, first, (hi - blk * bs).min(bs - 1))
    })
}

/// Per-task buffers, kept per thread across tasks and calls.
#[derive(Default)]
struct Scratch {
    decoded: Vec<f32>,
    zeros: Vec<f32>,
    scores: Vec<f32>,
    /// The rows' query heads packed in pairs (`group512::pack_pairs`), and one call's scores.
    qpack: Vec<f32>,
    group_scores: Vec<f32>,
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
    lanes: super::lanes::LaneScratch,
}

/// What every task of one `attend` call reads.
pub(super) struct Ctx<'a> {
    pub(super) lc: &'a LayerCache,
    pub(super) bs: usize,
    pub(super) query: &'a AttnQuery<'a>,
    pub(super) kbias: Option<&'a [f32]>,
    pub(super) p: &'a AttnParams,
}

/// The positions `start..=pos` each row of tile `r0..r1` attends to.
fn spans(query: &AttnQuery, p: &AttnParams, (r0, r1): (usize, usize)) -> Vec<(usize, usize)> {
    query.rows[r0..r1]
        .iter()
        .map(|row| {
            let pos = row.pos as usize;
            let start = match p.window {
                Some(w) if pos + 1 > w => pos + 1 - w,
                _ => 0,
            };
            (start, pos)
        })
        .collect()
}

/// Per (row, query head of the KV head's group): the max score `m`, the sum `l` of exp(score − m),
/// and `acc` = Σ exp(score − m)·v (`head_dim` each) — of one partition, or folded over several.
pub(super) struct Partials {
    pub(super) m: Vec<f32>,
    pub(super) l: Vec<f32>,
    pub(super) acc: Vec<f32>,
}

impl Partials {
    /// Nothing seen yet (`m` = −∞, the identity of [`Partials::fold`]).
    pub(super) fn empty(n: usize, hd: usize) -> Partials {
        Partials {
            m: vec![f32::NEG_INFINITY; n],
            l: vec![0.0; n],
            acc: vec![0.0; n * hd],
        }
    }

    /// Folds in the next partition's partials (each entry rescaled to the larger max).
    fn fold(&mut self, next: &Partials) {
        let hd = self.acc.len() / self.m.len().max(1);
        for i in 0..self.m.len() {
            if next.m[i] == f32::NEG_INFINITY {
                continue;
            }
            let m = self.m[i].max(next.m[i]);
            let (a, b) = ((self.m[i] - m).exp(), (next.m[i] - m).exp());
            self.m[i] = m;
            self.l[i] = self.l[i] * a + next.l[i] * b;
            let (acc, add) = (&mut self.acc[i * hd..(i + 1) * hd], &next.acc[i * hd..(i + 1) * hd]);
            acc.iter_mut().zip(add).for_each(|(x, y)| *x = *x * a + y * b);
        }
    }

    /// The outputs: `acc / l` (rows × group × head_dim).
    fn finish(mut self) -> Vec<f32> {
        let hd = self.acc.len() / self.m.len().max(1);
        for (i, &l) in self.l.iter().enumerate() {
            let inv = if l > 0.0 { 1.0 / l } else { 0.0 };
            self.acc[i * hd..(i + 1) * hd].iter_mut().for_each(|x| *x *= inv);
        }
        self.acc
    }
}

/// The partials of tile `r0..r1` (with `span` its rows' ranges) for the query heads on `kvh`, over
/// partition `part` (positions `part·PART .. (part+1)·PART − 1`); a row with no position there has
/// `m` = −∞.
#[allow(clippy::too_many_arguments)]
fn partition(
    cx: &Ctx,
    (r0, r1): (usize, usize),
    span: &[(usize, usize)],
    kvh: usize,
    part: usize,
    sc: &mut Scratch,
) -> Partials {
    let p = cx.p;
    let (hd, bs) = (p.head_dim, cx.bs);
    let group = p.num_heads / p.num_kv_heads;
    let row_len = p.num_heads * hd;
    let table = cx.query.tables[cx.query.rows[r0].table as usize];
    let mut out = Partials::empty((r1 - r0) * group, hd);
    let range = ranges(span, part);
    let Some(lo) = range.iter().flatten().map(|r| r.0).min() else {
        return out;
    };
    let hi = range.iter().flatten().map(|r| r.1).max().unwrap_or(lo);
    // Scores of row i, query head g: scores[at[i] + g·n_i ..][..n_i], from the multiple of 8 positions
    // at or below the row's first (−∞ before it): a position's exp sums in lane `pos mod 8`, as in the
    // lanes path.
    let mut at = Vec::with_capacity(range.len());
    let mut total = 0;
    for r in &range {
        at.push(total);
        total += r.map_or(0, |(a, b)| group * (b + 1 - a / 8 * 8));
    }
    sc.decoded.resize(bs * hd, 0.0);
    sc.zeros.resize(hd, 0.0);
    sc.scores.clear();
    sc.scores.resize(total, f32::NEG_INFINITY);
    let Scratch {
        decoded,
        zeros,
        scores,
        qpack,
        group_scores,
        ..
    } = sc;
    let qrow = |i: usize, g: usize| {
        let o = (r0 + i) * row_len + (kvh * group + g) * hd;
        &cx.query.q[o..o + hd]
    };
    // AVX-512: a whole group's scores per four keys (`group512`, the same bits)
    let pairs = group.div_ceil(2);
    let fast = wide(hd);
    if fast {
        qpack.clear();
        for i in 0..range.len() {
            let o = (r0 + i) * row_len + kvh * group * hd;
            pack_pairs_of(&cx.query.q[o..o + group * hd], group, hd, qpack);
        }
        group_scores.resize(pairs * 8, 0.0);
    }
    // The part of block `blk` (first..=last within it) that row i reads, if any.
    let piece = |i: usize, blk: usize, first: usize, last: usize| {
        let (a, b) = range[i]?;
        let (x, y) = ((blk * bs + first).max(a), (blk * bs + last).min(b));
        (x <= y).then(|| (x - blk * bs, y - blk * bs))
    };
    // scores are only scaled (no K-offset bias, no softcap): the common case, without per-score checks
    let plain = cx.kbias.is_none() && p.softcap.is_none();
    // the block read after `blk` (K, then V's first, then the next partition's first K block): its
    // cache lines are requested a few at a time as the current block's keys are read
    let last_blk = hi / bs;
    let after = |which: Which, blk: usize| {
        let (w, b) = match (which, blk < last_blk) {
            (_, true) => (which, blk + 1),
            (Which::K, false) => (Which::V, lo / bs),
            (Which::V, false) => (Which::K, blk + 1),
        };
        table.get(b).and_then(|&t| cx.lc.stored_bytes(w, t as usize, kvh))
    };
    for (blk, first, last) in blocks(lo, hi, bs) {
        let next = after(Which::K, blk);
        let keys = cx
            .lc
            .block_vectors(Which::K, table[blk] as usize, kvh, first, last + 1, decoded);
        for i in 0..range.len() {
            let Some((f, l)) = piece(i, blk, first, last) else {
                continue;
            };
            let Some((a, b)) = range[i] else { continue };
            let a = a / 8 * 8;
            let n = b + 1 - a;
            // Keys four at a time (a short group padded with zero keys) against query heads two at a
            // time (an odd last head paired with itself, its copy discarded).
            let mut j0 = f;
            while j0 <= l {
                let cnt = (l + 1 - j0).min(4);
                if i == 0 {
                    prefetch_share(next, j0, cnt, bs);
                }
                let mut ks: [&[f32]; 4] = [zeros.as_slice(); 4];
                for (j, k) in ks.iter_mut().enumerate().take(cnt) {
                    *k = &keys[(j0 + j) * hd..(j0 + j + 1) * hd];
                }
                let idx = blk * bs + j0 - a;
                // head h's four raw scores into its row of `scores`: scaled, biased, capped
                let mut put = |h: usize, half: &[f32]| {
                    let dst = &mut scores[at[i] + h * n + idx..][..cnt];
                    if plain {
                        dst.iter_mut().zip(half).for_each(|(d, &v)| *d = v * p.scale);
                        return;
                    }
                    for (d, &v) in dst.iter_mut().zip(half) {
                        let mut s = v * p.scale;
                        if let Some(bias) = cx.kbias {
                            s += bias[(r0 + i) * p.num_heads + kvh * group + h];
                        }
                        if let Some(cap) = p.softcap {
                            s = cap * (s / cap).tanh();
                        }
                        *d = s;
                    }
                };
                if fast {
                    let qp = &qpack[i * pairs * hd * 2..(i + 1) * pairs * hd * 2];
                    if plain {
                        // scaled straight into each head's row
                        let dest = Dest {
                            at: at[i] + idx,
                            stride: n,
                            cnt,
                            heads: group,
                            scale: Some(p.scale),
                        };
                        group_scores_of(qp, hd, &ks, scores, dest);
                        j0 += cnt;
                        continue;
                    }
                    group_scores_of(qp, hd, &ks, group_scores, Dest::raw(group));
                    for h in 0..group {
                        put(h, &group_scores[h * 4..h * 4 + 4]);
                    }
                } else {
                    for g in (0..group).step_by(2) {
                        let g1 = (g + 1).min(group - 1);
                        let s8 = dot2x4(qrow(i, g), qrow(i, g1), &ks);
                        put(g, &s8[..4]);
                        if g + 1 < group {
                            put(g + 1, &s8[4..]);
                        }
                    }
                }
                j0 += cnt;
            }
        }
    }
    for (i, r) in range.iter().enumerate() {
        let Some((a, b)) = *r else { continue };
        let a8 = a / 8 * 8;
        let n = b + 1 - a8;
        // a tree row: the positions it does not see score −∞ (weight 0, as the padding before `a`)
        let mask = cx.query.masks.get(r0 + i).and_then(Option::as_ref);
        for g in 0..group {
            let s = &mut scores[at[i] + g * n..at[i] + (g + 1) * n];
            if let Some(mk) = mask {
                s.iter_mut()
                    .enumerate()
                    .filter(|&(j, _)| !mk.sees(a8 + j))
                    .for_each(|(_, x)| *x = f32::NEG_INFINITY);
            }
            let m = max_of(s);
            if m == f32::NEG_INFINITY {
                // nothing seen in this partition: weights 0, and `m` −∞ folds as nothing
                s.fill(0.0);
                continue;
            }
            out.m[i * group + g] = m;
            out.l[i * group + g] = exp_sum_inplace(s, m);
        }
    }
    for (blk, first, last) in blocks(lo, hi, bs) {
        prefetch_share(after(Which::V, blk), 0, bs, bs);
        let vals = cx
            .lc
            .block_vectors(Which::V, table[blk] as usize, kvh, first, last + 1, decoded);
        for i in 0..range.len() {
            let Some((f, l)) = piece(i, blk, first, last) else {
                continue;
            };
            let Some((a, b)) = range[i] else { continue };
            let n = b + 1 - a / 8 * 8;
            let idx = blk * bs + f - a / 8 * 8;
            let xs = &vals[f * hd..(l + 1) * hd];
            let ws = |g: usize| &scores[at[i] + g * n + idx..at[i] + g * n + idx + (l + 1 - f)];
            if fast && hd == 64 {
                group_sums_of(&mut out.acc[i * group * hd..(i + 1) * group * hd], group, ws, xs);
                continue;
            }
            // query heads two at a time over the same values (each head's sums exactly its own)
            let mut g = 0;
            while g + 1 < group {
                let k = i * group + g;
                let (a0, a1) = out.acc[k * hd..(k + 2) * hd].split_at_mut(hd);
                axpy_many2(a0, a1, ws(g), ws(g + 1), xs);
                g += 2;
            }
            if g < group {
                let k = i * group + g;
                axpy_many(&mut out.acc[k * hd..(k + 1) * hd], ws(g), xs);
            }
        }
    }
    out
}

/// The positions `a..=b` of partition `part` each row reads (rows' spans clipped to it), if any.
fn ranges(span: &[(usize, usize)], part: usize) -> Vec<Option<(usize, usize)>> {
    let (p0, p1) = (part * PART, part * PART + PART - 1);
    span.iter()
        .map(|&(start, pos)| {
            let (a, b) = (start.max(p0), pos.min(p1));
            (a <= b).then_some((a, b))
        })
        .collect()
}

/// Whether tile `r0..r1` takes the lanes path: a prefill tile (a decode row's query heads fill few
/// lanes: even Qwen2.5's seven per KV head measured slower there than the row path) of plain causal
/// rows (tree rows take the row path, which masks).
#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
fn lanes_path(query: &AttnQuery, (r0, r1): (usize, usize), hd: usize) -> bool {
    let tree = query.masks.get(r0..r1).is_some_and(|m| m.iter().any(Option::is_some));
    super::lanes::eligible(hd) && r1 - r0 > SPREAD_ROWS && !tree
}

/// The partitions tile `r0..r1` reads.
fn partitions(span: &[(usize, usize)]) -> std::ops::RangeInclusive<usize> {
    let lo = span.iter().map(|s| s.0).min().unwrap_or(0);
    let hi = span.iter().map(|s| s.1).max().unwrap_or(0);
    lo / PART..=hi / PART
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
    let cx = Ctx {
        lc: cache.layer(layer),
        bs: cache.shape().block_size,
        query,
        kbias,
        p,
    };
    // Each tile with its rows' position ranges.
    type Tile = ((usize, usize), Vec<(usize, usize)>);
    let tiles: Vec<Tile> = tiles(query).into_iter().map(|t| (t, spans(query, p, t))).collect();
    // A task: (tile, KV head, a run of its partitions returned one by one — or every partition of the
    // tile folded in the task). Spread tiles' partitions are cut into runs so that there are a few tasks
    // per thread: a run computes each partition's partials exactly as a task of its own would.
    let spread: usize = tiles
        .iter()
        .filter(|((r0, r1), span)| r1 - r0 <= SPREAD_ROWS && partitions(span).count() > 1)
        .map(|(_, span)| partitions(span).count() * p.num_kv_heads)
        .sum();
    let runs_wanted = 4 * rayon::current_num_threads().max(1);
    let run_len = spread.div_ceil(runs_wanted).max(1);
    let mut tasks: Vec<(usize, usize, Option<std::ops::Range<usize>>)> = vec![];
    for (ti, ((r0, r1), span)) in tiles.iter().enumerate() {
        let parts = partitions(span);
        for kvh in 0..p.num_kv_heads {
            if r1 - r0 <= SPREAD_ROWS && parts.end() > parts.start() {
                let (lo, hi) = (*parts.start(), parts.end() + 1);
                let mut k = lo;
                while k < hi {
                    tasks.push((ti, kvh, Some(k..(k + run_len).min(hi))));
                    k += run_len;
                }
            } else {
                tasks.push((ti, kvh, None));
            }
        }
    }
    // One rayon piece per task: tasks differ in cost (a later tile attends to more keys), and rayon's own
    // split left a region's last large piece to one core while the other spun.
    let results: Vec<Vec<Partials>> = tasks
        .par_iter()
        .with_max_len(1)
        .map_init(Scratch::default, |sc, (ti, kvh, run)| {
            let (tile, span) = (&tiles[*ti].0, &tiles[*ti].1);
            #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
            let nqp = match lanes_path(query, *tile, hd) {
                true => Some(super::lanes::transpose_queries(&cx, *tile, *kvh, &mut sc.lanes)),
                false => None,
            };
            // The partials of partition k, by the lanes path or the row path (the same bits).
            let one = |k: usize, sc: &mut Scratch| {
                #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
                if let Some(nqp) = nqp {
                    return super::lanes::partition(&cx, *tile, &ranges(span, k), *kvh, nqp, &mut sc.lanes);
                }
                partition(&cx, *tile, span, *kvh, k, sc)
            };
            match run {
                Some(run) => run.clone().map(|k| one(k, sc)).collect(),
                None => {
                    let mut acc = Partials::empty((tile.1 - tile.0) * group, hd);
                    for k in partitions(span) {
                        acc.fold(&one(k, sc));
                    }
                    vec![acc]
                }
            }
        })
        .collect();
    // Each (tile, KV head)'s partials folded here in ascending partitions (a folded task's one result
    // folds into the empty state unchanged).
    let mut i = 0;
    while i < tasks.len() {
        let (ti, kvh) = (tasks[i].0, tasks[i].1);
        let mut j = i + 1;
        while j < tasks.len() && tasks[j].2.is_some() && tasks[j].0 == ti && tasks[j].1 == kvh {
            j += 1;
        }
        let (r0, r1) = tiles[ti].0;
        let mut folded = Partials::empty((r1 - r0) * group, hd);
        for r in results[i..j].iter().flatten() {
            folded.fold(r);
        }
        for (row, o) in folded.finish().chunks_exact(group * hd).enumerate() {
            let at = (r0 + row) * row_len + kvh * group * hd;
            out[at..at + group * hd].copy_from_slice(o);
        }
        i = j;
    }
}

#[cfg(test)]
#[path = "tiles_tests.rs"]
mod tests;
