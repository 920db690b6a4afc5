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
//! formats whose GGUF scales are f16) and f32 otherwise — or, for K-quants, nothing: their 8-bit sub-block
//! integers and f32 super-block factors sit in a header before each run of a super-block's records
//! ([`QMatrix::sub`]) — then its quants. 4-bit:
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

/// `vpdpwssd acc, a, b` (`acc` plus the pairwise products of `a`'s and `b`'s 16-bit lanes, per 32-bit
/// lane) as one instruction, in `$reg` registers with the encoding prefix `$prefix` (`""`: EVEX, zmm;
/// `"{{vex}} "`: AVX-VNNI, ymm). Written with the intrinsics, LLVM's machine combiner split most of
/// them into `vpmaddwd` + `vpaddd` (a shorter chain per accumulator, for kernels whose accumulators
/// are already independent): twice the vector ops in the 8- and 6-bit kernels, which prefill and
/// batched decode are bound by (objdump of `serve`: 363 `vpmaddwd` and 33 `vpdpwssd` in one
/// instantiation). An asm block is opaque to that pass; the sums are the same integers. The calling
/// function enables the instruction (AVX-512 VNNI; or AVX-VNNI without AVX-512, so that the registers
/// are ymm0–15, which VEX can encode).
#[cfg(target_arch = "x86_64")]
macro_rules! dpwssd {
    ($prefix:literal, $reg:ident, $acc:expr, $a:expr, $b:expr) => {{
        let mut acc = $acc;
        let (a, b) = ($a, $b);
        // SAFETY: registers only (no memory, stack or flags); the caller's target features hold
        // the instruction.
        unsafe {
            std::arch::asm!(
                concat!($prefix, "vpdpwssd {acc}, {a}, {b}"),
                acc = inout($reg) acc,
                a = in($reg) a,
                b = in($reg) b,
                options(pure, nomem, nostack, preserves_flags)
            )
        };
        acc
    }};
}

mod acts;
mod build;
mod direct;
#[cfg(target_arch = "x86_64")]
mod heads;
mod kernel;
mod kernel_int;
#[cfg(target_arch = "x86_64")]
mod kernel_wide;
#[cfg(target_arch = "x86_64")]
mod kernel_zmm;
mod layout;
#[cfg(target_arch = "x86_64")]
mod six;
mod widen;

use rayon::prelude::*;

pub(crate) use build::Factors;

/// Weights per block of the GGUF formats (and of most packed matrices; Q6_K's have 16).
pub const QK: usize = 32;

/// Output columns per panel.
pub const P: usize = 8;

/// Panels per parallel task (32 output columns); the panel count is padded to a multiple of it.
pub(crate) const TILE_PANELS: usize = 4;

/// Kernel row groups (8 rows on AVX-512, 4 on AVX2) past which a call prepares its tiles for prefill
/// (6-bit tiles widened to 8 bits; on AVX2 K-quant factors multiplied out) before its kernels run: below it
/// the preparation costs more than it saves, and each group's kernel expands what it reads itself.
/// Measured (Qwen2.5-Coder-1.5B, one forward pass, 2 cores, prepared from 9 rows as before → from
/// past this): AVX-512 9 rows 164 → 88 ms, 16 rows 197 → 122, 32 rows 299 → 221, 64 rows 502 → 433,
/// 96 rows 557 either way; AVX2 9 rows 191 → 148, 16 rows 257 → 219, 32 rows 415 → 408.
const PREP_GROUPS: usize = 8;

/// Rows per parallel task when a call has many rows (prefill): a chunk of activations that stays in L2.
const ROW_CHUNK: usize = 64;

/// Floats per block of a tile's expanded heads ([`QMatrix::expand_heads`]): the tile's 32 scales, then
/// its 32 offsets.
const HEADS: usize = 2 * P * TILE_PANELS;

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
    /// 6-bit quants (Q6_K kept at 6 bits, in blocks of 16): the signed weights `q − 32` stored as `q`
    /// (`0..64`), four consecutive inputs of a column per 32-bit lane, two 32-byte chunks' low nibbles
    /// to a chunk of bytes and their top two bits in a plane ([`QMatrix::q6_at`]), 6.6 bits a weight
    /// instead of 8.6. The f32 kernels expand a record into the 8-bit layout's bytes in registers (so
    /// their results are the 8-bit layout's, bit for bit); the integer kernel multiplies the unsigned
    /// bytes with 8-bit activation codes (`vpdpbusd` / `vpmaddubsw`) and takes `32 · Σ x` back off.
    Q6,
    /// A 6-bit tile widened for a prefill task's integer rows ([`QMatrix::tile_as_bytes`]): each
    /// chunk as [`six::grouped`] gives it (the unsigned `q`, four inputs of a column per lane, 8 bits
    /// a weight), which the integer kernel then loads instead of expanding it again per 4 or 8 rows;
    /// the same integers, so the 6-bit tile's results. Never built from a file, never given to the
    /// f32 kernels.
    Q6x,
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
    /// K-quant factors (see [`build::Factors`]): `Some(g)` when every block's scale (and offset) is
    /// a super-block factor shared by `g` consecutive blocks times the block's own 8-bit integer. The
    /// records then hold only quants (no head: 32-byte aligned loads) and each tile's run of `g` record
    /// groups starts with a header of its columns' f32 factors and the runs' integers
    /// ([`QMatrix::factor_at`]). The kernels multiply the two back — the same f32 the product was (an
    /// f16 times an 8-bit integer is exact) — so the bits are those of f32 heads, at 4.75 bits per
    /// Q4_K weight instead of 6 (Q6_K: 8.6 instead of 10). Stored as log2 `g` (super-blocks are 8 or
    /// 16 blocks; the kernels find a block's header with a shift).
    sub: Option<u32>,
    /// Bytes of one such header (0 without `sub`).
    sh: usize,
    /// Bytes of one tile's records and headers.
    tb: usize,
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

/// Rows one kernel call computes per read of a weight tile on this machine (8 with AVX-512, 4 with
/// AVX2): more rows read the tile again.
pub(crate) fn rows_per_pass() -> usize {
    kernel::max_rows()
}

impl QMatrix {
    fn bytes_per_block(kind: QKind, bl: usize) -> usize {
        match kind {
            QKind::Q4 => bl / 2,
            QKind::Q8 => bl,
            QKind::Q5 => bl / 2 + bl / 8,
            QKind::Q6 => bl / 2 + bl / 4,
            QKind::Q6x => bl,
            QKind::F16 | QKind::Bf16 => 2 * bl,
        }
    }

    /// Blocks per column.
    fn nb(&self) -> usize {
        self.k >> self.bl.trailing_zeros()
    }

    /// Byte offset of the record of panel `p`, block `b`.
    #[inline]
    fn record(&self, p: usize, b: usize) -> usize {
        // branch-free: without `sub`, `sh` is 0
        let headers = ((b >> self.sub.unwrap_or(0)) + 1) * self.sh;
        p / TILE_PANELS * self.tb + headers + (b * TILE_PANELS + p % TILE_PANELS) * self.rec
    }

    /// With `sub`: how far an offset's factor and integer lie from the scale's (see `factor_at`).
    #[inline]
    fn offset_factors(&self) -> (usize, usize) {
        (4 * P * TILE_PANELS, (TILE_PANELS * P) << self.sub.unwrap_or(0))
    }

    /// With `sub`: the byte offsets of the f32 super-block factor and of the 8-bit integer of panel
    /// `p`'s first column in block `b` (of its scale, or with `m` of its offset; the panel's other 7
    /// columns follow each). A header is `[f32 scale factors, tile's panels × 8 columns][the offsets'
    /// the same][scale integers, g blocks × panels × 8 columns][the offsets' the same]`.
    #[inline]
    fn factor_at(&self, p: usize, b: usize, m: bool) -> (usize, usize) {
        let g = self.sub.unwrap_or(0);
        let header = p / TILE_PANELS * self.tb + (b >> g) * (self.sh + ((TILE_PANELS * self.rec) << g));
        let (v, pairs) = (p % TILE_PANELS, 1 + self.offsets as usize);
        let (f, i) = (
            header + 4 * P * v,
            header + 4 * P * TILE_PANELS * pairs + ((b & ((1 << g) - 1)) * TILE_PANELS + v) * P,
        );
        let (df, di) = self.offset_factors();
        if m {
            (f + df, i + di)
        } else {
            (f, i)
        }
    }

    /// With `sub`: the scales and offsets of the tile of panel `p0` (its first), `HEADS` per block (see
    /// [`HEADS`]), each the product the kernels would form: on AVX2 a long call's kernel calls (4 rows
    /// each) read them as f32 heads instead of each forming them (`kernel::prepared_heads_pay`).
    fn expand_heads(&self, p0: usize) -> Option<Vec<f32>> {
        self.sub?;
        let mut out = vec![0f32; self.nb() * HEADS];
        let half = if self.offsets { 2 } else { 1 };
        for (b, heads) in out.chunks_exact_mut(HEADS).enumerate() {
            for (m, heads) in heads.chunks_exact_mut(HEADS / 2).take(half).enumerate() {
                // the tile's 4 panels' factors and integers are consecutive from its first panel's
                let (f, i) = self.factor_at(p0, b, m == 1);
                for (c, h) in heads.iter_mut().enumerate() {
                    *h = self.product_at(f + 4 * c, i + c);
                }
            }
        }
        Some(out)
    }

    /// With `sub`: the f32 factor at byte `f` times the 8-bit integer at byte `i` (a scale or offset).
    fn product_at(&self, f: usize, i: usize) -> f32 {
        let bytes = self.bytes_slice();
        f32_at(bytes, f) * bytes[i] as i8 as f32
    }

    /// The pointer the SIMD kernels take for a tile's expanded `heads` (null: the records' own heads),
    /// checked to cover every block.
    fn heads_ptr(&self, heads: Option<&[f32]>) -> *const f32 {
        assert!(heads.is_none_or(|h| h.len() >= self.nb() * HEADS));
        heads.map_or(std::ptr::null(), <[f32]>::as_ptr)
    }

    pub(crate) fn bytes_slice(&self) -> &[u8] {
        // SAFETY: `Line` is `repr(C)` around `[u8; 64]` (size 64, no padding).
        unsafe { std::slice::from_raw_parts(self.data.as_ptr() as *const u8, self.data.len() * 64) }
    }

    /// The record bytes (the kernels read them through this pointer).
    fn base(&self) -> *const u8 {
        self.data.as_ptr() as *const u8
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

    /// Whether the 8-bit-activation (integer) kernel exists for this matrix (4- to 8-bit quants).
    pub fn has_int8(&self) -> bool {
        matches!(self.kind, QKind::Q4 | QKind::Q8 | QKind::Q5 | QKind::Q6 | QKind::Q6x) && self.k.is_multiple_of(QK)
    }

    /// Whether the integer kernel meets this matrix's weights with 16-bit activation codes (the 8-bit
    /// layout) rather than bytes (4-, 5- and 6-bit weights).
    pub(super) fn wide_acts(&self) -> bool {
        self.kind == QKind::Q8
    }

    /// The rows of `x` marked in `which` quantized as this matrix's integer kernel reads them.
    fn quantize(&self, x: &[f32], which: &[bool]) -> acts::QuantRows {
        let q = acts::QuantRows::new(x, self.k, which, self.wide_acts());
        match self.kind {
            QKind::Q6 | QKind::Q6x => q.with_sums16(self.k, which),
            _ => q,
        }
    }

    /// As [`QMatrix::matmul`], with the rows marked in `int8` (one flag per row, or empty for none)
    /// computed from 8-bit activations by the integer kernel ([`kernel_int`]) when the matrix has one
    /// ([`QMatrix::has_int8`]); every other row as `matmul` computes it, bit for bit.
    pub fn matmul_rows(&self, x: &[f32], rows: usize, int8: &[bool]) -> Vec<f32> {
        let (n, k, nb) = (self.n, self.k, self.nb());
        assert_eq!(x.len(), rows * k, "activations are rows × k");
        assert!(int8.is_empty() || int8.len() == rows, "one flag per row");
        let int8 = Some(int8).filter(|m| self.has_int8() && m.iter().any(|&v| v));
        let quant = int8.map(|m| self.quantize(x, m));
        // Not zeroed: the tasks below write every element once (a prefill's outputs are tens of MB a
        // matmul; zeroing them first was ~3% of a 1.5B prefill).
        let mut out: Vec<f32> = Vec::with_capacity(rows * n);
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
        assert!(tiles * TILE_PANELS * P >= n, "the tiles cover every output column");
        let chunks = rows.div_ceil(ROW_CHUNK);
        let dst = Out(out.spare_capacity_mut().as_mut_ptr() as *mut f32);
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
        // Prefill with K-quant factors on the AVX2 kernels: each tile's scales and offsets multiplied
        // out once per call, not once per 4 rows in every kernel call (past `PREP_GROUPS` kernel calls
        // a tile; see `kernel::prepared_heads_pay`).
        let big = rows > PREP_GROUPS * kernel::max_rows();
        // and walks each tile in two passes of two panels where registers hold two (`kernel::Walk`)
        let walk = if big {
            kernel::Walk::Cached
        } else {
            kernel::Walk::Stream
        };
        let expand = big && self.sub.is_some() && kernel::prepared_heads_pay();
        let expanded: Option<Vec<Vec<f32>>> = expand.then(|| {
            (0..tiles)
                .into_par_iter()
                .filter_map(|t| self.expand_heads(t * TILE_PANELS))
                .collect()
        });
        let six = self.kind == QKind::Q6 && big;
        (0..tiles * chunks).into_par_iter().with_max_len(max_len).for_each(|t| {
            let (chunk, tile) = (t / tiles, t % tiles);
            let r1 = ((chunk + 1) * ROW_CHUNK).min(rows);
            let mut r = chunk * ROW_CHUNK;
            let heads = expanded.as_ref().map(|e| e[tile].as_slice());
            // Prefill over 6-bit records: the tile widened once for the task's rows, instead of
            // every 4- or 8-row kernel call expanding it again — to the 8-bit layout for f32 rows,
            // to the integer kernel's unsigned bytes for integer rows where that pays (the 8-bit
            // layout's would meet 16-bit codes: other results); the same values either way.
            let int_rows = int8.map_or(0, |m| m[r..r1].iter().filter(|&&v| v).count());
            let wide = (six && r1 - r - int_rows > kernel::max_rows()).then(|| self.tile_as_q8(tile));
            let bytes =
                (six && int_rows > kernel::max_rows() && kernel::widened_bytes_pay()).then(|| self.tile_as_bytes(tile));
            let (w, tp0) = match &wide {
                Some(w) => (w, 0),
                None => (self, tile * TILE_PANELS),
            };
            let (wi, ti0) = match &bytes {
                Some(w) => (w, 0),
                None => (self, tile * TILE_PANELS),
            };
            while r < r1 {
                let mut rr = (r1 - r).min(kernel::max_rows());
                let mut y: kernel::Acc = [[0f32; P]; kernel::MAX_ROWS * TILE_PANELS];
                let (p0, rxs) = (tp0, &xs[r * nb..]);
                match (int8, &quant) {
                    (Some(m), Some(q)) => {
                        // a group of consecutive rows of one mode
                        rr = m[r..r + rr].iter().take_while(|&&v| v == m[r]).count();
                        if m[r] {
                            kernel_int::run_int(wi, ti0, q, r, &rxs[..rr * nb], heads, rr, walk, &mut y);
                        } else {
                            kernel::run(w, p0, &x[r * k..(r + rr) * k], &rxs[..rr * nb], heads, rr, walk, &mut y);
                        }
                    }
                    _ => kernel::run(w, p0, &x[r * k..(r + rr) * k], &rxs[..rr * nb], heads, rr, walk, &mut y),
                }
                for i in 0..rr {
                    for v in 0..TILE_PANELS {
                        let c0 = (tile * TILE_PANELS + v) * P;
                        let live = P.min(n.saturating_sub(c0));
                        let at = dst.at((r + i) * n + c0);
                        if live == P {
                            // SAFETY: as below, for the panel's `P` columns (all below `n`).
                            unsafe { (at as *mut [f32; P]).write_unaligned(y[i * TILE_PANELS + v]) };
                            continue;
                        }
                        for (j, val) in y[i * TILE_PANELS + v][..live].iter().enumerate() {
                            // SAFETY: `(r + i) < rows` and `c0 + j < n`, so the index is inside `out`
                            // (`rows × n`); tasks own disjoint (row chunk, column tile) pairs, so no two
                            // threads write the same element, and `out` outlives the parallel loop.
                            unsafe { *at.add(j) = *val };
                        }
                    }
                }
                r += rr;
            }
        });
        // SAFETY: the tasks wrote all `rows × n` elements: the row chunks cover `0..rows`, each task's
        // loop every row of its chunk, and the tiles' panels (`np` padded to whole tiles) every
        // column below `n` (`live` stops at `n`).
        unsafe { out.set_len(rows * n) };
        out
    }
}

/// The f32 stored little-endian at byte `at`.
fn f32_at(bytes: &[u8], at: usize) -> f32 {
    f32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
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
