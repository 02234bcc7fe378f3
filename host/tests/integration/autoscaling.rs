//! Autoscaling (`cluster.autoscaling`, the scaler kind of policy-api 0.5.4, issue 28): a built-in
//! scaler decides the same linked in or loaded from the built-in plugin; bad specs stop with exit
//! code 2 naming file, line and field.

use crate::common::*;
use crate::pd::{bad, scratch};

/// The diurnal preset shortened to a 5-minute day, with `scaler` and one seed.
fn short_day(scaler: &str) -> String {
    std::fs::read_to_string(workspace().join("workloads/cluster/diurnal.yaml"))
        .unwrap()
        .replace("    scaler: hpa\n", &format!("    scaler: \"{scaler}\"\n"))
        .replace("period_s: 1200}", "period_s: 300}")
        .replace("duration_s: 1200", "duration_s: 300")
        .replace("seeds: 3", "seeds: 1")
}

/// The same scaler, linked or loaded from `libroutelab_builtin_plugin.so`, gives the same run bit
/// for bit (its decisions, so every figure) — and the fleet did change.
#[test]
fn a_scaler_decides_the_same_linked_or_loaded() {
    let lib = plugins().builtin.display().to_string();
    for name in ["hpa{metric: requests, target: 8}", "dynamo_planner", "llm_d_wva"] {
        let linked = compare_text(&short_day(name), "day.yaml", &["least_requests".into()]);
        let loaded = compare_text(&short_day(&format!("{lib}:{name}")), "day.yaml", &["least_requests".into()]);
        let (a, b) = (&linked.results[0], &loaded.results[0]);
        assert!(a.error.is_none() && b.error.is_none(), "{name}: {:?} {:?}", a.error, b.error);
        let bits = |m: &routelab_core::metrics::Metrics| -> Vec<(String, u64)> {
            m.0.iter().map(|(k, v)| (k.clone(), v.to_bits())).collect()
        };
        assert_eq!(bits(&a.per_seed[0]), bits(&b.per_seed[0]), "{name}");
        assert!(a.per_seed[0].get("scale_ups").unwrap() > 0.0, "{name}: the fleet never grew");
    }
}

#[test]
fn bad_autoscaling_is_refused_with_exit_2_naming_line_and_field() {
    let day = std::fs::read_to_string(workspace().join("workloads/cluster/diurnal.yaml")).unwrap();
    let line_of = |yaml: &str, key: &str| 1 + yaml.lines().position(|l| l.trim_start().starts_with(key)).unwrap();
    for (field, from, to, why) in [
        ("max_replicas", "max_replicas: 10", "max_replicas: 1", "starting replicas (2)"),
        ("interval_s", "interval_s: 15", "interval_s: 0", "must be positive"),
        ("min_replicas", "min_replicas: 1", "min_replicas: 0", "at least 1"),
        ("scaler", "scaler: hpa", "scaler: hpx", "'hpx'"),
    ] {
        let yaml = day.replace(from, to);
        let f = scratch("autoscaling.yaml", &yaml);
        let line = line_of(&yaml, to.split(':').next().unwrap());
        // An unknown scaler is named with the built-ins to choose from (as an unknown router is).
        let (located, path) = match field {
            "scaler" => (String::new(), "hpa, dynamo_planner, llm_d_wva".to_string()),
            _ => (format!("autoscaling.yaml:{line}:"), format!("cluster.autoscaling.{field}")),
        };
        bad(&f, "least_requests", &[&located, &path, why, "fix:"]);
    }
    // A scaler's own config is checked before any run.
    let f = scratch("autoscaling.yaml", &day.replace("scaler: hpa", "scaler: \"hpa{metric: gpu}\""));
    bad(&f, "least_requests", &["metric 'gpu'", "kv_utilisation"]);
}

/// On a P/D cluster each built-in scaler decides the same linked or loaded, and answers for both
/// pools (each pool's bill is in the run's figures).
#[test]
fn a_scaler_decides_both_pools_the_same_linked_or_loaded() {
    let lib = plugins().builtin.display().to_string();
    let pd_day = crate::fleet::pd_day;
    for name in ["hpa{metric: requests, target: 4}", "dynamo_planner", "llm_d_wva"] {
        let linked = compare_text(&pd_day(name), "pd_day.yaml", &["pd_least_loaded".into()]);
        let loaded = compare_text(&pd_day(&format!("{lib}:{name}")), "pd_day.yaml", &["pd_least_loaded".into()]);
        let (a, b) = (&linked.results[0], &loaded.results[0]);
        assert!(a.error.is_none() && b.error.is_none(), "{name}: {:?} {:?}", a.error, b.error);
        let bits = |m: &routelab_core::metrics::Metrics| -> Vec<(String, u64)> {
            m.0.iter().map(|(k, v)| (k.clone(), v.to_bits())).collect()
        };
        assert_eq!(bits(&a.per_seed[0]), bits(&b.per_seed[0]), "{name}");
        let m = &a.per_seed[0];
        assert!(m.get("replica_seconds_prefill").unwrap() > 0.0 && m.get("replica_seconds_decode").unwrap() > 0.0);
        assert!(m.get("scale_ups").unwrap() > 0.0, "{name}: the fleet never grew: {m:?}");
    }
}

/// Bad P/D autoscaling stops with exit 2 naming file, line, the field and a fix.
#[test]
fn bad_pd_autoscaling_is_refused_with_exit_2_naming_line_and_field() {
    let day = std::fs::read_to_string(workspace().join("workloads/cluster/pd/autoscaling.yaml")).unwrap();
    let line_of = |yaml: &str, key: &str| 1 + yaml.lines().position(|l| l.trim_start().starts_with(key)).unwrap();
    let yaml =
        day.replace("prefill: {min_replicas: 1, max_replicas: 6}", "prefill: {min_replicas: 1, max_replicas: 1}");
    let f = scratch("pd_autoscaling.yaml", &yaml);
    let at = format!("pd_autoscaling.yaml:{}:", line_of(&yaml, "prefill: {min_replicas"));
    bad(
        &f,
        "pd_least_loaded",
        &[&at, "cluster.autoscaling.pools.prefill.max_replicas", "starting instances (2)", "fix:"],
    );
    let start = day.find("    pools:").unwrap();
    let end = day.find("  generator:").unwrap();
    let yaml = format!("{}{}", &day[..start], &day[end..]);
    let f = scratch("pd_autoscaling.yaml", &yaml);
    bad(&f, "pd_least_loaded", &["cluster.autoscaling.pools", "is missing", "fix:"]);
}
