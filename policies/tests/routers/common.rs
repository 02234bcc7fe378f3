//! What the policy tests share. Each test module uses some of it.
#![allow(dead_code)]

use abi_stable::std_types::RNone;
use routelab_policy_api::{Completion, CostModel, Maker, Request, Roofline, RouterContext, Segment, World};

/// An aggregated cluster of `replicas`, seed 1, 100,000 tokens of KV each, no cost model.
pub fn ctx(replicas: u32) -> RouterContext {
    RouterContext {
        world: World::Cluster,
        replicas,
        seed: 1,
        kv_capacity_tokens: 100_000,
        cost: RNone,
        disaggregation: RNone,
        facts: Default::default(),
    }
}

pub fn seg(id: u64, tokens: u32) -> Segment {
    Segment { id, tokens }
}

/// Request `id` arriving at `at` with prompt `segs`.
pub fn req(id: u64, at: f64, segs: &[Segment]) -> Request<'_> {
    let tokens = segs.iter().map(|s| s.tokens).sum();
    Request::new(id, at, tokens).with_segments(segs)
}

/// Request `id` completed on `replica` (one output token; times that no field router reads).
pub fn done(id: u64, replica: u32) -> Completion {
    Completion {
        request_id: id,
        replica,
        arrived_at: 0.0,
        completed_at: 1.0,
        ttft: 0.5,
        prompt_tokens: 0,
        cached_tokens: 0,
        output_tokens: 1,
    }
}

/// Builds router `name` from YAML through the registry (the path the CLI and plugins take), on 4
/// replicas.
pub fn make(name: &str, yaml: &str) -> Result<(), String> {
    let e = routelab_policies::registry().into_iter().find(|e| e.name == name).expect("registered");
    match e.make {
        Maker::Router(f) => f(yaml, &ctx(4)).map(|_| ()).map_err(String::from),
        _ => panic!("{name} is a router"),
    }
}

/// Mistral-7B on one A6000 (the step model's calibration, docs/architecture.md: 112 TFLOP/s
/// effective, 80% of 768 GB/s).
pub fn a6000_mistral() -> CostModel {
    let params = 7_241_732_096.0;
    CostModel::roofline(Roofline {
        flops_per_s: 112e12,
        bytes_per_s: 0.8 * 768e9,
        linear_flops_per_token: 2.0 * params,
        attention_flops_per_pair: 4.0 * 32.0 * 4096.0,
        weight_bytes: 2.0 * params,
        kv_bytes_per_token: 131_072.0,
        step_overhead_s: 0.0004,
    })
}
