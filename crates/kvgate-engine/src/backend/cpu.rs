//! The CPU backend: the model's shared layer code over a host [`KvCache`] with the CPU paged attention
//! of `kvgate-kv`. The forward pass runs inside the rayon compute pool (one hand-off per step, not one
//! per parallel region: the engine thread is not a pool worker).

use kvgate_kv::{CacheShape, CpuAttention, KvCache, KvDtype, Which};
use kvgate_model::{Batch, Model};

use super::{check_batch, Backend, BackendError, KvStats};
use crate::kv_manager::BlockCopy;

/// Model + host cache.
#[derive(Debug)]
pub struct CpuBackend {
    model: Model,
    cache: KvCache,
}

impl CpuBackend {
    /// A backend running `model` over a zeroed cache of `num_blocks` blocks of `shape`.
    pub fn new(model: Model, shape: CacheShape, num_blocks: usize) -> CpuBackend {
        CpuBackend {
            model,
            cache: KvCache::new(shape, num_blocks),
        }
    }

    fn check(&self, b: &Batch) -> Result<(), BackendError> {
        check_batch(
            b,
            self.cache.num_blocks(),
            self.cache.shape().block_size(),
            self.attention_span(),
        )
    }
}

fn forward_error(e: kvgate_model::ModelError) -> BackendError {
    BackendError::Forward(e.to_string())
}

impl Backend for CpuBackend {
    fn device(&self) -> String {
        "cpu".into()
    }

    fn cache_shape(&self) -> CacheShape {
        *self.cache.shape()
    }

    fn num_blocks(&self) -> usize {
        self.cache.num_blocks()
    }

    fn vocab_size(&self) -> usize {
        self.model.config().vocab_size
    }

    fn max_positions(&self) -> usize {
        self.model.max_positions()
    }

    fn attention_span(&self) -> Option<usize> {
        self.model.config().attention_span()
    }

    fn copy_blocks(&mut self, copies: &[BlockCopy]) -> Result<(), BackendError> {
        let num_blocks = self.cache.num_blocks();
        for c in copies {
            for b in [c.src, c.dst] {
                if b.index() >= num_blocks {
                    return Err(BackendError::BlockOutOfRange {
                        block: b.index(),
                        num_blocks,
                    });
                }
            }
            self.cache.copy_block(c.src.index(), c.dst.index());
        }
        Ok(())
    }

    fn forward(&mut self, batch: &Batch) -> Result<Vec<f32>, BackendError> {
        self.check(batch)?;
        let (model, cache) = (&self.model, &mut self.cache);
        rayon::scope(|_| model.forward(batch, cache, &CpuAttention)).map_err(forward_error)
    }

    fn measure_kv(&mut self, batch: &Batch) -> Result<KvStats, BackendError> {
        self.check(batch)?;
        let shape = self
            .cache
            .shape()
            .with_dtype(KvDtype::F32)
            .map_err(|e| BackendError::Forward(e.to_string()))?;
        let blocks = batch
            .tables
            .iter()
            .filter_map(|t| t.iter().max())
            .max()
            .map_or(1, |&m| m as usize + 1);
        let mut scratch = KvCache::new(shape, blocks.min(self.cache.num_blocks()));
        let model = &self.model;
        let (_, amax) =
            rayon::scope(|_| model.forward_with_amax(batch, &mut scratch, &CpuAttention)).map_err(forward_error)?;
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

    fn set_kv_offsets(&mut self, offsets: &[(Vec<f32>, Vec<f32>)]) -> Result<(), BackendError> {
        for (l, (k, v)) in offsets.iter().enumerate().take(self.cache.shape().num_layers()) {
            self.cache
                .set_offsets(l, k.clone(), v.clone())
                .map_err(|e| BackendError::Forward(e.to_string()))?;
        }
        Ok(())
    }

    fn set_kv_scales(&mut self, scales: &[(f32, f32)]) -> Result<(), BackendError> {
        for (l, &(k, v)) in scales.iter().enumerate().take(self.cache.shape().num_layers()) {
            self.cache
                .set_scales(l, k, v)
                .map_err(|e| BackendError::Forward(e.to_string()))?;
        }
        Ok(())
    }
}
