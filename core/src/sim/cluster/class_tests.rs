//! Request classes, tenants and admission in the cluster world (issue 27): the stream's labels,
//! conservation, the per-class figures recomputed from per-request records, and `admit_all`
//! leaving every figure as it was.

use routelab_policy_api::PolicyKind;

use super::tests::preset;
use super::*;
use crate::plugin::{Loader, PolicySpec};
use crate::workload::generate::generate;

pub(super) fn classes_preset() -> ClusterSpec {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .join("workloads/cluster/classes/overload_shedding.yaml");
    crate::workload::load(&path).unwrap_or_else(|e| panic!("{e}")).cluster.unwrap()
}

/// Runs `router` on `spec` for `seed`, with the admission policy `admission` (a policy argument)
/// in front of it, or none.
pub(super) fn run(spec: &ClusterSpec, router: &str, admission: Option<&str>, seed: u64) -> RunOutcome {
    run_with(spec, router, admission, seed, |sim| sim.run().unwrap())
}

/// Builds the run [`run`] runs, and hands it to `go`.
pub(super) fn run_with<T>(
    spec: &ClusterSpec,
    router: &str,
    admission: Option<&str>,
    seed: u64,
    go: impl FnOnce(ClusterSim) -> T,
) -> T {
    let resolved = StepModels::resolve(spec).unwrap();
    let sm = &resolved.main;
    let mut loader = Loader::new();
    let r = loader.router(&PolicySpec::parse(router).unwrap(), &router_context_for(spec, &resolved, seed)).unwrap();
    let sched = loader.resolve(&PolicySpec::parse(&spec.scheduler).unwrap(), PolicyKind::Scheduler).unwrap();
    let schedulers = crate::runner::make_schedulers(&sched, sm, spec.replicas, seed).unwrap();
    let stream = generate(spec, None, seed).unwrap();
    let mut sim = ClusterSim::build(spec, &resolved, &stream, r, schedulers, router).unwrap();
    if let Some(a) = admission {
        let f = loader.admission_factory(&PolicySpec::parse(a).unwrap()).unwrap();
        sim = sim.with_admission(f.admission(&admission_context(spec, &resolved, seed)).unwrap(), a).unwrap();
    }
    go(sim)
}

/// Classes and tenants come from their own random stream: a workload without class-specific
/// sizes keeps its arrivals and sizes request for request, and the labels follow the shares.
#[test]
fn classes_move_no_arrival_and_follow_their_shares() {
    let mut plain = preset("tool_use");
    plain.requests = Some(4000);
    let mut labelled = plain.clone();
    labelled.classes = classes_preset().classes;
    for c in &mut labelled.classes {
        c.output_tokens = None;
    }
    labelled.tenants = classes_preset().tenants;
    let (a, b) = (generate(&plain, None, 3).unwrap(), generate(&labelled, None, 3).unwrap());
    assert_eq!(a.requests, b.requests);
    assert!(a.labels.is_empty() && b.labels.len() == b.requests.len());
    let share = |f: &dyn Fn(&crate::workload::cluster::classes::Label) -> bool| {
        b.labels.iter().filter(|l| f(l)).count() as f64 / b.labels.len() as f64
    };
    // Shares 0.2 / 0.3 / 0.5 and weights 4/8 of 4000 requests (tool_use has one turn each).
    assert!((share(&|l| l.class == 0) - 0.2).abs() < 0.03, "{}", share(&|l| l.class == 0));
    assert!((share(&|l| l.class == 1) - 0.3).abs() < 0.03);
    assert!((share(&|l| l.tenant == 0) - 0.5).abs() < 0.03);
    assert!(b.labels.iter().all(|l| l.class < 3 && l.tenant < 4));
}

/// A class's own output sizes are what its requests get.
#[test]
fn a_class_draws_its_own_output_sizes() {
    let mut spec = classes_preset();
    spec.requests = Some(2000);
    let s = generate(&spec, None, 1).unwrap();
    for (r, l) in s.requests.iter().zip(&s.labels) {
        let (lo, hi) = if l.class == 2 { (200, 400) } else { (10, 80) };
        assert!((lo..=hi).contains(&r.output_tokens), "class {} drew {}", l.class, r.output_tokens);
    }
}

/// `admit_all` in front of the router changes nothing: the same figures, bit for bit, as no
/// admission call at all.
#[test]
fn admit_all_leaves_every_figure_as_it_was() {
    let mut spec = preset("tool_use");
    spec.requests = Some(800);
    let a = run(&spec, "least_requests", None, 2);
    let b = run(&spec, "least_requests", Some("admit_all"), 2);
    assert_eq!(a, b);
}

/// Every view (router's, admission's, scaler's: one set) reads KV use as vLLM reports it
/// (what the inference extension's detector and a scrape read): blocks running requests hold.
/// At the end of a run every replica is idle with a warm prefix cache: the engine holds it, the
/// views count none of it.
#[test]
fn views_count_kv_as_vllm_reports_it() {
    let mut spec = classes_preset();
    spec.requests = Some(300);
    spec.admission = "gie_saturation".into();
    run_with(&spec, "round_robin", Some("gie_saturation"), 1, |mut sim| {
        sim.run_events().unwrap();
        sim.refresh_views(sim.last_arrived);
        assert_eq!(sim.views.len(), spec.replicas as usize);
        for (k, v) in sim.views.iter().enumerate() {
            let rep = &sim.replicas[sim.routable[k]];
            assert_eq!(v.kv_used_tokens, rep.kv_referenced_tokens());
            assert!(rep.kv_used_tokens() > 0 && v.kv_used_tokens == 0, "replica {k}: {v:?}");
        }
    });
}

/// Every request ends exactly once (finished, rejected, shed, or unfinished at the horizon), and
/// under overload `gie_saturation` sheds only the sheddable class; the run's own assertion (checked
/// profile) checks no request ended twice.
#[test]
fn gie_saturation_sheds_only_the_sheddable_class_and_conserves_requests() {
    let mut spec = classes_preset();
    spec.requests = Some(1500);
    spec.admission = "gie_saturation".into();
    let out = run(&spec, "least_requests", Some("gie_saturation"), 1);
    let n = out.records.len();
    let finished = out.records.iter().filter(|r| r.completed_at_s.is_finite()).count();
    let shed = out.records.iter().filter(|r| r.end == End::Shed).count();
    let rejected = out.records.iter().filter(|r| r.end == End::Rejected).count();
    let unfinished = out.records.iter().filter(|r| r.end == End::Served && !r.completed_at_s.is_finite()).count();
    assert_eq!(finished + shed + rejected + unfinished, n);
    assert!(out.records.iter().all(|r| !(r.end != End::Served && r.completed_at_s.is_finite())));
    assert!(shed > 50, "the overload should shed batch requests: {shed}");
    assert!(out.records.iter().filter(|r| r.end == End::Shed).all(|r| r.class == 2), "only batch is sheddable");
    assert_eq!(out.metrics.get("shed_requests"), Some(shed as f64));
    assert_eq!(out.metrics.get("admission.shed"), Some(shed as f64));
    assert_eq!(out.metrics.get("completed"), Some(finished as f64));
    // Shedding batch keeps the critical class's TTFT lower than admitting everything does.
    let all = run(&spec, "least_requests", Some("admit_all"), 1);
    let p99 = |o: &RunOutcome| o.metrics.get("class.critical.ttft_p99_s").unwrap();
    assert!(p99(&out) < p99(&all), "shed {} vs all {}", p99(&out), p99(&all));
}

/// The per-class and per-tenant figures, recomputed here from the per-request records.
#[test]
fn per_class_and_tenant_figures_recompute_from_the_records() {
    let mut spec = classes_preset();
    spec.requests = Some(1200);
    spec.admission = "gie_saturation".into();
    let out = run(&spec, "round_robin", Some("gie_saturation"), 3);
    let rs = &out.records;
    let get = |k: &str| out.metrics.get(k).unwrap_or_else(|| panic!("no {k}"));
    let span = rs.iter().map(|r| r.arrived_at_s).fold(f64::NEG_INFINITY, f64::max)
        - rs.iter().map(|r| r.arrived_at_s).fold(f64::INFINITY, f64::min);
    let ttft_bound = |class: u16| [2.0, 4.0, 30.0][class as usize];
    let ok =
        |r: &RequestRecord| r.completed_at_s.is_finite() && r.first_token_at_s - r.arrived_at_s <= ttft_bound(r.class);
    let mut total_ok = 0;
    for (k, name) in ["critical", "standard", "batch"].iter().enumerate() {
        let mine: Vec<_> = rs.iter().filter(|r| r.class as usize == k).collect();
        let met = mine.iter().filter(|r| ok(r)).count();
        total_ok += met;
        assert_eq!(get(&format!("class.{name}.requests")), mine.len() as f64);
        assert_eq!(get(&format!("class.{name}.slo_attainment")), met as f64 / mine.len() as f64, "{name}");
        assert_eq!(get(&format!("class.{name}.goodput_rps")), met as f64 / span);
        let shed = mine.iter().filter(|r| r.end == End::Shed).count();
        assert_eq!(get(&format!("class.{name}.shed")), shed as f64);
    }
    assert_eq!(get("slo_attainment"), total_ok as f64 / rs.len() as f64);
    let weights = [4.0, 2.0, 1.0, 1.0];
    let x: Vec<f64> = (0..4)
        .map(|t| {
            rs.iter()
                .filter(|r| r.tenant == t && r.completed_at_s.is_finite())
                .map(|r| (r.prompt_tokens + r.output_tokens) as f64)
                .sum::<f64>()
                / weights[t as usize]
        })
        .collect();
    let jain = x.iter().sum::<f64>().powi(2) / (4.0 * x.iter().map(|v| v * v).sum::<f64>());
    assert!((get("tenant_fairness_jain") - jain).abs() < 1e-12, "{} vs {jain}", get("tenant_fairness_jain"));
    let worst = (0..4)
        .map(|t| {
            let mine: Vec<_> = rs.iter().filter(|r| r.tenant == t).collect();
            mine.iter().filter(|r| ok(r)).count() as f64 / mine.len() as f64
        })
        .fold(f64::INFINITY, f64::min);
    assert_eq!(get("tenant_attainment_min"), worst);
    // Each class's admission wait: arrival → handed to the router over its requests routed. A
    // policy that holds requests (llm_d_flow_control, strict priority bands) gives waits that
    // differ by class; gie_saturation only sheds, so every wait is 0.
    let mut flow = spec.clone();
    flow.admission = "llm_d_flow_control".into();
    let held = run(&flow, "round_robin", Some("llm_d_flow_control"), 3);
    for out in [&out, &held] {
        let get = |k: &str| out.metrics.get(k).unwrap_or_else(|| panic!("no {k}"));
        let waits = |class: Option<u16>| -> Vec<f64> {
            let rs = out.records.iter().filter(|r| class.is_none_or(|c| r.class == c));
            rs.filter(|r| r.end == End::Served && r.dispatched_at_s.is_finite())
                .map(|r| r.dispatched_at_s - r.arrived_at_s)
                .collect()
        };
        let mean = |w: &[f64]| w.iter().sum::<f64>() / w.len() as f64;
        let overall = waits(None);
        assert_eq!(get("admission_wait_mean_s"), mean(&overall));
        for (k, name) in ["critical", "standard", "batch"].iter().enumerate() {
            let mine = waits(Some(k as u16));
            assert!(!mine.is_empty(), "{name}: some requests routed");
            assert_eq!(get(&format!("class.{name}.admission_wait_mean_s")), mean(&mine), "{name}");
        }
    }
    let wait = |o: &RunOutcome, name: &str| o.metrics.get(&format!("class.{name}.admission_wait_mean_s")).unwrap();
    assert!(["critical", "standard", "batch"].iter().all(|n| wait(&out, n) == 0.0));
    assert!(wait(&held, "critical") < wait(&held, "batch"), "{} vs {}", wait(&held, "critical"), wait(&held, "batch"));
}

/// A scheduler that asks for `priority` gets each waiting request's, row by row (here it orders
/// the queue by priority, highest first, as a priority-aware batch order would).
#[test]
fn a_scheduler_reads_each_waiting_requests_priority() {
    use routelab_policy_api::*;
    #[derive(serde::Serialize, serde::Deserialize, Default)]
    struct NoConfig {}
    struct ByPriority;
    impl Policy for ByPriority {
        const NAME: &'static str = "by_priority";
        const DESCRIPTION: &'static str = "test";
        type Config = NoConfig;
        type Context = SchedulerContext;
        fn new(_: NoConfig, _: &SchedulerContext) -> Result<Self, String> {
            Ok(ByPriority)
        }
    }
    impl SchedulerPolicy for ByPriority {
        fn request_facts(&self) -> Vec<String> {
            vec![facts::request::PRIORITY.into()]
        }
        fn order(&mut self, _: f64, waiting: &Waiting<'_>, order: &mut Vec<u32>) {
            order.extend(0..waiting.len() as u32);
            order.sort_by(|&a, &b| waiting.fact(b as usize, 0).total_cmp(&waiting.fact(a as usize, 0)));
        }
    }
    let boxed = Scheduler_TO::from_value(Guarded::new(ByPriority), abi_stable::sabi_trait::TD_Opaque);
    let mut h = crate::handle::SchedulerHandle::new(boxed, 0, "under_test".into());
    let info = |priority| RequestInfo { priority, ..RequestInfo::plain() };
    h.set_infos(vec![info(0), info(-1), info(2), info(1)].into());
    let row =
        |id| WaitingRequest { id, arrived_at: 0.0, prompt_tokens: 1, cached_tokens: 0, remaining_prefill_tokens: 1 };
    let waiting = [row(1), row(0), row(3), row(2)];
    let mut order = abi_stable::std_types::RVec::new();
    h.order(0.0, &waiting, &mut order).unwrap();
    // Priorities by row: -1, 0, 1, 2 → rows 3, 2, 1, 0.
    assert_eq!(order.as_slice(), &[3, 2, 1, 0]);
}

/// The queueing and rejecting built-ins end every request exactly once through an overload
/// (none left waiting: the held queues drain), and each does what it is for: flow control's
/// strict bands keep critical's TTFT P99 below admit_all's, its TTL sheds only held requests,
/// early rejection turns requests away on arrival, and VTC serves tenants at least as evenly
/// (Jain's index over served tokens ÷ weight) as admitting everything.
#[test]
fn queueing_and_rejecting_built_ins_conserve_requests() {
    let mut spec = classes_preset();
    spec.requests = Some(1500);
    let all = run(&spec, "least_requests", Some("admit_all"), 1);
    let get = |o: &RunOutcome, k: &str| o.metrics.get(k).unwrap_or_else(|| panic!("no {k}"));
    for a in ["vtc{weights: [4, 2, 1, 1]}", "llm_d_flow_control{ttl_s: 20}", "mooncake_early_reject{threshold: 0.1}"] {
        spec.admission = a.into();
        let out = run(&spec, "least_requests", Some(a), 1);
        let rs = &out.records;
        let finished = rs.iter().filter(|r| r.completed_at_s.is_finite()).count();
        let shed = rs.iter().filter(|r| r.end == End::Shed).count();
        let rejected = rs.iter().filter(|r| r.end == End::Rejected).count();
        assert_eq!(finished + shed + rejected, rs.len(), "{a}: every request ends, none is left held");
        assert_eq!(get(&out, "completed"), finished as f64, "{a}");
        match a.split('{').next().unwrap() {
            "llm_d_flow_control" => {
                assert_eq!(rejected, 0);
                assert_eq!(get(&out, "admission.expired"), shed as f64);
                let p99 = |o: &RunOutcome| get(o, "class.critical.ttft_p99_s");
                assert!(p99(&out) < p99(&all), "flow control {} vs admit_all {}", p99(&out), p99(&all));
            }
            "mooncake_early_reject" => {
                assert!(rejected > 0 && shed == 0, "rejected {rejected}, shed {shed}");
                assert_eq!(get(&out, "admission.rejected"), rejected as f64);
            }
            _ => {
                assert!(shed + rejected == 0);
                assert!(get(&out, "held_requests") > 0.0, "the overload should make VTC hold");
                let jain = |o: &RunOutcome| get(o, "tenant_fairness_jain");
                assert!(jain(&out) >= jain(&all) - 1e-9, "vtc {} vs admit_all {}", jain(&out), jain(&all));
            }
        }
    }
}
