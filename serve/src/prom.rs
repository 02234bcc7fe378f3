//! Prometheus text: reading engines' `/metrics` (vLLM's, SGLang's and llama.cpp's names) and
//! writing the gateway's (counters and fixed-bucket histograms).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

/// The sum of every sample of metric `name` (over its label sets), or `None` when absent.
/// Only `name` exactly (with or without labels) counts: `vllm:x` does not match `vllm:x_total`.
pub fn sum(text: &str, name: &str) -> Option<f64> {
    let mut total = None;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name) else { continue };
        let value = match rest.as_bytes().first() {
            Some(b'{') => rest.rfind('}').map(|i| &rest[i + 1..]),
            Some(b' ') => Some(rest),
            _ => None,
        };
        // `value [timestamp]`
        if let Some(v) = value.and_then(|v| v.split_whitespace().next()).and_then(|v| v.parse::<f64>().ok()) {
            *total.get_or_insert(0.0) += v;
        }
    }
    total
}

/// The first of `names` present in `text`.
pub fn first(text: &str, names: &[&str]) -> Option<f64> {
    names.iter().find_map(|n| sum(text, n))
}

/// An engine's load as scraped: vLLM's, SGLang's or llama.cpp's names, whichever the engine
/// exposes. llama.cpp (`llama-server --metrics`) has `llamacpp:requests_deferred` (requests
/// waiting for a slot) and `llamacpp:requests_processing` (slots busy), and no KV gauge: its KV
/// use stays unknown (0).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EngineLoad {
    pub waiting: f64,
    pub running: f64,
    /// KV cache usage in [0, 1].
    pub kv_usage: f64,
}

/// The most requests a scraped gauge may count: the mark an open circuit's view gets
/// (`u32::MAX / 4`), so a router's sum of a view's counts cannot overflow.
pub const MOST_REQUESTS: f64 = (u32::MAX / 4) as f64;

/// The load an engine's `/metrics` text shows, or `None` when it is unusable: no waiting gauge,
/// or a gauge that is no count (NaN, negative, infinite), which would otherwise read as an idle
/// engine (`NaN as u32` is 0) or overflow a router's sums (found by fuzz/http_front).
pub fn engine_load(text: &str) -> Option<EngineLoad> {
    let count = |v: f64| (v >= 0.0 && v.is_finite()).then_some(v.min(MOST_REQUESTS));
    let gauge = |names: &[&str]| first(text, names).map_or(Some(0.0), count);
    let waiting =
        count(first(text, &["vllm:num_requests_waiting", "sglang:num_queue_reqs", "llamacpp:requests_deferred"])?)?;
    let running = gauge(&["vllm:num_requests_running", "sglang:num_running_reqs", "llamacpp:requests_processing"])?;
    let kv_usage = gauge(&["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"])?.min(1.0);
    Some(EngineLoad { waiting, running, kv_usage })
}

/// An engine's prefix-cache counters, in prompt tokens since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PrefixCache {
    /// Prompt tokens found in the cache.
    pub hit_tokens: f64,
    /// Prompt tokens looked up (cached or not).
    pub query_tokens: f64,
}

/// The prefix-cache counters of vLLM (`prefix_cache_hits` / `prefix_cache_queries`), SGLang
/// (`cached_tokens` / `prompt_tokens`: its prompt count includes the cached ones) or llama.cpp
/// (`prompt_tokens_cached` / `prompt_tokens` + that: its prompt count excludes the cached ones);
/// `None` when the engine exposes none of them.
pub fn prefix_cache(text: &str) -> Option<PrefixCache> {
    if let Some(hits) = sum(text, "vllm:prefix_cache_hits_total") {
        let queries = sum(text, "vllm:prefix_cache_queries_total")?;
        return Some(PrefixCache { hit_tokens: hits, query_tokens: queries });
    }
    if let Some(hits) = sum(text, "sglang:cached_tokens_total") {
        let prompt = sum(text, "sglang:prompt_tokens_total")?;
        return Some(PrefixCache { hit_tokens: hits, query_tokens: prompt });
    }
    let hits = sum(text, "llamacpp:prompt_tokens_cached_total")?;
    let computed = sum(text, "llamacpp:prompt_tokens_total")?;
    Some(PrefixCache { hit_tokens: hits, query_tokens: hits + computed })
}

/// A sample value as Prometheus writes it: `+Inf`, `-Inf` and `NaN` for the non-finite ones
/// (Rust's `inf` is not valid exposition text).
pub fn value(v: f64) -> String {
    if v == f64::INFINITY {
        "+Inf".into()
    } else if v == f64::NEG_INFINITY {
        "-Inf".into()
    } else if v.is_nan() {
        "NaN".into()
    } else {
        v.to_string()
    }
}

/// Upper bounds (s) of the latency histograms' buckets.
pub const BUCKETS_S: [f64; 16] =
    [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

/// A histogram of seconds, updated without locks.
#[derive(Default)]
pub struct Histogram {
    counts: [AtomicU64; BUCKETS_S.len() + 1],
    sum_ns: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, seconds: f64) {
        let i = BUCKETS_S.iter().position(|&b| seconds <= b).unwrap_or(BUCKETS_S.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add((seconds * 1e9) as u64, Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    /// Writes the `_bucket`, `_sum` and `_count` lines of `name{labels}`.
    pub fn write(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0;
        for (i, c) in self.counts.iter().enumerate() {
            cumulative += c.load(Ordering::Relaxed);
            let le = BUCKETS_S.get(i).map_or("+Inf".to_string(), |b| b.to_string());
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {cumulative}");
        }
        let sum = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum{{{labels}}} {sum}\n{name}_count{{{labels}}} {cumulative}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// fuzz/http_front: `vllm:num_requests_waiting 1e308` became u32::MAX waiting (beyond the
    /// "full" mark, so a router's sums overflow), NaN became 0 (an idle engine).
    #[test]
    fn gauges_that_are_no_counts_make_the_scrape_unusable_and_huge_ones_are_capped() {
        let load = |t: &str| engine_load(t);
        for bad in ["NaN", "-1", "+Inf", "-Inf"] {
            assert_eq!(load(&format!("vllm:num_requests_waiting {bad}\n")), None, "waiting {bad}");
            let t = format!("vllm:num_requests_waiting 1\nvllm:num_requests_running {bad}\n");
            assert_eq!(load(&t), None, "running {bad}");
            let t = format!("vllm:num_requests_waiting 1\nvllm:kv_cache_usage_perc {bad}\n");
            assert_eq!(load(&t), None, "kv {bad}");
        }
        let huge = load("vllm:num_requests_waiting 1e308\nvllm:num_requests_running 5e9\n").unwrap();
        assert_eq!((huge.waiting, huge.running), (MOST_REQUESTS, MOST_REQUESTS));
        // Two label sets whose sum is infinite are no count either.
        assert_eq!(load("vllm:num_requests_waiting{a=\"1\"} 1e308\nvllm:num_requests_waiting{a=\"2\"} 1e308\n"), None);
        let fine = load("vllm:num_requests_waiting 3\nvllm:kv_cache_usage_perc 1.5\n").unwrap();
        assert_eq!((fine.waiting, fine.running, fine.kv_usage), (3.0, 0.0, 1.0));
    }

    #[test]
    fn reads_vllm_and_sglang_names_summing_label_sets() {
        let vllm = "# HELP x\nvllm:num_requests_waiting{model_name=\"a\"} 3\nvllm:num_requests_waiting{model_name=\"b\"} 2\n\
                    vllm:num_requests_running{model_name=\"a\"} 7 1700000000\nvllm:gpu_cache_usage_perc 0.25\n\
                    vllm:num_requests_waiting_total 99\n";
        assert_eq!(engine_load(vllm), Some(EngineLoad { waiting: 5.0, running: 7.0, kv_usage: 0.25 }));
        let sglang = "sglang:num_queue_reqs{tp_rank=\"0\"} 4\nsglang:num_running_reqs 1\nsglang:token_usage 0.5\n";
        assert_eq!(engine_load(sglang), Some(EngineLoad { waiting: 4.0, running: 1.0, kv_usage: 0.5 }));
        assert_eq!(engine_load("other_metric 1\n"), None);
    }

    #[test]
    fn reads_llama_cpps_names() {
        // As `llama-server --metrics` (llama.cpp in llama-cpp-python 0.3.36) writes them.
        let llama = "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed\n\
                     # TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 120\n\
                     llamacpp:prompt_tokens_cached_total 300\nllamacpp:requests_processing 2\n\
                     llamacpp:requests_deferred 1\nllamacpp:n_busy_slots_per_decode 1.5\n";
        assert_eq!(engine_load(llama), Some(EngineLoad { waiting: 1.0, running: 2.0, kv_usage: 0.0 }));
        assert_eq!(prefix_cache(llama), Some(PrefixCache { hit_tokens: 300.0, query_tokens: 420.0 }));
    }

    #[test]
    fn non_finite_values_are_written_as_prometheus_reads_them() {
        assert_eq!(
            (value(f64::INFINITY), value(f64::NEG_INFINITY), value(f64::NAN)),
            ("+Inf".into(), "-Inf".into(), "NaN".into())
        );
        assert_eq!(value(0.25), "0.25");
        assert_eq!(sum(&format!("x {}\n", value(f64::INFINITY)), "x"), Some(f64::INFINITY));
    }

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::default();
        h.observe(0.003);
        h.observe(0.003);
        h.observe(100.0);
        let mut s = String::new();
        h.write(&mut s, "t", "b=\"x\"");
        assert!(s.contains("t_bucket{b=\"x\",le=\"0.0025\"} 0\n"));
        assert!(s.contains("t_bucket{b=\"x\",le=\"0.005\"} 2\n"));
        assert!(s.contains("t_bucket{b=\"x\",le=\"+Inf\"} 3\n"));
        assert!(s.contains("t_count{b=\"x\"} 3"));
    }
}
