//! vLLM's async scheduling (`async_sched.rs`): batches formed one step ahead.

use routelab_policy_api::PolicyKind;

use super::*;
use crate::plugin::{Loader, PolicySpec};
use crate::runner::run_cluster;
use crate::step_model::{Calibration, Choice, Chunk, Step};
use crate::workload::generate::block_stream;
use crate::workload::mooncake::MooncakeRow;

/// One Llama-3.1-8B engine on the shipped RTX PRO 6000 profile, vLLM's knobs, `max_num_seqs`
/// `seqs`, scheduling one step ahead or not.
fn engine(async_scheduling: bool, seqs: u32) -> ClusterSpec {
    let yaml = format!(
        "{{replicas: 1, gpu: rtx-pro-6000, model: llama-3.1-8b, chunk_tokens: 2048, budget_counts_decode: true, \
         max_batch_requests: {seqs}, scheduler: fcfs, summary: exact, generator: {{suffix_tokens: 1, output_tokens: 1}}, \
         arrivals: {{poisson: {{rate: 1}}}}, requests: 2}}"
    );
    let mut spec: ClusterSpec = serde_norway::from_str(&yaml).unwrap();
    let mut c: Calibration = Choice::<Calibration>::Name("rtx-pro-6000".into()).resolve().unwrap();
    c.async_scheduling = async_scheduling;
    spec.calibration = Some(Choice::Custom(c));
    spec.validate().unwrap();
    spec
}

/// Requests of (arrival s, prompt tokens, output tokens), distinct prompts: each one's record.
fn run(spec: &ClusterSpec, requests: &[(f64, u32, u32)]) -> Vec<summary::RequestRecord> {
    let rows: Vec<MooncakeRow> = requests
        .iter()
        .enumerate()
        .map(|(i, &(at_s, input, output))| MooncakeRow {
            at_s,
            input_length: input,
            output_length: output,
            hash_ids: (0..input.div_ceil(16) as u64).map(|b| b + 1_000 * i as u64).collect(),
            line: i + 1,
            session: None,
            parents: Vec::new(),
            adapter: None,
            class: None,
            tenant: None,
            model: None,
        })
        .collect();
    let stream = block_stream(&rows, 16, 1.0, None, None);
    let sm = spec.step_model().unwrap();
    let ctx = router_context(&sm, spec.replicas, 1);
    let router = Loader::new().resolve(&PolicySpec::parse("round_robin").unwrap(), PolicyKind::Router).unwrap();
    run_cluster(spec, &stream, router.router(&ctx).unwrap(), "round_robin", 1).unwrap().records
}

#[test]
fn a_request_taken_in_mid_step_joins_the_step_after_the_next() {
    let sm = engine(false, 128).step_model().unwrap();
    let prefill = sm.pricer.step_time_s(&Step::mixed(0, 0, &[Chunk { new_tokens: 512, context_tokens: 0 }]));
    let decode = sm.pricer.step_time_s(&Step::decode(1, 513));
    // Request 1 arrives a third into request 0's first decode step.
    let requests = [(0.0, 512, 40), (prefill + decode / 3.0, 512, 40)];
    let (sync, ahead) = (run(&engine(false, 128), &requests), run(&engine(true, 128), &requests));
    for recs in [&sync, &ahead] {
        // Taken in when the step in flight ends (vLLM's queued_ts), in both modes.
        assert!((recs[1].queued_at_s - (prefill + decode)).abs() < 1e-6, "{:?}", recs[1]);
        // Request 0, taken in by an idle engine, runs at once.
        assert_eq!(recs[0].queued_at_s, 0.0);
        assert!((recs[0].first_token_at_s - prefill).abs() < 1e-6);
    }
    // Synchronous: the step formed at pickup prefills it. Ahead: that step was formed a step
    // earlier (request 0's decode alone), so request 1 is prefilled in the step after.
    let wait = |r: &summary::RequestRecord| r.first_token_at_s - r.queued_at_s;
    let extra = wait(&ahead[1]) - wait(&sync[1]);
    let decode_then = sm.pricer.step_time_s(&Step::decode(1, 514));
    assert!((extra - decode_then).abs() < 1e-5, "one more decode step: {extra} s against {decode_then} s");
    // Same seed, same run.
    assert_eq!(run(&engine(true, 128), &requests), ahead);
}

#[test]
fn a_slot_freed_at_a_steps_end_is_refilled_a_step_later() {
    // Two slots; requests 0 (4 tokens out) and 1 (60 out) take them, request 2 waits for
    // request 0's. All arrive at time 0, when the engine launches its first step: all are
    // taken in at once, and requests 1 and 2 may join the second step.
    let requests = [(0.0, 64, 4), (0.0, 64, 60), (0.0, 64, 10)];
    let (sync, ahead) = (run(&engine(false, 2), &requests), run(&engine(true, 2), &requests));
    assert_eq!(sync[0].first_token_at_s, ahead[0].first_token_at_s);
    assert_eq!(sync[0].completed_at_s, ahead[0].completed_at_s);
    // Request 0 finishes at the same time in both; its slot goes to request 2 one step later
    // ahead: the step after request 0's last was formed while it still held the slot.
    let sm = engine(false, 2).step_model().unwrap();
    let later = ahead[2].first_token_at_s - sync[2].first_token_at_s;
    let decode = sm.pricer.step_time_s(&Step::decode(1, 64 + 4));
    assert!(later > 0.5 * decode && later < 2.5 * decode, "{later} s later, a decode step {decode} s");
    // A workload whose profile does not declare it keeps the synchronous engine.
    assert!(!Choice::<Calibration>::Name("rtx4090".into()).resolve().unwrap().async_scheduling);
}
