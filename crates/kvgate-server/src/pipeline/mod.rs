//! The one request path every protocol shares: conversations read and rendered (`conversation`),
//! sampling, structured outputs, tools and reasoning read into one typed `generation::Generation` and
//! submitted once (`generation::submit`); the engine's events turned into a protocol's answers by its
//! `Shape` (`openai::respond`, `events`); the decision wires' common middle (`decision`) and the
//! render endpoints' answer (`render`). A protocol's stored objects live in a `bounded` map per API
//! key, owned by that protocol.

pub(crate) mod bounded;
pub(crate) mod cache;
pub(crate) mod conversation;
pub(crate) mod decision;
pub(crate) mod events;
pub(crate) mod generation;
pub(crate) mod openai;
pub(crate) mod reasoning;
pub(crate) mod render;
pub(crate) mod sampling;
pub(crate) mod structured;
pub(crate) mod tools;
