//! The engine of an encoder model (BERT family, behind [`EncoderBackend`]: the CPU's is
//! `kvgate_cpu::encoder`): no KV cache, no sampling, only embeddings. One thread owns the model; inputs queue on a channel (bounded by `max_queue`), and
//! each step takes what is waiting — whole inputs, up to a token budget — runs them as one batch and
//! answers each once. Completions and decisions are refused with a 400 naming what the model serves.
//!
//! Guarantees: an input's vector does not depend on its batch (the encoder computes every input on
//! its own); an input whose caller went away before its step is dropped uncomputed; a panic fails the
//! batch it hit and the thread keeps serving.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Instant;

use kvgate_backend::EncoderBackend;
use tokio::sync::oneshot;
use tracing::error;

use crate::error::EngineError;
use crate::inference::{Inference, PendingDecision, PendingEmbedding};
use crate::inference::{Limits, RequestStream};
use crate::kinds::embed::l2_normalize;
use crate::metrics::{EMBEDDINGS, PROMPT_TOKENS};
use crate::request::{DecideRequest, EmbedOutcome, EmbedRequest, GenerateRequest, Usage};

type Job = (EmbedRequest, oneshot::Sender<Result<EmbedOutcome, EngineError>>);

/// A handle to the encoder thread.
pub struct EncoderHandle {
    tx: mpsc::Sender<Option<Job>>,
    queued: Arc<AtomicUsize>,
    alive: Arc<AtomicBool>,
    limits: Limits,
    name: String,
}

impl std::fmt::Debug for EncoderHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncoderHandle").field("limits", &self.limits).finish()
    }
}

/// Starts the encoder thread for `model` (served as `name`): a step batches waiting inputs up to
/// `batch_tokens` tokens; at most `max_queue` inputs wait.
pub fn start_encoder(
    model: Box<dyn EncoderBackend>,
    name: &str,
    batch_tokens: usize,
    max_queue: usize,
) -> Result<EncoderHandle, EngineError> {
    let max_positions = model.max_positions();
    let limits = Limits {
        max_model_len: max_positions,
        max_queue,
        num_blocks: usize::MAX,
        block_size: 1,
        vocab_size: model.vocab_size(),
        hidden_size: model.hidden_size(),
        window_blocks: None,
        tree_attention: false,
    };
    let (tx, rx) = mpsc::channel::<Option<Job>>();
    let (queued, alive) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(true)));
    let (q, a, label) = (queued.clone(), alive.clone(), name.to_string());
    std::thread::Builder::new()
        .name("kvgate-encoder".into())
        .spawn(move || {
            run(model.as_ref(), &rx, &q, batch_tokens.max(max_positions), &label);
            a.store(false, Ordering::SeqCst);
        })
        .map_err(|e| EngineError::Spawn(e.to_string()))?;
    Ok(EncoderHandle {
        tx,
        queued,
        alive,
        limits,
        name: name.to_string(),
    })
}

fn run(model: &dyn EncoderBackend, rx: &mpsc::Receiver<Option<Job>>, queued: &AtomicUsize, budget: usize, label: &str) {
    let mut carry: Option<Job> = None;
    loop {
        let first = match carry.take() {
            Some(j) => j,
            None => match rx.recv() {
                Ok(Some(j)) => j,
                Ok(None) | Err(_) => return,
            },
        };
        let mut batch = vec![first];
        let mut tokens = batch[0].0.prompt.len();
        loop {
            match rx.try_recv() {
                Ok(Some(j)) if tokens + j.0.prompt.len() <= budget => {
                    tokens += j.0.prompt.len();
                    batch.push(j);
                }
                Ok(Some(j)) => {
                    carry = Some(j);
                    break;
                }
                Ok(None) => {
                    fail(batch, EngineError::EngineDead, queued);
                    return;
                }
                Err(_) => break,
            }
        }
        queued.fetch_sub(batch.len(), Ordering::SeqCst);
        batch.retain(|(_, reply)| !reply.is_closed());
        if batch.is_empty() {
            continue;
        }
        let t0 = Instant::now();
        let inputs: Vec<&[u32]> = batch.iter().map(|(r, _)| r.prompt.as_slice()).collect();
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| model.embed(&inputs)));
        let vectors = match out {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => {
                let e = EngineError::Unsupported(e.to_string());
                batch.into_iter().for_each(|(_, r)| drop(r.send(Err(e.clone()))));
                continue;
            }
            Err(_) => {
                error!("the encoder panicked; failing its batch");
                let e = EngineError::Panic("encoder".into());
                batch.into_iter().for_each(|(_, r)| drop(r.send(Err(e.clone()))));
                continue;
            }
        };
        for ((req, reply), mut v) in batch.into_iter().zip(vectors) {
            if req.normalize {
                l2_normalize(&mut v);
            }
            let n = req.prompt.len();
            metrics::counter!(EMBEDDINGS, "model_name" => label.to_string()).increment(1);
            metrics::counter!(PROMPT_TOKENS, "model_name" => label.to_string()).increment(n as u64);
            let usage = Usage {
                cache_write_tokens: 0,
                prompt_tokens: n,
                completion_tokens: 0,
                cached_tokens: 0,
            };
            let _ = reply.send(Ok(EmbedOutcome { embedding: v, usage }));
        }
        tracing::debug!(tokens, secs = t0.elapsed().as_secs_f64(), "encoder batch");
    }
}

fn fail(batch: Vec<Job>, e: EngineError, queued: &AtomicUsize) {
    queued.fetch_sub(batch.len(), Ordering::SeqCst);
    for (_, reply) in batch {
        let _ = reply.send(Err(e.clone()));
    }
}

impl EncoderHandle {
    fn unsupported(&self, what: &str) -> EngineError {
        EngineError::Unsupported(format!(
            "the model '{}' is an embedding model (a sentence encoder): it serves /v1/embeddings, not {what}",
            self.name
        ))
    }
}

impl Inference for EncoderHandle {
    fn limits(&self) -> Limits {
        self.limits
    }

    fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    fn generate(&self, _: GenerateRequest) -> Result<RequestStream, EngineError> {
        Err(self.unsupported("completions"))
    }

    fn decide(&self, _: DecideRequest) -> Result<PendingDecision, EngineError> {
        Err(self.unsupported("decisions"))
    }

    fn generates(&self) -> bool {
        false
    }

    fn embed(&self, req: EmbedRequest) -> Result<PendingEmbedding, EngineError> {
        let l = self.limits;
        if req.prompt.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        if let Some(&id) = req.prompt.iter().find(|&&t| t as usize >= l.vocab_size) {
            return Err(EngineError::InvalidToken {
                id,
                vocab: l.vocab_size,
            });
        }
        l.check_read(req.prompt.len())?;
        if !self.is_alive() {
            return Err(EngineError::EngineDead);
        }
        if self.queued.fetch_add(1, Ordering::SeqCst) >= l.max_queue {
            self.queued.fetch_sub(1, Ordering::SeqCst);
            return Err(EngineError::QueueFull { max_queue: l.max_queue });
        }
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Some((req, tx))).is_err() {
            self.queued.fetch_sub(1, Ordering::SeqCst);
            return Err(EngineError::EngineDead);
        }
        Ok(PendingEmbedding::from(rx))
    }

    fn shutdown(&self) {
        let _ = self.tx.send(None);
    }
}
