//! Tree reads in the engine on the tiny model: a chain is the causal read to the bit (the plumbing:
//! RoPE positions, masks, chunks), branches laid out in either order give the same answer (they do
//! not see each other), a tree's blocks are never found by a later causal read of the same tokens, a
//! malformed tree is refused, and nothing leaks.

mod common;

use common::*;
use kvgate_engine::{DecideRequest, DecisionRead, ReadResult, ReadTree, TreeRow};

fn bits(lo: usize, hi: usize) -> Vec<u64> {
    let mut v = vec![0u64; (hi + 1).div_ceil(64)];
    (lo..=hi).for_each(|i| v[i / 64] |= 1 << (i % 64));
    v
}

/// Branches of these lengths from `start`, then `tail` rows that see them all.
fn set_tree(start: usize, branches: &[usize], tail: usize) -> ReadTree {
    let mut rows = vec![];
    let mut at = 0;
    for &len in branches {
        rows.extend((0..len).map(|j| TreeRow {
            offset: j as u32,
            seen: bits(at, at + j),
        }));
        at += len;
    }
    let longest = branches.iter().copied().max().unwrap_or(0);
    rows.extend((0..tail).map(|t| TreeRow {
        offset: (longest + t) as u32,
        seen: bits(0, at + t),
    }));
    ReadTree { start, rows }
}

async fn read(
    h: &kvgate_engine::EngineHandle,
    prompt: Vec<u32>,
    labels: &[Vec<u32>],
    tree: Option<ReadTree>,
) -> ReadResult {
    let s = h
        .decide(DecideRequest {
            reads: vec![DecisionRead {
                prompt,
                labels: labels.to_vec(),
                tree,
            }],
            cache_salt: Some("t".into()),
            ..Default::default()
        })
        .unwrap();
    s.outcome().await.unwrap().reads.remove(0)
}

/// The head, two option lines and the tail of a choice read, tokenized apart; and the labels.
type Parts = (Vec<u32>, Vec<u32>, Vec<u32>, Vec<u32>, Vec<Vec<u32>>);

fn parts(tok: &kvgate_model::Tokenizer) -> Parts {
    let enc = |s: &str| tok.encode(s, false).unwrap();
    let head = enc("<|im_start|>user\nThe payout failed three times and the customer is upset.\nWhich team?\n");
    let a = enc("A: billing and refunds\n");
    let b = enc("B: technical support\n");
    let tail = enc("Answer with the letter of one option only.<|im_end|>\n<|im_start|>assistant\n");
    let labels = vec![enc("A"), enc("B")];
    (head, a, b, tail, labels)
}

#[test]
fn a_chain_is_the_causal_read_to_the_bit() {
    rt().block_on(async {
        let (h, tok) = engine(Opts {
            budget: 16,
            ..Default::default()
        });
        let (head, a, b, tail, labels) = parts(&tok);
        let prompt: Vec<u32> = [&head[..], &a, &b, &tail].concat();
        let causal = read(&h, prompt.clone(), &labels, None).await;
        // every tree row sees every earlier one, at its own position: a causal read, in small chunks
        let n = prompt.len() - head.len();
        let chain = ReadTree {
            start: head.len(),
            rows: (0..n)
                .map(|j| TreeRow {
                    offset: j as u32,
                    seen: bits(0, j),
                })
                .collect(),
        };
        let tree = read(&h, prompt, &labels, Some(chain)).await;
        assert_eq!(causal, tree);
        assert_pool_clean(&h).await;
    });
}

#[test]
fn branches_do_not_see_each_other_nor_leave_blocks_to_causal_reads() {
    rt().block_on(async {
        let (head, a, b, tail, labels) = parts(&engine(Opts::default()).1);
        let ab: Vec<u32> = [&head[..], &a, &b, &tail].concat();
        let ba: Vec<u32> = [&head[..], &b, &a, &tail].concat();
        let (h, _) = engine(Opts::default());
        let causal_fresh = read(&h, ab.clone(), &labels, None).await;
        let (h, _) = engine(Opts::default());
        let t_ab = read(
            &h,
            ab.clone(),
            &labels,
            Some(set_tree(head.len(), &[a.len(), b.len()], tail.len())),
        )
        .await;
        let t_ba = read(
            &h,
            ba,
            &labels,
            Some(set_tree(head.len(), &[b.len(), a.len()], tail.len())),
        )
        .await;
        // the same branches, the other way round: the same read up to rounding (lanes by position)
        for (x, y) in t_ab.label_probs.iter().zip(&t_ba.label_probs) {
            assert!((x - y).abs() < 1e-5 * x.max(*y).max(1e-3), "{t_ab:?} vs {t_ba:?}");
        }
        assert_ne!(t_ab, causal_fresh, "the branches are not the causal read");
        // the causal read of the same tokens after the tree read: not served from the tree's blocks
        let causal_after = read(&h, ab, &labels, None).await;
        assert_eq!(causal_after, causal_fresh);
        assert_pool_clean(&h).await;
    });
}

#[test]
fn a_malformed_tree_is_refused() {
    let (h, tok) = engine(Opts::default());
    let (head, a, _, tail, labels) = parts(&tok);
    let prompt: Vec<u32> = [&head[..], &a, &tail].concat();
    let bad = [
        // one row short
        set_tree(head.len(), &[a.len()], tail.len() - 1),
        // a row that sees a later one
        ReadTree {
            start: prompt.len() - 2,
            rows: vec![
                TreeRow {
                    offset: 0,
                    seen: vec![0b11],
                },
                TreeRow {
                    offset: 1,
                    seen: vec![0b11],
                },
            ],
        },
        // no prefix
        set_tree(0, &[prompt.len()], 0),
    ];
    for tree in bad {
        let r = h.decide(DecideRequest {
            reads: vec![DecisionRead {
                prompt: prompt.clone(),
                labels: labels.clone(),
                tree: Some(tree),
            }],
            ..Default::default()
        });
        assert!(r.is_err());
    }
}
