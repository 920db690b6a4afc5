//! Placeholder until the decision API lands.

use axum::response::Response;

use crate::error::ApiError;

/// The handler.
pub async fn systemone() -> Result<Response, ApiError> {
    Err(ApiError::NotFound("not yet".into()))
}
