//! Autoscaling on disaggregated clusters (`fleet_pd.rs`): a prefill and a decode instance that
//! join their pool's candidates `model_load_s` after the decision and then take work; a
//! draining decode instance that finishes its decode and the request paired with it before it
//! left; a draining prefill instance that stays until its hand-off's transfer ends; the bills
//! per pool; conservation under the built-in scalers; and the bad specs `validate` refuses.

use std::cell::RefCell;

use abi_stable::sabi_trait::TD_Opaque;
use routelab_policy_api::scaler::Scaler_TO;
use routelab_policy_api::{
    Completion, Guarded, Maker, PdPool, PdRoute, PdRouterPolicy, Policy, Pool, ReplicaChange, Replicas, Request,
    RouterContext, ScalerContext, ScalerPolicy,
};

use super::failures_tests::stream;
use super::*;
use crate::plugin::{Loader, PolicySpec};
use crate::workload::generate::RequestStream;

thread_local! {
    /// What the `Newest` router heard, in order (the sim runs on the test's thread).
    static HEARD: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

fn hear(line: String) {
    HEARD.with(|h| h.borrow_mut().push(line));
}

/// Always asks for these counts, one per pool (prefill, decode).
struct Fixed(Vec<u32>);

impl Policy for Fixed {
    const NAME: &'static str = "fixed";
    const DESCRIPTION: &'static str = "asks for fixed counts";
    type Config = Vec<u32>;
    type Context = ScalerContext;
    fn new(n: Vec<u32>, _: &ScalerContext) -> Result<Self, String> {
        Ok(Fixed(n))
    }
}

impl ScalerPolicy for Fixed {
    fn desired(&mut self, _: f64, pools: &[Pool<'_>]) -> Vec<u32> {
        assert_eq!(pools.len(), 2, "a disaggregated cluster's scaler decides for two pools");
        self.0.clone()
    }
}

/// Places every request on the newest candidate of each pool (the top index); logs notices.
struct Newest;

impl Policy for Newest {
    const NAME: &'static str = "newest";
    const DESCRIPTION: &'static str = "both pools' top index, logging";
    type Config = ();
    type Context = RouterContext;
    fn new(_: (), _: &RouterContext) -> Result<Self, String> {
        Ok(Newest)
    }
}

impl PdRouterPolicy for Newest {
    fn route_pair(&mut self, r: &Request<'_>, prefill: &Replicas<'_>, decode: &Replicas<'_>) -> PdRoute {
        hear(format!("route {} among {}+{}", r.id, prefill.len(), decode.len()));
        PdRoute::pair(prefill.len() - 1, decode.len() - 1)
    }
    fn on_prefill_complete(&mut self, c: &Completion) {
        hear(format!("prefilled {} on {}", c.request_id, c.replica));
    }
    fn on_complete(&mut self, c: &Completion) {
        hear(format!("complete {} on {}", c.request_id, c.replica));
    }
    fn on_pool_change(&mut self, pool: PdPool, c: &ReplicaChange) {
        let how = if c.joined { "join" } else { "leave" };
        hear(format!("{pool:?} {how} {} of {} at {}", c.replica, c.routable, c.at));
    }
}

/// `prefill` + `decode` instances at the start (A6000s, unchunked prefill), each pool within
/// `[1, max]`, a decision every 10 s, a model load of 30 s.
fn pd(prefill: (u32, u32), decode: (u32, u32)) -> ClusterSpec {
    serde_norway::from_str(&format!(
        "replicas: {}\nchunk_tokens: 0\ndisaggregation:\n  prefill: {{instances: {}}}\n  \
         decode: {{instances: {}}}\n  link: {{bandwidth_gbps: 100, base_latency_s: 0.0005}}\n\
         autoscaling:\n  scaler: fixed\n  interval_s: 10\n  model_load_s: 30\n  max_replicas: {}\n  \
         pools: {{prefill: {{max_replicas: {}}}, decode: {{max_replicas: {}}}}}\n\
         generator: {{output_tokens: 1}}\narrivals: {{poisson: {{rate: 1}}}}\nrequests: 3\n",
        prefill.0 + decode.0,
        prefill.0,
        decode.0,
        prefill.1 + decode.1,
        prefill.1,
        decode.1
    ))
    .unwrap()
}

/// Runs `spec` on `stream` with the `Newest` router and a `Fixed(want)` scaler; returns the
/// outcome and what the router heard.
fn run(spec: &ClusterSpec, stream: &RequestStream, want: &[u32]) -> (RunOutcome, Vec<String>) {
    HEARD.with(|h| h.borrow_mut().clear());
    let resolved = StepModels::resolve(spec).unwrap();
    let ctx = router_context_for(spec, &resolved, 1);
    let Maker::Router(make) = routelab_policy_api::pd_router::<Newest>().make else { unreachable!() };
    let router = make("", &ctx).unwrap();
    let sched =
        Loader::new().resolve(&PolicySpec::parse("fcfs").unwrap(), routelab_policy_api::PolicyKind::Scheduler).unwrap();
    let schedulers = crate::runner::make_schedulers(&sched, &resolved.main, spec.slots(), 1).unwrap();
    let scaler = Scaler_TO::from_value(Guarded::new(Fixed(want.to_vec())), TD_Opaque);
    let out = ClusterSim::build(spec, &resolved, stream, router, schedulers, "newest")
        .unwrap()
        .with_failures(spec.failures.as_ref(), 1)
        .with_scaler(scaler, "fixed")
        .unwrap()
        .run()
        .unwrap();
    (out, HEARD.with(|h| h.borrow().clone()))
}

fn close(a: Option<f64>, b: f64) -> bool {
    a.is_some_and(|a| (a - b).abs() < 1e-6)
}

/// One prefill and one decode instance, the decode pool up to two; the scaler asks for 1 + 2 at
/// its first decision (10 s). Slots: prefill 0, decode 1 and 2 (the pool's `max_replicas`).
/// Decode slot 2 loads from 10 s and joins the decode candidates at 40 s exactly (index 1 of
/// 2), so the request at 39.9 s decodes on slot 1 and the one at 40 s on slot 2. The prefill
/// pool is left alone. Bills: prefill slot 0 from 0 to the end; decode slot 1 from 0, slot 2 from
/// its decision at 10 s. (Request 1's 1,000-token prefill is still running at 40 s: it was
/// paired with slot 1 at 39.9 s and stays so.)
#[test]
fn a_scaled_up_decode_instance_joins_its_pool_after_the_model_load() {
    let (out, heard) =
        run(&pd((1, 1), (1, 2)), &stream(&[(0.0, 7, 1000, 4), (39.9, 8, 1000, 4), (40.0, 9, 1000, 4)]), &[1, 2]);
    let r = &out.records;
    assert_eq!(r.iter().map(|x| x.replica).collect::<Vec<_>>(), [1, 1, 2], "{r:?}");
    let want = [
        "route 0 among 1+1",
        "prefilled 0 on 0",
        "complete 0 on 0",
        "route 1 among 1+1",
        "Decode join 1 of 2 at 40",
        "route 2 among 1+2",
        "prefilled 1 on 0",
        "complete 1 on 0",
        "prefilled 2 on 0",
        "complete 2 on 1",
    ];
    assert_eq!(heard, want);
    let end = r.iter().map(|x| x.completed_at_s).fold(0.0, f64::max);
    let m = &out.metrics;
    assert!(close(m.get("replica_seconds_prefill"), end), "{m:?}");
    assert!(close(m.get("replica_seconds_decode"), end + (end - 10.0)), "{m:?}");
    assert!(close(m.get("replica_seconds"), 2.0 * end + (end - 10.0)), "{m:?}");
    assert_eq!(
        (m.get("scale_ups"), m.get("replicas_started"), m.get("replicas_max")),
        (Some(1.0), Some(1.0), Some(3.0))
    );
}

/// The prefill pool grows instead (1 + 1, prefill up to two; the scaler asks 2 + 1): prefill
/// slot 1 joins the prefill candidates at 40 s, at the top of their range (index 1 of 2), and
/// prefills the request of 40 s with a cold cache (the same prompt was cached on slot 0).
#[test]
fn a_scaled_up_prefill_instance_joins_its_pool_after_the_model_load() {
    let rows = [(0.0, 7, 1000, 4), (39.9, 7, 1000, 4), (40.0, 7, 1000, 4)];
    let (out, heard) = run(&pd((1, 2), (1, 1)), &stream(&rows), &[2, 1]);
    assert!(heard.contains(&"Prefill join 1 of 2 at 40".to_string()), "{heard:?}");
    assert_eq!(heard[heard.len() - 3..], ["route 2 among 2+1", "prefilled 2 on 1", "complete 2 on 0"]);
    let r = &out.records;
    assert_eq!(r.iter().map(|x| x.replica).collect::<Vec<_>>(), [2, 2, 2], "decode slot 2 throughout");
    assert_eq!((r[0].cached_tokens, r[2].cached_tokens), (0, 0), "the new prefill instance starts cold");
    assert!(r[1].cached_tokens > 0, "slot 0 had the prompt");
    let end = r.iter().map(|x| x.completed_at_s).fold(0.0, f64::max);
    let m = &out.metrics;
    assert!(close(m.get("replica_seconds_prefill"), end + (end - 10.0)), "{m:?}");
    assert!(close(m.get("replica_seconds_decode"), end), "{m:?}");
}

/// One prefill, two decode instances; the scaler asks for 1 + 1 at 10 s, so decode slot 2 (the
/// newest, candidate 1) drains. It holds request 0 (from 0 s, 2,000 output tokens), and
/// request 1 (at 9.99 s, an 8,000-token prompt still prefilling on slot 0 at 10 s) was paired
/// with it before it left: both decode there, and slot 2 goes off when the later of the two
/// ends. Request 2 (11 s) is placed on slot 1. Decode bill: slot 1 until the end, slot 2 until
/// its last request's completion.
#[test]
fn a_draining_decode_instance_finishes_its_decodes_and_the_requests_paired_with_it() {
    let rows = [(0.0, 7, 1000, 2000), (9.99, 8, 8000, 8), (11.0, 9, 500, 1)];
    let (out, heard) = run(&pd((1, 1), (2, 2)), &stream(&rows), &[1, 1]);
    let r = &out.records;
    assert_eq!(r.iter().map(|x| x.replica).collect::<Vec<_>>(), [2, 2, 1], "{r:?}");
    assert!(heard.contains(&"Decode leave 1 of 1 at 10".to_string()), "{heard:?}");
    assert!(r[1].first_token_at_s > 10.0, "request 1 was still prefilling at the drain: {:?}", r[1]);
    let off = r[0].completed_at_s.max(r[1].completed_at_s);
    assert!(off > 11.0, "slot 2 is still decoding when request 2 arrives ({off})");
    let end = r.iter().map(|x| x.completed_at_s).fold(0.0, f64::max);
    let m = &out.metrics;
    assert!(close(m.get("replica_seconds_decode"), end + off), "{m:?}");
    assert!(close(m.get("replica_seconds_prefill"), end), "{m:?}");
    assert_eq!((m.get("scale_downs"), m.get("completed")), (Some(1.0), Some(3.0)));
}

/// Two prefill, one decode instance; the scaler asks for 1 + 1 at 10 s, so prefill slot 1 (the
/// newest) drains while it prefills request 0 (9.9 s, 8,000 tokens). It finishes the prefill,
/// hands off, and stays until the KV transfer to decode slot 2 ends — the request's first token,
/// TTFT including the transfer — then goes off. Request 1 (10.5 s) is prefilled on slot 0.
#[test]
fn a_draining_prefill_instance_stays_until_its_hand_off_is_transferred() {
    let rows = [(9.9, 7, 8000, 4), (10.5, 8, 500, 4)];
    let (out, heard) = run(&pd((2, 2), (1, 1)), &stream(&rows), &[1, 1]);
    assert_eq!(heard[..3], ["route 0 among 2+1", "Prefill leave 1 of 1 at 10", "route 1 among 1+1"]);
    assert!(heard.contains(&"prefilled 0 on 1".to_string()), "{heard:?}");
    let r = &out.records;
    let transferred = r[0].first_token_at_s;
    assert!(transferred > 10.0, "{:?}", r[0]);
    let end = r.iter().map(|x| x.completed_at_s).fold(0.0, f64::max);
    let m = &out.metrics;
    assert!(m.get("transfer_time_mean_s").unwrap() > 0.0, "{m:?}");
    assert!(close(m.get("replica_seconds_prefill"), end + transferred), "{m:?}");
    assert!(close(m.get("replica_seconds_decode"), end), "{m:?}");
}

/// The P/D preset, shortened, under each built-in scaler, without and with random crashes:
/// every request finishes exactly once or fails (the finish's conservation check runs under
/// debug assertions), both pools' bills add up to the total, and the fleet both grew and shrank.
#[test]
fn every_request_finishes_once_while_both_pools_scale() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .join("workloads/cluster/pd/autoscaling.yaml");
    let mut spec = crate::workload::load(&path).unwrap_or_else(|e| panic!("{e}")).cluster.unwrap();
    spec.arrivals = crate::workload::cluster::Arrivals::Diurnal { rate: 8.0, amplitude: 0.8, period_s: 600.0 };
    spec.duration_s = Some(600.0);
    let crashes = "{mtbf_s: 120, restart_s: 20, max_retries: 2}";
    let failing = ClusterSpec { failures: Some(serde_norway::from_str(crashes).unwrap()), ..spec.clone() };
    let run = |spec: &ClusterSpec, scaler: &str| super::fleet_tests::run_scaled(spec, "pd_least_loaded", scaler);
    for scaler in ["hpa{metric: requests, target: 8}", "dynamo_planner", "llm_d_wva"] {
        for s in [&spec, &failing] {
            let (out, n) = run(s, scaler);
            let m = &out.metrics;
            let failed = m.get("failed_requests").unwrap_or(0.0);
            assert_eq!(m.get("completed").unwrap() + failed, n, "{scaler}: {m:?}");
            let pools = m.get("replica_seconds_prefill").unwrap() + m.get("replica_seconds_decode").unwrap();
            assert!(close(m.get("replica_seconds"), pools), "{scaler}: {m:?}");
            assert!(m.get("scale_ups").unwrap() > 0.0 && m.get("scale_downs").unwrap() > 0.0, "{scaler}: {m:?}");
        }
    }
}

/// What `validate` refuses, naming the field: pools on an aggregated cluster, no pools on a
/// disaggregated one, a pool's bounds below its starting instances, mixed instances.
#[test]
fn bad_pd_autoscaling_specs_name_the_field() {
    let err = |yaml: &str| {
        let spec: ClusterSpec = serde_norway::from_str(yaml).unwrap();
        let e = spec.validate().unwrap_err();
        format!("{}: {} ({})", e.path, e.message, e.fix)
    };
    let pd = "chunk_tokens: 0\ngenerator: {output_tokens: 1}\narrivals: {poisson: {rate: 1}}\nrequests: 3\n\
              disaggregation: {prefill: {instances: 2}, decode: {instances: 2}, link: {bandwidth_gbps: 100}}\n";
    let e = err(&format!("replicas: 4\n{pd}autoscaling: {{scaler: hpa, max_replicas: 8}}\n"));
    assert!(e.contains("autoscaling.pools") && e.contains("is missing"), "{e}");
    let e = err(&format!(
        "replicas: 4\n{pd}autoscaling: {{scaler: hpa, max_replicas: 8, pools: {{prefill: {{max_replicas: 1}}, \
         decode: {{max_replicas: 4}}}}}}\n"
    ));
    assert!(e.contains("autoscaling.pools.prefill.max_replicas") && e.contains("starting instances (2)"), "{e}");
    let agg = "replicas: 2\ngenerator: {output_tokens: 1}\narrivals: {poisson: {rate: 1}}\nrequests: 3\n\
               autoscaling: {scaler: hpa, max_replicas: 4, pools: {prefill: {max_replicas: 2}, decode: {max_replicas: 2}}}\n";
    assert!(err(agg).contains("autoscaling.pools") && err(agg).contains("aggregated"), "{}", err(agg));
    let mixed = "replicas: 5\nchunk_tokens: 0\ngenerator: {output_tokens: 1}\narrivals: {poisson: {rate: 1}}\n\
                 requests: 3\ndisaggregation: {prefill: {instances: 2}, decode: {instances: 2}, mixed: {instances: 1}, \
                 link: {bandwidth_gbps: 100}}\nautoscaling: {scaler: hpa, max_replicas: 8, pools: {prefill: \
                 {max_replicas: 3}, decode: {max_replicas: 3}}}\n";
    let e = err(mixed);
    assert!(e.contains("autoscaling") && e.contains("mixed"), "{e}");
}

/// Two prefill (up to three) and two decode instances; at 10 s the scaler asks for 3 + 1:
/// decode slot 4 (candidate 1) drains with request 0 (4,000 output tokens) on it, and prefill
/// slot 2 starts loading; at 40 s it joins the prefill candidates (index 2 of 3), which moves
/// every decode candidate up one router index. Request 0's completion still names decode
/// candidate 1, where it was placed (not 0, what the stale router index would give).
#[test]
fn a_draining_decode_instance_keeps_its_index_when_the_prefill_pool_grows() {
    let (out, heard) = run(&pd((2, 3), (2, 2)), &stream(&[(0.0, 7, 1000, 4000)]), &[3, 1]);
    assert!(out.records[0].completed_at_s > 40.0, "{:?}", out.records[0]);
    let want = ["Decode leave 1 of 1 at 10", "Prefill join 2 of 3 at 40", "complete 0 on 1"];
    assert_eq!(heard[heard.len() - 3..], want, "{heard:?}");
}

/// Utilisation over paid time: one prefill and one decode instance, decode up to two; the
/// scaler asks for 1 + 2 at 10 s, so decode slot 2 is paid for from 10 s (loading until 40 s,
/// then idle) and never works. One request (0 s, a 1,000-token prompt, 4,000 output tokens)
/// finishes past 40 s, at `end`. Busy: the prefill pool for the prefill (admission → hand-off,
/// the hand-off being the first token less the transfer), the decode pool from the first token
/// to the completion (one decode step after another). Paid: prefill `end`, decode
/// `end + (end − 10)`. Each utilisation is busy ÷ paid — not ÷ (2 slots × end), the pool's
/// every slot over the run.
#[test]
fn pd_utilisation_is_busy_time_over_the_pools_paid_time() {
    let (out, _) = run(&pd((1, 1), (1, 2)), &stream(&[(0.0, 7, 1000, 4000)]), &[1, 2]);
    let r = &out.records[0];
    let m = &out.metrics;
    let end = r.completed_at_s;
    assert!(end > 40.0, "{r:?}");
    let transfer = m.get("transfer_time_mean_s").unwrap();
    let prefill_busy = r.first_token_at_s - transfer - r.admitted_at_s;
    let decode_busy = r.completed_at_s - r.first_token_at_s;
    assert!(close(m.get("replica_seconds_prefill"), end) && close(m.get("replica_seconds_decode"), 2.0 * end - 10.0));
    assert!(close(m.get("prefill_utilisation"), prefill_busy / end), "{prefill_busy} / {end}: {m:?}");
    assert!(close(m.get("decode_utilisation"), decode_busy / (2.0 * end - 10.0)), "{decode_busy}: {m:?}");
    assert!(!close(m.get("decode_utilisation"), decode_busy / (2.0 * end)), "not over every slot: {m:?}");
}
