//! One GGUF tensor as the file stores it: its ggml type, its shape and its bytes — read in place from a
//! read-only memory map of the file (the loader's way: no copy, the page cache is the only one, and a
//! tensor a device uses as stored costs no memory of the process's own), or owned (a tensor made in
//! memory, e.g. by a test quantizing with candle).
//!
//! Guarantees: a tensor's bytes are exactly `rows · cols / block · type_size` bytes of the file
//! (checked when it is made, so a truncated file is an error, never an out-of-bounds read); every
//! dequantization (a whole tensor, or one row of it) goes through candle's own per-block routines, so a
//! row is bit for bit what the whole tensor's dequantization holds at that row.

use std::sync::Arc;

use candle_core::quantized::k_quants::{
    BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8K, BlockQ8_0,
    BlockQ8_1, GgmlType,
};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::Device;

use crate::error::{ModelError, Result};

/// Where a tensor's bytes are.
#[derive(Debug, Clone)]
enum Bytes {
    /// `len` bytes at `at` in a map of the file.
    Mapped {
        map: Arc<memmap2::Mmap>,
        at: usize,
        len: usize,
    },
    /// Bytes of its own.
    Owned(Arc<[u8]>),
}

/// A GGUF tensor: ggml type, shape (`dims[0]` rows of `dims[1]` for a matrix, outermost first), bytes.
#[derive(Debug, Clone)]
pub struct GgufTensor {
    dtype: GgmlDType,
    dims: Vec<usize>,
    bytes: Bytes,
}

/// Bytes of `elems` elements of `dtype`, or `None` when they are not whole blocks.
fn byte_len(dtype: GgmlDType, elems: usize) -> Option<usize> {
    elems
        .is_multiple_of(dtype.block_size())
        .then(|| elems / dtype.block_size() * dtype.type_size())
}

impl GgufTensor {
    /// The tensor of type `dtype` and shape `dims` stored at byte `at` of `map`; an error naming
    /// `name` when its blocks do not fit the file.
    pub(crate) fn mapped(
        map: &Arc<memmap2::Mmap>,
        at: usize,
        dtype: GgmlDType,
        dims: Vec<usize>,
        name: &str,
    ) -> Result<GgufTensor> {
        let elems: usize = dims.iter().product();
        let len = byte_len(dtype, elems).ok_or_else(|| {
            ModelError::Invalid(format!(
                "GGUF tensor '{name}': {elems} elements are not whole {dtype:?} blocks"
            ))
        })?;
        if at.checked_add(len).is_none_or(|end| end > map.len()) {
            return Err(ModelError::Invalid(format!(
                "GGUF tensor '{name}': {len} bytes at {at} run past the end of the file ({} bytes)",
                map.len()
            )));
        }
        Ok(GgufTensor {
            dtype,
            dims,
            bytes: Bytes::Mapped {
                map: map.clone(),
                at,
                len,
            },
        })
    }

    /// A copy of a candle tensor's blocks (tests and tools that quantize in memory).
    pub fn from_qtensor(q: &QTensor) -> Result<GgufTensor> {
        Ok(GgufTensor {
            dtype: q.dtype(),
            dims: q.shape().dims().to_vec(),
            bytes: Bytes::Owned(q.data()?.into_owned().into()),
        })
    }

    /// The ggml type.
    pub fn dtype(&self) -> GgmlDType {
        self.dtype
    }

    /// The shape, outermost first.
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// `(rows, cols)` of a matrix.
    pub fn dims2(&self) -> Result<(usize, usize)> {
        match self.dims[..] {
            [r, c] => Ok((r, c)),
            _ => Err(ModelError::Invalid(format!(
                "a matrix has two dimensions, not {:?}",
                self.dims
            ))),
        }
    }

    /// The stored bytes.
    pub fn data(&self) -> &[u8] {
        match &self.bytes {
            Bytes::Mapped { map, at, len } => &map[*at..*at + *len],
            Bytes::Owned(b) => b,
        }
    }

    /// The matrix's first `n` rows (the same bytes, in place: a view of a mapped tensor, a copy of an
    /// owned one's); an error when it has fewer rows or is not a matrix.
    pub fn first_rows(&self, n: usize) -> Result<GgufTensor> {
        let (rows, cols) = self.dims2()?;
        if n > rows {
            return Err(ModelError::Invalid(format!(
                "the first {n} rows of a tensor of {rows} rows"
            )));
        }
        let len = byte_len(self.dtype, n * cols)
            .ok_or_else(|| ModelError::Invalid(format!("rows of {cols} are not whole {:?} blocks", self.dtype)))?;
        let bytes = match &self.bytes {
            Bytes::Mapped { map, at, .. } => Bytes::Mapped {
                map: map.clone(),
                at: *at,
                len,
            },
            Bytes::Owned(b) => Bytes::Owned(b[..len].into()),
        };
        Ok(GgufTensor {
            dtype: self.dtype,
            dims: vec![n, cols],
            bytes,
        })
    }

    /// Bytes as stored.
    pub fn storage_size_in_bytes(&self) -> usize {
        self.data().len()
    }

    /// Tells the kernel this process is done reading the tensor's pages for now (a device laid it out
    /// in memory of its own): they leave the process's resident set and stay in the page cache, and a
    /// later read (an embedding row looked up) maps them back from the file. A no-op for owned bytes.
    pub fn release_pages(&self) {
        if let Bytes::Mapped { map, at, len } = &self.bytes {
            // SAFETY: the map is a private, read-only mapping of a file this process does not write:
            // dropping its pages loses nothing (they are read again from the file on the next access),
            // and no reference into the range is held across this call by the loaders' callers
            // beyond what a re-read restores.
            let _ = unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, *at, *len) };
        }
    }

    /// The tensor as candle's (a copy of the blocks): for candle's quantized matmul and dequantization.
    pub fn qtensor(&self) -> Result<QTensor> {
        Ok(candle_core::quantized::ggml_file::qtensor_from_ggml(
            self.dtype,
            self.data(),
            self.dims.clone(),
            &Device::Cpu,
        )?)
    }

    /// Every element as f32, row-major.
    pub fn dequantize(&self) -> Result<Vec<f32>> {
        let elems: usize = self.dims.iter().product();
        let mut out = vec![0f32; elems];
        to_float(self.dtype, self.data(), &mut out)?;
        Ok(out)
    }

    /// Row `r` of a matrix as f32, appended to `out` (an embedding lookup: one row dequantized, the
    /// table left as stored).
    pub fn row_into(&self, r: usize, out: &mut Vec<f32>) -> Result<()> {
        let (rows, cols) = self.dims2()?;
        if r >= rows {
            return Err(ModelError::Invalid(format!("row {r} of a tensor of {rows} rows")));
        }
        let len = byte_len(self.dtype, cols)
            .ok_or_else(|| ModelError::Invalid(format!("rows of {cols} are not whole {:?} blocks", self.dtype)))?;
        let start = out.len();
        out.resize(start + cols, 0.0);
        to_float(self.dtype, &self.data()[r * len..(r + 1) * len], &mut out[start..])
    }
}

/// Dequantizes `bytes` (whole blocks of `dtype`) into `out` (one f32 per element) with candle's
/// per-block routine, read from an aligned copy when the bytes are not aligned for the block type.
fn to_float(dtype: GgmlDType, bytes: &[u8], out: &mut [f32]) -> Result<()> {
    fn run<T: GgmlType>(bytes: &[u8], out: &mut [f32]) -> Result<()> {
        let size = std::mem::size_of::<T>();
        if size == 0 || !bytes.len().is_multiple_of(size) || bytes.len() / size * T::BLCK_SIZE != out.len() {
            return Err(ModelError::Invalid(format!(
                "{} bytes are not {} elements of {:?}",
                bytes.len(),
                out.len(),
                T::DTYPE
            )));
        }
        let n = bytes.len() / size;
        if (bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>()) {
            // SAFETY: the pointer is aligned for `T`, `n · size_of::<T>()` bytes are in range, and every
            // ggml block type is plain data (integers, f16/f32 fields: any bit pattern is a value).
            let blocks = unsafe { std::slice::from_raw_parts(bytes.as_ptr() as *const T, n) };
            T::to_float(blocks, out);
        } else {
            let mut aligned: Vec<T> = (0..n).map(|_| T::zeros()).collect();
            // SAFETY: `aligned` holds exactly `n · size` bytes of plain data, written whole.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), aligned.as_mut_ptr() as *mut u8, bytes.len()) };
            T::to_float(&aligned, out);
        }
        Ok(())
    }
    match dtype {
        GgmlDType::F32 => run::<f32>(bytes, out),
        GgmlDType::F16 => run::<half::f16>(bytes, out),
        GgmlDType::BF16 => run::<half::bf16>(bytes, out),
        GgmlDType::Q4_0 => run::<BlockQ4_0>(bytes, out),
        GgmlDType::Q4_1 => run::<BlockQ4_1>(bytes, out),
        GgmlDType::Q5_0 => run::<BlockQ5_0>(bytes, out),
        GgmlDType::Q5_1 => run::<BlockQ5_1>(bytes, out),
        GgmlDType::Q8_0 => run::<BlockQ8_0>(bytes, out),
        GgmlDType::Q8_1 => run::<BlockQ8_1>(bytes, out),
        GgmlDType::Q2K => run::<BlockQ2K>(bytes, out),
        GgmlDType::Q3K => run::<BlockQ3K>(bytes, out),
        GgmlDType::Q4K => run::<BlockQ4K>(bytes, out),
        GgmlDType::Q5K => run::<BlockQ5K>(bytes, out),
        GgmlDType::Q6K => run::<BlockQ6K>(bytes, out),
        GgmlDType::Q8K => run::<BlockQ8K>(bytes, out),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Tensor;

    #[test]
    fn rows_and_whole_tensors_are_candles_dequantization() {
        let (n, k) = (7, 512);
        let vals: Vec<f32> = (0..n * k)
            .map(|i| ((i * 7919 % 2003) as f32 - 1000.0) / 700.0)
            .collect();
        let t = Tensor::from_vec(vals, (n, k), &Device::Cpu).unwrap();
        for dtype in [
            GgmlDType::F32,
            GgmlDType::F16,
            GgmlDType::Q4_0,
            GgmlDType::Q4_1,
            GgmlDType::Q5_0,
            GgmlDType::Q8_0,
            GgmlDType::Q2K,
            GgmlDType::Q3K,
            GgmlDType::Q4K,
            GgmlDType::Q5K,
            GgmlDType::Q6K,
        ] {
            let q = QTensor::quantize(&t, dtype).unwrap();
            let want: Vec<f32> = q
                .dequantize(&Device::Cpu)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let g = GgufTensor::from_qtensor(&q).unwrap();
            assert_eq!(g.dims2().unwrap(), (n, k));
            assert_eq!(g.dequantize().unwrap(), want, "{dtype:?}: whole tensor");
            let mut rows = vec![];
            for r in 0..n {
                g.row_into(r, &mut rows).unwrap();
            }
            assert_eq!(rows, want, "{dtype:?}: row by row");
            assert!(g.row_into(n, &mut rows).is_err(), "{dtype:?}: a row past the end");
            let back = g.qtensor().unwrap();
            assert_eq!(back.data().unwrap(), q.data().unwrap(), "{dtype:?}: as candle's");
            let head = g.first_rows(3).unwrap();
            assert_eq!(head.dims2().unwrap(), (3, k));
            assert_eq!(head.dequantize().unwrap(), want[..3 * k], "{dtype:?}: the first rows");
            assert!(g.first_rows(n + 1).is_err(), "{dtype:?}: more rows than it has");
        }
    }
}
