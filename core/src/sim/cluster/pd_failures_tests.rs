//! Crashes on disaggregated clusters (`pd_failures.rs`): a decode instance lost mid-decode, a
//! prefill instance lost mid-prefill (and its restart), a request orphaned by its decode
//! instance while it prefills elsewhere — each with the notices the router hears, in order —
//! and conservation and determinism under random crashes with the P/D built-ins.

use std::cell::RefCell;

use routelab_policy_api::{
    Completion, Maker, PdPool, PdRoute, PdRouterPolicy, Policy, ReplicaChange, Replicas, Request, RouterContext,
};

use super::failures_tests::stream;
use super::*;
use crate::plugin::{Loader, PolicySpec};
use crate::runner::run_cluster;

thread_local! {
    /// What the `Recorder` router heard, in order (the sim runs on the test's thread).
    static HEARD: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

fn hear(line: String) {
    HEARD.with(|h| h.borrow_mut().push(line));
}

/// Prefill on candidate 0, decode on candidate 0; logs every notice and the pools' sizes.
struct Recorder;

impl Policy for Recorder {
    const NAME: &'static str = "recorder";
    const DESCRIPTION: &'static str = "both pools' index 0, logging";
    type Config = ();
    type Context = RouterContext;
    fn new(_: (), _: &RouterContext) -> Result<Self, String> {
        Ok(Recorder)
    }
}

impl PdRouterPolicy for Recorder {
    fn route_pair(&mut self, r: &Request<'_>, prefill: &Replicas<'_>, decode: &Replicas<'_>) -> PdRoute {
        hear(format!("route {} among {}+{}", r.id, prefill.len(), decode.len()));
        PdRoute::pair(0, 0)
    }
    fn on_prefill_complete(&mut self, c: &Completion) {
        hear(format!("prefilled {} on {}", c.request_id, c.replica));
    }
    fn on_complete(&mut self, c: &Completion) {
        hear(format!("complete {} on {}", c.request_id, c.replica));
    }
    fn on_abandon(&mut self, c: &Completion) {
        hear(format!("abandon {} on {}", c.request_id, c.replica));
    }
    fn on_pool_change(&mut self, pool: PdPool, c: &ReplicaChange) {
        let how = if c.joined { "join" } else { "leave" };
        hear(format!("{pool:?} {how} {} of {} at {}", c.replica, c.routable, c.at));
    }
    fn on_mixed_change(&mut self, p: &ReplicaChange, d: &ReplicaChange) {
        let how = if p.joined { "join" } else { "leave" };
        hear(format!("Mixed {how} {} of {} / {} of {} at {}", p.replica, p.routable, d.replica, d.routable, p.at));
    }
}

/// `prefill` + `decode` instances (A6000s, unchunked prefill), `extra` adding fields.
fn pd(prefill: u32, decode: u32, extra: &str) -> ClusterSpec {
    pd_mixed(prefill, 0, decode, extra)
}

/// `prefill` + `mixed` + `decode` instances (see [`pd`]).
fn pd_mixed(prefill: u32, mixed: u32, decode: u32, extra: &str) -> ClusterSpec {
    let mixed_pool = if mixed > 0 { format!("  mixed: {{instances: {mixed}}}\n") } else { String::new() };
    serde_norway::from_str(&format!(
        "replicas: {}\nchunk_tokens: 0\ndisaggregation:\n  prefill: {{instances: {prefill}}}\n  \
         decode: {{instances: {decode}}}\n{mixed_pool}  link: {{bandwidth_gbps: 100, base_latency_s: 0.0005}}\n{extra}\n\
         generator: {{output_tokens: 1}}\narrivals: {{poisson: {{rate: 1}}}}\nrequests: 3\n",
        prefill + mixed + decode
    ))
    .unwrap()
}

/// Runs `spec` on requests `rows` with the `Recorder`; returns the outcome and what it heard.
fn run(spec: &ClusterSpec, rows: &[(f64, u64, u32, u32)]) -> (RunOutcome, Vec<String>) {
    HEARD.with(|h| h.borrow_mut().clear());
    let resolved = StepModels::resolve(spec).unwrap();
    let ctx = router_context_for(spec, &resolved, 1);
    let Maker::Router(make) = routelab_policy_api::pd_router::<Recorder>().make else { unreachable!() };
    let out = run_cluster(spec, &stream(rows), make("", &ctx).unwrap(), "recorder", 1).unwrap();
    (out, HEARD.with(|h| h.borrow().clone()))
}

fn crash(slot: u32, at: f64, retries: u32) -> String {
    format!("failures: {{crashes: [{{replica: {slot}, at_s: {at}}}], restart_s: 100, max_retries: {retries}}}")
}

/// One prefill, two decode instances; a request decoding 2,000 tokens on decode slot 1 (decode
/// candidate 0) when it crashes at 5 s. The router hears the abandon (decode candidate 0), then
/// the decode pool's change (candidate 0 left, 1 remain); the request is routed again among
/// 1 + 1, prefills again (a second `prefilled`), and completes on slot 2 — now decode candidate
/// 0. Its first token is the one the client saw before the crash; it starts its output over,
/// so it ends later than without the crash by at least the decode time it had spent. The
/// restarted instance joins at the top (candidate 1) after the run's last request. With no
/// retry it fails.
#[test]
fn a_request_lost_with_its_decode_instance_is_routed_again_and_starts_its_output_over() {
    let rows = [(0.0, 7, 1000, 2000)];
    let (calm, _) = run(&pd(1, 2, ""), &rows);
    let (out, heard) = run(&pd(1, 2, &crash(1, 5.0, 1)), &rows);
    let (c, r) = (&calm.records[0], &out.records[0]);
    assert!(c.first_token_at_s < 5.0 && c.completed_at_s > 5.0, "{c:?}");
    assert_eq!((c.replica, r.replica), (1, 2), "calm on slot 1; retried on slot 2");
    assert_eq!(r.first_token_at_s, c.first_token_at_s, "the first token the client saw stands");
    assert!(r.completed_at_s - c.completed_at_s > 5.0 - c.first_token_at_s, "{r:?} vs {c:?}");
    let want = [
        "route 0 among 1+2",
        "prefilled 0 on 0",
        "abandon 0 on 0",
        "Decode leave 0 of 1 at 5",
        "route 0 among 1+1",
        "prefilled 0 on 0",
        "complete 0 on 0",
        "Decode join 1 of 2 at 105",
    ];
    assert_eq!(heard, want);
    let m = &out.metrics;
    let got = ["crashes", "requests_lost", "retried_requests", "failed_requests", "completed"].map(|k| m.get(k));
    assert_eq!(got, [Some(1.0), Some(1.0), Some(1.0), Some(0.0), Some(1.0)], "{m:?}");

    let (out, heard) = run(&pd(1, 2, &crash(1, 5.0, 0)), &rows);
    assert_eq!(out.records[0].end, End::Failed);
    assert_eq!(heard[..4], want[..4]);
    assert_eq!(heard[4..], ["Decode join 1 of 2 at 105"], "nothing for the failed request: {heard:?}");
}

/// Two prefill instances, one decode; a 30,000-token prompt prefilling on slot 0 (prefill
/// candidate 0) when it crashes at 0.5 s: the router hears the abandon (decode candidate 0, no
/// `prefilled` before or after for the lost attempt), the prefill pool's change, and routes it
/// again among 1 + 1: prefill candidate 0 is slot 1 now. Slot 0 restarts at 10.5 s and joins as
/// prefill candidate 1; the decode candidate's index never moved. A second request, after the
/// restart, sees 2 + 1 again.
#[test]
fn a_prefill_instance_lost_mid_prefill_leaves_and_rejoins_its_pool_at_the_top() {
    let rows = [(0.0, 7, 30_000, 4), (20.0, 8, 100, 2)];
    let spec = pd(2, 1, "failures: {crashes: [{replica: 0, at_s: 0.5}], restart_s: 10, max_retries: 1}");
    let (calm, _) = run(&pd(2, 1, ""), &rows);
    assert!(calm.records[0].first_token_at_s > 0.5, "the prefill outlasts the crash: {:?}", calm.records[0]);
    let (out, heard) = run(&spec, &rows);
    let want = [
        "route 0 among 2+1",
        "abandon 0 on 0",
        "Prefill leave 0 of 1 at 0.5",
        "route 0 among 1+1",
        "prefilled 0 on 0",
        "complete 0 on 0",
        "Prefill join 1 of 2 at 10.5",
        "route 1 among 2+1",
        "prefilled 1 on 0",
        "complete 1 on 0",
    ];
    assert_eq!(heard, want);
    let r = &out.records[0];
    assert_eq!((r.end, r.replica), (End::Served, 2));
    // Started over at 0.5 s on the other prefill instance: the first token comes that much later.
    let late = r.first_token_at_s - calm.records[0].first_token_at_s;
    assert!((late - 0.5).abs() < 1e-6, "{late}");
}

/// One prefill, two decode instances; a long prompt prefilling on slot 0, bound for decode slot
/// 1, which crashes at 0.5 s, mid-prefill. The router hears the abandon at once (before the
/// decode pool's change); the prefill runs on, and when it ends the hand-off finds no one: no
/// `prefilled` for that attempt, and the request is routed again (its prompt now cached on the
/// prefill instance) and completes on slot 2. Counted lost once, retried once.
#[test]
fn a_request_whose_decode_instance_crashes_during_its_prefill_is_lost_at_the_hand_off() {
    let rows = [(0.0, 7, 30_000, 4)];
    let (calm, _) = run(&pd(1, 2, ""), &rows);
    let prefill_end = calm.records[0].first_token_at_s;
    assert!(prefill_end > 0.5);
    let (out, heard) = run(&pd(1, 2, &crash(1, 0.5, 1)), &rows);
    let want = [
        "route 0 among 1+2",
        "abandon 0 on 0",
        "Decode leave 0 of 1 at 0.5",
        "route 0 among 1+1",
        "prefilled 0 on 0",
        "complete 0 on 0",
        "Decode join 1 of 2 at 100.5",
    ];
    assert_eq!(heard, want);
    let r = &out.records[0];
    assert_eq!((r.end, r.replica), (End::Served, 2));
    assert!(r.first_token_at_s > prefill_end, "routed again only at the hand-off: {r:?}");
    // The second prefill finds the whole prompt cached: far shorter than the first.
    assert!(r.first_token_at_s - prefill_end < (prefill_end - r.arrived_at_s) / 4.0, "{r:?}");
    let m = &out.metrics;
    assert_eq!((m.get("requests_lost"), m.get("retried_requests")), (Some(1.0), Some(1.0)), "{m:?}");
}

/// One prefill-only instance (slot 0), one mixed (slot 1), one decode-only (slot 2); the
/// router pairs prefill candidate 0 (slot 0) with decode candidate 0 (the mixed slot 1). A
/// request decoding 2,000 tokens on slot 1 when it crashes at 5 s: the router hears the
/// abandon (decode candidate 0), then one notice for both pools (prefill candidate 1 of 2 left,
/// 1 remains; decode candidate 0 of 2 left, 1 remains); it is routed again among 1 + 1 and
/// completes on slot 2, now decode candidate 0. Slot 1 restarts at 105 s at the top of the
/// mixed range: prefill candidate 1 (the top) and decode candidate 0 (below slot 2), one
/// notice again. A second request, after the restart, sees 2 + 2 and decodes on slot 1.
#[test]
fn a_mixed_instance_leaves_and_rejoins_both_pools_in_one_notice() {
    let rows = [(0.0, 7, 1000, 2000), (110.0, 8, 100, 2)];
    let spec = pd_mixed(1, 1, 1, &crash(1, 5.0, 1));
    let (out, heard) = run(&spec, &rows);
    let want = [
        "route 0 among 2+2",
        "prefilled 0 on 0",
        "abandon 0 on 0",
        "Mixed leave 1 of 1 / 0 of 1 at 5",
        "route 0 among 1+1",
        "prefilled 0 on 0",
        "complete 0 on 0",
        "Mixed join 1 of 2 / 0 of 2 at 105",
        "route 1 among 2+2",
        "prefilled 1 on 0",
        "complete 1 on 0",
    ];
    assert_eq!(heard, want);
    let replicas: Vec<u32> = out.records.iter().map(|r| r.replica).collect();
    assert_eq!(replicas, [2, 1], "retried on the decode-only slot; the second on the restarted mixed one");
    let m = &out.metrics;
    let got = ["crashes", "requests_lost", "retried_requests", "completed"].map(|k| m.get(k));
    assert_eq!(got, [Some(1.0), Some(1.0), Some(1.0), Some(2.0)], "{m:?}");
}

/// A router built before policy-api 0.5.13 (no `HEARS_MIXED_CHANGES`) is refused at build on a
/// cluster whose mixed instances may crash, naming the field and the fix; every P/D router built
/// against this crate has the flag, and without crashes or without mixed instances nothing is
/// refused.
#[test]
fn a_router_that_cannot_hear_mixed_changes_is_refused_where_mixed_instances_crash() {
    use routelab_policy_api::Capabilities;
    let old = Capabilities::DISAGGREGATED;
    let now = old | Capabilities::HEARS_MIXED_CHANGES;
    let crashing = pd_mixed(1, 1, 1, &crash(1, 5.0, 1));
    let e = build::check_mixed_changes(&crashing, old, "old").unwrap_err();
    assert_eq!(e.field, "failures");
    assert!(e.message.contains("policy 'old'") && e.fix.contains("0.5.13"), "{e:?}");
    assert!(build::check_mixed_changes(&crashing, now, "new").is_ok());
    assert!(build::check_mixed_changes(&pd_mixed(1, 1, 1, ""), old, "old").is_ok());
    assert!(build::check_mixed_changes(&pd(1, 2, &crash(1, 5.0, 1)), old, "old").is_ok());
    let Maker::Router(make) = routelab_policy_api::pd_router::<Recorder>().make else { unreachable!() };
    let ctx = router_context_for(&crashing, &StepModels::resolve(&crashing).unwrap(), 1);
    assert!(make("", &ctx).unwrap().capabilities().unwrap().contains(Capabilities::HEARS_MIXED_CHANGES));
}

/// A generated workload on 2 prefill + 3 decode instances, and on 1 prefill + 2 mixed + 2
/// decode, under random crashes (MTBF 15 s, restart 3 s, one retry), with P/D routers that keep
/// state per instance (`pd_sglang`'s cache-aware prefill child, `pd_dynamo`'s KV indexers),
/// migrate prefixes (`pd_mooncake`), count (`pd_round_robin`) or pair mixed instances with
/// themselves (`pd_least_loaded`): every request completes or fails exactly once (the finish's
/// conservation check runs under debug assertions), the run replays exactly from its seed, and
/// another seed crashes differently. With mixed instances, some requests still run locally on
/// one through the crashes.
#[test]
fn every_pd_request_completes_or_fails_once_under_random_crashes_and_the_seed_replays() {
    for (prefill, mixed, decode) in [(2, 0, 3), (1, 2, 2)] {
        crash_randomly(pd_mixed(prefill, mixed, decode, "failures: {mtbf_s: 15, restart_s: 3, max_retries: 1}"));
    }
}

fn crash_randomly(mut spec: ClusterSpec) {
    let mixed = spec.disaggregation.as_ref().unwrap().mixed_instances() > 0;
    spec.chunk_tokens = 2048;
    spec.generator = serde_norway::from_str(
        "{system_prompt_tokens: 200, contexts: {count: 8, tokens: 800}, suffix_tokens: 50, output_tokens: 100}",
    )
    .unwrap();
    spec.arrivals = crate::workload::cluster::Arrivals::Poisson { rate: 10.0 };
    spec.requests = Some(1200);
    let stream = crate::workload::generate::generate(&spec, None, 1).unwrap();
    let resolved = StepModels::resolve(&spec).unwrap();
    for policy in ["pd_round_robin", "pd_sglang", "pd_dynamo", "pd_mooncake", "pd_least_loaded"] {
        let once = |seed: u64| {
            let ctx = router_context_for(&spec, &resolved, seed);
            let router = Loader::new().router(&PolicySpec::parse(policy).unwrap(), &ctx).unwrap();
            run_cluster(&spec, &stream, router, policy, seed).unwrap_or_else(|e| panic!("{policy}: {e}"))
        };
        let (a, b, c) = (once(1), once(1), once(2));
        let n = |k: &str| a.metrics.get(k).unwrap();
        assert!(n("crashes") >= 3.0 && n("requests_lost") > 0.0 && n("retried_requests") > 0.0, "{policy}");
        assert_eq!(n("completed") + n("failed_requests") + n("unfinished"), 1200.0, "{policy}: {:?}", a.metrics);
        let failed = a.records.iter().filter(|r| r.end == End::Failed).count();
        assert_eq!(failed as f64, n("failed_requests"), "{policy}");
        assert_eq!(format!("{:?}", a.metrics), format!("{:?}", b.metrics), "{policy}: same seed, same run");
        assert_ne!(format!("{:?}", a.metrics), format!("{:?}", c.metrics), "{policy}: another seed");
        if mixed && policy == "pd_least_loaded" {
            assert!(n("local_share") > 0.0, "{:?}", a.metrics);
        }
    }
}
