//! The server's error type and the one place where errors become HTTP responses.
//!
//! Two shapes, chosen by route: the OpenAI routes answer `{"error": {"message", "type", "param", "code"}}`;
//! `/v1/systemone` (whose clients are Jev clients) answers Jev's `{"detail": {"error_type", "message"}}`
//! ([`ErrorBody::Jev`]). Validation errors (422) have the System One shape
//! `{"detail": [{"type", "loc", "msg", "input"}, ...]}` on every route that produces them.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use kvgate_engine::EngineError;
use serde::Serialize;
use serde_json::Value;

/// `{"detail": [...]}`: a 422's problems.
#[derive(Serialize)]
struct ValidationBody<'a> {
    detail: &'a [Detail],
}

/// `{"error": {...}}`: OpenAI's error body.
#[derive(Serialize)]
struct OpenAiBody<'a> {
    error: OpenAiError<'a>,
}

#[derive(Serialize)]
struct OpenAiError<'a> {
    message: String,
    #[serde(rename = "type")]
    kind: &'static str,
    param: Option<&'a str>,
    code: Code,
}

/// `error.code`: the status (vLLM's integer), or a string (the Responses API's, as the Open Responses
/// schema requires).
#[derive(Serialize)]
#[serde(untagged)]
enum Code {
    Status(u16),
    Named(&'static str),
}

/// `{"detail": {"error_type", "message"}}`: Jev's error body.
#[derive(Serialize)]
struct JevBody {
    detail: JevError,
}

#[derive(Serialize)]
struct JevError {
    error_type: &'static str,
    message: String,
}

/// A body as JSON (serialising these plain structs cannot fail).
fn to_value<T: Serialize>(t: &T) -> Value {
    serde_json::to_value(t).unwrap_or(Value::Null)
}

/// One problem of a 422 System One validation error.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Detail {
    /// Error type (`missing`, `string_type`, `extra_forbidden`, ...).
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Location, e.g. `["body", "questions", "q1", "criteria"]`.
    pub loc: Vec<String>,
    /// Message.
    pub msg: String,
    /// The offending input.
    pub input: Value,
}

/// Every error the HTTP layer returns.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400: a bad parameter (the message names the limit and the value).
    #[error("{message}")]
    BadRequest {
        /// The message.
        message: String,
        /// The parameter at fault.
        param: Option<String>,
    },
    /// 401.
    #[error("{0}")]
    Unauthorized(String),
    /// 403 (a browser's WebSocket upgrade from an origin not listed).
    #[error("{0}")]
    Forbidden(String),
    /// 404: unknown model or route.
    #[error("{0}")]
    NotFound(String),
    /// 405.
    #[error("{0}")]
    MethodNotAllowed(String),
    /// 413.
    #[error("request body too large: the limit is {limit} bytes")]
    PayloadTooLarge {
        /// The limit.
        limit: u64,
    },
    /// 415.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// 422 (System One validation).
    #[error("invalid request")]
    Unprocessable(Vec<Detail>),
    /// 429.
    #[error("{message}")]
    TooManyRequests {
        /// The message.
        message: String,
        /// Seconds for `Retry-After`.
        retry_after: u64,
    },
    /// 503.
    #[error("{0}")]
    Unavailable(String),
    /// 500.
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    /// A 400 naming a parameter.
    pub fn param(param: &str, message: impl Into<String>) -> ApiError {
        ApiError::BadRequest {
            message: message.into(),
            param: Some(param.to_string()),
        }
    }

    /// The same error; a 400 names `field` (a top-level field) as its param instead of the exact
    /// path, which its message keeps — the OpenAI chat and Responses wires name the field.
    pub fn in_field(self, field: &str) -> ApiError {
        match self {
            ApiError::BadRequest { message, .. } => ApiError::param(field, message),
            other => other,
        }
    }

    /// A 400 without a specific parameter.
    pub fn bad(message: impl Into<String>) -> ApiError {
        ApiError::BadRequest {
            message: message.into(),
            param: None,
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest { .. } => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::Unprocessable(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::TooManyRequests { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn type_name(&self) -> &'static str {
        match self {
            ApiError::BadRequest { .. } => "BadRequestError",
            ApiError::Unauthorized(_) => "AuthenticationError",
            ApiError::Forbidden(_) => "PermissionDeniedError",
            ApiError::NotFound(_) => "NotFoundError",
            ApiError::MethodNotAllowed(_) => "MethodNotAllowedError",
            ApiError::PayloadTooLarge { .. } => "RequestTooLargeError",
            ApiError::UnsupportedMediaType(_) => "UnsupportedMediaTypeError",
            ApiError::Unprocessable(_) => "UnprocessableEntityError",
            ApiError::TooManyRequests { .. } => "RateLimitError",
            ApiError::Unavailable(_) => "ServiceUnavailableError",
            ApiError::Internal(_) => "InternalServerError",
        }
    }

    /// The OpenAI-shaped body (also used for errors inside a stream).
    pub fn body(&self) -> Value {
        if let ApiError::Unprocessable(details) = self {
            return to_value(&ValidationBody { detail: details });
        }
        let param = match self {
            ApiError::BadRequest { param, .. } => param.as_deref(),
            _ => None,
        };
        to_value(&OpenAiBody {
            error: OpenAiError {
                message: self.to_string(),
                kind: self.type_name(),
                param,
                code: Code::Status(self.status().as_u16()),
            },
        })
    }

    /// The Responses API's body: OpenAI's, with a string `code` (Jev's error types name them).
    fn responses_body(&self) -> Value {
        let mut v = self.body();
        if let (Some(e), false) = (v.get_mut("error"), matches!(self, ApiError::Unprocessable(_))) {
            e["code"] = to_value(&Code::Named(self.jev_type()));
        }
        v
    }
}

/// Which error body a route answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorBody {
    /// `{"error": {"message", "type", "param", "code"}}`.
    OpenAi,
    /// `{"detail": {"error_type", "message"}}` (Jev, on `/v1/systemone`).
    Jev,
    /// OpenAI's with `code` a string (`/v1/responses…`, `/v1/conversations…`).
    Responses,
}

impl ErrorBody {
    /// The shape of errors on `path`.
    pub fn of_path(path: &str) -> ErrorBody {
        if path == "/v1/systemone" {
            ErrorBody::Jev
        } else if path.starts_with("/v1/responses") || path.starts_with("/v1/conversations") {
            ErrorBody::Responses
        } else {
            ErrorBody::OpenAi
        }
    }
}

impl ApiError {
    /// Jev's `error_type` for this error.
    fn jev_type(&self) -> &'static str {
        match self {
            ApiError::BadRequest { .. } => "api_usage_error",
            ApiError::Unauthorized(_) => "authentication_error",
            ApiError::Forbidden(_) => "permission_denied",
            ApiError::NotFound(_) => "not_found",
            ApiError::MethodNotAllowed(_) => "method_not_allowed",
            ApiError::PayloadTooLarge { .. } => "request_too_large",
            ApiError::UnsupportedMediaType(_) => "unsupported_media_type",
            ApiError::Unprocessable(_) => "validation_error",
            ApiError::TooManyRequests { .. } => "rate_limit_error",
            ApiError::Unavailable(_) => "service_unavailable",
            ApiError::Internal(_) => "internal_error",
        }
    }

    /// The body in `shape` (422s keep the validation shape in both).
    pub fn body_in(&self, shape: ErrorBody) -> Value {
        match (shape, self) {
            (ErrorBody::Jev, e) if !matches!(e, ApiError::Unprocessable(_)) => to_value(&JevBody {
                detail: JevError {
                    error_type: self.jev_type(),
                    message: self.to_string(),
                },
            }),
            (ErrorBody::Responses, e) => e.responses_body(),
            _ => self.body(),
        }
    }

    /// The response in `shape`: status, body, and `Retry-After` for a 429.
    pub fn response_in(self, shape: ErrorBody) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::error!(status = status.as_u16(), error = %self, "request failed");
        }
        let mut resp = (status, axum::Json(self.body_in(shape))).into_response();
        if let ApiError::TooManyRequests { retry_after, .. } = self {
            if let Ok(v) = HeaderValue::from_str(&retry_after.to_string()) {
                resp.headers_mut().insert(header::RETRY_AFTER, v);
            }
        }
        resp
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> ApiError {
        match &e {
            EngineError::PromptTooLong { .. } | EngineError::EmptyPrompt | EngineError::InvalidToken { .. } => {
                ApiError::param("prompt", e.to_string())
            }
            EngineError::TooManyTokens { .. } => ApiError::param("max_tokens", e.to_string()),
            EngineError::DoesNotFit { .. } | EngineError::Unsupported(_) => ApiError::bad(e.to_string()),
            EngineError::QueueFull { .. } => ApiError::TooManyRequests {
                message: e.to_string(),
                retry_after: 1,
            },
            EngineError::EngineDead => ApiError::Unavailable(e.to_string()),
            EngineError::Config(_)
            | EngineError::Spawn(_)
            | EngineError::Backend(_)
            | EngineError::Scheduler(_)
            | EngineError::Panic(_) => ApiError::Internal(e.to_string()),
        }
    }
}

impl From<kvgate_decide::DecideError> for ApiError {
    fn from(e: kvgate_decide::DecideError) -> ApiError {
        use kvgate_decide::DecideError;
        match e {
            DecideError::Unanswerable { field, message } => ApiError::param(field, message),
            DecideError::NoChatTemplate => ApiError::bad(e.to_string()),
            DecideError::Engine(e) => e.into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.response_in(ErrorBody::OpenAi)
    }
}

/// An error of the Responses and Conversations routes: answered in [`ErrorBody::Responses`].
#[derive(Debug)]
pub struct SpecError(pub ApiError);

impl From<ApiError> for SpecError {
    fn from(e: ApiError) -> SpecError {
        SpecError(e)
    }
}

impl IntoResponse for SpecError {
    fn into_response(self) -> Response {
        self.0.response_in(ErrorBody::Responses)
    }
}

/// An error event of the Responses WebSocket mode (`GET /v1/responses` upgraded): the error as the
/// Responses routes answer it, with the HTTP status it would have had.
#[derive(Serialize)]
struct SocketError {
    #[serde(rename = "type")]
    kind: &'static str,
    status: u16,
    error: Value,
}

impl ApiError {
    /// This error as a WebSocket `error` event (JSON text); `code` replaces the error's code (the
    /// WebSocket mode names some, as `previous_response_not_found`).
    pub fn socket_event(&self, code: Option<&str>) -> String {
        let mut body = self.body_in(ErrorBody::Responses);
        let mut error = body.get_mut("error").map(Value::take).unwrap_or(body);
        if let (Some(c), Some(e)) = (code, error.as_object_mut()) {
            e.insert("code".into(), Value::String(c.into()));
        }
        let event = SocketError {
            kind: "error",
            status: self.status().as_u16(),
            error,
        };
        serde_json::to_string(&event).unwrap_or_default()
    }
}
