//! Content keys of full blocks that outlive the hot pool: a 128-bit chain hash over the parent's key,
//! the block's tokens and the extra key (`cache_salt`, the fast path), so a key names the whole prefix
//! up to and including its block and is the same in every process (xxh3-128, fixed seed) — what a
//! spill file written by an earlier run is looked up by. A hit is never taken on the key alone: every
//! record also keeps its parent's key and its own tokens, which are compared.

use xxhash_rust::xxh3::Xxh3;

/// The chain key of a full block (or [`ChainKey::ROOT`], the parent of a sequence's first block).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ChainKey(pub u128);

impl ChainKey {
    /// The parent of every first block.
    pub const ROOT: ChainKey = ChainKey(0);

    /// The key of the block holding `tokens` after the block keyed `self`, under `extra`.
    pub fn child(self, tokens: &[u32], extra: &str) -> ChainKey {
        let mut h = Xxh3::new();
        h.update(&self.0.to_le_bytes());
        h.update(&(tokens.len() as u64).to_le_bytes());
        for t in tokens {
            h.update(&t.to_le_bytes());
        }
        h.update(extra.as_bytes());
        ChainKey(h.digest128())
    }
}

/// What identifies one block's content in a tier: its key, its parent's key, its tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockMeta {
    /// The block's chain key.
    pub key: ChainKey,
    /// Its parent's chain key.
    pub parent: ChainKey,
    /// Its tokens.
    pub tokens: Box<[u32]>,
    /// How KV events named it, when they did (`None`: not published — events off, a tenant's salt).
    pub published: Option<Published>,
}

/// A block's published hashes ([`crate::kv_events`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published {
    /// Its hash.
    pub hash: u64,
    /// Its parent's (`None`: a sequence's first block).
    pub parent: Option<u64>,
}

impl BlockMeta {
    /// Whether this record is the block `key` asked for with this parent and these tokens.
    pub fn is(&self, key: ChainKey, parent: ChainKey, tokens: &[u32]) -> bool {
        self.key == key && self.parent == parent && *self.tokens == *tokens
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_chain_and_separate() {
        let a = ChainKey::ROOT.child(&[1, 2, 3], "");
        assert_eq!(a, ChainKey::ROOT.child(&[1, 2, 3], ""), "deterministic");
        assert_ne!(a, ChainKey::ROOT.child(&[1, 2, 3], "salt"));
        assert_ne!(a, ChainKey::ROOT.child(&[1, 2, 4], ""));
        let b = a.child(&[4, 5, 6], "");
        assert_ne!(b, ChainKey::ROOT.child(&[4, 5, 6], ""), "the parent is in the key");
        assert_ne!(a, ChainKey::ROOT);
    }
}
