//! The shared KV tier (`--kv-shared`) end to end on the tiny model, against a real `redis-server` the
//! test starts (Debian's, installed by the setup script; required under `scripts/test.sh`):
//! - a second engine (another replica, a cold hot pool) finds a conversation's blocks the first one
//!   computed: the follow-up is cached and its tokens and log-probabilities are bitwise those of the
//!   first engine;
//! - another cache salt (another tenant) and another cache layout (dtype) find nothing;
//! - the store down, flushed, answering garbage, killed mid-run and restarted: every request is
//!   served, with the same tokens, the store's trouble counted — and the engine writes again once it
//!   is back.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvgate_cpu::tiny::{tiny_model, TinySpec};
use kvgate_cpu::{CpuBackend, CpuCache};
use kvgate_engine::{
    start, EngineConfig, EngineHandle, Event, GenerateRequest, SamplingParams, SharedConfig, TierConfig,
};
use kvgate_kv::KvDtype;
use kvgate_model::Tokenizer;

mod common;
#[path = "../../../tests/common/redis_server.rs"]
mod redis_server;

use common::rt;

use redis_server::Redis;

/// A connection to `r`.
fn conn(r: &Redis) -> redis::Connection {
    redis::Client::open(r.url()).unwrap().get_connection().unwrap()
}

/// The keys of every block stored in `r`.
fn keys(r: &Redis) -> Vec<String> {
    redis::cmd("KEYS").arg("kvgate:kv:*").query(&mut conn(r)).unwrap()
}

fn shared(url: &str) -> TierConfig {
    shared_within(url, Duration::from_millis(1000))
}

fn shared_within(url: &str, timeout: Duration) -> TierConfig {
    TierConfig {
        shared: Some(SharedConfig {
            url: url.into(),
            ttl: Duration::from_secs(600),
            timeout,
        }),
        ..Default::default()
    }
}

fn engine(tier: TierConfig, dtype: KvDtype) -> (EngineHandle, Arc<Tokenizer>) {
    let m = tiny_model(TinySpec::default()).unwrap();
    let tok = Arc::new(m.tokenizer);
    let cfg = EngineConfig {
        max_num_batched_tokens: 64,
        max_model_len: m.max_model_len,
        tier,
        ..Default::default()
    };
    let backend = Box::new(
        CpuBackend::with_cache(
            m.model,
            CpuCache {
                block_size: 4,
                num_blocks: 256,
                dtype,
                ..Default::default()
            },
        )
        .unwrap(),
    );
    (start(backend, tok.clone(), m.eos_token_ids, cfg).unwrap(), tok)
}

fn conversation(tok: &Tokenizer, i: usize) -> Vec<u32> {
    let mut s = format!("{i} conversation:");
    while tok.encode(&s, false).unwrap().len() < 120 {
        s.push_str(&format!(" turn {} of conversation {i} says hello;", s.len() % 97));
    }
    tok.encode(&s, false).unwrap()
}

/// Greedy, 8 tokens: (tokens with their logprobs as bits, cached prompt tokens).
async fn run(h: &EngineHandle, prompt: Vec<u32>, salt: Option<&str>) -> (Vec<(u32, u32)>, usize) {
    let mut s = h
        .generate(GenerateRequest {
            prompt,
            params: SamplingParams {
                temperature: 0.0,
                max_tokens: 8,
                ignore_eos: true,
                logprobs: Some(0),
                ..Default::default()
            },
            cache_salt: salt.map(str::to_string),
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

/// Waits until the engine has written at least `n` blocks behind.
async fn stored(h: &EngineHandle, n: u64) -> u64 {
    let t0 = Instant::now();
    loop {
        let s = h.stats().await.unwrap().shared.unwrap();
        if s.stored >= n || t0.elapsed() > Duration::from_secs(10) {
            return s.stored;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn another_replica_serves_a_conversation_from_the_shared_tier() {
    let Some(redis) = Redis::start(None, &[]) else { return };
    rt().block_on(async {
        let (a, tok) = engine(shared(&redis.url()), KvDtype::F32);
        let prompt = conversation(&tok, 0);
        let full = (prompt.len() - 1) / 4;
        let (first, cached) = run(&a, prompt.clone(), None).await;
        assert_eq!(cached, 0);
        // the prompt's and the output's full blocks, written behind
        assert!(stored(&a, full as u64).await >= full as u64);
        assert!(keys(&redis).len() >= full);
        // a cold replica: the whole prompt but its last token comes from the shared tier
        let (b, _) = engine(shared(&redis.url()), KvDtype::F32);
        let (again, cached) = run(&b, prompt.clone(), None).await;
        assert_eq!(again, first, "the same tokens and log-probabilities, to the bit");
        assert_eq!(cached, full * 4, "every full block of the prompt found");
        let s = b.stats().await.unwrap();
        let sh = s.shared.unwrap();
        assert_eq!((sh.hits, sh.refused, sh.errors), (full as u64, 0, 0), "{sh:?}");
        assert_eq!(s.tier.unwrap().landed, full as u64);
        // another tenant's salt finds nothing of it, nor does a cache of another dtype
        let (c, _) = engine(shared(&redis.url()), KvDtype::F32);
        let (_, cached) = run(&c, prompt.clone(), Some("tenant-b")).await;
        assert_eq!(cached, 0, "a salted request never reads unsalted blocks");
        let (d, _) = engine(shared(&redis.url()), KvDtype::F16);
        let (_, cached) = run(&d, prompt.clone(), None).await;
        assert_eq!(cached, 0, "another cache layout never reads these blocks");
        assert_eq!(d.stats().await.unwrap().shared.unwrap().hits, 0);
    });
}

#[test]
fn the_stores_trouble_never_fails_a_request() {
    let Some(redis) = Redis::start(None, &[]) else { return };
    rt().block_on(async {
        let (plain, tok) = engine(TierConfig::default(), KvDtype::F32);
        let prompts: Vec<Vec<u32>> = (0..3).map(|i| conversation(&tok, i)).collect();
        let mut want = vec![];
        for p in &prompts {
            want.push(run(&plain, p.clone(), None).await.0);
        }
        // nothing listens: served, the errors counted
        let nowhere = Redis::start(None, &[]).map(|r| r.url()).unwrap();
        let (e, _) = engine(shared(&nowhere), KvDtype::F32);
        assert_eq!(run(&e, prompts[0].clone(), None).await.0, want[0]);
        // fill the store, then answer garbage under every key: refused, recomputed, the same tokens
        let (a, _) = engine(shared(&redis.url()), KvDtype::F32);
        for (p, w) in prompts.iter().zip(&want) {
            assert_eq!(&run(&a, p.clone(), None).await.0, w);
        }
        stored(&a, 3 * 29).await;
        let mut con = conn(&redis);
        for k in keys(&redis) {
            redis::cmd("SET")
                .arg(&k)
                .arg(b"not a block".as_slice())
                .query::<()>(&mut con)
                .unwrap();
        }
        let (g, _) = engine(shared(&redis.url()), KvDtype::F32);
        let (out, cached) = run(&g, prompts[0].clone(), None).await;
        assert_eq!((out, cached), (want[0].clone(), 0));
        assert!(g.stats().await.unwrap().shared.unwrap().refused >= 1);
        // flushed: a miss
        redis::cmd("FLUSHALL").query::<()>(&mut con).unwrap();
        let (f, _) = engine(shared(&redis.url()), KvDtype::F32);
        assert_eq!(run(&f, prompts[1].clone(), None).await, (want[1].clone(), 0));
        // killed under traffic (three requests in flight): served; restarted on its port: the engine
        // reconnects and writes again
        let port = redis.port;
        let kill = async move {
            // once the three are submitted (each future's first poll sends its request)
            tokio::task::yield_now().await;
            drop(redis);
        };
        let (r0, r1, r2, ()) = tokio::join!(
            run(&f, prompts[0].clone(), None),
            run(&f, prompts[1].clone(), None),
            run(&f, prompts[2].clone(), None),
            kill
        );
        assert_eq!([r0.0, r1.0, r2.0], [want[0].clone(), want[1].clone(), want[2].clone()]);
        // the writes behind them (made once the engine is idle) fail, and are counted
        let t0 = Instant::now();
        loop {
            let s = f.stats().await.unwrap().shared.unwrap();
            if s.errors + s.dropped > 0 {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "a dead store's failures are counted: {s:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let back = Redis::start(Some(port), &[]).unwrap();
        let t0 = Instant::now();
        let mut i = 10;
        while keys(&back).is_empty() {
            assert!(t0.elapsed() < Duration::from_secs(20), "the engine never wrote again");
            run(&f, conversation(&tok, i), None).await;
            i += 1;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
}

/// A store that is full (maxmemory with noeviction: every write refused) or slow (a server that does not
/// answer for longer than the timeout): served, the same tokens, the trouble counted; a slow store's
/// request waits at most about the timeout.
#[test]
fn a_full_or_slow_store_is_only_a_miss() {
    let Some(full) = Redis::start(None, &["--maxmemory", "1mb", "--maxmemory-policy", "noeviction"]) else {
        return;
    };
    let slow = Redis::start(None, &["--enable-debug-command", "yes"]).unwrap();
    rt().block_on(async {
        let (plain, tok) = engine(TierConfig::default(), KvDtype::F32);
        let prompts: Vec<Vec<u32>> = (0..4).map(|i| conversation(&tok, 20 + i)).collect();
        let mut want = vec![];
        for p in &prompts {
            want.push(run(&plain, p.clone(), None).await.0);
        }
        let (f, _) = engine(shared(&full.url()), KvDtype::F32);
        for (p, w) in prompts.iter().zip(&want) {
            assert_eq!(&run(&f, p.clone(), None).await.0, w);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let s = f.stats().await.unwrap().shared.unwrap();
        assert!(
            s.dropped > 0 && s.errors > 0,
            "writes refused by a full store are counted: {s:?}"
        );
        // the slow store: DEBUG SLEEP holds it for 3 s while a request with a 300 ms timeout arrives
        let timeout = Duration::from_millis(300);
        let (g, _) = engine(shared_within(&slow.url(), timeout), KvDtype::F32);
        assert_eq!(run(&g, prompts[0].clone(), None).await.0, want[0]);
        let url = slow.url();
        let sleeper = std::thread::spawn(move || {
            let mut c = redis::Client::open(url).unwrap().get_connection().unwrap();
            redis::cmd("DEBUG").arg("SLEEP").arg(3).query::<()>(&mut c).unwrap();
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let t0 = Instant::now();
        assert_eq!(run(&g, prompts[1].clone(), None).await.0, want[1]);
        let waited = t0.elapsed();
        assert!(
            waited < Duration::from_millis(2500),
            "held {waited:?} for a 300 ms timeout"
        );
        sleeper.join().unwrap();
    });
}
