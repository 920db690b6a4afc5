//! The Responses API on the wire (`POST /v1/responses`, as OpenAI, the Open Responses spec and vLLM
//! define it): the request body and its input items ([`request`]), the `response` object and its
//! output items ([`object`]), and the typed stream events ([`events`]). Only the shapes live here; what
//! they mean is in [`super::input`] and [`super::shape`].

mod events;
mod object;
mod request;

pub use events::*;
pub use object::*;
pub use request::*;

#[cfg(test)]
mod tests;
