//! The cache's memory: for every layer one K and one V buffer holding `num_blocks` blocks in the layout
//! of [`CacheShape`], plus the layer's `k_scale` / `v_scale`.
//!
//! Writing encodes (quantize-on-store), after the shape's rotation when it has one;
//! [`LayerCache::vector`] decodes one (token, head) vector at a time (in the rotated basis), which is
//! all attention needs, so there is never a dequantized copy of the cache. The scales and the method are
//! frozen by the first write: every block is read with what it was written with.

use half::f16;

use crate::codec::fp8::{f32_to_e4m3, f32_to_e5m2};
use crate::codec::nvfp4::{nvfp4_decode_group, nvfp4_encode_group, nvfp4_encode_with_scale};
use crate::dtype::{KvDtype, INT8_GROUP, NVFP4_GROUP};
use crate::error::KvError;
use crate::layout::CacheShape;
use crate::quant::{self, Rotation, Scales};

mod buf;
mod slots;
mod zeroed;

pub use buf::Buf;
pub use zeroed::Zeroed;

/// Which of a layer's two buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    /// Keys.
    K,
    /// Values.
    V,
}

/// One layer's K and V with their scales.
#[derive(Debug, Clone)]
pub struct LayerCache {
    shape: CacheShape,
    k: Buf,
    v: Buf,
    /// Dequantization scale of K (fp8: `x ≈ q · k_scale`; nvfp4: global scale `gs = 1 / k_scale`).
    pub k_scale: f32,
    /// Dequantization scale of V.
    pub v_scale: f32,
    /// `smooth`: per-(KV head, channel) offsets subtracted from K before storing
    /// (`num_kv_heads × head_dim`; empty: none).
    k_offset: Vec<f32>,
    /// The same for V (attention adds them back to its output).
    v_offset: Vec<f32>,
}

impl LayerCache {
    fn buf(&self, which: Which) -> (&Buf, f32) {
        match which {
            Which::K => (&self.k, self.k_scale),
            Which::V => (&self.v, self.v_scale),
        }
    }

    /// The raw buffer.
    pub fn raw(&self, which: Which) -> &Buf {
        self.buf(which).0
    }

    /// The offsets subtracted from `which` before storing (`num_kv_heads × head_dim`), if any.
    pub fn offsets(&self, which: Which) -> Option<&[f32]> {
        let o = match which {
            Which::K => &self.k_offset,
            Which::V => &self.v_offset,
        };
        (!o.is_empty()).then_some(o.as_slice())
    }

    /// The (token, head) vector stored at `slot`, decoded to f32. For f32 storage this borrows the cache
    /// itself; otherwise it is decoded into `scratch` (at least `head_dim` long).
    #[inline]
    pub fn vector<'a>(
        &'a self,
        which: Which,
        block: usize,
        head: usize,
        token: usize,
        scratch: &'a mut [f32],
    ) -> &'a [f32] {
        let s = &self.shape;
        let hd = s.head_dim;
        let (buf, scale) = self.buf(which);
        let out = &mut scratch[..hd];
        match buf {
            Buf::F32(v) => {
                let o = s.elem_offset(block, head, token);
                return &v[o..o + hd];
            }
            Buf::F16(v) => {
                let o = s.elem_offset(block, head, token);
                half::slice::HalfFloatSliceExt::convert_to_f32_slice(&v[o..o + hd], out);
            }
            Buf::BF16(v) => {
                let o = s.elem_offset(block, head, token);
                // bf16 is the top half of an f32: a shift, which vectorises.
                for (y, x) in out.iter_mut().zip(&v[o..o + hd]) {
                    *y = f32::from_bits((x.to_bits() as u32) << 16);
                }
            }
            Buf::Bytes(b) => {
                let (d, sc) = s.byte_offsets(block, head, token);
                match s.dtype {
                    KvDtype::Int8 => {
                        for (g, (o, q)) in out
                            .chunks_mut(INT8_GROUP)
                            .zip(b[d..d + hd].chunks(INT8_GROUP))
                            .enumerate()
                        {
                            let s = f16::from_le_bytes([b[sc + 2 * g], b[sc + 2 * g + 1]]).to_f32();
                            for (y, &q) in o.iter_mut().zip(q) {
                                *y = f32::from(q as i8) * s;
                            }
                        }
                    }
                    KvDtype::Fp8E4m3 => {
                        // The 7 magnitude bits placed at f32's exponent/mantissa boundary give the value
                        // times 2^-120 (e4m3 subnormals land on f32 subnormals, exactly); the sign is
                        // moved to bit 31. Branch-free, so it vectorises. (The NaN codes are never
                        // written: the encoder only produces them for NaN input.)
                        let (mul, post) = match s.quant.scales {
                            Scales::Layer => (scale * 2f32.powi(120), 1.0),
                            Scales::Fine => {
                                // the vector's own 2^e, folded into the one multiply while it fits
                                let e = b[sc] as i32 - 127;
                                if e <= 7 {
                                    (quant::pow2(e + 120), 1.0)
                                } else {
                                    (2f32.powi(120), quant::pow2(e))
                                }
                            }
                        };
                        for (y, &q) in out.iter_mut().zip(&b[d..d + hd]) {
                            let bits = ((q as u32 & 0x7F) << 20) | ((q as u32 & 0x80) << 24);
                            *y = f32::from_bits(bits) * mul;
                        }
                        if post != 1.0 {
                            out.iter_mut().for_each(|y| *y *= post);
                        }
                    }
                    KvDtype::Fp8E5m2 => {
                        let scale = match s.quant.scales {
                            Scales::Layer => scale,
                            Scales::Fine => quant::pow2(b[sc] as i32 - 127),
                        };
                        // An e5m2 byte is the top byte of an IEEE half: widen, convert (F16C), scale.
                        let mut h = [half::f16::ZERO; 256];
                        for (o, q) in out.chunks_mut(256).zip(b[d..d + hd].chunks(256)) {
                            let h = &mut h[..q.len()];
                            for (x, &v) in h.iter_mut().zip(q) {
                                *x = half::f16::from_bits((v as u16) << 8);
                            }
                            half::slice::HalfFloatSliceExt::convert_to_f32_slice(&*h, o);
                            o.iter_mut().for_each(|y| *y *= scale);
                        }
                    }
                    KvDtype::Nvfp4 => {
                        let gs = 1.0 / scale;
                        for g in 0..hd / NVFP4_GROUP {
                            nvfp4_decode_group(
                                &b[d + g * 8..d + g * 8 + 8],
                                b[sc + g],
                                gs,
                                &mut out[g * NVFP4_GROUP..(g + 1) * NVFP4_GROUP],
                            );
                        }
                    }
                    _ => unreachable!("element dtypes are not stored as bytes"),
                }
            }
        }
        out
    }

    /// The stored bytes of one (block, head) — its elements or codes, and its scales (byte dtypes) — for
    /// a prefetch hint; `None` for a block outside the cache.
    pub fn stored_bytes(&self, which: Which, block: usize, head: usize) -> Option<(&[u8], &[u8])> {
        let s = &self.shape;
        let n = s.block_size * s.head_dim;
        let at = s.elem_offset(block, head, 0);
        match self.buf(which).0 {
            Buf::F32(v) => v.get(at..at + n).map(|x| (as_bytes(x), &[][..])),
            Buf::F16(v) => v.get(at..at + n).map(|x| (as_bytes(x), &[][..])),
            Buf::BF16(v) => v.get(at..at + n).map(|x| (as_bytes(x), &[][..])),
            Buf::Bytes(b) => {
                let (d, sc) = s.byte_offsets(block, head, 0);
                let data = b.get(d..d + s.block_size * s.dtype.data_bytes(s.head_dim))?;
                Some((data, b.get(sc..sc + s.block_size * s.scale_bytes())?))
            }
        }
    }

    /// Tokens `from..to` of one (block, head), decoded: `(to − from) · head_dim` values, placed at
    /// `[token · head_dim ..]` of the returned slice (so index by token within the block). For f32
    /// storage this borrows the cache; otherwise the tokens are decoded into `scratch`
    /// (`block_size · head_dim` long).
    #[inline]
    pub fn block_vectors<'a>(
        &'a self,
        which: Which,
        block: usize,
        head: usize,
        from: usize,
        to: usize,
        scratch: &'a mut [f32],
    ) -> &'a [f32] {
        let s = &self.shape;
        let hd = s.head_dim;
        if let Buf::F32(v) = self.buf(which).0 {
            let o = s.elem_offset(block, head, 0);
            return &v[o..o + s.block_size * hd];
        }
        if let (Buf::Bytes(b), KvDtype::Int8) = (self.buf(which).0, s.dtype) {
            if from < to {
                let (d, sc) = s.byte_offsets(block, head, from);
                let stride = s.scale_bytes();
                crate::codec::int8::decode_vectors(
                    &b[d..d + (to - from) * hd],
                    &b[sc..sc + (to - from) * stride],
                    stride,
                    hd,
                    to - from,
                    &mut scratch[from * hd..to * hd],
                );
            }
            return &scratch[..s.block_size * hd];
        }
        for t in from..to {
            // Every non-f32 dtype decodes into the scratch it is given.
            self.vector(which, block, head, t, &mut scratch[t * hd..(t + 1) * hd]);
        }
        &scratch[..s.block_size * hd]
    }

    fn write_vector(&mut self, which: Which, block: usize, head: usize, token: usize, x: &[f32]) {
        let s = self.shape;
        let hd = s.head_dim;
        let (buf, scale) = match which {
            Which::K => (&mut self.k, self.k_scale),
            Which::V => (&mut self.v, self.v_scale),
        };
        match buf {
            Buf::F32(v) => {
                let o = s.elem_offset(block, head, token);
                v[o..o + hd].copy_from_slice(x);
            }
            Buf::F16(v) => {
                let o = s.elem_offset(block, head, token);
                half::slice::HalfFloatSliceExt::convert_from_f32_slice(&mut v[o..o + hd], x);
            }
            Buf::BF16(v) => {
                let o = s.elem_offset(block, head, token);
                half::slice::HalfFloatSliceExt::convert_from_f32_slice(&mut v[o..o + hd], x);
            }
            Buf::Bytes(b) => {
                let (d, sc) = s.byte_offsets(block, head, token);
                let mut inv = 1.0 / scale;
                let fine = s.quant.scales == Scales::Fine;
                if fine && matches!(s.dtype, KvDtype::Fp8E4m3 | KvDtype::Fp8E5m2) {
                    let amax = x.iter().fold(0f32, |m, v| if v.abs() > m { v.abs() } else { m });
                    let e = quant::fp8_vector_exponent(amax, s.dtype);
                    b[sc] = (e + 127) as u8;
                    inv = quant::pow2(-e);
                }
                match s.dtype {
                    KvDtype::Int8 => {
                        // scales after the data (sc > d)
                        let (data, scales) = b.split_at_mut(sc);
                        let groups = data[d..d + hd].chunks_mut(INT8_GROUP).zip(x.chunks(INT8_GROUP));
                        for ((q, xs), s) in groups.zip(scales.chunks_exact_mut(2)) {
                            s.copy_from_slice(&quant::int8_encode_group(xs, q).to_le_bytes());
                        }
                    }
                    KvDtype::Fp8E4m3 => {
                        for (q, &v) in b[d..d + hd].iter_mut().zip(x) {
                            *q = f32_to_e4m3(v * inv);
                        }
                    }
                    KvDtype::Fp8E5m2 => {
                        for (q, &v) in b[d..d + hd].iter_mut().zip(x) {
                            *q = f32_to_e5m2(v * inv);
                        }
                    }
                    KvDtype::Nvfp4 => {
                        let groups = hd / NVFP4_GROUP;
                        let mut scales = [0u8; 64];
                        for g in 0..groups {
                            let xs = &x[g * NVFP4_GROUP..(g + 1) * NVFP4_GROUP];
                            let data = &mut b[d + g * 8..d + g * 8 + 8];
                            if fine {
                                scales[g] = quant::nvfp4_best_scale(xs, inv);
                                nvfp4_encode_with_scale(xs, inv, scales[g], data);
                            } else {
                                nvfp4_encode_group(xs, inv, data, &mut scales[g]);
                            }
                        }
                        b[sc..sc + groups].copy_from_slice(&scales[..groups]);
                    }
                    _ => unreachable!("element dtypes are not stored as bytes"),
                }
            }
        }
    }

    fn copy_block(&mut self, src: usize, dst: usize) {
        let s = self.shape;
        let elems = s.num_kv_heads * s.block_size * s.head_dim;
        let bytes = s.layer_block_bytes();
        for buf in [&mut self.k, &mut self.v] {
            match buf {
                Buf::F32(v) => v.copy_within(src * elems..(src + 1) * elems, dst * elems),
                Buf::F16(v) => v.copy_within(src * elems..(src + 1) * elems, dst * elems),
                Buf::BF16(v) => v.copy_within(src * elems..(src + 1) * elems, dst * elems),
                Buf::Bytes(v) => v.copy_within(src * bytes..(src + 1) * bytes, dst * bytes),
            }
        }
    }
}

/// The whole cache: every layer's K and V.
#[derive(Debug, Clone)]
pub struct KvCache {
    shape: CacheShape,
    num_blocks: usize,
    layers: Vec<LayerCache>,
    /// The rotation's sign pattern (empty without rotation).
    signs: Vec<u32>,
    /// Set by the first write: from then on the scales cannot change.
    written: bool,
}

impl KvCache {
    /// A zeroed cache of `num_blocks` blocks, all scales 1.0.
    pub fn new(shape: CacheShape, num_blocks: usize) -> KvCache {
        let elems = num_blocks * shape.num_kv_heads * shape.block_size * shape.head_dim;
        let bytes = num_blocks * shape.layer_block_bytes();
        let layers = (0..shape.num_layers)
            .map(|_| LayerCache {
                shape,
                k: Buf::zeros(shape.dtype, elems, bytes),
                v: Buf::zeros(shape.dtype, elems, bytes),
                k_scale: 1.0,
                v_scale: 1.0,
                k_offset: vec![],
                v_offset: vec![],
            })
            .collect();
        let signs = match shape.quant.rotation {
            Rotation::Hadamard => quant::sign_mask(shape.head_dim),
            Rotation::None => vec![],
        };
        KvCache {
            shape,
            num_blocks,
            layers,
            signs,
            written: false,
        }
    }

    /// The rotation's sign pattern, when the cache's method rotates (attention rotates queries and
    /// un-rotates outputs with it).
    pub fn rotation_signs(&self) -> Option<&[u32]> {
        (!self.signs.is_empty()).then_some(self.signs.as_slice())
    }

    /// The cache's shape.
    pub fn shape(&self) -> &CacheShape {
        &self.shape
    }

    /// Blocks in the pool.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// One layer.
    pub fn layer(&self, layer: usize) -> &LayerCache {
        &self.layers[layer]
    }

    /// Sets a layer's dequantization scales. Refused once anything has been written: a block is always
    /// read with the scales it was written with.
    pub fn set_scales(&mut self, layer: usize, k_scale: f32, v_scale: f32) -> Result<(), KvError> {
        if self.written {
            return Err(KvError::Frozen { layer });
        }
        let lc = self.layers.get_mut(layer).ok_or(KvError::NoLayer(layer))?;
        lc.k_scale = k_scale;
        lc.v_scale = v_scale;
        Ok(())
    }

    /// Sets a layer's K and V offsets (`num_kv_heads × head_dim` each; empty: none), subtracted from
    /// every vector before it is rotated and stored. Only for a `smooth` method, and refused once
    /// anything has been written.
    pub fn set_offsets(&mut self, layer: usize, k: Vec<f32>, v: Vec<f32>) -> Result<(), KvError> {
        if self.written {
            return Err(KvError::Frozen { layer });
        }
        let sh = &self.shape;
        if !sh.quant.smooth {
            return Err(KvError::Unsupported {
                dtype: sh.dtype.name(),
                reason: format!("the {} method keeps no offsets", sh.quant.name()),
            });
        }
        let n = sh.num_kv_heads * sh.head_dim;
        for o in [&k, &v] {
            if !o.is_empty() && o.len() != n {
                return Err(KvError::Unsupported {
                    dtype: sh.dtype.name(),
                    reason: format!("{} offsets for {n} channels", o.len()),
                });
            }
        }
        let lc = self.layers.get_mut(layer).ok_or(KvError::NoLayer(layer))?;
        lc.k_offset = k;
        lc.v_offset = v;
        Ok(())
    }

    /// Quantize-on-store: writes the K and V rows of `slots.len()` tokens (`slot = block · block_size +
    /// offset`; `k`, `v` are `tokens × kv_heads × head_dim`) into layer `layer`.
    pub fn write(&mut self, layer: usize, slots: &[usize], k: &[f32], v: &[f32]) {
        let s = self.shape;
        let row = s.num_kv_heads * s.head_dim;
        debug_assert_eq!(k.len(), slots.len() * row);
        debug_assert_eq!(v.len(), slots.len() * row);
        self.written = true;
        let lc = &mut self.layers[layer];
        let signs = &self.signs;
        let hd = s.head_dim;
        let (mut rk, mut rv) = (vec![0f32; hd], vec![0f32; hd]);
        for (i, &slot) in slots.iter().enumerate() {
            let (block, tok) = (slot / s.block_size, slot % s.block_size);
            for h in 0..s.num_kv_heads {
                let o = i * row + h * hd;
                let (kx, vx) = (&k[o..o + hd], &v[o..o + hd]);
                if signs.is_empty() && lc.k_offset.is_empty() && lc.v_offset.is_empty() {
                    lc.write_vector(Which::K, block, h, tok, kx);
                    lc.write_vector(Which::V, block, h, tok, vx);
                    continue;
                }
                // offsets, then rotation, then the codec
                for (r, x, off) in [(&mut rk, kx, &lc.k_offset), (&mut rv, vx, &lc.v_offset)] {
                    r.copy_from_slice(x);
                    if !off.is_empty() {
                        r.iter_mut().zip(&off[h * hd..(h + 1) * hd]).for_each(|(a, b)| *a -= b);
                    }
                    if !signs.is_empty() {
                        quant::rotate(r, signs);
                    }
                }
                lc.write_vector(Which::K, block, h, tok, &rk);
                lc.write_vector(Which::V, block, h, tok, &rv);
            }
        }
    }

    /// Appends block `b`'s bytes to `out`: every layer's K block then V block, as stored (bitwise; what
    /// [`KvCache::write_block`] takes back). `b` must be below [`KvCache::num_blocks`].
    pub fn read_block(&self, b: usize, out: &mut Vec<u8>) -> Result<(), KvError> {
        self.check_block(b, self.shape.bytes_per_block())?;
        let n = self.shape.layer_block_bytes();
        for l in &self.layers {
            for buf in [&l.k, &l.v] {
                out.extend_from_slice(&buf.as_bytes()[b * n..(b + 1) * n]);
            }
        }
        Ok(())
    }

    /// Overwrites block `b` with bytes [`KvCache::read_block`] gave (exactly
    /// [`CacheShape::bytes_per_block`] of them; anything else is refused with nothing written). The
    /// scales count as used from then on.
    pub fn write_block(&mut self, b: usize, bytes: &[u8]) -> Result<(), KvError> {
        self.check_block(b, bytes.len())?;
        self.written = true;
        let n = self.shape.layer_block_bytes();
        let mut src = bytes.chunks_exact(n);
        for l in &mut self.layers {
            for buf in [&mut l.k, &mut l.v] {
                let part = src.next().expect("length checked");
                buf.as_bytes_mut()[b * n..(b + 1) * n].copy_from_slice(part);
            }
        }
        Ok(())
    }

    fn check_block(&self, b: usize, got: usize) -> Result<(), KvError> {
        let expected = self.shape.bytes_per_block();
        if b >= self.num_blocks || got != expected {
            return Err(KvError::BlockBytes {
                block: b,
                num_blocks: self.num_blocks,
                expected,
                got,
            });
        }
        Ok(())
    }

    /// Everything a block's bytes depend on besides the tokens and the model, as bytes to hash: the
    /// shape (dtype, method, block and head sizes), every layer's scales and offsets, the rotation.
    pub fn params_bytes(&self) -> Vec<u8> {
        let mut out = format!("{:?}", self.shape).into_bytes();
        for l in &self.layers {
            for x in [l.k_scale, l.v_scale].iter().chain(&l.k_offset).chain(&l.v_offset) {
                out.extend_from_slice(&x.to_le_bytes());
            }
        }
        for s in &self.signs {
            out.extend_from_slice(&s.to_le_bytes());
        }
        out
    }

    /// Copies block `src` over block `dst` in every layer (copy-on-write of a shared partial block).
    pub fn copy_block(&mut self, src: usize, dst: usize) {
        for l in &mut self.layers {
            l.copy_block(src, dst);
        }
    }
}

#[cfg(test)]
mod tests;

/// The bytes of a slice of plain numbers (f32, f16, bf16: no padding).
fn as_bytes<T: Copy>(v: &[T]) -> &[u8] {
    // SAFETY: `T` is a plain number type without padding bytes; the view covers exactly `v`'s memory
    // and borrows it.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}
