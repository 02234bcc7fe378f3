//! Snapshot tests of the reports: the terminal table, JSON and CSV of tiny fixed-seed workloads
//! in each world, compared with the committed files in `snapshots/`. A change to what a report
//! shows, or to any figure, shows up here as a diff. After an intended change, rerun with
//! `UPDATE_SNAPSHOTS=1` and review the diff of the files before committing them.

use std::path::PathBuf;

use routelab::report;
use routelab_core::runner::WorkloadResult;

use crate::common::compare_text;

fn snapshot(name: &str, actual: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/integration/snapshots").join(name);
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; run with UPDATE_SNAPSHOTS=1 to create it", path.display()));
    if expected != actual {
        let first = expected
            .lines()
            .zip(actual.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(expected.lines().count().min(actual.lines().count()));
        panic!(
            "{name} differs from the snapshot at line {}:\n  expected: {:?}\n  actual:   {:?}\n(UPDATE_SNAPSHOTS=1 rewrites it)\n--- actual ---\n{actual}",
            first + 1,
            expected.lines().nth(first),
            actual.lines().nth(first)
        );
    }
}

fn check_all(stem: &str, w: &WorkloadResult) {
    assert!(
        w.results.iter().all(|r| r.error.is_none()),
        "{:?}",
        w.results.iter().map(|r| &r.error).collect::<Vec<_>>()
    );
    snapshot(&format!("{stem}.table.txt"), &report::table::render(w, false, None));
    snapshot(&format!("{stem}.json"), &report::json::render("compare", std::slice::from_ref(w)));
    snapshot(&format!("{stem}.csv"), &report::csv::render(std::slice::from_ref(w)));
}

fn policies(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

#[test]
fn dispatch_reports_match_their_snapshots() {
    let yaml = "name: tiny_dispatch\nseed: 3\nseeds: 2\ndispatch: {servers: 4, utilisation: 0.8, requests: 2000}\n";
    let w = compare_text(yaml, "tiny_dispatch.yaml", &policies(&["random", "least_requests", "power_of_two{d: 2}"]));
    check_all("dispatch", &w);
}

#[test]
fn cluster_reports_match_their_snapshots() {
    let yaml = "name: tiny_cluster\nseed: 5\ncluster:\n  replicas: 2\n  generator: {contexts: {count: 4, tokens: 2000}, suffix_tokens: 50, output_tokens: 8}\n  \
                arrivals: {poisson: {rate: 4.0}}\n  requests: 120\n";
    let w = compare_text(yaml, "tiny_cluster.yaml", &policies(&["round_robin", "threshold_affinity@lpm", "preble"]));
    check_all("cluster", &w);
}

#[test]
fn compound_reports_match_their_snapshots() {
    let text = std::fs::read_to_string(crate::common::workspace().join("workloads/compound/case_study.yaml")).unwrap();
    let w = compare_text(&text, "case_study.yaml", &policies(&["greedy", "llmselector"]));
    check_all("compound", &w);
}
