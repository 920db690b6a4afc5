//! Reading a request body into a JSON object before its serde wire type takes it (every error a 400
//! that says what was wrong), and the JSON type names the hand-walked validators use in messages.

use serde_json::{Map, Value};

use crate::http::error::ApiError;

/// Parses raw bytes into an object.
pub fn parse_object(bytes: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let v: Value =
        serde_json::from_slice(bytes).map_err(|e| ApiError::bad(format!("the request body is not valid JSON: {e}")))?;
    match v {
        Value::Object(m) => Ok(m),
        other => Err(ApiError::bad(format!(
            "the request body must be a JSON object, got {}",
            kind(&other)
        ))),
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
