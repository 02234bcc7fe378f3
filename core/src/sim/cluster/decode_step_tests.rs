//! The plain decode step (`Replica::next_decode_step`) is the general path's arithmetic: two
//! replicas fed the same requests, one taking the plain step wherever it applies and the other
//! always the general path, agree after every step.

use super::replica::{Replica, ReplicaConfig, RequestState};
use super::*;
use crate::handle::SchedulerHandle;
use crate::ids::{ReplicaId, RequestId};
use crate::plugin::{Loader, PolicySpec};
use crate::workload::cluster::Reservation;
use crate::workload::generate::{RequestStream, generate};

/// Twelve requests sharing a 64-token system prompt, 20–120 tokens of their own, 5–200 out.
fn stream() -> RequestStream {
    let spec: ClusterSpec = serde_norway::from_str(
        "replicas: 1
generator:
  system_prompt_tokens: 64
  suffix_tokens: {uniform: {min: 20, max: 120}}
  output_tokens: {uniform: {min: 5, max: 200}}
arrivals: {poisson: {rate: 1}}
requests: 12
",
    )
    .unwrap();
    generate(&spec, None, 3).unwrap()
}

fn config(capacity: u64, reservation: Reservation, report_evictions: bool) -> ReplicaConfig {
    ReplicaConfig { reservation, report_evictions, ..ReplicaConfig::plain(capacity, 256, 256) }
}

fn scheduler() -> SchedulerHandle {
    let ctx = routelab_policy_api::SchedulerContext::new(0, 0, 1000);
    SchedulerHandle::new(Loader::new().scheduler(&PolicySpec::parse("fcfs").unwrap(), &ctx).unwrap(), 0, "fcfs".into())
}

fn pricer() -> crate::step_model::Pricer {
    crate::step_model::StepModel::from_catalog("a6000", "mistral-7b", 1, 0.9).unwrap().pricer
}

/// Runs both replicas to the end, a request joining every 40 steps; returns how many steps the
/// plain path took, how many there were, and the preemptions and eviction notices. After each
/// plain step taken with no planned one pending, A plans the run that follows
/// ([`Replica::plan_decode_run`], as `runs.rs` does): every planned end must come at its time
/// and be a plain step, until a request joins; `planned` counts them.
fn run_both(cfg: &ReplicaConfig) -> (u32, u32, u64, usize, u32) {
    let stream = stream();
    let n = stream.requests.len();
    let (mut a, mut b) = (Replica::new(ReplicaId::from_u32(0)), Replica::new(ReplicaId::from_u32(0)));
    let (mut sa, mut sb) = (vec![RequestState::default(); n], vec![RequestState::default(); n]);
    let (mut qa, mut qb) = (scheduler(), scheduler());
    let (mut done_a, mut done_b) = (Vec::new(), Vec::new());
    let (mut now, mut next, mut steps, mut plain, mut notices) = (SimTime::ZERO, 0usize, 0u32, 0u32, 0);
    let (mut plan, mut at, mut planned) = (Vec::new(), 0usize, 0u32);
    // Each replica holds its requests' states; a finished one's comes back into `sa`/`sb`.
    let enqueue = |rep: &mut Replica, id: usize, now: SimTime| {
        let q = stream.request(id);
        rep.enqueue(now, RequestId::new(id), stream.prompt(id), q.output_tokens, RequestState::default(), cfg);
    };
    let release = |rep: &mut Replica, states: &mut [RequestState], done: &[RequestId]| {
        for &r in done {
            states[r.index()] = rep.release(r);
        }
    };
    enqueue(&mut a, 0, now);
    enqueue(&mut b, 0, now);
    next += 1;
    let mut d = a.start_step(now, &stream, cfg, &pricer(), &mut qa).unwrap();
    let db = b.start_step(now, &stream, cfg, &pricer(), &mut qb).unwrap();
    assert_eq!(d.map(f64::to_bits), db.map(f64::to_bits));
    while let Some(step) = d {
        now += crate::time::ticks(step).max(SimTime::TICK);
        steps += 1;
        if steps % 40 == 0 && next < n {
            enqueue(&mut a, next, now);
            enqueue(&mut b, next, now);
            next += 1;
            // Changed from outside: the run is over.
            plan.clear();
        }
        let planned_plain = at + 1 < plan.len();
        if planned_plain {
            assert_eq!(plan[at], now, "step {steps}: a planned end's time");
            at += 1;
            planned += 1;
        }
        // B: always the general path.
        done_b.clear();
        b.finish_step(now, &stream, cfg, &mut done_b);
        release(&mut b, &mut sb, &done_b);
        let db2 = b.start_step_tiered(now, &stream, cfg, &pricer(), &mut qb, None).unwrap();
        // A: the plain step where it applies.
        d = match a.next_decode_step(now, cfg, &pricer()) {
            Some(s) => {
                plain += 1;
                assert!(done_b.is_empty(), "step {steps}: a plain step completed nothing");
                if at + 1 >= plan.len() {
                    a.plan_decode_run(now + crate::time::ticks(s).max(SimTime::TICK), cfg, &pricer(), 64, &mut plan);
                    at = 0;
                }
                Some(s)
            }
            None => {
                assert!(!planned_plain, "step {steps}: a planned end is a plain step");
                done_a.clear();
                a.finish_step(now, &stream, cfg, &mut done_a);
                assert_eq!(done_a, done_b, "step {steps}");
                release(&mut a, &mut sa, &done_a);
                a.start_step_tiered(now, &stream, cfg, &pricer(), &mut qa, None).unwrap()
            }
        };
        assert_eq!(d.map(f64::to_bits), db2.map(f64::to_bits), "step {steps}: durations");
        assert_eq!(a.view(cfg), b.view(cfg), "step {steps}: views");
        assert_eq!((a.steps(), a.kv_used_tokens()), (b.steps(), b.kv_used_tokens()), "step {steps}");
        assert_eq!(a.cache().total_tokens(), b.cache().total_tokens(), "step {steps}: cache");
        let (ea, eb): (Vec<_>, Vec<_>) = (a.drain_evictions().collect(), b.drain_evictions().collect());
        assert_eq!(format!("{ea:?}"), format!("{eb:?}"), "step {steps}: eviction notices");
        notices += eb.len();
        if d.is_none() && next < n {
            // Idle: the next request arrives now.
            enqueue(&mut a, next, now);
            enqueue(&mut b, next, now);
            next += 1;
            d = a.start_step(now, &stream, cfg, &pricer(), &mut qa).unwrap();
            let db = b.start_step(now, &stream, cfg, &pricer(), &mut qb).unwrap();
            assert_eq!(d.map(f64::to_bits), db.map(f64::to_bits), "step {steps}: after idle");
        }
    }
    assert_eq!(next, n, "every request ran");
    assert!(sa.iter().zip(&sb).all(|(x, y)| x.completed_at.is_some() && x.completed_at == y.completed_at));
    assert_eq!(a.preemptions(), b.preemptions());
    (plain, steps, b.preemptions(), notices, planned)
}

#[test]
fn decode_steps_are_the_general_path() {
    // Roomy, full reservation; then tight under `estimate`, where decoding evicts the cached
    // prompts (reported) and preempts; each must take the plain path for most steps.
    for cfg in
        [config(100_000, Reservation::Full, false), config(700, Reservation::Estimate { output_tokens: 8 }, true)]
    {
        let (plain, steps, preemptions, notices, planned) = run_both(&cfg);
        assert!(plain * 10 > steps * 7, "{plain} plain steps of {steps} ({cfg:?})");
        // Planned runs carry most plain steps (fewer where every step cuts a reported cache).
        let least = if cfg.report_evictions { 0 } else { plain / 2 };
        assert!(planned > least, "{planned} planned of {plain} plain steps ({cfg:?})");
        if cfg.report_evictions {
            assert!(preemptions > 0 && notices > 0, "the tight replica preempts and evicts: {preemptions}, {notices}");
        }
    }
}
