//! kvgate's own matmul for packed GGUF weights (Q4_0, Q4_1, Q8_0 directly; Q5_0, Q5_1, Q4_K, Q5_K,
//! Q6_K through [`crate::repack`]; F16/BF16): the weight stays 4-, 5-, 8- or 16-bit. By default the
//! activations stay f32 (they are not quantized, unlike llama.cpp's and candle's `q8_1` path), so the
//! result equals a matmul against the dequantized weights up to f32 rounding while reading a quarter of
//! the bytes. Rows flagged for the 8-bit-activation mode (completions' default) ([`QMatrix::matmul_rows`]) go through
//! the integer kernel instead ([`kernel_int`], activations quantized per 32 inputs as llama.cpp does).
//!
//! **Layout.** Output columns are grouped in panels of [`P`] = 8 (one AVX2 register). A panel's block
//! `b` (32 inputs) is one record: its 8 scales `d`, its 8 offsets `m` (left out when every offset of
//! the matrix is 0, as in Q8_0, or exactly `−8d` / `−16d`, as in Q4_0 / Q5_0: then computed), each f16 when every value of the matrix is exactly an f16 (as in the
//! formats whose GGUF scales are f16) and f32 otherwise (K-quants' `d · sc`), then its quants. 4-bit:
//! one 32-byte chunk per 8 inputs, each column's 32-bit lane holding four consecutive inputs in its
//! low nibbles and the next four in its high nibbles (`QMatrix::q4_at`); 5-bit: the same plus a
//! 32-byte plane of fifth bits; 8-bit: one signed byte per column, input by input; 16-bit: two bytes
//! per column, input by input. Records are stored tile by tile ([`TILE_PANELS`] panels, the unit of
//! one parallel task), block by block, panel by panel, so a task reads one sequential stream. A kernel
//! step decodes the quants of 8 columns at one input and multiplies them with one broadcast activation
//! of each row in flight: a register-blocked GEMM microkernel (rows × panels of accumulators in
//! registers, the decoded weights reused by every row of the group). Panels are padded to a multiple
//! of [`TILE_PANELS`] with zero columns.
//!
//! **Arithmetic.** For output `(r, c)` and each block `b` in ascending order: `S = Σ_e q_e · x_e`
//! (a sequential FMA chain over the block's inputs, from 0), then `y = fma(m_b, X_b, fma(d_b, S, y))`
//! where `X_b` is the sum of the row's 32 activations of the block (computed once per call). Every
//! output is one fixed scalar sequence of f32 operations whatever the number of rows, the tiling, the
//! thread count or the instruction set, so a row's result never depends on the batch (batch invariance)
//! and the AVX2, AVX-512 and scalar paths give the same bits (tested). The integer kernel keeps the same
//! guarantees with its own fixed sequence.

mod acts;
mod kernel;
mod kernel_int;
#[cfg(target_arch = "x86_64")]
mod kernel_wide;
#[cfg(target_arch = "x86_64")]
mod kernel_zmm;

use rayon::prelude::*;

/// Weights per block of the GGUF formats (and of most packed matrices; Q6_K's have 16).
pub const QK: usize = 32;

/// Output columns per panel.
pub const P: usize = 8;

/// Panels per parallel task (32 output columns); the panel count is padded to a multiple of it.
pub(crate) const TILE_PANELS: usize = 4;

/// Rows per parallel task when a call has many rows (prefill): a chunk of activations that stays in L2.
const ROW_CHUNK: usize = 64;

/// Pieces per compute thread that a prefill matmul's tasks are split into at least (see `matmul_rows`).
const PIECES_PER_THREAD: usize = 32;

/// Packed formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QKind {
    /// 4-bit unsigned quants (Q4_0, Q4_1, Q4_K).
    Q4,
    /// 8-bit signed quants (Q8_0, and Q5_0 / Q5_1 / Q5_K widened).
    Q8,
    /// 5-bit unsigned quants (Q5_0 / Q5_1 / Q5_K kept at 5 bits, for the 8-bit-activation mode): the
    /// 4-bit layout plus a plane of high bits.
    Q5,
    /// IEEE half-precision weights (scale 1, no offsets).
    F16,
    /// bfloat16 weights (scale 1, no offsets).
    Bf16,
}

/// A repacked quantized matrix, `n` rows (outputs) of `k` inputs, in the panel layout.
#[derive(Debug, Clone)]
pub struct QMatrix {
    kind: QKind,
    n: usize,
    k: usize,
    /// Inputs per block (32, or 16 for Q6_K's sixteen scales per 256).
    bl: usize,
    /// Panels after padding.
    np: usize,
    /// Scales and offsets stored as f16 (each exactly the f32 it stands for).
    half: bool,
    /// Whether blocks have offsets (some `m ≠ 0`).
    offsets: bool,
    /// When set, every block's offset is exactly `ratio · d` (Q4_0's `−8d`, Q5_0's `−16d`), and the
    /// records carry only the scales: the kernels compute `m = d · ratio`, the same f32 (a power-of-two
    /// multiple is exact), so the bits are those of stored offsets with 1/6 fewer bytes per 5-bit record.
    ratio: Option<f32>,
    /// Bytes of a record's scales and offsets.
    head: usize,
    /// Bytes per record: `head` + the quants.
    rec: usize,
    /// The records, `[tile][block][panel of the tile]`.
    data: Vec<Line>,
}

/// 64 bytes, 64-byte aligned (one cache line).
#[derive(Debug, Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

fn f16le(b: &[u8]) -> f32 {
    half::f16::from_le_bytes([b[0], b[1]]).to_f32()
}

/// One column's blocks in the canonical (block-major) form the loaders produce: per block `d`, `m`
/// and 32 quants.
struct Column<'a> {
    d: &'a [f32],
    m: &'a [f32],
    q: Box<dyn Fn(usize, usize) -> i32 + 'a>,
}

impl QMatrix {
    fn bytes_per_block(kind: QKind, bl: usize) -> usize {
        match kind {
            QKind::Q4 => bl / 2,
            QKind::Q8 => bl,
            QKind::Q5 => bl / 2 + bl / 8,
            QKind::F16 | QKind::Bf16 => 2 * bl,
        }
    }

    /// Blocks per column.
    fn nb(&self) -> usize {
        self.k / self.bl
    }

    /// Where a 4-bit quant lives in its record's quants: the byte offset and the nibble's shift of
    /// input `e` of the panel's column `j`. Each 32-byte chunk holds 8 inputs of the 8 columns, column
    /// `j` in bytes `4j .. 4j + 4` (one 32-bit lane): low nibbles inputs `8i .. 8i + 4`, high nibbles
    /// `8i + 4 .. 8i + 8` — four consecutive inputs of one column per lane, as an integer dot product
    /// wants them, and one shift-and-mask per input for the f32 kernel.
    #[inline]
    fn q4_at(j: usize, e: usize) -> (usize, u32) {
        (32 * (e / 8) + 4 * j + e % 4, 4 * ((e % 8) / 4) as u32)
    }

    /// Where the fifth bit of a 5-bit quant lives: the byte offset in its record's quants (after the
    /// 128 bytes of nibbles, a 32-byte plane laid out like one nibble chunk) and the bit. Byte `4j + t`
    /// holds bit 4 of input `8c + t` at bit `c` and of input `8c + 4 + t` at bit `4 + c` (chunk `c`).
    #[inline]
    fn q5_high_at(j: usize, e: usize) -> (usize, u32) {
        (128 + 4 * j + e % 4, (e / 8 + 4 * ((e % 8) / 4)) as u32)
    }

    /// Byte offset of the record of panel `p`, block `b`.
    #[inline]
    fn record(&self, p: usize, b: usize) -> usize {
        ((p / TILE_PANELS * self.nb() + b) * TILE_PANELS + p % TILE_PANELS) * self.rec
    }

    fn bytes_slice(&self) -> &[u8] {
        // SAFETY: `Line` is `repr(C)` around `[u8; 64]` (size 64, no padding).
        unsafe { std::slice::from_raw_parts(self.data.as_ptr() as *const u8, self.data.len() * 64) }
    }

    /// The record bytes (the kernels read them through this pointer).
    fn base(&self) -> *const u8 {
        self.data.as_ptr() as *const u8
    }

    /// Builds the panel layout from `n` columns given one at a time, in blocks of `bl` inputs.
    fn build<'a>(kind: QKind, n: usize, k: usize, bl: usize, column: impl Fn(usize) -> Column<'a>) -> QMatrix {
        assert!(bl == QK || bl == QK / 2, "blocks of 16 or 32");
        assert_eq!(k % bl, 0, "k must be a multiple of the block");
        let nb = k / bl;
        let np = n.div_ceil(P).div_ceil(TILE_PANELS) * TILE_PANELS;
        let bpb = Self::bytes_per_block(kind, bl);
        let (mut half, mut offsets) = (true, false);
        // Offsets that may be implied (see `ratio`): whether every `m` is exactly `r · d`, per `r`.
        let ratios = [-8.0f32, -16.0];
        let mut implied = [true; 2];
        let is_f16 = |v: f32| half::f16::from_f32(v).to_f32().to_bits() == v.to_bits();
        for c in 0..n {
            let col = column(c);
            half &= col.d.iter().chain(col.m).all(|&v| is_f16(v));
            offsets |= col.m.iter().any(|&v| v != 0.0);
            for (ok, r) in implied.iter_mut().zip(ratios) {
                *ok = *ok && col.d.iter().zip(col.m).all(|(&d, &m)| (d * r).to_bits() == m.to_bits());
            }
        }
        let ratio = ratios
            .into_iter()
            .zip(implied)
            .find(|&(_, ok)| offsets && ok)
            .map(|(r, _)| r);
        let size = if half { 2 } else { 4 };
        let head = size * P * if offsets && ratio.is_none() { 2 } else { 1 };
        let rec = head + bpb * P;
        let mut w = QMatrix {
            kind,
            n,
            k,
            bl,
            np,
            half,
            offsets,
            ratio,
            head,
            rec,
            data: vec![Line([0; 64]); (np * nb * rec).div_ceil(64)],
        };
        // SAFETY: as in `bytes_slice`, mutably.
        let bytes = unsafe { std::slice::from_raw_parts_mut(w.data.as_mut_ptr() as *mut u8, w.data.len() * 64) };
        let put = |bytes: &mut [u8], at: usize, v: f32| {
            if half {
                bytes[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
            } else {
                bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
            }
        };
        for c in 0..n {
            let col = column(c);
            let (p, j) = (c / P, c % P);
            for b in 0..nb {
                let at = w.record(p, b);
                put(bytes, at + size * j, col.d[b]);
                if offsets && ratio.is_none() {
                    put(bytes, at + size * (P + j), col.m[b]);
                }
                let base = at + head + j;
                match kind {
                    QKind::Q4 | QKind::Q5 => {
                        for e in 0..bl {
                            let q = (col.q)(b, e) as u8;
                            let (off, shift) = Self::q4_at(j, e);
                            bytes[at + head + off] |= (q & 0xF) << shift;
                            if kind == QKind::Q5 {
                                let (off, bit) = Self::q5_high_at(j, e);
                                bytes[at + head + off] |= ((q >> 4) & 1) << bit;
                            }
                        }
                    }
                    QKind::Q8 => {
                        for e in 0..bl {
                            bytes[base + e * P] = (col.q)(b, e) as i8 as u8;
                        }
                    }
                    QKind::F16 | QKind::Bf16 => {
                        // The element's 16 bits; 8 columns' elements are 16 consecutive bytes.
                        let base = at + head + 2 * j;
                        for e in 0..bl {
                            let bits = ((col.q)(b, e) as u16).to_le_bytes();
                            bytes[base + 2 * e * P..base + 2 * e * P + 2].copy_from_slice(&bits);
                        }
                    }
                }
            }
        }
        w
    }

    /// A matrix from block-major per-block scales, offsets and packed quants (see [`crate::repack`]):
    /// 4-bit blocks hold elements `j` and `j + 16` in the low and high nibble of byte `j`, 8-bit blocks
    /// one signed byte per element, 5-bit blocks one byte (`0..32`) per element.
    pub(crate) fn from_parts(kind: QKind, n: usize, k: usize, d: Vec<f32>, m: Vec<f32>, qs: Vec<u8>) -> QMatrix {
        let nb = k / QK;
        assert_eq!(d.len(), n * nb, "one scale per block");
        let per_block = if kind == QKind::Q4 { QK / 2 } else { QK };
        assert_eq!(qs.len(), d.len() * per_block, "quant bytes");
        let (d, m, qs) = (&d, &m, &qs);
        Self::build(kind, n, k, QK, |c| Column {
            d: &d[c * nb..(c + 1) * nb],
            m: &m[c * nb..(c + 1) * nb],
            q: Box::new(move |b, e| {
                let blk = c * nb + b;
                match kind {
                    QKind::Q4 => {
                        let byte = qs[blk * 16 + e % 16];
                        (if e < 16 { byte & 0xF } else { byte >> 4 }) as i32
                    }
                    QKind::Q8 => qs[blk * 32 + e] as i8 as i32,
                    QKind::Q5 => (qs[blk * 32 + e] & 31) as i32,
                    QKind::F16 | QKind::Bf16 => unreachable!("16-bit weights are built by from_halves"),
                }
            }),
        })
    }

    /// A matrix of 16-bit float weights (`bits`: `n × k` row-major, F16 or BF16 bit patterns), in blocks
    /// of 32 with scale 1; `None` unless `k` is a multiple of 32.
    pub fn from_halves(kind: QKind, bits: &[u16], n: usize, k: usize) -> Option<QMatrix> {
        if !matches!(kind, QKind::F16 | QKind::Bf16) || !k.is_multiple_of(QK) || bits.len() != n * k {
            return None;
        }
        let ones = vec![1f32; k / QK];
        let zeros = vec![0f32; k / QK];
        let (ones, zeros) = (&ones, &zeros);
        Some(Self::build(kind, n, k, QK, |c| Column {
            d: ones,
            m: zeros,
            q: Box::new(move |b, e| bits[c * k + b * QK + e] as i32),
        }))
    }

    fn from_gguf(
        data: &[u8],
        n: usize,
        k: usize,
        block_bytes: usize,
        kind: QKind,
        split: impl Fn(&[u8]) -> (f32, f32, &[u8]),
    ) -> QMatrix {
        assert_eq!(k % QK, 0, "k must be a multiple of 32");
        let blocks = n * k / QK;
        assert_eq!(data.len(), blocks * block_bytes, "quantized data size");
        let mut d = Vec::with_capacity(blocks);
        let mut m = Vec::with_capacity(blocks);
        let mut qs = Vec::with_capacity(blocks * Self::bytes_per_block(kind, QK));
        for b in data.chunks_exact(block_bytes) {
            let (dd, mm, q) = split(b);
            d.push(dd);
            m.push(mm);
            qs.extend_from_slice(q);
        }
        Self::from_parts(kind, n, k, d, m, qs)
    }

    /// A matrix of 8-bit signed quants in blocks of 16 inputs, block-major (`d[c · k/16 + b]`, quants
    /// `q[(c · k/16 + b) · 16 + e]`), no offsets: Q6_K's layout after [`crate::repack::q6_k`].
    pub(crate) fn from_blocks16(n: usize, k: usize, d: Vec<f32>, q: Vec<i8>) -> QMatrix {
        let (bl, nb) = (QK / 2, k / (QK / 2));
        assert_eq!(d.len(), n * nb, "one scale per block");
        assert_eq!(q.len(), n * k, "one quant per weight");
        let zeros = vec![0f32; nb];
        let (d, q, zeros) = (&d, &q, &zeros);
        Self::build(QKind::Q8, n, k, bl, |c| Column {
            d: &d[c * nb..(c + 1) * nb],
            m: zeros,
            q: Box::new(move |b, e| q[(c * nb + b) * bl + e] as i32),
        })
    }

    /// Repacks GGUF Q4_0 data (`d: f16, qs: [u8; 16]` per block).
    pub fn from_q4_0(data: &[u8], n: usize, k: usize) -> QMatrix {
        Self::from_gguf(data, n, k, 18, QKind::Q4, |b| {
            let d = f16le(b);
            (d, -8.0 * d, &b[2..18])
        })
    }

    /// Repacks GGUF Q4_1 data (`d: f16, m: f16, qs: [u8; 16]` per block).
    pub fn from_q4_1(data: &[u8], n: usize, k: usize) -> QMatrix {
        Self::from_gguf(data, n, k, 20, QKind::Q4, |b| (f16le(b), f16le(&b[2..]), &b[4..20]))
    }

    /// Repacks GGUF Q8_0 data (`d: f16, qs: [i8; 32]` per block).
    pub fn from_q8_0(data: &[u8], n: usize, k: usize) -> QMatrix {
        Self::from_gguf(data, n, k, 34, QKind::Q8, |b| (f16le(b), 0.0, &b[2..34]))
    }

    /// The quant of column `c`, block `b`, element `e` (for 16-bit kinds, the weight's bits).
    fn quant(&self, c: usize, b: usize, e: usize) -> i32 {
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
            QKind::Q4 | QKind::Q8 | QKind::Q5 => q as f32,
            QKind::F16 => half::f16::from_bits(q as u16).to_f32(),
            QKind::Bf16 => f32::from_bits((q as u32) << 16),
        }
    }

    fn scale_offset(&self, c: usize, b: usize) -> (f32, f32) {
        let bytes = self.bytes_slice();
        let size = if self.half { 2 } else { 4 };
        let get = |i: usize| {
            if self.half {
                half::f16::from_le_bytes([bytes[i], bytes[i + 1]]).to_f32()
            } else {
                f32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]])
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

    /// The rows of several matrices of the same format and width stacked into one (e.g. q, k, v).
    pub fn concat(parts: &[&QMatrix]) -> Option<QMatrix> {
        let first = parts.first()?;
        if parts
            .iter()
            .any(|p| p.kind != first.kind || p.k != first.k || p.bl != first.bl)
        {
            return None;
        }
        let (k, nb) = (first.k, first.nb());
        let owner: Vec<(usize, usize)> = parts
            .iter()
            .enumerate()
            .flat_map(|(i, p)| (0..p.n).map(move |c| (i, c)))
            .collect();
        let cols: Vec<(Vec<f32>, Vec<f32>)> = owner
            .iter()
            .map(|&(i, c)| (0..nb).map(|b| parts[i].scale_offset(c, b)).unzip())
            .collect();
        Some(Self::build(first.kind, owner.len(), k, first.bl, |c| {
            let (i, src) = owner[c];
            Column {
                d: &cols[c].0,
                m: &cols[c].1,
                q: Box::new(move |b, e| parts[i].quant(src, b, e)),
            }
        }))
    }

    /// Output rows.
    pub fn rows(&self) -> usize {
        self.n
    }

    /// Inputs per row.
    pub fn cols(&self) -> usize {
        self.k
    }

    /// Bytes held (padding included).
    pub fn bytes(&self) -> usize {
        self.data.len() * 64
    }

    /// The dequantized value of row `r`, element `i` (tests).
    pub fn value(&self, r: usize, i: usize) -> f32 {
        let (d, m) = self.scale_offset(r, i / self.bl);
        self.weight(r, i / self.bl, i % self.bl).mul_add(d, m)
    }

    /// `x` is `rows × k`; returns `rows × n` (f32 activations).
    pub fn matmul(&self, x: &[f32], rows: usize) -> Vec<f32> {
        self.matmul_rows(x, rows, &[])
    }

    /// Whether the 8-bit-activation (integer) kernel exists for this matrix (4- and 8-bit quants).
    pub fn has_int8(&self) -> bool {
        matches!(self.kind, QKind::Q4 | QKind::Q8 | QKind::Q5) && self.k.is_multiple_of(QK)
    }

    /// As [`QMatrix::matmul`], with the rows marked in `int8` (one flag per row, or empty for none)
    /// computed from 8-bit activations by the integer kernel ([`kernel_int`]) when the matrix has one
    /// ([`QMatrix::has_int8`]); every other row as `matmul` computes it, bit for bit.
    pub fn matmul_rows(&self, x: &[f32], rows: usize, int8: &[bool]) -> Vec<f32> {
        let (n, k, nb) = (self.n, self.k, self.nb());
        assert_eq!(x.len(), rows * k, "activations are rows × k");
        assert!(int8.is_empty() || int8.len() == rows, "one flag per row");
        let int8 = Some(int8).filter(|m| self.has_int8() && m.iter().any(|&v| v));
        let quant = int8.map(|m| acts::QuantRows::new(x, k, m, self.kind == QKind::Q8));
        let mut out = vec![0f32; rows * n];
        if rows == 0 || n == 0 {
            return out;
        }
        // The per-row sums of each block's activations (the offset term), one fixed sequence each. An
        // integer row's offset term sums its quantized activations instead (the weight `d·q + m` times
        // the quantized input, as llama.cpp's `q8_1` does): with the exact sum, the error of the `d·q`
        // part would lose the cancellation the offset gives it.
        let mut xs = vec![0f32; rows * nb];
        if self.offsets {
            let integer = |r: usize| int8.is_some_and(|m| m[r]);
            if int8.is_some() {
                assert_eq!(self.bl, QK, "matrices with offsets have blocks of 32");
            }
            xs.par_chunks_mut(nb).enumerate().for_each(|(r, out)| match &quant {
                Some(q) if integer(r) => out.copy_from_slice(&q.sums[r * nb..(r + 1) * nb]),
                _ => {
                    for (o, b) in out.iter_mut().zip(x[r * k..(r + 1) * k].chunks_exact(self.bl)) {
                        *o = b.iter().fold(0.0, |s, v| s + v);
                    }
                }
            });
        }
        let tiles = self.np / TILE_PANELS;
        let chunks = rows.div_ceil(ROW_CHUNK);
        let dst = Out(out.as_mut_ptr());
        // Prefill: at most 1/32 of a thread's share per rayon piece. Rayon splits a range only as deep
        // as the thread count asks unless a piece is stolen, so a region's last large piece ran on one
        // core while the other spun (perf per thread on a 450-token Qwen2.5 prefill: ~15% of samples
        // idle). A decode call's tiles are microseconds each; its split stays rayon's own.
        let max_len = if rows > kernel::max_rows() {
            (tiles * chunks)
                .div_ceil(PIECES_PER_THREAD * rayon::current_num_threads())
                .max(1)
        } else {
            usize::MAX
        };
        (0..tiles * chunks).into_par_iter().with_max_len(max_len).for_each(|t| {
            let (chunk, tile) = (t / tiles, t % tiles);
            let r1 = ((chunk + 1) * ROW_CHUNK).min(rows);
            let mut r = chunk * ROW_CHUNK;
            while r < r1 {
                let mut rr = (r1 - r).min(kernel::max_rows());
                let mut y: kernel::Acc = [[0f32; P]; kernel::MAX_ROWS * TILE_PANELS];
                let (p0, rxs) = (tile * TILE_PANELS, &xs[r * nb..]);
                match (int8, &quant) {
                    (Some(m), Some(q)) => {
                        // a group of consecutive rows of one mode
                        rr = m[r..r + rr].iter().take_while(|&&v| v == m[r]).count();
                        if m[r] {
                            kernel_int::run_int(self, p0, q, r, &rxs[..rr * nb], rr, &mut y);
                        } else {
                            kernel::run(self, p0, &x[r * k..(r + rr) * k], &rxs[..rr * nb], rr, &mut y);
                        }
                    }
                    _ => kernel::run(self, p0, &x[r * k..(r + rr) * k], &rxs[..rr * nb], rr, &mut y),
                }
                for i in 0..rr {
                    for v in 0..TILE_PANELS {
                        let c0 = (tile * TILE_PANELS + v) * P;
                        let live = P.min(n.saturating_sub(c0));
                        for (j, val) in y[i * TILE_PANELS + v][..live].iter().enumerate() {
                            // SAFETY: `(r + i) < rows` and `c0 + j < n`, so the index is inside `out`
                            // (`rows × n`); tasks own disjoint (row chunk, column tile) pairs, so no two
                            // threads write the same element, and `out` outlives the parallel loop.
                            unsafe { *dst.at((r + i) * n + c0 + j) = *val };
                        }
                    }
                }
                r += rr;
            }
        });
        out
    }
}

/// The output pointer shared by the tasks of one [`QMatrix::matmul`], each writing its own elements.
#[derive(Clone, Copy)]
struct Out(*mut f32);

impl Out {
    fn at(self, i: usize) -> *mut f32 {
        self.0.wrapping_add(i)
    }
}
// SAFETY: tasks write disjoint elements (see the write in `matmul`), and the buffer outlives them.
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

#[cfg(test)]
mod tests;
