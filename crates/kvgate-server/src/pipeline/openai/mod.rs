//! The OpenAI wire types: [`request`] (what clients send, checked against each endpoint's exact
//! field set and deserialised into typed fields) and [`response`] (what kvgate answers, serialised
//! from structs), and [`respond`], the one pipeline from engine events to either (a protocol is a
//! [`respond::Shape`]); [`surface`], vLLM's and SGLang's extra fields,
//! accepted only at their no-op values.

pub mod request;
pub mod respond;
pub mod response;
pub mod surface;
