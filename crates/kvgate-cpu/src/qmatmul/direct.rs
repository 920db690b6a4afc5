//! The K-quants of Q4_K_M/Q6_K files (nearly every weight of the GGUFs people run) written straight
//! from the stored blocks into the panel layout, tile by tile in parallel: no per-block vectors in
//! between and no second pass, so a 1 GB model is laid out in a fraction of the time and memory of the
//! generic path ([`super::build`]).
//!
//! Guarantee: the matrix is byte for byte the one the generic path builds from the same blocks
//! (`crate::repack::q4_k` / `q6_k` through `QMatrix::build`: the same record format — K-quant factors,
//! offsets when any block has one — and the same bytes; tested), so every kernel result is too.

use super::{QKind, QMatrix, P, QK};
use crate::repack::{scale_min_k4, QK_K};

/// Bytes of a Q4_K and a Q6_K super-block.
const Q4K_BYTES: usize = 144;
const Q6K_BYTES: usize = 210;

fn f16le(b: &[u8]) -> f32 {
    half::f16::from_le_bytes([b[0], b[1]]).to_f32()
}

/// Checks that `rows(c)` is `k / 256` super-blocks of `bytes` for every column.
fn whole<'a>(n: usize, k: usize, bytes: usize, rows: &impl Fn(usize) -> &'a [u8]) -> bool {
    k.is_multiple_of(QK_K) && (0..n).all(|c| rows(c).len() == k / QK_K * bytes)
}

impl QMatrix {
    /// Q4_K rows (`rows(c)`: the stored super-blocks of output `c`, `k` inputs) in the 4-bit layout
    /// with K-quant factors; `None` unless every row is whole super-blocks.
    pub(crate) fn from_q4_k_rows<'a>(n: usize, k: usize, rows: impl Fn(usize) -> &'a [u8] + Sync) -> Option<QMatrix> {
        if !whole(n, k, Q4K_BYTES, &rows) {
            return None;
        }
        // offsets unless every block's min is zero (the generic path leaves them out then)
        let offsets = (0..n).any(|c| {
            rows(c).chunks_exact(Q4K_BYTES).any(|b| {
                let dmin = f16le(&b[2..4]);
                (0..8).any(|j| dmin * scale_min_k4(j, &b[4..16]).1 as f32 != 0.0)
            })
        });
        let mut w = QMatrix::zeroed(QKind::Q4, n, k, QK, false, offsets, None, Some(3));
        w.fill(|w, t, tile| {
            let from = t * w.tb;
            for c in w.tile_columns(t) {
                let (p, j) = (c / P, c % P);
                for (s, blk) in rows(c).chunks_exact(Q4K_BYTES).enumerate() {
                    let (d, dmin, sc, qs) = (f16le(blk), f16le(&blk[2..4]), &blk[4..16], &blk[16..]);
                    for sb in 0..8 {
                        let b = 8 * s + sb;
                        let (scale, min) = scale_min_k4(sb, sc);
                        let mut put = |m: bool, f: f32, i: u8| {
                            let (at_f, at_i) = w.factor_at(p, b, m);
                            tile[at_i - from + j] = i;
                            if sb == 0 {
                                let at_f = at_f - from + 4 * j;
                                tile[at_f..at_f + 4].copy_from_slice(&f.to_le_bytes());
                            }
                        };
                        put(false, d, scale);
                        if offsets {
                            put(true, -dmin, min);
                        }
                        // sub-block `sb`: the low (even) or high (odd) nibbles of 32 bytes; input `e`'s
                        // nibble goes where `QMatrix::q4_at` says, two inputs to a byte
                        let src = &qs[32 * (sb / 2)..32 * (sb / 2) + 32];
                        let nib = |e: usize| if sb % 2 == 0 { src[e] & 0xF } else { src[e] >> 4 };
                        let rec = w.record(p, b) - from;
                        for chunk in 0..4 {
                            for l in 0..4 {
                                let e = 8 * chunk + l;
                                tile[rec + 32 * chunk + 4 * j + l] = nib(e) | (nib(e + 4) << 4);
                            }
                        }
                    }
                }
            }
        });
        Some(w)
    }

    /// Q6_K rows (as [`QMatrix::from_q4_k_rows`]) in blocks of 16 with K-quant factors, in the 6-bit
    /// layout (`six`) or the 8-bit one; `None` unless every row is whole super-blocks.
    pub(crate) fn from_q6_k_rows<'a>(
        n: usize,
        k: usize,
        six: bool,
        rows: impl Fn(usize) -> &'a [u8] + Sync,
    ) -> Option<QMatrix> {
        if !whole(n, k, Q6K_BYTES, &rows) {
            return None;
        }
        let kind = if six { QKind::Q6 } else { QKind::Q8 };
        let mut w = QMatrix::zeroed(kind, n, k, QK / 2, false, false, None, Some(4));
        w.fill(|w, t, tile| {
            let from = t * w.tb;
            let mut vals = [0u8; QK_K];
            for c in w.tile_columns(t) {
                let (p, j) = (c / P, c % P);
                for (s, blk) in rows(c).chunks_exact(Q6K_BYTES).enumerate() {
                    let (ql, qh, sc, d) = (&blk[..128], &blk[128..192], &blk[192..208], f16le(&blk[208..210]));
                    // the super-block's 6-bit quants `q` (the weight is `d · sc · (q − 32)`), as ggml's
                    // `dequantize_row_q6_K` reads them
                    for half in 0..2 {
                        let (ql, qh) = (&ql[64 * half..], &qh[32 * half..]);
                        for l in 0..32 {
                            for t4 in 0..4 {
                                let low = if t4 < 2 {
                                    ql[l + 32 * t4] & 0xF
                                } else {
                                    ql[l + 32 * (t4 - 2)] >> 4
                                };
                                vals[128 * half + l + 32 * t4] = low | (((qh[l] >> (2 * t4)) & 3) << 4);
                            }
                        }
                    }
                    for (sb, q) in vals.chunks_exact(16).enumerate() {
                        let b = 16 * s + sb;
                        let (at_f, at_i) = w.factor_at(p, b, false);
                        tile[at_i - from + j] = sc[sb];
                        if sb == 0 {
                            let at_f = at_f - from + 4 * j;
                            tile[at_f..at_f + 4].copy_from_slice(&d.to_le_bytes());
                        }
                        let rec = w.record(p, b) - from;
                        if six {
                            // `QMatrix::q6_at` in blocks of 16: nibble bytes pair inputs e and e + 4
                            // (chunks 2n and 2n + 1), plane bytes hold inputs e, e + 4, e + 8, e + 12
                            // two bits each; column j's four inputs of a chunk in one 32-bit lane
                            for e in 0..4 {
                                let at = 4 * j + e;
                                tile[rec + at] = (q[e] & 0xF) | ((q[e + 4] & 0xF) << 4);
                                tile[rec + 32 + at] = (q[e + 8] & 0xF) | ((q[e + 12] & 0xF) << 4);
                                tile[rec + 64 + at] = (q[e] >> 4)
                                    | ((q[e + 4] >> 4) << 2)
                                    | ((q[e + 8] >> 4) << 4)
                                    | ((q[e + 12] >> 4) << 6);
                            }
                        } else {
                            for (e, &q) in q.iter().enumerate() {
                                tile[rec + e * P + j] = (q as i8 - 32) as u8;
                            }
                        }
                    }
                }
            }
        });
        Some(w)
    }
}
