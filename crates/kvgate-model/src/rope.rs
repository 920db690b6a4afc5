//! Rotary position embeddings' tables: cos/sin per position and frequency for one RoPE base, with
//! every scaling kvgate reads (linear, Llama 3), computed once from the config. Every backend rotates
//! with these same numbers (the CPU in its layer code, a GPU by uploading them), so a position's angles
//! never differ between devices.

use crate::config::{RopeScaling, RopeStyle};

/// A precomputed cos/sin table for one RoPE base.
#[derive(Debug, Clone)]
pub struct Rope {
    cos: Vec<f32>,
    sin: Vec<f32>,
    half: usize,
    max_pos: usize,
    style: RopeStyle,
}

impl Rope {
    /// Builds the table for positions `0..max_pos` (frequencies in f32 as Hugging Face computes them).
    pub fn new(head_dim: usize, theta: f32, scaling: RopeScaling, max_pos: usize, style: RopeStyle) -> Rope {
        let half = head_dim / 2;
        let inv_freq: Vec<f32> = (0..half)
            .map(|i| {
                let f = 1.0 / theta.powf((2 * i) as f32 / head_dim as f32);
                match scaling {
                    RopeScaling::None => f,
                    RopeScaling::Linear(factor) => f / factor,
                    RopeScaling::Llama3 {
                        factor,
                        low_freq_factor,
                        high_freq_factor,
                        original_max_position,
                    } => {
                        let low_wavelen = original_max_position / low_freq_factor;
                        let high_wavelen = original_max_position / high_freq_factor;
                        let wavelen = 2.0 * std::f32::consts::PI / f;
                        if wavelen < high_wavelen {
                            f
                        } else if wavelen > low_wavelen {
                            f / factor
                        } else {
                            let smooth = (original_max_position / wavelen - low_freq_factor)
                                / (high_freq_factor - low_freq_factor);
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    }
                }
            })
            .collect();
        let mut cos = Vec::with_capacity(max_pos * half);
        let mut sin = Vec::with_capacity(max_pos * half);
        for p in 0..max_pos {
            for f in &inv_freq {
                let a = (p as f32 * f) as f64;
                cos.push(a.cos() as f32);
                sin.push(a.sin() as f32);
            }
        }
        Rope {
            cos,
            sin,
            half,
            max_pos,
            style,
        }
    }

    /// The tables, `max_pos × head_dim / 2` each (position-major): what a device backend uploads so
    /// that its rotations use the CPU's own angles.
    #[inline]
    pub fn cos_sin(&self) -> (&[f32], &[f32]) {
        (&self.cos, &self.sin)
    }

    /// The pairing.
    #[inline]
    pub fn style(&self) -> RopeStyle {
        self.style
    }

    /// Positions the table covers.
    #[inline]
    pub fn max_pos(&self) -> usize {
        self.max_pos
    }

    /// Half the head dimension (pairs rotated per head).
    #[inline]
    pub fn half(&self) -> usize {
        self.half
    }
}
