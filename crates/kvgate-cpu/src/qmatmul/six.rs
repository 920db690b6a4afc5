//! 6-bit records ([`super::QKind::Q6`], Q6_K's blocks of 16) expanded in registers: each 32-byte chunk
//! (4 inputs × 8 columns) is one nibble load, one shift and mask of the two-bit plane and an `or`
//! ([`grouped`]: the unsigned quants, four inputs of a column per 32-bit lane, as the integer kernels
//! multiply them), or that reordered into the 8-bit layout's signed bytes ([`chunk`], for the f32
//! kernels and the widened tiles).
//!
//! Guarantee: the bytes produced are exactly the record's quants (`QMatrix::q6_at` is where each bit
//! lives): [`grouped`] the stored `q` (`0..64`) in their lanes, [`chunk`] the 8-bit layout's `q − 32`,
//! so every kernel that reads them computes what it computes on the 8-bit layout, bit for bit.
//! Shifts run in 16- or 32-bit lanes; the bits a shift carries across a byte boundary land outside the mask
//! kept (`0x0F` after a 4-bit right shift, `0x30` after shifts of the plane by −2..=4).

use std::arch::x86_64::*;

/// Chunk `c` (0..4) of the 6-bit record whose quants start at `q` (blocks of 16: 64 bytes of nibbles,
/// then 32 of the plane) as unsigned bytes `0..64`: byte `4j + t` is input `4c + t` of column `j`.
/// SAFETY (caller): AVX2 is available; `q` holds a 6-bit record's 96 bytes of quants.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn grouped(q: *const u8, c: usize) -> __m256i {
    // SAFETY: both loads are inside the record's quants (by the caller).
    let (nib, plane) = unsafe {
        (
            _mm256_loadu_si256(q.add(32 * (c / 2)) as *const __m256i),
            _mm256_loadu_si256(q.add(64) as *const __m256i),
        )
    };
    let low = match c % 2 {
        0 => nib,
        _ => _mm256_srli_epi16::<4>(nib),
    };
    let top = match c {
        0 => _mm256_slli_epi16::<4>(plane),
        1 => _mm256_slli_epi16::<2>(plane),
        2 => plane,
        _ => _mm256_srli_epi16::<2>(plane),
    };
    _mm256_or_si256(
        _mm256_and_si256(low, _mm256_set1_epi8(0x0F)),
        _mm256_and_si256(top, _mm256_set1_epi8(0x30)),
    )
}

/// Chunk `c` (0..4) of the 8-bit layout of the 6-bit record at `q` (byte `8t + j`: input `4c + t` of
/// column `j`, signed): [`grouped`] with each 128-bit half's 4 × 4 bytes transposed, its dwords put in
/// input order and 32 taken off.
/// SAFETY (caller): as [`grouped`].
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn chunk(q: *const u8, c: usize) -> __m256i {
    // SAFETY: as the caller guarantees.
    let g = unsafe { grouped(q, c) };
    // per half (columns 4h .. 4h + 4): dword t = input t of the four columns
    let t = _mm256_shuffle_epi8(
        g,
        _mm256_setr_epi8(
            0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,
        ),
    );
    let v = _mm256_permutevar8x32_epi32(t, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_sub_epi8(v, _mm256_set1_epi8(32))
}

/// [`grouped`] `c` of two consecutive records (`rec` bytes apart, quants `head` bytes in) side by
/// side: the first's 32 bytes (columns 0..8), then the second's (8..16). (Its shifts run in 32-bit
/// lanes: the masks keep the same bits.)
/// SAFETY (caller): AVX-512F is available; both records hold a 6-bit record's quants.
#[inline]
#[target_feature(enable = "avx512f,avx2")]
pub(super) unsafe fn grouped_pair(first: *const u8, rec: usize, head: usize, c: usize) -> __m512i {
    // SAFETY: inside the two records (by the caller).
    let (nib, plane) = unsafe {
        let load = |off: usize| {
            let a = _mm256_loadu_si256(first.add(head + off) as *const __m256i);
            let b = _mm256_loadu_si256(first.add(rec + head + off) as *const __m256i);
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a), b)
        };
        (load(32 * (c / 2)), load(64))
    };
    let low = match c % 2 {
        0 => nib,
        _ => _mm512_srli_epi32::<4>(nib),
    };
    let top = match c {
        0 => _mm512_slli_epi32::<4>(plane),
        1 => _mm512_slli_epi32::<2>(plane),
        2 => plane,
        _ => _mm512_srli_epi32::<2>(plane),
    };
    _mm512_or_si512(
        _mm512_and_si512(low, _mm512_set1_epi8(0x0F)),
        _mm512_and_si512(top, _mm512_set1_epi8(0x30)),
    )
}

/// The whole 8-bit record (128 bytes) of the 6-bit record at `q`, written to `out`.
/// SAFETY (caller): AVX2 is available; `q` as [`chunk`]'s.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn expand(q: *const u8, out: &mut [u8; 128]) {
    for c in 0..4 {
        // SAFETY: as the caller guarantees; `out` holds four chunks.
        unsafe { _mm256_storeu_si256(out.as_mut_ptr().add(32 * c) as *mut __m256i, chunk(q, c)) };
    }
}
