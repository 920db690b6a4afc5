//! The `/v1/decisions` request as openai-python 3.60 defines it (`DecisionCreateParams`), as serde
//! types: `null` reads as absent for every optional field, unknown fields are refused (the OpenAPI sets
//! `additionalProperties: false`), and every problem is a 400 whose `param` is the exact JSON path
//! (`questions[3].choices[1].value`, `input[2].content[0]`). Items and questions are typed one by one
//! ([`at`]), so the path survives the `role`-or-`type` dispatch of items and the string-or-parts unions.
//! [`super::spec`] checks the limits and builds the decision's spec from these types.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::http::error::ApiError;
use crate::pipeline::cache::CacheMode;

/// Reads `v` as `T`; a problem is a 400 naming `prefix` and the path inside `v`.
pub(crate) fn at<T: DeserializeOwned>(v: Value, prefix: &str) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let inner = e.path().to_string();
        let param = match inner.as_str() {
            "." | "" | "?" => prefix.to_string(),
            p if p.starts_with('[') => format!("{prefix}{p}"),
            p if prefix.is_empty() => p.to_string(),
            p => format!("{prefix}.{p}"),
        };
        let msg = e.into_inner().to_string();
        let msg = msg.replace(
            "data did not match any variant of untagged enum",
            "expected one of the forms of",
        );
        if param.is_empty() {
            ApiError::bad(format!("invalid request: {msg}"))
        } else {
            ApiError::param(&param, format!("{param}: {msg}"))
        }
    })
}

/// The body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DecisionBody {
    /// The model.
    pub model: String,
    /// A string, or items (typed one by one in [`super::spec`]).
    pub input: Input,
    /// The questions (typed one by one).
    pub questions: Vec<Value>,
    /// A session hint (as on chat and responses): the decision's state is retained for the next turn
    /// either way.
    #[serde(default)]
    #[allow(dead_code)]
    pub prompt_cache_key: Option<String>,
    /// Implicit or explicit caching, and the written breakpoints' lifetime.
    #[serde(default)]
    pub prompt_cache_options: Option<CacheOptions>,
    /// An opaque end-user id (at most 128 characters; logged only).
    #[serde(default)]
    pub safety_identifier: Option<String>,
    /// kvgate extension: answer `refusal` to a question whose reads put less than this probability
    /// mass on its labels at all (the model did not answer in the question's terms). Off by default.
    #[serde(default)]
    pub x_refuse_below: Option<f64>,
}

/// `input`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum Input {
    /// One user text.
    Text(String),
    /// Items, in order.
    Items(Vec<Value>),
}

/// `prompt_cache_options`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CacheOptions {
    /// `implicit` (the default) or `explicit`.
    #[serde(default)]
    pub mode: Option<CacheMode>,
    /// The least lifetime of what the request writes.
    #[serde(default)]
    pub ttl: Option<String>,
}

/// `prompt_cache_breakpoint` on a content part.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // `mode` is checked by its type
pub(crate) struct Breakpoint {
    /// Always `explicit`.
    pub mode: BreakpointMode,
}

/// A breakpoint's mode.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum BreakpointMode {
    /// The only one.
    Explicit,
}

/// A message item's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Role {
    /// The user.
    User,
    /// The developer (read as a system turn).
    Developer,
    /// The system.
    System,
    /// The assistant, earlier.
    Assistant,
}

/// A message item (`type` optional: messages are told apart by `role`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // `type` is accepted, not used
pub(crate) struct MessageItem {
    /// Who speaks.
    pub role: Role,
    /// A string or parts (typed one by one).
    pub content: Content,
    /// `message`, when sent.
    #[serde(default, rename = "type")]
    pub kind: Option<MessageType>,
    /// An assistant message's phase (`commentary` / `final_answer`), ignored.
    #[serde(default)]
    pub phase: Option<Phase>,
}

/// `type: "message"`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(dead_code)]
pub(crate) enum MessageType {
    /// The one value.
    Message,
}

/// An assistant message's phase.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(dead_code)]
pub(crate) enum Phase {
    /// Intermediate commentary.
    Commentary,
    /// The final answer.
    FinalAnswer,
}

/// Content: a string or parts.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum Content {
    /// Text.
    Text(String),
    /// Parts.
    Parts(Vec<Value>),
}

/// A content part of any message or tool output (which role may carry which is checked after).
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
#[allow(dead_code)] // accepted fields kvgate does not use (ids, statuses, image details)
pub(crate) enum Part {
    /// Text, possibly closing a reusable prefix.
    InputText {
        /// The text.
        text: String,
        /// Ends a reusable prefix here.
        #[serde(default)]
        prompt_cache_breakpoint: Option<Breakpoint>,
    },
    /// An image (refused on a text-only model).
    InputImage {
        /// A data URL or an HTTP(S) URL.
        image_url: String,
        /// `low`, `high`, `auto` or `original`.
        #[serde(default)]
        detail: Option<String>,
        /// Ends a reusable prefix here.
        #[serde(default)]
        prompt_cache_breakpoint: Option<Breakpoint>,
    },
    /// JSON data, rendered as compact JSON text (at most 32 levels, 10,000 values, 256 KiB).
    InputJson {
        /// An object or an array of objects.
        data: Value,
    },
    /// Text the assistant wrote.
    OutputText {
        /// The text.
        text: String,
        /// Echoed from a Responses output item, ignored.
        #[serde(default)]
        annotations: Option<Value>,
        /// Echoed from a Responses output item, ignored.
        #[serde(default)]
        logprobs: Option<Value>,
    },
    /// A refusal the assistant wrote.
    Refusal {
        /// Its text.
        refusal: String,
    },
}

impl Part {
    /// The wire name of the part's type.
    pub fn kind(&self) -> &'static str {
        match self {
            Part::InputText { .. } => "input_text",
            Part::InputImage { .. } => "input_image",
            Part::InputJson { .. } => "input_json",
            Part::OutputText { .. } => "output_text",
            Part::Refusal { .. } => "refusal",
        }
    }
}

/// A tool call or its output (the items that are not messages).
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
#[allow(dead_code)] // accepted fields kvgate does not use (ids, statuses, image details)
pub(crate) enum ToolItem {
    /// A function call the model made.
    FunctionCall {
        /// Pairs it with its output.
        call_id: String,
        /// The function.
        name: String,
        /// Its arguments (JSON text).
        arguments: String,
        /// Ignored.
        #[serde(default)]
        id: Option<String>,
        /// Ignored.
        #[serde(default)]
        namespace: Option<String>,
        /// Ignored.
        #[serde(default)]
        status: Option<ItemStatus>,
    },
    /// A function's result.
    FunctionCallOutput {
        /// The call it answers.
        call_id: String,
        /// Text or `input_text` / `input_image` parts.
        output: Content,
        /// Ignored.
        #[serde(default)]
        id: Option<String>,
        /// Ignored.
        #[serde(default)]
        status: Option<ItemStatus>,
    },
    /// A custom (free-form) tool call.
    CustomToolCall {
        /// Pairs it with its output.
        call_id: String,
        /// The tool.
        name: String,
        /// Its input.
        input: String,
        /// Ignored.
        #[serde(default)]
        id: Option<String>,
        /// Ignored.
        #[serde(default)]
        namespace: Option<String>,
        /// Ignored.
        #[serde(default)]
        status: Option<ItemStatus>,
    },
    /// A custom tool's result.
    CustomToolCallOutput {
        /// The call it answers.
        call_id: String,
        /// Text or parts.
        output: Content,
        /// Ignored.
        #[serde(default)]
        id: Option<String>,
        /// Ignored.
        #[serde(default)]
        status: Option<ItemStatus>,
    },
}

/// An item's status.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(dead_code)]
pub(crate) enum ItemStatus {
    /// Running.
    InProgress,
    /// Done.
    Completed,
    /// Cut short.
    Incomplete,
}

/// A question.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum QuestionIn {
    /// How likely a statement about the input is true.
    Predicate {
        /// The statement.
        instructions: Content,
        /// Echoed in the answer (`null`: unnamed).
        #[serde(default)]
        name: Option<String>,
    },
    /// Which of the supplied values.
    Choice {
        /// The question.
        instructions: Content,
        /// 2–255 distinct values.
        choices: Vec<ChoiceIn>,
        /// Echoed in the answer.
        #[serde(default)]
        name: Option<String>,
    },
    /// A level on an ordered scale.
    Score {
        /// The question.
        instructions: Content,
        /// 2–10 levels, low to high.
        levels: Vec<LevelIn>,
        /// Echoed in the answer.
        #[serde(default)]
        name: Option<String>,
    },
}

/// A choice's value: a string or a boolean, kept typed (`"true"` is not `true`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(untagged)]
pub(crate) enum ChoiceValue {
    /// A boolean.
    Bool(bool),
    /// A string.
    Str(String),
}

/// One choice.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ChoiceIn {
    /// Its value, echoed typed.
    pub value: ChoiceValue,
    /// What it means.
    #[serde(default)]
    pub description: Option<String>,
}

/// One level of a score.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LevelIn {
    /// Its label, echoed in the answer.
    pub label: String,
    /// What it means.
    #[serde(default)]
    pub description: Option<String>,
}

/// A question instruction part (`input_text` without a breakpoint, `input_image`, `input_json`).
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
#[allow(dead_code)] // accepted fields kvgate does not use (ids, statuses, image details)
#[allow(clippy::enum_variant_names)] // the wire's names
pub(crate) enum InstructionPart {
    /// Text.
    InputText {
        /// The text.
        text: String,
    },
    /// An image (refused on a text-only model).
    InputImage {
        /// The image.
        image_url: String,
        /// Its detail.
        #[serde(default)]
        detail: Option<String>,
    },
    /// JSON data rendered as text.
    InputJson {
        /// An object or an array of objects.
        data: Value,
    },
}
