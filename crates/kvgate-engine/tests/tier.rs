//! The second KV tier end to end on the tiny model: a conversation's state evicted from a small hot
//! pool by other traffic comes back from the tier (memory, or the spill file) instead of being
//! recomputed — the follow-up finds it cached, and its log-probabilities are bitwise those of a run that
//! never evicted anything; a spill file written by one engine serves the next one (same model and
//! cache), and nothing of it is served to a cache of another dtype. Every request ends and no block is
//! left held in either tier's bookkeeping.

use std::path::PathBuf;
use std::sync::Arc;

use kvgate_cpu::tiny::{tiny_model, TinySpec};
use kvgate_cpu::{CpuBackend, CpuCache};
use kvgate_engine::{start, EngineConfig, EngineHandle, Event, GenerateRequest, SamplingParams, TierConfig};
use kvgate_kv::KvDtype;
use kvgate_model::Tokenizer;

/// An engine over `blocks` hot blocks; waits for a previous engine to let go of the spill file.
fn engine(blocks: usize, tier: TierConfig, dtype: KvDtype) -> (EngineHandle, Arc<Tokenizer>) {
    for _ in 0..200 {
        let m = tiny_model(TinySpec::default()).unwrap();
        let tok = Arc::new(m.tokenizer);
        let cfg = EngineConfig {
            max_num_batched_tokens: 64,
            max_model_len: m.max_model_len,
            tier: tier.clone(),
            ..Default::default()
        };
        let backend = Box::new(
            CpuBackend::with_cache(
                m.model,
                CpuCache {
                    block_size: 4,
                    num_blocks: blocks,
                    dtype,
                    ..Default::default()
                },
            )
            .unwrap(),
        );
        match start(backend, tok.clone(), m.eos_token_ids, cfg) {
            Ok(h) => return (h, tok),
            Err(e) if e.to_string().contains("in use") => std::thread::sleep(std::time::Duration::from_millis(50)),
            Err(e) => panic!("{e}"),
        }
    }
    panic!("the spill file stayed locked");
}

fn text(tok: &Tokenizer, i: usize) -> Vec<u32> {
    let mut s = format!("{i} conversation:");
    while tok.encode(&s, false).unwrap().len() < 60 {
        s.push_str(&format!(" message {} of conversation {i} is here;", s.len() % 89));
    }
    tok.encode(&s, false).unwrap()
}

/// Runs a prompt greedily for 6 tokens: (tokens with their logprobs as bits, cached prompt tokens).
async fn run(h: &EngineHandle, prompt: Vec<u32>) -> (Vec<(u32, u32)>, usize) {
    let mut s = h
        .generate(GenerateRequest {
            prompt,
            params: SamplingParams {
                temperature: 0.0,
                max_tokens: 6,
                ignore_eos: true,
                logprobs: Some(0),
                ..Default::default()
            },
            cache_salt: None,
            retain: None,
            breakpoints: vec![],
        })
        .unwrap();
    let mut out = vec![];
    loop {
        match s.next().await.unwrap() {
            Event::Token { token, logprob, .. } => out.push((token, logprob.unwrap().logprob.to_bits())),
            Event::Done(u) => return (out, u.cached_tokens),
            Event::Error(e) => panic!("{e}"),
            _ => {}
        }
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kvgate-tier-e2e-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Conversation 0, then 6 others through a pool that holds about two, then conversation 0 again.
async fn evict_and_return(h: &EngineHandle, tok: &Tokenizer) -> ((Vec<(u32, u32)>, usize), (Vec<(u32, u32)>, usize)) {
    let first = run(h, text(tok, 0)).await;
    for i in 1..7 {
        run(h, text(tok, i)).await;
    }
    let again = run(h, text(tok, 0)).await;
    (first, again)
}

#[test]
fn evicted_state_comes_back_from_memory_bitwise() {
    let rt = rt();
    rt.block_on(async {
        let (plain, tok) = engine(40, TierConfig::default(), KvDtype::F32);
        let (p_first, p_again) = evict_and_return(&plain, &tok).await;
        assert_eq!(p_again.1, 0, "without a tier the state is recomputed");
        let tier = TierConfig {
            memory_bytes: 1 << 20,
            ..Default::default()
        };
        let (h, _) = engine(40, tier, KvDtype::F32);
        let (first, again) = evict_and_return(&h, &tok).await;
        let len = text(&tok, 0).len();
        assert_eq!(first.1, 0);
        assert_eq!(
            again.1,
            (len - 1) / 4 * 4,
            "every full block before the last token is restored"
        );
        assert_eq!(again.0, p_first.0, "restored blocks give bitwise the same logprobs");
        assert_eq!(p_again.0, p_first.0);
        let st = h.stats().await.unwrap();
        let t = st.tier.unwrap();
        assert!(t.stored > 0 && t.hits_memory as usize == again.1 / 4, "{t:?}");
        assert_eq!(st.active_requests, 0);
        assert_eq!(st.pool.used, 0, "no block held: {st:?}");
    });
}

#[test]
fn spill_file_serves_the_next_engine_and_only_a_matching_cache() {
    let dir = temp_dir("restart");
    let tier = TierConfig {
        memory_bytes: 0,
        dir: Some(dir.clone()),
        disk_bytes: 64 << 20,
        shared: None,
    };
    let rt = rt();
    rt.block_on(async {
        let (h, tok) = engine(40, tier.clone(), KvDtype::F32);
        let (first, again) = evict_and_return(&h, &tok).await;
        assert!(again.1 >= 52, "restored from the spill file: {}", again.1);
        assert_eq!(again.0, first.0);
        let t = h.stats().await.unwrap().tier.unwrap();
        assert!(t.hits_disk > 0 && t.spill.written > 0, "{t:?}");
        h.shutdown();
        drop(h);
        // the next engine over the same file: conversation 3 (spilled when the others pushed it out)
        // and conversation 0 (written at shutdown, still hot then) are found there
        let (h2, _) = engine(40, tier.clone(), KvDtype::F32);
        let t = h2.stats().await.unwrap().tier.unwrap();
        assert!(t.spill.reloaded > 0, "{t:?}");
        let (out, cached) = run(&h2, text(&tok, 3)).await;
        assert!(cached >= 52, "a restart restores from the spill file: {cached}");
        assert!(
            run(&h2, text(&tok, 0)).await.1 >= 52,
            "the hot pool was spilled at shutdown"
        );
        let (plain, _) = engine(40, TierConfig::default(), KvDtype::F32);
        assert_eq!(out, run(&plain, text(&tok, 3)).await.0, "bitwise after a restart");
        h2.shutdown();
        drop(h2);
        // a cache of another dtype never reads those records
        let (h3, _) = engine(40, tier.clone(), KvDtype::BF16);
        let t = h3.stats().await.unwrap().tier.unwrap();
        assert_eq!(t.spill.reloaded, 0, "{t:?}");
        let (_, cached) = run(&h3, text(&tok, 3)).await;
        assert_eq!(cached, 0);
        h3.shutdown();
    });
    let _ = std::fs::remove_dir_all(&dir);
}
