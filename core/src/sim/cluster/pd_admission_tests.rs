//! Request classes and admission on a disaggregated cluster (issue 27): the same admission calls
//! as on an aggregated one (`admit_all` changes nothing, `gie_saturation` sheds only the
//! sheddable class and every request ends once), and a P/D router sees each request's class.

use super::class_tests::{classes_preset, run};
use super::*;

/// overload_shedding's classes and tenants on its 4 replicas split 3 prefill + 1 decode (as
/// `classes/pd_overload.yaml`), `requests` requests.
fn pd_classes(requests: u64) -> ClusterSpec {
    let mut spec = classes_preset();
    spec.requests = Some(requests);
    spec.disaggregation = Some(
        serde_norway::from_str("{prefill: {instances: 3}, decode: {instances: 1}, link: {bandwidth_gbps: 100}}")
            .unwrap(),
    );
    spec
}

/// `admit_all` in front of a P/D router changes nothing: the same figures and records, bit for
/// bit, as no admission call at all (what a disaggregated run did before admission reached it).
#[test]
fn admit_all_on_a_pd_cluster_leaves_every_figure_as_it_was() {
    let spec = pd_classes(600);
    let a = run(&spec, "pd_least_loaded", None, 2);
    let b = run(&spec, "pd_least_loaded", Some("admit_all"), 2);
    assert_eq!(a, b);
    assert!(a.metrics.get("transfer_share").is_some_and(|s| s > 0.0), "requests were disaggregated");
}

/// Through the overload (the one decode instance's memory fills with batch requests' long
/// outputs) `gie_saturation` sheds batch requests only, before the P/D router sees them; every
/// request ends exactly once (finished, shed, or unfinished at the horizon), the router rejects
/// none, and the P/D figures count the served requests only. Its KV threshold is 0.05: at
/// upstream's 0.8 the detector does not see the decode bottleneck and sheds nothing
/// (docs/experiments.md, "On a disaggregated fleet").
#[test]
fn gie_saturation_sheds_only_batch_before_the_pd_router() {
    let mut spec = pd_classes(1500);
    let gie = "gie_saturation{kv_cache_util_threshold: 0.05}";
    spec.admission = gie.into();
    let out = run(&spec, "pd_least_loaded", Some(gie), 1);
    let rs = &out.records;
    let finished = rs.iter().filter(|r| r.completed_at_s.is_finite()).count();
    let shed = rs.iter().filter(|r| r.end == End::Shed).count();
    let unfinished = rs.iter().filter(|r| r.end == End::Served && !r.completed_at_s.is_finite()).count();
    assert_eq!(finished + shed + unfinished, rs.len(), "nothing is rejected here, so these are all");
    assert!(shed > 20, "the overload should shed batch requests: {shed}");
    assert!(rs.iter().filter(|r| r.end == End::Shed).all(|r| r.class == 2), "only batch is sheddable");
    assert!(rs.iter().filter(|r| r.end == End::Shed).all(|r| !r.admitted_at_s.is_finite()), "never served");
    let get = |k: &str| out.metrics.get(k).unwrap_or_else(|| panic!("no {k}"));
    assert_eq!(get("shed_requests"), shed as f64);
    assert_eq!(get("class.batch.shed"), shed as f64);
    assert_eq!(get("class.critical.shed") + get("class.standard.shed"), 0.0);
    assert_eq!(get("rejected"), 0.0, "admission's sheds are not the router's rejections");
    assert_eq!(get("completed"), finished as f64);
    // Every served request prefilled on the prefill pool and decoded on the decode pool: the
    // share that skipped prefill is over the served requests, shed ones excluded.
    assert_eq!(get("decode_only_share"), 0.0);
    assert!(rs.iter().filter(|r| r.completed_at_s.is_finite()).all(|r| r.replica == 3), "decoded on instance 3");
}

/// A P/D router that turns away every request whose class priority is negative: it reads the
/// priority the host hands it (before admission reached P/D clusters, a P/D router was given a
/// blank request info, so every priority read 0).
#[test]
fn a_pd_router_reads_each_requests_class() {
    use routelab_policy_api::*;
    #[derive(serde::Serialize, serde::Deserialize, Default)]
    struct NoConfig {}
    struct RejectSheddable(u32);
    impl Policy for RejectSheddable {
        const NAME: &'static str = "reject_sheddable";
        const DESCRIPTION: &'static str = "test";
        type Config = NoConfig;
        type Context = RouterContext;
        fn new(_: NoConfig, _: &RouterContext) -> Result<Self, String> {
            Ok(RejectSheddable(0))
        }
    }
    impl PdRouterPolicy for RejectSheddable {
        fn request_facts(&self) -> Vec<String> {
            vec![facts::request::PRIORITY.into()]
        }
        fn route_pair(&mut self, request: &Request<'_>, prefill: &Replicas<'_>, decode: &Replicas<'_>) -> PdRoute {
            if request.fact(0) < 0.0 {
                return PdRoute::Reject;
            }
            self.0 += 1;
            let k = self.0 as usize;
            PdRoute::Disaggregate { prefill: k % prefill.len(), decode: k % decode.len(), prefix_from: None }
        }
    }
    let spec = pd_classes(400);
    let router: RouterBox = routelab_policy_api::Router_TO::from_value(
        GuardedPd::new(RejectSheddable(0)),
        abi_stable::sabi_trait::TD_Opaque,
    );
    let stream = crate::workload::generate::generate(&spec, None, 1).unwrap();
    let out = crate::runner::run_cluster(&spec, &stream, router, "reject_sheddable", 1).unwrap();
    let batch = out.records.iter().filter(|r| r.class == 2).count();
    assert!(batch > 50, "{batch}");
    for r in &out.records {
        assert_eq!(r.end == End::Rejected, r.class == 2, "request of class {} ended {:?}", r.class, r.end);
    }
    assert_eq!(out.metrics.get("rejected"), Some(batch as f64));
}
