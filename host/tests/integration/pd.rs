//! Prefill/decode-disaggregated clusters end to end: PD routers loaded from the built-in plugin
//! library replay the linked-in ones bit for bit, the example PD crate loads and skips the
//! prefill pool, and bad PD input stops with exit code 2 naming file, line and field.

use std::process::Command;

use crate::common::*;

/// tool_use on 3 prefill + 5 decode A6000s.
pub(crate) fn pd_tool_use(requests: u64) -> String {
    std::fs::read_to_string(workspace().join("workloads/cluster/tool_use.yaml"))
        .unwrap()
        .replace("requests: 20000", &format!("requests: {requests}"))
        .replace("seeds: 3", "seeds: 2")
        .replace(
            "  replicas: 8\n",
            "  replicas: 8\n  disaggregation:\n    prefill: {instances: 3}\n    decode: {instances: 5}\n    link: {bandwidth_gbps: 100}\n",
        )
}

#[test]
fn pd_routers_are_bit_identical_from_the_plugin_library() {
    let lib = &plugins().builtin;
    let yaml = pd_tool_use(1200);
    let names = [
        "pd_random",
        "pd_round_robin",
        "pd_least_loaded",
        "pd_sglang{prefill: sglang_cache_aware, decode: power_of_two}",
        "pd_sglang{prefill: llm_d, decode: least_requests}",
        "pd_dynamo{conditional_disagg: true}",
        "pd_llm_d",
        "pd_aibrix",
        "pd_mooncake",
        "pd_mooncake{scheduling: random, tbt_slo_s: 0.03}",
    ];
    let linked: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    let loaded: Vec<String> = names.iter().map(|s| format!("{}:{s}", lib.display())).collect();
    let a = compare_text(&yaml, "pd.yaml", &linked);
    let b = compare_text(&yaml, "pd.yaml", &loaded);
    for (x, y) in a.results.iter().zip(&b.results) {
        assert!(x.error.is_none() && y.error.is_none(), "{:?} {:?}", x.error, y.error);
        let served = x.metrics.get("completed").unwrap() + x.metrics.get("rejected").unwrap();
        assert_eq!(served, 1200.0, "{}: every request completes or is rejected", x.policy);
        assert!(x.metrics.get("transfer_share").is_some_and(|s| s > 0.0), "{}", x.policy);
        assert_eq!(x.per_seed, y.per_seed, "{} differs when loaded", x.policy);
    }
    let tight = a.results.last().unwrap();
    assert!(tight.metrics.get("rejected").unwrap() > 0.0, "a 30 ms TBT SLO turns requests away");
    assert!(a.results.iter().any(|r| r.metrics.get("prefix_migrations").unwrap() > 0.0), "pd_mooncake migrates");
}

#[test]
fn the_example_pd_crate_skips_the_prefill_pool_when_little_is_uncached() {
    let lib = &plugins().pd_threshold;
    let yaml = pd_tool_use(800);
    let never = format!("never={}:pd_threshold{{threshold: 0}}", lib.display());
    let hot = format!("hot={}:pd_threshold{{threshold: 1500}}", lib.display());
    let w = compare_text(&yaml, "pd.yaml", &[never, hot]);
    for r in &w.results {
        assert!(r.error.is_none(), "{}: {:?}", r.policy, r.error);
        assert_eq!(r.metrics.get("completed"), Some(800.0));
    }
    assert_eq!(metric(&w, "never", "decode_only_share"), 0.0);
    let share = metric(&w, "hot", "decode_only_share");
    assert!(share > 0.1, "tool descriptions are hot: most prompts are mostly cached on decode ({share})");
    assert_eq!(metric(&w, "hot", "router.skipped_prefill"), share * 800.0);
}

pub(crate) fn scratch(name: &str, yaml: &str) -> String {
    let p = fixture("pd", name);
    std::fs::write(&p, yaml).unwrap();
    p.display().to_string()
}

/// `routelab compare FILE --policies POLICY` fails with exit 2 and names every fragment.
pub(crate) fn bad(file: &str, policy: &str, wanted: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_routelab"))
        .args(["compare", file, "--policies", policy])
        .output()
        .expect("routelab runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{file} {policy}: {err}");
    for w in wanted {
        assert!(err.contains(w), "{policy}: stderr lacks {w:?}: {err}");
    }
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn bad_pd_input_is_refused_with_exit_2() {
    let pd = pd_tool_use(50);
    let f = scratch("pd.yaml", &pd);
    bad(
        &f,
        "round_robin",
        &["cluster.disaggregation", "not a disaggregation router", "pd_sglang{prefill: round_robin"],
    );
    let agg = std::fs::read_to_string(workspace().join("workloads/cluster/tool_use.yaml")).unwrap();
    let f = scratch("agg.yaml", &agg);
    bad(&f, "pd_least_loaded", &["cluster.disaggregation", "is a disaggregation router", "aggregated"]);
    let f = scratch("zero.yaml", &pd.replace("decode: {instances: 5}", "decode: {instances: 0}"));
    bad(&f, "pd_random", &["zero.yaml", "cluster.disaggregation.decode.instances", "no instances"]);
    let bw = pd.replace("bandwidth_gbps: 100", "bandwidth_gbps: 0");
    let line = 1 + bw.lines().position(|l| l.contains("bandwidth_gbps")).unwrap();
    let f = scratch("bw.yaml", &bw);
    bad(&f, "pd_random", &[&format!("bw.yaml:{line}:"), "cluster.disaggregation.link.bandwidth_gbps", "fix:"]);
    for (field, tier) in [
        ("capacity_gb", "capacity_gb: 0, bandwidth_gbps: 100"),
        ("bandwidth_gbps", "capacity_gb: 64, bandwidth_gbps: -5"),
        ("base_latency_s", "capacity_gb: 64, bandwidth_gbps: 100, base_latency_s: -1"),
    ] {
        let tier = pd.replace(
            "link: {bandwidth_gbps: 100}\n",
            &format!("link: {{bandwidth_gbps: 100}}\n    shared_kv: {{{tier}}}\n"),
        );
        let line = 1 + tier.lines().position(|l| l.contains("shared_kv")).unwrap();
        let f = scratch("tier.yaml", &tier);
        bad(
            &f,
            "pd_random",
            &[&format!("tier.yaml:{line}:"), &format!("cluster.disaggregation.shared_kv.{field}"), "fix:"],
        );
    }
    let f = scratch("sum.yaml", &pd.replace("prefill: {instances: 3}", "prefill: {instances: 4}"));
    bad(&f, "pd_random", &["cluster.replicas", "set `replicas: 9`"]);
}

/// Issue 26: a link or a pool GPU so slow that a transfer or a step overflows the nanosecond clock
/// was accepted, and the wrapped times gave TTFTs lower than at 100 Gbit/s with exit 0.
#[test]
fn a_link_or_pool_gpu_beyond_the_clock_is_refused_with_exit_2() {
    let pd = pd_tool_use(50);
    for (name, yaml, field) in [
        (
            "slow_link.yaml",
            pd.replace("bandwidth_gbps: 100", "bandwidth_gbps: 1e-12"),
            "disaggregation.link.bandwidth_gbps",
        ),
        (
            "slow_tier.yaml",
            pd.replace(
                "link: {bandwidth_gbps: 100}\n",
                "link: {bandwidth_gbps: 100}\n    shared_kv: {capacity_gb: 64, bandwidth_gbps: 1e-12}\n",
            ),
            "disaggregation.shared_kv.bandwidth_gbps",
        ),
        (
            "slow_pool_gpu.yaml",
            pd.replace(
                "prefill: {instances: 3}",
                "prefill: {instances: 3, gpu: {name: slow, memory_gb: 48, bandwidth_gb_s: 768, tflops: 1e-300}}",
            ),
            "disaggregation.prefill.gpu",
        ),
        (
            "nan_pool_gpu.yaml",
            pd.replace(
                "decode: {instances: 5}",
                "decode: {instances: 5, gpu: {name: nan, memory_gb: .nan, bandwidth_gb_s: 768, tflops: 154.8}}",
            ),
            "disaggregation.decode",
        ),
    ] {
        let f = scratch(name, &yaml);
        bad(&f, "pd_random", &[name, field, "fix:"]);
        let out = Command::new(env!("CARGO_BIN_EXE_routelab")).args(["validate", &f]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "validate {name}: {err}");
        assert!(err.contains(field) && !err.contains("arrivals"), "validate {name}: {err}");
    }
}
