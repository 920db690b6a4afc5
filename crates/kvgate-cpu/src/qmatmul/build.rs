//! Building a [`QMatrix`]'s records from columns of blocks (the loaders' canonical form: per block a
//! scale `d`, an offset `m` and its quants), and stacking matrices. The record format is chosen from
//! the values themselves and never changes one: f16 heads only when every scale and offset is exactly
//! an f16, offsets left out only when every one is exactly `ratio · d`, K-quant factors (integers in the
//! records, super-block factors in a header) only when every product is exactly the scale or offset.

use candle_core::quantized::GgmlDType;

use super::{f32_at, Line, QKind, QMatrix, P, QK, TILE_PANELS};
use crate::repack;

fn f16le(b: &[u8]) -> f32 {
    half::f16::from_le_bytes([b[0], b[1]]).to_f32()
}

/// One column's blocks in the canonical (block-major) form the loaders produce: per block `d`, `m`
/// and 32 quants, and a K-quant's factors of `d` and `m` when it has them.
struct Column<'a> {
    d: &'a [f32],
    m: &'a [f32],
    q: Box<dyn Fn(usize, usize) -> i32 + 'a>,
    sub: Option<Sub<'a>>,
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
        let size = if half { 2 } else { 4 };
        let pairs = if offsets && ratio.is_none() { 2 } else { 1 };
        let head = if sub.is_some() { 0 } else { size * P * pairs };
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
            sub,
            sh: sub.map_or(0, |g| (4 + (1 << g)) * P * TILE_PANELS * pairs),
            tb: 0,
            head,
            rec,
            data: vec![],
        };
        w.tb = nb * TILE_PANELS * rec + sub.map_or(0, |g| (nb >> g) * w.sh);
        w.data = vec![Line([0; 64]); (np / TILE_PANELS * w.tb).div_ceil(64)];
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
                match (&col.sub, sub) {
                    (Some(s), Some(lg)) => {
                        let g = 1 << lg;
                        let mut put_factor = |m: bool, f: f32, i: i8| {
                            let (at_f, at_i) = w.factor_at(p, b, m);
                            bytes[at_i + j] = i as u8;
                            if b % g == 0 {
                                bytes[at_f + 4 * j..at_f + 4 * j + 4].copy_from_slice(&f.to_le_bytes());
                            }
                        };
                        put_factor(false, s.sd[b / g], s.sc[b]);
                        if offsets {
                            put_factor(true, s.sm[b / g], s.mn[b]);
                        }
                    }
                    _ => {
                        put(bytes, at + size * j, col.d[b]);
                        if offsets && ratio.is_none() {
                            put(bytes, at + size * (P + j), col.m[b]);
                        }
                    }
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
            q: Box::new(move |b, e| bits[c * k + b * QK + e] as i32),
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

    /// A matrix of 8-bit signed quants in blocks of 16 inputs, block-major (`d[c · k/16 + b]`, quants
    /// `q[(c · k/16 + b) · 16 + e]`), no offsets: Q6_K's layout after [`crate::repack::q6_k`]; `f`:
    /// the factors of `d` (super-block `d` times 8-bit scale), if any.
    pub(crate) fn from_blocks16(n: usize, k: usize, d: Vec<f32>, q: Vec<i8>, f: Option<&Factors>) -> QMatrix {
        let (bl, nb) = (QK / 2, k / (QK / 2));
        assert_eq!(d.len(), n * nb, "one scale per block");
        assert_eq!(q.len(), n * k, "one quant per weight");
        let zeros = vec![0f32; nb];
        let (d, q, zeros) = (&d, &q, &zeros);
        Self::build(QKind::Q8, n, k, bl, |c| Column {
            d: &d[c * nb..(c + 1) * nb],
            m: zeros,
            q: Box::new(move |b, e| q[(c * nb + b) * bl + e] as i32),
            sub: f.and_then(|f| f.column(c, n, nb)),
        })
    }

    /// Repacks a GGUF tensor's data (`n` rows of `k`) of any format the kernels take (Q4_0, Q4_1,
    /// Q8_0, F16, BF16 directly; Q5_0, Q5_1, Q4_K, Q5_K, Q6_K through [`crate::repack`]; `five_bit`
    /// keeps 5-bit formats at 5 bits); `None` for other formats or a `k` that is not a multiple of 32.
    pub fn from_ggml(dtype: GgmlDType, data: &[u8], n: usize, k: usize, five_bit: bool) -> Option<QMatrix> {
        if !k.is_multiple_of(QK) {
            return None;
        }
        let halves = || -> Vec<u16> { data.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]])).collect() };
        match dtype {
            GgmlDType::Q4_0 => Some(QMatrix::from_q4_0(data, n, k)),
            GgmlDType::Q4_1 => Some(QMatrix::from_q4_1(data, n, k)),
            GgmlDType::Q8_0 => Some(QMatrix::from_q8_0(data, n, k)),
            GgmlDType::Q5_0 => repack::q5_0(data, n, k, five_bit),
            GgmlDType::Q5_1 => repack::q5_1(data, n, k, five_bit),
            GgmlDType::Q4K => repack::q4_k(data, n, k),
            GgmlDType::Q5K => repack::q5_k(data, n, k, five_bit),
            GgmlDType::Q6K => repack::q6_k(data, n, k),
            GgmlDType::F16 => QMatrix::from_halves(QKind::F16, &halves(), n, k),
            GgmlDType::BF16 => QMatrix::from_halves(QKind::Bf16, &halves(), n, k),
            _ => None,
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
                q: Box::new(move |b, e| parts[i].quant(src, b, e)),
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
