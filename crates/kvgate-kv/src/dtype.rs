//! The KV-cache element formats (`--kv-cache-dtype`) and their sizes.
//!
//! Sizes are given per stored vector (one token, one KV head, `head_dim` elements) in bytes, scales
//! included, because 4-bit values with per-group scales have no whole number of bytes per element.

use crate::error::KvError;

/// How K and V are stored in the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvDtype {
    /// IEEE f32: the CPU reference.
    F32,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    BF16,
    /// Symmetric int8 with an f16 scale per group of [`INT8_GROUP`] elements (chosen per group by least
    /// squared error near `amax/127`): no calibration; at `head_dim` 64, 68 bytes a vector against
    /// bfloat16's 128.
    Int8,
    /// FP8 E4M3 ("fn": max ±448, no infinities, one NaN code), with a per-layer scale.
    Fp8E4m3,
    /// FP8 E5M2 (max ±57344), with a per-layer scale.
    Fp8E5m2,
    /// NVFP4: E2M1 values, one E4M3 scale per 16 elements, a per-layer f32 global scale.
    Nvfp4,
}

/// Elements that share one int8 scale (an f16); a `head_dim` not a multiple of it ends in a shorter group.
pub const INT8_GROUP: usize = 32;

/// Elements that share one NVFP4 scale byte.
pub const NVFP4_GROUP: usize = 16;

impl KvDtype {
    /// Every dtype, in the order reports list them.
    pub const ALL: [KvDtype; 7] = [
        KvDtype::F32,
        KvDtype::BF16,
        KvDtype::F16,
        KvDtype::Int8,
        KvDtype::Fp8E4m3,
        KvDtype::Fp8E5m2,
        KvDtype::Nvfp4,
    ];

    /// Parses a `--kv-cache-dtype` value. `auto` is resolved by the caller (it depends on the model), so
    /// it is returned as `None`.
    pub fn parse(s: &str) -> Result<Option<KvDtype>, KvError> {
        Ok(Some(match s.trim().to_ascii_lowercase().as_str() {
            "auto" => return Ok(None),
            "float32" | "f32" | "fp32" => KvDtype::F32,
            "float16" | "f16" | "fp16" | "half" => KvDtype::F16,
            "bfloat16" | "bf16" => KvDtype::BF16,
            "int8" | "i8" => KvDtype::Int8,
            "fp8" | "fp8_e4m3" => KvDtype::Fp8E4m3,
            "fp8_e5m2" => KvDtype::Fp8E5m2,
            "nvfp4" => KvDtype::Nvfp4,
            _ => return Err(KvError::UnknownDtype(s.to_string())),
        }))
    }

    /// The canonical name, as `--kv-cache-dtype` spells it and the metrics report it.
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "float32",
            KvDtype::F16 => "float16",
            KvDtype::BF16 => "bfloat16",
            KvDtype::Int8 => "int8",
            KvDtype::Fp8E4m3 => "fp8_e4m3",
            KvDtype::Fp8E5m2 => "fp8_e5m2",
            KvDtype::Nvfp4 => "nvfp4",
        }
    }

    /// Whether the dtype is quantized (stored with scales and written with a [`crate::KvQuant`] method):
    /// the per-layer scaled ones and int8.
    pub fn is_quantized(self) -> bool {
        self.is_scaled() || self == KvDtype::Int8
    }

    /// Whether the dtype uses per-layer scales (`k_scale` / `v_scale`).
    pub fn is_scaled(self) -> bool {
        matches!(self, KvDtype::Fp8E4m3 | KvDtype::Fp8E5m2 | KvDtype::Nvfp4)
    }

    /// Bytes of element data for one vector of `head_dim` elements.
    pub fn data_bytes(self, head_dim: usize) -> usize {
        match self {
            KvDtype::F32 => 4 * head_dim,
            KvDtype::F16 | KvDtype::BF16 => 2 * head_dim,
            KvDtype::Int8 | KvDtype::Fp8E4m3 | KvDtype::Fp8E5m2 => head_dim,
            KvDtype::Nvfp4 => head_dim / 2,
        }
    }

    /// Bytes of scale data for one vector of `head_dim` elements (NVFP4's and int8's per-group scales).
    pub fn scale_bytes(self, head_dim: usize) -> usize {
        match self {
            KvDtype::Nvfp4 => head_dim / NVFP4_GROUP,
            KvDtype::Int8 => 2 * head_dim.div_ceil(INT8_GROUP),
            _ => 0,
        }
    }

    /// Bytes for one vector (one token, one KV head), scales included.
    pub fn bytes_per_vector(self, head_dim: usize) -> usize {
        self.data_bytes(head_dim) + self.scale_bytes(head_dim)
    }

    /// Checks that a model with this `head_dim` and block size can be stored in this dtype.
    pub fn check(self, head_dim: usize, block_size: usize) -> Result<(), KvError> {
        if self == KvDtype::Nvfp4 {
            if !head_dim.is_multiple_of(NVFP4_GROUP) {
                return Err(KvError::Unsupported {
                    dtype: self.name(),
                    reason: format!("head_dim {head_dim} is not a multiple of {NVFP4_GROUP}"),
                });
            }
            if !block_size.is_multiple_of(4) {
                return Err(KvError::Unsupported {
                    dtype: self.name(),
                    reason: format!("block size {block_size} is not a multiple of 4"),
                });
            }
        }
        Ok(())
    }
}

impl std::fmt::Display for KvDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_the_spec_table_at_head_dim_64() {
        assert_eq!(KvDtype::F32.bytes_per_vector(64), 256);
        assert_eq!(KvDtype::BF16.bytes_per_vector(64), 128);
        assert_eq!(KvDtype::F16.bytes_per_vector(64), 128);
        assert_eq!(KvDtype::Fp8E4m3.bytes_per_vector(64), 64);
        assert_eq!(KvDtype::Fp8E5m2.bytes_per_vector(64), 64);
        assert_eq!(KvDtype::Nvfp4.bytes_per_vector(64), 36);
        assert_eq!(KvDtype::Int8.bytes_per_vector(64), 68);
        assert_eq!(KvDtype::Int8.bytes_per_vector(40), 44);
    }

    #[test]
    fn parse_names() {
        assert_eq!(KvDtype::parse("auto").unwrap(), None);
        assert_eq!(KvDtype::parse("fp8").unwrap(), Some(KvDtype::Fp8E4m3));
        for d in KvDtype::ALL {
            assert_eq!(KvDtype::parse(d.name()).unwrap(), Some(d));
        }
        assert!(KvDtype::parse("int3").is_err());
    }

    #[test]
    fn nvfp4_needs_groups_of_16() {
        assert!(KvDtype::Nvfp4.check(64, 16).is_ok());
        assert!(KvDtype::Nvfp4.check(40, 16).is_err());
        assert!(KvDtype::Nvfp4.check(64, 6).is_err());
        assert!(KvDtype::F32.check(40, 6).is_ok());
    }
}
