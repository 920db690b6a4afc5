//! The protocols: each is a parser from its wire to the shared pipeline and a `Shape` for its answers —
//! `completions`, `chat`, `responses` (with the `conversations` it keeps), `embeddings`, the render endpoints (`render`) and Jev's System One
//! wire (`systemone`) and OpenAI's Decisions API (`decisions`), both over `kvgate-decide`. No protocol imports another's handler.

pub(crate) mod chat;
pub(crate) mod completions;
pub(crate) mod conversations;
pub(crate) mod decisions;
pub(crate) mod embeddings;
pub(crate) mod render;
pub(crate) mod responses;
pub(crate) mod systemone;
