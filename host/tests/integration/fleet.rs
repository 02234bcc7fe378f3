//! A living fleet (issue 28): the stateful built-in routers stay correct while replicas leave
//! and join — two crashes (one shifting every index above it) and an autoscaled day with
//! scale-ups and drains — linked in or loaded from the built-in plugin, bit for bit; bad
//! `failures:` input stops with exit code 2 naming file, line, field and the fix.

use std::process::Command;

use crate::common::*;
use routelab_core::metrics::Metrics;

/// The routers that keep per-replica state of their own (prefix indices, in-flight counts).
const STATEFUL: [&str; 8] = [
    "llm_d",
    "llm_d{prefix_state: precise, no_hit_lru_weight: 1}",
    "dynamo_kv",
    "aibrix_prefix_cache",
    "vllm_prefix_aware",
    "chwbl",
    "ray_prefix_aware",
    "preble",
];

fn bits(m: &Metrics) -> Vec<(String, u64)> {
    m.0.iter().map(|(k, v)| (k.clone(), v.to_bits())).collect()
}

/// `crash.yaml` cut to 30 s, one seed: replica 0 crashes at 8 s (every index above it moves
/// down), replica 5 at 12 s; both are back, cold, 6 s later.
fn crashes() -> String {
    std::fs::read_to_string(workspace().join("workloads/cluster/crash.yaml"))
        .unwrap()
        .replace("crashes: [{replica: 0, at_s: 40}]", "crashes: [{replica: 0, at_s: 8}, {replica: 5, at_s: 12}]")
        .replace("restart_s: 30", "restart_s: 6")
        .replace("duration_s: 120", "duration_s: 30")
        .replace("seeds: 3", "seeds: 1")
}

/// The diurnal preset shortened to a 4-minute day with an eager scaler (a 5 s interval, a 20 s
/// scale-down window): the fleet grows from 2 and drains again.
fn day() -> String {
    std::fs::read_to_string(workspace().join("workloads/cluster/diurnal.yaml"))
        .unwrap()
        .replace("    scaler: hpa\n", "    scaler: \"hpa{metric: requests, target: 8, scale_down_window_s: 20}\"\n")
        .replace("interval_s: 15", "interval_s: 5")
        .replace("model_load_s: 60", "model_load_s: 10")
        .replace("period_s: 1200}", "period_s: 240}")
        .replace("duration_s: 1200", "duration_s: 240")
        .replace("seeds: 3", "seeds: 1")
}

/// `day()` with crashes while the fleet scales: random ones (a mean of 60 s a replica) and
/// replica 0 at 30 s, each back 10 s later, lost requests routed again up to twice.
fn failing_day() -> String {
    day().replace(
        "  generator:\n",
        "  failures: {crashes: [{replica: 0, at_s: 30}], mtbf_s: 60, restart_s: 10, max_retries: 2}\n  generator:\n",
    )
}

/// Runs every stateful router on `yaml` linked and loaded: each run ends every request
/// (completed or failed, none left over), and the two runs agree bit for bit.
fn survives(yaml: &str, name: &str, changed: &dyn Fn(&Metrics) -> bool) {
    let lib = plugins().builtin.display().to_string();
    let linked: Vec<String> = STATEFUL.iter().map(|s| s.to_string()).collect();
    let loaded: Vec<String> = STATEFUL.iter().map(|s| format!("{lib}:{s}")).collect();
    let (a, b) = (compare_text(yaml, name, &linked), compare_text(yaml, name, &loaded));
    for (x, y) in a.results.iter().zip(&b.results) {
        assert!(x.error.is_none() && y.error.is_none(), "{}: {:?} / {:?}", x.policy, x.error, y.error);
        let m = &x.per_seed[0];
        assert!(changed(m), "{}: the fleet never changed: {m:?}", x.policy);
        assert_eq!(bits(m), bits(&y.per_seed[0]), "{}: linked ≠ loaded", x.policy);
    }
    each_ended_once(&a, name);
}

/// Every router of `w` ended each request of the (shared) stream once: the served ones
/// (`requests`, which leaves the failed out) all completed, and served + failed is the same
/// count whichever router ran.
fn each_ended_once(w: &routelab_core::runner::WorkloadResult, name: &str) {
    let mut arrived = None;
    for r in &w.results {
        assert!(r.error.is_none(), "{name}: {}: {:?}", r.policy, r.error);
        let m = &r.per_seed[0];
        let n = |k: &str| m.get(k).unwrap_or(0.0);
        assert_eq!((n("unfinished"), n("completed")), (0.0, n("requests")), "{name}: {}: {m:?}", r.policy);
        let all = n("requests") + n("failed_requests");
        assert_eq!(*arrived.get_or_insert(all), all, "{name}: {}: {m:?}", r.policy);
    }
}

#[test]
fn stateful_routers_survive_crashes_linked_or_loaded() {
    // (A router that herds every request onto one replica — `vllm_prefix_aware` here — may lose none.)
    survives(&crashes(), "crashes.yaml", &|m| m.get("crashes") == Some(2.0));
}

#[test]
fn stateful_routers_survive_crashes_in_a_scaling_fleet_linked_or_loaded() {
    survives(&failing_day(), "failing_day.yaml", &|m| m.get("crashes") >= Some(3.0) && m.get("scale_ups") > Some(0.0));
}

#[test]
fn stateful_routers_survive_scale_ups_and_drains_linked_or_loaded() {
    // A router that overloads the fleet (`vllm_prefix_aware` herds onto one replica) never lets
    // it shrink; every other one sees it grow and drain.
    survives(&day(), "day.yaml", &|m| {
        m.get("scale_ups") > Some(0.0) && (m.get("scale_downs") > Some(0.0) || m.get("overloaded") == Some(1.0))
    });
}

/// The built-in routers' names: the P/D ones (`pd_…`), or every other one.
fn built_in_routers(pd: bool) -> Vec<String> {
    let mut loader = routelab_core::plugin::Loader::new();
    let routers = loader.list(None).unwrap().into_iter();
    routers
        .filter(|l| l.kind == routelab_policy_api::PolicyKind::Router && l.name.starts_with("pd_") == pd)
        .map(|l| l.name)
        .collect()
}

/// Every aggregated built-in router (the view-only ones too), linked: each run through the
/// crashes and the scaled day ends every request, with no answer out of range.
#[test]
fn every_aggregated_router_survives_crashes_and_scaling() {
    let routers = built_in_routers(false);
    assert!(routers.len() >= 19, "{routers:?}");
    for (yaml, name) in [(crashes(), "crashes.yaml"), (day(), "day.yaml"), (failing_day(), "failing_day.yaml")] {
        each_ended_once(&compare_text(&yaml, name, &routers), name);
    }
}

/// The P/D autoscaling preset shortened to a 4-minute day with an eager scaler (a 5 s interval,
/// a 10 s model load): both pools grow from 2 + 2 and drain again.
pub(crate) fn pd_day(scaler: &str) -> String {
    std::fs::read_to_string(workspace().join("workloads/cluster/pd/autoscaling.yaml"))
        .unwrap()
        .replace("    scaler: dynamo_planner\n", &format!("    scaler: \"{scaler}\"\n"))
        .replace("interval_s: 15", "interval_s: 5")
        .replace("model_load_s: 60", "model_load_s: 10")
        .replace("period_s: 1200}", "period_s: 240}")
        .replace("duration_s: 1200", "duration_s: 240")
        .replace("seeds: 3", "seeds: 1")
}

/// Every P/D built-in router, linked, through the scaled P/D day (instances joining and leaving
/// each pool's candidates), with and without random crashes: each run ends every request, with
/// no answer out of range, and the fleet both grew and shrank.
#[test]
fn every_pd_router_survives_both_pools_scaling() {
    let routers = built_in_routers(true);
    assert!(routers.len() >= 6, "{routers:?}");
    let day = pd_day("dynamo_planner");
    let failing =
        day.replace("  generator:\n", "  failures: {mtbf_s: 60, restart_s: 10, max_retries: 2}\n  generator:\n");
    for (yaml, name) in [(day, "pd_day.yaml"), (failing, "pd_failing_day.yaml")] {
        let w = compare_text(&yaml, name, &routers);
        // As `each_ended_once`, with the requests a P/D router rejects (`pd_mooncake` under
        // overload) counted beside the served and the failed.
        let mut arrived = None;
        for r in &w.results {
            assert!(r.error.is_none(), "{name}: {}: {:?}", r.policy, r.error);
            let m = &r.per_seed[0];
            let n = |k: &str| m.get(k).unwrap_or(0.0);
            assert_eq!((n("unfinished"), n("completed")), (0.0, n("requests")), "{name}: {}: {m:?}", r.policy);
            let all = n("requests") + n("failed_requests") + n("rejected");
            assert_eq!(*arrived.get_or_insert(all), all, "{name}: {}: {m:?}", r.policy);
            assert!(m.get("scale_ups") > Some(0.0) && m.get("scale_downs") > Some(0.0), "{name}: {}: {m:?}", r.policy);
        }
    }
}

/// `routelab compare FILE --policies round_robin` on `yaml` fails with exit 2 naming each of `wanted`.
fn refused(name: &str, yaml: &str, wanted: &[&str]) {
    let f = fixture("fleet", name);
    std::fs::write(&f, yaml).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_routelab"))
        .args(["compare", &f.display().to_string(), "--policies", "round_robin"])
        .output()
        .expect("routelab runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{name}: {err}");
    for w in wanted {
        assert!(err.contains(w), "{name}: stderr lacks {w:?}: {err}");
    }
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn bad_failures_are_refused_with_exit_2_naming_file_line_field_and_fix() {
    let crash = std::fs::read_to_string(workspace().join("workloads/cluster/crash.yaml")).unwrap();
    let line_of = |yaml: &str, key: &str| 1 + yaml.lines().position(|l| l.trim_start().starts_with(key)).unwrap();
    let at = "crashes: [{replica: 0, at_s: 40}]";
    for (i, (field, to, why)) in [
        ("crashes[0].replica", "crashes: [{replica: 8, at_s: 40}]", "cluster has 8 replicas"),
        ("crashes[0].at_s", "crashes: [{replica: 0, at_s: -1}]", "must be ≥ 0"),
        ("crashes", "crashes: []", "nothing would fail"),
        ("mtbf_s", "crashes: []\n    mtbf_s: 0", "must be positive"),
        ("restart_s", "crashes: [{replica: 0, at_s: 40}]\n    restart_s: -5", "must be ≥ 0"),
    ]
    .into_iter()
    .enumerate()
    {
        let mut yaml = crash.replace(at, to);
        if field == "restart_s" {
            yaml = yaml.replacen("    restart_s: 30\n", "", 1);
        }
        let key = field.split(['.', '[']).next().unwrap();
        let key = if field == "crashes" || field.starts_with("crashes[") { "crashes" } else { key };
        let line = line_of(&yaml, &format!("{key}:"));
        let name = format!("failures_{i}.yaml");
        let located = format!("{name}:{line}:");
        refused(&name, &yaml, &[&located, &format!("cluster.failures.{field}"), why, "fix:"]);
    }
    // A field the section does not know; with autoscaling, a crash may name any slot up to
    // `max_replicas`, and no further.
    let yaml = crash.replace("max_retries: 1", "max_retry: 1");
    refused("failures_unknown.yaml", &yaml, &["failures_unknown.yaml", "max_retry", "max_retries"]);
    let scaled = |at: &str| {
        crash.replace(
            "  failures:\n",
            "  autoscaling: {scaler: hpa, interval_s: 15, model_load_s: 60, min_replicas: 1, max_replicas: 9}\n  failures:\n",
        )
        .replace("crashes: [{replica: 0, at_s: 40}]", at)
    };
    refused(
        "failures_scaled.yaml",
        &scaled("crashes: [{replica: 9, at_s: 40}]"),
        &["cluster.failures.crashes[0].replica", "fix:"],
    );
    let ok = routelab(&["validate", &{
        let f = fixture("fleet", "failures_scaled_ok.yaml");
        std::fs::write(&f, scaled("crashes: [{replica: 8, at_s: 40}]")).unwrap();
        f.display().to_string()
    }]);
    assert!(ok.status.success(), "slot 8 of 9 may crash: {}", String::from_utf8_lossy(&ok.stderr));
}
