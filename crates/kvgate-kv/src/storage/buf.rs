//! One layer's K or V buffer in its element type (f32, f16, bf16, or packed bytes for fp8 and nvfp4),
//! zeroed on first touch ([`Zeroed`]), with byte views of it for the tiers' copies.

use half::{bf16, f16};

use super::Zeroed;
use crate::dtype::KvDtype;

/// One layer's K or V storage (zeroed without being written: see [`Zeroed`]).
#[derive(Debug, Clone)]
pub enum Buf {
    /// f32 elements.
    F32(Zeroed<f32>),
    /// f16 elements.
    F16(Zeroed<f16>),
    /// bf16 elements.
    BF16(Zeroed<bf16>),
    /// Packed bytes (fp8, nvfp4).
    Bytes(Zeroed<u8>),
}

impl Buf {
    pub(super) fn zeros(dtype: KvDtype, elems: usize, bytes: usize) -> Buf {
        match dtype {
            KvDtype::F32 => Buf::F32(Zeroed::new(elems)),
            KvDtype::F16 => Buf::F16(Zeroed::new(elems)),
            KvDtype::BF16 => Buf::BF16(Zeroed::new(elems)),
            _ => Buf::Bytes(Zeroed::new(bytes)),
        }
    }

    pub(super) fn as_bytes_mut(&mut self) -> &mut [u8] {
        fn cast<T>(v: &mut [T]) -> &mut [u8] {
            // SAFETY: f32/f16/bf16 are plain old data without padding and every bit pattern is a valid
            // value; the length is the exact byte size of the slice.
            unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, std::mem::size_of_val(v)) }
        }
        match self {
            Buf::F32(v) => cast(v),
            Buf::F16(v) => cast(v),
            Buf::BF16(v) => cast(v),
            Buf::Bytes(v) => v,
        }
    }

    /// The raw bytes of the buffer (for byte-level comparisons with other implementations).
    pub fn as_bytes(&self) -> &[u8] {
        fn cast<T>(v: &[T]) -> &[u8] {
            // SAFETY: f32/f16/bf16 are plain old data without padding; any byte view of them is valid and
            // the length is the exact byte size of the slice.
            unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
        }
        match self {
            Buf::F32(v) => cast(v),
            Buf::F16(v) => cast(v),
            Buf::BF16(v) => cast(v),
            Buf::Bytes(v) => v,
        }
    }
}
