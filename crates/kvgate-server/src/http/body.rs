//! Reading a request body into a JSON object before its serde wire type takes it: the content type
//! (415), the size (413, `--max-request-body`, after decompression), the JSON (400, saying what was
//! wrong); and the JSON type names the hand-walked validators use in messages.

use axum::http::{header, HeaderMap};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::http::error::ApiError;
use crate::http::state::AppState;

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

/// Reads `v` as `T`; a problem is a 400 naming `prefix` and the path inside `v`.
pub(crate) fn at<T: DeserializeOwned>(v: Value, prefix: &str) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let inner = e.path().to_string();
        let param = match inner.as_str() {
            "." | "" | "?" => prefix.to_string(),
            p if p.starts_with('[') => format!("{prefix}{p}"),
            p if prefix.is_empty() => p.to_string(),
            p => format!("{prefix}.{p}"),
        };
        let msg = e.into_inner().to_string();
        let msg = msg.replace(
            "data did not match any variant of untagged enum",
            "expected one of the forms of",
        );
        if param.is_empty() {
            ApiError::bad(format!("invalid request: {msg}"))
        } else {
            ApiError::param(&param, format!("{param}: {msg}"))
        }
    })
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

impl AppState {
    /// Checks the content type and parses a JSON object body (415 / 413 / 400 as appropriate).
    pub fn json_body(
        &self,
        headers: &HeaderMap,
        body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
    ) -> Result<Map<String, Value>, ApiError> {
        check_json_content_type(headers)?;
        let bytes = body.map_err(|e| self.body_error(e))?;
        parse_object(&bytes)
    }

    /// Maps a body-reading failure.
    pub fn body_error(&self, e: axum::extract::rejection::BytesRejection) -> ApiError {
        if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::PayloadTooLarge {
                limit: self.settings().max_request_body,
            }
        } else {
            ApiError::bad(format!("cannot read the request body: {e}"))
        }
    }
}

/// 415 unless the body is declared as JSON.
pub fn check_json_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let mime = ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    if mime == "application/json" || (mime.starts_with("application/") && mime.ends_with("+json")) {
        Ok(())
    } else {
        Err(ApiError::UnsupportedMediaType(format!(
            "Content-Type must be application/json, got {}",
            if ct.is_empty() {
                "none".to_string()
            } else {
                format!("{ct:?}")
            }
        )))
    }
}
