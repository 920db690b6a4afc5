//! Constrained decoding through the engine's [`TokenConstraint`] seam on the tiny model: the mask is
//! obeyed (sampled and greedy, `n` > 1), forced tokens are appended without sampling and counted, a
//! finished grammar ends the choice with `stop`, unconstrained requests batched beside a constrained
//! one produce exactly what they produce alone, and no block leaks.

use std::sync::Arc;

use kvgate_cpu::tiny::{tiny_model, TinySpec};
use kvgate_cpu::{CpuBackend, CpuCache};
use kvgate_engine::{
    start, ConstraintFactory, EngineConfig, EngineHandle, Event, FinishReason, GenerateRequest, Guide, SamplingParams,
    TokenConstraint, TokenMask,
};

fn engine() -> (EngineHandle, Arc<kvgate_model::Tokenizer>, usize) {
    let m = tiny_model(TinySpec::default()).unwrap();
    let tok = Arc::new(m.tokenizer);
    let vocab = m.model.config().vocab_size;
    let cfg = EngineConfig {
        max_num_seqs: 64,
        max_num_batched_tokens: 512,
        max_queue: 64,
        prefix_caching: true,
        max_model_len: m.max_model_len,
        model_name: "tiny".into(),
        ..Default::default()
    };
    let backend = Box::new(
        CpuBackend::with_cache(
            m.model,
            CpuCache {
                block_size: 4,
                num_blocks: 256,
                ..Default::default()
            },
        )
        .unwrap(),
    );
    (start(backend, tok.clone(), m.eos_token_ids, cfg).unwrap(), tok, vocab)
}

/// The output must spell `target`; from `ff_from` tokens on, the rest is forced.
#[derive(Clone)]
struct Spell {
    target: Vec<u32>,
    pos: usize,
    vocab: usize,
    ff_from: Option<usize>,
}

impl TokenConstraint for Spell {
    fn mask(&mut self) -> Result<TokenMask, String> {
        let next = self.target.get(self.pos).copied();
        Ok(TokenMask::from_ids(self.vocab, next.as_slice()))
    }
    fn commit(&mut self, token: u32, fast_forward: bool) -> Result<Vec<u32>, String> {
        if self.target.get(self.pos) != Some(&token) {
            return Err(format!("token {token} is not allowed at {}", self.pos));
        }
        self.pos += 1;
        if fast_forward && self.ff_from.is_some_and(|f| self.pos >= f) {
            let rest = self.target[self.pos..].to_vec();
            self.pos = self.target.len();
            return Ok(rest);
        }
        Ok(vec![])
    }
    fn is_stopped(&self) -> bool {
        self.pos >= self.target.len()
    }
    fn fork(&self) -> Box<dyn TokenConstraint> {
        Box::new(self.clone())
    }
}

struct SpellFactory(Spell);

impl ConstraintFactory for SpellFactory {
    fn start(&self) -> Box<dyn TokenConstraint> {
        Box::new(self.0.clone())
    }
    fn describe(&self) -> String {
        format!("spell {:?}", self.0.target)
    }
}

fn guide(target: &[u32], vocab: usize, ff_from: Option<usize>) -> Guide {
    Guide(Arc::new(SpellFactory(Spell {
        target: target.to_vec(),
        pos: 0,
        vocab,
        ff_from,
    })))
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

type Choices = Vec<(Vec<u32>, Option<FinishReason>)>;

async fn collect(h: &EngineHandle, req: GenerateRequest) -> (Choices, usize) {
    let n = req.params.n.max(1);
    let mut s = h.generate(req).unwrap();
    let mut out: Choices = vec![(vec![], None); n];
    loop {
        match s.next().await.unwrap() {
            Event::Token { choice, token, .. } => out[choice].0.push(token),
            Event::Finished { choice, reason, .. } => out[choice].1 = Some(reason),
            Event::Done(u) => return (out, u.completion_tokens),
            Event::PromptLogprobs(_) => {}
            e => panic!("unexpected {e:?}"),
        }
    }
}

async fn pool_clean(h: &EngineHandle) {
    for _ in 0..100 {
        let s = h.stats().await.unwrap();
        if s.active_requests == 0 && s.pool.used == 0 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("blocks leaked: {:?}", h.stats().await.unwrap().pool);
}

fn req(prompt: Vec<u32>, params: SamplingParams) -> GenerateRequest {
    GenerateRequest {
        prompt,
        params,
        cache_salt: None,
        retain: None,
        breakpoints: vec![],
    }
}

#[test]
fn the_mask_is_obeyed_forced_tokens_are_appended_and_the_grammar_ends_the_choice() {
    let (h, tok, vocab) = engine();
    let prompt = tok.encode("The weather today is", false).unwrap();
    // Tokens the model would rarely pick by itself.
    let target: Vec<u32> = vec![40, 200, 7, 300, 41, 41, 9];
    rt().block_on(async {
        for (temperature, n, ff) in [(0.0, 1, None), (1.0, 3, None), (0.7, 2, Some(2)), (0.0, 1, Some(1))] {
            let p = SamplingParams {
                temperature,
                n,
                seed: Some(7),
                max_tokens: 50,
                guide: Some(guide(&target, vocab, ff)),
                ..Default::default()
            };
            let (out, completion) = collect(&h, req(prompt.clone(), p)).await;
            for (toks, reason) in &out {
                assert_eq!(toks, &target, "temperature {temperature}, n {n}, ff {ff:?}");
                assert_eq!(*reason, Some(FinishReason::Stop));
            }
            assert_eq!(completion, n * target.len(), "forced tokens count as output");
        }
        // max_tokens still wins over the grammar.
        let p = SamplingParams {
            temperature: 0.0,
            max_tokens: 3,
            guide: Some(guide(&target, vocab, None)),
            ..Default::default()
        };
        let (out, _) = collect(&h, req(prompt.clone(), p)).await;
        assert_eq!(out[0].0, target[..3]);
        assert_eq!(out[0].1, Some(FinishReason::Length));
        pool_clean(&h).await;
    });
}

#[test]
fn unconstrained_neighbours_are_untouched_by_a_constrained_request() {
    let (h, tok, vocab) = engine();
    let greedy = |max_tokens| SamplingParams {
        temperature: 0.0,
        max_tokens,
        ignore_eos: true,
        ..Default::default()
    };
    let prompts: Vec<Vec<u32>> = (0..4)
        .map(|i| {
            tok.encode(&format!("Item {i}: a story about the sea and"), false)
                .unwrap()
        })
        .collect();
    rt().block_on(async {
        let mut alone = vec![];
        for p in &prompts {
            alone.push(collect(&h, req(p.clone(), greedy(12))).await.0);
        }
        let target: Vec<u32> = (0..30).map(|i| 30 + i * 3).collect();
        let constrained = SamplingParams {
            temperature: 0.0,
            max_tokens: 40,
            guide: Some(guide(&target, vocab, Some(10))),
            ..Default::default()
        };
        let mut futs = vec![];
        futs.push(collect(&h, req(prompts[0].clone(), constrained)));
        for p in &prompts {
            futs.push(collect(&h, req(p.clone(), greedy(12))));
        }
        let outs = futures::future::join_all(futs).await;
        assert_eq!(outs[0].0[0].0, target);
        for (i, o) in outs[1..].iter().enumerate() {
            assert_eq!(o.0, alone[i], "prompt {i} batched beside a constrained request");
        }
        pool_clean(&h).await;
    });
}
