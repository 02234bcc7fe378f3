//! Lock-step groups (`lockstep.rs`): data-parallel engines of a mixture of experts step together.

use routelab_policy_api::PolicyKind;

use super::*;
use crate::plugin::{Loader, PolicySpec};
use crate::runner::run_cluster;
use crate::step_model::{Chunk, Step};
use crate::workload::generate::block_stream;
use crate::workload::mooncake::MooncakeRow;

/// Two engines of Qwen3-30B-A3B with the experts split over them, vLLM's scheduler knobs.
fn moe_pair(data_parallel: u32) -> ClusterSpec {
    let yaml = format!(
        "{{replicas: 2, gpu: rtx-pro-6000, model: qwen3-30b-a3b, calibration: rtx-pro-6000, expert_parallel: 2, \
         data_parallel: {data_parallel}, chunk_tokens: 2048, budget_counts_decode: true, max_batch_requests: 128, \
         scheduler: fcfs, summary: exact, generator: {{suffix_tokens: 1, output_tokens: 1}}, arrivals: {{poisson: {{rate: 1}}}}, requests: 2}}"
    );
    let spec: ClusterSpec = serde_norway::from_str(&yaml).unwrap();
    spec.validate().unwrap();
    spec
}

/// Request 0 (a 20,480-token prompt, ten 2,048-token chunks) goes to engine 0 and request 1
/// (16 tokens, 41 out) to engine 1 (round robin), both at time 0: (TTFT, TPOT) of each.
fn run(spec: &ClusterSpec) -> Vec<(f64, f64)> {
    let row = |input: u32, output: u32, first: u64| MooncakeRow {
        at_s: 0.0,
        input_length: input,
        output_length: output,
        hash_ids: (first..first + input.div_ceil(16) as u64).collect(),
        line: 1,
        session: None,
        parents: Vec::new(),
        adapter: None,
        class: None,
        tenant: None,
        model: None,
    };
    let stream = block_stream(&[row(20_480, 2, 0), row(16, 41, 10_000)], 16, 1.0, None, None);
    let sm = spec.step_model().unwrap();
    let ctx = router_context(&sm, spec.replicas, 1);
    let router = Loader::new().resolve(&PolicySpec::parse("round_robin").unwrap(), PolicyKind::Router).unwrap();
    let out = run_cluster(spec, &stream, router.router(&ctx).unwrap(), "round_robin", 1).unwrap();
    let recs = out.records;
    recs.iter()
        .map(|r| {
            let ttft = r.first_token_at_s - r.arrived_at_s;
            (ttft, (r.completed_at_s - r.first_token_at_s) / (r.output_tokens - 1).max(1) as f64)
        })
        .collect()
}

#[test]
fn a_lone_decode_keeps_pace_with_the_other_engines_prefill_chunks() {
    let alone = run(&moe_pair(1));
    let together = run(&moe_pair(2));
    // Alone, engine 1 decodes at its own small steps; in lock-step its first tokens wait for
    // the chunks of engine 0's long prompt: ten chunks of at least ~30 ms each.
    let sm = moe_pair(2).step_model().unwrap();
    let chunk = sm.pricer.step_time_s(&Step::mixed(0, 0, &[Chunk { new_tokens: 2048, context_tokens: 0 }]));
    assert!(together[1].1 > 2.0 * alone[1].1, "TPOT alone {:?}, together {:?}", alone[1], together[1]);
    assert!(together[1].1 * 40.0 > 8.0 * chunk, "{together:?}, chunk {chunk}");
    // The short prompt's first token waits for the group's first step, a whole chunk long.
    assert!(together[1].0 > 3.0 * alone[1].0, "{alone:?} {together:?}");
    // Deterministic.
    assert_eq!(run(&moe_pair(2)), together);
}

#[test]
fn lockstep_groups_are_refused_where_vllm_has_none() {
    let mut dense = moe_pair(2);
    dense.model = crate::step_model::Choice::Name("llama-3.1-8b".into());
    dense.expert_parallel = 1;
    let e = dense.validate().unwrap_err();
    assert_eq!(e.path, "data_parallel", "{e:?}");
    let mut odd = moe_pair(2);
    odd.replicas = 3;
    assert_eq!(odd.validate().unwrap_err().path, "data_parallel");
}

/// Routers price with the replicas' own calibrated model, its per-layer overhead and expert
/// terms included (the pricer behind `RouterContext::cost`): bit for bit, for a MoE whose
/// experts are split over the engines. What a router cannot see is the lock-step itself (a
/// group's step lasts its slowest engine's, which depends on the other engines' batches).
#[test]
fn routers_price_a_calibrated_moe_step_as_the_replicas_do() {
    let spec = moe_pair(2);
    let sm = spec.step_model().unwrap();
    let ctx = router_context(&sm, spec.replicas, 1);
    let cost = ctx.cost.clone().unwrap();
    let crate::step_model::Pricer::Calibrated(c) = sm.pricer else { panic!("calibrated") };
    let chunks = [Chunk { new_tokens: 1500, context_tokens: 300 }];
    for step in [Step::decode(1, 900), Step::decode(100, 90_000), Step::mixed(40, 30_000, &chunks)] {
        assert_eq!(cost.step_time(step).to_bits(), sm.pricer.step_time_s(&step).to_bits());
    }
    // The expert layers and the per-layer overhead are in what the router sees.
    let decode = cost.decode_step_time_s(64, 64_000);
    assert!(decode > c.step_overhead_s + c.layers * c.experts_time_s(64.0), "{decode} {c:?}");
    assert!(c.step_overhead_s > 0.0 && c.experts_time_s(64.0) > 0.0);
}
