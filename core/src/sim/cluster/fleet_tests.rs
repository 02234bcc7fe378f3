//! Autoscaling in whole cluster runs: a scale-up's cold replica and a drain, timed by hand, and
//! conservation while the fleet changes; crashes in a scaled fleet (a ready replica that loads
//! again, a draining one that goes, an off slot that cannot crash).

use abi_stable::sabi_trait::TD_Opaque;
use routelab_policy_api::scaler::Scaler_TO;
use routelab_policy_api::{
    Guarded, Maker, Policy, Pool, Replicas, Request, RouterContext, RouterPolicy, ScalerContext, ScalerPolicy, Segment,
};

use super::*;
use crate::plugin::{Loader, PolicySpec};
use crate::time::ticks;
use crate::workload::generate::{GeneratedRequest, RequestStream};

/// Always asks for `n` replicas.
struct Fixed(u32);

impl Policy for Fixed {
    const NAME: &'static str = "fixed";
    const DESCRIPTION: &'static str = "asks for a fixed count";
    type Config = u32;
    type Context = ScalerContext;
    fn new(n: u32, _: &ScalerContext) -> Result<Self, String> {
        Ok(Fixed(n))
    }
}

impl ScalerPolicy for Fixed {
    fn desired(&mut self, _: f64, pools: &[Pool<'_>]) -> Vec<u32> {
        vec![self.0; pools.len()]
    }
}

/// Sends every request to the newest routable replica (the last index).
struct Newest;

impl Policy for Newest {
    const NAME: &'static str = "newest";
    const DESCRIPTION: &'static str = "the last index";
    type Config = ();
    type Context = RouterContext;
    fn new(_: (), _: &RouterContext) -> Result<Self, String> {
        Ok(Newest)
    }
}

impl RouterPolicy for Newest {
    fn route(&mut self, _: &Request<'_>, replicas: &Replicas<'_>) -> usize {
        replicas.len() - 1
    }
}

/// One A6000, unchunked prefill; `extra` adds fields (autoscaling).
fn spec(replicas: u32, extra: &str) -> ClusterSpec {
    serde_norway::from_str(&format!(
        "replicas: {replicas}\nchunk_tokens: 0\n{extra}\n\
         generator: {{output_tokens: 1}}\narrivals: {{poisson: {{rate: 1}}}}\nrequests: 3\n"
    ))
    .unwrap()
}

/// Requests of `(arrival s, prompt segment id, prompt tokens, output tokens)`.
fn stream(rows: &[(f64, u64, u32, u32)]) -> RequestStream {
    let mut s = RequestStream::default();
    for &(at, id, tokens, output) in rows {
        let start = s.segments.len() as u32;
        s.segments.push(Segment { id, tokens });
        s.requests.push(GeneratedRequest {
            arrived_at: ticks(at),
            prompt_tokens: tokens,
            output_tokens: output,
            segments: start..s.segments.len() as u32,
            output_segment: None,
        });
    }
    s
}

/// Runs `spec` on `stream` with the `Newest` router and, if given, a `Fixed(n)` scaler.
fn run(spec: &ClusterSpec, stream: &RequestStream, scaler: Option<u32>) -> RunOutcome {
    let resolved = StepModels::resolve(spec).unwrap();
    let sm = &resolved.main;
    let ctx = router_context_for(spec, &resolved, 1);
    let Maker::Router(make) = routelab_policy_api::router::<Newest>().make else { unreachable!() };
    let router = make("", &ctx).unwrap();
    let mut loader = Loader::new();
    let sched =
        loader.resolve(&PolicySpec::parse("fcfs").unwrap(), routelab_policy_api::PolicyKind::Scheduler).unwrap();
    let schedulers = crate::runner::make_schedulers(&sched, sm, spec.slots(), 1).unwrap();
    let mut sim = ClusterSim::build(spec, &resolved, stream, router, schedulers, "newest")
        .unwrap()
        .with_failures(spec.failures.as_ref(), 1);
    if let Some(n) = scaler {
        let s = Scaler_TO::from_value(Guarded::new(Fixed(n)), TD_Opaque);
        sim = sim.with_scaler(s, "fixed").unwrap();
    }
    sim.run().unwrap()
}

const SCALING: &str =
    "autoscaling: {scaler: fixed, interval_s: 10, model_load_s: 30, min_replicas: 1, max_replicas: 2}";

/// One replica; the scaler asks for two at its first decision (t = 10 s); the new replica loads
/// for 30 s, so it takes requests from t = 40 s exactly (an arrival at the same instant as the
/// load's end comes after it), with a cold cache. Three requests with the same 1,000-token
/// prompt: at 0 (cold, replica 0), at 39.9 (replica 0 still the only one: a cache hit), at 40
/// (the new replica, index 1: cold again, so its time to first token equals the first's).
/// Billing: replica 0 from 0, replica 1 from its decision at 10, both until the last request
/// ends.
#[test]
fn a_scaled_up_replica_takes_requests_after_its_model_load_with_a_cold_cache() {
    let spec = spec(1, SCALING);
    let out = run(&spec, &stream(&[(0.0, 7, 1000, 1), (39.9, 7, 1000, 1), (40.0, 7, 1000, 1)]), Some(2));
    let r = &out.records;
    assert_eq!(r.iter().map(|x| x.replica).collect::<Vec<_>>(), [0, 0, 1]);
    assert_eq!(r[0].cached_tokens, 0);
    assert!(r[1].cached_tokens > 0, "the second request hits replica 0's cache");
    assert_eq!(r[2].cached_tokens, 0, "the new replica starts cold");
    let ttft = |x: &RequestRecord| x.first_token_at_s - x.arrived_at_s;
    assert!((ttft(&r[2]) - ttft(&r[0])).abs() < 1e-9, "{} vs {}", ttft(&r[2]), ttft(&r[0]));
    let end = r[2].completed_at_s;
    let m = &out.metrics;
    assert!((m.get("replica_seconds").unwrap() - (end + (end - 10.0))).abs() < 1e-6, "{m:?}");
    assert_eq!(m.get("scale_ups"), Some(1.0));
    assert_eq!(m.get("replicas_started"), Some(1.0));
    // The third request arrived while no replica was loading any more (it became ready at 40).
    assert_eq!(m.get("replicas_max"), Some(2.0));
}

/// Two replicas; the scaler asks for one at t = 10 s. The newest (index 1) is drained: the long
/// request it runs (from t = 0, 2,000 output tokens) finishes there exactly as it would alone,
/// a request at 11 s goes to replica 0, and replica 1 stops being paid for when its request ends.
#[test]
fn a_drained_replica_finishes_what_it_has_and_then_goes() {
    let rows = [(0.0, 7, 1000, 2000), (11.0, 8, 500, 1)];
    // The long request alone on a fixed fleet (where the newest replica would also get the second).
    let fixed = run(&spec(2, ""), &stream(&rows[..1]), None);
    let spec = spec(2, SCALING);
    let out = run(&spec, &stream(&rows), Some(1));
    let r = &out.records;
    assert_eq!((r[0].replica, r[1].replica), (1, 0));
    let done_at = r[0].completed_at_s;
    assert!(done_at > 11.0, "the long request is still running at the drain ({done_at})");
    assert_eq!(done_at, fixed.records[0].completed_at_s, "draining does not disturb in-flight work");
    let end = done_at.max(r[1].completed_at_s);
    let m = &out.metrics;
    assert!((m.get("replica_seconds").unwrap() - (end + done_at)).abs() < 1e-6, "{m:?}");
    assert_eq!((m.get("scale_downs"), m.get("replicas_started")), (Some(1.0), Some(0.0)));
}

/// The diurnal preset, shortened, under each built-in scaler, without failures and with random
/// crashes (mean 60 s a replica, so every slot's lives see several) and a scheduled one: every
/// request finishes exactly once, or fails (the finish's conservation check runs under debug
/// assertions), on a replica that existed; the fleet both grew and shrank; with crashes, a
/// second run with the same seed gives the same figures.
#[test]
fn every_request_finishes_once_while_the_fleet_scales() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().join("workloads/cluster/diurnal.yaml");
    let mut spec = crate::workload::load(&path).unwrap_or_else(|e| panic!("{e}")).cluster.unwrap();
    spec.arrivals = crate::workload::cluster::Arrivals::Diurnal { rate: 30.0, amplitude: 0.8, period_s: 600.0 };
    spec.duration_s = Some(600.0);
    let crashes = "{crashes: [{replica: 0, at_s: 100}], mtbf_s: 60, restart_s: 20, max_retries: 2}";
    let failing = ClusterSpec { failures: Some(serde_norway::from_str(crashes).unwrap()), ..spec.clone() };
    let run = |spec: &ClusterSpec, scaler: &str| run_scaled(spec, "least_requests", scaler);
    for scaler in ["hpa{metric: requests, target: 8}", "dynamo_planner", "llm_d_wva"] {
        let (out, n) = run(&spec, scaler);
        let m = &out.metrics;
        assert_eq!(m.get("completed"), Some(n), "{scaler}: {m:?}");
        assert!(out.records.iter().all(|r| r.replica < 10 && r.completed_at_s.is_finite()), "{scaler}");
        assert!(m.get("scale_ups").unwrap() > 0.0 && m.get("scale_downs").unwrap() > 0.0, "{scaler}: {m:?}");
        let (out, n) = run(&failing, scaler);
        let m = &out.metrics;
        let (completed, failed) = (m.get("completed").unwrap(), m.get("failed_requests").unwrap());
        assert_eq!(completed + failed, n, "{scaler}: {m:?}");
        assert!(m.get("crashes").unwrap() >= 5.0 && m.get("retried_requests").unwrap() > 0.0, "{scaler}: {m:?}");
        let availability = m.get("availability").unwrap();
        assert!(availability > 0.0 && availability < 1.0, "{scaler}: {m:?}");
        assert!(out.records.iter().all(|r| r.replica < 10), "{scaler}");
        let (again, _) = run(&failing, scaler);
        assert_eq!(format!("{:?}", again.metrics), format!("{m:?}"), "{scaler}: same seed, same run");
    }
}

/// Two ready replicas of at most three, a scaler that keeps two. Slot 1 crashes at 5 s while it
/// runs a long request (retried on slot 0 at once); slot 2, off, "crashes" at 6 s, which is no
/// crash. Slot 1 loads again for `restart_s` = 20 s, still paid for and counted as loading, so
/// the scaler (asking two at 10 and 20 s) starts no replica; it takes requests from 25 s exactly,
/// cold. Availability is the share of the paid replica-time not down: 1 − 20 / (2 × end).
#[test]
fn a_crashed_replica_of_a_scaled_fleet_loads_again_and_is_paid_for() {
    let scaling = "autoscaling: {scaler: fixed, interval_s: 10, model_load_s: 30, min_replicas: 1, max_replicas: 3}\n\
                   failures: {crashes: [{replica: 1, at_s: 5}, {replica: 2, at_s: 6}], restart_s: 20}";
    let spec = spec(2, scaling);
    let rows = [(0.0, 7, 1000, 2000), (24.9, 8, 500, 1), (25.0, 8, 500, 1)];
    let out = run(&spec, &stream(&rows), Some(2));
    let r = &out.records;
    assert_eq!(r.iter().map(|x| x.replica).collect::<Vec<_>>(), [0, 0, 1], "retried on 0; 1 back at 25 s");
    assert_eq!(r[2].cached_tokens, 0, "the restarted replica is cold");
    assert!(r[0].completed_at_s > 25.0, "the long request outlives the restart");
    let m = &out.metrics;
    assert_eq!(
        (m.get("crashes"), m.get("retried_requests"), m.get("failed_requests")),
        (Some(1.0), Some(1.0), Some(0.0))
    );
    assert_eq!((m.get("scale_ups"), m.get("replicas_started")), (Some(0.0), Some(0.0)), "{m:?}");
    let end = r.iter().map(|x| x.completed_at_s).fold(0.0, f64::max);
    assert!((m.get("replica_seconds").unwrap() - 2.0 * end).abs() < 1e-6, "{m:?}");
    assert!((m.get("availability").unwrap() - (1.0 - 20.0 / (2.0 * end))).abs() < 1e-9, "{m:?}");
}

/// Two replicas; the scaler asks for one at 10 s, so slot 1 drains its long request; it
/// crashes at 12 s: the request is retried on slot 0, and slot 1 goes at once (it was going),
/// paid for until 12 s, never down.
#[test]
fn a_draining_replica_that_crashes_is_gone() {
    let extra = format!("{SCALING}\nfailures: {{crashes: [{{replica: 1, at_s: 12}}], restart_s: 20}}");
    let out = run(&spec(2, &extra), &stream(&[(0.0, 7, 1000, 2000)]), Some(1));
    let r = &out.records;
    assert_eq!(r[0].replica, 0, "retried on the replica that stays");
    let m = &out.metrics;
    assert_eq!(
        (m.get("crashes"), m.get("requests_lost"), m.get("retried_requests")),
        (Some(1.0), Some(1.0), Some(1.0))
    );
    let end = r[0].completed_at_s;
    assert!((m.get("replica_seconds").unwrap() - (end + 12.0)).abs() < 1e-6, "{m:?}");
    assert_eq!(m.get("availability"), Some(1.0), "{m:?}");
}

/// A whole run of `spec` (with its failures) under `router`, `fcfs` and `scaler`, built as
/// `compare` builds it: the outcome and the number of requests generated.
pub(super) fn run_scaled(spec: &ClusterSpec, router: &str, scaler: &str) -> (RunOutcome, f64) {
    let resolved = StepModels::resolve(spec).unwrap();
    let mut loader = Loader::new();
    let ctx = router_context_for(spec, &resolved, 1);
    let r = loader.router(&PolicySpec::parse(router).unwrap(), &ctx).unwrap();
    let sched =
        loader.resolve(&PolicySpec::parse("fcfs").unwrap(), routelab_policy_api::PolicyKind::Scheduler).unwrap();
    let schedulers = crate::runner::make_schedulers(&sched, &resolved.main, spec.slots(), 1).unwrap();
    let stream = crate::workload::generate::generate(spec, None, 1).unwrap();
    let s = loader.scaler_factory(&PolicySpec::parse(scaler).unwrap()).unwrap();
    let s = s.scaler(&scaler_context(spec, &resolved, 1)).unwrap();
    let out = ClusterSim::build(spec, &resolved, &stream, r, schedulers, router)
        .unwrap()
        .with_failures(spec.failures.as_ref(), 1)
        .with_scaler(s, scaler)
        .unwrap()
        .run()
        .unwrap();
    (out, stream.requests.len() as f64)
}
