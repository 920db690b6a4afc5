//! The OpenAI request bodies as serde structs: the sampling fields both endpoints share, the
//! structured-output fields, and each endpoint's own. A body is checked against the exact field set
//! of its endpoint (an unknown key is a 400 naming it), then deserialised into these types (a wrong
//! type is a 400 naming the field's path); ranges and combinations are checked after, in one pass per
//! endpoint (`sampling::read` and the handlers). Fields OpenAI has and kvgate cannot honour are typed
//! [`Refused`] and refused by name.

use std::collections::BTreeMap;

use serde::de::{self, Deserializer, IgnoredAny, Visitor};
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::http::error::ApiError;
use crate::pipeline::openai::surface::{EndpointFields, VllmFields};

/// An integer; JSON clients sometimes send `5.0`, which counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Int(pub i64);

impl<'de> Deserialize<'de> for Int {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Int, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Int;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an integer")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Int, E> {
                Ok(Int(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Int, E> {
                i64::try_from(v)
                    .map(Int)
                    .map_err(|_| E::custom(format!("{v} is too large")))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Int, E> {
                if v.fract() == 0.0 && v.abs() < 9e15 {
                    Ok(Int(v as i64))
                } else {
                    Err(E::invalid_type(de::Unexpected::Float(v), &self))
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// A string or a list of strings (`stop`).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged, expecting = "a string or a list of strings")]
pub enum OneOrMany {
    /// One.
    One(String),
    /// Several.
    Many(Vec<String>),
}

impl OneOrMany {
    /// As a list.
    pub fn into_vec(self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        }
    }
}

/// An OpenAI field kvgate does not implement: any non-null value is refused by name.
pub type Refused = Option<IgnoredAny>;

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    /// A final chunk with the usage.
    pub include_usage: Option<bool>,
    /// vLLM's: usage in every chunk.
    pub continuous_usage_stats: Option<bool>,
}

/// The sampling and control fields of both endpoints (OpenAI's and vLLM's names and meanings).
#[derive(Debug, Default, Deserialize)]
pub struct SamplingFields {
    pub model: Option<String>,
    pub max_tokens: Option<Int>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<Int>,
    pub min_p: Option<f64>,
    pub seed: Option<Int>,
    pub stop: Option<OneOrMany>,
    pub stop_token_ids: Option<Vec<u32>>,
    pub include_stop_str_in_output: Option<bool>,
    pub ignore_eos: Option<bool>,
    pub min_tokens: Option<Int>,
    pub n: Option<Int>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub logit_bias: Option<BTreeMap<String, f64>>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    #[allow(dead_code)] // accepted and ignored (sampling::harmless)
    pub user: Option<String>,
    #[allow(dead_code)] // accepted and ignored (sampling::harmless)
    pub store: Option<bool>,
    pub metadata: Option<Map<String, Value>>,
    pub service_tier: Option<String>,
    pub reasoning_effort: Option<String>,
    pub cache_salt: Option<String>,
    /// OpenAI's session hint: the request's state is retained for the session's next turn.
    pub prompt_cache_key: Option<String>,
    /// OpenAI's prompt caching: `implicit` / `explicit` and the breakpoints' lifetime
    /// ([`crate::pipeline::cache`]).
    pub prompt_cache_options: Option<crate::pipeline::cache::CacheOptions>,
    /// Deprecated by OpenAI; accepted (kvgate retains by its session window).
    #[allow(dead_code)]
    pub prompt_cache_retention: Option<crate::pipeline::cache::Retention>,
    pub skip_special_tokens: Option<bool>,
    /// vLLM's: only these token ids may be sampled.
    pub allowed_token_ids: Option<Vec<u32>>,
    /// vLLM's: words never generated (tokenized by the handler).
    pub bad_words: Option<Vec<String>>,
    pub best_of: Refused,
    pub suffix: Refused,
    pub functions: Refused,
    pub function_call: Refused,
    pub audio: Refused,
    pub modalities: Refused,
    pub prediction: Refused,
    pub web_search_options: Refused,
    pub use_beam_search: Refused,
    /// vLLM's: the logprobs of every prompt token with this many alternatives (non-streamed only).
    pub prompt_logprobs: Option<Int>,
}

impl SamplingFields {
    /// 400 for the first refused field that is set.
    pub fn refuse_unsupported(&self) -> Result<(), ApiError> {
        let refused = [
            ("best_of", self.best_of.is_some()),
            ("suffix", self.suffix.is_some()),
            ("functions", self.functions.is_some()),
            ("function_call", self.function_call.is_some()),
            ("audio", self.audio.is_some()),
            ("modalities", self.modalities.is_some()),
            ("prediction", self.prediction.is_some()),
            ("web_search_options", self.web_search_options.is_some()),
            ("use_beam_search", self.use_beam_search.is_some()),
        ];
        match refused.iter().find(|(_, set)| *set) {
            Some((k @ ("functions" | "function_call"), _)) => Err(ApiError::param(
                k,
                format!("'{k}' (deprecated by OpenAI) is not supported by kvgate; use 'tools' and 'tool_choice'"),
            )),
            Some((k, _)) => Err(ApiError::param(k, format!("'{k}' is not supported by kvgate"))),
            None => Ok(()),
        }
    }
}

/// `response_format`.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ResponseFormat {
    /// Plain text (no constraint).
    Text,
    /// Any JSON object.
    JsonObject,
    /// A JSON Schema.
    JsonSchema {
        /// The schema and its options.
        json_schema: JsonSchemaFormat,
    },
}

/// `response_format.json_schema`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonSchemaFormat {
    /// Its name (informational).
    #[allow(dead_code)]
    pub name: Option<String>,
    /// What it is for (informational).
    #[allow(dead_code)]
    pub description: Option<String>,
    /// The schema.
    pub schema: Option<Value>,
    /// OpenAI's strict mode.
    pub strict: Option<bool>,
}

/// vLLM's `structured_outputs`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StructuredOutputs {
    /// A JSON Schema (object or JSON string).
    pub json: Option<Value>,
    /// A regular expression.
    pub regex: Option<String>,
    /// One of these strings.
    pub choice: Option<Vec<String>>,
    /// A Lark grammar.
    pub grammar: Option<String>,
    /// Any JSON object.
    pub json_object: Option<bool>,
    /// vLLM backend options, accepted (kvgate has one backend and no fallback).
    #[allow(dead_code)]
    pub disable_fallback: Option<bool>,
    /// Accepted: kvgate's JSON is always compact.
    #[allow(dead_code)]
    pub disable_any_whitespace: Option<bool>,
    /// Accepted: a strict schema already forbids what it does not list.
    #[allow(dead_code)]
    pub disable_additional_properties: Option<bool>,
}

/// The structured-output fields of both endpoints.
#[derive(Debug, Default, Deserialize)]
pub struct StructuredFields {
    pub response_format: Option<ResponseFormat>,
    pub structured_outputs: Option<StructuredOutputs>,
    pub guided_json: Option<Value>,
    pub guided_regex: Option<String>,
    pub guided_choice: Option<Vec<String>>,
    pub guided_grammar: Option<String>,
    #[allow(dead_code)] // which backend compiles grammars is kvgate's business (llguidance)
    pub guided_decoding_backend: Option<String>,
    pub guided_whitespace_pattern: Refused,
}

/// A body of exactly `T`'s fields, deserialised (an unknown field or a wrong type is a 400 naming it).
pub fn strict_body<T: for<'de> Deserialize<'de>>(body: Map<String, Value>) -> Result<T, ApiError> {
    only_known(&body, &[field_names::<T>()])?;
    typed(&Value::Object(body))
}

/// The field names of a struct's `Deserialize` (serde's own list, read by asking it to deserialize
/// from a deserializer that only records them).
pub fn field_names<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
    struct Names<'a>(&'a mut &'static [&'static str]);
    impl<'de> Deserializer<'de> for Names<'_> {
        type Error = de::value::Error;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("not a struct"))
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(de::Error::custom("names read"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option
            unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
        }
    }
    let mut names: &'static [&'static str] = &[];
    let _ = T::deserialize(Names(&mut names));
    names
}

/// Refuses keys of `body` that none of `known` field sets has.
pub fn only_known(body: &Map<String, Value>, known: &[&[&str]]) -> Result<(), ApiError> {
    match body.keys().find(|k| !known.iter().any(|set| set.contains(&k.as_str()))) {
        Some(k) => Err(ApiError::param(k, format!("unknown parameter '{k}'"))),
        None => Ok(()),
    }
}

/// An OpenAI endpoint's body: checked against the exact field set (the shared sampling and
/// structured-output fields, the endpoint's own `E` and the vLLM surface kvgate accepts only at its
/// no-op values, [`VllmFields`]), then deserialised into the three (the fourth only checked); the
/// whole body is returned too (for `--log-requests`).
pub fn endpoint_body<E: for<'de> Deserialize<'de> + EndpointFields>(
    body: Map<String, Value>,
) -> Result<(SamplingFields, StructuredFields, E, Value), ApiError> {
    only_known(
        &body,
        &[
            field_names::<SamplingFields>(),
            field_names::<StructuredFields>(),
            field_names::<E>(),
            field_names::<VllmFields>(),
        ],
    )?;
    let value = Value::Object(body);
    typed::<VllmFields>(&value)?.check::<E>()?;
    Ok((typed(&value)?, typed(&value)?, typed(&value)?, value))
}

/// Deserialises `body` into `T`; a wrong type is a 400 naming the field's path.
pub fn typed<T: for<'de> Deserialize<'de>>(body: &Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(body).map_err(|e| {
        let path = e.path().to_string();
        let field = path.split(['.', '[']).next().unwrap_or("").to_string();
        let inner = e.into_inner();
        if field.is_empty() || field == "?" {
            ApiError::bad(format!("invalid request: {inner}"))
        } else {
            ApiError::param(&field, format!("'{path}': {inner}"))
        }
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A body with a field of each kind (`/v1/completions`' own, as `protocols/completions/wire.rs`).
    #[derive(Deserialize)]
    #[allow(dead_code)]
    struct CompletionFields {
        prompt: Option<Value>,
        logprobs: Option<Int>,
        echo: Option<bool>,
    }

    #[test]
    fn field_names_are_serdes_and_types_name_the_path() {
        assert!(field_names::<CompletionFields>().contains(&"prompt"));
        assert!(field_names::<SamplingFields>().contains(&"stream_options"));
        assert_eq!(
            field_names::<StreamOptions>(),
            ["include_usage", "continuous_usage_stats"]
        );
        let e = typed::<SamplingFields>(&json!({"temperature": "hot"})).unwrap_err();
        assert!(e.to_string().contains("'temperature'"), "{e}");
        let e = typed::<SamplingFields>(&json!({"stream_options": {"include_usage": 1}})).unwrap_err();
        assert!(e.to_string().contains("'stream_options.include_usage'"), "{e}");
        let s: SamplingFields = typed(&json!({"max_tokens": 5.0, "n": null, "stop": "x"})).unwrap();
        assert_eq!((s.max_tokens, s.n), (Some(Int(5)), None));
        assert!(typed::<SamplingFields>(&json!({"max_tokens": 5.5})).is_err());
        let b = json!({"prompt": "x", "frobnicate": 1});
        let e = only_known(b.as_object().unwrap(), &[field_names::<CompletionFields>()]).unwrap_err();
        assert!(e.to_string().contains("frobnicate"));
    }
}
