//! Building a [`QMatrix`]'s records from columns of blocks (the loaders' canonical form: per block a
//! scale `d`, an offset `m` and its quants), and stacking matrices. The record format is chosen from
//! the values themselves and never changes one: f16 heads only when every scale and offset is exactly
//! an f16, offsets left out only when every one is exactly `ratio · d`, K-quant factors (integers in the
//! records, super-block factors in a header) only when every product is exactly the scale or offset.

use candle_core::quantized::GgmlDType;
use rayon::prelude::*;

use super::{f32_at, Line, QKind, QMatrix, P, QK, TILE_PANELS};
use crate::repack;

/// Bytes read as the signed bytes they store.
fn signed(b: &[u8]) -> &[i8] {
    // SAFETY: `u8` and `i8` have the same size and alignment, and every bit pattern is valid in both.
    unsafe { std::slice::from_raw_parts(b.as_ptr() as *const i8, b.len()) }
}

fn f16le(b: &[u8]) -> f32 {
    half::f16::from_le_bytes([b[0], b[1]]).to_f32()
}

/// One column's blocks in the canonical (block-major) form the loaders produce: per block `d`, `m`
/// and its quants, and a K-quant's factors of `d` and `m` when it has them.
struct Column<'a> {
    d: &'a [f32],
    m: &'a [f32],
    q: Quants<'a>,
    sub: Option<Sub<'a>>,
}

/// A column's quants, block after block (`bl` each): read directly from the loaders' vectors (the
/// build's inner loop is then a slice read, not a call), or through a function (stacking matrices).
enum Quants<'a> {
    /// 4-bit, 16 bytes a block of 32: element `e < 16` in the low nibble of byte `e`, `e + 16` in
    /// its high nibble.
    Nibbles(&'a [u8]),
    /// One byte per element: unsigned 5-bit quants (masked to 5 bits).
    Five(&'a [u8]),
    /// One signed byte per element.
    Signed(&'a [i8]),
    /// One 16-bit pattern per element.
    Halves(&'a [u16]),
    /// Element `e` of block `b`.
    Each(Box<dyn Fn(usize, usize) -> i32 + Sync + 'a>),
}

impl Quants<'_> {
    /// Quant `e` of block `b` (blocks of `bl`).
    #[inline(always)]
    fn at(&self, bl: usize, b: usize, e: usize) -> i32 {
        match self {
            Quants::Nibbles(q) => {
                let byte = q[b * 16 + e % 16];
                (if e < 16 { byte & 0xF } else { byte >> 4 }) as i32
            }
            Quants::Five(q) => (q[b * bl + e] & 31) as i32,
            Quants::Signed(q) => q[b * bl + e] as i32,
            Quants::Halves(q) => q[b * bl + e] as i32,
            Quants::Each(f) => f(b, e),
        }
    }
}

/// One column's K-quant factors: block `b`'s scale is `sd[b / g] · sc[b]` and its offset
/// `sm[b / g] · mn[b]`, `g = blocks / sd.len()` blocks per super-block (its f16 `d` and `−dmin` times
/// the block's own 6-bit scale and min; Q6_K: `d` times an 8-bit scale, no offsets).
struct Sub<'a> {
    sd: &'a [f32],
    sm: &'a [f32],
    sc: &'a [i8],
    mn: &'a [i8],
}

/// The K-quant factors of a whole matrix, column-major like the loaders' `d` (see [`Sub`]): `sd`,
/// `sm` one per column and super-block, `sc`, `mn` one per column and block.
#[derive(Debug, Default)]
pub(crate) struct Factors {
    pub(crate) sd: Vec<f32>,
    pub(crate) sm: Vec<f32>,
    pub(crate) sc: Vec<i8>,
    pub(crate) mn: Vec<i8>,
}

impl Factors {
    /// Column `c`'s factors of a matrix of `n` columns of `nb` blocks, when the vectors have the sizes
    /// that says (else none: the matrix is built with plain heads).
    fn column(&self, c: usize, n: usize, nb: usize) -> Option<Sub<'_>> {
        let ns = self.sd.len() / n.max(1);
        let fits = ns > 0
            && self.sd.len() == n * ns
            && self.sm.len() == n * ns
            && self.sc.len() == n * nb
            && self.mn.len() == n * nb;
        fits.then(|| Sub {
            sd: &self.sd[c * ns..(c + 1) * ns],
            sm: &self.sm[c * ns..(c + 1) * ns],
            sc: &self.sc[c * nb..(c + 1) * nb],
            mn: &self.mn[c * nb..(c + 1) * nb],
        })
    }
}

impl QMatrix {
    /// Builds the panel layout from `n` columns given one at a time, in blocks of `bl` inputs. The
    /// tiles are written in parallel (each owns its bytes: its records and headers).
    fn build<'a>(kind: QKind, n: usize, k: usize, bl: usize, column: impl Fn(usize) -> Column<'a> + Sync) -> QMatrix {
        assert!(bl == QK || bl == QK / 2, "blocks of 16 or 32");
        assert_eq!(k % bl, 0, "k must be a multiple of the block");
        let nb = k / bl;
        let (mut half, mut offsets) = (true, false);
        // Offsets that may be implied (see `ratio`): whether every `m` is exactly `r · d`, per `r`.
        let ratios = [-8.0f32, -16.0];
        let mut implied = [true; 2];
        // K-quant factors (see `Sub`): whether every column has exact ones, `group` blocks per super-block.
        let (mut factored, mut group) = (true, None);
        let is_f16 = |v: f32| half::f16::from_f32(v).to_f32().to_bits() == v.to_bits();
        for c in 0..n {
            let col = column(c);
            half &= col.d.iter().chain(col.m).all(|&v| is_f16(v));
            offsets |= col.m.iter().any(|&v| v != 0.0);
            for (ok, r) in implied.iter_mut().zip(ratios) {
                *ok = *ok && col.d.iter().zip(col.m).all(|(&d, &m)| (d * r).to_bits() == m.to_bits());
            }
            factored &= col.sub.as_ref().is_some_and(|s| {
                let g = nb / s.sd.len().max(1);
                let exact = |f: f32, i: i8, v: f32| (f * i as f32).to_bits() == v.to_bits();
                g.is_power_of_two()
                    && g * s.sd.len() == nb
                    && *group.get_or_insert(g) == g
                    && (0..nb).all(|b| exact(s.sd[b / g], s.sc[b], col.d[b]) && exact(s.sm[b / g], s.mn[b], col.m[b]))
            });
        }
        let ratio = ratios
            .into_iter()
            .zip(implied)
            .find(|&(_, ok)| offsets && ok)
            .map(|(r, _)| r);
        // K-quant factors beat every other head (one byte per scale or offset); f16 heads hold a
        // K-quant's products only by chance.
        let sub = group.filter(|_| factored && n > 0).map(|g: usize| g.trailing_zeros());
        let half = half && sub.is_none();
        let ratio = ratio.filter(|_| sub.is_none());
        let mut w = Self::zeroed(kind, n, k, bl, half, offsets, ratio, sub);
        w.fill(|w, t, tile| {
            for c in w.tile_columns(t) {
                w.write_column(tile, t * w.tb, c, &column(c), half, offsets, ratio.is_none(), sub);
            }
        });
        w
    }

    /// The columns of tile `t` (none past `n`).
    pub(super) fn tile_columns(&self, t: usize) -> std::ops::Range<usize> {
        let start = (t * TILE_PANELS * P).min(self.n);
        start..((t + 1) * TILE_PANELS * P).min(self.n)
    }

    /// Runs `write(matrix, t, bytes)` on every tile `t` in parallel, `bytes` the tile's own (its records
    /// and headers, from byte `t · tb` of the matrix); `matrix` is the layout (its `data` left out).
    pub(super) fn fill(&mut self, write: impl Fn(&QMatrix, usize, &mut [u8]) + Sync) {
        let mut data = std::mem::take(&mut self.data);
        // SAFETY: as in `bytes_slice`, mutably.
        let bytes = unsafe { std::slice::from_raw_parts_mut(data.as_mut_ptr() as *mut u8, data.len() * 64) };
        let me = &*self;
        bytes
            .par_chunks_mut(me.tb.max(1))
            .enumerate()
            .for_each(|(t, tile)| write(me, t, tile));
        self.data = data;
    }

    /// A matrix of `n` columns of `k` inputs in blocks of `bl`, its record format given (f16 heads,
    /// offsets, implied offsets, K-quant factors in super-blocks of `2^sub` blocks), every byte zero.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn zeroed(
        kind: QKind,
        n: usize,
        k: usize,
        bl: usize,
        half: bool,
        offsets: bool,
        ratio: Option<f32>,
        sub: Option<u32>,
    ) -> QMatrix {
        let nb = k / bl;
        let np = n.div_ceil(P).div_ceil(TILE_PANELS) * TILE_PANELS;
        let size = if half { 2 } else { 4 };
        let pairs = if offsets && ratio.is_none() { 2 } else { 1 };
        let head = if sub.is_some() { 0 } else { size * P * pairs };
        let rec = head + Self::bytes_per_block(kind, bl) * P;
        let sh = sub.map_or(0, |g| (4 + (1 << g)) * P * TILE_PANELS * pairs);
        let tb = nb * TILE_PANELS * rec + sub.map_or(0, |g| (nb >> g) * sh);
        QMatrix {
            kind,
            n,
            k,
            bl,
            np,
            half,
            offsets,
            ratio,
            sub,
            sh,
            tb,
            head,
            rec,
            data: vec![Line([0; 64]); (np / TILE_PANELS * tb).div_ceil(64)],
        }
    }

    /// Writes column `c` (heads or factors, quants) into its tile's bytes `tile`, which start at byte
    /// `from` of the matrix.
    #[allow(clippy::too_many_arguments)]
    fn write_column(
        &self,
        tile: &mut [u8],
        from: usize,
        c: usize,
        col: &Column<'_>,
        half: bool,
        offsets: bool,
        stored_m: bool,
        sub: Option<u32>,
    ) {
        let (kind, bl, head) = (self.kind, self.bl, self.head);
        let (p, j) = (c / P, c % P);
        let put = |bytes: &mut [u8], at: usize, v: f32| {
            if half {
                bytes[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
            } else {
                bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
            }
        };
        let size = if half { 2 } else { 4 };
        for b in 0..self.nb() {
            let at = self.record(p, b) - from;
            match (&col.sub, sub) {
                (Some(s), Some(lg)) => {
                    let g = 1 << lg;
                    let mut put_factor = |m: bool, f: f32, i: i8| {
                        let (at_f, at_i) = self.factor_at(p, b, m);
                        tile[at_i - from + j] = i as u8;
                        if b % g == 0 {
                            let at_f = at_f - from + 4 * j;
                            tile[at_f..at_f + 4].copy_from_slice(&f.to_le_bytes());
                        }
                    };
                    put_factor(false, s.sd[b / g], s.sc[b]);
                    if offsets {
                        put_factor(true, s.sm[b / g], s.mn[b]);
                    }
                }
                _ => {
                    put(tile, at + size * j, col.d[b]);
                    if offsets && stored_m {
                        put(tile, at + size * (P + j), col.m[b]);
                    }
                }
            }
            let quants = &mut tile[at + head..at + self.rec];
            let q = |e: usize| col.q.at(bl, b, e);
            match kind {
                QKind::Q4 | QKind::Q5 => {
                    for e in 0..bl {
                        let q = q(e) as u8;
                        let (off, shift) = Self::q4_at(j, e);
                        quants[off] |= (q & 0xF) << shift;
                        if kind == QKind::Q5 {
                            let (off, bit) = Self::q5_high_at(j, e);
                            quants[off] |= ((q >> 4) & 1) << bit;
                        }
                    }
                }
                QKind::Q8 => {
                    for e in 0..bl {
                        quants[j + e * P] = q(e) as i8 as u8;
                    }
                }
                QKind::Q6x => unreachable!("widened 6-bit tiles are made from 6-bit ones"),
                QKind::Q6 => {
                    for e in 0..bl {
                        let q = q(e) + 32;
                        assert!((0..64).contains(&q), "a 6-bit quant is −32..32, got {}", q - 32);
                        let (nib, shift, plane, bit) = Self::q6_at(bl, j, e);
                        quants[nib] |= (q as u8 & 0xF) << shift;
                        quants[plane] |= (q as u8 >> 4) << bit;
                    }
                }
                QKind::F16 | QKind::Bf16 => {
                    // The element's 16 bits; 8 columns' elements are 16 consecutive bytes.
                    for e in 0..bl {
                        let at = 2 * j + 2 * e * P;
                        quants[at..at + 2].copy_from_slice(&(q(e) as u16).to_le_bytes());
                    }
                }
            }
        }
    }

    /// A matrix from block-major per-block scales, offsets and packed quants (see [`crate::repack`]):
    /// 4-bit blocks hold elements `j` and `j + 16` in the low and high nibble of byte `j`, 8-bit blocks
    /// one signed byte per element, 5-bit blocks one byte (`0..32`) per element; `f`: the K-quant
    /// factors of `d` and `m`, if any.
    pub(crate) fn from_parts(
        kind: QKind,
        n: usize,
        k: usize,
        d: Vec<f32>,
        m: Vec<f32>,
        qs: Vec<u8>,
        f: Option<&Factors>,
    ) -> QMatrix {
        let nb = k / QK;
        assert_eq!(d.len(), n * nb, "one scale per block");
        let per_block = if kind == QKind::Q4 { QK / 2 } else { QK };
        assert_eq!(qs.len(), d.len() * per_block, "quant bytes");
        let (d, m, qs) = (&d, &m, &qs);
        Self::build(kind, n, k, QK, |c| Column {
            d: &d[c * nb..(c + 1) * nb],
            m: &m[c * nb..(c + 1) * nb],
            q: match kind {
                QKind::Q4 => Quants::Nibbles(&qs[c * nb * 16..(c + 1) * nb * 16]),
                // SAFETY-free reinterpretation: the loaders' signed bytes as `i8`
                QKind::Q8 => Quants::Signed(signed(&qs[c * nb * 32..(c + 1) * nb * 32])),
                QKind::Q5 => Quants::Five(&qs[c * nb * 32..(c + 1) * nb * 32]),
                QKind::Q6 | QKind::Q6x | QKind::F16 | QKind::Bf16 => {
                    unreachable!("6- and 16-bit weights are built by from_blocks16 and from_halves")
                }
            },
            sub: f.and_then(|f| f.column(c, n, nb)),
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
            q: Quants::Halves(&bits[c * k..(c + 1) * k]),
            sub: None,
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
        Self::from_parts(kind, n, k, d, m, qs, None)
    }

    /// A matrix of signed quants in blocks of 16 inputs, block-major (`d[c · k/16 + b]`, quants
    /// `q[(c · k/16 + b) · 16 + e]`), no offsets: Q6_K's layout after [`crate::repack::q6_k`], as
    /// `kind` [`QKind::Q8`] or (quants within −32..32) [`QKind::Q6`]; `f`: the factors of `d`
    /// (super-block `d` times 8-bit scale), if any.
    #[cfg(test)]
    pub(crate) fn from_blocks16(
        kind: QKind,
        n: usize,
        k: usize,
        d: Vec<f32>,
        q: Vec<i8>,
        f: Option<&Factors>,
    ) -> QMatrix {
        assert!(matches!(kind, QKind::Q8 | QKind::Q6), "blocks of 16 are 8- or 6-bit");
        let (bl, nb) = (QK / 2, k / (QK / 2));
        assert_eq!(d.len(), n * nb, "one scale per block");
        assert_eq!(q.len(), n * k, "one quant per weight");
        let zeros = vec![0f32; nb];
        let (d, q, zeros) = (&d, &q, &zeros);
        Self::build(kind, n, k, bl, |c| Column {
            d: &d[c * nb..(c + 1) * nb],
            m: zeros,
            q: Quants::Signed(&q[c * k..(c + 1) * k]),
            sub: f.and_then(|f| f.column(c, n, nb)),
        })
    }

    /// Repacks a GGUF tensor's data (`n` rows of `k`) of any format the kernels take (Q4_0, Q4_1,
    /// Q8_0, F16, BF16 directly; Q4_K and Q6_K (kept at 6 bits: [`QKind::Q6`]) straight from their
    /// blocks
    /// ([`super::direct`]); Q5_0, Q5_1, Q5_K through [`crate::repack`]; `five_bit` keeps 5-bit formats
    /// at 5 bits); `None` for other formats or a `k` that is not a multiple of 32.
    pub fn from_ggml(dtype: GgmlDType, data: &[u8], n: usize, k: usize, five_bit: bool) -> Option<QMatrix> {
        if !k.is_multiple_of(QK) || !(k * n).is_multiple_of(dtype.block_size()) {
            return None;
        }
        let row = k / dtype.block_size() * dtype.type_size();
        if data.len() != n * row {
            return None;
        }
        let halves = || -> Vec<u16> { data.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]])).collect() };
        match dtype {
            GgmlDType::Q4_0 => Some(QMatrix::from_q4_0(data, n, k)),
            GgmlDType::Q4_1 => Some(QMatrix::from_q4_1(data, n, k)),
            GgmlDType::Q8_0 => Some(QMatrix::from_q8_0(data, n, k)),
            GgmlDType::Q5_0 => repack::q5_0(data, n, k, five_bit),
            GgmlDType::Q5_1 => repack::q5_1(data, n, k, five_bit),
            GgmlDType::Q4K | GgmlDType::Q6K => {
                Self::from_ggml_rows(dtype, n, k, five_bit, |c| &data[c * row..(c + 1) * row])
            }
            GgmlDType::Q5K => repack::q5_k(data, n, k, five_bit),
            GgmlDType::F16 => QMatrix::from_halves(QKind::F16, &halves(), n, k),
            GgmlDType::BF16 => QMatrix::from_halves(QKind::Bf16, &halves(), n, k),
            _ => None,
        }
    }

    /// As [`QMatrix::from_ggml`], the stored bytes of output `c` given by `rows(c)` (several tensors'
    /// rows stacked without copying them side by side first, for Q4_K and Q6_K).
    pub fn from_ggml_rows<'a>(
        dtype: GgmlDType,
        n: usize,
        k: usize,
        five_bit: bool,
        rows: impl Fn(usize) -> &'a [u8] + Sync,
    ) -> Option<QMatrix> {
        match dtype {
            GgmlDType::Q4K => QMatrix::from_q4_k_rows(n, k, rows),
            GgmlDType::Q6K => QMatrix::from_q6_k_rows(n, k, true, rows),
            _ => {
                let data: Vec<u8> = (0..n).flat_map(|c| rows(c).iter().copied()).collect();
                Self::from_ggml(dtype, &data, n, k, five_bit)
            }
        }
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
        let factors: Vec<Option<Factors>> = owner.iter().map(|&(i, c)| parts[i].factors(c)).collect();
        Some(Self::build(first.kind, owner.len(), k, first.bl, |c| {
            let (i, src) = owner[c];
            Column {
                d: &cols[c].0,
                m: &cols[c].1,
                q: Quants::Each(Box::new(move |b, e| parts[i].quant(src, b, e))),
                sub: factors[c].as_ref().and_then(|f| f.column(0, 1, nb)),
            }
        }))
    }

    /// Column `c`'s K-quant factors as stored (see [`Sub`]), when the records hold them.
    fn factors(&self, c: usize) -> Option<Factors> {
        let g = 1 << self.sub?;
        let (bytes, (p, j)) = (self.bytes_slice(), (c / P, c % P));
        let mut f = Factors::default();
        for b in 0..self.nb() {
            for m in [false, true] {
                let (at_f, at_i) = self.factor_at(p, b, m);
                let (i, x) = if m && !self.offsets {
                    (0, 0.0)
                } else {
                    (bytes[at_i + j] as i8, f32_at(bytes, at_f + 4 * j))
                };
                let (ints, xs) = if m {
                    (&mut f.mn, &mut f.sm)
                } else {
                    (&mut f.sc, &mut f.sd)
                };
                ints.push(i);
                if b % g == 0 {
                    xs.push(x);
                }
            }
        }
        Some(f)
    }
}
