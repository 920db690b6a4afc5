//! Load-time repacking of more GGUF formats into the two layouts kvgate's own kernel streams
//! ([`QMatrix`]: blocks of 32 (Q6_K: 16) weights with a scale `d` and offset `m`, 4-bit or 8-bit quants), so
//! that they too keep f32 activations and go through the packed kernel instead of candle's:
//! - Q5_0 (`d·(q − 16)`) and Q5_1 (`d·q + m`), 5-bit quants → the 8-bit layout, or with `five` (the
//!   8-bit-activation mode, whose integer kernel unpacks them cheaply) the 5-bit layout, Q5_0 as
//!   `d·q − 16d`;
//! - Q4_K (super-blocks of 256: eight sub-blocks of 32 with 6-bit scales and mins, `d·sc·q − dmin·mn`)
//!   → the 4-bit layout, one (scale, offset) pair per sub-block, kept as its factors (`d`, `−dmin`,
//!   `sc`, `mn`: [`crate::qmatmul::Factors`]) so the records stay compact;
//! - Q5_K (the same with a fifth bit) → the 8-bit layout (with `five`, the 5-bit one);
//! - Q6_K (super-blocks of 256: sixteen sub-blocks of 16 with int8 scales, `d·sc·(q − 32)`) → the 6-bit
//!   layout (or, `six` off, the 8-bit one) in blocks of 16, scale `d·sc` (exact in f32, kept as its
//!   factors), quant `q − 32`, no offsets.
//!
//! Every value equals ggml's dequantization of the block up to one f32 rounding (the kernel's `fma`),
//! which the tests check against candle's dequantization of the same bytes. Q4_K and Q6_K are laid
//! out by the loaders straight from their blocks (`qmatmul::direct`); the block-by-block forms here
//! are the reference those are held to.

use crate::qmatmul::{Factors, QKind, QMatrix, QK};

/// Weights per K-quant super-block.
pub(crate) const QK_K: usize = 256;

fn f16le(b: &[u8]) -> f32 {
    half::f16::from_le_bytes([b[0], b[1]]).to_f32()
}

/// Per-block scales, offsets and packed quants as the loaders produce them (see
/// [`QMatrix::from_parts`]), and the K-quants' factors of the scales and offsets.
#[derive(Default)]
struct Parts {
    d: Vec<f32>,
    m: Vec<f32>,
    qs: Vec<u8>,
    f: Factors,
}

/// Builds a matrix from the parts `block` pushes, one call per GGUF block.
fn build(
    data: &[u8],
    n: usize,
    k: usize,
    block_bytes: usize,
    weights_per_block: usize,
    kind: QKind,
    block: impl Fn(&[u8], &mut Parts),
) -> Option<QMatrix> {
    if !k.is_multiple_of(weights_per_block) || data.len() != n * k / weights_per_block * block_bytes {
        return None;
    }
    let mut p = Parts::default();
    for b in data.chunks_exact(block_bytes) {
        block(b, &mut p);
    }
    let f = Some(&p.f).filter(|f| !f.sd.is_empty());
    Some(QMatrix::from_parts(kind, n, k, p.d, p.m, p.qs, f))
}

/// The 5-bit quants of a Q5_0/Q5_1 block (`qh`: 32 high bits, `qs`: 16 bytes of low nibbles).
fn q5_quants(qh: &[u8], qs: &[u8]) -> [u8; 32] {
    let h = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let mut q = [0u8; 32];
    for j in 0..16 {
        q[j] = (qs[j] & 0x0F) | ((((h >> j) << 4) & 0x10) as u8);
        q[j + 16] = (qs[j] >> 4) | (((h >> (j + 12)) & 0x10) as u8);
    }
    q
}

/// The layout 5-bit formats go to.
fn five_kind(five: bool) -> QKind {
    if five {
        QKind::Q5
    } else {
        QKind::Q8
    }
}

/// Q5_0 (`d: f16, qh: [u8; 4], qs: [u8; 16]`): `d · (q − 16)`, as signed 8-bit quants (`five`: 5-bit
/// quants `q` with offset `−16d`).
pub(crate) fn q5_0(data: &[u8], n: usize, k: usize, five: bool) -> Option<QMatrix> {
    build(data, n, k, 22, QK, five_kind(five), |b, p| {
        let dd = f16le(b);
        p.d.push(dd);
        let q = q5_quants(&b[2..6], &b[6..22]);
        if five {
            p.m.push(-16.0 * dd);
            p.qs.extend(q);
        } else {
            p.m.push(0.0);
            p.qs.extend(q.iter().map(|&q| (q as i8 - 16) as u8));
        }
    })
}

/// Q5_1 (`d: f16, m: f16, qh: [u8; 4], qs: [u8; 16]`): `d · q + m`.
pub(crate) fn q5_1(data: &[u8], n: usize, k: usize, five: bool) -> Option<QMatrix> {
    build(data, n, k, 24, QK, five_kind(five), |b, p| {
        p.d.push(f16le(b));
        p.m.push(f16le(&b[2..4]));
        p.qs.extend(q5_quants(&b[4..8], &b[8..24]));
    })
}

/// Scale and min of sub-block `j` from a K-quant's 12 packed scale bytes (ggml's `get_scale_min_k4`).
pub(crate) fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// Pushes a Q4_K/Q5_K super-block's 8 (scale, offset) pairs, `d·sc` and `−(dmin·mn)`, and their
/// factors (`d`, `−dmin`, and the 6-bit `sc`, `mn`: the products are exact in f32).
fn k_scales(b: &[u8], p: &mut Parts) {
    let (d, dmin) = (f16le(b), f16le(&b[2..4]));
    p.f.sd.push(d);
    p.f.sm.push(-dmin);
    for j in 0..8 {
        let (sc, mn) = scale_min_k4(j, &b[4..16]);
        p.d.push(d * sc as f32);
        p.m.push(-(dmin * mn as f32));
        p.f.sc.push(sc as i8);
        p.f.mn.push(mn as i8);
    }
}

/// Q4_K (`d, dmin: f16, scales: [u8; 12], qs: [u8; 128]`): sub-block `2i` is the low nibbles of
/// `qs[32i..32i + 32]`, sub-block `2i + 1` the high nibbles. The reference the loaders' direct
/// writer (`qmatmul::direct`) is held to, byte for byte.
#[cfg(test)]
pub(crate) fn q4_k(data: &[u8], n: usize, k: usize) -> Option<QMatrix> {
    build(data, n, k, 144, QK_K, QKind::Q4, |b, p| {
        k_scales(b, p);
        let q = &b[16..144];
        for j in 0..8 {
            let src = &q[(j / 2) * 32..(j / 2) * 32 + 32];
            let e = |l: usize| if j % 2 == 0 { src[l] & 0x0F } else { src[l] >> 4 };
            p.qs.extend((0..16).map(|l| e(l) | (e(l + 16) << 4)));
        }
    })
}

/// Q5_K (`d, dmin: f16, scales: [u8; 12], qh: [u8; 32], qs: [u8; 128]`): as Q4_K, with the fifth bit
/// of sub-block `j`'s element `l` in bit `j` of `qh[l]`.
pub(crate) fn q5_k(data: &[u8], n: usize, k: usize, five: bool) -> Option<QMatrix> {
    build(data, n, k, 176, QK_K, five_kind(five), |b, p| {
        k_scales(b, p);
        let (qh, q) = (&b[16..48], &b[48..176]);
        for j in 0..8 {
            let src = &q[(j / 2) * 32..(j / 2) * 32 + 32];
            p.qs.extend((0..32).map(|l| {
                let lo = if j % 2 == 0 { src[l] & 0x0F } else { src[l] >> 4 };
                lo | (((qh[l] >> j) & 1) << 4)
            }));
        }
    })
}

/// Q6_K (`ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16`): in each half of 128, element
/// `l + 32t` (`l < 32`, `t < 4`) takes the low or high nibble of `ql[l + 32·(t mod 2)]` and bits `2t..2t+2`
/// of `qh[l]`; element `e` of the super-block has scale `scales[e / 16]` (ggml's `dequantize_row_q6_K`).
/// `six`: the 6-bit layout ([`QKind::Q6`]: the same results from a quarter fewer bytes), else the 8-bit one.
/// The reference the loaders' direct writer (`qmatmul::direct`) is held to, byte for byte.
#[cfg(test)]
pub(crate) fn q6_k(data: &[u8], n: usize, k: usize, six: bool) -> Option<QMatrix> {
    const BYTES: usize = 210;
    if !k.is_multiple_of(QK_K) || data.len() != n * k / QK_K * BYTES {
        return None;
    }
    let mut d = Vec::with_capacity(n * k / 16);
    let mut q = Vec::with_capacity(n * k);
    let mut f = Factors::default();
    for b in data.chunks_exact(BYTES) {
        let (ql, qh, sc) = (&b[..128], &b[128..192], &b[192..208]);
        let dd = f16le(&b[208..210]);
        let mut vals = [0i8; QK_K];
        for half in 0..2 {
            let (ql, qh) = (&ql[64 * half..], &qh[32 * half..]);
            for l in 0..32 {
                for t in 0..4 {
                    let low = if t < 2 {
                        ql[l + 32 * t] & 0xF
                    } else {
                        ql[l + 32 * (t - 2)] >> 4
                    };
                    let high = (qh[l] >> (2 * t)) & 3;
                    vals[128 * half + l + 32 * t] = ((low | (high << 4)) as i8) - 32;
                }
            }
        }
        d.extend(sc.iter().map(|&s| dd * s as i8 as f32));
        f.sd.push(dd);
        f.sm.push(0.0);
        f.sc.extend(sc.iter().map(|&s| s as i8));
        f.mn.extend([0; 16]);
        q.extend_from_slice(&vals);
    }
    let kind = if six { QKind::Q6 } else { QKind::Q8 };
    Some(QMatrix::from_blocks16(kind, n, k, d, q, Some(&f)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{Device, Tensor};

    /// Quantizes a random matrix with candle (ggml's reference quantizers), repacks the bytes, and
    /// checks every repacked value against candle's dequantization of the same bytes.
    fn check(dtype: GgmlDType, repack: fn(&[u8], usize, usize) -> Option<QMatrix>) {
        let (n, k) = (5, 512);
        let mut s = 12345u32;
        let vals: Vec<f32> = (0..n * k)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                ((s >> 8) as f32 / (1 << 24) as f32 - 0.3) * 2.0
            })
            .collect();
        let t = Tensor::from_vec(vals, (n, k), &Device::Cpu).unwrap();
        let q = QTensor::quantize(&t, dtype).unwrap();
        let want = q
            .dequantize(&Device::Cpu)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let w = repack(&q.data().unwrap(), n, k).expect("repacks");
        let mut worst = 0f32;
        for r in 0..n {
            for i in 0..k {
                let (a, b) = (w.value(r, i), want[r * k + i]);
                worst = worst.max((a - b).abs() / (1e-3 + b.abs()));
            }
        }
        assert!(worst < 1e-5, "{dtype:?}: worst relative difference {worst}");
        // a size that is not whole blocks is refused, not misread
        assert!(repack(&q.data().unwrap()[1..], n, k).is_none());
    }

    #[test]
    fn q5_0_matches_ggml() {
        check(GgmlDType::Q5_0, |d, n, k| q5_0(d, n, k, false));
        check(GgmlDType::Q5_0, |d, n, k| q5_0(d, n, k, true));
    }

    #[test]
    fn q5_1_matches_ggml() {
        check(GgmlDType::Q5_1, |d, n, k| q5_1(d, n, k, false));
        check(GgmlDType::Q5_1, |d, n, k| q5_1(d, n, k, true));
    }

    #[test]
    fn q4_k_matches_ggml() {
        check(GgmlDType::Q4K, q4_k);
    }

    #[test]
    fn q5_k_matches_ggml() {
        check(GgmlDType::Q5K, |d, n, k| q5_k(d, n, k, false));
        check(GgmlDType::Q5K, |d, n, k| q5_k(d, n, k, true));
    }

    #[test]
    fn q6_k_matches_ggml() {
        check(GgmlDType::Q6K, |d, n, k| q6_k(d, n, k, false));
        check(GgmlDType::Q6K, |d, n, k| q6_k(d, n, k, true));
        check(GgmlDType::Q6K, |d, n, k| {
            QMatrix::from_ggml(GgmlDType::Q6K, d, n, k, false)
        });
    }

    #[test]
    fn q4_k_through_the_loaders_path_matches_ggml() {
        check(GgmlDType::Q4K, |d, n, k| {
            QMatrix::from_ggml(GgmlDType::Q4K, d, n, k, false)
        });
    }

    /// The loaders' direct writers build the same bytes as the block-by-block reference, at widths that
    /// pad the last tile and with several super-blocks per row; stacked rows as a stacked tensor.
    #[test]
    fn direct_writers_build_the_references_bytes() {
        let mut s = 99u32;
        for (n, k) in [(5, 256), (45, 1024), (64, 512)] {
            let vals: Vec<f32> = (0..n * k)
                .map(|_| {
                    s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    ((s >> 8) as f32 / (1 << 24) as f32 - 0.4) * 3.0
                })
                .collect();
            let t = Tensor::from_vec(vals, (n, k), &Device::Cpu).unwrap();
            for dtype in [GgmlDType::Q4K, GgmlDType::Q6K] {
                let data = QTensor::quantize(&t, dtype).unwrap().data().unwrap().into_owned();
                let direct = QMatrix::from_ggml(dtype, &data, n, k, false).unwrap();
                let reference = match dtype {
                    GgmlDType::Q4K => q4_k(&data, n, k).unwrap(),
                    // kept at 6 bits
                    _ => q6_k(&data, n, k, true).unwrap(),
                };
                assert_eq!(direct.bytes_slice(), reference.bytes_slice(), "{dtype:?} {n}×{k}");
                // the rows of two tensors stacked: the tensor of both
                let row = data.len() / n;
                let (a, b) = data.split_at(2 * row);
                let stacked = QMatrix::from_ggml_rows(dtype, n, k, false, |c| {
                    if c < 2 {
                        &a[c * row..(c + 1) * row]
                    } else {
                        &b[(c - 2) * row..(c - 1) * row]
                    }
                })
                .unwrap();
                assert_eq!(stacked.bytes_slice(), reference.bytes_slice(), "{dtype:?} stacked");
            }
        }
    }
}
