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

/// The key a fast-path sequence's own blocks are registered under: the backend's fast path named
/// apart from every exact key, then the tenant's salt (`""` for none).
pub(crate) fn fast_key(path: &str, tenant: &str) -> String {
    format!("\u{1}{path}\u{1}{tenant}")
}

/// The tenant's salt inside a block's key (exact or fast path): `""` when the block is shared by all.
pub(crate) fn tenant_of(key: &str) -> &str {
    match key.strip_prefix('\u{1}') {
        Some(rest) => rest.split_once('\u{1}').map_or("", |(_, tenant)| tenant),
        None => key,
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tenant_is_read_back_from_either_key() {
        assert_eq!(tenant_of(""), "");
        assert_eq!(tenant_of("acme"), "acme");
        assert_eq!(tenant_of(&fast_key("int8", "")), "");
        assert_eq!(tenant_of(&fast_key("int8", "acme")), "acme");
    }
}
