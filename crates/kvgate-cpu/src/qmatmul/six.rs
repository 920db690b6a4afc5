//! 6-bit records ([`super::QKind::Q6`], Q6_K's blocks of 16) expanded back into the 8-bit layout's
//! signed bytes in registers: each 32-byte chunk of the 8-bit record (4 inputs × 8 columns) is one
//! nibble load, one shift and mask of the two-bit plane, an `or` and a subtraction of 32.
//!
//! Guarantee: the bytes produced are exactly the 8-bit layout's (`QMatrix::q6_at` is where each bit
//! lives), so every kernel that reads them computes what it computes on the 8-bit layout, bit for bit.
//! Shifts run in 16-bit lanes; the bits a shift carries across a byte boundary land outside the mask
//! kept (`0x0F` after a 4-bit right shift, `0x30` after shifts of the plane by −2..=4).

use std::arch::x86_64::*;

/// Chunk `c` (0..4) of the 8-bit layout of the 6-bit record whose quants start at `q` (blocks of 16:
/// 64 bytes of nibbles, then 32 of the plane).
/// SAFETY (caller): AVX2 is available; `q` holds a 6-bit record's 96 bytes of quants.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn chunk(q: *const u8, c: usize) -> __m256i {
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
    let v = _mm256_or_si256(
        _mm256_and_si256(low, _mm256_set1_epi8(0x0F)),
        _mm256_and_si256(top, _mm256_set1_epi8(0x30)),
    );
    _mm256_sub_epi8(v, _mm256_set1_epi8(32))
}

/// [`chunk`] `c` of two consecutive records (`rec` bytes apart, quants `head` bytes in) side by side:
/// the first's 32 bytes, then the second's.
/// SAFETY (caller): AVX-512F/BW are available; both records hold a 6-bit record's quants.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx2")]
pub(super) unsafe fn chunk_pair(first: *const u8, rec: usize, head: usize, c: usize) -> __m512i {
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
        _ => _mm512_srli_epi16::<4>(nib),
    };
    let top = match c {
        0 => _mm512_slli_epi16::<4>(plane),
        1 => _mm512_slli_epi16::<2>(plane),
        2 => plane,
        _ => _mm512_srli_epi16::<2>(plane),
    };
    let v = _mm512_or_si512(
        _mm512_and_si512(low, _mm512_set1_epi8(0x0F)),
        _mm512_and_si512(top, _mm512_set1_epi8(0x30)),
    );
    _mm512_sub_epi8(v, _mm512_set1_epi8(32))
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
