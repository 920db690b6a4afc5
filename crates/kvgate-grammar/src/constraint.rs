//! An llguidance [`Matcher`] as the engine's [`TokenConstraint`]: one per choice, started from a
//! parser compiled once per request (each start is a deep clone, so choices never share state).

use std::sync::Mutex;

use kvgate_engine::{ConstraintFactory, TokenConstraint, TokenMask};
use llguidance::Matcher;

/// One choice's grammar state.
pub(crate) struct LlgConstraint {
    m: Matcher,
}

impl TokenConstraint for LlgConstraint {
    fn mask(&mut self) -> Result<TokenMask, String> {
        let v = self.m.compute_mask_or_eos().map_err(|e| e.to_string())?;
        Ok(TokenMask::from_words(v.as_slice().to_vec()))
    }

    fn commit(&mut self, token: u32, fast_forward: bool) -> Result<Vec<u32>, String> {
        if self.m.is_stopped() {
            // Only EOS was allowed; nothing more to follow.
            return Ok(vec![]);
        }
        self.m.consume_token(token).map_err(|e| e.to_string())?;
        if !fast_forward || self.m.is_stopped() {
            return Ok(vec![]);
        }
        Ok(self.m.consume_ff_tokens())
    }

    fn is_stopped(&self) -> bool {
        self.m.is_stopped()
    }

    fn fork(&self) -> Box<dyn TokenConstraint> {
        Box::new(LlgConstraint { m: self.m.deep_clone() })
    }
}

/// A compiled grammar: each choice starts from a deep clone of the prototype.
pub(crate) struct LlgFactory {
    pub(crate) proto: Mutex<Matcher>,
    pub(crate) what: String,
}

impl ConstraintFactory for LlgFactory {
    fn start(&self) -> Box<dyn TokenConstraint> {
        let m = match self.proto.lock() {
            Ok(p) => p.deep_clone(),
            Err(poisoned) => poisoned.into_inner().deep_clone(),
        };
        Box::new(LlgConstraint { m })
    }

    fn describe(&self) -> String {
        self.what.clone()
    }
}
