//! How a chat completion writes engine events ([`ChatShape`]): `chat.completion` and
//! `chat.completion.chunk`, the assistant role opening each choice, the reasoning of a model that
//! thinks split out of the answer, tool calls parsed out of the answer when tools were offered.

use std::sync::Arc;

use kvgate_engine::{FinishReason, StopMatch, TokenLogprob, Usage};

use super::wire::{
    AssistantMessage, ChatChoice, ChatChunk, ChatCompletion, ChatLogprobs, ChunkChoice, Delta, FunctionCallOut,
    ToolCallOut,
};
use crate::http::state::AppState;
use crate::pipeline::events::ChoiceOut;
use crate::pipeline::openai::respond::{vllm_prompt_logprobs, PromptLogprobs, Shape};
use crate::pipeline::openai::response::{StopReason, TokenLogprobOut, UsageOut};
use crate::pipeline::reasoning::{ReasoningSplit, Split};
use crate::pipeline::tools::stream::{CallStream, Piece};
use crate::pipeline::tools::{call_id, ParsedCall, ToolSpec};

fn chat_logprobs(st: &AppState, lps: &[TokenLogprob]) -> ChatLogprobs {
    let content = lps.iter().map(|l| TokenLogprobOut::of(st.tokenizer(), l)).collect();
    ChatLogprobs { content }
}

/// A parsed call as it goes out (`index` only in stream deltas).
fn call_out(c: &ParsedCall, index: Option<usize>) -> ToolCallOut {
    ToolCallOut {
        index,
        id: call_id(),
        kind: "function",
        function: FunctionCallOut {
            name: c.name.clone(),
            arguments: c.arguments.clone(),
        },
    }
}

/// How a request wants the reasoning of a model that thinks.
#[derive(Debug, Clone)]
pub(super) struct ReasoningWanted {
    /// Split it from the answer (`separate_reasoning`, default true).
    pub(super) separate: bool,
    /// Return it (`include_reasoning`, default true).
    pub(super) include: bool,
    /// The rendered prompt's end (a template may open the thinking there).
    pub(super) prompt_tail: String,
}

/// The assistant message of a finished choice: the reasoning split out, tool calls parsed out of the
/// answer when tools were offered.
pub(super) fn message(text: &str, tools: Option<&ToolSpec>, r: &ReasoningWanted) -> (AssistantMessage, bool) {
    let (reasoning, answer) = match r.separate {
        true => ReasoningSplit::whole(&r.prompt_tail, text),
        false => (None, text.to_string()),
    };
    let reasoning = reasoning.filter(|_| r.include);
    let Some(spec) = tools else {
        let m = AssistantMessage {
            role: "assistant",
            content: Some(answer),
            reasoning_content: reasoning.clone(),
            reasoning,
            tool_calls: None,
        };
        return (m, false);
    };
    let (content, calls) = spec.parse(&answer);
    let called = !calls.is_empty();
    let m = AssistantMessage {
        role: "assistant",
        content,
        reasoning_content: reasoning.clone(),
        reasoning,
        // omitted when the model made none, as OpenAI does
        tool_calls: called.then(|| calls.iter().map(|c| call_out(c, None)).collect()),
    };
    (m, called)
}

/// `finish_reason`: `tool_calls` when a choice that stopped by itself made calls.
fn finish_reason(reason: Option<FinishReason>, called: bool) -> Option<&'static str> {
    match reason {
        Some(FinishReason::Stop) if called => Some("tool_calls"),
        r => r.map(FinishReason::as_str),
    }
}

/// How a chat completion writes engine events: `chat.completion` and `chat.completion.chunk`, the
/// assistant role opening each choice, tool calls parsed out of the text when tools were offered.
pub(super) struct ChatShape {
    pub(super) st: Arc<AppState>,
    pub(super) id: String,
    pub(super) created: u64,
    pub(super) model: String,
    pub(super) want_lp: bool,
    /// vLLM's `prompt_logprobs` (non-streamed): alternatives per prompt token.
    pub(super) prompt_lp: Option<usize>,
    /// Per choice: whether its role chunk went out.
    pub(super) started: Vec<bool>,
    /// Per choice: its tool-call parser (when tools were offered).
    pub(super) calls: Vec<CallStream>,
    /// Per choice: its reasoning splitter.
    pub(super) splits: Vec<ReasoningSplit>,
    pub(super) reasoning: ReasoningWanted,
    pub(super) tools: Option<ToolSpec>,
}

impl ChatShape {
    fn chunk(&self, choices: Vec<ChunkChoice>, usage: Option<UsageOut>) -> ChatChunk {
        ChatChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        }
    }

    fn delta(&self, index: usize, delta: Delta) -> ChatChunk {
        self.chunk(
            vec![ChunkChoice {
                index,
                delta,
                logprobs: None,
                finish_reason: None,
                stop_reason: None,
            }],
            None,
        )
    }

    /// The role chunk, before a choice's first delta.
    fn open(&mut self, index: usize, out: &mut Vec<ChatChunk>) {
        if let Some(false) = self.started.get(index) {
            self.started[index] = true;
            let d = Delta {
                role: Some("assistant"),
                content: Some(String::new()),
                ..Default::default()
            };
            out.push(self.delta(index, d));
        }
    }

    /// Splits a choice's text delta into its reasoning (as deltas, when returned) and its answer.
    fn split(&mut self, index: usize, text: String, end: bool, out: &mut Vec<ChatChunk>) -> String {
        if !self.reasoning.separate {
            return text;
        }
        let Some(sp) = self.splits.get_mut(index) else {
            return text;
        };
        let mut parts = sp.push(&text);
        if end {
            parts.extend(sp.finish());
        }
        let mut answer = String::new();
        for p in parts {
            match p {
                Split::Content(t) => answer.push_str(&t),
                Split::Reasoning(r) if self.reasoning.include => {
                    let d = Delta {
                        reasoning_content: Some(r.clone()),
                        reasoning: Some(r),
                        ..Default::default()
                    };
                    out.push(self.delta(index, d));
                }
                Split::Reasoning(_) => {}
            }
        }
        answer
    }

    /// Text pieces of a choice as deltas, calls numbered after the calls it already made.
    fn pieces(&self, index: usize, pieces: Vec<Piece>) -> Vec<ChatChunk> {
        let made = self.calls.get(index).map_or(0, CallStream::calls);
        let mut k = made - pieces.iter().filter(|p| matches!(p, Piece::Call(_))).count();
        pieces
            .into_iter()
            .map(|p| match p {
                Piece::Content(t) => Delta {
                    content: Some(t),
                    ..Default::default()
                },
                Piece::Call(c) => {
                    k += 1;
                    Delta {
                        tool_calls: Some(vec![call_out(&c, Some(k - 1))]),
                        ..Default::default()
                    }
                }
            })
            .map(|d| self.delta(index, d))
            .collect()
    }
}

impl Shape for ChatShape {
    type Chunk = ChatChunk;
    type Body = ChatCompletion;

    fn token(
        &mut self,
        _prompt: usize,
        index: usize,
        _token: u32,
        text: String,
        logprob: Option<TokenLogprob>,
    ) -> Vec<ChatChunk> {
        let mut out = vec![];
        self.open(index, &mut out);
        let text = self.split(index, text, false, &mut out);
        let lp = match (self.want_lp, logprob) {
            (true, Some(l)) => Some(chat_logprobs(&self.st, &[l])),
            _ => None,
        };
        let pieces = match (&self.tools, self.calls.get_mut(index)) {
            (Some(spec), Some(cs)) => Some(cs.push(spec, &text)),
            _ => None,
        };
        match pieces {
            Some(pieces) => {
                out.extend(self.pieces(index, pieces));
                if lp.is_some() {
                    let mut c = self.delta(index, Delta::default());
                    c.choices[0].logprobs = lp;
                    out.push(c);
                }
            }
            None => {
                if !text.is_empty() || lp.is_some() {
                    let d = Delta {
                        content: Some(text),
                        ..Default::default()
                    };
                    let mut c = self.delta(index, d);
                    c.choices[0].logprobs = lp;
                    out.push(c);
                }
            }
        }
        out
    }

    fn finished(
        &mut self,
        _prompt: usize,
        index: usize,
        reason: FinishReason,
        text: String,
        stop: Option<StopMatch>,
    ) -> Vec<ChatChunk> {
        let mut out = vec![];
        self.open(index, &mut out);
        let text = self.split(index, text, true, &mut out);
        let pieces = match (&self.tools, self.calls.get_mut(index)) {
            (Some(spec), Some(cs)) => {
                let mut pieces = cs.push(spec, &text);
                pieces.extend(cs.finish(spec));
                Some(pieces)
            }
            _ => None,
        };
        let delta = match pieces {
            Some(pieces) => {
                out.extend(self.pieces(index, pieces));
                Delta::default()
            }
            None if text.is_empty() => Delta::default(),
            None => Delta {
                content: Some(text),
                ..Default::default()
            },
        };
        let called = self.calls.get(index).is_some_and(|c| c.calls() > 0);
        let mut c = self.delta(index, delta);
        c.choices[0].finish_reason = finish_reason(Some(reason), called);
        c.choices[0].stop_reason = StopReason::of(&stop);
        out.push(c);
        out
    }

    fn usage_chunk(&self, usage: UsageOut) -> ChatChunk {
        self.chunk(vec![], Some(usage))
    }

    fn set_running_usage(chunk: &mut ChatChunk, usage: UsageOut) {
        chunk.usage.get_or_insert(usage);
    }

    fn body(self, choices: Vec<ChoiceOut>, prompt_lps: PromptLogprobs, usage: Usage) -> ChatCompletion {
        let prompt_logprobs = self
            .prompt_lp
            .map(|k| vllm_prompt_logprobs(self.st.tokenizer(), k, prompt_lps.first().and_then(Option::as_ref)));
        let choices = choices
            .iter()
            .enumerate()
            .map(|(i, ch)| {
                let (message, called) = message(&ch.text, self.tools.as_ref(), &self.reasoning);
                ChatChoice {
                    index: i,
                    message,
                    logprobs: self.want_lp.then(|| chat_logprobs(&self.st, &ch.logprobs)),
                    finish_reason: finish_reason(ch.finish, called),
                    stop_reason: StopReason::of(&ch.stop),
                }
            })
            .collect();
        ChatCompletion {
            id: self.id,
            object: "chat.completion",
            created: self.created,
            model: self.model,
            choices,
            usage: UsageOut::of(&usage),
            prompt_logprobs,
        }
    }
}
