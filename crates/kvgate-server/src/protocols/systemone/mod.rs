//! `POST /v1/systemone`: the Jev wire of System One decisions. The decision policy lives below HTTP
//! in `kvgate-decide`; this module parses the wire into a typed spec ([`wire`]), calls the service and
//! renders its typed answers ([`route`]).

pub mod route;
pub mod wire;
