//! Seeded randomized invariant tests of the scheduler, the KV manager and the block pool together.
//!
//! A simulated KV cache stores, for every slot written, the identity of the whole prefix up to that
//! token. Before every chunk runs, every earlier position of its sequence is read back through the block
//! table and must hold exactly that sequence's prefix identity: prefix-cache hits, copy-on-write, forks
//! and preemption can never make a sequence read someone else's K/V. After every operation the pool's
//! reference counts must equal the number of tables holding each block; when everything ends, every
//! block is free or cached.
//!
//! Half the runs speculate: decode chunks carry proposed tokens (the simulation writes their K/V as
//! the chunk's own tokens, keeps a random-length agreeing prefix as a verifier would, and gives the
//! rest back), so the same checks prove that a rejected proposal's K/V is never read as a sequence's
//! own and that speculation leaks no block (decisions with tree reads among them).
//!
//! Half the runs put a second tier (host memory, sometimes a spill file) behind the pool: the
//! simulation carries out each plan's spills (reading the simulated block) and restores (writing it)
//! before its copies, as the engine does, so the same read-back check proves that a restored block
//! holds exactly the prefix it is matched for.

use std::collections::HashMap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::block_pool::{BlockPool, BlockRef};
use crate::layout::PinKind;
use crate::registry::{GroupId, SeqId};
use crate::scheduler::{Admission, Logits, Scheduler, SchedulerConfig, SpecPlan, StepUpdate};
use crate::speculation::{SpecConfig, SpecMethod};
use crate::tier::{SecondTier, TierConfig};

fn prefix_id(tokens: &[u32], salt: &str) -> u64 {
    let mut h: u64 = 1469598103934665603;
    for b in salt.bytes() {
        h = (h ^ b as u64).wrapping_mul(1099511628211);
    }
    for &t in tokens {
        h = (h ^ (t as u64 + 7)).wrapping_mul(1099511628211);
    }
    h
}

struct Sim {
    rng: ChaCha8Rng,
    s: Scheduler,
    cache: Vec<u64>,
    bs: usize,
    kind: HashMap<GroupId, (bool, usize, usize, String)>, // (is_decision, n, max_new, salt)
    generated: HashMap<SeqId, usize>,
    forked: HashMap<GroupId, bool>,
    clock: u64,
    finished_groups: usize,
    restored: u64,
    /// Token-tree paths kept that left the first proposal (their rows moved).
    moved_paths: u64,
}

fn constant_hash(_: Option<BlockRef>, _: &[u32], _: &str) -> u64 {
    1
}

impl Drop for Sim {
    fn drop(&mut self) {
        if let Some(dir) = self.s.tier().and_then(|t| t.spill_path()).and_then(|p| p.parent()) {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

impl Sim {
    fn new(seed: u64, collide: bool) -> Sim {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let bs = [1usize, 2, 4, 16][rng.random_range(0..4)];
        let blocks = rng.random_range(12..80);
        let (seqs, budget) = (rng.random_range(2..24), rng.random_range(3..80));
        let mut cfg = SchedulerConfig {
            prefix_caching: rng.random_bool(0.85),
            release_window: rng.random_bool(0.3).then(|| rng.random_range(1..24)),
            ..SchedulerConfig::new(seqs, budget, bs)
        };
        if rng.random_bool(0.5) {
            // cache-aware admission, sometimes with a bound the simulation's clock reaches
            cfg.admission = Admission::cache_aware(rng.random_range(1..200));
        }
        if rng.random_bool(0.5) {
            let min = rng.random_range(1..3);
            let spec = SpecConfig {
                // a draft model's proposals are random tokens here (the fuzz's verifier keeps them
                // by chance, as it keeps prompt lookup's)
                method: [SpecMethod::Ngram, SpecMethod::DraftModel, SpecMethod::LookupThenDraft]
                    [rng.random_range(0..3usize)],
                num_speculative_tokens: rng.random_range(1..7),
                prompt_lookup_min: min,
                prompt_lookup_max: min + rng.random_range(0..3),
                max_batch: rng.random_range(1..24),
                draft_p_min: 0.0,
                draft_window: crate::speculation::DEFAULT_DRAFT_WINDOW,
                draft_share: crate::speculation::DRAFT_PROMPT_SHARE,
                tree_branches: rng.random_range(1..4),
            };
            let mut plan = SpecPlan::new(spec);
            if rng.random_bool(0.5) {
                plan.rows_per_weight_read = Some(rng.random_range(1..9));
            }
            if rng.random_bool(0.5) {
                // token trees, in a small grain so that partitions end inside trees
                plan.tree = Some(kvgate_backend::TreeGrain {
                    lanes: rng.random_range(1..5),
                    partition: rng.random_range(8..40),
                });
            }
            cfg.speculation = Some(plan);
        }
        let pool = if collide {
            BlockPool::with_hasher(blocks, constant_hash)
        } else {
            BlockPool::new(blocks)
        };
        let mut s = Scheduler::with_pool(cfg, pool);
        if rng.random_bool(0.5) {
            let disk = rng.random_bool(0.3);
            let dir = std::env::temp_dir().join(format!("kvgate-fuzz-{}-{seed}-{collide}", std::process::id()));
            let cfg = TierConfig {
                memory_bytes: rng.random_range(0..40) * bs as u64 * 8,
                dir: disk.then_some(dir),
                disk_bytes: rng.random_range(0..400) * bs as u64 * 8,
                shared: None,
            };
            s.set_tier(Some(SecondTier::open(&cfg, bs, bs * 8, seed).unwrap()));
        }
        Sim {
            rng,
            s,
            cache: vec![u64::MAX; blocks * bs],
            bs,
            kind: HashMap::new(),
            generated: HashMap::new(),
            forked: HashMap::new(),
            clock: 0,
            finished_groups: 0,
            restored: 0,
            moved_paths: 0,
        }
    }

    fn capacity_tokens(&self) -> usize {
        self.s.pool().total() * self.bs
    }

    fn tokens(&mut self, n: usize) -> Vec<u32> {
        (0..n).map(|_| self.rng.random_range(0..3)).collect()
    }

    fn add(&mut self) {
        let cap = self.capacity_tokens();
        let salt = if self.rng.random_bool(0.2) { "t1" } else { "" }.to_string();
        if self.rng.random_bool(0.6) {
            let n = if self.rng.random_bool(0.2) {
                self.rng.random_range(2..4)
            } else {
                1
            };
            let len: usize = self.rng.random_range(1..30);
            let max_new: usize = self.rng.random_range(1..12);
            // Up-front admission check, as the engine does: the whole group must fit alone.
            if len.div_ceil(self.bs) + n * (max_new.div_ceil(self.bs) + 1) > self.s.pool().total()
                || len + max_new > cap
            {
                return;
            }
            let prompt = self.tokens(len);
            let all = self.rng.random_bool(0.05);
            let (g, _) = self.s.add_generate(prompt, &salt, all);
            self.kind.insert(g, (false, n, max_new, salt));
        } else {
            let k = self.rng.random_range(1..6);
            let state_len = self.rng.random_range(0..30);
            let state = self.tokens(state_len);
            let mut prompts = vec![];
            for _ in 0..k {
                let sl = self.rng.random_range(1..8);
                let mut p = state.clone();
                p.extend(self.tokens(sl));
                prompts.push(p);
            }
            let need: usize = prompts.iter().map(|p| p.len().div_ceil(self.bs) + 1).sum();
            if need > self.s.pool().total() {
                return;
            }
            // some reads end in a tree (a set read): its tokens never enter the prefix cache
            let plain: Vec<usize> = prompts
                .iter()
                .map(|p| match self.rng.random_bool(0.3) {
                    true => self.rng.random_range(1..=p.len()),
                    false => usize::MAX,
                })
                .collect();
            let g = self.s.add_decision_reads(prompts, plain, &salt);
            self.kind.insert(g, (true, k, 0, salt));
        }
    }

    fn step(&mut self) {
        let asks: Vec<(SeqId, usize, usize, usize)> = self
            .s
            .draft_asks()
            .iter()
            .map(|a| (a.seq, a.k, a.upto, a.tokens.len()))
            .collect();
        for (seq, k, upto, len) in asks {
            // a prompt being computed: the draft follows what the target computed; a decoding
            // sequence: all its tokens, and at least one to propose
            assert!(upto >= 1 && upto <= len && (k == 0) == (upto < len), "{k} {upto} {len}");
            if k == 0 {
                continue;
            }
            let n = self.rng.random_range(0..=k);
            let drafted = (0..n).map(|_| self.rng.random_range(0..3)).collect();
            self.s.set_drafted(seq, drafted).unwrap();
        }
        let budget = self.s.config().max_num_batched_tokens;
        let plan = self.s.schedule().unwrap();
        for a in self.s.draft_follows(&plan.chunks) {
            // a draft follows a planned prompt chunk to its end, never past the tokens
            let c = plan.chunks.iter().find(|c| c.seq == a.seq).unwrap();
            assert_eq!((a.upto, a.k), (c.start + c.len, 0));
            assert!(a.upto <= a.tokens.len());
        }
        assert!(plan.num_tokens() <= budget, "budget exceeded");
        let mut seen = std::collections::HashSet::new();
        for c in &plan.chunks {
            assert!(c.len > 0);
            assert!(seen.insert(c.seq), "a sequence twice in one step");
        }
        for (g, _) in &plan.failed {
            self.kind.remove(g);
        }
        // the tier first (spilled blocks read, then restored ones written), as the engine does
        let ops = self.s.take_tier_ops();
        let bs = self.bs;
        let mut spilled = vec![];
        for (b, meta) in ops.spills {
            let slots = &self.cache[b.index() * bs..(b.index() + 1) * bs];
            spilled.push((meta, slots.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>()));
        }
        for r in ops.restores {
            for (o, x) in r.bytes.chunks_exact(8).enumerate() {
                self.cache[r.block.index() * bs + o] = u64::from_le_bytes(x.try_into().unwrap());
            }
            self.restored += 1;
        }
        if let Some(t) = self.s.tier_mut() {
            for (meta, bytes) in spilled {
                t.store(meta, bytes);
            }
        }
        // copies first, then every chunk checks its past and writes its tokens
        let snapshot = self.cache.clone();
        for cp in &plan.copies {
            for o in 0..self.bs {
                self.cache[cp.dst as usize * self.bs + o] = snapshot[cp.src as usize * self.bs + o];
            }
        }
        for c in &plan.chunks {
            let seq = self.s.seq(c.seq).expect("scheduled seq exists");
            assert_eq!(c.group, seq.group);
            assert_eq!(c.table, seq.blocks.table(), "the plan carries the table");
            let known = c.start + c.len - c.draft;
            assert_eq!(
                c.tokens[..c.len - c.draft],
                seq.tokens[c.start..known],
                "the plan carries the tokens"
            );
            assert_eq!(c.at_end, known == seq.tokens.len());
            if c.draft > 0 {
                assert!(c.at_end && known == c.start + 1, "a proposal follows a decode token");
                assert_eq!(c.logits, Logits::All);
            }
            let salt = &self.kind[&seq.group].3;
            // With a release window, only what the chunk's queries can read must still be there.
            let first_read = self
                .s
                .config()
                .release_window
                .map_or(0, |w| (c.start + 1).saturating_sub(w));
            for p in first_read..c.start {
                let slot = c.table[p / self.bs]
                    .expect("a block in the window was given back")
                    .index()
                    * self.bs
                    + p % self.bs;
                assert_eq!(
                    self.cache[slot],
                    prefix_id(&seq.tokens[..=p], salt),
                    "stale K/V at position {p}"
                );
            }
        }
        for c in &plan.chunks {
            let seq = self.s.seq(c.seq).expect("exists");
            let salt = self.kind[&seq.group].3.clone();
            // proposed tokens are written as what the chunk runs
            let mut run = seq.tokens[..c.start].to_vec();
            run.extend(&c.tokens);
            for i in 0..c.len {
                let p = c.slot_position(i);
                let slot =
                    c.table[p / self.bs].expect("a written block was given back").index() * self.bs + p % self.bs;
                assert_eq!(c.slots[i], slot, "the plan's slot of position {p}");
                if c.tree.is_empty() {
                    self.cache[slot] = prefix_id(&run[..=c.start + i], &salt);
                    continue;
                }
                // a tree row's K/V is its path's: the chunk's first token, its ancestors, itself
                let mut path = vec![];
                let mut r = i;
                while r > 0 {
                    path.push(c.tokens[r]);
                    r = c.tree[r - 1].parent;
                }
                path.reverse();
                let mut toks = seq.tokens[..=c.start].to_vec();
                toks.extend(path);
                self.cache[slot] = prefix_id(&toks, &salt);
            }
            if c.draft > 0 {
                continue;
            }
            let end = c.start + c.len;
            let at_end = end == seq.tokens.len();
            if seq.wants_logits && at_end {
                assert!(matches!(c.logits, Logits::Last | Logits::All));
            } else if !seq.all_logits {
                assert_eq!(c.logits, Logits::None);
            }
        }
        for c in &plan.chunks {
            self.s.advance(c).unwrap();
        }
        for c in plan.chunks {
            let Ok(seq) = self.s.seq(c.seq) else { continue };
            if c.logits == Logits::None || !c.at_end {
                continue;
            }
            let g = seq.group;
            let (is_dec, n, max_new, _) = self.kind[&g].clone();
            if c.draft > 0 {
                // a verifier: each row reached samples a token; the walk goes on to the proposed
                // row holding it (the next one, or a child in a token tree)
                let (t, mut path, mut u) = (c.seq, vec![], StepUpdate::default());
                let mut done = false;
                let mut at = 0;
                loop {
                    let tok = self.rng.random_range(0..3);
                    u.append(t, tok);
                    let gen = self.generated.entry(t).or_insert(0);
                    *gen += 1;
                    if *gen >= max_new {
                        done = true;
                        break;
                    }
                    match c.next_row(at, tok) {
                        Some(r) => {
                            path.push(r);
                            at = r;
                        }
                        None => break,
                    }
                }
                u.accept_path(t, path);
                if done {
                    u.finish(t);
                } else {
                    u.spec_limit(t, max_new - self.generated[&t] - 1);
                }
                self.s.update_from_output(u).unwrap();
                // a kept tree path's rows to their plain slots, as the engine does
                let moves = self.s.take_slot_moves();
                self.moved_paths += u64::from(!moves.is_empty());
                for m in moves {
                    self.cache[m.dst] = self.cache[m.src];
                }
                if !self.s.has_group(g) {
                    self.kind.remove(&g);
                    self.finished_groups += 1;
                }
                continue;
            }
            if is_dec {
                self.s.finish_seq(c.seq).unwrap();
            } else {
                let mut targets = vec![c.seq];
                if n > 1 && !self.forked.get(&g).copied().unwrap_or(false) {
                    self.forked.insert(g, true);
                    targets.extend(self.s.fork(c.seq, n - 1).unwrap());
                }
                for t in targets {
                    let tok = self.rng.random_range(0..3);
                    self.s.append_token(t, tok).unwrap();
                    let gen = self.generated.entry(t).or_insert(0);
                    *gen += 1;
                    if *gen >= max_new {
                        self.s.finish_seq(t).unwrap();
                    } else {
                        let mut u = StepUpdate::default();
                        u.spec_limit(t, max_new - *gen - 1);
                        self.s.update_from_output(u).unwrap();
                    }
                }
            }
            if !self.s.has_group(g) {
                self.kind.remove(&g);
                self.finished_groups += 1;
            }
        }
    }

    fn abort_random(&mut self) {
        let gs: Vec<GroupId> = self.kind.keys().copied().collect();
        if gs.is_empty() {
            return;
        }
        let g = gs[self.rng.random_range(0..gs.len())];
        self.s.finish_group(g);
        self.kind.remove(&g);
    }

    fn pin_random(&mut self) {
        let gs: Vec<GroupId> = self.kind.keys().copied().collect();
        if let Some(&g) = gs.first() {
            if let Some(&sid) = self.s.group_seqs(g).first() {
                let t = self.clock + self.rng.random_range(1..20);
                let kind = if self.rng.random_bool(0.5) {
                    PinKind::Session
                } else {
                    PinKind::KeepAlive
                };
                self.s.pin_prefix(sid, 1000, t, Some((t % 3) as u32), kind).unwrap();
            }
        }
    }

    fn run(&mut self, ops: usize) {
        for _ in 0..ops {
            self.clock += 1;
            match self.rng.random_range(0..100) {
                0..=24 => self.add(),
                25..=89 => self.step(),
                90..=94 => self.abort_random(),
                95..=96 => self.pin_random(),
                _ => {
                    self.s.expire_pins(self.clock);
                }
            }
            self.s.check_invariants();
        }
        // Drain: everything finishes or is aborted.
        let mut guard = 0;
        while !self.s.is_idle() && guard < 10_000 {
            self.step();
            self.s.check_invariants();
            guard += 1;
        }
        for g in self.kind.keys().copied().collect::<Vec<_>>() {
            self.s.finish_group(g);
        }
        self.s.clear_pins();
        self.s.check_invariants();
        let c = self.s.pool().counts();
        assert_eq!(c.used, 0, "leaked blocks");
        assert_eq!(c.cached_free + c.plain_free, c.total);
    }
}

#[test]
fn randomized_invariants() {
    let (mut total, mut preemptions, mut hits, mut evictions, mut restored) = (0, 0, 0, 0, 0);
    let (mut drafts, mut kept, mut moved) = (0, 0, 0);
    for seed in 0..60 {
        let mut sim = Sim::new(seed, false);
        sim.run(5_000);
        let spec = sim.s.stats().spec;
        (drafts, kept) = (drafts + spec.drafts, kept + spec.accepted);
        moved += sim.moved_paths;
        total += sim.finished_groups;
        preemptions += sim.s.preemptions();
        hits += sim.s.prefix_stats().hits;
        evictions += sim.s.pool().evictions();
        restored += sim.restored;
        if let Some(t) = sim.s.tier_mut() {
            t.flush();
            t.check_invariants();
        }
    }
    assert!(restored > 1000, "blocks restored from the tier: {restored}");
    // The simulation must exercise what it claims to.
    assert!(total > 1000, "finished requests: {total}");
    assert!(preemptions > 100, "preemptions: {preemptions}");
    assert!(hits > 1000, "prefix-cache hit tokens: {hits}");
    assert!(evictions > 100, "evictions: {evictions}");
    assert!(
        drafts > 1000 && kept > 500,
        "proposals verified: {drafts}, tokens kept: {kept}"
    );
    assert!(moved > 200, "token-tree paths kept off the first proposal: {moved}");
}

#[test]
fn randomized_invariants_with_colliding_hashes() {
    for seed in 100..130 {
        let mut sim = Sim::new(seed, true);
        sim.run(4_000);
    }
}
