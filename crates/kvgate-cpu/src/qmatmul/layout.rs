//! Where each quant and factor of a record lives, read one at a time: the layout's definition
//! (`q4_at`, `q5_high_at`, `q6_at`, which the builders write by and the SIMD kernels' loads follow) and
//! the scalar accessors the scalar kernels and the tests read weights through.
//!
//! Guarantee: `quant`, `weight` and `scale_offset` return exactly what the builders stored (the
//! matrix tests hold every kind's dequantized values to its source's).

use super::{f32_at, QKind, QMatrix, P};

impl QMatrix {
    /// Where a 4-bit quant lives in its record's quants: the byte offset and the nibble's shift of
    /// input `e` of the panel's column `j`. Each 32-byte chunk holds 8 inputs of the 8 columns, column
    /// `j` in bytes `4j .. 4j + 4` (one 32-bit lane): low nibbles inputs `8i .. 8i + 4`, high nibbles
    /// `8i + 4 .. 8i + 8` — four consecutive inputs of one column per lane, as an integer dot product
    /// wants them, and one shift-and-mask per input for the f32 kernel.
    #[inline]
    pub(super) fn q4_at(j: usize, e: usize) -> (usize, u32) {
        (32 * (e / 8) + 4 * j + e % 4, 4 * ((e % 8) / 4) as u32)
    }

    /// Where the fifth bit of a 5-bit quant lives: the byte offset in its record's quants (after the
    /// 128 bytes of nibbles, a 32-byte plane laid out like one nibble chunk) and the bit. Byte `4j + t`
    /// holds bit 4 of input `8c + t` at bit `c` and of input `8c + 4 + t` at bit `4 + c` (chunk `c`).
    #[inline]
    pub(super) fn q5_high_at(j: usize, e: usize) -> (usize, u32) {
        (128 + 4 * j + e % 4, (e / 8 + 4 * ((e % 8) / 4)) as u32)
    }

    /// Where a 6-bit quant lives: the byte and shift of its low nibble and of its top two bits in its
    /// record's quants. Chunk `c = e / 4` holds inputs `4c .. 4c + 4`, column `j` in bytes `4j .. 4j + 4`
    /// (one 32-bit lane, as the 4-bit layout and an integer dot product want them): input `e` at byte
    /// `at = 4j + e % 4`. Chunks `2n` and `2n + 1` share nibble chunk `n` (low and high nibbles, byte
    /// `at`), and chunks `4g .. 4g + 4` share plane chunk `g` (after the `4·bl` bytes of nibbles; bits
    /// `2(c % 4)`, `2(c % 4) + 1` of byte `at`), so one 32-byte load and a shift and mask give a whole
    /// chunk ([`six::grouped`]; [`six::chunk`] reorders it to the 8-bit layout's).
    #[inline]
    pub(super) fn q6_at(bl: usize, j: usize, e: usize) -> (usize, u32, usize, u32) {
        let (c, at) = (e / 4, 4 * j + e % 4);
        (
            32 * (c / 2) + at,
            4 * (c % 2) as u32,
            4 * bl + 32 * (c / 4) + at,
            2 * (c % 4) as u32,
        )
    }

    /// The quant of column `c`, block `b`, element `e` (for 16-bit kinds, the weight's bits).
    pub(super) fn quant(&self, c: usize, b: usize, e: usize) -> i32 {
        let base = self.record(c / P, b) + self.head + c % P;
        let bytes = self.bytes_slice();
        match self.kind {
            QKind::Q4 | QKind::Q5 => {
                let rec = self.record(c / P, b) + self.head;
                let (at, shift) = Self::q4_at(c % P, e);
                let mut q = (bytes[rec + at] >> shift) & 0xF;
                if self.kind == QKind::Q5 {
                    let (at, bit) = Self::q5_high_at(c % P, e);
                    q |= ((bytes[rec + at] >> bit) & 1) << 4;
                }
                q as i32
            }
            QKind::Q8 => bytes[base + e * P] as i8 as i32,
            QKind::Q6 => {
                let rec = self.record(c / P, b) + self.head;
                let (nib, shift, plane, bit) = Self::q6_at(self.bl, c % P, e);
                let q = ((bytes[rec + nib] >> shift) & 0xF) | (((bytes[rec + plane] >> bit) & 3) << 4);
                q as i32 - 32
            }
            QKind::Q6x => {
                let rec = self.record(c / P, b) + self.head;
                bytes[rec + 32 * (e / 4) + 4 * (c % P) + e % 4] as i32 - 32
            }
            QKind::F16 | QKind::Bf16 => {
                let at = base + c % P + 2 * e * P;
                u16::from_le_bytes([bytes[at], bytes[at + 1]]) as i32
            }
        }
    }

    /// The weight before its block's scale and offset: the quant, or the 16-bit float's value.
    pub(super) fn weight(&self, c: usize, b: usize, e: usize) -> f32 {
        let q = self.quant(c, b, e);
        match self.kind {
            QKind::Q4 | QKind::Q8 | QKind::Q5 | QKind::Q6 | QKind::Q6x => q as f32,
            QKind::F16 => half::f16::from_bits(q as u16).to_f32(),
            QKind::Bf16 => f32::from_bits((q as u32) << 16),
        }
    }

    pub(super) fn scale_offset(&self, c: usize, b: usize) -> (f32, f32) {
        let bytes = self.bytes_slice();
        if self.sub.is_some() {
            let product = |m: bool| {
                let (f, i) = self.factor_at(c / P, b, m);
                self.product_at(f + 4 * (c % P), i + c % P)
            };
            return (product(false), if self.offsets { product(true) } else { 0.0 });
        }
        let size = if self.half { 2 } else { 4 };
        let get = |i: usize| {
            if self.half {
                half::f16::from_le_bytes([bytes[i], bytes[i + 1]]).to_f32()
            } else {
                f32_at(bytes, i)
            }
        };
        let at = self.record(c / P, b) + size * (c % P);
        let d = get(at);
        let m = match (self.offsets, self.ratio) {
            (false, _) => 0.0,
            (true, None) => get(at + size * P),
            (true, Some(r)) => d * r,
        };
        (d, m)
    }
}
