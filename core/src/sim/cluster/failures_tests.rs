//! Replica failures in whole cluster runs: a crash's lost request retried elsewhere (or
//! failed), a restarted replica's cold cache, a fleet with no replica up, a lock-step group
//! that fails whole, and conservation and determinism under random crashes.

use routelab_policy_api::{Maker, Policy, Replicas, Request, RouterContext, RouterPolicy, Segment};

use super::*;
use crate::plugin::{Loader, PolicySpec};
use crate::time::ticks;
use crate::workload::generate::{GeneratedRequest, RequestStream};

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

/// One A6000 per replica, unchunked prefill; `extra` adds fields (failures).
fn spec(replicas: u32, extra: &str) -> ClusterSpec {
    serde_norway::from_str(&format!(
        "replicas: {replicas}\nchunk_tokens: 0\n{extra}\n\
         generator: {{output_tokens: 1}}\narrivals: {{poisson: {{rate: 1}}}}\nrequests: 3\n"
    ))
    .unwrap()
}

/// Requests of `(arrival s, prompt segment id, prompt tokens, output tokens)`.
pub(super) fn stream(rows: &[(f64, u64, u32, u32)]) -> RequestStream {
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

/// Runs `spec` on `stream` with the `Newest` router, failures as the spec says (seed 1).
fn run(spec: &ClusterSpec, stream: &RequestStream) -> RunOutcome {
    run_with(spec, stream, |_| {})
}

/// [`run`], with `prepare` given the simulator before it runs.
fn run_with(spec: &ClusterSpec, stream: &RequestStream, prepare: impl FnOnce(&mut ClusterSim<'_>)) -> RunOutcome {
    let resolved = StepModels::resolve(spec).unwrap();
    let sm = &resolved.main;
    let ctx = router_context_for(spec, &resolved, 1);
    let Maker::Router(make) = routelab_policy_api::router::<Newest>().make else { unreachable!() };
    let router = make("", &ctx).unwrap();
    let mut loader = Loader::new();
    let sched =
        loader.resolve(&PolicySpec::parse("fcfs").unwrap(), routelab_policy_api::PolicyKind::Scheduler).unwrap();
    let schedulers = crate::runner::make_schedulers(&sched, sm, spec.slots(), 1).unwrap();
    let sim = ClusterSim::build(spec, &resolved, stream, router, schedulers, "newest").unwrap();
    let mut sim = sim.with_failures(spec.failures.as_ref(), 1);
    prepare(&mut sim);
    sim.run().unwrap()
}

/// Two replicas; a long request (2,000 output tokens) starts at 0 on the newest (slot 1), which
/// crashes at 5 s. Retried (Dynamo's migration), it goes to slot 0 at once and finishes there:
/// its first token is the one it streamed before the crash, and it ends later than without the
/// crash by at least the lost decode time. With no retry it fails, and nothing completes.
#[test]
fn a_request_lost_in_a_crash_is_retried_on_another_replica_or_fails() {
    let rows = [(0.0, 7, 1000, 2000)];
    let calm = run(&spec(2, ""), &stream(&rows));
    let crash = |retries: u32| {
        spec(2, &format!("failures: {{crashes: [{{replica: 1, at_s: 5}}], restart_s: 60, max_retries: {retries}}}"))
    };
    let out = run(&crash(1), &stream(&rows));
    let (r, c) = (&out.records[0], &calm.records[0]);
    assert_eq!((c.replica, r.replica), (1, 0), "calm on the newest; retried on the survivor");
    assert!(c.completed_at_s > 5.0, "the request was still running at the crash ({})", c.completed_at_s);
    assert_eq!(r.first_token_at_s, c.first_token_at_s, "the first token streamed before the crash stands");
    assert!(r.completed_at_s > c.completed_at_s, "{} vs {}", r.completed_at_s, c.completed_at_s);
    let m = &out.metrics;
    let got = ["crashes", "requests_lost", "retried_requests", "failed_requests", "completed"].map(|k| m.get(k));
    assert_eq!(got, [Some(1.0), Some(1.0), Some(1.0), Some(0.0), Some(1.0)], "{m:?}");
    // Replica 1 was down from 5 s to the end (its restart at 65 s comes after).
    let end = r.completed_at_s;
    let want = 1.0 - (end - 5.0).min(60.0) / (2.0 * end);
    assert!((m.get("availability").unwrap() - want).abs() < 1e-9, "{m:?} vs {want}");

    let out = run(&crash(0), &stream(&rows));
    assert_eq!(out.records[0].end, End::Failed);
    assert!(out.records[0].completed_at_s.is_nan());
    let m = &out.metrics;
    assert_eq!(
        (m.get("failed_requests"), m.get("completed"), m.get("retried_requests")),
        (Some(1.0), Some(0.0), Some(0.0))
    );
}

/// A random crash is drawn in one life of its replica and is void once that life has ended:
/// replica 1 crashes (scheduled) at 5 s and is back at 10 s; a random crash drawn in its first
/// life (life 0) falling at 20 s is no crash, one drawn in its second (life 1) is. (Before lives,
/// the first kind fired too, and a scheduled crash doubled the replica's random rate.)
#[test]
fn a_random_crash_drawn_in_an_ended_life_is_void() {
    let spec = spec(2, "failures: {crashes: [{replica: 1, at_s: 5}], restart_s: 5}");
    let rows = [(0.0, 7, 1000, 2000)];
    let with_random = |life: u32| {
        let out = run_with(&spec, &stream(&rows), |sim| {
            sim.queue.push(ticks(20.0), Event::Crash { slot: crate::ids::ReplicaId::from_u32(1), life });
        });
        assert!(out.records[0].completed_at_s > 20.0, "the run is live at 20 s");
        out.metrics.get("crashes")
    };
    assert_eq!(with_random(0), Some(1.0), "drawn before the scheduled crash: void");
    assert_eq!(with_random(1), Some(2.0), "drawn after the restart: a crash");
}

/// Lock-step groups fail whole: four engines of a MoE in two groups of two; replica 2 (idle)
/// crashes at 5 s and takes replica 3, its group's other engine, with it, so the long request
/// on replica 3 (the newest) is lost and retried on replica 1 (the newest left). Both engines
/// are back at 15 s, at the top indices in slot order, cold: a request at 15 s goes to replica
/// 3 again. One crash; two engines down 10 s each.
#[test]
fn a_lock_step_group_crashes_and_restarts_whole() {
    let moe = "gpu: rtx-pro-6000\nmodel: qwen3-30b-a3b\nexpert_parallel: 2\ndata_parallel: 2\n\
               failures: {crashes: [{replica: 2, at_s: 5}], restart_s: 10}";
    let rows = [(0.0, 7, 1000, 2000), (15.0, 7, 1000, 1)];
    let out = run(&spec(4, moe), &stream(&rows));
    let r = &out.records;
    assert_eq!((r[0].replica, r[1].replica), (1, 3), "retried on the other group; the group back at 15 s");
    assert!(r[0].completed_at_s > 15.0, "the long request outlives the restart ({})", r[0].completed_at_s);
    assert_eq!(r[1].cached_tokens, 0, "the restarted engine is cold");
    let m = &out.metrics;
    let got = ["crashes", "requests_lost", "retried_requests", "failed_requests"].map(|k| m.get(k));
    assert_eq!(got, [Some(1.0), Some(1.0), Some(1.0), Some(0.0)], "{m:?}");
    let end = r[0].completed_at_s.max(r[1].completed_at_s);
    let want = 1.0 - 2.0 * 10.0 / (4.0 * end);
    assert!((m.get("availability").unwrap() - want).abs() < 1e-9, "{m:?} vs {want}");
}

/// A slow replica (`failures.slowdowns`): every step it starts in the window takes `factor` times
/// as long, so a lone request's TTFT and latency triple under a whole-run factor 3 (to the
/// nanosecond tick each step rounds to); a window that closes before the request, or factor 1,
/// leaves every record exactly as without it; a window that opens mid-request slows only the
/// steps from then on. Nothing is lost: the replica stays up.
#[test]
fn a_slow_replica_stretches_the_steps_it_starts_in_its_window() {
    let rows = [(10.0, 7, 1000, 50)];
    let calm = run(&spec(1, ""), &stream(&rows));
    let slow = |d: &str| run(&spec(1, &format!("failures: {{slowdowns: [{d}]}}")), &stream(&rows));
    let c = &calm.records[0];
    let ttft = |r: &RequestRecord| r.first_token_at_s - r.arrived_at_s;
    let latency = |r: &RequestRecord| r.completed_at_s - r.arrived_at_s;
    let whole = slow("{replica: 0, factor: 3}");
    let w = &whole.records[0];
    let (ct, cl) = (ttft(c), latency(c));
    let (wt, wl) = (ttft(w), latency(w));
    let steps = 51.0; // the prefill and 50 decode steps, each rounded up to a whole tick at most
    assert!((wt - 3.0 * ct).abs() < 2e-9, "TTFT {wt} vs 3 × {ct}");
    assert!((wl - 3.0 * cl).abs() < steps * 2e-9, "latency {wl} vs 3 × {cl}");
    assert_eq!(whole.metrics.get("crashes"), Some(0.0));
    assert_eq!(whole.metrics.get("availability"), Some(1.0), "a slow replica is up");
    for unchanged in ["{replica: 0, factor: 3, from_s: 0, until_s: 10}", "{replica: 0, factor: 1}"] {
        let u = slow(unchanged);
        assert_eq!(
            (u.records[0].first_token_at_s, u.records[0].completed_at_s),
            (c.first_token_at_s, c.completed_at_s),
            "{unchanged}"
        );
    }
    // From the first token on: the prefill as calm, the decode steps three times as long.
    let later = slow(&format!("{{replica: 0, factor: 3, from_s: {}}}", c.first_token_at_s));
    let l = &later.records[0];
    assert_eq!(l.first_token_at_s, c.first_token_at_s);
    let (decode_calm, decode_slow) = (c.completed_at_s - c.first_token_at_s, l.completed_at_s - l.first_token_at_s);
    assert!((decode_slow - 3.0 * decode_calm).abs() < steps * 2e-9, "{decode_slow} vs 3 × {decode_calm}");
}

/// The shipped `slow_replica.yaml` (seed 1): round robin keeps feeding the slow replica and
/// misses the TTFT SLO on several percent of requests, while a router reading live load routes
/// around it and keeps nearly all (docs/experiments.md, "Failures: a slow replica").
#[test]
fn round_robin_suffers_a_slow_replica_that_a_load_reading_router_routes_around() {
    let spec = super::tests::preset("slow_replica");
    let attained = |router: &str| {
        let out = super::tests::run_named(&spec, None, router, 1).unwrap();
        out.metrics.get("slo_attainment").unwrap()
    };
    let (rr, lwl) = (attained("round_robin"), attained("least_work_left"));
    assert!(rr < 0.96 && lwl > 0.99, "round_robin {rr}, least_work_left {lwl}");
    let mut calm = spec.clone();
    calm.failures = None;
    let calm_rr = super::tests::run_named(&calm, None, "round_robin", 1).unwrap().metrics.get("slo_attainment");
    assert!(calm_rr.unwrap() > 0.99, "without the slowdown round robin holds the SLO: {calm_rr:?}");
}

/// Lost KV events (`failures.kv_event_loss`) on long_doc_qa (seed 1), whose documents do not all
/// fit and are evicted all the time: `dynamo_kv` indexes the replicas' caches from its events.
/// About the share asked for is lost (of the events a lossless run hears, within a wide band: the
/// lost events change the routing, and so the evictions), more at a higher loss, the seed replays
/// exactly, and the router, believing in blocks that are gone, decides differently.
#[test]
fn lost_kv_events_are_drawn_from_the_seed_and_mislead_an_indexing_router() {
    let base = super::tests::preset("long_doc_qa");
    let with_loss = |p: f64| {
        let mut spec = base.clone();
        spec.failures = Some(serde_norway::from_str(&format!("kv_event_loss: {p}")).unwrap());
        super::tests::run_named(&spec, None, "dynamo_kv", 1).unwrap()
    };
    let (low, high) = (with_loss(0.1), with_loss(0.6));
    let lost = |o: &RunOutcome| o.metrics.get("kv_events_lost").unwrap();
    assert!(lost(&low) > 10.0, "{}", lost(&low));
    assert!(lost(&high) > 3.0 * lost(&low), "{} vs {}", lost(&high), lost(&low));
    assert_eq!(with_loss(0.6).metrics, high.metrics, "the seed replays the same losses");
    let lossless = super::tests::run_named(&base, None, "dynamo_kv", 1).unwrap();
    assert!(lossless.metrics.get("kv_events_lost").is_none(), "no failures section: no such key");
    let routed = |o: &RunOutcome| o.records.iter().map(|r| r.replica).collect::<Vec<_>>();
    assert_ne!(routed(&high), routed(&lossless), "phantom blocks move decisions");
}

/// One replica crashes at 1 s and restarts 10 s later, cold: a request at 5 s finds no replica
/// up and fails; one at 11 s (the restart's instant: it comes after) is served with nothing
/// cached, although the same prompt was computed there at 0 s.
#[test]
fn a_restarted_replica_comes_back_cold_and_requests_fail_while_none_is_up() {
    let spec = spec(1, "failures: {crashes: [{replica: 0, at_s: 1}], restart_s: 10}");
    let out = run(&spec, &stream(&[(0.0, 7, 1000, 1), (5.0, 7, 1000, 1), (11.0, 7, 1000, 1)]));
    let r = &out.records;
    assert!(r[0].completed_at_s < 1.0, "the first request is done before the crash");
    assert_eq!(r[1].end, End::Failed, "nothing is up at 5 s");
    assert_eq!((r[2].end, r[2].cached_tokens), (End::Served, 0), "cold after the restart");
    let ttft = |x: &RequestRecord| x.first_token_at_s - x.arrived_at_s;
    assert!((ttft(&r[2]) - ttft(&r[0])).abs() < 1e-9, "{} vs {}", ttft(&r[2]), ttft(&r[0]));
    assert_eq!(out.metrics.get("requests_lost"), Some(0.0));
}

/// A generated workload under random crashes (MTBF 20 s, restart 5 s, one retry) with a
/// load-aware and a prefix-aware router, on four independent replicas and on four engines of a
/// MoE in two lock-step groups (a member's crash takes its group): every request completes or
/// fails exactly once (the finish's conservation check runs under debug assertions), the run
/// replays exactly from its seed, and another seed crashes differently.
#[test]
fn every_request_completes_or_fails_once_under_random_crashes_and_the_seed_replays() {
    let moe = "gpu: rtx-pro-6000\nmodel: qwen3-30b-a3b\nexpert_parallel: 2\ndata_parallel: 2\n";
    for extra in ["", moe] {
        crashes_conserve(&format!("{extra}failures: {{mtbf_s: 20, restart_s: 5, max_retries: 1}}"));
    }
}

/// [`every_request_completes_or_fails_once_under_random_crashes_and_the_seed_replays`] on a
/// four-replica cluster with `extra` fields.
fn crashes_conserve(extra: &str) {
    let mut spec = spec(4, extra);
    spec.generator = serde_norway::from_str(
        "{system_prompt_tokens: 200, contexts: {count: 8, tokens: 800}, suffix_tokens: 50, output_tokens: 200}",
    )
    .unwrap();
    spec.arrivals = crate::workload::cluster::Arrivals::Poisson { rate: 8.0 };
    spec.requests = Some(1500);
    let resolved = StepModels::resolve(&spec).unwrap();
    let sm = &resolved.main;
    let stream = crate::workload::generate::generate(&spec, None, 1).unwrap();
    for policy in ["least_requests", "least_work_left", "sglang_cache_aware"] {
        let once = |seed: u64| {
            let mut loader = Loader::new();
            let ctx = router_context_for(&spec, &resolved, seed);
            let router = loader.router(&PolicySpec::parse(policy).unwrap(), &ctx).unwrap();
            let sched = loader
                .resolve(&PolicySpec::parse("fcfs").unwrap(), routelab_policy_api::PolicyKind::Scheduler)
                .unwrap();
            let schedulers = crate::runner::make_schedulers(&sched, sm, spec.slots(), seed).unwrap();
            let sim = ClusterSim::build(&spec, &resolved, &stream, router, schedulers, policy).unwrap();
            sim.with_failures(spec.failures.as_ref(), seed).run().unwrap_or_else(|e| panic!("{policy}: {e}"))
        };
        let (a, b, c) = (once(1), once(1), once(2));
        let m = &a.metrics;
        let n = |k: &str| m.get(k).unwrap();
        assert!(n("crashes") > 0.0 && n("requests_lost") > 0.0, "{policy}: {m:?}");
        assert_eq!(n("completed") + n("failed_requests") + n("unfinished"), 1500.0, "{policy}: {m:?}");
        let failed = a.records.iter().filter(|r| r.end == End::Failed).count();
        assert_eq!(failed as f64, n("failed_requests"), "{policy}");
        assert!(n("availability") < 1.0 && n("availability") > 0.5, "{policy}: {m:?}");
        assert_eq!(format!("{:?}", a.metrics), format!("{:?}", b.metrics), "{policy}: same seed, same run");
        assert_ne!(
            a.metrics.get("crashes").zip(a.metrics.get("latency_mean_s")),
            c.metrics.get("crashes").zip(c.metrics.get("latency_mean_s")),
            "{policy}"
        );
    }
}

/// Where each router sends the traffic that arrives while replica 0 of `slow_replica.yaml` is
/// slow (30–90 s, seed 1): round robin its eighth, the live-load readers a few percent, and
/// `llm_d` (scraped waiting counts, KV use and prefix) a little more than least-requests: its
/// KV-utilisation scorer reads KV use as vLLM reports it, the blocks running requests hold, so the
/// slow replica's backlog shows in it; counted with the warm cache (as before the views followed
/// vLLM) every replica read nearly full and `llm_d` sent the slow replica 10.1%
/// (docs/experiments.md, "Failures: a slow replica").
#[test]
fn llm_d_routes_around_the_slow_replica_nearly_as_well_as_live_load_readers() {
    let spec = super::tests::preset("slow_replica");
    let share = |router: &str| {
        let out = super::tests::run_named(&spec, None, router, 1).unwrap();
        let window = out.records.iter().filter(|r| (30.0..90.0).contains(&r.arrived_at_s));
        let (n, on_slow) = window.fold((0, 0), |(n, k), r| (n + 1, k + usize::from(r.replica == 0)));
        on_slow as f64 / n as f64
    };
    let (rr, least, llm_d) = (share("round_robin"), share("least_requests"), share("llm_d"));
    assert!((rr - 0.125).abs() < 0.01, "round robin's share {rr}");
    assert!(least < 0.06, "least_requests {least}");
    assert!(llm_d > least && llm_d < 0.07, "llm_d {llm_d} vs least_requests {least}");
}
