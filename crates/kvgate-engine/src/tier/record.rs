//! A block as the shared tier stores it: a self-describing record — magic, version, the cache's
//! fingerprint (model weights, KV dtype, method, block size, scales), the block's chain key, its
//! parent's key and its tokens, the payload's length, the payload (the hot cache's own bytes), and an
//! xxh3-64 checksum over everything before it — under a key that names the fingerprint and the chain
//! key ([`redis_key`]).
//!
//! [`decode`] takes a record back only when every part is what the reader asked for: a torn, foreign
//! (another model, layout or dtype), mislabelled or corrupted record is refused with the reason, and
//! its block is recomputed; nothing else is ever attended to.

use xxhash_rust::xxh3::xxh3_64;

use super::key::{BlockMeta, ChainKey};

const MAGIC: &[u8; 4] = b"KVGS";
const VERSION: u32 = 1;

/// The store key of block `key` of a cache with `fingerprint`: replicas of one model and cache layout
/// share it, anything else never meets it. The chain key already holds the salt (cache salt, API
/// key's tenant, the fast path), so another tenant's blocks have other keys.
pub(crate) fn redis_key(fingerprint: u64, key: ChainKey) -> String {
    format!("kvgate:kv:{fingerprint:016x}:{:032x}", key.0)
}

/// The record of block `meta` with payload `bytes` (see the module doc).
pub(crate) fn encode(fingerprint: u64, meta: &BlockMeta, bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + 4 * meta.tokens.len() + bytes.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&fingerprint.to_le_bytes());
    out.extend_from_slice(&meta.key.0.to_le_bytes());
    out.extend_from_slice(&meta.parent.0.to_le_bytes());
    out.extend_from_slice(&(meta.tokens.len() as u32).to_le_bytes());
    for t in meta.tokens.iter() {
        out.extend_from_slice(&t.to_le_bytes());
    }
    out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
    out.extend_from_slice(bytes);
    let sum = xxh3_64(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

/// Why a record was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Too short, a wrong magic or version, or lengths that do not add up.
    Torn,
    /// The checksum does not match.
    Checksum,
    /// Another cache's (model, dtype, layout or scales).
    Foreign,
    /// Another block's key, parent or tokens.
    Mislabelled,
    /// A payload of another size than this cache's blocks.
    Length,
}

/// Reads a little-endian number of `N` bytes at `*at`, advancing it.
fn take<const N: usize>(b: &[u8], at: &mut usize) -> Option<[u8; N]> {
    let s = b.get(*at..*at + N)?;
    *at += N;
    s.try_into().ok()
}

/// The payload of `record` when it is block `want` of a cache with `fingerprint` and
/// `block_bytes`-byte blocks, whole and unaltered.
pub(crate) fn decode(
    record: &[u8],
    fingerprint: u64,
    want: &BlockMeta,
    block_bytes: usize,
) -> Result<Vec<u8>, Refused> {
    let body_len = record.len().checked_sub(8).ok_or(Refused::Torn)?;
    let (body, sum) = record.split_at(body_len);
    let mut at = 0;
    if take::<4>(body, &mut at).as_ref() != Some(MAGIC)
        || take::<4>(body, &mut at).map(u32::from_le_bytes) != Some(VERSION)
    {
        return Err(Refused::Torn);
    }
    if u64::from_le_bytes(sum.try_into().map_err(|_| Refused::Torn)?) != xxh3_64(body) {
        return Err(Refused::Checksum);
    }
    let fp = take::<8>(body, &mut at).map(u64::from_le_bytes).ok_or(Refused::Torn)?;
    if fp != fingerprint {
        return Err(Refused::Foreign);
    }
    let key = take::<16>(body, &mut at)
        .map(u128::from_le_bytes)
        .ok_or(Refused::Torn)?;
    let parent = take::<16>(body, &mut at)
        .map(u128::from_le_bytes)
        .ok_or(Refused::Torn)?;
    let n = take::<4>(body, &mut at).map(u32::from_le_bytes).ok_or(Refused::Torn)? as usize;
    let mut tokens = Vec::with_capacity(n.min(1 << 16));
    for _ in 0..n {
        tokens.push(take::<4>(body, &mut at).map(u32::from_le_bytes).ok_or(Refused::Torn)?);
    }
    if !want.is(ChainKey(key), ChainKey(parent), &tokens) {
        return Err(Refused::Mislabelled);
    }
    let len = take::<8>(body, &mut at).map(u64::from_le_bytes).ok_or(Refused::Torn)? as usize;
    if body.len() != at + len {
        return Err(Refused::Torn);
    }
    if len != block_bytes {
        return Err(Refused::Length);
    }
    Ok(body[at..].to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(tokens: &[u32]) -> BlockMeta {
        let parent = ChainKey::ROOT.child(&[9, 9], "");
        BlockMeta {
            key: parent.child(tokens, "salt"),
            parent,
            tokens: tokens.into(),
            published: None,
        }
    }

    #[test]
    fn a_record_comes_back_only_as_the_block_it_is() {
        let m = meta(&[1, 2, 3, 4]);
        let payload: Vec<u8> = (0..64u8).collect();
        let r = encode(7, &m, &payload);
        assert_eq!(decode(&r, 7, &m, 64), Ok(payload.clone()));
        // another cache, another block, another size
        assert_eq!(decode(&r, 8, &m, 64), Err(Refused::Foreign));
        assert_eq!(decode(&r, 7, &meta(&[1, 2, 3, 5]), 64), Err(Refused::Mislabelled));
        assert_eq!(decode(&r, 7, &m, 32), Err(Refused::Length));
        // every truncation is torn, every flipped byte is caught
        for cut in 0..r.len() {
            assert!(decode(&r[..cut], 7, &m, 64).is_err(), "cut at {cut}");
        }
        for i in 0..r.len() {
            let mut bad = r.clone();
            bad[i] ^= 0x40;
            assert!(decode(&bad, 7, &m, 64).is_err(), "byte {i} flipped");
        }
        assert_eq!(decode(b"garbage that is not a record", 7, &m, 64), Err(Refused::Torn));
        assert_ne!(redis_key(7, m.key), redis_key(8, m.key));
    }
}
