//! Sampling: the OpenAI/vLLM parameters turned into a per-sequence sampler over one logits row.
//!
//! Order (as vLLM): logit bias → min_tokens masking of stop tokens → repetition penalty (prompt and
//! output tokens) → frequency and presence penalties (output tokens) → greedy if temperature is 0, else
//! temperature → top-k → top-p → min-p → draw from a ChaCha RNG seeded per request (and per choice).
//! Logprobs are reported from the raw model distribution (vLLM's default `raw_logprobs`).

use std::collections::HashMap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::constraint::{Guide, TokenMask};

/// Sampling parameters of one request (validated by the server).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 = greedy.
    pub temperature: f32,
    /// Nucleus mass in (0, 1].
    pub top_p: f32,
    /// 0 = off.
    pub top_k: usize,
    /// In [0, 1].
    pub min_p: f32,
    /// Seed; `None` draws one.
    pub seed: Option<u64>,
    /// OpenAI presence penalty.
    pub presence_penalty: f32,
    /// OpenAI frequency penalty.
    pub frequency_penalty: f32,
    /// Multiplicative repetition penalty (1 = off).
    pub repetition_penalty: f32,
    /// Added to logits.
    pub logit_bias: Vec<(u32, f32)>,
    /// Output tokens at most.
    pub max_tokens: usize,
    /// Output tokens before stop tokens may end generation.
    pub min_tokens: usize,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Extra stop token ids.
    pub stop_token_ids: Vec<u32>,
    /// Keep the matched stop string in the output.
    pub include_stop_str_in_output: bool,
    /// Do not stop at EOS.
    pub ignore_eos: bool,
    /// Top logprobs per output token (`Some(0)` = only the chosen token's).
    pub logprobs: Option<usize>,
    /// Top logprobs per prompt token (echo with logprobs).
    pub prompt_logprobs: Option<usize>,
    /// Choices.
    pub n: usize,
    /// Drop special tokens from the text.
    pub skip_special_tokens: bool,
    /// The grammar the output must follow (structured outputs, tool calls).
    pub guide: Option<Guide>,
    /// vLLM's `allowed_token_ids`: only these may be sampled (`None`: any).
    pub allowed_token_ids: Option<Vec<u32>>,
    /// vLLM's `bad_words`, as token sequences: a sequence's last token is never sampled right after the
    /// rest of it (a one-token word never).
    pub bad_words: Vec<Vec<u32>>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            seed: None,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            logit_bias: vec![],
            max_tokens: 16,
            min_tokens: 0,
            stop: vec![],
            stop_token_ids: vec![],
            include_stop_str_in_output: false,
            ignore_eos: false,
            logprobs: None,
            prompt_logprobs: None,
            n: 1,
            allowed_token_ids: None,
            bad_words: vec![],
            skip_special_tokens: true,
            guide: None,
        }
    }
}

/// Temperatures below this sample greedily.
pub const GREEDY_BELOW: f32 = 1e-5;

/// A token's logprob and the top alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The token.
    pub token: u32,
    /// Its logprob.
    pub logprob: f32,
    /// The most likely tokens with their logprobs, best first.
    pub top: Vec<(u32, f32)>,
    /// Its rank in the distribution, as vLLM counts it: 1 + the number of tokens strictly more likely.
    pub rank: usize,
}

impl TokenLogprob {
    /// The entry of `token` in the log-softmax row `ls`, with the `k` most likely tokens.
    pub fn of(ls: &[f32], token: u32, k: usize) -> TokenLogprob {
        let logprob = ls[token as usize];
        TokenLogprob {
            token,
            logprob,
            top: top_k_of(ls, k),
            rank: 1 + ls.iter().filter(|&&v| v > logprob).count(),
        }
    }
}

/// Log-softmax of a row (f64 normaliser).
pub fn log_softmax(x: &[f32]) -> Vec<f32> {
    let lse = kvgate_backend::log_sum_exp(x);
    x.iter().map(|&v| v - lse).collect()
}

/// The `k` best entries of a row, best first (ties: lower id first).
pub fn top_k_of(x: &[f32], k: usize) -> Vec<(u32, f32)> {
    if k == 0 {
        return vec![];
    }
    let mut idx: Vec<u32> = (0..x.len() as u32).collect();
    let cmp = |a: &u32, b: &u32| x[*b as usize].total_cmp(&x[*a as usize]).then(a.cmp(b));
    if k < idx.len() {
        idx.select_nth_unstable_by(k - 1, cmp);
        idx.truncate(k);
    }
    idx.sort_by(cmp);
    idx.into_iter().map(|i| (i, x[i as usize])).collect()
}

/// The first index of the largest value.
pub fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}

/// The sampler of one sequence.
#[derive(Debug, Clone)]
pub struct Sampler {
    rng: ChaCha8Rng,
    counts: HashMap<u32, u32>,
    prompt_tokens: Vec<u32>,
    generated: usize,
    /// The last output tokens (as many as the longest bad word needs before its last token).
    recent: Vec<u32>,
    recent_len: usize,
}

impl Sampler {
    /// A sampler for choice `choice` of a request.
    pub fn new(p: &SamplingParams, prompt: &[u32], choice: usize) -> Sampler {
        let seed = p.seed.unwrap_or_else(rand::random);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(choice as u64);
        let mut prompt_tokens = if p.repetition_penalty != 1.0 {
            prompt.to_vec()
        } else {
            vec![]
        };
        prompt_tokens.sort_unstable();
        prompt_tokens.dedup();
        Sampler {
            rng,
            counts: HashMap::new(),
            prompt_tokens,
            generated: 0,
            recent: vec![],
            recent_len: p.bad_words.iter().map(|w| w.len().saturating_sub(1)).max().unwrap_or(0),
        }
    }

    /// Output tokens sampled so far.
    pub fn generated(&self) -> usize {
        self.generated
    }

    /// Counts a token the grammar forced (not sampled) as generated output.
    pub(crate) fn note_forced(&mut self, tok: u32) {
        *self.counts.entry(tok).or_insert(0) += 1;
        self.generated += 1;
        self.remember(tok);
    }

    /// Keeps the last output tokens, as long as the longest bad word needs them.
    fn remember(&mut self, tok: u32) {
        if self.recent_len > 0 {
            self.recent.push(tok);
            let extra = self.recent.len().saturating_sub(self.recent_len);
            self.recent.drain(..extra);
        }
    }

    /// Bans the tokens `p.bad_words` forbid after the output so far.
    fn ban_bad_words(&mut self, x: &mut [f32], p: &SamplingParams) {
        for w in &p.bad_words {
            let Some((&last, before)) = w.split_last() else {
                continue;
            };
            if self.recent.ends_with(before) {
                if let Some(v) = x.get_mut(last as usize) {
                    *v = f32::NEG_INFINITY;
                }
            }
        }
    }

    /// Picks the next token from `logits` (`stop_ids` are masked while fewer than `min_tokens` were
    /// generated; tokens outside `mask` are never picked) and returns it with its logprob entry when
    /// asked (from the raw distribution).
    pub fn sample(
        &mut self,
        logits: &[f32],
        p: &SamplingParams,
        stop_ids: &[u32],
        mask: Option<&TokenMask>,
    ) -> (u32, Option<TokenLogprob>) {
        let mut x = logits.to_vec();
        for &(t, b) in &p.logit_bias {
            if let Some(v) = x.get_mut(t as usize) {
                *v += b;
            }
        }
        if let Some(allowed) = &p.allowed_token_ids {
            let mut keep = vec![f32::NEG_INFINITY; x.len()];
            for &t in allowed {
                if let (Some(k), Some(v)) = (keep.get_mut(t as usize), x.get(t as usize)) {
                    *k = *v;
                }
            }
            x = keep;
        }
        if !p.bad_words.is_empty() {
            self.ban_bad_words(&mut x, p);
        }
        if self.generated < p.min_tokens {
            for &t in stop_ids {
                if let Some(v) = x.get_mut(t as usize) {
                    *v = f32::NEG_INFINITY;
                }
            }
        }
        if p.repetition_penalty != 1.0 {
            let r = p.repetition_penalty;
            let pen = |v: &mut f32| *v = if *v > 0.0 { *v / r } else { *v * r };
            for &t in &self.prompt_tokens {
                if let Some(v) = x.get_mut(t as usize) {
                    pen(v);
                }
            }
            for &t in self.counts.keys() {
                if self.prompt_tokens.binary_search(&t).is_err() {
                    if let Some(v) = x.get_mut(t as usize) {
                        pen(v);
                    }
                }
            }
        }
        if p.frequency_penalty != 0.0 || p.presence_penalty != 0.0 {
            for (&t, &c) in &self.counts {
                if let Some(v) = x.get_mut(t as usize) {
                    *v -= p.frequency_penalty * c as f32 + p.presence_penalty;
                }
            }
        }
        if let Some(m) = mask {
            m.apply(&mut x);
            if x.iter().all(|v| *v == f32::NEG_INFINITY) {
                // min_tokens masked the only tokens the grammar allows: the grammar wins.
                x = logits.to_vec();
                m.apply(&mut x);
            }
        }
        // Below 1e-5 (vLLM's epsilon) is greedy: 1/T would overflow (a subnormal T gives inf).
        let tok = if p.temperature < GREEDY_BELOW {
            argmax(&x)
        } else {
            self.draw(&mut x, p)
        };
        let lp = p.logprobs.map(|k| TokenLogprob::of(&log_softmax(logits), tok, k));
        *self.counts.entry(tok).or_insert(0) += 1;
        self.generated += 1;
        self.remember(tok);
        (tok, lp)
    }

    fn draw(&mut self, x: &mut [f32], p: &SamplingParams) -> u32 {
        let inv_t = 1.0 / p.temperature;
        // Candidates sorted by logit (descending), restricted by top-k.
        let k = if p.top_k == 0 { x.len() } else { p.top_k.min(x.len()) };
        let mut cand = top_k_of(x, k);
        let max = cand[0].1;
        let mut probs: Vec<f64> = cand.iter().map(|&(_, v)| (((v - max) * inv_t) as f64).exp()).collect();
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|q| *q /= total);
        // top-p: the smallest prefix with mass ≥ top_p.
        if p.top_p < 1.0 {
            let mut acc = 0.0;
            let mut keep = probs.len();
            for (i, q) in probs.iter().enumerate() {
                acc += q;
                if acc >= p.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
            probs.truncate(keep);
            cand.truncate(keep);
        }
        // min-p: drop tokens below min_p × the top probability.
        if p.min_p > 0.0 {
            let floor = probs[0] * p.min_p as f64;
            let keep = probs.iter().take_while(|&&q| q >= floor).count().max(1);
            probs.truncate(keep);
            cand.truncate(keep);
        }
        let total: f64 = probs.iter().sum();
        let mut r = self.rng.random::<f64>() * total;
        for (i, q) in probs.iter().enumerate() {
            if r < *q {
                return cand[i].0;
            }
            r -= q;
        }
        cand[cand.len() - 1].0
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn allowed_token_ids_and_bad_words_shape_what_is_sampled() {
        use super::*;
        let logits = vec![5.0, 4.0, 3.0, 2.0, 1.0];
        let p = SamplingParams {
            temperature: 0.0,
            allowed_token_ids: Some(vec![2, 3]),
            ..Default::default()
        };
        let mut s = Sampler::new(&p, &[], 0);
        assert_eq!(s.sample(&logits, &p, &[], None).0, 2, "the best allowed token");
        // a one-token bad word is never sampled; a two-token one only after its first token
        let p = SamplingParams {
            temperature: 0.0,
            bad_words: vec![vec![0], vec![1, 1]],
            ..Default::default()
        };
        let mut s = Sampler::new(&p, &[], 0);
        assert_eq!(s.sample(&logits, &p, &[], None).0, 1, "0 is banned");
        assert_eq!(s.sample(&logits, &p, &[], None).0, 2, "1 after 1 is banned");
        assert_eq!(s.sample(&logits, &p, &[], None).0, 1, "1 after 2 is fine");
    }

    use super::*;

    fn params() -> SamplingParams {
        SamplingParams::default()
    }

    #[test]
    fn a_subnormal_temperature_is_greedy() {
        let logits: Vec<f32> = (0..50).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let want = argmax(&logits);
        for t in [1e-39f32, 1e-45, 1e-6] {
            let p = SamplingParams {
                temperature: t,
                seed: Some(1),
                ..params()
            };
            let mut s = Sampler::new(&p, &[], 0);
            for _ in 0..20 {
                assert_eq!(s.sample(&logits, &p, &[], None).0, want, "temperature {t}");
            }
        }
    }

    #[test]
    fn log_softmax_normalises() {
        let l = log_softmax(&[1.0, 2.0, 3.0]);
        let s: f32 = l.iter().map(|x| x.exp()).sum();
        assert!((s - 1.0).abs() < 1e-6);
    }

    #[test]
    fn greedy_is_argmax_and_penalties_apply() {
        let mut p = params();
        p.temperature = 0.0;
        let mut s = Sampler::new(&p, &[], 0);
        assert_eq!(s.sample(&[0.0, 3.0, 1.0], &p, &[], None).0, 1);
        p.logit_bias = vec![(2, 5.0)];
        assert_eq!(s.sample(&[0.0, 3.0, 1.0], &p, &[], None).0, 2);
        p.logit_bias.clear();
        let mut s = Sampler::new(&p, &[], 0);
        assert_eq!(s.sample(&[0.0, 3.0, 1.0], &p, &[], None).0, 1);
        p.frequency_penalty = 2.5; // token 1 was generated once: 3 - 2.5 < 1
        assert_eq!(s.sample(&[0.0, 3.0, 1.0], &p, &[], None).0, 2);
    }

    #[test]
    fn min_tokens_masks_stop_ids() {
        let mut p = params();
        p.temperature = 0.0;
        p.min_tokens = 1;
        let mut s = Sampler::new(&p, &[], 0);
        assert_eq!(s.sample(&[9.0, 1.0], &p, &[0], None).0, 1);
        assert_eq!(s.sample(&[9.0, 1.0], &p, &[0], None).0, 0);
    }

    #[test]
    fn seeded_sampling_reproduces_and_respects_top_k() {
        let mut p = params();
        p.seed = Some(5);
        p.top_k = 2;
        let logits = [1.0, 1.1, 0.9, 1.05, -3.0];
        let run = |choice| {
            let mut s = Sampler::new(&p, &[], choice);
            (0..50).map(|_| s.sample(&logits, &p, &[], None).0).collect::<Vec<_>>()
        };
        let a = run(0);
        assert_eq!(a, run(0));
        assert_ne!(a, run(1), "choices draw from different streams");
        assert!(a.iter().all(|&t| t == 1 || t == 3), "{a:?}");
        assert!(a.contains(&1) && a.contains(&3));
    }

    #[test]
    fn top_p_keeps_the_nucleus() {
        let mut p = params();
        p.seed = Some(1);
        p.top_p = 0.5;
        let logits = [5.0, 4.9, 0.0, 0.0];
        let mut s = Sampler::new(&p, &[], 0);
        for _ in 0..100 {
            let t = s.sample(&logits, &p, &[], None).0;
            assert!(t == 0 || t == 1, "{t}");
        }
    }

    #[test]
    fn logprobs_are_raw_and_top_sorted() {
        let mut p = params();
        p.temperature = 0.0;
        p.logprobs = Some(2);
        let mut s = Sampler::new(&p, &[], 0);
        let (_, lp) = s.sample(&[0.0, 2.0, 1.0], &p, &[], None);
        let lp = lp.unwrap();
        assert_eq!(lp.token, 1);
        assert_eq!(lp.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 2]);
        let z: f32 = [0.0f32, 2.0, 1.0].iter().map(|v| v.exp()).sum();
        assert!((lp.logprob - (2.0 - z.ln())).abs() < 1e-5);
    }
}
