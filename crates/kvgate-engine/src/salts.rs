//! The prefix-cache keys one sequence matches blocks under ([`Salts`]): the one-way sharing between the
//! backend's exact path and its fast path. Pure data; the walks that use it are in
//! [`crate::kv_manager`].

/// The prefix-cache keys a sequence's blocks are matched under. Its own blocks are registered under
/// `own`. A sequence computed on the backend's fast path also reads blocks the exact path computed
/// (`exact`: a decision's state, for the follow-up completion), preferring them while they last and then
/// continuing on its own key; an exact sequence (`exact: None`) never reads fast-path blocks, so
/// decisions keep their exact, cache-independent results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Salts<'a> {
    /// The key its own blocks are registered under.
    pub own: &'a str,
    /// The exact path's key, read first, for a fast-path sequence.
    pub exact: Option<&'a str>,
}

impl<'a> Salts<'a> {
    /// One key, read and registered.
    #[cfg(test)]
    pub fn one(own: &'a str) -> Salts<'a> {
        Salts { own, exact: None }
    }

    /// The keys to try for the next block, each with whether it is the exact path's: the exact key
    /// first while the walk is still on exact blocks.
    pub(crate) fn candidates(self, exact: bool) -> impl Iterator<Item = (&'a str, bool)> {
        let first = self.exact.filter(|_| exact).map(|e| (e, true));
        first.into_iter().chain(std::iter::once((self.own, false)))
    }
}
