//! Field-by-field reading of the small bodies that have no wire struct of their own (`/tokenize`,
//! `/detokenize`, System One's model field): every error is a 400 that names the parameter and the
//! value. The OpenAI endpoints use the serde types of [`crate::openai::request`].

use serde_json::{Map, Value};

use crate::error::ApiError;

/// A JSON object being read field by field.
pub struct Body<'a> {
    map: &'a Map<String, Value>,
}

fn show(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 80 {
        format!("{}…", &s[..s.char_indices().nth(77).map_or(s.len(), |(i, _)| i)])
    } else {
        s
    }
}

impl<'a> Body<'a> {
    /// Parses raw bytes into an object.
    pub fn parse(bytes: &[u8]) -> Result<Map<String, Value>, ApiError> {
        let v: Value = serde_json::from_slice(bytes)
            .map_err(|e| ApiError::bad(format!("the request body is not valid JSON: {e}")))?;
        match v {
            Value::Object(m) => Ok(m),
            other => Err(ApiError::bad(format!(
                "the request body must be a JSON object, got {}",
                kind(&other)
            ))),
        }
    }

    /// Wraps an object.
    pub fn new(map: &'a Map<String, Value>) -> Body<'a> {
        Body { map }
    }

    /// Refuses every field not in `allowed`; `unsupported` ones get a message saying kvgate does not
    /// implement them.
    pub fn only(&self, allowed: &[&str], unsupported: &[&str]) -> Result<(), ApiError> {
        for k in self.map.keys() {
            if unsupported.contains(&k.as_str()) && !self.map[k].is_null() {
                return Err(ApiError::param(k, format!("'{k}' is not supported by kvgate")));
            }
            if !allowed.contains(&k.as_str()) && !unsupported.contains(&k.as_str()) {
                return Err(ApiError::param(k, format!("unknown parameter '{k}'")));
            }
        }
        Ok(())
    }

    /// The raw value (null counts as absent).
    pub fn raw(&self, k: &str) -> Option<&'a Value> {
        self.map.get(k).filter(|v| !v.is_null())
    }

    /// A boolean.
    pub fn bool(&self, k: &str) -> Result<Option<bool>, ApiError> {
        match self.raw(k) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(ApiError::param(k, format!("'{k}' must be a boolean, got {}", show(v)))),
        }
    }

    /// A string.
    pub fn str(&self, k: &str) -> Result<Option<&'a str>, ApiError> {
        match self.raw(k) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            Some(v) => Err(ApiError::param(k, format!("'{k}' must be a string, got {}", show(v)))),
        }
    }

    /// A list of token ids.
    pub fn ids(&self, k: &str) -> Result<Vec<u32>, ApiError> {
        match self.raw(k) {
            None => Ok(vec![]),
            Some(Value::Array(a)) => a
                .iter()
                .map(|x| {
                    x.as_u64()
                        .filter(|&t| t <= u32::MAX as u64)
                        .map(|t| t as u32)
                        .ok_or_else(|| {
                            ApiError::param(k, format!("'{k}' must be a list of token ids, got an item {}", show(x)))
                        })
                })
                .collect(),
            Some(v) => Err(ApiError::param(
                k,
                format!("'{k}' must be a list of token ids, got {}", show(v)),
            )),
        }
    }

    /// An object.
    pub fn object(&self, k: &str) -> Result<Option<&'a Map<String, Value>>, ApiError> {
        match self.raw(k) {
            None => Ok(None),
            Some(Value::Object(m)) => Ok(Some(m)),
            Some(v) => Err(ApiError::param(k, format!("'{k}' must be an object, got {}", show(v)))),
        }
    }
}

/// The JSON type name of a value.
pub fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
