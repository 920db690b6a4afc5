//! `keep_alive` pins cannot starve the cache: they never hold more than their cap (older pins make
//! room), they are released early when a request needs their blocks (it runs instead of failing with
//! a "does not fit" that is not true), and a request that truly cannot fit is told the real number of
//! blocks it needs.

use std::sync::Arc;
use std::time::Duration;

use kvgate_cpu::tiny::{tiny_model, TinySpec};
use kvgate_cpu::{CpuBackend, CpuCache};
use kvgate_engine::{
    start, DecideRequest, DecisionRead, EngineConfig, EngineError, EngineHandle, Event, GenerateRequest, SamplingParams,
};

const BLOCKS: usize = 64;

fn engine(max_pinned: Option<usize>) -> (EngineHandle, Arc<kvgate_model::Tokenizer>) {
    engine_with(max_pinned, None)
}

fn engine_with(max_pinned: Option<usize>, per_tenant: Option<usize>) -> (EngineHandle, Arc<kvgate_model::Tokenizer>) {
    let m = tiny_model(TinySpec::default()).unwrap();
    let tok = Arc::new(m.tokenizer);
    let cfg = EngineConfig {
        max_num_seqs: 64,
        max_num_batched_tokens: 512,
        max_queue: 64,
        prefix_caching: true,
        max_model_len: m.max_model_len,
        model_name: "tiny".into(),
        max_pinned_blocks: max_pinned,
        max_pinned_blocks_per_tenant: per_tenant,
        ..Default::default()
    };
    let backend = Box::new(
        CpuBackend::with_cache(
            m.model,
            CpuCache {
                block_size: 4,
                num_blocks: BLOCKS,
                ..Default::default()
            },
        )
        .unwrap(),
    );
    (start(backend, tok.clone(), m.eos_token_ids, cfg).unwrap(), tok)
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A decision over a state of about `tokens` tokens, pinned for an hour.
async fn pinned_decision(h: &EngineHandle, tok: &kvgate_model::Tokenizer, id: usize, tokens: usize) {
    pinned_decision_of(h, tok, id, tokens, None).await
}

async fn pinned_decision_of(
    h: &EngineHandle,
    tok: &kvgate_model::Tokenizer,
    id: usize,
    tokens: usize,
    tenant: Option<u32>,
) {
    let mut state = format!("State {id}:");
    while tok.encode(&state, false).unwrap().len() < tokens {
        state.push_str(&format!(" item {id} is fine;"));
    }
    let mut prompt = tok.encode(&state, false).unwrap();
    prompt.extend(tok.encode(" Is it fine? Answer:", false).unwrap());
    let labels = vec![tok.encode(" yes", false).unwrap(), tok.encode(" no", false).unwrap()];
    h.decide(DecideRequest {
        reads: vec![DecisionRead {
            prompt,
            labels,
            tree: None,
        }],
        cache_salt: None,
        keep_alive: Some(Duration::from_secs(3600)),
        tenant,
        ..Default::default()
    })
    .unwrap()
    .outcome()
    .await
    .unwrap();
}

async fn generate(h: &EngineHandle, prompt: Vec<u32>, max_tokens: usize) -> Result<usize, EngineError> {
    let p = SamplingParams {
        temperature: 0.0,
        max_tokens,
        ignore_eos: true,
        ..Default::default()
    };
    let mut s = h.generate(GenerateRequest {
        prompt,
        params: p,
        cache_salt: None,
        retain: None,
        breakpoints: vec![],
    })?;
    loop {
        match s.next().await.unwrap() {
            Event::Done(u) => return Ok(u.completion_tokens),
            Event::Error(e) => return Err(e),
            _ => {}
        }
    }
}

#[test]
fn pins_stay_under_their_cap_and_give_way_to_real_work() {
    let (h, tok) = engine(None);
    rt().block_on(async {
        // Each state pins ~20 of 64 blocks; the cap is half the pool (32): the second pin releases
        // the first.
        pinned_decision(&h, &tok, 1, 80).await;
        let s = h.stats().await.unwrap();
        assert!(s.pins >= 18, "{s:?}");
        pinned_decision(&h, &tok, 2, 80).await;
        let s = h.stats().await.unwrap();
        assert!(s.pins <= BLOCKS / 2, "pins over the cap: {s:?}");
        assert_eq!(s.pins_released_early, 1, "{s:?}");
        // A request needing ~56 of the 64 blocks: the remaining pin gives way and it runs.
        let prompt: Vec<u32> = (0..220).map(|i| 10 + (i % 50) as u32).collect();
        assert_eq!(generate(&h, prompt, 4).await, Ok(4));
        let s = h.stats().await.unwrap();
        assert_eq!(s.pins, 0, "{s:?}");
        assert_eq!(s.pins_released_early, 2, "{s:?}");
        assert_eq!(s.pool.used, 0, "{s:?}");
    });
}

#[test]
fn a_prefix_larger_than_the_cap_is_not_pinned_and_real_block_counts_are_reported() {
    let (h, tok) = engine(Some(8));
    rt().block_on(async {
        pinned_decision(&h, &tok, 3, 80).await;
        let s = h.stats().await.unwrap();
        assert_eq!(s.pins, 0, "a 20-block prefix is not pinned under a cap of 8: {s:?}");
        pinned_decision(&h, &tok, 4, 6).await;
        let s = h.stats().await.unwrap();
        assert!(s.pins > 0 && s.pins <= 8, "{s:?}");
        // A prompt that fits the context but not the pool: refused up front with the real count.
        let prompt: Vec<u32> = (0..300).map(|i| 10 + (i % 50) as u32).collect();
        match generate(&h, prompt, 4).await {
            Err(EngineError::DoesNotFit { needed, available }) => {
                assert!(needed >= 76, "{needed}");
                assert_eq!(available, BLOCKS);
            }
            other => panic!("{other:?}"),
        }
    });
}

#[test]
fn a_tenant_over_its_share_gives_up_its_own_pins_only() {
    let (h, tok) = engine_with(None, Some(10));
    rt().block_on(async {
        pinned_decision_of(&h, &tok, 10, 6, Some(1)).await;
        let other = h.stats().await.unwrap().pins;
        assert!(other > 0 && other <= 10, "{other}");
        pinned_decision_of(&h, &tok, 11, 6, Some(0)).await;
        pinned_decision_of(&h, &tok, 12, 6, Some(0)).await;
        let s = h.stats().await.unwrap();
        // tenant 0 holds one pin (its first was released for its second); tenant 1's stays
        assert_eq!(s.pins_released_early, 1, "{s:?}");
        assert!(s.pins <= other + 10, "{s:?}");
        pinned_decision_of(&h, &tok, 13, 80, Some(1)).await;
        let s2 = h.stats().await.unwrap();
        assert_eq!(
            s2.pins, s.pins,
            "a prefix over the tenant's share is not pinned: {s2:?}"
        );
    });
}
