//! The protocols: each is a parser from its wire to the shared pipeline and a `Shape` for its answers,
//! with its own wire types and its own state — `completions` and `chat` (each with its render route),
//! `responses` (with the `conversations` it keeps and its stores), `embeddings`, vLLM's tokenizer
//! routes (`tokenize`), Jev's System One wire (`systemone`) and OpenAI's Decisions API (`decisions`),
//! both over `kvgate-decide`. No protocol imports another.

pub(crate) mod chat;
pub(crate) mod completions;
pub(crate) mod decisions;
pub(crate) mod embeddings;
pub(crate) mod responses;
pub(crate) mod systemone;
pub(crate) mod tokenize;
