//! Embeddings through the engine on the tiny model: a hidden row is exactly what the LM head reads
//! (the head of it gives the row's logits bit for bit); last-token and mean pooling equal the pooled
//! rows of a plain single-sequence forward pass, bit for bit, whatever ran next to them (completions
//! in the same batch, chunked prefill, prefix-cache hits, preemption); a dropped embedding frees its
//! blocks.

use kvgate_backend::{Backend, Batch, Output, Want};
use kvgate_cpu::tiny::{tiny_model, TinySpec};
use kvgate_cpu::CpuBackend;
use kvgate_engine::{EmbedRequest, EngineHandle, GenerateRequest, Pooling};
use kvgate_kv::KvDtype;

mod common;

use common::*;

/// Every row's final hidden state of `prompt`, run alone.
fn hidden_rows(prompt: &[u32]) -> (Vec<f32>, usize) {
    let m = tiny_model(TinySpec::default()).unwrap();
    let shape = m.model.config().cache_shape(4, KvDtype::F32).unwrap();
    let d = m.model.config().hidden_size;
    let mut cpu = CpuBackend::new(m.model, shape, 64);
    let mut b = Batch::single_sequence(prompt, 4);
    b.outputs = (0..prompt.len())
        .map(|row| Output {
            row,
            want: Want::Hidden,
        })
        .collect();
    let out = cpu.forward(&b).unwrap();
    assert_eq!((out.width, out.hidden.len()), (d, prompt.len() * d));
    assert!(out.logits.is_empty(), "no head runs for hidden rows");
    (out.hidden, d)
}

/// The reference pooling: the last row, or the f64 mean in position order; then unit length.
fn pooled(rows: &[f32], d: usize, pooling: Pooling) -> Vec<f32> {
    let mut v: Vec<f32> = match pooling {
        Pooling::Last => rows[rows.len() - d..].to_vec(),
        Pooling::Mean => {
            let n = rows.len() / d;
            let mut sum = vec![0f64; d];
            for r in rows.chunks_exact(d) {
                sum.iter_mut().zip(r).for_each(|(s, &x)| *s += x as f64);
            }
            sum.iter().map(|s| (s / n as f64) as f32).collect()
        }
    };
    let norm = v.iter().map(|&x| (x as f64) * (x as f64)).sum::<f64>().sqrt();
    v.iter_mut().for_each(|x| *x = (*x as f64 / norm) as f32);
    v
}

async fn embed(h: &EngineHandle, prompt: &[u32], pooling: Pooling) -> (Vec<f32>, kvgate_engine::Usage) {
    let o = h
        .embed(EmbedRequest {
            prompt: prompt.to_vec(),
            pooling,
            normalize: true,
            cache_salt: None,
        })
        .unwrap()
        .outcome()
        .await
        .unwrap();
    (o.embedding, o.usage)
}

#[test]
fn a_hidden_row_is_what_the_head_reads() {
    let m = tiny_model(TinySpec::default()).unwrap();
    let prompt = m
        .tokenizer
        .encode("The order shipped late. Is it urgent?", false)
        .unwrap();
    let shape = m.model.config().cache_shape(4, KvDtype::F32).unwrap();
    let head = m.model.weights().lm_head.clone();
    let mut cpu = CpuBackend::new(m.model, shape, 64);
    let mut b = Batch::single_sequence(&prompt, 4);
    let last = prompt.len() - 1;
    b.outputs = vec![
        Output {
            row: last,
            want: Want::Hidden,
        },
        Output {
            row: last,
            want: Want::Logits,
        },
    ];
    let out = cpu.forward(&b).unwrap();
    let again = head.forward_rows(&out.hidden, 1, &[]).unwrap();
    assert_eq!(out.logits.len(), cpu.vocab_size());
    assert!(out.logits.iter().zip(&again).all(|(a, b)| a.to_bits() == b.to_bits()));
    // and the hidden row does not depend on the other outputs asked of the batch
    let (rows, d) = hidden_rows(&prompt);
    assert_eq!(out.hidden, rows[last * d..]);
}

#[test]
fn pooling_is_invariant_to_batching_chunking_caching_and_preemption() {
    rt().block_on(async {
        let (base, tok) = engine(Opts::default());
        let ps = prompts(&tok, 12);
        let want: Vec<[Vec<f32>; 2]> = ps
            .iter()
            .map(|p| {
                let (rows, d) = hidden_rows(p);
                [pooled(&rows, d, Pooling::Last), pooled(&rows, d, Pooling::Mean)]
            })
            .collect();
        for (i, p) in ps.iter().enumerate() {
            let (last, u) = embed(&base, p, Pooling::Last).await;
            assert_eq!(last, want[i][0], "last pooling, alone");
            assert_eq!((u.prompt_tokens, u.completion_tokens), (p.len(), 0));
            let (mean, u) = embed(&base, p, Pooling::Mean).await;
            assert_eq!(mean, want[i][1], "mean pooling, alone");
            assert_eq!(u.cached_tokens, 0, "mean pooling computes every row");
            assert_ne!(last, mean);
            let norm: f64 = mean.iter().map(|&x| (x as f64).powi(2)).sum();
            assert!((norm - 1.0).abs() < 1e-5);
        }
        // the shared system prompt is cached now: last pooling reuses it and answers the same
        let (again, u) = embed(&base, &ps[1], Pooling::Last).await;
        assert!(
            u.cached_tokens > 0,
            "prefix cache served the last-token embedding: {u:?}"
        );
        assert_eq!(again, want[1][0]);
        assert_pool_clean(&base).await;

        let need = ps.iter().map(|p| (p.len() + 40).div_ceil(4)).max().unwrap();
        for (label, opts) in [
            (
                "chunked, next to completions",
                Opts {
                    budget: 16,
                    ..Default::default()
                },
            ),
            (
                "with preemption",
                Opts {
                    blocks: need + 6,
                    budget: 64,
                    ..Default::default()
                },
            ),
        ] {
            let (h, _) = engine(opts);
            let gens: Vec<_> = ps
                .iter()
                .map(|p| {
                    collect(
                        &h,
                        GenerateRequest {
                            prompt: p.clone(),
                            params: greedy(40),
                            cache_salt: None,
                            retain: None,
                            breakpoints: vec![],
                        },
                    )
                })
                .collect();
            let embs: Vec<_> = ps
                .iter()
                .flat_map(|p| [embed(&h, p, Pooling::Last), embed(&h, p, Pooling::Mean)])
                .collect();
            let (_, got) = tokio::join!(futures::future::join_all(gens), futures::future::join_all(embs));
            for (i, pair) in got.chunks(2).enumerate() {
                assert_eq!(pair[0].0, want[i][0], "{label}: last pooling of prompt {i}");
                assert_eq!(pair[1].0, want[i][1], "{label}: mean pooling of prompt {i}");
            }
            let s = h.stats().await.unwrap();
            assert!(
                label != "with preemption" || s.preemptions > 0,
                "preemption was exercised: {s:?}"
            );
            assert_pool_clean(&h).await;
        }
    });
}

#[test]
fn a_dropped_embedding_frees_its_blocks() {
    rt().block_on(async {
        let (h, tok) = engine(Opts {
            budget: 8,
            ..Default::default()
        });
        let p = prompts(&tok, 1).remove(0);
        for pooling in [Pooling::Last, Pooling::Mean] {
            let pending = h
                .embed(EmbedRequest {
                    prompt: p.clone(),
                    pooling,
                    normalize: false,
                    cache_salt: None,
                })
                .unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            drop(pending);
            assert_pool_clean(&h).await;
        }
        // an empty or over-long input is refused at submission
        assert!(h.embed(EmbedRequest::default()).is_err());
    });
}
