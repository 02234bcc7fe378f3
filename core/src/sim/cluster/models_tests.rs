//! Several models on one cluster (`cluster.models`): each request routed only among its model's
//! replicas, by its model's own router; the host refusing an index past them; per-model figures.

use routelab_policy_api::{Maker, Policy, Replicas, Request, RouterContext, RouterPolicy, Segment};

use super::*;
use crate::plugin::{Loader, PolicySpec};
use crate::time::ticks;
use crate::workload::generate::{GeneratedRequest, RequestStream, apply_models, generate};

/// Sends request `i` to replica `i mod n` of the replicas it is shown.
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

/// Always answers index 2 (past the replicas of a model that has two).
struct Two;

impl Policy for Two {
    const NAME: &'static str = "two";
    const DESCRIPTION: &'static str = "index 2";
    type Config = ();
    type Context = RouterContext;
    fn new(_: (), _: &RouterContext) -> Result<Self, String> {
        Ok(Two)
    }
}

impl RouterPolicy for Two {
    fn route(&mut self, _: &Request<'_>, _: &Replicas<'_>) -> usize {
        2
    }
}

fn spec(yaml: &str) -> ClusterSpec {
    let spec: ClusterSpec = serde_norway::from_str(yaml).unwrap();
    spec.validate().unwrap_or_else(|e| panic!("{}: {}", e.path, e.message));
    spec
}

/// Models `a` (replicas 0, 1) and `b` (replica 2); unchunked, one output token.
fn small() -> ClusterSpec {
    spec(
        "replicas: 3\nchunk_tokens: 0\nmodels: [{name: a, replicas: 2, share: 0.6}, {name: b, replicas: 1, share: 0.4}]\n\
         generator: {output_tokens: 1}\narrivals: {poisson: {rate: 1}}\nrequests: 5\n",
    )
}

/// Requests of `(arrival s, model)`, each with its own 100-token prompt and one output token.
fn stream(rows: &[(f64, u16)]) -> RequestStream {
    let mut s = RequestStream::default();
    for (i, &(at, model)) in rows.iter().enumerate() {
        s.segments.push(Segment { id: 10 + i as u64, tokens: 100 });
        s.requests.push(GeneratedRequest {
            arrived_at: ticks(at),
            prompt_tokens: 100,
            output_tokens: 1,
            segments: i as u32..i as u32 + 1,
            output_segment: None,
        });
        s.models.push(model);
    }
    s
}

/// Runs `spec` on `stream` with router `P` for every model (seed 1).
fn run_with<P: RouterPolicy + Policy<Config = (), Context = RouterContext> + 'static>(
    spec: &ClusterSpec,
    stream: &RequestStream,
    give_others: bool,
) -> Result<RunOutcome, RunError> {
    let resolved = StepModels::resolve(spec).unwrap();
    let sm = &resolved.main;
    let make = |m: usize| {
        let Maker::Router(make) = routelab_policy_api::router::<P>().make else { unreachable!() };
        make("", &router_context_for_model(spec, &resolved, 1, m)).unwrap()
    };
    let others: Vec<_> = (1..spec.models.len()).map(make).collect();
    let sched =
        Loader::new().resolve(&PolicySpec::parse("fcfs").unwrap(), routelab_policy_api::PolicyKind::Scheduler).unwrap();
    let schedulers = crate::runner::make_schedulers(&sched, sm, spec.slots(), 1).unwrap();
    let sim = ClusterSim::build(spec, &resolved, stream, make(0), schedulers, P::NAME).unwrap();
    // Without the other models' routers the run refuses to start.
    if give_others { sim.with_model_routers(others).unwrap() } else { sim }.run()
}

/// Runs built-in `name` on `spec`'s generated stream (seed `seed`), one router per model.
fn run_named(spec: &ClusterSpec, name: &str, seed: u64) -> RunOutcome {
    let resolved = StepModels::resolve(spec).unwrap();
    let sm = &resolved.main;
    let mut stream = generate(spec, None, seed).unwrap();
    apply_models(spec, &mut stream, seed);
    let mut loader = Loader::new();
    let p = PolicySpec::parse(name).unwrap();
    let r0 = loader.router(&p, &router_context_for(spec, &resolved, seed)).unwrap();
    let others = (1..spec.models.len())
        .map(|m| loader.router(&p, &router_context_for_model(spec, &resolved, seed, m)).unwrap())
        .collect();
    let sched =
        loader.resolve(&PolicySpec::parse("fcfs").unwrap(), routelab_policy_api::PolicyKind::Scheduler).unwrap();
    let schedulers = crate::runner::make_schedulers(&sched, sm, spec.slots(), seed).unwrap();
    let sim = ClusterSim::build(spec, &resolved, &stream, r0, schedulers, name).unwrap();
    sim.with_model_routers(others).unwrap().run().unwrap()
}

/// By hand: requests 0..5 on models [a, b, a, a, b]. Model a's router sees its two replicas
/// (slots 0, 1) and sends request i to i mod 2; model b's sees one (slot 2). So the replicas
/// are [0, 2, 0, 1, 2] — had a's router seen all three, request 2 would have gone to slot 2.
/// Per model: a has 3 requests, b 2, none served elsewhere.
#[test]
fn each_model_routes_among_its_own_replicas_by_hand() {
    let rows = [(0.0, 0), (1.0, 1), (2.0, 0), (3.0, 0), (4.0, 1)];
    let out = run_with::<ById>(&small(), &stream(&rows), true).unwrap();
    let replicas: Vec<u32> = out.records.iter().map(|r| r.replica).collect();
    assert_eq!(replicas, [0, 2, 0, 1, 2]);
    let models: Vec<u16> = out.records.iter().map(|r| r.model).collect();
    assert_eq!(models, [0, 1, 0, 0, 1]);
    let m = &out.metrics;
    let got = ["model.a.requests", "model.b.requests", "model.a.finished", "model.b.finished"].map(|k| m.get(k));
    assert_eq!(got, [Some(3.0), Some(2.0), Some(3.0), Some(2.0)], "{m:?}");
    assert_eq!(m.get("model.a.served_elsewhere"), Some(0.0));
    assert_eq!(m.get("model.b.served_elsewhere"), Some(0.0));
    // Each request alone on an idle replica: the same TTFT for all, so the models' means agree.
    let (ta, tb) = (m.get("model.a.ttft_mean_s").unwrap(), m.get("model.b.ttft_mean_s").unwrap());
    assert!(ta > 0.0 && (ta - tb).abs() < 1e-12, "{ta} vs {tb}");
}

/// A router answering index 2 for model a (two replicas) names model b's replica in the whole
/// cluster's numbering: the host refuses it as out of range, naming the policy; and a cluster of
/// several models does not run without a router per model.
#[test]
fn an_index_past_the_models_replicas_is_refused_and_every_model_needs_a_router() {
    let e = run_with::<Two>(&small(), &stream(&[(0.0, 0)]), true).expect_err("refused").to_string();
    assert!(e.contains("two") && e.contains("returned replica 2") && e.contains("only 2 (valid: 0..1)"), "{e}");
    let e = run_with::<ById>(&small(), &stream(&[(0.0, 0)]), false).expect_err("refused").to_string();
    assert!(e.contains("one router per model"), "{e}");
}

/// A generated stream of sessions over two models with skewed shares (0.8 / 0.2) and an even
/// split of replicas: every request is served by a replica of its own model (conservation per
/// model), each model's requests add up to the stream, every turn of a session asks for the
/// same model, the shares come out near 0.8 / 0.2, and the run is deterministic.
#[test]
fn a_request_is_never_served_by_a_replica_of_another_model() {
    let s = spec(
        "replicas: 4\nmodels: [{name: chat, replicas: 2, share: 0.8}, {name: coder, replicas: 2, share: 0.2}]\n\
         generator: {system_prompt_tokens: 200, suffix_tokens: {uniform: {min: 50, max: 300}}, output_tokens: {uniform: {min: 10, max: 60}}, \
         turns: {uniform: {min: 1, max: 3}}, think_time_s: 2}\narrivals: {poisson: {rate: 8}}\nrequests: 1500\n",
    );
    for router in ["round_robin", "least_requests", "dynamo_kv"] {
        let out = run_named(&s, router, 3);
        let bounds = s.model_bounds();
        let mut per_model = [0usize; 2];
        for (i, r) in out.records.iter().enumerate() {
            per_model[r.model as usize] += 1;
            if r.completed_at_s.is_finite() {
                let range = bounds[r.model as usize]..bounds[r.model as usize + 1];
                assert!(
                    range.contains(&r.replica),
                    "{router}: request {i} of model {} on replica {}",
                    r.model,
                    r.replica
                );
            }
        }
        let m = &out.metrics;
        assert_eq!(m.get("model.chat.requests"), Some(per_model[0] as f64));
        assert_eq!(m.get("model.coder.requests"), Some(per_model[1] as f64));
        assert_eq!(per_model[0] + per_model[1], out.records.len());
        assert_eq!(m.get("model.chat.served_elsewhere"), Some(0.0));
        assert_eq!(m.get("model.coder.served_elsewhere"), Some(0.0));
        let chat = per_model[0] as f64 / out.records.len() as f64;
        assert!((0.7..0.9).contains(&chat), "{router}: chat's share {chat}");
        assert_eq!(run_named(&s, router, 3).metrics, out.metrics, "{router}: same seed, same figures");
    }
    // Every turn of a session (one first unique segment) asks for the same model.
    let mut stream = generate(&s, None, 3).unwrap();
    apply_models(&s, &mut stream, 3);
    let mut by_key = std::collections::HashMap::new();
    for i in 0..stream.requests.len() {
        let key = stream.prompt(i).iter().find(|g| g.id >= 1 << 32).map(|g| g.id).unwrap();
        assert_eq!(*by_key.entry(key).or_insert(stream.model(i)), stream.model(i), "request {i}");
    }
}

/// One model, written out or not, changes nothing: the stream draws no models and the run's
/// figures are those of the same cluster without `models:`.
#[test]
fn one_model_is_the_cluster_without_models() {
    let base = "replicas: 3\ngenerator: {system_prompt_tokens: 100, suffix_tokens: 80, output_tokens: 20}\n\
                arrivals: {poisson: {rate: 5}}\nrequests: 300\n";
    let plain = spec(base);
    let one = spec(&format!("{base}models: [{{name: only, replicas: 3, share: 1}}]\n"));
    let a = run_named(&plain, "least_requests", 2);
    let b = run_named(&one, "least_requests", 2);
    assert_eq!(a.metrics, b.metrics);
    assert_eq!(a.records, b.records);
}

/// Models of two sizes on their own GPUs (`models[i].gpu/tp/model`): model a's request runs
/// exactly as on a cluster of a's hardware alone, model b's as on b's (the same latency to the
/// nanosecond: each replica's steps priced on its model's pool), b's 70B on H100s slower per
/// token than a's 8B on an A6000 alone would not be; and the fleet costs each model's price.
#[test]
fn each_model_runs_on_its_own_hardware_and_is_paid_at_its_own_price() {
    let tail = "chunk_tokens: 0\ngenerator: {output_tokens: 1}\narrivals: {poisson: {rate: 1}}\nrequests: 2\n";
    let mixed = spec(&format!(
        "replicas: 3\ngpu: a6000\nmodel: llama-3-8b\nmodels: [{{name: a, replicas: 2, share: 1, cost_per_hour: 1.0}}, \
         {{name: b, replicas: 1, share: 1, gpu: h100, tp: 4, model: llama-3-70b, cost_per_hour: 10.0}}]\n{tail}"
    ));
    assert_eq!(mixed.pool_count(), 2);
    assert_eq!(mixed.replica_pools(), [0, 0, 1]);
    let alone_a = spec(&format!("replicas: 1\ngpu: a6000\nmodel: llama-3-8b\n{tail}"));
    let alone_b = spec(&format!("replicas: 1\ngpu: h100\ntp: 4\nmodel: llama-3-70b\n{tail}"));
    let rows = [(0.0, 0), (0.0, 1)];
    let out = run_with::<ById>(&mixed, &stream(&rows), true).unwrap();
    let a = run_with::<ById>(&alone_a, &stream(&rows[..1]), false).unwrap();
    let b = run_with::<ById>(&alone_b, &stream(&[(0.0, 0)]), false).unwrap();
    let latency = |o: &RunOutcome, i: usize| o.records[i].completed_at_s - o.records[i].arrived_at_s;
    assert_eq!(out.records.iter().map(|r| r.replica).collect::<Vec<_>>(), [0, 2]);
    assert_eq!(latency(&out, 0), latency(&a, 0), "model a's request on its A6000 with the 8B");
    assert_eq!(latency(&out, 1), latency(&b, 0), "model b's request on its H100s with the 70B");
    assert_ne!(latency(&out, 0), latency(&out, 1));
    let end = out.records.iter().map(|r| r.completed_at_s).fold(0.0, f64::max);
    let cost = out.metrics.get("cost").unwrap();
    let want = (2.0 * 1.0 + 10.0) * end / 3600.0;
    assert!((cost - want).abs() < 1e-12, "{cost} vs {want}");
}

/// A model's own hardware is checked as a pool's, under `models[i]`: an unknown GPU, a TP degree
/// outside 1/2/4/8, a model too large for its GPU, and `pools:` beside it.
#[test]
fn a_models_own_hardware_is_checked_under_its_field() {
    let bad = |model_b: &str, extra: &str| {
        let spec: ClusterSpec = serde_norway::from_str(&format!(
            "replicas: 2\nmodels: [{{name: a, replicas: 1, share: 1}}, {{name: b, replicas: 1, share: 1, {model_b}}}]\n\
             generator: {{output_tokens: 1}}\narrivals: {{poisson: {{rate: 1}}}}\nrequests: 2\n{extra}"
        ))
        .unwrap();
        spec.validate().unwrap_err()
    };
    let e = bad("gpu: b9000", "");
    assert_eq!(e.path, "models[1].gpu", "{e:?}");
    assert!(e.message.contains("b9000"), "{e:?}");
    let e = bad("tp: 3", "");
    assert_eq!(e.path, "models[1].tp", "{e:?}");
    let e = bad("gpu: a6000, model: llama-3-70b", "");
    assert!(e.path.starts_with("models[1]"), "{e:?}");
    let e = bad("gpu: h100", "pools: [{gpu: h100, replicas: 2}]\n");
    assert_eq!(e.path, "models[1]", "{e:?}");
    assert!(e.fix.contains("pools:"), "{e:?}");
}
