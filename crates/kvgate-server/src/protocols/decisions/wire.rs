//! The `/v1/decisions` request as openai-python 3.60 defines it (`DecisionCreateParams`), as serde
//! types: `null` reads as absent for every optional field, unknown fields are refused (the OpenAPI sets
//! `additionalProperties: false`), and every problem is a 400 whose `param` is the exact JSON path
//! (`questions[3].choices[1].value`, `input[2].content[0]`). Questions are typed one by one
//! ([`crate::http::body::at`]), so the path survives the string-or-parts unions; the input items are
//! the one typed item of every wire, read strictly ([`crate::pipeline::conversation::item`]).
//! [`super::spec`] checks the limits and builds the decision's spec from these types.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::pipeline::cache::CacheMode;

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

/// A question's instructions: a string or parts.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum Content {
    /// Text.
    Text(String),
    /// Parts.
    Parts(Vec<Value>),
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
