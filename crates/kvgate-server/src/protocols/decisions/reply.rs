//! The `/v1/decisions` response as openai-python 3.60 types it (`Decision`): `model`, the answers in
//! question order and `usage` — no `id`, `object` or `created`. Every answer carries `name` (`null`
//! when the question had none: the Agents-style runners, the AI SDK and LangChain index by it); a choice
//! echoes its values typed (`true` stays a boolean) with probabilities in choice order; a score's
//! probabilities are `{value: i, label, probability}` and its `score` is `Σ i·pᵢ`; confidences are the
//! decision service's (Jev's formulas), so `/v1/systemone` and `/v1/decisions` agree on the same state.
//! Every usage counter is an integer and every details object is present.

use kvgate_decide::answer::argmax_first;
use kvgate_decide::{Answer, QuestionAnswer};
use serde::Serialize;

use super::spec::AnswerKey;
use super::wire::ChoiceValue;

/// The response body.
#[derive(Debug, Serialize)]
pub(crate) struct Decision {
    /// The served model.
    pub model: String,
    /// One per question, in order.
    pub answers: Vec<AnswerOut>,
    /// Token accounting.
    pub usage: DecisionUsage,
}

/// One answer.
#[derive(Debug, Serialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum AnswerOut {
    /// P(the statement is true).
    Predicate {
        /// The question's name.
        name: Option<String>,
        /// The probability.
        probability: f64,
    },
    /// The most probable value.
    Choice {
        /// The question's name.
        name: Option<String>,
        /// The value, typed.
        choice: ChoiceValue,
        /// Per value, in choice order.
        probabilities: Vec<ValueProbability>,
        /// How concentrated the distribution is.
        confidence: f64,
    },
    /// The expected level.
    Score {
        /// The question's name.
        name: Option<String>,
        /// `Σ i·pᵢ` over zero-based level indices.
        score: f64,
        /// Per level.
        probabilities: Vec<LevelProbability>,
        /// How concentrated the distribution is.
        confidence: f64,
    },
    /// Declined (only when asked for with `x_refuse_below`).
    Refusal {
        /// The question's name.
        name: Option<String>,
    },
}

/// A choice value's probability.
#[derive(Debug, Serialize, PartialEq)]
pub(crate) struct ValueProbability {
    /// The value, typed.
    pub value: ChoiceValue,
    /// Its probability.
    pub probability: f64,
}

/// A level's probability.
#[derive(Debug, Serialize, PartialEq)]
pub(crate) struct LevelProbability {
    /// The level's index.
    pub value: usize,
    /// Its label.
    pub label: String,
    /// Its probability.
    pub probability: f64,
}

/// `usage`.
#[derive(Debug, Serialize, PartialEq)]
pub(crate) struct DecisionUsage {
    /// Prompt tokens over every read.
    pub input_tokens: usize,
    /// Of which served from the prefix cache, and written to it.
    pub input_tokens_details: InputDetails,
    /// Always 0: nothing is generated.
    pub output_tokens: usize,
    /// Always 0.
    pub output_tokens_details: OutputDetails,
    /// Input plus output.
    pub total_tokens: usize,
}

/// `usage.input_tokens_details`.
#[derive(Debug, Serialize, PartialEq)]
pub(crate) struct InputDetails {
    /// Read from the prefix cache.
    pub cached_tokens: usize,
    /// Retained by this request for reuse (its breakpoints' prefixes).
    pub cache_write_tokens: usize,
}

/// `usage.output_tokens_details`.
#[derive(Debug, Serialize, PartialEq)]
pub(crate) struct OutputDetails {
    /// Always 0.
    pub reasoning_tokens: usize,
}

impl DecisionUsage {
    /// Usage of reads over `input` prompt tokens, `cached` of them from the cache, `written` retained.
    pub fn new(input: usize, cached: usize, written: usize) -> DecisionUsage {
        DecisionUsage {
            input_tokens: input,
            input_tokens_details: InputDetails {
                cached_tokens: cached,
                cache_write_tokens: written,
            },
            output_tokens: 0,
            output_tokens_details: OutputDetails { reasoning_tokens: 0 },
            total_tokens: input,
        }
    }
}

/// One question's answer in OpenAI's shape; a refusal when its label mass is under `refuse_below`.
pub(crate) fn answer(key: &AnswerKey, a: &QuestionAnswer, refuse_below: Option<f64>) -> AnswerOut {
    let name = match key {
        AnswerKey::Predicate { name } | AnswerKey::Choice { name, .. } | AnswerKey::Score { name, .. } => name.clone(),
    };
    if refuse_below.is_some_and(|r| a.diagnostics.label_mass < r) {
        return AnswerOut::Refusal { name };
    }
    match (key, &a.answer) {
        (AnswerKey::Predicate { .. }, Answer::Noul { noul }) => AnswerOut::Predicate {
            name,
            probability: *noul,
        },
        (
            AnswerKey::Choice { values, .. },
            Answer::Choice {
                probabilities,
                confidence,
                ..
            },
        ) => {
            let p: Vec<f64> = probabilities.0.iter().map(|(_, x)| *x).collect();
            AnswerOut::Choice {
                name,
                choice: values[argmax_first(&p)].clone(),
                probabilities: values
                    .iter()
                    .zip(p)
                    .map(|(v, probability)| ValueProbability {
                        value: v.clone(),
                        probability,
                    })
                    .collect(),
                confidence: *confidence,
            }
        }
        (
            AnswerKey::Score { labels, .. },
            Answer::Score {
                score,
                probabilities,
                confidence,
                ..
            },
        ) => AnswerOut::Score {
            name,
            score: *score,
            probabilities: labels
                .iter()
                .zip(&probabilities.0)
                .enumerate()
                .map(|(i, (label, (_, p)))| LevelProbability {
                    value: i,
                    label: label.clone(),
                    probability: *p,
                })
                .collect(),
            confidence: *confidence,
        },
        // The service answers each question with its own type; a mismatch cannot be rendered and
        // reads as a refusal of that question rather than a panic.
        _ => AnswerOut::Refusal { name },
    }
}
