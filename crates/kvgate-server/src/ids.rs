//! Ids and the clock, a leaf every layer may read: unix seconds, request ids (`chatcmpl-…`,
//! `req-…`) and the Responses API's item ids (`resp_…`, `msg_…`, `fc_…`). Ids are unique within a
//! process (a counter) and unpredictable enough not to collide across replicas (time and pid mixed).

/// Unix seconds now.
pub fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// An id as OpenAI writes the Responses API's (`resp_…`, `msg_…`, `fc_…`, `call_…`): the prefix joined by
/// an underscore.
pub fn item_id(prefix: &str) -> String {
    let id = request_id(prefix);
    format!("{prefix}_{}", &id[prefix.len() + 1..])
}

/// A random-looking request id with a prefix.
pub fn request_id(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mut x = t ^ (n.wrapping_mul(0x9E37_79B9_7F4A_7C15)) ^ (std::process::id() as u64) << 32;
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    format!("{prefix}-{x:016x}{n:04x}")
}
