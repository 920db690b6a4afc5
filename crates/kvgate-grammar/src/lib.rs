//! kvgate's structured outputs: a request's grammar (JSON Schema, a bare JSON object, a regular
//! expression, a fixed choice of strings, or a Lark grammar, which llguidance reads with `%json`
//! embeds) compiled with llguidance against the served tokenizer into a [`Guide`] the engine applies
//! token by token.
//!
//! Guarantees: an invalid schema, regex or grammar is an error naming the problem, found when the
//! request is compiled (before it reaches the engine); compiling is bounded by llguidance's limits;
//! JSON is generated compact (`", "` and `": "` separators, no free whitespace), so a small model
//! cannot wander into endless blank space.

mod constraint;
mod vocab;

use std::sync::{Arc, Mutex};

use kvgate_engine::Guide;
use kvgate_model::Tokenizer;
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};
use toktrie::TokEnv;

use crate::constraint::LlgFactory;

/// What went wrong building a grammar.
#[derive(Debug, thiserror::Error)]
pub enum GrammarError {
    /// The tokenizer cannot be described to llguidance.
    #[error("structured outputs are unavailable for this tokenizer: {0}")]
    Vocabulary(String),
    /// The request's schema, regex or grammar is invalid or unsupported.
    #[error("invalid {what}: {message}")]
    Invalid {
        /// What was compiled (`json_schema`, `regex`, `grammar`…).
        what: &'static str,
        /// llguidance's reason.
        message: String,
    },
}

/// A request's output grammar.
#[derive(Debug, Clone, PartialEq)]
pub enum GrammarSpec {
    /// A JSON Schema. `strict` (OpenAI's): unsupported keywords are errors and objects without
    /// `additionalProperties` take no extra keys; not strict: unsupported keywords are ignored.
    JsonSchema {
        /// The schema.
        schema: Value,
        /// OpenAI's `strict`.
        strict: bool,
    },
    /// Any JSON object (`response_format: json_object`).
    JsonObject,
    /// A regular expression the whole output matches.
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A Lark grammar (llguidance's dialect: `start` rule, `%json {…}` embeds).
    Lark(String),
}

impl GrammarSpec {
    /// The field name the error messages use.
    pub fn kind(&self) -> &'static str {
        match self {
            GrammarSpec::JsonSchema { .. } => "json_schema",
            GrammarSpec::JsonObject => "json_object",
            GrammarSpec::Regex(_) => "regex",
            GrammarSpec::Choice(_) => "choice",
            GrammarSpec::Lark(_) => "grammar",
        }
    }
}

/// Compact JSON with llguidance's options (`x-guidance`), unless the schema sets its own.
fn with_json_options(mut schema: Value, strict: bool) -> Value {
    if let Value::Object(m) = &mut schema {
        m.entry("x-guidance").or_insert_with(|| json_options(strict));
    }
    schema
}

/// The `x-guidance` options kvgate compiles JSON with.
pub fn json_options(strict: bool) -> Value {
    json!({
        "whitespace_flexible": false,
        "item_separator": ", ",
        "key_separator": ": ",
        "lenient": !strict,
    })
}

/// A string as a Lark string literal.
pub fn lark_literal(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

fn top_level(spec: &GrammarSpec) -> Result<TopLevelGrammar, GrammarError> {
    Ok(match spec {
        GrammarSpec::JsonSchema { schema, strict } => {
            if !schema.is_object() && !schema.is_boolean() {
                return Err(GrammarError::Invalid {
                    what: "json_schema",
                    message: "a JSON Schema is an object (or true/false)".into(),
                });
            }
            TopLevelGrammar::from_json_schema(with_json_options(schema.clone(), *strict))
        }
        GrammarSpec::JsonObject => {
            TopLevelGrammar::from_json_schema(with_json_options(json!({"type": "object"}), false))
        }
        GrammarSpec::Regex(r) => TopLevelGrammar::from_regex(r),
        GrammarSpec::Choice(options) => {
            if options.is_empty() {
                return Err(GrammarError::Invalid {
                    what: "choice",
                    message: "at least one option is needed".into(),
                });
            }
            let alts: Vec<String> = options.iter().map(|o| lark_literal(o)).collect();
            TopLevelGrammar::from_lark(format!("start: {}", alts.join(" | ")))
        }
        GrammarSpec::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
    })
}

/// Compiles grammars against one tokenizer (built once at startup).
pub struct Grammars {
    factory: ParserFactory,
}

impl Grammars {
    /// The compiler for `tok`, a model of `vocab` logits ending at any of `eos`.
    pub fn new(tok: Arc<Tokenizer>, eos: &[u32], vocab: usize) -> Result<Grammars, GrammarError> {
        let env: TokEnv = vocab::tok_env(tok, eos, vocab)?;
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| GrammarError::Vocabulary(e.to_string()))?;
        factory.quiet();
        Ok(Grammars { factory })
    }

    /// Compiles `spec` into a guide; errors name the problem.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Guide, GrammarError> {
        let what = spec.kind();
        let grammar = top_level(spec)?;
        let parser = self.factory.create_parser(grammar).map_err(|e| GrammarError::Invalid {
            what,
            message: e.to_string(),
        })?;
        let mut m = Matcher::new(Ok(parser));
        // The first mask proves the grammar can start (an unsatisfiable schema fails here).
        if let Err(e) = m.compute_mask() {
            return Err(GrammarError::Invalid {
                what,
                message: e.to_string(),
            });
        }
        Ok(Guide(Arc::new(LlgFactory {
            proto: Mutex::new(m),
            what: what.to_string(),
        })))
    }
}

#[cfg(test)]
mod tests;
