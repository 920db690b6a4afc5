//! A tile of a 6-bit matrix ([`QKind::Q6`]) widened for a prefill task: to the 8-bit layout for its
//! f32 rows ([`QMatrix::tile_as_q8`]), to the integer kernel's unsigned bytes for its integer rows
//! ([`QMatrix::tile_as_bytes`], [`QKind::Q6x`]). The kernels then read bytes for every group of 4 or 8
//! rows instead of expanding the same 6-bit records again in each.
//!
//! Guarantee: a widened tile holds the same weights (headers copied, records expanded as the kernels
//! expand them), so every result is the 6-bit tile's, bit for bit (the matmul tests hold prefill-sized
//! calls to the 8-bit layout's results, and integer rows to their results alone).

use super::{QKind, QMatrix, P, TILE_PANELS};

/// One 6-bit record's quants (blocks of 16: 96 bytes) as the 8-bit layout's 128 signed bytes: in
/// registers where the machine has AVX2 ([`super::six::expand`]), else byte by byte.
fn expand_record(q: &[u8], out: &mut [u8; 128]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 detected just above; `q` holds a 6-bit record's 96 bytes.
        unsafe { super::six::expand(q.as_ptr(), out) };
        return;
    }
    for (e, chunk) in out.chunks_exact_mut(P).enumerate() {
        for (j, o) in chunk.iter_mut().enumerate() {
            let (nib, shift, plane, bit) = QMatrix::q6_at(16, j, e);
            let v = ((q[nib] >> shift) & 0xF) | (((q[plane] >> bit) & 3) << 4);
            *o = (v as i8 - 32) as u8;
        }
    }
}

/// One 6-bit record's quants as [`QKind::Q6x`]'s 128 bytes: each chunk as [`super::six::grouped`]
/// gives it, in registers where the machine has AVX2, else byte by byte.
fn group_record(q: &[u8], out: &mut [u8; 128]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        for c in 0..4 {
            // SAFETY: AVX2 detected just above; `q` holds a 6-bit record's 96 bytes, `out` four chunks.
            unsafe {
                use std::arch::x86_64::*;
                let g = super::six::grouped(q.as_ptr(), c);
                _mm256_storeu_si256(out.as_mut_ptr().add(32 * c) as *mut __m256i, g);
            }
        }
        return;
    }
    for e in 0..16 {
        for j in 0..P {
            let (nib, shift, plane, bit) = QMatrix::q6_at(16, j, e);
            out[32 * (e / 4) + 4 * j + e % 4] = ((q[nib] >> shift) & 0xF) | (((q[plane] >> bit) & 3) << 4);
        }
    }
}

impl QMatrix {
    /// Tile `t` of a 6-bit matrix as a one-tile matrix in the 8-bit layout: the same K-quant headers,
    /// each record expanded (the kernels' results on it are the 6-bit tile's, bit for bit). A prefill
    /// task widens its tile once for its f32 rows.
    pub(super) fn tile_as_q8(&self, t: usize) -> QMatrix {
        self.widen(t, QKind::Q8, expand_record)
    }

    /// Tile `t` of a 6-bit matrix as a one-tile [`QKind::Q6x`] matrix (the integer kernel's bytes), for
    /// a prefill task's integer rows.
    pub(super) fn tile_as_bytes(&self, t: usize) -> QMatrix {
        self.widen(t, QKind::Q6x, group_record)
    }

    fn widen(&self, t: usize, kind: QKind, record: fn(&[u8], &mut [u8; 128])) -> QMatrix {
        assert_eq!((self.kind, self.bl), (QKind::Q6, 16), "a 6-bit matrix in blocks of 16");
        let mut w = QMatrix::zeroed(kind, TILE_PANELS * P, self.k, self.bl, self.half, false, None, self.sub);
        let (src, nb, p0) = (self.bytes_slice(), self.nb(), t * TILE_PANELS);
        let g = self.sub.unwrap_or(0);
        let mut data = std::mem::take(&mut w.data);
        // SAFETY: as in `bytes_slice`, mutably.
        let dst = unsafe { std::slice::from_raw_parts_mut(data.as_mut_ptr() as *mut u8, data.len() * 64) };
        let sh = self.sh;
        for b in 0..nb {
            if self.sub.is_some() && b.trailing_zeros() >= g {
                // the super-block's header sits just before its first record group
                let (from, to) = (self.record(p0, b) - sh, w.record(0, b) - sh);
                dst[to..to + sh].copy_from_slice(&src[from..from + sh]);
            }
            for v in 0..TILE_PANELS {
                // the record's own head (plain scales) as it is, then its quants widened
                let (from, to, head) = (self.record(p0 + v, b), w.record(v, b), self.head);
                dst[to..to + head].copy_from_slice(&src[from..from + head]);
                let out: &mut [u8; 128] = (&mut dst[to + head..to + head + 128])
                    .try_into()
                    .expect("an 8-bit record of 16 inputs");
                record(&src[from + head..from + head + 96], out);
            }
        }
        w.data = data;
        w
    }
}
