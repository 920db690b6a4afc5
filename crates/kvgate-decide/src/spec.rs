//! A decision's typed spec: the state, the questions in request order and how they are read. It is
//! what the service takes, whatever protocol asked (the `/v1/systemone` wire is parsed into it by the
//! HTTP layer, which lists every problem of a request at once); a spec is valid by construction of its
//! parser, and the service checks only what depends on the model (labels, context length).

use std::time::Duration;

use kvgate_model::prompt::Message;
use serde_json::Value;

use crate::orders::ReadMethod;

/// Text given as a string, or structured content (object/array, rendered as JSON text).
#[derive(Debug, Clone, PartialEq)]
pub struct Content(pub Value);

impl Content {
    /// The text the model reads: a string verbatim, anything else as compact JSON (keys in the order
    /// sent).
    pub fn text(&self) -> String {
        match &self.0 {
            Value::String(s) => s.clone(),
            v => v.to_string(),
        }
    }
}

/// What the questions are about.
#[derive(Debug, Clone, PartialEq)]
pub enum State {
    /// A string, object or array rendered as text.
    Text(String),
    /// A chat conversation (kvgate extension): normalised messages (as `/v1/chat/completions`
    /// passes them to the template), rendered through the chat template.
    Conversation(Vec<Message>),
}

/// One question.
#[derive(Debug, Clone, PartialEq)]
pub enum Question {
    /// Yes/no.
    Noul {
        /// The question.
        instructions: Option<Content>,
        /// What a yes means.
        yes: Option<Content>,
        /// What a no means.
        no: Option<Content>,
    },
    /// One of several options.
    Choice {
        /// The question.
        instructions: Content,
        /// Options in order, with optional descriptions.
        options: Vec<(String, Option<Content>)>,
    },
    /// A level on an ordered scale.
    Score {
        /// The question.
        instructions: Content,
        /// Levels, low to high, as sent (echoed in `legend`).
        levels: Vec<Value>,
    },
}

impl Question {
    /// The wire name of the type.
    pub fn kind(&self) -> &'static str {
        match self {
            Question::Noul { .. } => "noul",
            Question::Choice { .. } => "choice",
            Question::Score { .. } => "score",
        }
    }
}

/// The longest keep_alive accepted, in seconds.
pub const MAX_KEEP_ALIVE: f64 = 3600.0;

/// What to decide.
#[derive(Debug, Clone, PartialEq)]
pub struct DecisionSpec {
    /// The state.
    pub state: State,
    /// Questions in request order, with their ids.
    pub questions: Vec<(String, Question)>,
    /// Top-level instructions (a system message before the state).
    pub instructions: Option<Content>,
    /// How long to keep the state's prefix blocks after the decision.
    pub keep_alive: Option<Duration>,
    /// Prefix-cache isolation key (already joined to the tenant's when tenants are kept apart).
    pub cache_salt: Option<String>,
    /// How choices are read (`x_read`; none: the service's default for its model).
    pub read: Option<ReadMethod>,
    /// Option orders read per choice when ordered (`x_orders`; none: the service's default for its model).
    pub orders: Option<usize>,
    /// Who asks (the API key's index when several keys are configured): its `keep_alive` pins count
    /// against its own cap.
    pub tenant: Option<u32>,
    /// Prompt-cache breakpoints to write: per one, the index of the conversation message (of a
    /// [`State::Conversation`]) whose end closes a prefix to keep for `breakpoint_ttl`.
    pub breakpoints: Vec<usize>,
    /// How long a breakpoint's prefix is kept.
    pub breakpoint_ttl: Duration,
    /// Write only the breakpoints: no session retention of the state (OpenAI's explicit mode).
    pub breakpoints_only: bool,
}

impl DecisionSpec {
    /// A spec over `state` with `questions`, read the default way, nothing kept or salted.
    pub fn new(state: State, questions: Vec<(String, Question)>) -> DecisionSpec {
        DecisionSpec {
            state,
            questions,
            instructions: None,
            keep_alive: None,
            cache_salt: None,
            read: None,
            orders: None,
            tenant: None,
            breakpoints: vec![],
            breakpoint_ttl: Duration::ZERO,
            breakpoints_only: false,
        }
    }
}
