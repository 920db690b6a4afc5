//! Decisions in the engine on the tiny model: a read's probabilities are bitwise the same alone, in a
//! batch of completions and over a warm prefix; a decision's shared prefix is computed once, and a
//! decision asked again finds each read's own blocks as well.

mod common;

use common::*;
use kvgate_engine::{DecideRequest, DecisionRead, GenerateRequest};

#[test]
fn decisions_are_bitwise_identical_alone_in_a_batch_and_warm() {
    rt().block_on(async {
        let (h, tok) = engine(Opts {
            budget: 64,
            ..Default::default()
        });
        let state = tok
            .encode(
                "<|im_start|>user\nThe payout failed three times and the customer is upset.<|im_end|>\n",
                false,
            )
            .unwrap();
        let yes = tok.encode("yes", false).unwrap()[0];
        let no = tok.encode("no", false).unwrap()[0];
        let reads: Vec<DecisionRead> = ["Is it urgent?", "Is it about money?", "Is the customer calm?"]
            .iter()
            .map(|q| {
                let mut p = state.clone();
                p.extend(
                    tok.encode(
                        &format!("<|im_start|>user\n{q} Answer yes or no.<|im_end|>\n<|im_start|>assistant\n"),
                        false,
                    )
                    .unwrap(),
                );
                DecisionRead {
                    prompt: p,
                    labels: vec![vec![yes], vec![no]],
                    tree: None,
                }
            })
            .collect();
        let ask = |salt: Option<&str>| {
            let s = h
                .decide(DecideRequest {
                    reads: reads.clone(),
                    cache_salt: salt.map(str::to_string),
                    keep_alive: None,
                    tenant: None,
                    ..Default::default()
                })
                .unwrap();
            async move {
                let o = s.outcome().await.unwrap();
                (o.reads, o.usage)
            }
        };
        let (cold, cold_usage) = ask(Some("cold")).await;
        let (warm, warm_usage) = ask(Some("cold")).await;
        assert_eq!(cold, warm, "warm prefix gives bitwise the same probabilities");
        assert!(warm_usage.cached_tokens > cold_usage.cached_tokens);
        // asked again, each read finds its own blocks too, beyond the shared state: at most its last
        // partial block and the token whose logits are read are computed again
        let bs = 4;
        assert!(
            warm_usage.prompt_tokens - warm_usage.cached_tokens <= reads.len() * bs,
            "{warm_usage:?}"
        );
        // inside a batch of 16 concurrent completions
        let ps = prompts(&tok, 16);
        let mut streams = vec![];
        for p in &ps {
            streams.push(
                h.generate(GenerateRequest {
                    prompt: p.clone(),
                    params: greedy(30),
                    cache_salt: None,
                    retain: None,
                    breakpoints: vec![],
                })
                .unwrap(),
            );
        }
        let (busy, _) = ask(Some("fresh-salt")).await;
        assert_eq!(cold, busy, "batch composition does not change the probabilities");
        for r in &cold {
            assert!(r.label_mass > 0.0 && r.label_mass <= 1.0 + 1e-9);
        }
        drop(streams);
        assert_pool_clean(&h).await;
    });
}

#[test]
fn decision_prefix_is_computed_once() {
    rt().block_on(async {
        let (h, tok) = engine(Opts::default());
        let state: Vec<u32> = tok.encode(&"the state of the world. ".repeat(30), false).unwrap();
        let reads: Vec<DecisionRead> = (0..8)
            .map(|i| {
                let mut p = state.clone();
                p.extend(tok.encode(&format!(" question {i}? Answer:"), false).unwrap());
                DecisionRead {
                    prompt: p,
                    labels: vec![vec![5], vec![6]],
                    tree: None,
                }
            })
            .collect();
        let first = &reads[0].prompt;
        let lcp = reads
            .iter()
            .map(|r| first.iter().zip(&r.prompt).take_while(|(a, b)| a == b).count())
            .min()
            .unwrap();
        assert!(lcp >= state.len());
        let suffixes: usize = reads.iter().map(|r| r.prompt.len() - lcp).sum();
        let total: usize = reads.iter().map(|r| r.prompt.len()).sum();
        let usage = h
            .decide(DecideRequest {
                reads: reads.clone(),
                cache_salt: None,
                keep_alive: None,
                tenant: None,
                ..Default::default()
            })
            .unwrap()
            .outcome()
            .await
            .unwrap()
            .usage;
        let computed = total - usage.cached_tokens;
        assert_eq!(
            computed,
            lcp + suffixes,
            "the shared prefix once, then each read's own tokens"
        );
        let reads_len: Vec<usize> = reads.iter().map(|r| r.prompt.len()).collect();
        let usage = h
            .decide(DecideRequest {
                reads,
                cache_salt: None,
                keep_alive: None,
                tenant: None,
                ..Default::default()
            })
            .unwrap()
            .outcome()
            .await
            .unwrap()
            .usage;
        let computed_warm = total - usage.cached_tokens;
        // warm: the prefix's partial block, then each read from its last cached full block on (its own
        // blocks, computed the first time, are found too; the last token is always computed for its
        // logits)
        let own: usize = reads_len.iter().map(|&len| len - ((len - 1) / 4 * 4).max(lcp)).sum();
        assert!(own < suffixes);
        assert_eq!(
            computed_warm,
            lcp % 4 + own,
            "warm: the prefix's partial block and each read's tail"
        );
    });
}
