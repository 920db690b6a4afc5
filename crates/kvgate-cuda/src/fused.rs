//! Fused launches of `kernels/model.cu`: several matmuls over one input (q·k·v), gate·up with the
//! activation, the residual add with the next norm, RoPE of q and k — fewer launches per layer, each
//! computing bit for bit what the separate launches of [`crate::ops`] compute (checked on the emulated
//! device by `tests/host/kernels_test.cpp`).

use cudarc::driver::{CudaSlice, PushKernelArg};

use crate::checked::check_len;
use crate::ops::{elementwise, matmul_grid, per_row, DevMatrix};
use crate::{drv, CudaError, Gpu};

impl Gpu {
    /// Up to three matmuls over the same `x` (`n × cols`) in one launch: `ys[i] = x · ws[i]ᵀ (+ bias)`,
    /// each computed exactly as [`Gpu::matmul`] computes it (q·k·v, gate·up).
    pub fn matmul3(
        &self,
        ys: [Option<&mut CudaSlice<f32>>; 3],
        x: &CudaSlice<f32>,
        ws: [Option<&DevMatrix>; 3],
        n: usize,
    ) -> Result<(), CudaError> {
        let cols = ws.iter().flatten().next().map_or(0, |w| w.cols);
        for (y, w) in ys.iter().zip(&ws) {
            match (y, w) {
                (Some(y), Some(w)) => {
                    if w.cols != cols {
                        return Err(CudaError::Invalid(format!(
                            "matmul3 over {} and {cols} columns",
                            w.cols
                        )));
                    }
                    check_len("y", y.len(), n * w.rows)?;
                }
                (None, None) => {}
                _ => return Err(CudaError::Invalid("matmul3: an output without its matrix".into())),
            }
        }
        check_len("x", x.len(), n * cols)?;
        let total: usize = ws.iter().flatten().map(|w| w.rows).sum();
        if n == 0 || total == 0 {
            return Ok(());
        }
        let f = self.func("matmul3")?;
        let cfg = matmul_grid(total, n);
        // absent matrices: 0 outputs, stand-in pointers never read
        let data: [&CudaSlice<u8>; 3] = ws.map(|w| w.map_or(&self.absent_bytes, |w| &w.data));
        let bias: [&CudaSlice<f32>; 3] = ws.map(|w| w.and_then(|w| w.bias.as_ref()).unwrap_or(&self.absent));
        let [f0, f1, f2] = ws.map(|w| w.map_or(0i32, |w| w.format.code()));
        let [rb0, rb1, rb2] = ws.map(|w| w.map_or(0u64, |w| w.row_bytes as u64));
        let [hb0, hb1, hb2] = ws.map(|w| i32::from(w.is_some_and(|w| w.bias.is_some())));
        let [o0, o1, o2] = ws.map(|w| w.map_or(0i32, |w| w.rows as i32));
        let (c, rows) = (cols as i32, n as i32);
        let mut b = self.stream.launch_builder(&f);
        for y in ys {
            match y {
                Some(y) => b.arg(y),
                // an absent matrix has no outputs: its output is never written
                None => b.arg(&self.absent),
            };
        }
        b.arg(x)
            .arg(data[0])
            .arg(data[1])
            .arg(data[2])
            .arg(&f0)
            .arg(&f1)
            .arg(&f2)
            .arg(&rb0)
            .arg(&rb1)
            .arg(&rb2)
            .arg(bias[0])
            .arg(bias[1])
            .arg(bias[2])
            .arg(&hb0)
            .arg(&hb1)
            .arg(&hb2)
            .arg(&o0)
            .arg(&o1)
            .arg(&o2)
            .arg(&c)
            .arg(&rows);
        // SAFETY: arguments match the kernel; every present output holds n rows of its matrix's outputs,
        // x holds n rows of the shared width; an absent matrix has no outputs, so nothing reads its
        // stand-ins.
        unsafe { b.launch(cfg) }.map_err(drv)?;
        Ok(())
    }

    /// The MLP's first half in one launch: `y = act(x · gateᵀ) · (x · upᵀ)` over `n` rows of `cols`
    /// (`gelu` picks GELU-tanh, else SiLU) — the same bits as two [`Gpu::matmul`]s and
    /// [`Gpu::gated_act`].
    pub fn matmul_gated(
        &self,
        y: &mut CudaSlice<f32>,
        x: &CudaSlice<f32>,
        gate: &DevMatrix,
        up: &DevMatrix,
        n: usize,
        gelu: bool,
    ) -> Result<(), CudaError> {
        if gate.dims() != up.dims() || gate.bias.is_some() || up.bias.is_some() {
            return Err(CudaError::Invalid(format!(
                "matmul_gated over gate {:?} and up {:?} (equal shapes, no biases)",
                gate.dims(),
                up.dims()
            )));
        }
        check_len("x", x.len(), n * gate.cols)?;
        check_len("y", y.len(), n * gate.rows)?;
        if n == 0 {
            return Ok(());
        }
        let f = self.func("matmul_gated")?;
        let cfg = matmul_grid(gate.rows, n);
        let (fg, fu) = (gate.format.code(), up.format.code());
        let (rbg, rbu) = (gate.row_bytes as u64, up.row_bytes as u64);
        let (inter, cols, rows, act) = (gate.rows as i32, gate.cols as i32, n as i32, i32::from(gelu));
        let mut b = self.stream.launch_builder(&f);
        b.arg(y)
            .arg(x)
            .arg(&gate.data)
            .arg(&up.data)
            .arg(&fg)
            .arg(&fu)
            .arg(&rbg)
            .arg(&rbu)
            .arg(&inter)
            .arg(&cols)
            .arg(&rows)
            .arg(&act);
        // SAFETY: arguments match the kernel; x holds n rows of cols, y n rows of the matrices' outputs.
        unsafe { b.launch(cfg) }.map_err(drv)?;
        Ok(())
    }

    /// `x += y`, then `out = RMSNorm(x)` (`rows` rows of `w.len()` values) in one launch: the same
    /// values as [`Gpu::add`] then [`Gpu::rms_norm`].
    #[allow(clippy::too_many_arguments)]
    pub fn add_rms_norm(
        &self,
        x: &mut CudaSlice<f32>,
        y: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
        w: &CudaSlice<f32>,
        rows: usize,
        eps: f32,
        plus_one: bool,
    ) -> Result<(), CudaError> {
        let d = w.len();
        for (what, len) in [("x", x.len()), ("y", y.len()), ("out", out.len())] {
            check_len(what, len, rows * d)?;
        }
        if rows == 0 {
            return Ok(());
        }
        let f = self.func("add_rms_norm")?;
        let (di, p1) = (d as i32, i32::from(plus_one));
        let mut b = self.stream.launch_builder(&f);
        b.arg(x).arg(y).arg(out).arg(w).arg(&di).arg(&eps).arg(&p1);
        // SAFETY: x, y and out hold rows × d values.
        unsafe { b.launch(per_row(rows)) }.map_err(drv)?;
        Ok(())
    }

    /// [`Gpu::rope`] over `q` (`rows × nh` vectors) and `k` (`rows × nkv`) in one launch.
    #[allow(clippy::too_many_arguments)]
    pub fn rope_qk(
        &self,
        q: &mut CudaSlice<f32>,
        k: &mut CudaSlice<f32>,
        cos: &CudaSlice<f32>,
        sin: &CudaSlice<f32>,
        positions: &CudaSlice<u32>,
        rows: usize,
        (nh, nkv, head_dim): (usize, usize, usize),
        interleaved: bool,
    ) -> Result<(), CudaError> {
        check_len("q", q.len(), rows * nh * head_dim)?;
        check_len("k", k.len(), rows * nkv * head_dim)?;
        check_len("positions", positions.len(), rows)?;
        let total = rows * (nh + nkv) * (head_dim / 2);
        if total == 0 {
            return Ok(());
        }
        let f = self.func("rope_qk")?;
        let (r, a, b2, d, style) = (
            rows as i32,
            nh as i32,
            nkv as i32,
            head_dim as i32,
            i32::from(!interleaved),
        );
        let mut b = self.stream.launch_builder(&f);
        b.arg(q)
            .arg(k)
            .arg(cos)
            .arg(sin)
            .arg(positions)
            .arg(&r)
            .arg(&a)
            .arg(&b2)
            .arg(&d)
            .arg(&style);
        // SAFETY: q and k hold every vector, positions every row; table reads are below max_pos (caller).
        unsafe { b.launch(elementwise(total)) }.map_err(drv)?;
        Ok(())
    }
}
