//! Structured outputs on the wire: OpenAI's `response_format` (`text`, `json_object`, `json_schema`
//! with `strict`), vLLM's `structured_outputs` (`json`, `regex`, `choice`, `grammar`, `json_object`)
//! and its older `guided_json` / `guided_regex` / `guided_choice` / `guided_grammar`, read from their
//! serde types ([`StructuredFields`]) into one [`GrammarSpec`] and compiled (off the async runtime) into the engine's guide. At
//! most one of them per request; every problem is a 400 naming the field.

use std::sync::Arc;

use kvgate_engine::Guide;
use kvgate_grammar::{GrammarError, GrammarSpec, Grammars};
use serde_json::Value;

use crate::http::error::ApiError;
use crate::pipeline::openai::request::{ResponseFormat, StructuredFields};

/// A schema given as an object or as a JSON string (vLLM accepts both).
fn schema_value(field: &str, v: Value) -> Result<Value, ApiError> {
    match v {
        Value::String(s) => serde_json::from_str(&s)
            .map_err(|e| ApiError::param(field, format!("'{field}' is a string but not JSON: {e}"))),
        other => Ok(other),
    }
}

/// The grammar the request's output must follow, if any, with the field it came from.
pub fn read(b: &StructuredFields) -> Result<Option<(&'static str, GrammarSpec)>, ApiError> {
    let mut found: Vec<(&'static str, GrammarSpec)> = vec![];
    match &b.response_format {
        None | Some(ResponseFormat::Text) => {}
        Some(ResponseFormat::JsonObject) => found.push(("response_format", GrammarSpec::JsonObject)),
        Some(ResponseFormat::JsonSchema { json_schema }) => {
            let schema = json_schema.schema.clone().ok_or_else(|| {
                ApiError::param("response_format", "'response_format.json_schema.schema' is required")
            })?;
            found.push((
                "response_format",
                GrammarSpec::JsonSchema {
                    schema,
                    strict: json_schema.strict.unwrap_or(false),
                },
            ));
        }
    }
    if let Some(so) = &b.structured_outputs {
        let mut specs = vec![];
        if let Some(j) = &so.json {
            specs.push(GrammarSpec::JsonSchema {
                schema: schema_value("structured_outputs", j.clone())?,
                strict: true,
            });
        }
        if let Some(r) = &so.regex {
            specs.push(GrammarSpec::Regex(r.clone()));
        }
        if let Some(c) = &so.choice {
            specs.push(GrammarSpec::Choice(c.clone()));
        }
        if let Some(g) = &so.grammar {
            specs.push(GrammarSpec::Lark(g.clone()));
        }
        if so.json_object == Some(true) {
            specs.push(GrammarSpec::JsonObject);
        }
        match specs.len() {
            0 => {}
            1 => found.extend(specs.into_iter().map(|s| ("structured_outputs", s))),
            k => {
                return Err(ApiError::param(
                    "structured_outputs",
                    format!(
                    "'structured_outputs' must set exactly one of json, regex, choice, grammar, json_object; got {k}"
                ),
                ))
            }
        }
    }
    if let Some(v) = &b.guided_json {
        found.push((
            "guided_json",
            GrammarSpec::JsonSchema {
                schema: schema_value("guided_json", v.clone())?,
                strict: true,
            },
        ));
    }
    if let Some(r) = &b.guided_regex {
        found.push(("guided_regex", GrammarSpec::Regex(r.clone())));
    }
    if let Some(c) = &b.guided_choice {
        found.push(("guided_choice", GrammarSpec::Choice(c.clone())));
    }
    if let Some(g) = &b.guided_grammar {
        found.push(("guided_grammar", GrammarSpec::Lark(g.clone())));
    }
    // Which backend compiles the grammar is kvgate's business (llguidance): `guided_decoding_backend`
    // is accepted and ignored.
    if b.guided_whitespace_pattern.is_some() {
        return Err(ApiError::param(
            "guided_whitespace_pattern",
            "'guided_whitespace_pattern' is not supported by kvgate (JSON is generated compact)",
        ));
    }
    if found.len() > 1 {
        let names: Vec<&str> = found.iter().map(|(f, _)| *f).collect();
        return Err(ApiError::param(
            names[1],
            format!("only one output constraint per request, got {}", names.join(" and ")),
        ));
    }
    Ok(found.pop())
}

/// Compiles `spec` on the blocking pool; an invalid grammar is a 400 on `field`.
pub async fn compile(grammars: Option<Arc<Grammars>>, field: &str, spec: GrammarSpec) -> Result<Guide, ApiError> {
    let Some(g) = grammars else {
        return Err(ApiError::param(
            field,
            "structured outputs are unavailable: the grammar engine could not read this model's tokenizer (see the startup log)",
        ));
    };
    let r = tokio::task::spawn_blocking(move || g.compile(&spec))
        .await
        .map_err(|e| ApiError::Internal(format!("grammar compilation failed: {e}")))?;
    r.map_err(|e| match e {
        GrammarError::Invalid { .. } => ApiError::param(field, format!("'{field}': {e}")),
        GrammarError::Vocabulary(_) => ApiError::param(field, e.to_string()),
    })
}
