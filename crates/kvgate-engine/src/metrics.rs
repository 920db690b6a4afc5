//! Names of the engine's Prometheus series (vLLM's names under the `kvgate:` prefix; every series has a
//! `model_name` label). The engine records through the `metrics` facade; the server installs the
//! exporter.

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
/// Counter: prompt tokens of completions served from blocks a decision warmed.
pub const DECISION_PREFIX_REUSE: &str = "kvgate:decision_prefix_reuse_tokens_total";
/// Gauge (value 1): the cache configuration as labels.
pub const CACHE_CONFIG: &str = "kvgate:cache_config_info";

/// Every histogram name (the exporter gives them buckets).
pub const HISTOGRAMS: [&str; 5] = [TTFT, ITL, E2E, QUEUE_TIME, DECISION_LATENCY];
