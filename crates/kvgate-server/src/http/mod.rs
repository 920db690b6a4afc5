//! The HTTP core, the ground of the server's layers (it imports no protocol, no pipeline, no startup):
//! middleware (auth and the request's tenant, CORS, limits, decompression, panics), the one place errors
//! become HTTP responses (`error`), reading a JSON body (`body`), the handlers' settings (`settings`),
//! the shared state handlers read (`state`), the small routes that read only that state (`routes`) and
//! the `vllm:` metric names (`vllm_metrics`). The router is the startup layer's (`startup::router`).

pub(crate) mod body;
pub(crate) mod error;
pub(crate) mod middleware;
pub(crate) mod routes;
pub(crate) mod settings;
pub(crate) mod state;
pub(crate) mod vllm_metrics;
