//! The decode row path's AVX-512 kernels (`tiles.rs`' `partition`, a tile of one or two rows): a GQA
//! group's scores against four keys at once, and the weighted sums of V for up to four query heads per
//! pass over the values.
//!
//! Guarantee: the same bits as the AVX2 kernels they stand in for, so a row's output does not depend on
//! the machine's vector width (nor on its tile, batch or thread split):
//! - a score is [`super::dot2x4`]'s: eight FMA chains over the dimensions `d ≡ r (mod 8)`, `d`
//!   ascending, then `((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7))`. Here a 16-lane register holds
//!   two query heads' eight chains against one key (the key's eight elements broadcast to both halves),
//!   and the tree is `_mm256_hadd_ps`'s pairwise sums done on 512 bits by two shuffles and an add;
//! - a weighted sum of V is one FMA per term per element, positions ascending, as
//!   [`super::axpy_many`]: each value vector loaded once for up to four heads.
//!
//! Why: with Qwen2.5's seven query heads per KV head, [`super::dot2x4`] re-read each key four times and
//! spent a third of its instructions in 256-bit `hadd` trees; one long decode stream is this loop.

use std::arch::x86_64::*;

use super::group::Dest;

/// Query heads of one group packed in pairs for [`scores4`], appended to `out`: from where `out` ended,
/// `[(p·chunks + c)·16 ..][..16]` holds
/// head `2p`'s elements `8c..8c+8` then head `2p+1`'s (an odd last head paired with itself; its copy's
/// scores are discarded). `q` is the group's `group × hd` query elements, `hd % 8 == 0`.
pub(super) fn pack_pairs(q: &[f32], group: usize, hd: usize, out: &mut Vec<f32>) {
    let chunks = hd / 8;
    let pairs = group.div_ceil(2);
    let at = out.len();
    out.resize(at + pairs * chunks * 16, 0.0);
    for p in 0..pairs {
        let (h0, h1) = (2 * p, (2 * p + 1).min(group - 1));
        for c in 0..chunks {
            let dst = &mut out[at + (p * chunks + c) * 16..][..16];
            dst[..8].copy_from_slice(&q[h0 * hd + 8 * c..][..8]);
            dst[8..].copy_from_slice(&q[h1 * hd + 8 * c..][..8]);
        }
    }
}

/// `_mm256_hadd_ps` on each 256-bit half: per 128-bit block `[a0 + a1, a2 + a3, b0 + b1, b2 + b3]`.
#[inline(always)]
unsafe fn hadd(a: __m512, b: __m512) -> __m512 {
    _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x88), _mm512_shuffle_ps(a, b, 0xDD))
}

/// Scores of pairs `P` (from `qp`, packed by [`pack_pairs`]) against four keys: pair `p`'s
/// [`super::dot2x4`] `[q0·k0..k3, q1·k0..k3]` (heads `h0 + 2p`, `h0 + 2p + 1`) put as `dest` says.
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn scores4_n<const P: usize>(qp: *const f32, hd: usize, ks: &[&[f32]; 4], out: *mut f32, h0: usize, dest: Dest) {
    let chunks = hd / 8;
    let mut acc = [[_mm512_setzero_ps(); 4]; P];
    for c in 0..chunks {
        // key j's elements 8c..8c+8 in both halves
        let kv: [__m512; 4] = std::array::from_fn(|j| {
            _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_loadu_pd(
                ks[j].as_ptr().add(8 * c) as *const f64
            )))
        });
        for (p, a) in acc.iter_mut().enumerate() {
            let q = _mm512_loadu_ps(qp.add((p * chunks + c) * 16));
            for j in 0..4 {
                a[j] = _mm512_fmadd_ps(q, kv[j], a[j]);
            }
        }
    }
    for (p, a) in acc.iter().enumerate() {
        // `reduce8`'s tree: the low halves are dot2x4's acc[0..4], the high halves its acc[4..8]
        let u = hadd(hadd(a[0], a[1]), hadd(a[2], a[3]));
        // blocks [u0.lo, u0.hi, u1.lo, u1.hi] → [u0.lo, u1.lo] + [u0.hi, u1.hi]
        let lo = _mm512_shuffle_f32x4(u, u, 0b00_00_10_00);
        let hi = _mm512_shuffle_f32x4(u, u, 0b00_00_11_01);
        let r = _mm512_castps512_ps256(_mm512_add_ps(lo, hi));
        let h = h0 + 2 * p;
        match dest.scale {
            None => _mm256_storeu_ps(out.add(4 * h), r),
            Some(scale) => {
                // a score times the scale: one rounding, as the scalar path
                let r = _mm256_mul_ps(r, _mm256_set1_ps(scale));
                let mask = _mm_cmplt_epi32(_mm_setr_epi32(0, 1, 2, 3), _mm_set1_epi32(dest.cnt as i32));
                _mm_maskstore_ps(out.add(dest.at + h * dest.stride), mask, _mm256_castps256_ps128(r));
                if h + 1 < dest.heads {
                    _mm_maskstore_ps(
                        out.add(dest.at + (h + 1) * dest.stride),
                        mask,
                        _mm256_extractf128_ps(r, 1),
                    );
                }
            }
        }
    }
}

/// Scores of every head of a packed group (`dest.heads` heads, [`pack_pairs`]) against four keys, each
/// `q_h · k_j` by [`super::dot2x4`]'s arithmetic, put into `out` as `dest` says.
/// SAFETY (caller): avx512f available; `hd % 8 == 0`; `qp` holds `pairs · hd · 2` elements
/// (`pairs = ⌈heads / 2⌉`); every `ks[j]` at least `hd`; `out` holds every place `dest` names
/// (scaled: `at + (heads − 1)·stride + cnt`, `cnt ≤ 4`; raw: `pairs · 8`).
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn scores4(qp: &[f32], hd: usize, ks: &[&[f32]; 4], out: &mut [f32], dest: Dest) {
    let pairs = dest.heads.div_ceil(2);
    debug_assert!(qp.len() >= pairs * hd * 2);
    debug_assert!(match dest.scale {
        Some(_) => dest.cnt <= 4 && out.len() >= dest.at + (dest.heads - 1) * dest.stride + dest.cnt,
        None => out.len() >= pairs * 8,
    });
    let (q, o) = (qp.as_ptr(), out.as_mut_ptr());
    let mut p = 0;
    while p < pairs {
        let q = q.add(p * hd * 2);
        match pairs - p {
            1 => scores4_n::<1>(q, hd, ks, o, 2 * p, dest),
            2 => scores4_n::<2>(q, hd, ks, o, 2 * p, dest),
            3 => scores4_n::<3>(q, hd, ks, o, 2 * p, dest),
            _ => scores4_n::<4>(q, hd, ks, o, 2 * p, dest),
        }
        p += 4;
    }
}

/// `accs[h] += Σ_j ws[h][j] · xs[j·64 ..][..64]`, `j` ascending, one FMA per term per element.
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn axpy64_n<const N: usize>(accs: [*mut f32; N], ws: [&[f32]; N], xs: *const f32) {
    let mut r: [[__m512; 4]; N] =
        std::array::from_fn(|h| std::array::from_fn(|i| _mm512_loadu_ps(accs[h].add(16 * i))));
    for j in 0..ws[0].len() {
        let b: [__m512; N] = std::array::from_fn(|h| _mm512_set1_ps(*ws[h].get_unchecked(j)));
        for i in 0..4 {
            let x = _mm512_loadu_ps(xs.add(j * 64 + 16 * i));
            for (rh, bh) in r.iter_mut().zip(&b) {
                rh[i] = _mm512_fmadd_ps(*bh, x, rh[i]);
            }
        }
    }
    for (rh, a) in r.iter().zip(accs) {
        for (i, v) in rh.iter().enumerate() {
            _mm512_storeu_ps(a.add(16 * i), *v);
        }
    }
}

/// The weighted sums of V of heads `0..n` of a group over the same values (head_dim 64):
/// `acc[h·64 ..][..64] += Σ_j w(h)[j] · xs[j·64 ..][..64]` — each head by exactly
/// [`super::axpy_many`]'s arithmetic, up to four heads per pass over `xs`.
/// SAFETY (caller): avx512f available; `acc.len() ≥ n · 64`; every `w(h)` of one length `m`;
/// `xs.len() ≥ m · 64`.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn weighted_sums64<'w>(acc: &mut [f32], n: usize, w: impl Fn(usize) -> &'w [f32], xs: &[f32]) {
    debug_assert!(acc.len() >= n * 64);
    let (a, x) = (acc.as_mut_ptr(), xs.as_ptr());
    let mut h = 0;
    while h < n {
        let at = |k: usize| a.add((h + k) * 64);
        match n - h {
            1 => axpy64_n::<1>([at(0)], [w(h)], x),
            2 => axpy64_n::<2>([at(0), at(1)], [w(h), w(h + 1)], x),
            3 => axpy64_n::<3>([at(0), at(1), at(2)], [w(h), w(h + 1), w(h + 2)], x),
            _ => axpy64_n::<4>([at(0), at(1), at(2), at(3)], [w(h), w(h + 1), w(h + 2), w(h + 3)], x),
        }
        h += 4;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::simd::{axpy, AVX512};
    use crate::attention::{dot2x4, dot8};

    fn rng(seed: &mut u32) -> f32 {
        *seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        ((*seed >> 8) as f32 / (1 << 24) as f32 - 0.5) * 6.0
    }

    /// Every group size kvgate's models have (1 to 8, and a 12-head group that takes two passes) and
    /// head_dims 32 to 256: each score is `dot8`'s bits, and `dot2x4`'s.
    #[test]
    fn group_scores_give_dot8_bits() {
        if !*AVX512 {
            eprintln!("skipped: no AVX-512 on this machine");
            return;
        }
        let mut seed = 3;
        for hd in [32usize, 64, 128, 256] {
            for group in [1usize, 2, 3, 4, 5, 7, 8, 12] {
                let q: Vec<f32> = (0..group * hd).map(|_| rng(&mut seed)).collect();
                let keys: Vec<Vec<f32>> = (0..8).map(|_| (0..hd).map(|_| rng(&mut seed)).collect()).collect();
                let mut qp = vec![];
                pack_pairs(&q, group, hd, &mut qp);
                let ks: [&[f32]; 4] = std::array::from_fn(|j| keys[j].as_slice());
                let mut out = vec![0f32; group.div_ceil(2) * 8];
                let raw = Dest::raw(group);
                // SAFETY: AVX-512 checked above; sizes as the kernel asks.
                unsafe { scores4(&qp, hd, &ks, &mut out, raw) };
                // scaled into rows of stride 7, three keys
                let mut rows = vec![f32::NAN; group * 7 + 4];
                let scaled = Dest {
                    at: 1,
                    stride: 7,
                    cnt: 3,
                    heads: group,
                    scale: Some(0.125),
                };
                // SAFETY: as above; `rows` holds 1 + (group − 1)·7 + 3 elements.
                unsafe { scores4(&qp, hd, &ks, &mut rows, scaled) };
                let k8: [&[f32]; 8] = std::array::from_fn(|j| keys[j].as_slice());
                for h in 0..group {
                    let want = dot8(&q[h * hd..(h + 1) * hd], &k8);
                    let pair = dot2x4(&q[h * hd..(h + 1) * hd], &q[h * hd..(h + 1) * hd], &ks);
                    for j in 0..4 {
                        assert_eq!(
                            out[h * 4 + j].to_bits(),
                            want[j].to_bits(),
                            "hd {hd} group {group} h {h} k {j}"
                        );
                        assert_eq!(out[h * 4 + j].to_bits(), pair[j].to_bits());
                        if j < 3 {
                            assert_eq!(rows[1 + h * 7 + j].to_bits(), (want[j] * 0.125).to_bits());
                        }
                    }
                    // outside its three places, head h's row is untouched
                    assert!(rows[1 + h * 7 + 3..1 + h * 7 + 7].iter().all(|x| x.is_nan()) || h + 1 == group);
                }
            }
        }
    }

    #[test]
    fn group_weighted_sums_give_axpy_bits() {
        if !*AVX512 {
            eprintln!("skipped: no AVX-512 on this machine");
            return;
        }
        let mut seed = 5;
        for n in 1..=9usize {
            for m in [1usize, 3, 16] {
                let xs: Vec<f32> = (0..m * 64).map(|_| rng(&mut seed)).collect();
                let ws: Vec<Vec<f32>> = (0..n).map(|_| (0..m).map(|_| rng(&mut seed)).collect()).collect();
                let start: Vec<f32> = (0..n * 64).map(|_| rng(&mut seed)).collect();
                let mut want = start.clone();
                for h in 0..n {
                    for j in 0..m {
                        axpy(&mut want[h * 64..(h + 1) * 64], ws[h][j], &xs[j * 64..(j + 1) * 64]);
                    }
                }
                let mut got = start.clone();
                // SAFETY: AVX-512 checked above; sizes as the kernel asks.
                unsafe { weighted_sums64(&mut got, n, |h| ws[h].as_slice(), &xs) };
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "n {n} m {m}");
            }
        }
    }
}
