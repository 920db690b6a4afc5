//! What callers submit to the engine and what it sends back on each request's channel.

use std::time::Duration;

use crate::error::EngineError;
use crate::sampling::{SamplingParams, TokenLogprob};

/// Identifies a submitted request.
pub type RequestId = u64;

/// A completion request: a tokenized prompt and sampling parameters.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerateRequest {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Sampling parameters.
    pub params: SamplingParams,
    /// Isolates prefix-cache sharing (joins the block keys).
    pub cache_salt: Option<String>,
    /// A session hint: its state is expected again (the session's next turn), so its blocks are
    /// retained when it ends.
    pub retain: Option<Retain>,
    /// Prompt-cache breakpoints: per one, the prompt's prefix to keep (in tokens: its full blocks are
    /// pinned as `keep_alive` pins, within the same caps) and for how long.
    pub breakpoints: Vec<(usize, Duration)>,
}

/// Retention of a finished request's blocks for its session's next turn: ahead of plain LRU for
/// `window`, given back first to running work, taken over by the next turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retain {
    /// How long.
    pub window: Duration,
    /// Whose (the API key's index when several keys are configured): counted against its own cap.
    pub tenant: Option<u32>,
    /// What holds it besides the window (a WebSocket connection): when its holder goes,
    /// [`crate::Inference::release_retained`] lets it go at once.
    pub owner: Option<u64>,
}

/// One read of a decision: a prompt and, per label, the token ids whose probabilities are summed into
/// it (the label's alias forms).
#[derive(Debug, Clone, PartialEq)]
pub struct DecisionRead {
    /// Prompt token ids (state first, so reads of one decision share a prefix).
    pub prompt: Vec<u32>,
    /// Per label: its alias token ids.
    pub labels: Vec<Vec<u32>>,
    /// The prompt's tail as a tree (a `set` read's options as parallel branches), when it is one.
    pub tree: Option<ReadTree>,
}

/// The tail of a read's prompt laid out as a tree: from `start` on, each token has a RoPE position
/// (`start + offset`: the branches of a `set` read all start at one position) and sees the prompt
/// before `start` and the tree tokens whose bits are set (bit `j` of `seen` for the `start + j`-th
/// token; its own always). Only for a backend with tree attention ([`crate::Limits::tree_attention`]).
/// Blocks holding tree tokens are never registered in the prefix cache, nor matched from it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReadTree {
    /// The first tree token.
    pub start: usize,
    /// Per tree token: its RoPE offset from `start` and what it sees.
    pub rows: Vec<TreeRow>,
}

/// One token of a [`ReadTree`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TreeRow {
    /// RoPE position minus the tree's start.
    pub offset: u32,
    /// Bit `j`: it sees the tree's `j`-th token.
    pub seen: Vec<u64>,
}

impl ReadTree {
    /// The RoPE position and mask of the prompt's token at `pos` (`None` for a plain causal token).
    pub fn row(&self, pos: usize) -> Option<(u32, kvgate_backend::RowMask)> {
        let r = self.rows.get(pos.checked_sub(self.start)?)?;
        Some((
            (self.start as u32).saturating_add(r.offset),
            kvgate_backend::RowMask {
                base: self.start as u32,
                seen: r.seen.clone(),
            },
        ))
    }

    /// Checks it against a prompt of `len` tokens: one row per token from `start` to the end, each
    /// seeing only tree tokens up to its own (its own included).
    pub fn check(&self, len: usize) -> Result<(), String> {
        if self.start + self.rows.len() != len || self.start == 0 {
            return Err(format!(
                "a tree of {} rows from token {} does not end a prompt of {len} tokens after a prefix",
                self.rows.len(),
                self.start
            ));
        }
        for (j, r) in self.rows.iter().enumerate() {
            let bit = |i: usize| r.seen.get(i / 64).is_some_and(|w| (w >> (i % 64)) & 1 == 1);
            // no words past its own (so no later row, and no mask larger than the tree)
            let beyond = r.seen.len() > j / 64 + 1 || (j + 1..r.seen.len() * 64).any(bit);
            if !bit(j) || beyond {
                return Err(format!("tree row {j} must see itself and no later row"));
            }
        }
        Ok(())
    }
}

/// A decision request: reads that are evaluated together, forked from their shared prefix.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DecideRequest {
    /// The reads, in answer order.
    pub reads: Vec<DecisionRead>,
    /// Isolates prefix-cache sharing.
    pub cache_salt: Option<String>,
    /// Keep the shared prefix's blocks from eviction this long after the decision, whoever reuses
    /// them (without it the engine's session window retains them until the session's next turn).
    pub keep_alive: Option<Duration>,
    /// Who asks (the API key's index when several keys are configured): its pins count against its
    /// own cap.
    pub tenant: Option<u32>,
    /// Prompt-cache breakpoints: per one, the prefix of the first read to keep (in tokens: its full
    /// blocks are pinned, as `keep_alive` pins, within the same caps) and for how long.
    pub breakpoints: Vec<(usize, Duration)>,
    /// Keep only the breakpoints (OpenAI's explicit caching mode): no session retention of the shared
    /// prefix.
    pub breakpoints_only: bool,
}

/// How an embedding is pooled from a prompt's final hidden states.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Pooling {
    /// The last token's (decoder models; the prefix cache may serve everything before it).
    #[default]
    Last,
    /// The mean over every token (every row computed).
    Mean,
}

impl Pooling {
    /// The name vLLM and llama.cpp give it.
    pub fn as_str(self) -> &'static str {
        match self {
            Pooling::Last => "last",
            Pooling::Mean => "mean",
        }
    }
}

/// An embedding request: one input's tokens, pooled into one vector.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EmbedRequest {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// How the hidden states are pooled.
    pub pooling: Pooling,
    /// Scale the pooled vector to unit L2 norm.
    pub normalize: bool,
    /// Isolates prefix-cache sharing.
    pub cache_salt: Option<String>,
}

/// What an embedding request returns.
#[derive(Debug, Clone, PartialEq)]
pub struct EmbedOutcome {
    /// The pooled vector (the model's hidden size).
    pub embedding: Vec<f32>,
    /// Its prompt tokens and cached ones.
    pub usage: Usage,
}

/// The outcome of one read.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadResult {
    /// Per label: the summed probability of its alias tokens (not renormalised).
    pub label_probs: Vec<f64>,
    /// Σ of `label_probs`: the mass the model put on the labels at all.
    pub label_mass: f64,
}

/// Why a choice ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// EOS, a stop token or a stop string.
    Stop,
    /// `max_tokens` or the context length.
    Length,
}

impl FinishReason {
    /// The OpenAI spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// What matched a stop, for `stop_reason`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopMatch {
    /// A stop string.
    Text(String),
    /// A stop token id (EOS excluded, as vLLM reports it).
    Token(u32),
}

/// Token accounting of a finished request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens (decisions: over all reads).
    pub prompt_tokens: usize,
    /// Generated tokens over all choices.
    pub completion_tokens: usize,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
    /// Prompt tokens this request computed and pinned at a prompt-cache breakpoint (the longest).
    pub cache_write_tokens: usize,
}

impl Usage {
    /// Adds another request's (or prompt's) accounting.
    pub fn add(&mut self, other: &Usage) {
        self.prompt_tokens += other.prompt_tokens;
        self.completion_tokens += other.completion_tokens;
        self.cached_tokens += other.cached_tokens;
        self.cache_write_tokens += other.cache_write_tokens;
    }
}

/// An event on a completion's channel (a decision gets one result instead: [`crate::PendingDecision`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Logprobs of the prompt tokens (the first is `None`), when asked.
    PromptLogprobs(Vec<Option<TokenLogprob>>),
    /// One generated token of one choice, with the text that became final.
    Token {
        /// Choice index.
        choice: usize,
        /// The token.
        token: u32,
        /// Text delta (may be empty while text is held back).
        text: String,
        /// Its logprobs, when asked.
        logprob: Option<TokenLogprob>,
    },
    /// A choice ended; `text` is its last delta.
    Finished {
        /// Choice index.
        choice: usize,
        /// Why.
        reason: FinishReason,
        /// Text released at the end.
        text: String,
        /// What stopped it.
        stop: Option<StopMatch>,
    },
    /// Every choice ended.
    Done(Usage),
    /// The request failed.
    Error(EngineError),
}
