//! The decode floor: under a flood of prompts, running streams keep a share of the engine's time.
//! Every step decodes first and fills the rest of its token budget with prefill chunks; a step with a
//! long prefill delays every stream by its whole duration. So each such step (one that ran prefill
//! while streams were decoding) puts its duration, scaled by `share / (1 − share)`, on a debt, and the
//! engine runs decode-only steps while the debt lasts: at least `share` of the time under contention
//! goes to decode-only steps. A prefill with no stream waiting runs up no debt; the debt is capped so
//! prompts are never held back for long. Next to streams a step also holds fewer tokens (an eighth of
//! the budget, `config::prefill_cap`), so streams advance every short step rather than after a long one.

use std::time::Duration;

/// Most time decode-only steps may hold prompts back at once.
const MAX_DEBT: Duration = Duration::from_secs(5);

/// The decode floor's state.
#[derive(Debug, Clone)]
pub(crate) struct DecodeFloor {
    share: f64,
    debt: Duration,
}

impl DecodeFloor {
    /// A floor giving decode-only steps `share` (0 off, below 1) of the time under contention.
    pub(crate) fn new(share: f64) -> DecodeFloor {
        DecodeFloor {
            share: share.clamp(0.0, 0.95),
            debt: Duration::ZERO,
        }
    }

    /// Whether the next step should run decode rows only.
    pub(crate) fn decode_only(&self) -> bool {
        self.share > 0.0 && !self.debt.is_zero()
    }

    /// Accounts a step that ran `prefill_rows` prompt rows and `decode_rows` decode rows in `took`.
    pub(crate) fn record(&mut self, prefill_rows: usize, decode_rows: usize, took: Duration) {
        if prefill_rows == 0 {
            self.debt = self.debt.saturating_sub(took);
        } else if decode_rows > 0 && self.share > 0.0 {
            let owed = took.mul_f64(self.share / (1.0 - self.share));
            self.debt = (self.debt + owed).min(MAX_DEBT);
        }
    }

    /// Forgets the debt (nothing is decoding any more).
    pub(crate) fn clear(&mut self) {
        self.debt = Duration::ZERO;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefill_next_to_streams_buys_them_as_much_decode_time() {
        let ms = Duration::from_millis;
        let mut f = DecodeFloor::new(0.5);
        assert!(!f.decode_only());
        f.record(100, 0, ms(400)); // nobody was decoding: no debt
        assert!(!f.decode_only());
        f.record(100, 4, ms(400)); // 4 streams waited 400 ms
        assert!(f.decode_only());
        f.record(0, 4, ms(300));
        assert!(f.decode_only());
        f.record(0, 4, ms(100));
        assert!(!f.decode_only(), "paid back");
        // a long prefill is paid back for at most MAX_DEBT
        f.record(2_000, 4, Duration::from_secs(60));
        f.record(0, 4, MAX_DEBT);
        assert!(!f.decode_only());
        // a share of 0.75 buys three times the prefill's duration; 0 buys nothing
        let mut f = DecodeFloor::new(0.75);
        f.record(10, 1, ms(100));
        f.record(0, 1, ms(290));
        assert!(f.decode_only());
        f.record(0, 1, ms(10));
        assert!(!f.decode_only());
        let mut off = DecodeFloor::new(0.0);
        off.record(10, 1, ms(100));
        assert!(!off.decode_only());
        f.record(10, 1, ms(100));
        f.clear();
        assert!(!f.decode_only());
    }
}
