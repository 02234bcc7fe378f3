//! Mixed GPUs (`cluster.pools`): each replica's steps priced on its pool's GPU, and the fleet's
//! cost from each pool's price.

use routelab_policy_api::{Maker, Policy, Replicas, Request, RouterContext, RouterPolicy, Segment};

use super::*;
use crate::plugin::{Loader, PolicySpec};
use crate::time::ticks;
use crate::workload::generate::{GeneratedRequest, RequestStream};

/// Sends request `i` to replica `i mod n`.
struct ById;

impl Policy for ById {
    const NAME: &'static str = "by_id";
    const DESCRIPTION: &'static str = "request i to replica i mod n";
    type Config = ();
    type Context = RouterContext;
    fn new(_: (), _: &RouterContext) -> Result<Self, String> {
        Ok(ById)
    }
}

impl RouterPolicy for ById {
    fn route(&mut self, request: &Request<'_>, replicas: &Replicas<'_>) -> usize {
        request.id as usize % replicas.len()
    }
}

fn spec(yaml: &str) -> ClusterSpec {
    let spec: ClusterSpec = serde_norway::from_str(&format!(
        "{yaml}\nchunk_tokens: 0\ngenerator: {{output_tokens: 1}}\narrivals: {{poisson: {{rate: 1}}}}\nrequests: 2\n"
    ))
    .unwrap();
    spec.validate().unwrap_or_else(|e| panic!("{}: {}", e.path, e.message));
    spec
}

/// Two requests with the same 2,000-token prompt and 100 output tokens, at 0 and 0.001 s.
fn stream() -> RequestStream {
    let mut s = RequestStream::default();
    for (i, at) in [0.0, 0.001].into_iter().enumerate() {
        s.segments.push(Segment { id: 7, tokens: 2000 });
        s.requests.push(GeneratedRequest {
            arrived_at: ticks(at),
            prompt_tokens: 2000,
            output_tokens: 100,
            segments: i as u32..i as u32 + 1,
            output_segment: None,
        });
    }
    s
}

fn run(spec: &ClusterSpec) -> RunOutcome {
    let resolved = StepModels::resolve(spec).unwrap();
    let sm = &resolved.main;
    let ctx = router_context_for(spec, &resolved, 1);
    let Maker::Router(make) = routelab_policy_api::router::<ById>().make else { unreachable!() };
    let router = make("", &ctx).unwrap();
    let mut loader = Loader::new();
    let sched =
        loader.resolve(&PolicySpec::parse("fcfs").unwrap(), routelab_policy_api::PolicyKind::Scheduler).unwrap();
    let schedulers = crate::runner::make_schedulers(&sched, sm, spec.slots(), 1).unwrap();
    ClusterSim::build(spec, &resolved, &stream(), router, schedulers, "by_id").unwrap().run().unwrap()
}

/// An H100 pool and an A6000 pool of one replica each: the request on each runs exactly as on a
/// cluster of that GPU alone (same latency to the nanosecond), the H100 one faster; the fleet
/// costs each pool's price for the run's length.
#[test]
fn each_pool_runs_on_its_own_gpu_and_is_paid_at_its_own_price() {
    let mixed = run(&spec(
        "replicas: 2\ngpu: a6000\npools: [{gpu: h100, replicas: 1, cost_per_hour: 4.0}, {gpu: a6000, replicas: 1, cost_per_hour: 1.0}]",
    ));
    let h100 = run(&spec("replicas: 2\ngpu: h100"));
    let a6000 = run(&spec("replicas: 2\ngpu: a6000"));
    let latency = |o: &RunOutcome, i: usize| o.records[i].completed_at_s - o.records[i].arrived_at_s;
    assert_eq!(latency(&mixed, 0), latency(&h100, 0), "request 0 on the H100 pool");
    assert_eq!(latency(&mixed, 1), latency(&a6000, 1), "request 1 on the A6000 pool");
    assert!(latency(&mixed, 0) < latency(&mixed, 1));
    let end = mixed.records[1].completed_at_s.max(mixed.records[0].completed_at_s);
    let cost = mixed.metrics.get("cost").unwrap();
    assert!((cost - (4.0 + 1.0) * end / 3600.0).abs() < 1e-12, "{cost} vs {}", 5.0 * end / 3600.0);
}

/// The pools must add up to `replicas`, and run on fixed aggregated clusters only.
#[test]
fn pools_must_add_up_and_stay_aggregated() {
    let bad = |yaml: &str| {
        let spec: ClusterSpec = serde_norway::from_str(&format!(
            "{yaml}\ngenerator: {{output_tokens: 1}}\narrivals: {{poisson: {{rate: 1}}}}\nrequests: 2\n"
        ))
        .unwrap();
        spec.validate().unwrap_err()
    };
    let e = bad("replicas: 3\npools: [{gpu: h100, replicas: 1}, {gpu: a6000, replicas: 1}]");
    assert_eq!(e.path, "replicas");
    assert!(e.fix.contains("replicas: 2"), "{}", e.fix);
    let e = bad("replicas: 2\npools: [{gpu: h100, replicas: 2}]\nautoscaling: {scaler: hpa, max_replicas: 4}");
    assert_eq!(e.path, "pools");
    let e = bad("replicas: 2\npools: [{gpu: h100, replicas: 2, tp: 3}]");
    assert_eq!(e.path, "pools[0].tp");
}
