//! The backend seam from the engine's side, on the tiny model: every row says what it needs back — a
//! decision read asks for the log-probs of its label ids only (never a full-vocabulary row), a
//! completion for logits rows, a prefill chunk for nothing — and those log-probs equal the entries of
//! the log-softmax of the same row; calibration is one typed call. (The `--device` factory and its
//! refusals are tested beside it, in `kvgate-server`'s `backends`.) And the decode
//! floor as the backend sees it: a step that prefilled next to running streams is followed by a
//! decode-only step.

use std::sync::{Arc, Mutex};

use kvgate_backend::{
    Backend, BackendError, Batch, BlockCopy, CalibrationReport, Capacity, Device, KvCalibration, KvMemory, Output,
    Scales, StepOutput, Want,
};
use kvgate_cpu::tiny::{tiny_model, TinySpec};
use kvgate_cpu::{CpuBackend, CpuCache, CpuSettings, Model};
use kvgate_engine::{
    log_softmax, start, DecideRequest, DecisionRead, EngineConfig, Event, GenerateRequest, SamplingParams,
};
use kvgate_kv::{CacheShape, KvDtype};
use kvgate_model::LoadedModel;

/// A backend that records the outputs each batch asked for, then runs the CPU backend.
struct Recording {
    inner: Box<dyn Backend>,
    seen: Arc<Mutex<Vec<Vec<Output>>>>,
    /// Per batch, the rows of each sequence.
    rows: Arc<Mutex<Vec<Vec<usize>>>>,
}

impl Backend for Recording {
    fn device(&self) -> Device {
        self.inner.device()
    }
    fn cache_shape(&self) -> CacheShape {
        self.inner.cache_shape()
    }
    fn capacity(&self) -> Capacity {
        self.inner.capacity()
    }
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }
    fn hidden_size(&self) -> usize {
        self.inner.hidden_size()
    }
    fn max_positions(&self) -> usize {
        self.inner.max_positions()
    }
    fn attention_span(&self) -> Option<usize> {
        self.inner.attention_span()
    }
    fn fast_path(&self) -> Option<&'static str> {
        self.inner.fast_path()
    }
    fn copy_blocks(&mut self, copies: &[BlockCopy]) -> Result<(), BackendError> {
        self.inner.copy_blocks(copies)
    }
    fn read_block(&self, block: u32, out: &mut Vec<u8>) -> Result<(), BackendError> {
        self.inner.read_block(block, out)
    }
    fn write_block(&mut self, block: u32, bytes: &[u8]) -> Result<(), BackendError> {
        self.inner.write_block(block, bytes)
    }
    fn kv_fingerprint(&self) -> u64 {
        self.inner.kv_fingerprint()
    }
    fn forward(&mut self, batch: &Batch) -> Result<StepOutput, BackendError> {
        self.seen.lock().unwrap().push(batch.outputs.clone());
        let mut per = vec![0; batch.tables.len()];
        batch.seq_of_row.iter().for_each(|&t| per[t as usize] += 1);
        self.rows.lock().unwrap().push(per);
        self.inner.forward(batch)
    }
    fn calibrate(&mut self, how: &KvCalibration, first: Option<&Batch>) -> Result<CalibrationReport, BackendError> {
        self.inner.calibrate(how, first)
    }
}

fn tiny() -> LoadedModel<Model> {
    tiny_model(TinySpec::default()).unwrap()
}

/// The tiny model over `blocks` blocks of 4 tokens.
fn cpu(model: Model, blocks: usize) -> Box<dyn Backend> {
    let c = CpuCache {
        block_size: 4,
        num_blocks: blocks,
        ..Default::default()
    };
    Box::new(CpuBackend::with_cache(model, c).unwrap())
}

#[test]
fn reads_ask_for_label_logprobs_and_completions_for_logits() {
    let m = tiny();
    let backend = cpu(tiny().model, 64);
    let tok = Arc::new(m.tokenizer);
    let seen = Arc::new(Mutex::new(vec![]));
    let rec = Recording {
        inner: backend,
        seen: seen.clone(),
        rows: Arc::new(Mutex::new(vec![])),
    };
    let cfg = EngineConfig {
        max_model_len: m.max_model_len,
        ..Default::default()
    };
    let h = start(Box::new(rec), tok.clone(), m.eos_token_ids, cfg).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let prompt = tok.encode("The order shipped late. Is it urgent?", false).unwrap();
    let labels = vec![
        vec![
            tok.encode("yes", false).unwrap()[0],
            tok.encode(" yes", false).unwrap()[0],
        ],
        vec![tok.encode("no", false).unwrap()[0]],
    ];
    let flat: Vec<u32> = labels.iter().flatten().copied().collect();
    let reads = rt.block_on(async {
        let pending = h
            .decide(DecideRequest {
                reads: vec![DecisionRead {
                    prompt: prompt.clone(),
                    labels: labels.clone(),
                    tree: None,
                }],
                cache_salt: Some("seam".into()),
                keep_alive: None,
                tenant: None,
                ..Default::default()
            })
            .unwrap();
        pending.outcome().await.unwrap().reads
    });
    let decision_outputs: Vec<Output> = seen.lock().unwrap().drain(..).flatten().collect();
    assert_eq!(decision_outputs.len(), 1, "one read, one output row");
    assert_eq!(decision_outputs[0].want, Want::Logprobs(flat.clone()));

    // the same prompt's next-token logits, asked as a completion with prompt logprobs
    rt.block_on(async {
        let mut s = h
            .generate(GenerateRequest {
                prompt: prompt.clone(),
                params: SamplingParams {
                    max_tokens: 1,
                    ..Default::default()
                },
                cache_salt: Some("seam-2".into()),
                retain: None,
                breakpoints: vec![],
            })
            .unwrap();
        while let Some(e) = s.next().await {
            if matches!(e, Event::Done(_) | Event::Error(_)) {
                break;
            }
        }
    });
    let outs: Vec<Output> = seen.lock().unwrap().drain(..).flatten().collect();
    assert!(!outs.is_empty() && outs.iter().all(|o| o.want == Want::Logits));

    // the read's probabilities are the log-softmax entries of the full row, bit for bit
    let shape = m.model.config().cache_shape(4, KvDtype::F32).unwrap();
    let mut cpu = CpuBackend::new(m.model, shape, 64);
    let mut b = Batch::single_sequence(&prompt, 4);
    let last = prompt.len() - 1;
    b.outputs = vec![
        Output {
            row: last,
            want: Want::Logits,
        },
        Output {
            row: last,
            want: Want::Logprobs(flat.clone()),
        },
    ];
    let out = cpu.forward(&b).unwrap();
    let ls = log_softmax(&out.logits);
    let want: Vec<f64> = labels
        .iter()
        .map(|a| a.iter().map(|&t| (ls[t as usize] as f64).exp()).sum())
        .collect();
    assert_eq!(reads[0].label_probs, want);
    for (lp, &t) in out.logprobs[0].iter().zip(&flat) {
        assert_eq!(lp.to_bits(), ls[t as usize].to_bits());
    }
}

#[test]
fn calibration_is_one_typed_call() {
    let m = tiny();
    let shape = m.model.config().cache_shape(4, KvDtype::Fp8E4m3).unwrap();
    let mut cpu = CpuBackend::open(tiny().model, shape, KvMemory::Blocks(8), CpuSettings::default()).unwrap();
    let measured = KvCalibration {
        scales: Scales::Measured,
        offsets: false,
    };
    assert_eq!(cpu.calibrate(&measured, None), Err(BackendError::CalibrationNeedsBatch));
    let b = Batch::single_sequence(&[1, 2, 3, 4, 5, 6], 4);
    let r = cpu.calibrate(&measured, Some(&b)).unwrap();
    let layers = m.model.config().num_layers;
    assert_eq!((r.scales.len(), r.offset_layers, r.measured_rows), (layers, 0, 6));
    assert!(r.scales.iter().all(|&(k, v)| k > 0.0 && v > 0.0));
    // given scales need no batch; once something is written the cache refuses new ones
    let given = KvCalibration {
        scales: Scales::Given(vec![(0.5, 0.25); layers]),
        offsets: false,
    };
    assert_eq!(cpu.calibrate(&given, None).unwrap().scales.len(), layers);
    cpu.forward(&b).unwrap();
    assert!(matches!(
        cpu.calibrate(&given, None),
        Err(BackendError::Cache(kvgate_kv::KvError::Frozen { .. }))
    ));
}

#[test]
fn a_dropped_decision_frees_its_blocks_and_a_kept_one_answers_once() {
    let m = tiny();
    let tok = Arc::new(m.tokenizer);
    let cfg = EngineConfig {
        max_model_len: m.max_model_len,
        ..Default::default()
    };
    let h = start(cpu(m.model, 64), tok.clone(), m.eos_token_ids, cfg).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let read = |text: &str| DecisionRead {
        prompt: tok.encode(text, false).unwrap(),
        labels: vec![tok.encode("yes", false).unwrap(), tok.encode("no", false).unwrap()],
        tree: None,
    };
    let ask = |reads: Vec<DecisionRead>| DecideRequest {
        reads,
        cache_salt: None,
        keep_alive: None,
        tenant: None,
        ..Default::default()
    };
    rt.block_on(async {
        for i in 0..20 {
            // dropped at once: aborted in the engine whatever step it reached
            drop(
                h.decide(ask(vec![read(&format!("State {i}: the order is late. Urgent?"))]))
                    .unwrap(),
            );
        }
        let o = h
            .decide(ask(vec![read("State: fine. Urgent?"), read("State: fine. Late?")]))
            .unwrap()
            .outcome()
            .await
            .unwrap();
        assert_eq!(o.reads.len(), 2);
        assert!(o.reads.iter().all(|r| r.label_mass > 0.0 && r.label_probs.len() == 2));
        for _ in 0..200 {
            let s = h.stats().await.unwrap();
            if s.active_requests == 0 {
                assert_eq!(s.pool.used, 0, "blocks still held: {s:?}");
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("engine did not return to idle");
    });
}

#[test]
fn a_prefill_next_to_a_stream_is_followed_by_a_decode_only_step() {
    for share in [0.5, 0.0] {
        let m = tiny();
        let backend = cpu(tiny().model, 512);
        let tok = Arc::new(m.tokenizer);
        let rows = Arc::new(Mutex::new(vec![]));
        let rec = Recording {
            inner: backend,
            seen: Arc::new(Mutex::new(vec![])),
            rows: rows.clone(),
        };
        let cfg = EngineConfig {
            max_num_batched_tokens: 16,
            max_model_len: m.max_model_len,
            decode_share: share,
            ..Default::default()
        };
        let h = start(Box::new(rec), tok.clone(), m.eos_token_ids, cfg).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let submit = |prompt: &str, max_tokens: usize| {
            h.generate(GenerateRequest {
                prompt: tok.encode(prompt, false).unwrap(),
                params: SamplingParams {
                    max_tokens,
                    ignore_eos: true,
                    ..Default::default()
                },
                cache_salt: None,
                retain: None,
                breakpoints: vec![],
            })
            .unwrap()
        };
        let drain = |mut s: kvgate_engine::RequestStream| async move {
            while let Some(e) = s.next().await {
                if matches!(e, Event::Done(_) | Event::Error(_)) {
                    break;
                }
            }
        };
        rt.block_on(async {
            // the stream outlives the prompt however late the prompt arrives (a busy machine may
            // run many decode steps first); it is dropped once the prompt is answered, so every
            // prefill chunk has a stream beside it
            let mut stream = submit("A stream that keeps decoding.", 900);
            // once it decodes, a long prompt arrives
            while !matches!(stream.next().await, Some(Event::Token { .. })) {}
            let flood = submit(&"A long prompt arriving while the stream decodes. ".repeat(4), 1);
            let keep_reading = async {
                while let Some(e) = stream.next().await {
                    if matches!(e, Event::Done(_) | Event::Error(_)) {
                        break;
                    }
                }
            };
            tokio::select! {
                _ = drain(flood) => {}
                _ = keep_reading => panic!("the stream ended before the prompt was answered"),
            }
            // the stream goes on until the step after the prompt's last chunk is recorded
            let settled = || {
                let rows = rows.lock().unwrap();
                let last = rows.iter().rposition(|r| r.iter().any(|&n| n > 1));
                last.is_some_and(|l| rows.len() > l + 1)
            };
            while !settled() {
                match stream.next().await {
                    Some(Event::Token { .. }) => {}
                    e => panic!("the stream ended early: {e:?}"),
                }
            }
        });
        let rows = rows.lock().unwrap().clone();
        // steps with a prefill chunk (a sequence with several rows) next to a decode row
        let mixed: Vec<usize> = (0..rows.len())
            .filter(|&i| rows[i].iter().any(|&r| r > 1) && rows[i].contains(&1))
            .collect();
        assert!(
            !mixed.is_empty(),
            "the prompt was prefilled next to the stream: {rows:?}"
        );
        let followed = mixed
            .iter()
            .filter(|&&i| rows.get(i + 1).is_some_and(|n| n.iter().all(|&r| r <= 1)))
            .count();
        if share > 0.0 {
            assert_eq!(
                followed,
                mixed.len(),
                "each is followed by a decode-only step: {rows:?}"
            );
        } else {
            assert!(
                followed < mixed.len(),
                "without the floor prefill goes on at once: {rows:?}"
            );
        }
    }
}
