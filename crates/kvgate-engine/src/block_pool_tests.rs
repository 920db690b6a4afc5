//! Tests of `block_pool.rs`.

use super::*;

#[test]
fn allocate_free_lru_order() {
    let mut p = BlockPool::new(3);
    let a = p.allocate().unwrap();
    let b = p.allocate().unwrap();
    let c = p.allocate().unwrap();
    assert!(p.allocate().is_none());
    p.register(a, None, ChainKey::ROOT, &[1, 2], "");
    p.register(b, Some((a, 0)), ChainKey::ROOT, &[3, 4], "");
    p.decref(a); // cached → tail
    p.decref(c); // plain → head
    p.decref(b); // cached → tail
    p.check_invariants();
    assert_eq!(p.allocate(), Some(c), "plain blocks are reused first");
    assert_eq!(p.allocate(), Some(a), "then the least recently freed cached one");
    assert_eq!(p.evictions(), 1);
    assert_eq!(p.lookup(None, &[1, 2], ""), None);
    // b's parent (a, gen 0) is gone: a's next life has generation 1
    assert_eq!(p.block_ref(a), None);
    assert_eq!(p.lookup(Some((a, 0)), &[3, 4], ""), Some(b));
    p.register(a, None, ChainKey::ROOT, &[9, 9], "");
    assert_eq!(p.block_ref(a), Some((a, 1)));
    assert_eq!(
        p.lookup(Some((a, 1)), &[3, 4], ""),
        None,
        "stale child never matches the new parent"
    );
    p.check_invariants();
}

#[test]
fn hit_on_free_block_takes_it_out_of_the_free_list() {
    let mut p = BlockPool::new(2);
    let a = p.allocate().unwrap();
    p.register(a, None, ChainKey::ROOT, &[5], "salt");
    p.decref(a);
    assert_eq!(p.num_free(), 2);
    assert_eq!(p.lookup(None, &[5], ""), None, "extra key must match");
    let hit = p.lookup(None, &[5], "salt").unwrap();
    p.incref(hit);
    assert_eq!(p.num_free(), 1);
    assert_eq!(p.ref_count(hit), 1);
    p.check_invariants();
}

#[test]
fn forced_collisions_are_never_hits() {
    fn constant(_: Option<BlockRef>, _: &[u32], _: &str) -> u64 {
        7
    }
    let mut p = BlockPool::with_hasher(4, constant);
    let a = p.allocate().unwrap();
    let b = p.allocate().unwrap();
    p.register(a, None, ChainKey::ROOT, &[1, 2, 3], "");
    p.register(b, None, ChainKey::ROOT, &[1, 2, 4], "");
    assert_eq!(p.lookup(None, &[1, 2, 3], ""), Some(a));
    assert_eq!(p.lookup(None, &[1, 2, 4], ""), Some(b));
    assert_eq!(p.lookup(None, &[1, 2, 5], ""), None);
    assert_eq!(p.lookup(Some((a, 0)), &[1, 2, 3], ""), None);
    p.check_invariants();
}

#[test]
fn duplicate_registration_returns_the_existing_block() {
    let mut p = BlockPool::new(2);
    let a = p.allocate().unwrap();
    let b = p.allocate().unwrap();
    assert_eq!(p.register(a, None, ChainKey::ROOT, &[1], ""), a);
    assert_eq!(p.register(b, None, ChainKey::ROOT, &[1], ""), a);
    assert_eq!(p.block_ref(b), None);
}
