//! KV calibration as one typed call: where a scaled cache's per-layer k/v scales come from (none, the
//! checkpoint, or measured on the first prefill), whether a `smooth` method takes per-channel offsets
//! from it, and what a measurement saw. The scale rule (a power of two with headroom) and the plan of
//! what to set ([`KvCalibration::plan`]) are here too, so every backend calibrates alike.

use kvgate_kv::KvDtype;

use crate::batch::Batch;
use crate::error::BackendError;

/// Where the per-layer (k_scale, v_scale) of a scaled cache come from.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum Scales {
    /// 1.0 everywhere (the cache's own default).
    #[default]
    Unit,
    /// Given per layer (from the checkpoint).
    Given(Vec<(f32, f32)>),
    /// Measured on the first batch: the amax of K and V per layer mapped inside the format's range
    /// ([`scales_from_amax`], `--calculate-kv-scales`).
    Measured,
}

/// How a backend sets its cache's per-layer parameters before anything is written.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KvCalibration {
    /// The k/v scales.
    pub scales: Scales,
    /// Per-channel K and V offsets (`smooth` methods): the means of the first batch's K and V.
    pub offsets: bool,
}

impl KvCalibration {
    /// Whether it measures the first batch.
    pub fn needs_batch(&self) -> bool {
        self.scales == Scales::Measured || self.offsets
    }

    /// Whether there is anything to do at all.
    pub fn is_noop(&self) -> bool {
        self.scales == Scales::Unit && !self.offsets
    }
}

/// What a calibration did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CalibrationReport {
    /// The per-layer scales set (empty when none were).
    pub scales: Vec<(f32, f32)>,
    /// Layers whose offsets were set.
    pub offset_layers: usize,
    /// Rows the measurement ran (0 when nothing was measured).
    pub measured_rows: usize,
}

/// Per-layer amax of K and V seen in a forward pass.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KvAmax {
    /// amax of K per layer.
    pub k: Vec<f32>,
    /// amax of V per layer.
    pub v: Vec<f32>,
}

/// What a calibration sets, decided the same way for every backend ([`KvCalibration::plan`]): the
/// per-layer scales, the per-layer `smooth` offsets, and how many rows were measured.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CalibrationPlan {
    /// Per-layer (k_scale, v_scale); empty when none are set.
    pub scales: Vec<(f32, f32)>,
    /// Per-layer (K, V) offsets, at most one entry per layer; empty when none are set.
    pub offsets: Vec<(Vec<f32>, Vec<f32>)>,
    /// Rows the measurement ran (0 when nothing was measured).
    pub measured_rows: usize,
}

impl CalibrationPlan {
    /// What the calibration did, once the backend has set the plan.
    pub fn report(self) -> CalibrationReport {
        CalibrationReport {
            offset_layers: self.offsets.len(),
            scales: self.scales,
            measured_rows: self.measured_rows,
        }
    }
}

impl KvCalibration {
    /// The batch this calibration measures (`first`), `None` when it measures nothing, or
    /// [`BackendError::CalibrationNeedsBatch`] when it measures and none was given.
    pub fn batch_to_measure<'a>(&self, first: Option<&'a Batch>) -> Result<Option<&'a Batch>, BackendError> {
        match (self.needs_batch(), first) {
            (false, _) => Ok(None),
            (true, Some(b)) => Ok(Some(b)),
            (true, None) => Err(BackendError::CalibrationNeedsBatch),
        }
    }

    /// What to set on a cache of `layers` layers of `dtype`, given what the measurement of
    /// [`KvCalibration::batch_to_measure`] saw (`stats`, over `rows` rows).
    pub fn plan(
        &self,
        dtype: KvDtype,
        layers: usize,
        stats: Option<KvStats>,
        rows: usize,
    ) -> Result<CalibrationPlan, BackendError> {
        let scales = match (&self.scales, &stats) {
            (Scales::Unit, _) => vec![],
            (Scales::Given(s), _) => s.clone(),
            (Scales::Measured, Some(st)) => scales_from_amax(dtype, &st.amax),
            (Scales::Measured, None) => return Err(BackendError::CalibrationNeedsBatch),
        };
        let measured_rows = if stats.is_some() { rows } else { 0 };
        let offsets = match stats {
            Some(st) if self.offsets => st.means.into_iter().take(layers).collect(),
            _ => vec![],
        };
        Ok(CalibrationPlan {
            scales,
            offsets,
            measured_rows,
        })
    }
}

/// What one measuring forward pass saw.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KvStats {
    /// Per-layer amax of K and V.
    pub amax: KvAmax,
    /// Per layer, the mean of K and of V over the batch's rows, per (KV head, channel)
    /// (`num_kv_heads × head_dim` each).
    pub means: Vec<(Vec<f32>, Vec<f32>)>,
}

/// The calibrated scale for an observed amax: the power of two at or above `amax / range`, times two.
/// A power of two scales values exactly, so values in the format's normal range round exactly as with
/// scale 1 and only the range moves (away from underflow); the factor two leaves headroom for later
/// prompts that reach further than the first one.
pub fn kv_scale(amax: f32, range: f32) -> f32 {
    if !(amax > 0.0 && amax.is_finite()) {
        return 1.0;
    }
    2f32.powi((amax / range).log2().ceil() as i32 + 1)
}

/// The largest value a dtype stores at scale 1 (nvfp4: its e2m1 maximum times the largest e4m3 group
/// scale).
pub fn dtype_range(dtype: KvDtype) -> f32 {
    match dtype {
        KvDtype::Fp8E4m3 => 448.0,
        KvDtype::Fp8E5m2 => 57344.0,
        KvDtype::Nvfp4 => 448.0 * 6.0,
        _ => 1.0,
    }
}

/// Per-layer (k_scale, v_scale) for `dtype` from measured amax.
pub fn scales_from_amax(dtype: KvDtype, amax: &KvAmax) -> Vec<(f32, f32)> {
    let range = dtype_range(dtype);
    amax.k
        .iter()
        .zip(&amax.v)
        .map(|(&k, &v)| (kv_scale(k, range), kv_scale(v, range)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_are_powers_of_two_with_headroom() {
        assert_eq!(kv_scale(0.0, 448.0), 1.0);
        assert_eq!(kv_scale(f32::NAN, 448.0), 1.0);
        // amax 18 over range 448 → 2^ceil(log2(0.04)) · 2 = 2^-4 · 2
        assert_eq!(kv_scale(18.0, 448.0), 0.125);
        let s = scales_from_amax(
            KvDtype::Fp8E4m3,
            &KvAmax {
                k: vec![18.0],
                v: vec![448.0],
            },
        );
        assert_eq!(s, vec![(0.125, 2.0)]);
    }

    #[test]
    fn what_needs_a_batch() {
        assert!(KvCalibration::default().is_noop());
        let given = KvCalibration {
            scales: Scales::Given(vec![(1.0, 2.0)]),
            offsets: false,
        };
        assert!(!given.needs_batch() && !given.is_noop());
        assert!(KvCalibration { offsets: true, ..given }.needs_batch());
        assert!(KvCalibration {
            scales: Scales::Measured,
            offsets: false
        }
        .needs_batch());
    }
}
