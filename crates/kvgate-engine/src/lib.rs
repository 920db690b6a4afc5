//! kvgate's engine: one thread that owns the scheduler, the block pool and prefix cache, the sequences,
//! the sampler and the decision reads, and runs the model one flat batch per step. The world talks to it
//! through an [`EngineHandle`] and per-request channels; it knows nothing of HTTP.

pub mod block_pool;
pub mod kv_manager;
pub mod scheduler;

#[cfg(test)]
mod scheduler_fuzz;
