//! The layers around every route: CORS exactly as `specs/server.md` says (deny by default, exact origin
//! match, preflights answered before auth, error responses to listed origins still carry the headers),
//! API-key auth (constant-time comparison; `/health`, `/ping`, `/version`, `/metrics` open), structured
//! request logs (request id, route, status, latency; no bodies or keys), and panics turned into 500s.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, Response, StatusCode};
use axum::middleware::Next;
use axum::response::IntoResponse;
use subtle::ConstantTimeEq;

use crate::http::error::{ApiError, ErrorBody};

/// The effective CORS policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorsPolicy {
    /// Exact origins, or `*`.
    pub origins: Vec<String>,
    /// Methods (or `*`).
    pub methods: Vec<String>,
    /// Headers (or `*`).
    pub headers: Vec<String>,
    /// Credentials allowed.
    pub credentials: bool,
}

const ALL_METHODS: &str = "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT";

impl CorsPolicy {
    pub(crate) fn allows(&self, origin: &str) -> bool {
        self.origins.iter().any(|o| o == "*" || o == origin)
    }

    fn wildcard(&self) -> bool {
        self.origins.iter().any(|o| o == "*")
    }

    /// One line for the start-up log.
    pub fn describe(&self) -> String {
        if self.origins.is_empty() {
            return "CORS: no origin allowed (browsers on other origins cannot read responses; preflights get 400)"
                .into();
        }
        format!(
            "CORS: origins {:?}, methods {:?}, headers {:?}, credentials {}",
            self.origins, self.methods, self.headers, self.credentials
        )
    }

    fn allow_origin_value(&self, origin: &str) -> Option<HeaderValue> {
        if self.wildcard() && !self.credentials {
            Some(HeaderValue::from_static("*"))
        } else {
            HeaderValue::from_str(origin).ok()
        }
    }
}

fn text(status: StatusCode, body: &'static str) -> Response<Body> {
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// The CORS layer.
pub async fn cors(State(p): State<Arc<CorsPolicy>>, req: Request, next: Next) -> Response<Body> {
    let origin = req
        .headers()
        .get(header::ORIGIN)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let Some(origin) = origin else {
        return next.run(req).await;
    };
    let preflight =
        req.method() == Method::OPTIONS && req.headers().contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    if preflight {
        if !p.allows(&origin) {
            return text(StatusCode::BAD_REQUEST, "Disallowed CORS origin");
        }
        let want_method = req
            .headers()
            .get(header::ACCESS_CONTROL_REQUEST_METHOD)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_ascii_uppercase();
        let any_method = p.methods.iter().any(|m| m == "*");
        if !any_method && !p.methods.iter().any(|m| m.eq_ignore_ascii_case(&want_method)) {
            return text(StatusCode::BAD_REQUEST, "Disallowed CORS method");
        }
        let want_headers = req
            .headers()
            .get(header::ACCESS_CONTROL_REQUEST_HEADERS)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let any_header = p.headers.iter().any(|h| h == "*");
        if !any_header {
            for h in want_headers.split(',').map(str::trim).filter(|h| !h.is_empty()) {
                let simple = ["accept", "accept-language", "content-language", "content-type"];
                if !simple.contains(&h.to_ascii_lowercase().as_str())
                    && !p.headers.iter().any(|x| x.eq_ignore_ascii_case(h))
                {
                    return text(StatusCode::BAD_REQUEST, "Disallowed CORS headers");
                }
            }
        }
        let mut r = text(StatusCode::OK, "OK");
        let h = r.headers_mut();
        if let Some(v) = p.allow_origin_value(&origin) {
            h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, v);
        }
        h.insert(header::VARY, HeaderValue::from_static("Origin"));
        let methods = if any_method {
            ALL_METHODS.to_string()
        } else {
            p.methods.join(", ")
        };
        if let Ok(v) = HeaderValue::from_str(&methods) {
            h.insert(header::ACCESS_CONTROL_ALLOW_METHODS, v);
        }
        let headers = if any_header { want_headers } else { p.headers.join(", ") };
        if let Ok(v) = HeaderValue::from_str(&headers) {
            if !headers.is_empty() {
                h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, v);
            }
        }
        h.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("600"));
        if p.credentials {
            h.insert(
                header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
                HeaderValue::from_static("true"),
            );
        }
        return r;
    }
    let mut r = next.run(req).await;
    if p.allows(&origin) {
        let h = r.headers_mut();
        if let Some(v) = p.allow_origin_value(&origin) {
            h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, v);
        }
        h.append(header::VARY, HeaderValue::from_static("Origin"));
        if p.credentials {
            h.insert(
                header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
                HeaderValue::from_static("true"),
            );
        }
    }
    r
}

/// The API keys, and whether they are several tenants (more than one key).
#[derive(Debug, Clone)]
pub struct Keys(pub Vec<String>, pub bool);

/// Routes that never need a key.
pub const OPEN_ROUTES: [&str; 4] = ["/health", "/ping", "/version", "/metrics"];

/// The index of the key a request carries (`Authorization: Bearer <key>`, the scheme in any case),
/// compared against every key in constant time.
fn key_index(headers: &HeaderMap, keys: &[String]) -> Option<usize> {
    let v = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok())?;
    // The scheme is case-insensitive (RFC 9110 §11.1): `Bearer`, `bearer`, `BEARER`.
    let (scheme, token) = v.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let token = token.trim().as_bytes();
    // Compare against every key without stopping early.
    let mut found = subtle::CtOption::new(0u64, subtle::Choice::from(0u8));
    for (i, k) in keys.iter().enumerate() {
        let hit = k.as_bytes().ct_eq(token);
        found = subtle::CtOption::new(i as u64, hit).or_else(|| found);
    }
    Option::<u64>::from(found).map(|i| i as usize)
}

/// The API-key layer.
pub async fn auth(State(keys): State<Arc<Keys>>, mut req: Request, next: Next) -> Response<Body> {
    if keys.0.is_empty() || OPEN_ROUTES.contains(&req.uri().path()) || req.method() == Method::OPTIONS {
        return next.run(req).await;
    }
    if let Some(i) = key_index(req.headers(), &keys.0) {
        if keys.1 {
            req.extensions_mut().insert(RequestTenant(Some(i as u32)));
        }
        return next.run(req).await;
    }
    let why = if req.headers().contains_key(header::AUTHORIZATION) {
        "Unauthorized: the API key is not valid (send Authorization: Bearer <key>)"
    } else {
        "Unauthorized: an API key is required (Authorization: Bearer <key>)"
    };
    ApiError::Unauthorized(why.into()).response_in(ErrorBody::of_path(req.uri().path()))
}

/// Request-body encodings the decompression layer decodes.
pub const BODY_ENCODINGS: [&str; 5] = ["identity", "gzip", "deflate", "br", "zstd"];

/// Refuses a request body in an encoding the decompression layer cannot decode with a 415 that names
/// it (in the route's error shape), instead of the layer's empty 415.
pub async fn body_encoding(req: Request, next: Next) -> Response<Body> {
    let bad = req
        .headers()
        .get_all(header::CONTENT_ENCODING)
        .iter()
        .flat_map(|v| v.to_str().unwrap_or("?").split(','))
        .map(|e| e.trim().to_ascii_lowercase())
        .find(|e| !e.is_empty() && !BODY_ENCODINGS.contains(&e.as_str()));
    match bad {
        None => next.run(req).await,
        Some(e) => ApiError::UnsupportedMediaType(format!(
            "Content-Encoding {e:?} is not supported; send one of {}",
            BODY_ENCODINGS.join(", ")
        ))
        .response_in(ErrorBody::of_path(req.uri().path())),
    }
}

/// Whether a client's `X-Request-Id` may be used as is: 1–128 characters of `A-Z a-z 0-9 . _ : / -`.
/// Anything else (spaces, quotes, `=`: what could forge fields in a text log line) is replaced by an id
/// of kvgate's own.
pub fn safe_request_id(v: &str) -> bool {
    !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_alphanumeric() || b"._:/-".contains(&b))
}

/// Structured request log line per request: id, method, route, status, latency.
pub async fn log(req: Request, next: Next) -> Response<Body> {
    let start = Instant::now();
    let method = req.method().clone();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| req.uri().path().to_string());
    let id = req
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| safe_request_id(v))
        .map(str::to_string)
        .unwrap_or_else(|| crate::ids::request_id("req"));
    let mut r = next.run(req).await;
    if let Ok(v) = HeaderValue::from_str(&id) {
        r.headers_mut().insert("x-request-id", v);
    }
    tracing::info!(
        target: "kvgate::access",
        request_id = %id,
        method = %method,
        route = %route,
        status = r.status().as_u16(),
        latency_ms = start.elapsed().as_secs_f64() * 1000.0,
        "request"
    );
    r
}

/// The response for a panic inside a handler: a 500 for that request; the server keeps serving.
pub fn panic_response(err: Box<dyn std::any::Any + Send + 'static>) -> Response<Body> {
    let msg = err
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown panic".into());
    tracing::error!(panic = %msg, "a request handler panicked");
    ApiError::Internal("internal error while handling the request".into()).into_response()
}

/// The API key (its index) a request used, when several keys are configured: the auth layer puts it
/// in the request's extensions (a client cannot set it); as an extractor, `None` when it did not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestTenant(pub Option<u32>);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for RequestTenant {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(parts
            .extensions
            .get::<RequestTenant>()
            .copied()
            .unwrap_or(RequestTenant(None)))
    }
}
