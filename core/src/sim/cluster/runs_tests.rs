//! Decode runs (`runs.rs`) change nothing: the same run with every step queued and with plain
//! decode steps advanced in runs gives the same outcome, bit for bit, and the runs carry most
//! steps where they apply.

use super::class_tests::{classes_preset, run_with};
use super::tests::preset;
use super::*;

/// The outcome of `sim` run to its horizon, the planned step ends its runs applied, and its
/// steps in all.
fn outcome(mut sim: ClusterSim) -> (RunOutcome, Option<u64>, u64) {
    sim.run_to_horizon().unwrap();
    let applied = sim.decode_run_steps();
    let steps = sim.replicas.iter().map(|r| r.steps()).sum();
    (sim.finish().unwrap(), applied, steps)
}

/// `router` (behind `admission`) on `spec`, seed 1: queued step by step, then with runs; and
/// the share of the steps the runs applied.
fn both(spec: &ClusterSpec, router: &str, admission: Option<&str>) -> (RunOutcome, RunOutcome, f64) {
    let (queued, none, _) = run_with(spec, router, admission, 1, |sim| outcome(sim.without_decode_runs()));
    assert_eq!(none, None, "runs off");
    let (ran, applied, steps) = run_with(spec, router, admission, 1, outcome);
    (queued, ran, applied.expect("runs apply to this cluster") as f64 / steps as f64)
}

/// The same metrics and per-request records, floats by their printed bits (NaN included).
fn same(a: &RunOutcome, b: &RunOutcome, what: &str) {
    assert_eq!(format!("{:?}", a.metrics), format!("{:?}", b.metrics), "{what}: metrics");
    assert_eq!(a.records.len(), b.records.len(), "{what}: records");
    for (i, (x, y)) in a.records.iter().zip(&b.records).enumerate() {
        assert_eq!(format!("{x:?}"), format!("{y:?}"), "{what}: request {i}");
    }
    assert_eq!(format!("{a:?}"), format!("{b:?}"), "{what}: the outcomes");
}

/// Agent sessions (tool pauses release calls at any time) on a cache that evicts every step,
/// and a router that hears every cut (the runs stop short of one).
#[test]
fn runs_change_no_outcome_and_carry_most_steps() {
    let mut agent = preset("agentic/coding_agent");
    agent.requests = Some(600);
    let mut tools = preset("tool_use");
    tools.requests = Some(1500);
    for (spec, router, least) in
        [(&agent, "least_work_left", 0.5), (&agent, "dynamo_kv", 0.0), (&tools, "sglang_cache_aware", 0.0)]
    {
        let (queued, ran, share) = both(spec, router, None);
        same(&queued, &ran, router);
        assert!(share > least, "{router}: {share} of the steps in runs");
    }
}

/// Admission policies that hold requests through an overload (VTC, and the Gateway API
/// Inference Extension's flow control): a held request may be released at any step end, so
/// runs pause while one is held; the outcome is the same.
#[test]
fn runs_pause_while_admission_holds_a_request() {
    let mut spec = classes_preset();
    spec.requests = Some(1500);
    for a in ["vtc{weights: [4, 2, 1, 1]}", "llm_d_flow_control{ttl_s: 20}"] {
        spec.admission = a.into();
        let (queued, ran, share) = both(&spec, "least_requests", Some(a));
        assert!(queued.metrics.get("held_requests").is_some_and(|h| h > 0.0), "{a}: requests were held");
        assert!(share > 0.0, "{a}: runs between the holds");
        same(&queued, &ran, a);
    }
}
