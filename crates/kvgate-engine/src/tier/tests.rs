//! The tier's tests: seeded randomized invariants of the memory part and the spill file, reload after a
//! restart, and the crash-safety cases (torn record, flipped bit, another cache's file, a second process).

use std::collections::HashMap;
use std::path::PathBuf;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;

const BS: usize = 4;
const BYTES: usize = 40;

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kvgate-tier-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn record(i: u32) -> (BlockMeta, Vec<u8>) {
    let tokens: Vec<u32> = (0..BS as u32).map(|t| i * 10 + t).collect();
    let parent = ChainKey::ROOT.child(&[i], "");
    let key = parent.child(&tokens, "");
    let bytes = (0..BYTES).map(|b| (i as usize * 31 + b) as u8).collect();
    (
        BlockMeta {
            key,
            parent,
            tokens: tokens.into(),
            published: None,
        },
        bytes,
    )
}

fn fetch(t: &mut SecondTier, i: u32) -> Option<(Vec<u8>, Medium)> {
    let (m, _) = record(i);
    t.fetch(m.key, m.parent, &m.tokens).map(|(b, w)| (b.to_vec(), w))
}

#[test]
fn randomized_memory_and_disk_serve_exactly_what_was_stored() {
    for (seed, disk) in [(1u64, false), (2, true), (3, true)] {
        let dir = temp_dir(&format!("rand{seed}"));
        let cfg = TierConfig {
            memory_bytes: 5 * BYTES as u64,
            dir: disk.then(|| dir.clone()),
            disk_bytes: if disk { 8 * spill_slot() } else { 0 },
            shared: None,
        };
        let mut t = SecondTier::open(&cfg, BS, BYTES, 7).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut stored: HashMap<u32, Vec<u8>> = HashMap::new();
        for _ in 0..2000 {
            let i = rng.random_range(0..30u32);
            if rng.random_bool(0.5) {
                let (m, b) = record(i);
                stored.insert(i, b.clone());
                t.store(m, b);
            } else if let Some((got, _)) = fetch(&mut t, i) {
                assert_eq!(Some(&got), stored.get(&i), "record {i}");
            }
            if rng.random_bool(0.05) {
                t.flush();
            }
            t.check_invariants();
            let s = t.stats();
            assert!(s.memory_bytes <= cfg.memory_bytes);
            assert!(s.disk_blocks <= 8);
        }
        // the most recently stored record is always found
        let (m, b) = record(99);
        t.store(m, b.clone());
        assert_eq!(fetch(&mut t, 99).map(|x| x.0), Some(b));
        // a wrong parent or wrong tokens never match
        let (m, _) = record(99);
        assert!(t.fetch(m.key, ChainKey::ROOT, &m.tokens).is_none());
        assert!(t.fetch(m.key, m.parent, &[0, 0, 0, 0]).is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }
}

fn spill_slot() -> u64 {
    (48 + 8 + 4 * BS + BYTES + 8) as u64
}

fn disk_tier(dir: &std::path::Path, fingerprint: u64) -> SecondTier {
    let cfg = TierConfig {
        memory_bytes: 0,
        dir: Some(dir.to_path_buf()),
        disk_bytes: 16 * spill_slot(),
        shared: None,
    };
    SecondTier::open(&cfg, BS, BYTES, fingerprint).unwrap()
}

#[test]
fn spill_file_survives_a_restart_and_never_serves_a_bad_record() {
    let dir = temp_dir("restart");
    let mut t = disk_tier(&dir, 42);
    for i in 0..6 {
        let (m, b) = record(i);
        t.store(m, b);
    }
    t.flush();
    assert_eq!(t.stats().spill.written, 6);
    let path = t.spill_path().unwrap().to_path_buf();
    // a second process cannot use the same file while this one holds it
    let second = SecondTier::open(
        &TierConfig {
            memory_bytes: 0,
            dir: Some(dir.clone()),
            disk_bytes: 1 << 20,
            shared: None,
        },
        BS,
        BYTES,
        42,
    );
    assert!(second.is_err_and(|e| e.to_string().contains("in use")));
    drop(t);

    // flip a payload bit of record 1, tear record 5 (the file ends inside it)
    let mut raw = std::fs::read(&path).unwrap();
    let slot = spill_slot() as usize;
    let find = |raw: &[u8], i: u32| {
        let (m, _) = record(i);
        (0..raw.len() / slot)
            .find(|s| raw[s * slot + 16..s * slot + 32] == m.key.0.to_le_bytes())
            .unwrap()
    };
    let s1 = find(&raw, 1);
    raw[s1 * slot + slot - 20] ^= 0x10;
    let s5 = find(&raw, 5);
    let torn = s5 == raw.len() / slot - 1;
    if torn {
        raw.truncate(s5 * slot + slot - 9);
    }
    std::fs::write(&path, &raw).unwrap();

    let mut t = disk_tier(&dir, 42);
    let reloaded = t.stats().spill.reloaded;
    assert_eq!(reloaded, if torn { 5 } else { 6 });
    for i in [0, 2, 3, 4] {
        let (_, b) = record(i);
        assert_eq!(fetch(&mut t, i), Some((b, Medium::Disk)), "record {i} after restart");
    }
    assert_eq!(fetch(&mut t, 1), None, "a flipped bit is never served");
    assert!(t.stats().spill.rejected >= 1);
    assert_eq!(fetch(&mut t, 1), None, "and it is gone");
    if torn {
        assert_eq!(fetch(&mut t, 5), None, "a torn record is never served");
    }
    t.check_invariants();
    drop(t);

    // another model or dtype (another fingerprint): nothing is served, the file is reused
    let mut t = disk_tier(&dir, 43);
    assert_eq!(t.stats().spill.reloaded, 0);
    assert_eq!(fetch(&mut t, 0), None);
    let (m, b) = record(7);
    t.store(m, b.clone());
    t.flush();
    assert_eq!(fetch(&mut t, 7), Some((b, Medium::Disk)));
    t.check_invariants();
    drop(t);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A tier of two records in memory over two on disk in `dir`.
fn two_and_two(dir: &std::path::Path) -> SecondTier {
    let cfg = TierConfig {
        memory_bytes: 2 * BYTES as u64,
        dir: Some(dir.to_path_buf()),
        disk_bytes: 2 * spill_slot(),
        shared: None,
    };
    SecondTier::open(&cfg, BS, BYTES, 1).unwrap()
}

#[test]
fn memory_pushes_its_oldest_records_to_disk() {
    let dir = temp_dir("demote");
    let mut t = two_and_two(&dir);
    for i in 0..5 {
        let (m, b) = record(i);
        t.store(m, b);
    }
    // memory holds 3 and 4, disk 1 and 2, record 0 fell off the end
    assert_eq!(fetch(&mut t, 4).unwrap().1, Medium::Memory);
    assert_eq!(fetch(&mut t, 3).unwrap().1, Medium::Memory);
    assert_eq!(
        fetch(&mut t, 2).unwrap().1,
        Medium::Disk,
        "served before the writer is done"
    );
    t.flush();
    assert_eq!(fetch(&mut t, 1).unwrap().1, Medium::Disk);
    assert_eq!(fetch(&mut t, 0), None);
    let s = t.stats();
    assert_eq!(
        (s.memory_blocks, s.disk_blocks, s.demoted, s.dropped_disk),
        (2, 2, 3, 1)
    );
    assert_eq!((s.hits_memory, s.hits_disk), (2, 2));
    drop(t);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The tiers publish what they keep: stored in memory, moved to disk (removed from memory, stored on
/// disk), pushed off the end (removed from disk), under the hashes the pool published; records the pool
/// did not publish (a tenant's salt) say nothing, and nothing is recorded until asked.
#[test]
fn what_the_tiers_keep_is_published_with_its_medium() {
    use crate::kv_events::KvEvent;
    let dir = temp_dir("events");
    let mut t = two_and_two(&dir);
    let published = |i: u32| {
        let (mut m, b) = record(i);
        m.published = Some(crate::tier::Published {
            hash: 100 + i as u64,
            parent: (i > 0).then(|| 99 + i as u64),
        });
        (m, b)
    };
    let (m, b) = published(9);
    t.store(m, b);
    assert!(t.take_events().is_empty(), "not recorded until asked");
    t.record_events();
    for i in 0..5 {
        let (m, b) = if i == 2 { record(i) } else { published(i) };
        t.store(m, b);
    }
    let ev: Vec<String> = t
        .take_events()
        .iter()
        .map(|e| match e {
            KvEvent::TierStored { hash, medium, .. } => format!("+{hash}:{}", medium.name()),
            KvEvent::TierRemoved { hash, medium } => format!("-{hash}:{}", medium.name()),
            other => panic!("{other:?}"),
        })
        .collect();
    // memory holds two, disk two. 0 and 1 go to memory, pushing 9 (stored before recording) to disk;
    // 2 (unpublished, silent) pushes 0 to disk; 3 pushes 1 to disk, which pushes 9 off the end; 4
    // pushes 2 to disk, which pushes 0 off the end
    assert_eq!(
        ev,
        [
            "+100:memory",
            "+101:memory",
            "+109:disk",
            "-100:memory",
            "+100:disk",
            "+103:memory",
            "-101:memory",
            "-109:disk",
            "+101:disk",
            "+104:memory",
            "-100:disk",
        ]
    );
    drop(t);
    let _ = std::fs::remove_dir_all(&dir);
}
