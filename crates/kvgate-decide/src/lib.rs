//! kvgate's System One decision service, below HTTP: a typed [`DecisionSpec`] (state, noul / choice /
//! score questions, read method) in, typed [`Decision`] answers out. Every read is a one-step read of
//! next-token label probabilities over KV blocks the engine keeps warm: the state is computed once
//! (or found in the prefix cache), one forked read per question and option order, nothing sampled.
//!
//! The rooms: [`spec`] (what to decide), [`service`] (the entry point), `reads` (plan, run and combine
//! the reads), [`orders`] (option orders and the read method), [`labels`] and [`trie`] (label tokens),
//! [`priors`] (content-free calibration, cached per question shape), [`temperature`], [`render`] (the
//! text of a read), [`answer`] (Jev's formulas and the answer shapes), [`error`].

pub mod answer;
pub mod error;
pub mod labels;
pub mod orders;
pub mod priors;
mod reads;
pub mod render;
pub mod service;
pub mod set;
pub mod spec;
pub mod temperature;
pub mod trie;

pub use answer::Answer;
pub use error::DecideError;
pub use service::{Decision, DecisionService, Diagnostics, QuestionAnswer};
pub use spec::{Content, DecisionSpec, Question, State};
pub use temperature::DecisionTemperature;
