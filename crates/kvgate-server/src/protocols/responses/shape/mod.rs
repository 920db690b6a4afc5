//! How a Responses request writes engine events: the `response` object (non-streaming), or its typed
//! SSE events in OpenAI's order, each with a `sequence_number` — `response.created`,
//! `response.in_progress`, per output item `response.output_item.added`, for text
//! `response.content_part.added`, `response.output_text.delta`… `.done`, `response.content_part.done`,
//! for a call `response.function_call_arguments.delta` / `.done` (or `response.custom_tool_call_input.*`),
//! `response.output_item.done`; and always one of `response.completed`, `response.incomplete` (the
//! output limit) or `response.failed` last. Tool calls are parsed out of the text as chat does (a
//! fragment cut off by the limit never becomes text). The shape writes; the finished response goes to
//! the turn's [`Record`] (`finish.rs`), which stores it.

mod open;

use std::sync::Arc;

use kvgate_engine::{EngineError, FinishReason, StopMatch, TokenLogprob, Usage};
use kvgate_model::Tokenizer;
use serde_json::Value;

use super::finish::{Kept, Record};
use super::wire::{
    ArgumentsDone, CallDelta, Incomplete, InputDone, OutputItem, OutputText, ReasoningText, ResponseError,
    ResponseObject, ResponseUsage, StreamEvent, WithResponse,
};
use crate::http::error::ApiError;
use crate::ids::item_id;
use crate::pipeline::events::ChoiceOut;
use crate::pipeline::openai::respond::{PromptLogprobs, Shape};
use crate::pipeline::openai::response::{TokenLogprobOut, UsageOut};
use crate::pipeline::reasoning::{ReasoningSplit, Split};
use crate::pipeline::tools::stream::{CallStream, Piece};
use crate::pipeline::tools::{call_id, ParsedCall, ToolSpec};
use crate::protocols::responses::ResponsesState;
use open::{delta, done, item, part, OpenText};

/// What a request brings to its shape besides the response object.
pub struct Turn {
    /// The offered tools.
    pub tools: Option<ToolSpec>,
    /// Tools that are custom (freeform input), offered to the model as functions of `{input}`.
    pub custom: Vec<String>,
    /// The rendered prompt's end (a template may open the thinking there).
    pub prompt_tail: String,
    /// Whether the output text carries its tokens' logprobs (`top_logprobs`, or `include`
    /// `message.output_text.logprobs`).
    pub logprobs: bool,
    /// What the turn leaves behind when it ends (`finish.rs`).
    pub kept: Kept,
}

/// The shape of one response.
pub struct ResponsesShape {
    /// The response as it will be reported (status, output and usage filled in as it goes).
    pub response: ResponseObject,
    pub tools: Option<ToolSpec>,
    /// Tools that are custom (freeform input), offered to the model as functions of `{input}`.
    pub custom: Vec<String>,
    /// Where the turn ends (the stores: `finish.rs`).
    record: Record,
    /// The tokenizer (a token's logprobs are written with its text), when logprobs are asked.
    logprobs: Option<Arc<Tokenizer>>,
    /// The logprobs of the token being written, until its text lands in the output text.
    pending: Vec<TokenLogprobOut>,
    seq: usize,
    calls: CallStream,
    open: Option<OpenText>,
    finish: Option<FinishReason>,
    /// The reasoning splitter (models that think), the reasoning item being streamed, and the
    /// tokens that went to it.
    split: ReasoningSplit,
    prompt_tail: String,
    thinking: Option<OpenText>,
    reasoning_tokens: usize,
}

impl ResponsesShape {
    /// A shape for `response` (status `in_progress`, no output yet) answering `turn`.
    pub fn new(st: Arc<ResponsesState>, response: ResponseObject, turn: Turn) -> ResponsesShape {
        let Turn {
            tools,
            custom,
            prompt_tail,
            logprobs,
            kept,
        } = turn;
        let logprobs = logprobs.then(|| st.tokenizer().clone());
        ResponsesShape {
            split: ReasoningSplit::new(&prompt_tail),
            prompt_tail,
            thinking: None,
            reasoning_tokens: 0,
            record: Record::new(st, kept),
            logprobs,
            pending: vec![],
            response,
            tools,
            custom,
            seq: 0,
            calls: CallStream::default(),
            open: None,
            finish: None,
        }
    }

    fn push(&mut self, out: &mut Vec<StreamEvent>, mut e: StreamEvent) {
        e.set_sequence(self.seq);
        self.seq += 1;
        out.push(e);
    }

    fn call_item(&self, c: &ParsedCall) -> OutputItem {
        let (id, call_id) = (item_id("fc"), call_id());
        if self.custom.contains(&c.name) {
            let input = serde_json::from_str::<Value>(&c.arguments)
                .ok()
                .and_then(|v| v.get("input").and_then(Value::as_str).map(str::to_string))
                .unwrap_or_else(|| c.arguments.clone());
            return OutputItem::CustomToolCall {
                id,
                call_id,
                name: c.name.clone(),
                input,
                status: "completed",
            };
        }
        OutputItem::FunctionCall {
            id,
            call_id,
            name: c.name.clone(),
            arguments: c.arguments.clone(),
            status: "completed",
        }
    }

    /// Reasoning text: opens the reasoning item when none is open, then a delta.
    fn reason(&mut self, t: String, out: &mut Vec<StreamEvent>) {
        if t.is_empty() {
            return;
        }
        if self.thinking.is_none() {
            let index = self.response.output.len();
            let id = item_id("rs");
            let opened = OutputItem::Reasoning {
                id: id.clone(),
                summary: vec![],
                content: vec![],
                status: "in_progress",
            };
            self.push(out, StreamEvent::ItemAdded(item(index, opened.clone())));
            self.response.output.push(opened);
            self.thinking = Some(OpenText {
                logprobs: vec![],
                index,
                id,
                text: String::new(),
            });
        }
        let Some(o) = self.thinking.as_mut() else { return };
        o.text.push_str(&t);
        let e = StreamEvent::ReasoningDelta(delta(o, t, None));
        self.push(out, e);
    }

    /// Closes the reasoning item.
    fn close_reasoning(&mut self, out: &mut Vec<StreamEvent>) {
        let Some(o) = self.thinking.take() else { return };
        self.push(out, StreamEvent::ReasoningDone(done(&o, None)));
        let closed = OutputItem::Reasoning {
            id: o.id,
            summary: vec![],
            content: vec![ReasoningText {
                kind: "reasoning_text",
                text: o.text,
            }],
            status: "completed",
        };
        self.push(out, StreamEvent::ItemDone(item(o.index, closed.clone())));
        self.response.output[o.index] = closed;
    }

    /// A text delta through the reasoning splitter: reasoning goes to its item, the answer is returned.
    fn route(&mut self, text: &str, end: bool, out: &mut Vec<StreamEvent>) -> String {
        let mut parts = self.split.push(text);
        if end {
            parts.extend(self.split.finish());
        }
        let mut answer = String::new();
        for p in parts {
            match p {
                Split::Reasoning(r) => self.reason(r, out),
                Split::Content(c) => answer.push_str(&c),
            }
        }
        answer
    }

    /// Text: opens the message item when none is open, then a delta.
    fn text(&mut self, t: String, out: &mut Vec<StreamEvent>) {
        if t.is_empty() {
            return;
        }
        self.close_reasoning(out);
        if self.open.is_none() {
            let index = self.response.output.len();
            let opened = OutputItem::Message {
                id: item_id("msg"),
                status: "in_progress",
                role: "assistant",
                content: vec![],
            };
            let o = OpenText {
                logprobs: vec![],
                index,
                id: opened.id().to_string(),
                text: String::new(),
            };
            self.push(out, StreamEvent::ItemAdded(item(index, opened.clone())));
            self.push(out, StreamEvent::PartAdded(part(&o, OutputText::of(String::new()))));
            // the item's place in the output is taken now; its content is filled when it closes
            self.response.output.push(opened);
            self.open = Some(o);
        }
        let Some(o) = self.open.as_mut() else { return };
        o.text.push_str(&t);
        let lps = std::mem::take(&mut self.pending);
        o.logprobs.extend(lps.iter().cloned());
        let e = StreamEvent::TextDelta(delta(o, t, Some(lps)));
        self.push(out, e);
    }

    /// Closes the open message item.
    fn close_text(&mut self, status: &'static str, out: &mut Vec<StreamEvent>) {
        let Some(mut o) = self.open.take() else { return };
        // tokens whose text was held back to the end (part of a character) belong to it too
        o.logprobs.append(&mut self.pending);
        let whole = OutputText {
            logprobs: o.logprobs.clone(),
            ..OutputText::of(o.text.clone())
        };
        self.push(out, StreamEvent::TextDone(done(&o, Some(o.logprobs.clone()))));
        self.push(out, StreamEvent::PartDone(part(&o, whole.clone())));
        let closed = OutputItem::Message {
            id: o.id,
            status,
            role: "assistant",
            content: vec![whole],
        };
        self.push(out, StreamEvent::ItemDone(item(o.index, closed.clone())));
        self.response.output[o.index] = closed;
    }

    /// A complete call: its own item, opened and closed at once.
    fn call(&mut self, c: ParsedCall, out: &mut Vec<StreamEvent>) {
        self.close_reasoning(out);
        self.close_text("completed", out);
        let output_index = self.response.output.len();
        let whole = self.call_item(&c);
        // the item as opened: no arguments (or input) yet, in progress
        let mut added = whole.clone();
        let (id, text) = match &mut added {
            OutputItem::CustomToolCall { id, input, status, .. } => {
                *status = "in_progress";
                (id.clone(), std::mem::take(input))
            }
            OutputItem::FunctionCall {
                id, arguments, status, ..
            } => {
                *status = "in_progress";
                (id.clone(), std::mem::take(arguments))
            }
            OutputItem::Message { .. } | OutputItem::Reasoning { .. } | OutputItem::Compaction { .. } => return,
        };
        let custom = matches!(whole, OutputItem::CustomToolCall { .. });
        self.push(out, StreamEvent::ItemAdded(item(output_index, added)));
        let d = CallDelta {
            sequence_number: 0,
            item_id: id.clone(),
            output_index,
            delta: text.clone(),
        };
        let (d, end) = match custom {
            true => (
                StreamEvent::InputDelta(d),
                StreamEvent::InputDone(InputDone {
                    sequence_number: 0,
                    item_id: id,
                    output_index,
                    name: c.name,
                    input: text,
                }),
            ),
            false => (
                StreamEvent::ArgumentsDelta(d),
                StreamEvent::ArgumentsDone(ArgumentsDone {
                    sequence_number: 0,
                    item_id: id,
                    output_index,
                    name: c.name,
                    arguments: text,
                }),
            ),
        };
        self.push(out, d);
        self.push(out, end);
        self.push(out, StreamEvent::ItemDone(item(output_index, whole.clone())));
        self.response.output.push(whole);
    }

    fn pieces(&mut self, pieces: Vec<Piece>, out: &mut Vec<StreamEvent>) {
        for p in pieces {
            match p {
                Piece::Content(t) => self.text(t, out),
                Piece::Call(c) => self.call(c, out),
            }
        }
    }

    /// Status and incomplete details from how generation ended.
    fn conclude(&mut self, usage: &Usage) {
        let mut u = ResponseUsage::of(usage);
        u.output_tokens_details.reasoning_tokens = self.reasoning_tokens;
        self.response.usage = Some(u);
        if self.finish == Some(FinishReason::Length) {
            self.response.status = "incomplete";
            self.response.incomplete_details = Some(Incomplete {
                reason: "max_output_tokens".into(),
            });
        } else {
            self.response.status = "completed";
            self.response.completed_at = Some(crate::ids::now_secs());
        }
    }

    /// The response as a stream event's `response` field.
    fn snapshot(&self) -> WithResponse {
        WithResponse {
            sequence_number: 0,
            response: self.response.clone(),
        }
    }
}

/// The `error.code` of an engine failure.
fn code_of(e: &EngineError) -> &'static str {
    match e {
        EngineError::PromptTooLong { .. } | EngineError::TooManyTokens { .. } => "context_length_exceeded",
        EngineError::QueueFull { .. } => "rate_limit_exceeded",
        _ => "server_error",
    }
}

impl Shape for ResponsesShape {
    type Chunk = StreamEvent;
    type Body = ResponseObject;
    const DONE_MARKER: bool = false;

    fn event_name(c: &StreamEvent) -> Option<&'static str> {
        Some(c.kind())
    }

    fn start(&mut self) -> Vec<StreamEvent> {
        let mut out = vec![];
        let snap = self.snapshot();
        self.push(&mut out, StreamEvent::Created(snap));
        let snap = self.snapshot();
        self.push(&mut out, StreamEvent::InProgress(snap));
        out
    }

    fn token(&mut self, _: usize, _: usize, _: u32, text: String, lp: Option<TokenLogprob>) -> Vec<StreamEvent> {
        let mut out = vec![];
        if let (Some(tok), Some(lp)) = (&self.logprobs, &lp) {
            // (a token whose text is held back, part of a character, joins the next delta)
            self.pending.push(TokenLogprobOut::of(tok, lp));
        }
        let before = self.seq;
        let text = self.route(&text, false, &mut out);
        if text.is_empty() && (self.seq > before || self.thinking.is_some()) {
            self.reasoning_tokens += 1;
            // the reasoning took it: none of it goes to the output text
            self.pending.clear();
        }
        match self.tools.clone() {
            Some(spec) => {
                let pieces = self.calls.push(&spec, &text);
                self.pieces(pieces, &mut out);
            }
            None => self.text(text, &mut out),
        }
        out
    }

    fn finished(
        &mut self,
        _: usize,
        _: usize,
        reason: FinishReason,
        text: String,
        _: Option<StopMatch>,
    ) -> Vec<StreamEvent> {
        let mut out = vec![];
        self.finish = Some(reason);
        let text = self.route(&text, true, &mut out);
        self.close_reasoning(&mut out);
        match self.tools.clone() {
            Some(spec) => {
                let mut pieces = self.calls.push(&spec, &text);
                pieces.extend(self.calls.finish(&spec));
                self.pieces(pieces, &mut out);
            }
            None => self.text(text, &mut out),
        }
        let status = match reason {
            FinishReason::Length => "incomplete",
            FinishReason::Stop => "completed",
        };
        self.close_text(status, &mut out);
        out
    }

    /// (Never asked for: a response reports its usage in its closing event, [`Shape::end`] below.)
    fn usage_chunk(&self, _: UsageOut) -> StreamEvent {
        StreamEvent::InProgress(self.snapshot())
    }

    fn set_running_usage(_: &mut StreamEvent, _: UsageOut) {}

    fn end(&mut self, usage: &Usage, _: bool) -> Vec<StreamEvent> {
        self.conclude(usage);
        self.record.answered(&self.response);
        let mut out = vec![];
        let snap = self.snapshot();
        let e = match self.response.status {
            "incomplete" => StreamEvent::Incomplete(snap),
            _ => StreamEvent::Completed(snap),
        };
        self.push(&mut out, e);
        out
    }

    /// Stopped by `POST /v1/responses/{id}/cancel`: the open items closed, status `cancelled` (stored
    /// so, when stored), in a `response.incomplete` event (a stream always ends with one of the three).
    fn cancelled(&mut self) -> Vec<StreamEvent> {
        let mut out = vec![];
        self.close_reasoning(&mut out);
        self.close_text("incomplete", &mut out);
        self.response.status = "cancelled";
        self.record.answered(&self.response);
        self.record.ended(&self.response.id);
        let snap = self.snapshot();
        self.push(&mut out, StreamEvent::Incomplete(snap));
        out
    }

    fn failed(&mut self, e: &EngineError) -> Option<Vec<StreamEvent>> {
        let mut out = vec![];
        self.close_reasoning(&mut out);
        self.close_text("incomplete", &mut out);
        self.response.status = "failed";
        self.response.error = Some(ResponseError {
            code: code_of(e).into(),
            message: ApiError::from(e.clone()).to_string(),
        });
        self.record.failed(&self.response);
        self.record.ended(&self.response.id);
        let snap = self.snapshot();
        self.push(&mut out, StreamEvent::Failed(snap));
        Some(out)
    }

    fn body(mut self, choices: Vec<ChoiceOut>, _: PromptLogprobs, usage: Usage) -> ResponseObject {
        if let Some(ch) = choices.into_iter().next() {
            self.finish = ch.finish;
            let mut sink = vec![];
            let (reasoning, answer) = ReasoningSplit::whole(&self.prompt_tail, &ch.text);
            if let Some(r) = reasoning {
                // (a whole answer: the reasoning's share of the tokens is estimated by its share of the text)
                let share = r.len() as f64 / ch.text.len().max(1) as f64;
                self.reasoning_tokens = (share * ch.tokens.len() as f64).round() as usize;
                self.reason(r, &mut sink);
                self.close_reasoning(&mut sink);
            }
            if let Some(tok) = &self.logprobs {
                // (a whole answer: its text carries every token's logprobs)
                self.pending = ch.logprobs.iter().map(|l| TokenLogprobOut::of(tok, l)).collect();
            }
            let ch = ChoiceOut { text: answer, ..ch };
            match self.tools.clone() {
                Some(spec) => {
                    let (content, calls) = spec.parse(&ch.text);
                    if let Some(c) = content.filter(|c| !c.trim().is_empty()) {
                        self.text(c, &mut sink);
                    }
                    self.close_text("completed", &mut sink);
                    for c in calls {
                        self.call(c, &mut sink);
                    }
                }
                None => self.text(ch.text, &mut sink),
            }
            let status = match ch.finish {
                Some(FinishReason::Length) => "incomplete",
                _ => "completed",
            };
            self.close_text(status, &mut sink);
        }
        self.conclude(&usage);
        self.record.answered(&self.response);
        self.response
    }
}
