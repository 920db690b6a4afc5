//! Structured outputs on the wire: OpenAI's `response_format` (`text`, `json_object`, `json_schema`
//! with `strict`), vLLM's `structured_outputs` (`json`, `regex`, `choice`, `grammar`, `json_object`)
//! and its older `guided_json` / `guided_regex` / `guided_choice` / `guided_grammar`, read as serde
//! types into one [`GrammarSpec`] and compiled (off the async runtime) into the engine's guide. At
//! most one of them per request; every problem is a 400 naming the field.

use std::sync::Arc;

use kvgate_engine::Guide;
use kvgate_grammar::{GrammarError, GrammarSpec, Grammars};
use serde::Deserialize;
use serde_json::Value;

use crate::error::ApiError;
use crate::params::Body;

/// Fields this module reads.
pub const FIELDS: &[&str] = &[
    "response_format",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "guided_decoding_backend",
    "guided_whitespace_pattern",
];

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema { json_schema: JsonSchemaFormat },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonSchemaFormat {
    #[allow(dead_code)]
    name: Option<String>,
    #[allow(dead_code)]
    description: Option<String>,
    schema: Option<Value>,
    strict: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StructuredOutputs {
    json: Option<Value>,
    regex: Option<String>,
    choice: Option<Vec<String>>,
    grammar: Option<String>,
    json_object: Option<bool>,
    #[allow(dead_code)]
    disable_fallback: Option<bool>,
    #[allow(dead_code)]
    disable_any_whitespace: Option<bool>,
    #[allow(dead_code)]
    disable_additional_properties: Option<bool>,
}

/// A schema given as an object or as a JSON string (vLLM accepts both).
fn schema_value(field: &str, v: Value) -> Result<Value, ApiError> {
    match v {
        Value::String(s) => serde_json::from_str(&s)
            .map_err(|e| ApiError::param(field, format!("'{field}' is a string but not JSON: {e}"))),
        other => Ok(other),
    }
}

fn parse<T: for<'de> Deserialize<'de>>(field: &str, v: &Value) -> Result<T, ApiError> {
    serde_json::from_value(v.clone()).map_err(|e| ApiError::param(field, format!("invalid '{field}': {e}")))
}

/// The grammar the request's output must follow, if any, with the field it came from.
pub fn read(b: &Body) -> Result<Option<(&'static str, GrammarSpec)>, ApiError> {
    let mut found: Vec<(&'static str, GrammarSpec)> = vec![];
    if let Some(v) = b.raw("response_format") {
        match parse::<ResponseFormat>("response_format", v)? {
            ResponseFormat::Text => {}
            ResponseFormat::JsonObject => found.push(("response_format", GrammarSpec::JsonObject)),
            ResponseFormat::JsonSchema { json_schema } => {
                let schema = json_schema.schema.ok_or_else(|| {
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
    }
    if let Some(v) = b.raw("structured_outputs") {
        let so: StructuredOutputs = parse("structured_outputs", v)?;
        let mut specs = vec![];
        if let Some(j) = so.json {
            specs.push(GrammarSpec::JsonSchema {
                schema: schema_value("structured_outputs", j)?,
                strict: true,
            });
        }
        if let Some(r) = so.regex {
            specs.push(GrammarSpec::Regex(r));
        }
        if let Some(c) = so.choice {
            specs.push(GrammarSpec::Choice(c));
        }
        if let Some(g) = so.grammar {
            specs.push(GrammarSpec::Lark(g));
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
    if let Some(v) = b.raw("guided_json") {
        found.push((
            "guided_json",
            GrammarSpec::JsonSchema {
                schema: schema_value("guided_json", v.clone())?,
                strict: true,
            },
        ));
    }
    if let Some(r) = b.str("guided_regex")? {
        found.push(("guided_regex", GrammarSpec::Regex(r.to_string())));
    }
    if let Some(v) = b.raw("guided_choice") {
        found.push(("guided_choice", GrammarSpec::Choice(parse("guided_choice", v)?)));
    }
    if let Some(g) = b.str("guided_grammar")? {
        found.push(("guided_grammar", GrammarSpec::Lark(g.to_string())));
    }
    // Which backend compiles the grammar is kvgate's business (llguidance); the name is accepted.
    let _ = b.str("guided_decoding_backend")?;
    if b.raw("guided_whitespace_pattern").is_some() {
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
