//! The engine's Prometheus series: their names (vLLM's names under the `kvgate:` prefix; every series
//! has a `model_name` label) and the [`Recorder`] through which the engine records them (the `metrics`
//! facade; the server installs the exporter).

use std::time::Instant;

use crate::speculation::SpecStats;
use crate::tier::TierStats;

/// Gauge: running requests.
pub const RUNNING: &str = "kvgate:num_requests_running";
/// Gauge: waiting requests.
pub const WAITING: &str = "kvgate:num_requests_waiting";
/// Gauge: fraction of KV blocks held by live sequences (cached-but-free blocks excluded).
pub const KV_USAGE: &str = "kvgate:kv_cache_usage_perc";
/// Gauge: free blocks that keep a prefix-cache identity.
pub const KV_CACHED_FREE: &str = "kvgate:kv_cache_cached_free_blocks";
/// Counter: prompt tokens looked up in the prefix cache.
pub const PREFIX_QUERIES: &str = "kvgate:prefix_cache_queries_total";
/// Counter: prompt tokens found in the prefix cache.
pub const PREFIX_HITS: &str = "kvgate:prefix_cache_hits_total";
/// Counter: preemptions.
pub const PREEMPTIONS: &str = "kvgate:num_preemptions_total";
/// Counter: prompt tokens of finished requests.
pub const PROMPT_TOKENS: &str = "kvgate:prompt_tokens_total";
/// Counter: generated tokens.
pub const GENERATION_TOKENS: &str = "kvgate:generation_tokens_total";
/// Counter: finished requests by `finished_reason`.
pub const REQUEST_SUCCESS: &str = "kvgate:request_success_total";
/// Histogram: time to first token.
pub const TTFT: &str = "kvgate:time_to_first_token_seconds";
/// Histogram: time between tokens.
pub const ITL: &str = "kvgate:inter_token_latency_seconds";
/// Histogram: end-to-end latency.
pub const E2E: &str = "kvgate:e2e_request_latency_seconds";
/// Histogram: time spent waiting for admission.
pub const QUEUE_TIME: &str = "kvgate:request_queue_time_seconds";
/// Counter: decision requests.
pub const DECISION_REQUESTS: &str = "kvgate:decision_requests_total";
/// Counter: decision questions by `type` (recorded by the server, which knows the types).
pub const DECISION_QUESTIONS: &str = "kvgate:decision_questions_total";
/// Histogram: decision latency.
pub const DECISION_LATENCY: &str = "kvgate:decision_latency_seconds";
/// Counter: embedding inputs answered (one per input of an embeddings request).
pub const EMBEDDINGS: &str = "kvgate:embeddings_total";
/// Counter: prompt tokens of completions served from blocks a decision warmed.
pub const DECISION_PREFIX_REUSE: &str = "kvgate:decision_prefix_reuse_tokens_total";
/// Counter: decode chunks that carried proposed tokens (speculation).
pub const SPEC_DRAFTS: &str = "kvgate:spec_decode_num_drafts_total";
/// Counter: tokens proposed.
pub const SPEC_DRAFT_TOKENS: &str = "kvgate:spec_decode_num_draft_tokens_total";
/// Counter: proposed tokens kept.
pub const SPEC_ACCEPTED: &str = "kvgate:spec_decode_num_accepted_tokens_total";
/// Counter: proposed tokens kept, by `position` in their proposal.
pub const SPEC_ACCEPTED_PER_POS: &str = "kvgate:spec_decode_num_accepted_tokens_per_pos_total";
/// Counter: decode chunks whose proposals were a token tree (several verified at once).
pub const SPEC_TREES: &str = "kvgate:spec_decode_num_tree_drafts_total";
/// Counter: token trees whose kept path left the first proposal.
pub const SPEC_TREE_BRANCH_KEPT: &str = "kvgate:spec_decode_num_tree_branches_kept_total";
/// Gauge (value 1): the cache configuration as labels.
pub const CACHE_CONFIG: &str = "kvgate:cache_config_info";

/// Grammar token masks computed (structured outputs, tool calls).
pub const GRAMMAR_MASKS: &str = "kvgate:grammar_masks_total";
/// Seconds spent computing grammar masks (÷ masks = the mean per-token mask time; a float, so a gauge
/// that only grows).
pub const GRAMMAR_MASK_SECONDS: &str = "kvgate:grammar_mask_seconds_total";
/// Output tokens a grammar forced (appended without sampling).
pub const GRAMMAR_FORCED_TOKENS: &str = "kvgate:grammar_forced_tokens_total";
/// Blocks held by session retention (decisions' states, completions with a session hint).
pub const RETAINED_BLOCKS: &str = "kvgate:kv_cache_retained_blocks";
/// Retained states taken over by their session's next turn.
pub const SESSION_TURNS_KEPT: &str = "kvgate:session_turns_kept_total";
/// Pins (retention or keep_alive) released before their deadline to make room.
pub const PINS_RELEASED_EARLY: &str = "kvgate:pins_released_early_total";
/// Counter: cached blocks that left the hot pool, by `reason` (`lru`: an unretained cached block was
/// reused; `retention_released`: a retention or keep_alive pin gave way before its deadline, counted per
/// pin).
pub const EVICTIONS: &str = "kvgate:kv_cache_evictions_total";
/// Counter: prompt tokens found in the cache, by `tier` (`hot`, `memory`, `disk`).
pub const HITS_BY_TIER: &str = "kvgate:prefix_cache_hits_by_tier_total";
/// Counter: blocks found in the cache, by `tier`.
pub const HIT_BLOCKS_BY_TIER: &str = "kvgate:prefix_cache_hit_blocks_by_tier_total";
/// Gauge: records in the second tier, by `tier` (`memory`, `disk`).
pub const TIER_BLOCKS: &str = "kvgate:kv_tier_blocks";
/// Gauge: bytes the second tier holds, by `tier`.
pub const TIER_BYTES: &str = "kvgate:kv_tier_bytes";
/// Counter: blocks evicted from the hot pool and stored in the second tier.
pub const TIER_STORED: &str = "kvgate:kv_tier_stored_blocks_total";
/// Counter: records pushed out of the second tier, by `tier`.
pub const TIER_EVICTIONS: &str = "kvgate:kv_tier_evictions_total";
/// Counter: records that failed a check when read from the spill file (dropped, never served).
pub const TIER_REJECTED: &str = "kvgate:kv_tier_rejected_records_total";
/// Counter: blocks fetched from the shared store (`--kv-shared`) and verified.
pub const SHARED_HITS: &str = "kvgate:kv_shared_hits_total";
/// Counter: blocks asked of the shared store and not found there.
pub const SHARED_MISSES: &str = "kvgate:kv_shared_misses_total";
/// Counter: shared-store records refused by verification (torn, foreign, mislabelled, corrupted).
pub const SHARED_REFUSED: &str = "kvgate:kv_shared_verification_failures_total";
/// Counter: bytes read from the shared store.
pub const SHARED_BYTES_IN: &str = "kvgate:kv_shared_bytes_in_total";
/// Counter: bytes written to the shared store.
pub const SHARED_BYTES_OUT: &str = "kvgate:kv_shared_bytes_out_total";
/// Counter: blocks written to the shared store.
pub const SHARED_STORED: &str = "kvgate:kv_shared_stored_blocks_total";
/// Counter: blocks not written (queue full, store down, a failed write).
pub const SHARED_DROPPED: &str = "kvgate:kv_shared_dropped_blocks_total";
/// Counter: connection failures, timeouts and error replies of the shared store.
pub const SHARED_ERRORS: &str = "kvgate:kv_shared_errors_total";
/// Counter (float, a gauge that only grows): seconds fetches from the shared store took (÷ fetches =
/// the mean latency).
pub const SHARED_FETCH_SECONDS: &str = "kvgate:kv_shared_fetch_seconds_total";
/// Counter: fetches from the shared store answered.
pub const SHARED_FETCHES: &str = "kvgate:kv_shared_fetches_total";
/// Counter: blocks restored from the second tier into the hot pool.
pub const TIER_RESTORED: &str = "kvgate:kv_tier_restored_blocks_total";
/// Counter: bytes restored (÷ restore seconds = the restore rate).
pub const TIER_RESTORE_BYTES: &str = "kvgate:kv_tier_restore_bytes_total";
/// Counter (float, a gauge that only grows): seconds the engine spent writing restored blocks.
pub const TIER_RESTORE_SECONDS: &str = "kvgate:kv_tier_restore_seconds_total";
/// Counter (float): seconds the engine spent reading evicted blocks out for the tier.
pub const TIER_SPILL_SECONDS: &str = "kvgate:kv_tier_spill_seconds_total";
/// Counter: prompt tokens of completions with a session hint (`prompt_cache_key`, `X-Session-ID`).
pub const SESSION_PROMPT_TOKENS: &str = "kvgate:session_prompt_tokens_total";
/// Counter: of those, tokens found in the cache (÷ the above = the sessions' follow-up hit rate).
pub const SESSION_CACHED_TOKENS: &str = "kvgate:session_cached_tokens_total";
/// Counter: KV-event batches dropped because the publisher's queue was full (each leaves a gap in
/// the sequence numbers consumers see).
pub const KV_EVENTS_DROPPED: &str = "kvgate:kv_events_dropped_batches_total";
/// Counter: KV-event batches sent on the publisher's socket.
pub const KV_EVENTS_PUBLISHED: &str = "kvgate:kv_events_published_batches_total";
/// Every histogram name (the exporter gives them buckets).
pub const HISTOGRAMS: [&str; 5] = [TTFT, ITL, E2E, QUEUE_TIME, DECISION_LATENCY];

/// What the recorder reads of the scheduler after a step: a snapshot of plain numbers, so that this
/// room depends on no bookkeeping room (the scheduler makes it, [`crate::scheduler::Scheduler::stats`]).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SchedulerStats {
    /// Groups running.
    pub(crate) running: usize,
    /// Groups waiting.
    pub(crate) waiting: usize,
    /// Blocks referenced by a sequence.
    pub(crate) used_blocks: usize,
    /// Blocks in the pool.
    pub(crate) total_blocks: usize,
    /// Free blocks that still hold a cached prefix.
    pub(crate) cached_free: usize,
    /// Prompt tokens looked up in the prefix cache, and found, since the start.
    pub(crate) prefix_queries: u64,
    /// (See `prefix_queries`.)
    pub(crate) prefix_hits: u64,
    /// Preemptions since the start.
    pub(crate) preemptions: u64,
    /// Blocks session retention holds.
    pub(crate) retained_blocks: usize,
    /// Session turns that found their retained state, and pins released early, since the start.
    pub(crate) pins_consumed: u64,
    /// (See `pins_consumed`.)
    pub(crate) pins_released_early: u64,
    /// Cached blocks evicted (LRU) since the start.
    pub(crate) evictions: u64,
    /// The second tier's counters (zero without one).
    pub(crate) tier: TierStats,
    /// Speculation's counters (zero without it).
    pub(crate) spec: SpecStats,
}

/// Records the engine's series under one `model_name` label.
pub(crate) struct Recorder {
    label: [(&'static str, String); 1],
    last_prefix: (u64, u64),
    last_preemptions: u64,
    /// (session turns kept, pins released early) as last reported.
    last_pins: (u64, u64),
    last_evictions: u64,
    last_tier: TierStats,
    last_spec: SpecStats,
    last_shared: crate::tier::SharedStats,
    block_size: u64,
    /// Seconds spent restoring and spilling (reported as totals).
    restore_seconds: f64,
    spill_seconds: f64,
}

impl Recorder {
    pub(crate) fn new(model_name: &str, block_size: usize) -> Recorder {
        Recorder {
            label: [("model_name", model_name.to_string())],
            last_prefix: (0, 0),
            last_preemptions: 0,
            last_pins: (0, 0),
            last_evictions: 0,
            last_tier: TierStats::default(),
            last_spec: SpecStats::default(),
            last_shared: Default::default(),
            block_size: block_size as u64,
            restore_seconds: 0.0,
            spill_seconds: 0.0,
        }
    }

    /// The shared store's counters (their growth since the last call).
    pub(crate) fn shared(&mut self, now: crate::tier::SharedStats) {
        if now == self.last_shared {
            return;
        }
        let (l, was) = (&self.label, std::mem::replace(&mut self.last_shared, now));
        let d = |a: u64, b: u64| a.saturating_sub(b);
        for (name, a, b) in [
            (SHARED_HITS, now.hits, was.hits),
            (SHARED_MISSES, now.misses, was.misses),
            (SHARED_REFUSED, now.refused, was.refused),
            (SHARED_BYTES_IN, now.bytes_in, was.bytes_in),
            (SHARED_BYTES_OUT, now.bytes_out, was.bytes_out),
            (SHARED_STORED, now.stored, was.stored),
            (SHARED_DROPPED, now.dropped, was.dropped),
            (SHARED_ERRORS, now.errors, was.errors),
            (SHARED_FETCHES, now.fetches, was.fetches),
        ] {
            metrics::counter!(name, l).increment(d(a, b));
        }
        metrics::gauge!(SHARED_FETCH_SECONDS, l).set(now.fetch_micros as f64 / 1e6);
    }

    /// Gauges from the scheduler's state; counters by what changed since the last call.
    pub(crate) fn update(&mut self, s: &SchedulerStats) {
        let l = &self.label;
        metrics::gauge!(RUNNING, l).set(s.running as f64);
        metrics::gauge!(WAITING, l).set(s.waiting as f64);
        metrics::gauge!(KV_USAGE, l).set(s.used_blocks as f64 / s.total_blocks.max(1) as f64);
        metrics::gauge!(KV_CACHED_FREE, l).set(s.cached_free as f64);
        let (queries, hits) = (s.prefix_queries, s.prefix_hits);
        let prev_prefix = self.last_prefix;
        metrics::counter!(PREFIX_QUERIES, l).increment(queries - self.last_prefix.0.min(queries));
        metrics::counter!(PREFIX_HITS, l).increment(hits - self.last_prefix.1.min(hits));
        self.last_prefix = (queries, hits);
        let pre = s.preemptions;
        metrics::counter!(PREEMPTIONS, l).increment(pre - self.last_preemptions.min(pre));
        self.last_preemptions = pre;
        metrics::gauge!(RETAINED_BLOCKS, l).set(s.retained_blocks as f64);
        let kept = s.pins_consumed;
        metrics::counter!(SESSION_TURNS_KEPT, l).increment(kept - self.last_pins.0.min(kept));
        let early = s.pins_released_early;
        metrics::counter!(PINS_RELEASED_EARLY, l).increment(early - self.last_pins.1.min(early));
        let reason = |r: &'static str| [l[0].clone(), ("reason", r.to_string())];
        metrics::counter!(EVICTIONS, &reason("retention_released")).increment(early - self.last_pins.1.min(early));
        self.last_pins = (kept, early);
        let ev = s.evictions;
        metrics::counter!(EVICTIONS, &reason("lru")).increment(ev - self.last_evictions.min(ev));
        self.last_evictions = ev;
        let t = s.tier;
        let last = std::mem::replace(&mut self.last_tier, t);
        let d = |now: u64, then: u64| now - then.min(now);
        let tier = |name: &'static str| [l[0].clone(), ("tier", name.to_string())];
        let (hm, hd) = (d(t.hits_memory, last.hits_memory), d(t.hits_disk, last.hits_disk));
        let hot_tokens = d(hits, prev_prefix.1).saturating_sub((hm + hd) * self.block_size);
        metrics::counter!(HITS_BY_TIER, &tier("hot")).increment(hot_tokens);
        metrics::counter!(HIT_BLOCKS_BY_TIER, &tier("hot")).increment(hot_tokens / self.block_size.max(1));
        for (name, blocks) in [("memory", hm), ("disk", hd)] {
            metrics::counter!(HITS_BY_TIER, &tier(name)).increment(blocks * self.block_size);
            metrics::counter!(HIT_BLOCKS_BY_TIER, &tier(name)).increment(blocks);
        }
        metrics::counter!(TIER_RESTORED, l).increment(hm + hd);
        metrics::counter!(TIER_STORED, l).increment(d(t.stored, last.stored));
        metrics::counter!(TIER_EVICTIONS, &tier("memory")).increment(d(t.dropped_memory, last.dropped_memory));
        metrics::counter!(TIER_EVICTIONS, &tier("disk")).increment(d(t.dropped_disk, last.dropped_disk));
        metrics::counter!(TIER_REJECTED, l).increment(d(t.spill.rejected, last.spill.rejected));
        metrics::gauge!(TIER_BLOCKS, &tier("memory")).set(t.memory_blocks as f64);
        metrics::gauge!(TIER_BLOCKS, &tier("disk")).set(t.disk_blocks as f64);
        metrics::gauge!(TIER_BYTES, &tier("memory")).set(t.memory_bytes as f64);
        metrics::gauge!(TIER_BYTES, &tier("disk")).set(t.disk_bytes as f64);
        let (sp, was) = (&s.spec, std::mem::replace(&mut self.last_spec, s.spec));
        if sp.drafts > was.drafts {
            metrics::counter!(SPEC_DRAFTS, l).increment(d(sp.drafts, was.drafts));
            metrics::counter!(SPEC_DRAFT_TOKENS, l).increment(d(sp.draft_tokens, was.draft_tokens));
            metrics::counter!(SPEC_ACCEPTED, l).increment(d(sp.accepted, was.accepted));
            metrics::counter!(SPEC_TREES, l).increment(d(sp.trees, was.trees));
            metrics::counter!(SPEC_TREE_BRANCH_KEPT, l).increment(d(sp.tree_branch_kept, was.tree_branch_kept));
            for (i, (now, then)) in sp.accepted_per_pos.iter().zip(&was.accepted_per_pos).enumerate() {
                if now > then {
                    let pos = [l[0].clone(), ("position", i.to_string())];
                    metrics::counter!(SPEC_ACCEPTED_PER_POS, &pos).increment(d(*now, *then));
                }
            }
        }
        metrics::gauge!(TIER_RESTORE_SECONDS, l).set(self.restore_seconds);
        metrics::gauge!(TIER_SPILL_SECONDS, l).set(self.spill_seconds);
    }

    /// The engine wrote `bytes` of restored blocks in `secs`, and read spilled ones out in `spill_secs`.
    pub(crate) fn tier_io(&mut self, bytes: u64, secs: f64, spill_secs: f64) {
        metrics::counter!(TIER_RESTORE_BYTES, &self.label).increment(bytes);
        self.restore_seconds += secs;
        self.spill_seconds += spill_secs;
    }

    /// A completion with a session hint was admitted with `cached` of its `prompt` tokens found.
    pub(crate) fn session_turn(&self, prompt: usize, cached: usize) {
        metrics::counter!(SESSION_PROMPT_TOKENS, &self.label).increment(prompt as u64);
        metrics::counter!(SESSION_CACHED_TOKENS, &self.label).increment(cached as u64);
    }

    /// A request was admitted (queue time; prompt tokens of a completion found in decision-warmed blocks).
    pub(crate) fn admitted(&self, arrival: Instant, now: Instant, decision_warmed_tokens: usize) {
        if decision_warmed_tokens > 0 {
            metrics::counter!(DECISION_PREFIX_REUSE, &self.label).increment(decision_warmed_tokens as u64);
        }
        metrics::histogram!(QUEUE_TIME, &self.label).record((now - arrival).as_secs_f64());
    }

    /// A decision was submitted.
    pub(crate) fn decision_request(&self) {
        metrics::counter!(DECISION_REQUESTS, &self.label).increment(1);
    }

    /// A token step of a completion: TTFT for the first, inter-token latency after.
    pub(crate) fn token_timing(&self, arrival: Instant, last: Option<Instant>, now: Instant) {
        match last {
            None => metrics::histogram!(TTFT, &self.label).record((now - arrival).as_secs_f64()),
            Some(t) => metrics::histogram!(ITL, &self.label).record((now - t).as_secs_f64()),
        }
    }

    /// One generated token.
    pub(crate) fn generated_token(&self) {
        metrics::counter!(GENERATION_TOKENS, &self.label).increment(1);
    }

    /// A grammar mask took `secs` (0: it was ready, computed alongside the forward pass).
    pub(crate) fn grammar_mask(&self, secs: f64) {
        if secs > 0.0 {
            self.grammar_mask_done(secs);
        }
    }

    /// One grammar mask computed in `secs`.
    pub(crate) fn grammar_mask_done(&self, secs: f64) {
        metrics::counter!(GRAMMAR_MASKS, &self.label).increment(1);
        metrics::gauge!(GRAMMAR_MASK_SECONDS, &self.label).increment(secs);
    }

    /// One output token forced by a grammar.
    pub(crate) fn forced_token(&self) {
        metrics::counter!(GRAMMAR_FORCED_TOKENS, &self.label).increment(1);
    }

    /// A completion finished.
    pub(crate) fn request_done(&self, arrival: Instant, prompt_tokens: usize) {
        metrics::histogram!(E2E, &self.label).record(arrival.elapsed().as_secs_f64());
        metrics::counter!(PROMPT_TOKENS, &self.label).increment(prompt_tokens as u64);
    }

    /// A decision finished.
    pub(crate) fn decision_done(&self, arrival: Instant, prompt_tokens: usize) {
        metrics::histogram!(DECISION_LATENCY, &self.label).record(arrival.elapsed().as_secs_f64());
        self.request_done(arrival, prompt_tokens);
    }

    /// An embedding finished.
    pub(crate) fn embedding_done(&self, arrival: Instant, prompt_tokens: usize) {
        metrics::counter!(EMBEDDINGS, &self.label).increment(1);
        self.request_done(arrival, prompt_tokens);
    }

    /// A request ended, for `request_success_total{finished_reason}`.
    pub(crate) fn request_ended(&self, reason: &str) {
        metrics::counter!(REQUEST_SUCCESS, "model_name" => self.label[0].1.clone(), "finished_reason" => reason.to_string())
            .increment(1);
    }
}
