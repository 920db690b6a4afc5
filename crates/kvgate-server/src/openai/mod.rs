//! The OpenAI wire types: [`request`] (what clients send, checked against each endpoint's exact
//! field set and deserialised into typed fields) and [`response`] (what kvgate answers, serialised
//! from structs).

pub mod request;
pub mod response;
