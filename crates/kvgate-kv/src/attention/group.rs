//! The row path's doors to its fast kernels (`tiles.rs`' `partition`): whether a machine takes
//! `group512.rs`' AVX-512 kernels, safe wrappers that check every size those kernels rely on, and the
//! prefetch hint for the block read next. Without AVX2 the kernels are not compiled and [`wide`] is
//! false, so the wrappers are never called there.

/// Requests the cache lines of positions `j..j + cnt` (of `bs`) of a stored block (its elements or
/// codes; its scales with the first positions): a hint, no effect on results. Into L2 (`T1`), not L1:
/// on AMD Zen 4 an L1 prefetch holds one of the core's few L1 miss buffers, so a block's burst of 64
/// stalled the loop at the prefetch itself (one stream's decode attention 15–22% faster with `T1`
/// there, no change measured on Intel).
#[inline]
pub(super) fn prefetch_share(block: Option<(&[u8], &[u8])>, j: usize, cnt: usize, bs: usize) {
    let Some((data, scales)) = block else { return };
    let per = data.len() / bs;
    let part = data.get(j * per..((j + cnt) * per).min(data.len())).unwrap_or(&[]);
    let scales = if j == 0 { scales } else { &[] };
    for line in part.chunks(64).chain(scales.chunks(64)) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a prefetch has no architectural effect and never faults.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(line.as_ptr() as *const i8)
        };
        #[cfg(not(target_arch = "x86_64"))]
        let _ = line;
    }
}

/// Whether the row path takes `group512`'s kernels: an AVX-512 machine and whole 8-element chunks.
pub(super) fn wide(hd: usize) -> bool {
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
    return *super::simd::AVX512 && hd.is_multiple_of(8);
    #[allow(unreachable_code)]
    {
        let _ = hd;
        false
    }
}

/// `group512::pack_pairs` (only called when [`wide`]).
pub(super) fn pack_pairs_of(q: &[f32], group: usize, hd: usize, out: &mut Vec<f32>) {
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
    super::group512::pack_pairs(q, group, hd, out);
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma")))]
    unreachable!("wide() is false without AVX2: {q:?} {group} {hd} {out:?}")
}

/// Where `group512::scores4` puts a group's scores: head `h`'s score of key `j < cnt` at
/// `at + h·stride + j`, times `scale`; or, with `scale` `None`, raw at `h·4 + j` (`cnt` = 4, `stride`
/// unused). Without AVX2 nothing reads it.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(
    not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma")),
    allow(dead_code)
)]
pub(super) struct Dest {
    pub(super) at: usize,
    pub(super) stride: usize,
    pub(super) cnt: usize,
    pub(super) heads: usize,
    pub(super) scale: Option<f32>,
}

impl Dest {
    /// The raw scores of `heads` heads against four keys, `h·4 + j`.
    pub(super) fn raw(heads: usize) -> Dest {
        Dest {
            at: 0,
            stride: 0,
            cnt: 4,
            heads,
            scale: None,
        }
    }
}

/// `group512::scores4` (only called when [`wide`]).
pub(super) fn group_scores_of(qp: &[f32], hd: usize, ks: &[&[f32]; 4], out: &mut [f32], dest: Dest) {
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
    {
        let pairs = dest.heads.div_ceil(2);
        assert!(*super::simd::AVX512 && hd.is_multiple_of(8) && qp.len() >= pairs * hd * 2 && dest.heads > 0);
        assert!(ks.iter().all(|k| k.len() >= hd));
        assert!(match dest.scale {
            Some(_) => dest.cnt <= 4 && out.len() >= dest.at + (dest.heads - 1) * dest.stride + dest.cnt,
            None => out.len() >= pairs * 8,
        });
        // SAFETY: AVX-512F detected at run time; the sizes asserted above.
        unsafe { super::group512::scores4(qp, hd, ks, out, dest) }
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma")))]
    unreachable!("wide() is false without AVX2: {qp:?} {hd} {ks:?} {out:?} {dest:?}")
}

/// `group512::weighted_sums64` (only called when [`wide`] and head_dim 64).
pub(super) fn group_sums_of<'w>(acc: &mut [f32], n: usize, w: impl Fn(usize) -> &'w [f32], xs: &[f32]) {
    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma"))]
    {
        let m = w(0).len();
        assert!(*super::simd::AVX512 && acc.len() >= n * 64 && xs.len() >= m * 64);
        assert!((0..n).all(|h| w(h).len() == m));
        // SAFETY: AVX-512F detected at run time; the sizes asserted above.
        unsafe { super::group512::weighted_sums64(acc, n, w, xs) }
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma")))]
    unreachable!("wide() is false without AVX2: {acc:?} {n} {xs:?} {:?}", w(0))
}
