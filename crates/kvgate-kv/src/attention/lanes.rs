//! A prefill tile's attention with the tile's query vectors in the vector lanes (x86): the scores of a
//! K/V partition land as a positions × queries matrix, computed by broadcasting each key element against
//! the transposed queries; the softmax runs down the positions; the weighted sums of V broadcast each
//! value element against the weights of many queries at once. Keys and values are read in their cache
//! layout (nothing transposed but the tile's queries, once per task), and no horizontal reduction is left
//! in the inner loops, so the score and V kernels run at the FMA units' rate instead of the shuffles'.
//!
//! Guarantee: each number is computed by exactly the arithmetic the row-at-a-time path of `tiles.rs`
//! uses for the same row, so a row's output is the same bits in either path (and in any tile, batch or
//! thread split):
//! - a score is [`super::dot2x4`]'s: eight FMA chains over the dimensions `d ≡ r (mod 8)`, `d`
//!   ascending, then `((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7))`; then scale, bias, softcap;
//! - an exp is [`super::exp_sum_inplace`]'s vectorised `exp`, and a partition's sum of exps that
//!   function's eight lanes — position `pos` in lane `pos mod 8`, ascending — and its fixed tree;
//! - a weighted sum of V is one FMA chain per output element over the positions, ascending.
//!
//! Positions outside a query's range hold −∞ scores, hence zero weights: exact no-ops in both sums.

use std::arch::x86_64::*;

use super::simd::{exp_sub, AVX512};
use super::tiles::{blocks, Ctx, Partials};
use crate::storage::Which;

/// Per-thread buffers of the lanes path.
#[derive(Default)]
pub(super) struct LaneScratch {
    /// The tile's queries transposed: `qt[d·nqp + q]`.
    qt: Vec<f32>,
    /// Scores, then weights: `w[(pos − lo)·nqp + q]`.
    w: Vec<f32>,
    /// Weighted sums, transposed: `acc[d·nqp + q]`.
    acc: Vec<f32>,
    decoded: Vec<f32>,
    /// Per query lane: the first and last position it reads, its max, the max the exps subtract.
    st: Vec<i32>,
    en: Vec<i32>,
    m: Vec<f32>,
    safe: Vec<f32>,
    /// Per lane `pos mod 8` × query: the exps' partial sums.
    sums: Vec<f32>,
}

/// `v` holding `n` copies of `x` (its allocation kept across calls).
fn filled<T: Copy>(v: &mut Vec<T>, n: usize, x: T) -> &mut [T] {
    v.clear();
    v.resize(n, x);
    v
}

/// Queries per register on this machine.
fn width() -> usize {
    if *AVX512 {
        16
    } else {
        8
    }
}

/// Whether a tile of these parameters can take the lanes path (the score kernels need whole 8-lane
/// chunks of the head dimension, as [`super::dot2x4`]'s vector path does).
pub(super) fn eligible(head_dim: usize) -> bool {
    head_dim.is_multiple_of(8)
}

/// The tile's query vectors for KV head `kvh` (row-major: row `i`'s query head `g` is vector
/// `i·group + g`), transposed into `ls.qt` with zero padding up to a whole register; returns the
/// padded count.
pub(super) fn transpose_queries(cx: &Ctx, (r0, r1): (usize, usize), kvh: usize, ls: &mut LaneScratch) -> usize {
    let p = cx.p;
    let (hd, group) = (p.head_dim, p.num_heads / p.num_kv_heads);
    let row_len = p.num_heads * hd;
    let nq = (r1 - r0) * group;
    let nqp = nq.next_multiple_of(width());
    ls.qt.clear();
    ls.qt.resize(hd * nqp, 0.0);
    for q in 0..nq {
        let o = (r0 + q / group) * row_len + (kvh * group + q % group) * hd;
        for (d, &x) in cx.query.q[o..o + hd].iter().enumerate() {
            ls.qt[d * nqp + q] = x;
        }
    }
    nqp
}

/// The partials of tile `r0..r1` on KV head `kvh` over partition `p0..=p1` (its rows' clipped ranges
/// in `range`), with the queries already in `ls.qt` (`nqp` lanes).
pub(super) fn partition(
    cx: &Ctx,
    (r0, r1): (usize, usize),
    range: &[Option<(usize, usize)>],
    kvh: usize,
    nqp: usize,
    ls: &mut LaneScratch,
) -> Partials {
    let p = cx.p;
    let (hd, bs) = (p.head_dim, cx.bs);
    let group = p.num_heads / p.num_kv_heads;
    let nq = (r1 - r0) * group;
    let mut out = Partials::empty(nq, hd);
    let Some(lo) = range.iter().flatten().map(|r| r.0).min() else {
        return out;
    };
    let hi = range.iter().flatten().map(|r| r.1).max().unwrap_or(lo);
    let n = hi + 1 - lo;
    let table = cx.query.tables[cx.query.rows[r0].table as usize];
    let LaneScratch {
        qt,
        w,
        acc,
        decoded,
        st,
        en,
        m,
        safe,
        sums,
    } = ls;
    let w = filled(w, n * nqp, 0.0);
    decoded.resize(bs * hd, 0.0);
    for (blk, first, last) in blocks(lo, hi, bs) {
        let keys = cx
            .lc
            .block_vectors(Which::K, table[blk] as usize, kvh, first, last + 1, decoded);
        let at = (blk * bs + first - lo) * nqp;
        scores(qt, nqp, hd, &keys[first * hd..(last + 1) * hd], &mut w[at..]);
    }
    // Scale (bias, softcap), and −∞ outside each query's range (padding lanes included).
    let (st, en) = (filled(st, nqp, i32::MAX), filled(en, nqp, -1));
    for (q, r) in range
        .iter()
        .enumerate()
        .flat_map(|(i, r)| (0..group).map(move |g| (i * group + g, r)))
    {
        if let Some((a, b)) = *r {
            (st[q], en[q]) = (a as i32, b as i32);
        }
    }
    let m = filled(m, nqp, f32::NEG_INFINITY);
    let plain = cx.kbias.is_none() && p.softcap.is_none();
    if plain && *AVX512 && nqp.is_multiple_of(16) {
        // SAFETY: AVX-512F detected at run time; every slice holds whole rows of `nqp`.
        unsafe { exp512::scale_mask_max(w, nqp, p.scale, st, en, lo as i32, m) };
    } else {
        scale_mask_max(cx, (r0, kvh), w, nqp, (st, en), lo, m);
    }
    // Exps, and the sums in exp_sum_inplace's lanes (position mod 8) and tree.
    safe.clear();
    safe.extend(m.iter().map(|&x| if x == f32::NEG_INFINITY { 0.0 } else { x }));
    let sums = filled(sums, 8 * nqp, 0.0);
    exps(w, nqp, safe, sums, lo);
    let lane = |t: usize, q: usize| sums[t * nqp + q];
    out.m.copy_from_slice(&m[..nq]);
    for (q, l) in out.l.iter_mut().enumerate() {
        *l = ((lane(0, q) + lane(4, q)) + (lane(2, q) + lane(6, q)))
            + ((lane(1, q) + lane(5, q)) + (lane(3, q) + lane(7, q)));
    }
    // Weighted sums of V.
    let acc = filled(acc, hd * nqp, 0.0);
    for (blk, first, last) in blocks(lo, hi, bs) {
        let vals = cx
            .lc
            .block_vectors(Which::V, table[blk] as usize, kvh, first, last + 1, decoded);
        let at = (blk * bs + first - lo) * nqp;
        weighted_sums(
            &w[at..at + (last + 1 - first) * nqp],
            nqp,
            &vals[first * hd..(last + 1) * hd],
            acc,
        );
    }
    for q in 0..nq {
        for d in 0..hd {
            out.acc[q * hd + d] = acc[d * nqp + q];
        }
    }
    out
}

/// Each row `j` of `w` (position `lo + j`) scaled (bias added, softcap applied, as the row path does
/// per score), −∞ in the lanes whose range `st..=en` does not hold the position, and the lanes' maxima
/// into `m`: the portable form of `exp512::scale_mask_max`, for any model.
#[allow(clippy::too_many_arguments)]
fn scale_mask_max(
    cx: &Ctx,
    (r0, kvh): (usize, usize),
    w: &mut [f32],
    nqp: usize,
    (st, en): (&[i32], &[i32]),
    lo: usize,
    m: &mut [f32],
) {
    let p = cx.p;
    let group = p.num_heads / p.num_kv_heads;
    let plain = cx.kbias.is_none() && p.softcap.is_none();
    for (j, row) in w.chunks_exact_mut(nqp).enumerate() {
        let pos = (lo + j) as i32;
        if plain {
            for ((x, &s), &e) in row.iter_mut().zip(st).zip(en) {
                let v = *x * p.scale;
                *x = if pos >= s && pos <= e { v } else { f32::NEG_INFINITY };
            }
            m.iter_mut().zip(row.iter()).for_each(|(m, &x)| *m = m.max(x));
            continue;
        }
        for (q, x) in row.iter_mut().enumerate() {
            if pos < st[q] || pos > en[q] {
                *x = f32::NEG_INFINITY;
                continue;
            }
            let mut s = *x * p.scale;
            if let Some(bias) = cx.kbias {
                s += bias[(r0 + q / group) * p.num_heads + kvh * group + q % group];
            }
            if let Some(cap) = p.softcap {
                s = cap * (s / cap).tanh();
            }
            *x = s;
        }
        m.iter_mut().zip(row.iter()).for_each(|(m, &x)| *m = m.max(x));
    }
}

/// Row `j` of `w` (position `lo + j`) becomes `exp(w − m)` lane by lane, and is added into `sums`'
/// row `(lo + j) mod 8`: [`super::exp_sum_inplace`]'s exps and lanes.
fn exps(w: &mut [f32], nqp: usize, m: &[f32], sums: &mut [f32], lo: usize) {
    assert!(m.len() == nqp && sums.len() == 8 * nqp && w.len().is_multiple_of(nqp));
    if *AVX512 && nqp.is_multiple_of(16) {
        // SAFETY: AVX-512F detected at run time; lengths asserted above.
        return unsafe { exp512::exps(w, nqp, m, sums, lo) };
    }
    for (j, row) in w.chunks_exact_mut(nqp).enumerate() {
        exp_sub(row, m);
        let s = &mut sums[(lo + j) % 8 * nqp..][..nqp];
        s.iter_mut().zip(row.iter()).for_each(|(s, &e)| *s += e);
    }
}

/// The plain scores' scaling and masking, and the exps, in 16-lane registers.
#[path = "lanes_exp512.rs"]
mod exp512;

/// `out[j·nqp + q]` = the score of query `q` (of `qt`, transposed) against key `j` of `keys` (`hd` each),
/// by [`super::dot2x4`]'s arithmetic.
fn scores(qt: &[f32], nqp: usize, hd: usize, keys: &[f32], out: &mut [f32]) {
    let cnt = keys.len() / hd;
    assert!(qt.len() >= hd * nqp && out.len() >= cnt * nqp && hd.is_multiple_of(8));
    if *AVX512 {
        assert!(nqp.is_multiple_of(16));
        // SAFETY: AVX-512F detected at run time; lengths asserted above.
        unsafe { avx512::scores(qt, nqp, hd, keys, out) }
    } else {
        assert!(nqp.is_multiple_of(8));
        // SAFETY: AVX2 and FMA are enabled at compile time; lengths asserted above.
        unsafe { avx2::scores(qt, nqp, hd, keys, out) }
    }
}

/// `acc[d·nqp + q] += Σ_j w[j·nqp + q] · vals[j·hd + d]`, one FMA per term, `j` ascending.
fn weighted_sums(w: &[f32], nqp: usize, vals: &[f32], acc: &mut [f32]) {
    let n = w.len() / nqp;
    let hd = acc.len() / nqp;
    assert!(vals.len() >= n * hd && hd.is_multiple_of(8));
    if *AVX512 {
        assert!(nqp.is_multiple_of(16));
        // SAFETY: AVX-512F detected at run time; lengths asserted above.
        unsafe { avx512::weighted_sums(w, nqp, vals, acc) }
    } else {
        assert!(nqp.is_multiple_of(8));
        // SAFETY: AVX2 and FMA are enabled at compile time; lengths asserted above.
        unsafe { avx2::weighted_sums(w, nqp, vals, acc) }
    }
}

/// One register block of scores: `$nv` query registers × `$nk` keys from query `q0`, key `j`.
macro_rules! score_block {
    ($nv:literal, $nk:literal, $k:ident, $qt:ident, $nqp:ident, $hd:ident, $keys:ident, $out:ident, $q0:ident, $j:ident) => {{
        let z = $k::zero();
        let mut acc = [[z; $nk]; $nv];
        let (mut pair, mut lo4, mut hi4) = (acc, acc, acc);
        for r in 0..8 {
            acc = [[z; $nk]; $nv];
            let mut d = r;
            while d < $hd {
                let mut kb = [z; $nk];
                for k in 0..$nk {
                    kb[k] = $k::splat(*$keys.get_unchecked(($j + k) * $hd + d));
                }
                for v in 0..$nv {
                    let qv = $k::load($qt.as_ptr().add(d * $nqp + $q0 + $k::L * v));
                    for k in 0..$nk {
                        acc[v][k] = $k::fma(qv, kb[k], acc[v][k]);
                    }
                }
                d += 8;
            }
            for v in 0..$nv {
                for k in 0..$nk {
                    let a = acc[v][k];
                    match r {
                        0 | 2 | 4 | 6 => pair[v][k] = a,
                        1 => lo4[v][k] = $k::add(pair[v][k], a),
                        3 => lo4[v][k] = $k::add(lo4[v][k], $k::add(pair[v][k], a)),
                        5 => hi4[v][k] = $k::add(pair[v][k], a),
                        _ => hi4[v][k] = $k::add(hi4[v][k], $k::add(pair[v][k], a)),
                    }
                }
            }
        }
        for v in 0..$nv {
            for k in 0..$nk {
                let at = ($j + k) * $nqp + $q0 + $k::L * v;
                $k::store($out.as_mut_ptr().add(at), $k::add(lo4[v][k], hi4[v][k]));
            }
        }
    }};
}

/// One register block of weighted sums: `$nd` dimensions from `d0` × `$nv` query registers from `q0`.
macro_rules! vsum_block {
    ($nd:literal, $nv:literal, $k:ident, $w:ident, $nqp:ident, $n:ident, $hd:ident, $vals:ident, $acc:ident, $d0:ident, $q0:ident) => {{
        let z = $k::zero();
        let mut a = [[z; $nv]; $nd];
        for dd in 0..$nd {
            for v in 0..$nv {
                a[dd][v] = $k::load($acc.as_ptr().add(($d0 + dd) * $nqp + $q0 + $k::L * v));
            }
        }
        for j in 0..$n {
            let mut wv = [z; $nv];
            for v in 0..$nv {
                wv[v] = $k::load($w.as_ptr().add(j * $nqp + $q0 + $k::L * v));
            }
            for dd in 0..$nd {
                let x = $k::splat(*$vals.get_unchecked(j * $hd + $d0 + dd));
                for v in 0..$nv {
                    a[dd][v] = $k::fma(wv[v], x, a[dd][v]);
                }
            }
        }
        for dd in 0..$nd {
            for v in 0..$nv {
                $k::store($acc.as_mut_ptr().add(($d0 + dd) * $nqp + $q0 + $k::L * v), a[dd][v]);
            }
        }
    }};
}

/// The kernels at one register width (`$reg`, `$lanes` queries), with `$nvs` query registers per
/// score block (keys four or two at a time) and `$nd` dimensions per weighted-sum block.
macro_rules! kernels {
    ($modname:ident, $feat:literal, $reg:ty, $lanes:literal, $zero:ident, $set1:ident, $load:ident, $store:ident, $fmadd:ident, $add:ident, $nk:literal, $nd:literal) => {
        pub(super) mod $modname {
            use super::*;

            /// The register's operations (each one IEEE operation per lane).
            pub(super) struct K;
            #[allow(dead_code)]
            impl K {
                pub const L: usize = $lanes;
                #[inline]
                #[target_feature(enable = $feat)]
                pub fn zero() -> $reg {
                    $zero()
                }
                #[inline]
                #[target_feature(enable = $feat)]
                pub fn splat(x: f32) -> $reg {
                    $set1(x)
                }
                /// SAFETY (caller): `p..p + L` readable.
                #[inline]
                #[target_feature(enable = $feat)]
                pub unsafe fn load(p: *const f32) -> $reg {
                    // SAFETY: by the caller.
                    unsafe { $load(p) }
                }
                /// SAFETY (caller): `p..p + L` writable.
                #[inline]
                #[target_feature(enable = $feat)]
                pub unsafe fn store(p: *mut f32, x: $reg) {
                    // SAFETY: by the caller.
                    unsafe { $store(p, x) }
                }
                #[inline]
                #[target_feature(enable = $feat)]
                pub fn fma(a: $reg, b: $reg, c: $reg) -> $reg {
                    $fmadd(a, b, c)
                }
                #[inline]
                #[target_feature(enable = $feat)]
                pub fn add(a: $reg, b: $reg) -> $reg {
                    $add(a, b)
                }
            }

            /// SAFETY (caller): the feature available, `nqp % L == 0`, `hd % 8 == 0`, `qt` ≥ hd·nqp,
            /// `out` ≥ (keys/hd)·nqp.
            #[target_feature(enable = $feat)]
            pub(super) unsafe fn scores(qt: &[f32], nqp: usize, hd: usize, keys: &[f32], out: &mut [f32]) {
                let cnt = keys.len() / hd;
                let mut q0 = 0;
                while q0 < nqp {
                    let two = nqp - q0 >= 2 * K::L;
                    let mut j = 0;
                    while j < cnt {
                        let left = cnt - j;
                        // SAFETY (each block): loads stay below hd·nqp in `qt`, keys below cnt·hd,
                        // stores below cnt·nqp.
                        unsafe {
                            match (two, left.min($nk)) {
                                (true, $nk) => score_block!(2, $nk, K, qt, nqp, hd, keys, out, q0, j),
                                (false, $nk) => score_block!(1, $nk, K, qt, nqp, hd, keys, out, q0, j),
                                (true, _) => score_block!(2, 1, K, qt, nqp, hd, keys, out, q0, j),
                                (false, _) => score_block!(1, 1, K, qt, nqp, hd, keys, out, q0, j),
                            }
                        }
                        j += if left >= $nk { $nk } else { 1 };
                    }
                    q0 += if two { 2 * K::L } else { K::L };
                }
            }

            /// SAFETY (caller): the feature available, `nqp % L == 0`, `acc.len() = hd·nqp` with
            /// `hd % 8 == 0`, `vals` ≥ (w/nqp)·hd.
            #[target_feature(enable = $feat)]
            pub(super) unsafe fn weighted_sums(w: &[f32], nqp: usize, vals: &[f32], acc: &mut [f32]) {
                let n = w.len() / nqp;
                let hd = acc.len() / nqp;
                let mut q0 = 0;
                while q0 < nqp {
                    let two = nqp - q0 >= 2 * K::L;
                    let mut d0 = 0;
                    while d0 < hd {
                        let full = hd - d0 >= $nd;
                        // SAFETY (each block): loads and stores stay inside `w`, `vals` and `acc`.
                        unsafe {
                            match (two, full) {
                                (true, true) => vsum_block!($nd, 2, K, w, nqp, n, hd, vals, acc, d0, q0),
                                (false, true) => vsum_block!($nd, 1, K, w, nqp, n, hd, vals, acc, d0, q0),
                                (true, false) => vsum_block!(4, 2, K, w, nqp, n, hd, vals, acc, d0, q0),
                                (false, false) => vsum_block!(4, 1, K, w, nqp, n, hd, vals, acc, d0, q0),
                            }
                        }
                        d0 += if full { $nd } else { 4 };
                    }
                    q0 += if two { 2 * K::L } else { K::L };
                }
            }
        }
    };
}

kernels!(
    avx512,
    "avx512f,avx2,fma",
    __m512,
    16,
    _mm512_setzero_ps,
    _mm512_set1_ps,
    _mm512_loadu_ps,
    _mm512_storeu_ps,
    _mm512_fmadd_ps,
    _mm512_add_ps,
    4,
    8
);
kernels!(
    avx2,
    "avx2,fma",
    __m256,
    8,
    _mm256_setzero_ps,
    _mm256_set1_ps,
    _mm256_loadu_ps,
    _mm256_storeu_ps,
    _mm256_fmadd_ps,
    _mm256_add_ps,
    2,
    4
);

#[cfg(test)]
#[path = "lanes_tests.rs"]
mod tests;
