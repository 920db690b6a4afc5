//! Tests of `kv_manager.rs`.

use super::*;

#[test]
fn prefix_hits_then_cow_on_fork() {
    let mut m = KvManager::new(BlockPool::new(8), 4, true);
    let toks: Vec<u32> = (0..10).collect();
    let mut a = m.match_prefix(&toks, 2, Salts::one(""), true);
    assert!(a.is_empty());
    let mut copies = vec![];
    assert!(m.reserve(&mut a, 0, 10, &mut copies));
    assert_eq!(a.len(), 3);
    m.commit(&mut a, &toks, 10, "", false);
    // a second sequence with the same 8-token prefix hits two blocks
    let mut b = m.match_prefix(&toks, 2, Salts::one(""), true);
    assert_eq!(b.live(), &a.live()[..2]);
    assert_eq!(m.stats(), PrefixStats { queries: 20, hits: 8 });
    // fork a, then writing at position 10 (partial block 2) copies it
    let mut c = m.fork(&a);
    assert_eq!(m.blocks_needed(&c, 10, 11), 1);
    assert!(m.reserve(&mut c, 10, 11, &mut copies));
    assert_eq!(copies.len(), 1);
    assert_eq!(copies[0].src, u32::from(a.live()[2]));
    assert_ne!(c.live()[2], a.live()[2]);
    // the original is now the only owner: no copy
    assert!(m.reserve(&mut a, 10, 11, &mut copies));
    assert_eq!(copies.len(), 1);
    for sb in [&mut a, &mut b, &mut c] {
        m.release(sb);
    }
    let counts = m.pool().counts();
    assert_eq!(counts.used, 0);
    assert_eq!(counts.cached_free, 2);
    m.pool().check_invariants();
}

#[test]
fn fast_sequences_read_exact_blocks_and_exact_ones_never_read_fast_ones() {
    let mut m = KvManager::new(BlockPool::new(32), 4, true);
    let fast = Salts {
        own: "\u{1}f\u{1}",
        exact: Some(""),
    };
    let run = |m: &mut KvManager, toks: &[u32], salts: Salts| {
        let mut sb = m.match_prefix(toks, usize::MAX, salts, false);
        let hit = sb.len() * 4;
        assert!(m.reserve(&mut sb, hit, toks.len(), &mut vec![]));
        m.commit(&mut sb, toks, toks.len(), salts.own, false);
        (sb, hit)
    };
    let t: Vec<u32> = (0..12).collect();
    let tu: Vec<u32> = (0..20).collect();
    // an exact sequence (a decision's state) computes three blocks
    let (mut a, _) = run(&mut m, &t, Salts::one(""));
    // a fast one over the same state reads them, then registers its own two
    let (mut b, hit) = run(&mut m, &tu, fast);
    assert_eq!(hit, 12);
    assert_eq!(&b.live()[..3], a.live());
    // an exact read of the longer prompt finds the exact three only
    let probe = |m: &KvManager, toks: &[u32], salts| m.probe_prefix(toks, usize::MAX, salts).0;
    assert_eq!(probe(&m, &tu, Salts::one("")), a.live());
    // a fast read finds all five; a fast sequence alone (no exact key) finds none
    assert_eq!(probe(&m, &tu, fast), b.live());
    assert!(probe(&m, &tu, Salts::one(fast.own)).is_empty());
    // a fast chain longer than the exact one wins over the greedy walk
    let v: Vec<u32> = (100..116).collect();
    let (mut c, _) = run(&mut m, &v, fast);
    let (mut d, _) = run(&mut m, &v[..8], Salts::one(""));
    assert_eq!(probe(&m, &v, Salts::one("")), d.live());
    assert_eq!(probe(&m, &v, fast), c.live());
    let e = m.match_prefix(&v, usize::MAX, fast, true);
    assert_eq!(e.live(), c.live());
    for sb in [&mut a, &mut b, &mut c, &mut d] {
        m.release(sb);
    }
    let mut e = e;
    m.release(&mut e);
    assert_eq!(m.pool().counts().used, 0);
    m.pool().check_invariants();
}

#[test]
fn slid_blocks_are_given_back_and_stay_matchable() {
    let mut m = KvManager::new(BlockPool::new(8), 4, true);
    let toks: Vec<u32> = (0..20).collect();
    let mut a = SeqBlocks::default();
    assert!(m.reserve(&mut a, 0, 20, &mut vec![]));
    // not registered yet: nothing is given back while prefix caching is on
    assert_eq!(m.release_slid(&mut a, 20, 6), 0);
    m.commit(&mut a, &toks, 20, "", false);
    // the next query (position 20) reads 15..=20: blocks 0..3 (tokens 0..12) are done
    assert_eq!(m.release_slid(&mut a, 20, 6), 3);
    assert_eq!((a.len(), a.released(), a.live().len()), (5, 3, 2));
    assert_eq!(a.get(2), None);
    assert!(a.get(3).is_some());
    assert_eq!(a.table()[..3], [None, None, None]);
    assert_eq!(m.release_slid(&mut a, 20, 6), 0, "idempotent");
    assert_eq!(m.pool().counts().used, 2);
    // the given-back blocks are still in the prefix cache: the whole prefix matches
    let mut b = m.match_prefix(&toks, 5, Salts::one(""), true);
    assert_eq!(b.len(), 5);
    m.release(&mut b);
    m.release(&mut a);
    assert_eq!(m.pool().counts().used, 0);
    m.pool().check_invariants();
    // without prefix caching blocks go back as soon as they slide out
    let mut m = KvManager::new(BlockPool::new(8), 4, false);
    let mut c = SeqBlocks::default();
    assert!(m.reserve(&mut c, 0, 20, &mut vec![]));
    assert_eq!(m.release_slid(&mut c, 19, 1), 4, "position 19 is still read");
    assert_eq!(m.pool().counts().used, 1);
    assert_eq!(m.release_slid(&mut c, 20, 1), 1);
    assert_eq!(m.pool().counts().used, 0);
}

#[test]
fn reserve_is_all_or_nothing() {
    let mut m = KvManager::new(BlockPool::new(2), 4, true);
    let mut a = SeqBlocks::default();
    let mut copies = vec![];
    assert!(!m.reserve(&mut a, 0, 9, &mut copies));
    assert!(a.is_empty());
    assert_eq!(m.pool().num_free(), 2);
}
