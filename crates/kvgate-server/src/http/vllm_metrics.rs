//! The `vllm:` view of `/metrics`: the series vLLM's consumers scrape — the llm-d / Gateway API
//! Inference Extension endpoint picker (`vllm:num_requests_waiting`, `vllm:num_requests_running`,
//! `vllm:kv_cache_usage_perc`, `vllm:cache_config_info`, `vllm:lora_requests_info`, every 50 ms),
//! dashboards and autoscalers (prefix-cache queries and hits, token counters, the latency histograms)
//! — beside kvgate's own. The engine records each series once, under `kvgate:` with vLLM's meaning and
//! type (`kvgate_engine::metrics`); this module copies the listed families into the `vllm:` namespace
//! as the text is rendered, so a scrape costs one pass over the text and the engine's hot path records
//! nothing twice. kvgate serves no LoRA adapters: `vllm:lora_requests_info` says so (`max_lora="0"`,
//! no running or waiting adapters), its value the scrape time as in vLLM.

use std::fmt::Write;

/// The `kvgate:` families with a `vllm:` twin: the suffix is the same, and so are type and meaning.
const SHARED: [&str; 18] = [
    "num_requests_running",
    "num_requests_waiting",
    "kv_cache_usage_perc",
    "cache_config_info",
    "prefix_cache_queries_total",
    "prefix_cache_hits_total",
    "num_preemptions_total",
    "prompt_tokens_total",
    "generation_tokens_total",
    "request_success_total",
    "time_to_first_token_seconds",
    "inter_token_latency_seconds",
    "e2e_request_latency_seconds",
    "request_queue_time_seconds",
    "spec_decode_num_drafts_total",
    "spec_decode_num_draft_tokens_total",
    "spec_decode_num_accepted_tokens_total",
    "spec_decode_num_accepted_tokens_per_pos_total",
];

/// Families vLLM also publishes under an older name (the inter-token histogram was
/// `time_per_output_token_seconds` before vLLM 0.10), copied under both.
const ALIASES: [(&str, &str); 1] = [("inter_token_latency_seconds", "time_per_output_token_seconds")];

/// The family a sample or comment line belongs to, and where its name starts and ends.
fn family(line: &str) -> Option<(&str, usize, usize)> {
    let (start, rest) = if let Some(r) = line.strip_prefix("# HELP ").or_else(|| line.strip_prefix("# TYPE ")) {
        (7, r)
    } else if line.starts_with('#') {
        return None;
    } else {
        (0, line)
    };
    let end = rest.find(['{', ' ']).unwrap_or(rest.len());
    let name = rest[..end].strip_prefix("kvgate:")?;
    let fam = ["_bucket", "_sum", "_count"]
        .iter()
        .find_map(|s| {
            name.strip_suffix(s)
                .filter(|f| SHARED.contains(f) && f.ends_with("_seconds"))
        })
        .unwrap_or(name);
    SHARED.contains(&fam).then_some((fam, start, start + end))
}

/// `text` (the exporter's rendering) followed by the `vllm:` twins of the shared families and the
/// LoRA info gauge for `model_name`; `now` is the scrape's Unix time.
pub fn with_vllm_names(text: String, model_name: &str, now: f64) -> String {
    let mut twins = String::with_capacity(text.len() / 2);
    for line in text.lines() {
        let Some((fam, start, end)) = family(line) else {
            continue;
        };
        let suffix = &line[start + "kvgate:".len()..end];
        let names = std::iter::once(suffix.to_string()).chain(
            ALIASES
                .iter()
                .filter(|(from, _)| *from == fam)
                .map(|(from, to)| suffix.replacen(from, to, 1)),
        );
        for name in names {
            let _ = writeln!(twins, "{}vllm:{name}{}", &line[..start], &line[end..]);
        }
    }
    let mut out = text;
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(&twins);
    let label = model_name.replace('\\', "\\\\").replace('"', "\\\"");
    let _ = writeln!(
        out,
        "# HELP vllm:lora_requests_info LoRA adapters running and waiting (kvgate serves none).\n\
         # TYPE vllm:lora_requests_info gauge\n\
         vllm:lora_requests_info{{max_lora=\"0\",model_name=\"{label}\",running_lora_adapters=\"\",waiting_lora_adapters=\"\"}} {now}"
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_families_get_vllm_twins_and_others_do_not() {
        let text = "\
# TYPE kvgate:num_requests_waiting gauge
kvgate:num_requests_waiting{model_name=\"m\"} 3
# TYPE kvgate:prefix_cache_hits_total counter
kvgate:prefix_cache_hits_total{model_name=\"m\"} 40
# TYPE kvgate:inter_token_latency_seconds histogram
kvgate:inter_token_latency_seconds_bucket{model_name=\"m\",le=\"0.01\"} 2
kvgate:inter_token_latency_seconds_sum{model_name=\"m\"} 0.01
kvgate:inter_token_latency_seconds_count{model_name=\"m\"} 2
# TYPE kvgate:kv_tier_blocks gauge
kvgate:kv_tier_blocks{model_name=\"m\",tier=\"memory\"} 7
kvgate:num_requests_waiting_for_godot 1
"
        .to_string();
        let out = with_vllm_names(text.clone(), "m", 12.5);
        assert!(out.starts_with(&text), "kvgate's own series come first, unchanged");
        let added: Vec<&str> = out[text.len()..].lines().collect();
        for want in [
            "# TYPE vllm:num_requests_waiting gauge",
            "vllm:num_requests_waiting{model_name=\"m\"} 3",
            "vllm:prefix_cache_hits_total{model_name=\"m\"} 40",
            "# TYPE vllm:inter_token_latency_seconds histogram",
            "vllm:inter_token_latency_seconds_bucket{model_name=\"m\",le=\"0.01\"} 2",
            "vllm:time_per_output_token_seconds_count{model_name=\"m\"} 2",
            "vllm:lora_requests_info{max_lora=\"0\",model_name=\"m\",running_lora_adapters=\"\",waiting_lora_adapters=\"\"} 12.5",
        ] {
            assert!(added.contains(&want), "missing {want:?} in {added:#?}");
        }
        assert!(
            !out.contains("vllm:kv_tier_blocks"),
            "kvgate-only families stay kvgate's"
        );
        assert!(!out.contains("vllm:num_requests_waiting_for_godot"));
        assert_eq!(added.iter().filter(|l| l.starts_with("vllm:")).count(), 9);
    }
}
