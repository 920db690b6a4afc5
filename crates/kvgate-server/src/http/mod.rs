//! HTTP plumbing: the router (`app`), middleware (auth, CORS, limits, decompression, panics), the one
//! place errors become HTTP responses (`error`), the shared state handlers read (`state`), the small
//! routes (`routes`) and the `vllm:` metric names (`vllm_metrics`).

pub(crate) mod app;
pub(crate) mod error;
pub(crate) mod middleware;
pub(crate) mod routes;
pub(crate) mod state;
pub(crate) mod vllm_metrics;
