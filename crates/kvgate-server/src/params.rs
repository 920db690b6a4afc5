//! Typed reading of request bodies: every field is checked for its type and range, and every error is
//! a 400 that names the parameter, the limit and the value. Unknown or unsupported parameters are
//! refused by name rather than silently ignored.

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

    /// A number within `[lo, hi]`.
    pub fn f32_in(&self, k: &str, lo: f32, hi: f32) -> Result<Option<f32>, ApiError> {
        match self.raw(k) {
            None => Ok(None),
            Some(v) => {
                let x = v
                    .as_f64()
                    .ok_or_else(|| ApiError::param(k, format!("'{k}' must be a number, got {}", show(v))))?;
                if !(x >= lo as f64 && x <= hi as f64) {
                    return Err(ApiError::param(
                        k,
                        format!("'{k}' must be between {lo} and {hi}, got {x}"),
                    ));
                }
                Ok(Some(x as f32))
            }
        }
    }

    /// An integer within `[lo, hi]`.
    pub fn int_in(&self, k: &str, lo: i64, hi: i64) -> Result<Option<i64>, ApiError> {
        match self.raw(k) {
            None => Ok(None),
            Some(v) => {
                let x = v.as_i64().or_else(|| {
                    v.as_f64()
                        .filter(|f| f.fract() == 0.0 && f.abs() < 9e15)
                        .map(|f| f as i64)
                });
                let x = x.ok_or_else(|| ApiError::param(k, format!("'{k}' must be an integer, got {}", show(v))))?;
                if x < lo || x > hi {
                    let range = if hi == i64::MAX {
                        format!("at least {lo}")
                    } else {
                        format!("between {lo} and {hi}")
                    };
                    return Err(ApiError::param(k, format!("'{k}' must be {range}, got {x}")));
                }
                Ok(Some(x))
            }
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

    /// A string or a list of strings (e.g. `stop`), at most `max` items.
    pub fn strings(&self, k: &str, max: usize) -> Result<Vec<String>, ApiError> {
        let out = match self.raw(k) {
            None => vec![],
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Array(a)) => a
                .iter()
                .map(|x| {
                    x.as_str().map(str::to_string).ok_or_else(|| {
                        ApiError::param(
                            k,
                            format!("'{k}' must be a string or a list of strings, got an item {}", show(x)),
                        )
                    })
                })
                .collect::<Result<_, _>>()?,
            Some(v) => {
                return Err(ApiError::param(
                    k,
                    format!("'{k}' must be a string or a list of strings, got {}", show(v)),
                ))
            }
        };
        if out.len() > max {
            return Err(ApiError::param(
                k,
                format!("'{k}' may hold at most {max} items, got {}", out.len()),
            ));
        }
        Ok(out)
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
