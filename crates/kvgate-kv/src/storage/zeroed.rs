//! A cache buffer that starts zeroed without being written: large buffers are anonymous memory maps,
//! whose pages the kernel supplies (zeroed) on first touch, so a KV pool of gigabytes costs no time at
//! start-up and no resident memory until blocks are used; small ones are plain vectors.
//!
//! Guarantee: it reads as a slice of zeros until written, whatever its size; it is only ever made of
//! element types for which the all-zero bit pattern is the value zero ([`Plain`]).

use std::ops::{Deref, DerefMut};

use half::{bf16, f16};

/// Element types whose all-zero bytes are a valid value (zero) and that have no padding.
pub trait Plain: Copy + Default + Send + Sync + 'static {}
impl Plain for f32 {}
impl Plain for f16 {}
impl Plain for bf16 {}
impl Plain for u8 {}

/// Buffers of at least this many bytes are memory maps.
const MAP_FROM: usize = 1 << 20;

/// `len` zeroed elements of `T`.
pub enum Zeroed<T: Plain> {
    /// A plain vector (small buffers, or when the map cannot be made).
    Vec(Vec<T>),
    /// `len` elements at the start of an anonymous map.
    Map { map: memmap2::MmapMut, len: usize },
}

impl<T: Plain> Zeroed<T> {
    /// `len` zeros.
    pub fn new(len: usize) -> Zeroed<T> {
        let bytes = len * std::mem::size_of::<T>();
        if bytes >= MAP_FROM {
            if let Ok(map) = memmap2::MmapMut::map_anon(bytes) {
                return Zeroed::Map { map, len };
            }
        }
        Zeroed::Vec(vec![T::default(); len])
    }
}

impl<T: Plain> Deref for Zeroed<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match self {
            Zeroed::Vec(v) => v,
            // SAFETY: the map is page-aligned (aligned for any `T`) and holds `len · size_of::<T>()`
            // bytes, all zero or written as `T`s; `T: Plain` has no invalid bit patterns.
            Zeroed::Map { map, len } => unsafe { std::slice::from_raw_parts(map.as_ptr() as *const T, *len) },
        }
    }
}

impl<T: Plain> DerefMut for Zeroed<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match self {
            Zeroed::Vec(v) => v,
            // SAFETY: as in `deref`, and the map is exclusively borrowed.
            Zeroed::Map { map, len } => unsafe { std::slice::from_raw_parts_mut(map.as_mut_ptr() as *mut T, *len) },
        }
    }
}

impl<T: Plain> Clone for Zeroed<T> {
    fn clone(&self) -> Zeroed<T> {
        let mut c = Zeroed::new(self.len());
        c.copy_from_slice(self);
        c
    }
}

impl<T: Plain> std::fmt::Debug for Zeroed<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Zeroed({} × {})", self.len(), std::any::type_name::<T>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_zero_until_written_small_and_large() {
        for len in [0, 5, MAP_FROM / 4 + 3, 3 * MAP_FROM] {
            let mut z = Zeroed::<f32>::new(len);
            assert_eq!(z.len(), len);
            assert!(z.iter().all(|&v| v == 0.0));
            if len > 0 {
                z[len - 1] = 2.5;
                let c = z.clone();
                assert_eq!(c[len - 1], 2.5);
                assert!(c[..len - 1].iter().all(|&v| v == 0.0));
            }
        }
        let b = Zeroed::<u8>::new(2 * MAP_FROM);
        assert!(matches!(b, Zeroed::Map { .. }) && b.iter().all(|&v| v == 0));
    }
}
