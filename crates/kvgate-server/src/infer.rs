//! The seam between HTTP and the engine is the engine's own [`Inference`] trait (the decision service
//! below HTTP talks to it too); re-exported here for the HTTP layer and its tests.

pub use kvgate_engine::Inference;
