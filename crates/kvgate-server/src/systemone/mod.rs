//! `POST /v1/systemone`: System One decisions (noul / choice / score questions over a state),
//! evaluated in the engine on warm KV blocks: no decode loop, no second prefill.

pub mod answer;
pub mod labels;
pub mod orders;
pub mod priors;
pub mod reads;
pub mod render;
pub mod route;
pub mod temperature;
pub mod trie;
pub mod wire;
