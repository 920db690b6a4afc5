//! Launches of the model kernels (`kernels/model.cu`): a weight matrix on the device as the file stores
//! it ([`DevMatrix`]), and one checked wrapper per kernel. Every wrapper checks that its buffers hold
//! what the launch reads and writes before launching, so a wrong length is a [`CudaError::Invalid`],
//! never an out-of-bounds access.

use candle_core::quantized::GgmlDType;
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use crate::checked::check_len;
use crate::{drv, CudaError, Gpu};

/// How a matrix's rows are stored (the `WF_*` codes of `kernels/model.cu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightFormat {
    /// f32.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    BF16,
    /// ggml Q4_0 (32 elements in 18 bytes).
    Q4_0,
    /// ggml Q4_1 (20 bytes).
    Q4_1,
    /// ggml Q5_0 (22 bytes).
    Q5_0,
    /// ggml Q5_1 (24 bytes).
    Q5_1,
    /// ggml Q8_0 (34 bytes).
    Q8_0,
    /// ggml Q4_K (256 elements in 144 bytes).
    Q4K,
    /// ggml Q5_K (176 bytes).
    Q5K,
    /// ggml Q6_K (210 bytes).
    Q6K,
}

impl WeightFormat {
    /// Every layout the kernels read.
    pub const ALL: [WeightFormat; 11] = [
        WeightFormat::F32,
        WeightFormat::F16,
        WeightFormat::BF16,
        WeightFormat::Q4_0,
        WeightFormat::Q4_1,
        WeightFormat::Q5_0,
        WeightFormat::Q5_1,
        WeightFormat::Q8_0,
        WeightFormat::Q4K,
        WeightFormat::Q5K,
        WeightFormat::Q6K,
    ];

    pub(crate) fn code(self) -> i32 {
        self as i32
    }

    /// The GGUF (ggml) type stored in this layout.
    pub fn gguf(self) -> GgmlDType {
        match self {
            WeightFormat::F32 => GgmlDType::F32,
            WeightFormat::F16 => GgmlDType::F16,
            WeightFormat::BF16 => GgmlDType::BF16,
            WeightFormat::Q4_0 => GgmlDType::Q4_0,
            WeightFormat::Q4_1 => GgmlDType::Q4_1,
            WeightFormat::Q5_0 => GgmlDType::Q5_0,
            WeightFormat::Q5_1 => GgmlDType::Q5_1,
            WeightFormat::Q8_0 => GgmlDType::Q8_0,
            WeightFormat::Q4K => GgmlDType::Q4K,
            WeightFormat::Q5K => GgmlDType::Q5K,
            WeightFormat::Q6K => GgmlDType::Q6K,
        }
    }

    /// The layout of a GGUF type, when a kernel reads it.
    pub fn of_gguf(t: GgmlDType) -> Option<WeightFormat> {
        WeightFormat::ALL.into_iter().find(|f| f.gguf() == t)
    }

    /// `(elements, bytes)` of one storage block.
    pub fn block(self) -> (usize, usize) {
        match self {
            WeightFormat::F32 => (1, 4),
            WeightFormat::F16 | WeightFormat::BF16 => (1, 2),
            WeightFormat::Q4_0 => (32, 18),
            WeightFormat::Q4_1 => (32, 20),
            WeightFormat::Q5_0 => (32, 22),
            WeightFormat::Q5_1 => (32, 24),
            WeightFormat::Q8_0 => (32, 34),
            WeightFormat::Q4K => (256, 144),
            WeightFormat::Q5K => (256, 176),
            WeightFormat::Q6K => (256, 210),
        }
    }

    /// Bytes of one row of `cols` elements, or why that row cannot be stored so.
    pub fn row_bytes(self, cols: usize) -> Result<usize, CudaError> {
        let (e, b) = self.block();
        if cols == 0 || !cols.is_multiple_of(e) {
            return Err(CudaError::Invalid(format!(
                "a {self:?} row of {cols} elements is not a whole number of {e}-element blocks"
            )));
        }
        Ok(cols / e * b)
    }
}

/// A matrix (`rows × cols`, a linear layer's `out × in`) on the device as stored, with its bias.
pub struct DevMatrix {
    pub(crate) data: CudaSlice<u8>,
    pub(crate) format: WeightFormat,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) row_bytes: usize,
    pub(crate) bias: Option<CudaSlice<f32>>,
}

impl DevMatrix {
    /// Uploads `bytes` (`rows` rows of `cols` elements in `format`) and a bias of `rows` values.
    pub fn upload(
        gpu: &Gpu,
        format: WeightFormat,
        rows: usize,
        cols: usize,
        bytes: &[u8],
        bias: Option<&[f32]>,
    ) -> Result<DevMatrix, CudaError> {
        let row_bytes = format.row_bytes(cols)?;
        if bytes.len() != rows * row_bytes {
            return Err(CudaError::Invalid(format!(
                "{} bytes for {rows} {format:?} rows of {cols} ({row_bytes} bytes each)",
                bytes.len()
            )));
        }
        if let Some(b) = bias {
            if b.len() != rows {
                return Err(CudaError::Invalid(format!("a bias of {} for {rows} rows", b.len())));
            }
        }
        Ok(DevMatrix {
            data: gpu.upload(bytes)?,
            format,
            rows,
            cols,
            row_bytes,
            bias: bias.map(|b| gpu.upload(b)).transpose()?,
        })
    }

    /// `(rows, cols)`.
    pub fn dims(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    /// Bytes on the device.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }
}

/// The launch of a matmul kernel over `outputs` outputs and `n` rows: one warp per output and tile of
/// rows (`MM_WARPS` and `MM_ROWS` of `kernels/model.cu`).
pub(crate) fn matmul_grid(outputs: usize, n: usize) -> LaunchConfig {
    const WARPS: u32 = 4; // MM_WARPS
    const ROWS: u32 = 8; // MM_ROWS
    LaunchConfig {
        grid_dim: ((outputs as u32).div_ceil(WARPS), (n as u32).div_ceil(ROWS), 1),
        block_dim: (WARPS * 32, 1, 1),
        shared_mem_bytes: 0,
    }
}

pub(crate) fn per_row(rows: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

pub(crate) fn elementwise(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: ((n as u32).div_ceil(256).max(1), 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl Gpu {
    /// `out[r] = scale · table[tokens[r]]` for the `n` tokens (each below the table's rows: checked
    /// by the caller against the vocabulary, which is the table's rows).
    pub fn embed(
        &self,
        out: &mut CudaSlice<f32>,
        table: &DevMatrix,
        tokens: &CudaSlice<u32>,
        n: usize,
        scale: f32,
    ) -> Result<(), CudaError> {
        check_len("tokens", tokens.len(), n)?;
        check_len("out", out.len(), n * table.cols)?;
        if n == 0 {
            return Ok(());
        }
        let f = self.func("embed")?;
        let chunks = table.cols.div_ceil(32) as u32;
        let cfg = LaunchConfig {
            grid_dim: (chunks.div_ceil(64), n as u32, 1),
            block_dim: (64, 1, 1),
            shared_mem_bytes: 0,
        };
        let (fmt, rb, dim) = (table.format.code(), table.row_bytes as u64, table.cols as i32);
        let mut b = self.stream.launch_builder(&f);
        b.arg(out)
            .arg(&table.data)
            .arg(&fmt)
            .arg(&rb)
            .arg(tokens)
            .arg(&dim)
            .arg(&scale);
        // SAFETY: arguments match the kernel; out holds n rows, tokens n ids, each a row of the table.
        unsafe { b.launch(cfg) }.map_err(drv)?;
        Ok(())
    }

    /// `y = x · Wᵀ (+ bias)` for `n` rows: `x` is `n × cols`, `y` `n × rows`.
    pub fn matmul(&self, y: &mut CudaSlice<f32>, x: &CudaSlice<f32>, w: &DevMatrix, n: usize) -> Result<(), CudaError> {
        check_len("x", x.len(), n * w.cols)?;
        check_len("y", y.len(), n * w.rows)?;
        if n == 0 {
            return Ok(());
        }
        let f = self.func("matmul")?;
        let cfg = matmul_grid(w.rows, n);
        let (bias, has_bias) = match &w.bias {
            Some(b) => (b, 1i32),
            None => (&self.absent, 0),
        };
        let (fmt, rb, out_dim, cols, rows) = (
            w.format.code(),
            w.row_bytes as u64,
            w.rows as i32,
            w.cols as i32,
            n as i32,
        );
        let mut b = self.stream.launch_builder(&f);
        b.arg(y)
            .arg(x)
            .arg(&w.data)
            .arg(&fmt)
            .arg(&rb)
            .arg(bias)
            .arg(&has_bias)
            .arg(&out_dim)
            .arg(&cols)
            .arg(&rows);
        // SAFETY: arguments match the kernel; x, y and the weights hold what it reads and writes.
        unsafe { b.launch(cfg) }.map_err(drv)?;
        Ok(())
    }

    /// RMSNorm of `rows` rows of `w.len()` values of `x` into `out`.
    pub fn rms_norm(
        &self,
        out: &mut CudaSlice<f32>,
        x: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        rows: usize,
        eps: f32,
        plus_one: bool,
    ) -> Result<(), CudaError> {
        let d = w.len();
        check_len("x", x.len(), rows * d)?;
        check_len("out", out.len(), rows * d)?;
        if rows == 0 {
            return Ok(());
        }
        let f = self.func("rms_norm")?;
        let (di, p1) = (d as i32, i32::from(plus_one));
        let mut b = self.stream.launch_builder(&f);
        b.arg(out).arg(x).arg(w).arg(&di).arg(&eps).arg(&p1);
        // SAFETY: x and out hold rows × d values.
        unsafe { b.launch(per_row(rows)) }.map_err(drv)?;
        Ok(())
    }

    /// RMSNorm in place (`rows` rows of `w.len()` values).
    pub fn rms_norm_inplace(
        &self,
        x: &mut CudaSlice<f32>,
        w: &CudaSlice<f32>,
        rows: usize,
        eps: f32,
        plus_one: bool,
    ) -> Result<(), CudaError> {
        let d = w.len();
        check_len("x", x.len(), rows * d)?;
        if rows == 0 {
            return Ok(());
        }
        let f = self.func("rms_norm_inplace")?;
        let (di, p1) = (d as i32, i32::from(plus_one));
        let mut b = self.stream.launch_builder(&f);
        b.arg(x).arg(w).arg(&di).arg(&eps).arg(&p1);
        // SAFETY: x holds rows × d values.
        unsafe { b.launch(per_row(rows)) }.map_err(drv)?;
        Ok(())
    }

    /// `x += y` over `n` values.
    pub fn add(&self, x: &mut CudaSlice<f32>, y: &CudaSlice<f32>, n: usize) -> Result<(), CudaError> {
        check_len("x", x.len(), n)?;
        check_len("y", y.len(), n)?;
        let f = self.func("add")?;
        let n64 = n as u64;
        let mut b = self.stream.launch_builder(&f);
        b.arg(x).arg(y).arg(&n64);
        // SAFETY: both hold n values.
        unsafe { b.launch(elementwise(n)) }.map_err(drv)?;
        Ok(())
    }

    /// Rotates `rows × heads` head vectors of `head_dim` by their row's position, with the tables
    /// `cos`/`sin` (`max_pos × head_dim / 2`); `interleaved` pairs (2i, 2i+1), else (i, i + d/2).
    /// Every position must be below `max_pos` (checked by the caller against the model's positions).
    #[allow(clippy::too_many_arguments)]
    pub fn rope(
        &self,
        x: &mut CudaSlice<f32>,
        cos: &CudaSlice<f32>,
        sin: &CudaSlice<f32>,
        positions: &CudaSlice<u32>,
        rows: usize,
        heads: usize,
        head_dim: usize,
        interleaved: bool,
    ) -> Result<(), CudaError> {
        check_len("x", x.len(), rows * heads * head_dim)?;
        check_len("positions", positions.len(), rows)?;
        let total = rows * heads * (head_dim / 2);
        if total == 0 {
            return Ok(());
        }
        let f = self.func("rope")?;
        let (r, h, d, style) = (rows as i32, heads as i32, head_dim as i32, i32::from(!interleaved));
        let mut b = self.stream.launch_builder(&f);
        b.arg(x)
            .arg(cos)
            .arg(sin)
            .arg(positions)
            .arg(&r)
            .arg(&h)
            .arg(&d)
            .arg(&style);
        // SAFETY: x holds every vector, positions every row; table reads are below max_pos (caller).
        unsafe { b.launch(elementwise(total)) }.map_err(drv)?;
        Ok(())
    }

    /// `gate = act(gate) · up` over `n` values; `gelu` picks GELU-tanh, else SiLU.
    pub fn gated_act(
        &self,
        gate: &mut CudaSlice<f32>,
        up: &CudaSlice<f32>,
        n: usize,
        gelu: bool,
    ) -> Result<(), CudaError> {
        check_len("gate", gate.len(), n)?;
        check_len("up", up.len(), n)?;
        let f = self.func("gated_act")?;
        let (n64, act) = (n as u64, i32::from(gelu));
        let mut b = self.stream.launch_builder(&f);
        b.arg(gate).arg(up).arg(&n64).arg(&act);
        // SAFETY: both hold n values.
        unsafe { b.launch(elementwise(n)) }.map_err(drv)?;
        Ok(())
    }

    /// `x = cap · tanh(x / cap)` over `n` values.
    pub fn softcap(&self, x: &mut CudaSlice<f32>, n: usize, cap: f32) -> Result<(), CudaError> {
        check_len("x", x.len(), n)?;
        let f = self.func("softcap")?;
        let n64 = n as u64;
        let mut b = self.stream.launch_builder(&f);
        b.arg(x).arg(&n64).arg(&cap);
        // SAFETY: x holds n values.
        unsafe { b.launch(elementwise(n)) }.map_err(drv)?;
        Ok(())
    }

    /// `out[k] = x[rows[k]]`, rows of `d` values; every index below `x_rows`.
    pub fn gather_rows(
        &self,
        out: &mut CudaSlice<f32>,
        x: &CudaSlice<f32>,
        x_rows: usize,
        rows: &[u32],
        d: usize,
    ) -> Result<(), CudaError> {
        if let Some(&r) = rows.iter().find(|&&r| r as usize >= x_rows) {
            return Err(CudaError::Invalid(format!("row {r} of {x_rows}")));
        }
        check_len("x", x.len(), x_rows * d)?;
        check_len("out", out.len(), rows.len() * d)?;
        if rows.is_empty() {
            return Ok(());
        }
        let idx = self.upload(rows)?;
        let f = self.func("gather_rows")?;
        let cfg = LaunchConfig {
            grid_dim: ((d as u32).div_ceil(256), rows.len() as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let di = d as i32;
        let mut b = self.stream.launch_builder(&f);
        b.arg(out).arg(x).arg(&idx).arg(&di);
        // SAFETY: every index is a row of x; out holds rows.len() rows.
        unsafe { b.launch(cfg) }.map_err(drv)?;
        Ok(())
    }

    /// The log-probabilities of `ids[r]` under the softmax of logits row `r`, for every row of
    /// `logits` (`ids.len() × vocab`), each id below `vocab`. Only these values leave the device.
    pub fn logprobs(
        &self,
        logits: &CudaSlice<f32>,
        vocab: usize,
        ids: &[Vec<u32>],
    ) -> Result<Vec<Vec<f32>>, CudaError> {
        check_len("logits", logits.len(), ids.len() * vocab)?;
        if let Some(&t) = ids.iter().flatten().find(|&&t| t as usize >= vocab) {
            return Err(CudaError::Invalid(format!("token {t} of a vocabulary of {vocab}")));
        }
        let mut first = Vec::with_capacity(ids.len() + 1);
        let mut flat = Vec::new();
        first.push(0u32);
        for r in ids {
            flat.extend_from_slice(r);
            first.push(flat.len() as u32);
        }
        if flat.is_empty() {
            return Ok(ids.iter().map(|_| Vec::new()).collect());
        }
        let d_ids = self.upload(&flat)?;
        let d_first = self.upload(&first)?;
        let mut out = self.stream.alloc_zeros::<f32>(flat.len()).map_err(drv)?;
        let f = self.func("logprobs")?;
        let cfg = LaunchConfig {
            grid_dim: (ids.len() as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let v = vocab as i32;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&mut out).arg(logits).arg(&v).arg(&d_ids).arg(&d_first);
        // SAFETY: logits hold every row; every id is inside the vocabulary; out holds every entry.
        unsafe { b.launch(cfg) }.map_err(drv)?;
        let host = self.download(&out)?;
        Ok(first
            .windows(2)
            .map(|w| host[w[0] as usize..w[1] as usize].to_vec())
            .collect())
    }

    /// A zeroed f32 buffer of `n` values.
    pub fn zeros_f32(&self, n: usize) -> Result<CudaSlice<f32>, CudaError> {
        self.stream.alloc_zeros::<f32>(n.max(1)).map_err(drv)
    }
}
