//! The decision service: a typed [`DecisionSpec`] in, a typed [`Decision`] out. It owns what decisions
//! need besides the engine — the tokenizer and chat template (each read is rendered exactly as a chat
//! completion over the same messages would be, so the follow-up finds the state warm), the label sets
//! of this tokenizer, the calibration priors and the per-type temperatures — and talks to the engine
//! only through [`Inference`]. Any protocol (the `/v1/systemone` route today) parses its wire into a
//! spec, calls [`DecisionService::decide`] and renders the answers; no decision policy lives above it.

use std::sync::Arc;

use kvgate_engine::{Inference, Usage};
use kvgate_model::prompt::{render_conversation, Message};
use kvgate_model::{ChatTemplate, Tokenizer};
use serde::Serialize;
use serde_json::{Map, Value};

use crate::answer::{self, Answer};
use crate::error::DecideError;
use crate::labels::LabelTable;
use crate::orders::ReadMethod;
use crate::priors::PriorCache;
use crate::reads;
use crate::spec::{DecisionSpec, Question};
use crate::temperature::DecisionTemperature;

/// How one question was read (`diagnostics` on the wire): the spec's `label_mass`, and kvgate's
/// `x_read` (the method used), `x_orders` (reads), `x_temperature`, `x_prior` (`cached` / `computed`,
/// when calibrated). Serialised in this order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Diagnostics {
    /// The mean probability mass the reads put on the labels at all.
    pub label_mass: f64,
    /// The read method's wire name.
    pub x_read: &'static str,
    /// Reads of this question (option orders).
    pub x_orders: usize,
    /// The temperature applied.
    pub x_temperature: f64,
    /// Where the calibration prior came from, when calibrated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub x_prior: Option<&'static str>,
}

/// One question's result.
#[derive(Debug, Clone, PartialEq)]
pub struct QuestionAnswer {
    /// The question's id.
    pub id: String,
    /// Its answer.
    pub answer: Answer,
    /// How it was read.
    pub diagnostics: Diagnostics,
}

/// A decision's result: the answers in the spec's order, and the token accounting over every read.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// One per question, in the spec's order.
    pub answers: Vec<QuestionAnswer>,
    /// Prompt tokens over every read (no output tokens), and those served from the prefix cache.
    pub usage: Usage,
    /// Tokens of the longest breakpoint prefix this decision computed and kept (written to the
    /// prompt cache).
    pub written_tokens: usize,
}

/// The service (one per served model).
pub struct DecisionService {
    pub(crate) engine: Arc<dyn Inference>,
    pub(crate) tokenizer: Arc<Tokenizer>,
    chat: Option<Arc<ChatTemplate>>,
    pub(crate) labels: LabelTable,
    pub(crate) priors: PriorCache,
    pub(crate) temperature: DecisionTemperature,
    /// Option orders per choice when a request does not say (`x_orders`).
    pub(crate) orders: usize,
    /// Whether a calibrating read method calibrates yes/no questions too.
    pub(crate) yes_no_calibration: bool,
    /// The read method when a request does not say (`x_read`).
    pub(crate) default_read: ReadMethod,
    pub(crate) model_name: String,
}

impl DecisionService {
    /// A service over `engine` for the model `model_name` (the metrics' label) with its tokenizer and
    /// chat template; finds the tokenizer's label sets once.
    pub fn new(
        engine: Arc<dyn Inference>,
        tokenizer: Arc<Tokenizer>,
        chat: Option<Arc<ChatTemplate>>,
        temperature: DecisionTemperature,
        orders: usize,
        model_name: String,
    ) -> DecisionService {
        DecisionService {
            labels: LabelTable::new(&tokenizer),
            engine,
            tokenizer,
            chat,
            priors: PriorCache::default(),
            temperature,
            orders: orders.clamp(1, crate::orders::MAX_ORDERS),
            yes_no_calibration: true,
            default_read: ReadMethod::UNFITTED,
            model_name,
        }
    }

    /// The service with this read method for requests that do not name one (unless set, that of a
    /// model nothing was fitted for, [`ReadMethod::UNFITTED`]).
    pub fn with_default_read(mut self, read: ReadMethod) -> DecisionService {
        self.default_read = read;
        self
    }

    /// The service with yes/no questions calibrated by a calibrating read method (`true`, the
    /// default) or read uncalibrated.
    pub fn with_yes_no_calibration(mut self, on: bool) -> DecisionService {
        self.yes_no_calibration = on;
        self
    }

    /// The label sets of this tokenizer.
    pub fn labels(&self) -> &LabelTable {
        &self.labels
    }

    /// Calibration priors kept so far.
    pub fn priors_kept(&self) -> usize {
        self.priors.len()
    }

    /// Answers every question of `spec` over its state: the state computed once (or found warm), one
    /// forked read per question and option order, calibrated and tempered; nothing sampled.
    pub async fn decide(&self, spec: &DecisionSpec) -> Result<Decision, DecideError> {
        let read = reads::run(self, spec).await?;
        let answers = spec
            .questions
            .iter()
            .zip(read.probs)
            .zip(read.diagnostics)
            .map(|(((id, q), p), diagnostics)| {
                let answer = match q {
                    Question::Noul { .. } => answer::noul(&p),
                    Question::Choice { options, .. } => {
                        let names: Vec<String> = options.iter().map(|(n, _)| n.clone()).collect();
                        answer::choice(&names, &p)
                    }
                    Question::Score { levels, .. } => answer::score(levels, &p),
                };
                QuestionAnswer {
                    id: id.clone(),
                    answer,
                    diagnostics,
                }
            })
            .collect();
        Ok(Decision {
            answers,
            usage: read.usage,
            written_tokens: read.written_tokens,
        })
    }

    /// The text of a conversation prefix as every read renders it, without the generation prompt
    /// (where a prompt-cache breakpoint closes it).
    pub(crate) fn render_prefix(
        &self,
        messages: &[Message],
        kwargs: &Map<String, Value>,
    ) -> Result<String, DecideError> {
        let tmpl = self.chat.as_ref().ok_or(DecideError::NoChatTemplate)?;
        render_conversation(tmpl, messages, false, false, kwargs, None)
            .map_err(|e| DecideError::field("messages", e.to_string()))
    }

    /// One read's text: `messages` through the chat template exactly as a chat completion renders
    /// them (no tools), with the generation prompt.
    pub(crate) fn render(&self, messages: &[Message], kwargs: &Map<String, Value>) -> Result<String, DecideError> {
        let tmpl = self.chat.as_ref().ok_or(DecideError::NoChatTemplate)?;
        render_conversation(tmpl, messages, true, false, kwargs, None)
            .map_err(|e| DecideError::field("messages", e.to_string()))
    }
}
