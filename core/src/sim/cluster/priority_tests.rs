//! Priority preemption (`priority.rs`) and the `priority` scheduler: hand-set replicas where the
//! victim and the admission are known, and a whole run where they protect the critical class.

use super::replica::{Phase, Replica, ReplicaConfig, RequestState};
use super::*;
use crate::handle::SchedulerHandle;
use crate::ids::{ReplicaId, RequestId};
use crate::plugin::{Loader, PolicySpec};
use crate::workload::cluster::{Preemption, Reservation};
use crate::workload::generate::{RequestStream, generate};

/// Three requests of 100 own prompt tokens (nothing shared) and 50 output tokens.
fn stream() -> RequestStream {
    let spec: ClusterSpec = serde_norway::from_str(
        "replicas: 1
generator: {system_prompt_tokens: 0, suffix_tokens: 100, output_tokens: 50}
arrivals: {poisson: {rate: 1}}
requests: 3
",
    )
    .unwrap();
    generate(&spec, None, 1).unwrap()
}

fn config(capacity: u64, reservation: Reservation, preemption: Preemption) -> ReplicaConfig {
    ReplicaConfig { reservation, preemption, ..ReplicaConfig::plain(capacity, 512, 256) }
}

/// A built-in scheduler that knows the requests' priorities, by id.
fn scheduler(name: &str, priorities: &[i32]) -> SchedulerHandle {
    let ctx = routelab_policy_api::SchedulerContext::new(0, 0, 1000);
    let s = Loader::new().scheduler(&PolicySpec::parse(name).unwrap(), &ctx).unwrap();
    let mut h = SchedulerHandle::new(s, 0, "under_test".into());
    h.set_infos(priorities.iter().map(|&priority| RequestInfo { priority, ..RequestInfo::plain() }).collect());
    h
}

/// `running` is unordered.
fn sorted(running: &[RequestId]) -> Vec<u32> {
    let mut v: Vec<u32> = running.iter().map(|r| r.raw()).collect();
    v.sort_unstable();
    v
}

fn pricer() -> crate::step_model::Pricer {
    crate::step_model::StepModel::from_catalog("a6000", "mistral-7b", 1, 0.9).unwrap().pricer
}

/// Requests 0 and 1 fill the replica (full reservation: 2 × (100 + 50) = 300 tokens); then
/// request 2 arrives with `priority[2]`. Returns the replica (which holds the requests' states)
/// after its next step.
fn third_arrives(priorities: [i32; 3], preemption: Preemption) -> Replica {
    third_arrives_from(0, priorities, preemption)
}

/// [`third_arrives`] with the requests numbered from `base`, in a stream that holds only those
/// (a lazy stream's `base`: it dropped the older ones).
fn third_arrives_from(base: u32, priorities: [i32; 3], preemption: Preemption) -> Replica {
    let mut stream = stream();
    stream.base = base as usize;
    let cfg = config(300, Reservation::Full, preemption);
    let n = base as usize + 3;
    let mut rep = Replica::new(ReplicaId::from_u32(0));
    let mut all = vec![0; n];
    all[base as usize..].copy_from_slice(&priorities);
    let mut sched = scheduler("priority", &all);
    let mut done = Vec::new();
    let enqueue = |rep: &mut Replica, r: u32| {
        let prompt = stream.prompt(r as usize);
        rep.enqueue(SimTime::ZERO, RequestId::from_u32(r), prompt, 50, RequestState::default(), &cfg);
    };
    for r in base..base + 2 {
        enqueue(&mut rep, r);
    }
    rep.start_step(SimTime::ZERO, &stream, &cfg, &pricer(), &mut sched).unwrap().unwrap();
    rep.finish_step(SimTime::TICK, &stream, &cfg, &mut done);
    assert_eq!(sorted(rep.running()), [base, base + 1], "both fit: 300 tokens committed of 300");
    enqueue(&mut rep, base + 2);
    rep.start_step(SimTime::TICK, &stream, &cfg, &pricer(), &mut sched).unwrap().unwrap();
    rep
}

/// The state of request `r`, which `rep` holds.
fn st(rep: &Replica, r: usize) -> &RequestState {
    rep.state(RequestId::new(r))
}

#[test]
fn a_higher_priority_arrival_preempts_the_latest_lower_one_and_is_admitted() {
    let rep = third_arrives([0, 0, 2], Preemption::Priority);
    // Of the two priority-0 requests, the later arrival (1) gives way; 150 tokens free up,
    // exactly what request 2 needs; request 1 waits to recompute its prompt and its one token.
    assert_eq!(st(&rep, 1).phase, Phase::Waiting);
    assert_eq!((st(&rep, 1).preemptions, st(&rep, 1).prefill_target), (1, 101));
    assert_eq!(st(&rep, 2).phase, Phase::Prefill);
    assert_eq!(st(&rep, 0).phase, Phase::Decode);
    assert_eq!(rep.waiting().iter().map(|r| r.raw()).collect::<Vec<_>>(), [1]);
    assert_eq!(rep.preemptions(), 1);
    assert_eq!(rep.committed_tokens(&config(300, Reservation::Full, Preemption::Priority)), 300);
}

/// A stream that holds only its newest requests (a lazy stream's `base`, in sketched runs) is
/// read by request id: the admission check of priority preemption once indexed the held
/// requests by id, past their end.
#[test]
fn priority_preemption_reads_a_stream_that_dropped_its_oldest_requests() {
    const BASE: usize = 5;
    let rep = third_arrives_from(BASE as u32, [0, 0, 2], Preemption::Priority);
    // As with every request held: the later priority-0 request gives way to the priority-2 one.
    assert_eq!(st(&rep, BASE + 1).phase, Phase::Waiting);
    assert_eq!(st(&rep, BASE + 2).phase, Phase::Prefill);
    assert_eq!(rep.preemptions(), 1);
}

#[test]
fn the_lowest_priority_goes_first_whatever_its_arrival() {
    let rep = third_arrives([-1, 0, 2], Preemption::Priority);
    // Request 0 is older but sheddable: it is the victim, not the newest.
    assert_eq!((st(&rep, 0).phase, st(&rep, 0).preemptions), (Phase::Waiting, 1));
    assert_eq!((st(&rep, 1).phase, st(&rep, 2).phase), (Phase::Decode, Phase::Prefill));
}

#[test]
fn equal_priority_or_newest_preemption_never_preempts_for_a_waiting_request() {
    for (priorities, preemption) in [([0, 0, 0], Preemption::Priority), ([0, 0, 2], Preemption::Newest)] {
        let rep = third_arrives(priorities, preemption);
        assert_eq!(rep.preemptions(), 0, "{priorities:?} {preemption:?}");
        assert_eq!(st(&rep, 2).phase, Phase::Waiting);
        assert_eq!(sorted(rep.running()), [0, 1]);
    }
}

/// Under `estimate` reservation memory runs out mid-decode: `newest` preempts the last admitted
/// request, `priority` the least important one even though it was admitted first.
#[test]
fn out_of_memory_the_victim_is_the_least_important_not_the_newest() {
    let stream = stream();
    for (preemption, victim) in [(Preemption::Newest, 1), (Preemption::Priority, 0)] {
        // Room for both prompts (200) and 2 × 10 headroom; decoding grows past it.
        let cfg = config(220, Reservation::Estimate { output_tokens: 10 }, preemption);
        let mut rep = Replica::new(ReplicaId::from_u32(0));
        let mut sched = scheduler("fcfs", &[0, 2, 0]);
        let mut done = Vec::new();
        for r in 0..2u32 {
            rep.enqueue(
                SimTime::ZERO,
                RequestId::from_u32(r),
                stream.prompt(r as usize),
                50,
                RequestState::default(),
                &cfg,
            );
        }
        let mut now = SimTime::ZERO;
        while rep.preemptions() == 0 && done.is_empty() {
            rep.start_step(now, &stream, &cfg, &pricer(), &mut sched).unwrap();
            now += SimTime::TICK;
            rep.finish_step(now, &stream, &cfg, &mut done);
        }
        assert_eq!(rep.preemptions(), 1, "{preemption:?}");
        assert_eq!(st(&rep, victim).preemptions, 1, "{preemption:?}");
        assert_eq!(st(&rep, 1 - victim).preemptions, 0, "{preemption:?}");
    }
}

/// The shipped workload, shortened: ordering by priority cuts interactive's TTFT P99 against
/// FCFS, preempting batch for it cuts it further, and every request still finishes exactly once.
#[test]
fn priority_order_and_preemption_protect_the_interactive_class() {
    let mut spec = super::tests::preset("classes/priority_preemption");
    spec.requests = Some(1500);
    let p99 = |scheduler: &str, preemption: Preemption| {
        let mut s = spec.clone();
        s.scheduler = scheduler.into();
        s.preemption = preemption;
        let out = super::tests::run_named(&s, None, "least_requests", 1).unwrap();
        let finished = out.records.iter().filter(|r| r.completed_at_s.is_finite()).count();
        assert_eq!(finished, 1500, "{scheduler} {preemption:?}: every request finishes");
        assert_eq!(out.metrics.get("completed"), Some(1500.0));
        let preempted = out.metrics.get("preemptions").unwrap();
        (out.metrics.get("class.interactive.ttft_p99_s").unwrap(), preempted)
    };
    let (fcfs, none) = p99("fcfs", Preemption::Newest);
    let (ordered, none_either) = p99("priority", Preemption::Newest);
    let (preempting, preempted) = p99("priority", Preemption::Priority);
    assert_eq!((none, none_either), (0.0, 0.0), "full reservation: nothing preempted without priority");
    assert!(preempted > 0.0);
    assert!(ordered < fcfs && preempting < ordered, "fcfs {fcfs}, priority {ordered}, + preemption {preempting}");
}
