//! Bit-exact codecs for the quantized cache formats, matching NVIDIA's so that the CUDA kernels produce
//! the same bytes: FP8 E4M3 ("fn"), FP8 E5M2, and NVFP4 (E2M1 values with an E4M3 scale per 16).
//!
//! All encoders round to nearest, ties to even, and saturate to the largest finite value (`satfinite`).
//! NaN has one defined code whatever its sign: E4M3 `0x7F`, E5M2 `0x7F`, E2M1 `0` (the format has no
//! NaN).

pub mod fp8;
pub mod int8;
pub mod nvfp4;

pub use fp8::{e4m3_to_f32, e5m2_to_f32, f32_to_e4m3, f32_to_e5m2, E4M3_LUT, E4M3_MAX, E5M2_MAX};
pub use nvfp4::{e2m1_to_f32, f32_to_e2m1, nvfp4_decode_group, nvfp4_encode_group, nvfp4_encode_with_scale, E2M1_MAX};
