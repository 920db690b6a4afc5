//! The CPU backend: the model's shared layer code over a host [`KvCache`] with the CPU paged attention
//! of `kvgate-kv`, behind the `kvgate_backend` seam. The forward pass runs inside the rayon compute
//! pool (one hand-off per step, not one per parallel region: the engine thread is not a pool worker).
//! Its one device-specific setting is the 8-bit-activation path (on by default in `serve`) for
//! [`Precision::Fast`](kvgate_backend::Precision) rows; it sizes its cache from the host's available
//! memory when asked for the default.

use kvgate_backend::{
    check_batch, Backend, BackendError, Batch, BatchError, BlockCopy, CalibrationReport, Capacity, Device,
    KvCalibration, KvMemory, KvStats, SlotCopy, StepOutput, TreeGrain, Want,
};
use kvgate_kv::{CacheShape, CpuAttention, KvCache, KvDtype, KvQuant, Which};

use crate::model::Model;

/// The CPU backend's settings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuSettings {
    /// Rows of [`Precision::Fast`](kvgate_backend::Precision) sequences compute their matmuls from
    /// 8-bit activations where the weight format has the integer kernel
    /// ([`crate::QMatrix::matmul_rows`]): faster, not f32 accuracy (`--activations int8`).
    pub int8_activations: bool,
}

/// A host cache described by its blocks: what callers that size the cache themselves open (tests,
/// benches, tools; `serve` sizes it from `--kv-cache-memory` through its factory).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CpuCache {
    /// Tokens per block.
    pub block_size: usize,
    /// Blocks.
    pub num_blocks: usize,
    /// Element format.
    pub dtype: KvDtype,
    /// How a quantized cache is written.
    pub quant: KvQuant,
    /// The backend's settings.
    pub settings: CpuSettings,
}

impl Default for CpuCache {
    /// 512 blocks of 16 tokens as float32, exact activations.
    fn default() -> CpuCache {
        CpuCache {
            block_size: 16,
            num_blocks: 512,
            dtype: KvDtype::F32,
            quant: KvQuant::PLAIN,
            settings: CpuSettings::default(),
        }
    }
}

/// Model + host cache.
#[derive(Debug)]
pub struct CpuBackend {
    model: Model,
    cache: KvCache,
    settings: CpuSettings,
    /// [`Backend::fast_path`], fixed at construction.
    fast: Option<&'static str>,
    budget_bytes: u64,
    /// xxh3 of the model's configuration and embedding (see [`model_fingerprint`]).
    model_fingerprint: u64,
}

/// A fingerprint of the model: its configuration, token embedding and final norm, hashed once.
fn model_fingerprint(model: &Model) -> u64 {
    use xxhash_rust::xxh3::Xxh3;
    let mut h = Xxh3::new();
    h.update(format!("{:?}", model.config()).as_bytes());
    let w = model.weights();
    h.update(w.embed.raw());
    for x in &w.final_norm {
        h.update(&x.to_le_bytes());
    }
    h.digest()
}

/// The name of the CPU's fast path.
const INT8_PATH: &str = "int8-activations";

impl CpuBackend {
    /// A backend running `model` over a zeroed cache of `num_blocks` blocks of `shape`.
    pub fn new(model: Model, shape: CacheShape, num_blocks: usize) -> CpuBackend {
        CpuBackend {
            cache: KvCache::new(shape, num_blocks),
            settings: CpuSettings::default(),
            fast: None,
            budget_bytes: num_blocks as u64 * shape.bytes_per_block() as u64,
            model_fingerprint: model_fingerprint(&model),
            model,
        }
    }

    /// `model` over the cache `c` describes.
    pub fn with_cache(model: Model, c: CpuCache) -> Result<CpuBackend, BackendError> {
        let shape = model.config().cache_shape(c.block_size, c.dtype)?.with_quant(c.quant)?;
        CpuBackend::open(model, shape, KvMemory::Blocks(c.num_blocks), c.settings)
    }

    /// A backend running `model` over a cache of `shape` holding what `memory` asks for
    /// ([`KvMemory::Auto`]: [`CpuBackend::default_kv_memory`]).
    pub fn open(
        model: Model,
        shape: CacheShape,
        memory: KvMemory,
        settings: CpuSettings,
    ) -> Result<CpuBackend, BackendError> {
        let (num_blocks, budget_bytes) = memory.resolve(&shape, Self::default_kv_memory)?;
        // the 8-bit path when it is on and some weight has its kernel (on f32 or 2/3-bit weights it
        // would compute what the exact path does: no fast path to key apart)
        let fast = (settings.int8_activations && model.weights().has_int8()).then_some(INT8_PATH);
        Ok(CpuBackend {
            cache: KvCache::new(shape, num_blocks),
            settings,
            fast,
            budget_bytes,
            model_fingerprint: model_fingerprint(&model),
            model,
        })
    }

    /// The default KV memory on the host: a quarter of the available memory, at most 4 GiB, at least
    /// 64 MiB.
    pub fn default_kv_memory() -> u64 {
        let avail = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("MemAvailable:"))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|kb| kb.parse::<u64>().ok())
            })
            .map(|kb| kb * 1024)
            .unwrap_or(8 << 30);
        (avail / 4).clamp(64 << 20, 4 << 30)
    }

    fn check(&self, b: &Batch) -> Result<(), BackendError> {
        check_batch(
            b,
            self.cache.num_blocks(),
            self.cache.shape().block_size(),
            self.model.config().vocab_size,
            self.attention_span(),
        )?;
        // a head cut to the first ids (a draft's) scores only those
        let head = self.head_rows();
        for o in &b.outputs {
            if let Want::Logprobs(ids) = &o.want {
                if let Some(&token) = ids.iter().find(|&&t| t as usize >= head) {
                    return Err(BatchError::Token { token, vocab: head }.into());
                }
            }
        }
        Ok(())
    }

    /// Token ids the output projection scores: the vocabulary, or its first ids where the head was
    /// cut ([`kvgate_model::StoredWeights::keep_head_rows`]).
    fn head_rows(&self) -> usize {
        self.model.weights().lm_head.out_dim()
    }

    /// Runs `batch` on scratch f32 storage (the cache untouched) and reports the per-layer amax of K
    /// and V and their per-channel means.
    fn measure(&self, batch: &Batch) -> Result<KvStats, BackendError> {
        self.check(batch)?;
        let shape = self.cache.shape().with_dtype(KvDtype::F32)?;
        let blocks = batch
            .tables
            .iter()
            .filter_map(|t| t.iter().max())
            .max()
            .map_or(1, |&m| m as usize + 1);
        let mut scratch = KvCache::new(shape, blocks.min(self.cache.num_blocks()));
        let model = &self.model;
        let (_, amax) =
            crate::pool::hot(|| model.forward_with_amax(batch, &mut scratch, &CpuAttention)).map_err(compute_error)?;
        // the means of what the batch wrote, read back from the scratch cache
        let (nkv, hd, bs) = (shape.num_kv_heads(), shape.head_dim(), shape.block_size());
        let n = batch.len().max(1) as f64;
        let mut buf = vec![0f32; hd];
        let means = (0..shape.num_layers())
            .map(|l| {
                let mut mean = |which: Which| {
                    let mut acc = vec![0f64; nkv * hd];
                    for (&seq, &pos) in batch.seq_of_row.iter().zip(&batch.positions) {
                        let (pos, table) = (pos as usize, &batch.tables[seq as usize]);
                        let block = table[pos / bs] as usize;
                        for h in 0..nkv {
                            let x = scratch.layer(l).vector(which, block, h, pos % bs, &mut buf);
                            acc[h * hd..(h + 1) * hd]
                                .iter_mut()
                                .zip(x)
                                .for_each(|(a, &b)| *a += b as f64);
                        }
                    }
                    acc.into_iter().map(|a| (a / n) as f32).collect::<Vec<f32>>()
                };
                (mean(Which::K), mean(Which::V))
            })
            .collect();
        Ok(KvStats { amax, means })
    }
}

fn compute_error(e: kvgate_model::ModelError) -> BackendError {
    BackendError::Compute {
        device: Device::Cpu,
        message: e.to_string(),
    }
}

impl Backend for CpuBackend {
    fn device(&self) -> Device {
        Device::Cpu
    }

    fn cache_shape(&self) -> CacheShape {
        *self.cache.shape()
    }

    fn capacity(&self) -> Capacity {
        Capacity {
            num_blocks: self.cache.num_blocks(),
            bytes_per_block: self.cache.shape().bytes_per_block(),
            budget_bytes: self.budget_bytes,
        }
    }

    fn vocab_size(&self) -> usize {
        self.model.config().vocab_size
    }

    fn hidden_size(&self) -> usize {
        self.model.config().hidden_size
    }

    fn tree_attention(&self) -> bool {
        true
    }

    /// Rows in the lane and the partition of their plain position compute its bits ([`kvgate_kv::LANES`],
    /// [`kvgate_kv::PARTITION`]); a sliding-window layer's span depends on where a row sits, so a model
    /// with one keeps to single paths.
    fn token_trees(&self) -> Option<TreeGrain> {
        (!self.model.config().any_window()).then_some(TreeGrain {
            lanes: kvgate_kv::LANES,
            partition: kvgate_kv::PARTITION,
        })
    }

    fn copy_slots(&mut self, moves: &[SlotCopy]) -> Result<(), BackendError> {
        for m in moves {
            self.cache.copy_slot(m.src, m.dst)?;
        }
        Ok(())
    }

    fn max_positions(&self) -> usize {
        self.model.max_positions()
    }

    fn attention_span(&self) -> Option<usize> {
        self.model.config().attention_span()
    }

    /// The 8-bit-activation path when it is on and some weight has its kernel (decided at construction).
    fn fast_path(&self) -> Option<&'static str> {
        self.fast
    }

    fn rows_per_weight_read(&self) -> Option<usize> {
        Some(crate::qmatmul::rows_per_pass())
    }

    fn copy_blocks(&mut self, copies: &[BlockCopy]) -> Result<(), BackendError> {
        let num_blocks = self.cache.num_blocks();
        for c in copies {
            for b in [c.src, c.dst] {
                if b as usize >= num_blocks {
                    return Err(BackendError::BlockOutOfRange {
                        block: b as usize,
                        num_blocks,
                    });
                }
            }
            self.cache.copy_block(c.src as usize, c.dst as usize);
        }
        Ok(())
    }

    fn read_block(&self, block: u32, out: &mut Vec<u8>) -> Result<(), BackendError> {
        Ok(self.cache.read_block(block as usize, out)?)
    }

    fn write_block(&mut self, block: u32, bytes: &[u8]) -> Result<(), BackendError> {
        Ok(self.cache.write_block(block as usize, bytes)?)
    }

    fn kv_fingerprint(&self) -> u64 {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        h.update(&self.model_fingerprint.to_le_bytes());
        h.update(&self.cache.params_bytes());
        h.digest()
    }

    fn forward(&mut self, batch: &Batch) -> Result<StepOutput, BackendError> {
        self.check(batch)?;
        let (model, cache) = (&self.model, &mut self.cache);
        let int8 = self.settings.int8_activations;
        let out = crate::pool::hot(|| model.forward_split(batch, cache, &CpuAttention, int8)).map_err(compute_error)?;
        let c = self.model.config();
        Ok(StepOutput::from_rows(
            batch,
            out.logits,
            self.head_rows(),
            out.hidden,
            c.hidden_size,
        ))
    }

    fn calibrate(&mut self, how: &KvCalibration, first: Option<&Batch>) -> Result<CalibrationReport, BackendError> {
        let stats = how.batch_to_measure(first)?.map(|b| self.measure(b)).transpose()?;
        let layers = self.cache.shape().num_layers();
        let plan = how.plan(self.cache.shape().dtype(), layers, stats, first.map_or(0, Batch::len))?;
        for (l, &(k, v)) in plan.scales.iter().enumerate().take(layers) {
            self.cache.set_scales(l, k, v)?;
        }
        for (l, (k, v)) in plan.offsets.iter().enumerate() {
            self.cache.set_offsets(l, k.clone(), v.clone())?;
        }
        Ok(plan.report())
    }
}
