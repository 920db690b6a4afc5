//! A bounded in-memory map of stored objects (conversations, compactions), each owned by one API
//! key: at most `max_entries` objects and `max_bytes` bytes (each object's size as its owner says),
//! least recently used out first when either bound is reached; 0 entries turns it off. Another key's
//! lookups find nothing (a 404 at the edge), never another tenant's object.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

struct Entry<V> {
    tenant: Option<u32>,
    value: V,
    bytes: usize,
    tick: u64,
}

struct Inner<V> {
    map: HashMap<String, Entry<V>>,
    lru: BTreeMap<u64, String>,
    tick: u64,
    bytes: usize,
}

/// The map.
pub struct Bounded<V> {
    max_entries: usize,
    max_bytes: usize,
    size: fn(&V) -> usize,
    inner: Mutex<Inner<V>>,
}

impl<V: Clone> Bounded<V> {
    /// A map of at most `max_entries` objects and `max_bytes` bytes, `size` measuring each.
    pub fn new(max_entries: usize, max_bytes: usize, size: fn(&V) -> usize) -> Bounded<V> {
        Bounded {
            max_entries,
            max_bytes,
            size,
            inner: Mutex::new(Inner {
                map: HashMap::new(),
                lru: BTreeMap::new(),
                tick: 0,
                bytes: 0,
            }),
        }
    }

    /// Whether storing is on.
    pub fn enabled(&self) -> bool {
        self.max_entries > 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<V>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps `value` as `id` of `tenant` (replacing one of the same id); false when it alone is over
    /// the byte bound or storing is off. Older objects go, least recently used first, to make room.
    pub fn put(&self, tenant: Option<u32>, id: &str, value: V) -> bool {
        let bytes = (self.size)(&value);
        if !self.enabled() || bytes > self.max_bytes {
            return false;
        }
        let mut g = self.lock();
        if let Some(old) = g.map.remove(id) {
            g.lru.remove(&old.tick);
            g.bytes -= old.bytes;
        }
        g.tick += 1;
        let tick = g.tick;
        g.bytes += bytes;
        g.lru.insert(tick, id.to_string());
        g.map.insert(
            id.to_string(),
            Entry {
                tenant,
                value,
                bytes,
                tick,
            },
        );
        self.evict(&mut g);
        g.map.contains_key(id)
    }

    /// Drops the least recently used objects until both bounds hold.
    fn evict(&self, g: &mut Inner<V>) {
        while g.map.len() > self.max_entries || g.bytes > self.max_bytes {
            let Some((_, old)) = g.lru.pop_first() else { break };
            if let Some(e) = g.map.remove(&old) {
                g.bytes -= e.bytes;
            }
        }
    }

    /// Object `id` of `tenant` (now the most recently used).
    pub fn get(&self, tenant: Option<u32>, id: &str) -> Option<V> {
        self.read(tenant, id, V::clone)
    }

    /// Reads object `id` of `tenant` with `f` (now the most recently used; not re-measured).
    pub fn read<R>(&self, tenant: Option<u32>, id: &str, f: impl FnOnce(&V) -> R) -> Option<R> {
        let mut g = self.lock();
        let g = &mut *g;
        let e = g.map.get_mut(id).filter(|e| e.tenant == tenant)?;
        let r = f(&e.value);
        g.lru.remove(&e.tick);
        g.tick += 1;
        e.tick = g.tick;
        g.lru.insert(g.tick, id.to_string());
        Some(r)
    }

    /// Runs `f` on object `id` of `tenant` (now the most recently used) and re-measures it; `None`
    /// when there is none. An object grown past the byte bound is dropped after `f`.
    pub fn update<R>(&self, tenant: Option<u32>, id: &str, f: impl FnOnce(&mut V) -> R) -> Option<R> {
        let mut g = self.lock();
        let g = &mut *g;
        let e = g.map.get_mut(id).filter(|e| e.tenant == tenant)?;
        let r = f(&mut e.value);
        let bytes = (self.size)(&e.value);
        let old = e.tick;
        g.tick += 1;
        e.tick = g.tick;
        g.bytes = g.bytes - e.bytes + bytes;
        e.bytes = bytes;
        g.lru.remove(&old);
        g.lru.insert(g.tick, id.to_string());
        self.evict(g);
        Some(r)
    }

    /// Deletes object `id` of `tenant`; false when there is none.
    pub fn delete(&self, tenant: Option<u32>, id: &str) -> bool {
        let mut g = self.lock();
        if g.map.get(id).is_none_or(|e| e.tenant != tenant) {
            return false;
        }
        if let Some(e) = g.map.remove(id) {
            g.lru.remove(&e.tick);
            g.bytes -= e.bytes;
        }
        true
    }

    /// How many objects are stored, and their bytes.
    #[cfg(test)]
    pub fn len(&self) -> (usize, usize) {
        let g = self.lock();
        (g.map.len(), g.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(entries: usize, bytes: usize) -> Bounded<String> {
        Bounded::new(entries, bytes, |s: &String| s.len())
    }

    #[test]
    fn keys_see_only_their_own_objects() {
        let s = store(4, 100);
        assert!(s.put(Some(1), "a", "one".into()));
        assert_eq!(s.get(Some(1), "a").as_deref(), Some("one"));
        assert_eq!(s.get(Some(2), "a"), None);
        assert_eq!(s.get(None, "a"), None);
        assert!(!s.delete(Some(2), "a"));
        assert!(s.delete(Some(1), "a"));
        assert_eq!(s.len(), (0, 0));
    }

    #[test]
    fn the_least_recently_used_goes_first_under_either_bound() {
        let s = store(2, 10);
        s.put(None, "a", "aaa".into());
        s.put(None, "b", "bbb".into());
        s.get(None, "a");
        s.put(None, "c", "ccc".into());
        assert_eq!(s.get(None, "b"), None, "b was the least recently used");
        assert!(s.get(None, "a").is_some() && s.get(None, "c").is_some());
        // growing past the byte bound pushes the others out
        s.update(None, "c", |v| v.push_str("cccccc"));
        assert_eq!(s.len(), (1, 9));
        assert!(!s.put(None, "big", "x".repeat(11)), "over the byte bound alone");
        assert!(!store(0, 10).put(None, "a", "a".into()), "0 entries: off");
    }

    /// Seeded random puts, updates and deletes: the byte count always equals the sum of the
    /// objects' sizes and both bounds hold.
    #[test]
    fn random_operations_keep_the_accounting_exact() {
        let s = store(8, 64);
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..5000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let id = format!("k{}", x % 12);
            let t = Some((x >> 8) as u32 % 2);
            match (x >> 16) % 4 {
                0 | 1 => {
                    s.put(t, &id, "y".repeat((x >> 24) as usize % 20));
                }
                2 => {
                    s.update(t, &id, |v| v.push('z'));
                }
                _ => {
                    s.delete(t, &id);
                }
            }
            let g = s.lock();
            let sum: usize = g.map.values().map(|e| e.value.len()).sum();
            assert_eq!(g.bytes, sum);
            assert!(g.map.len() <= 8 && g.bytes <= 64 && g.lru.len() == g.map.len());
        }
    }
}
