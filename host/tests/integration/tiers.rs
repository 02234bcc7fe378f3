//! Per-replica KV tiers (`cluster.kv_tiers`, issue 28) at the command line: bad tiers stop with
//! exit code 2 naming file, line and field, before any run.

use crate::common::*;
use crate::pd::{bad, pd_tool_use, scratch};

/// tool_use with `kv_tiers: TIERS` under `cluster:`; the line of `kv_tiers`.
fn tiered(tiers: &str) -> (String, usize) {
    let yaml = std::fs::read_to_string(workspace().join("workloads/cluster/tool_use.yaml"))
        .unwrap()
        .replace("  replicas: 8\n", &format!("  replicas: 8\n  kv_tiers: {tiers}\n"));
    let line = 1 + yaml.lines().position(|l| l.contains("kv_tiers")).unwrap();
    (yaml, line)
}

#[test]
fn bad_kv_tiers_are_refused_with_exit_2_naming_line_and_field() {
    for (field, tiers, why) in [
        ("cpu.capacity_gb", "{cpu: {capacity_gb: 0, bandwidth_gbps: 400}}", "positive number of GB"),
        ("cpu.bandwidth_gbps", "{cpu: {capacity_gb: 64, bandwidth_gbps: -1}}", "positive number of Gbit/s"),
        ("cpu.base_latency_s", "{cpu: {capacity_gb: 64, bandwidth_gbps: 400, base_latency_s: -1}}", "[0, 10]"),
        // A whole replica's KV over this link would overflow the nanosecond clock.
        ("cpu.bandwidth_gbps", "{cpu: {capacity_gb: 64, bandwidth_gbps: 1e-12}}", "clock"),
        (
            "remote.capacity_gb",
            "{cpu: {capacity_gb: 64, bandwidth_gbps: 400}, remote: {capacity_gb: .nan, bandwidth_gbps: 100}}",
            "positive number of GB",
        ),
        ("cpu.speed", "{cpu: {capacity_gb: 64, bandwidth_gbps: 400, speed: 2}}", "unknown field"),
        ("", "{layerwise: true}", "missing field `cpu`"),
    ] {
        let (yaml, line) = tiered(tiers);
        let f = scratch("tiers.yaml", &yaml);
        let path = if field.is_empty() { "cluster.kv_tiers".to_string() } else { format!("cluster.kv_tiers.{field}") };
        bad(&f, "round_robin", &[&format!("tiers.yaml:{line}:"), &path, why, "fix:"]);
    }
    // A disaggregated cluster takes CPU tiers under its prefill instances, but its shared tier is
    // `shared_kv`, not `kv_tiers.remote`.
    let pd = pd_tool_use(50).replace(
        "  replicas: 8\n",
        "  replicas: 8\n  kv_tiers: {cpu: {capacity_gb: 64, bandwidth_gbps: 400}, remote: {capacity_gb: 900, bandwidth_gbps: 100}}\n",
    );
    let f = scratch("pd_tiers.yaml", &pd);
    bad(&f, "pd_random", &["cluster.kv_tiers.remote", "disaggregation.shared_kv"]);
}
