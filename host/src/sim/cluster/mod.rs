//! The cluster world: N LLM replicas (continuous batching, chunked prefill, a segment-level
//! prefix cache, KV memory) behind a router, with a local scheduler inside each replica.
//!
//! The loop merges the (pre-generated, policy-independent) arrivals with an event queue of step
//! ends and delayed eviction notices, keyed (time, sequence) in integer nanoseconds; an event at
//! the same time as an arrival runs first, so the router sees every step that has ended. A replica
//! that has work runs steps back to back; an idle one starts a step when a request arrives.
//!
//! What routers see: [`ReplicaView`] per replica (`outstanding_work` = remaining prefill + output
//! tokens; `matched_tokens` only for routers whose capabilities ask for exact matches, counting
//! cached segments and segments of requests dispatched there and not yet computed); `on_dispatch`
//! after each decision; `on_complete` when a request's last token is out; `on_evict` (only with
//! `wants_evictions`) `eviction_delay_s` after each cut of a replica's cache.
//!
//! Metrics (OUTPUT.md keys): latency = arrival → last token; TTFT = arrival → first token; TPOT =
//! (latency − TTFT)/(output − 1) over requests with more than one output token. `hit_rate` =
//! cached prompt tokens / prompt tokens, at each request's first admission. `replication_factor` =
//! Σ over replicas of cached tokens ÷ tokens of the union of cached content (content = segment
//! path; a path cached partly on two replicas counts its longer copy once), averaged over 20
//! samples taken as each successive 5% of the requests arrives (1.0 = no duplication).
//! `overloaded` = 1 when requests were still unfinished `drain_s` after the last arrival, or when
//! the cluster's waiting queue grew, between the arrival of the middle request and of the last,
//! by more than 5% of the requests that arrived in between (the queue was still growing: latency
//! ratios of such runs are not speed-ups). `latency_p99_low_hit_s` = P99 latency over the requests
//! with less than half their prompt cached at first admission (NaN when there are none). `busiest_replica_share` = the largest share of requests
//! dispatched to one replica. `preemptions` counts recompute preemptions (`estimate` reservation).
//! A router's own `report()` figures follow the host's.

pub mod batcher;
pub mod prefix_cache;
pub mod replica;
#[cfg(test)]
mod tests;

use std::collections::HashMap;

use abi_stable::std_types::{RNone, RSlice, RSome};
use routelab_policy_api::{Completion, Eviction, ReplicaView, Request, RouterBox, RouterContext, SchedulerBox, SchedulerContext, Segment, World};

use self::replica::{Replica, ReplicaConfig, RequestState};
use super::RunError;
use super::event_queue::{EventQueue, SimTime, seconds, ticks};
use crate::metrics::{Metrics, quantile};
use crate::plugin::{LoadError, Loader, PolicySpec};
use crate::seeds::stream_seed;
use crate::step_model::StepModel;
use crate::workload::cluster::ClusterSpec;
use crate::workload::generate::{RequestStream, generate};
use crate::workload::trace::TraceRow;

/// What a router is told at creation in this world.
pub fn router_context(sm: &StepModel, replicas: u32, run_seed: u64) -> RouterContext {
    RouterContext {
        world: World::Cluster,
        replicas,
        seed: stream_seed(run_seed, "policy.router"),
        kv_capacity_tokens: sm.kv_capacity_tokens,
        cost: RSome(sm.cost),
    }
}

/// What replica `replica`'s scheduler is told at creation.
pub fn scheduler_context(sm: &StepModel, replica: u32, run_seed: u64) -> SchedulerContext {
    SchedulerContext {
        replica,
        seed: stream_seed(run_seed, &format!("policy.scheduler.{replica}")),
        kv_capacity_tokens: sm.kv_capacity_tokens,
    }
}

/// One scheduler per replica, as `spec.scheduler` names it (built in or from a library).
pub fn make_schedulers(spec: &ClusterSpec, loader: &mut Loader, run_seed: u64) -> Result<Vec<SchedulerBox>, LoadError> {
    let sm = spec.step_model().map_err(|e| {
        LoadError::new(crate::plugin::LoadErrorKind::BadConfig, format!("cluster.{}: {}", e.path, e.message), e.fix)
    })?;
    let policy = PolicySpec::parse(&spec.scheduler)?;
    (0..spec.replicas).map(|r| loader.scheduler(&policy, &scheduler_context(&sm, r, run_seed))).collect()
}

/// One request's measured life (times in seconds; NaN where it did not get that far).
#[derive(Clone, Debug, PartialEq)]
pub struct RequestRecord {
    pub replica: u32,
    pub arrived_at_s: f64,
    pub admitted_at_s: f64,
    pub first_token_at_s: f64,
    pub completed_at_s: f64,
    pub prompt_tokens: u32,
    pub cached_tokens: u32,
    pub output_tokens: u32,
    pub preemptions: u32,
}

/// Metrics plus per-request records (for exercises and plots).
#[derive(Clone, Debug, PartialEq)]
pub struct RunOutcome {
    pub metrics: Metrics,
    pub records: Vec<RequestRecord>,
}

/// One run: generates the stream of `spec` for `run_seed` (identical for every policy) and runs
/// it. `trace` holds the rows when `arrivals` is a trace. `label` names the policy in errors.
pub fn run(
    spec: &ClusterSpec,
    trace: Option<&[TraceRow]>,
    router: &mut RouterBox,
    schedulers: &mut [SchedulerBox],
    label: &str,
    run_seed: u64,
) -> Result<Metrics, RunError> {
    let stream = generate(spec, trace, run_seed).map_err(RunError)?;
    Ok(run_stream(spec, &stream, router, schedulers, label)?.metrics)
}

enum Event {
    StepEnd(u32),
    Evicted { replica: u32, evicted_at: SimTime, path: Vec<Segment>, remaining_tokens: u32 },
}

/// Runs an already generated stream (see [`generate`]).
pub fn run_stream(
    spec: &ClusterSpec,
    stream: &RequestStream,
    router: &mut RouterBox,
    schedulers: &mut [SchedulerBox],
    label: &str,
) -> Result<RunOutcome, RunError> {
    let sm = spec.step_model().map_err(|e| RunError(format!("cluster.{}: {}", e.path, e.message)))?;
    let n = spec.replicas as usize;
    if schedulers.len() != n {
        return Err(RunError(format!("{} schedulers for {n} replicas (one per replica is needed)", schedulers.len())));
    }
    for (i, r) in stream.requests.iter().enumerate() {
        if r.prompt_tokens as u64 + r.output_tokens as u64 > sm.kv_capacity_tokens {
            return Err(RunError(format!(
                "request {i} needs {} prompt + {} output tokens of KV, more than a replica's capacity ({} tokens); \
                 raise tp or use a GPU with more memory",
                r.prompt_tokens, r.output_tokens, sm.kv_capacity_tokens
            )));
        }
    }
    let caps = router.capabilities();
    let cfg = ReplicaConfig {
        kv_capacity_tokens: sm.kv_capacity_tokens,
        step_prefill_budget: if spec.chunk_tokens == 0 { spec.max_step_tokens } else { spec.chunk_tokens },
        max_batch_requests: spec.max_batch_requests,
        reservation: spec.reservation.clone(),
        scheduler_window: spec.scheduler_window,
        track_pending: caps.needs_exact_match,
        report_evictions: caps.wants_evictions,
    };
    let cost = sm.cost;
    let fail = |e: String| RunError(format!("policy '{label}': {e}"));
    let mut replicas: Vec<Replica> = (0..n as u32).map(Replica::new).collect();
    let mut states = vec![RequestState::default(); stream.requests.len()];
    let mut queue: EventQueue<Event> = EventQueue::new();
    let mut views = vec![ReplicaView::default(); n];
    let mut completed: Vec<u32> = Vec::new();
    let total = stream.requests.len();
    let last_arrival = stream.requests.last().map_or(0, |r| r.arrived_at);
    let horizon = last_arrival.saturating_add(ticks(spec.drain_s));
    let half = total / 2;
    let mut waiting_at_half = 0u64;
    let mut waiting_at_end = 0u64;
    let sample_every = (total / 20).max(1);
    let mut replication = Replication::default();
    let mut done = 0usize;
    let mut next = 0usize;

    // Starts replica `r`'s next step at `now` if it has work; queues its end and its evictions.
    let start = |r: usize,
                 now: SimTime,
                 replicas: &mut [Replica],
                 states: &mut [RequestState],
                 queue: &mut EventQueue<Event>,
                 schedulers: &mut [SchedulerBox]|
     -> Result<(), RunError> {
        let rep = &mut replicas[r];
        let step = if rep.has_work() { rep.start_step(now, stream, states, &cfg, &cost, &mut schedulers[r]).map_err(fail)? } else { None };
        rep.busy = step.is_some();
        if let Some(d) = step {
            queue.push(now + ticks(d).max(1), Event::StepEnd(r as u32));
        }
        let delay = ticks(spec.eviction_delay_s);
        for ev in rep.evictions.drain(..) {
            queue.push(now + delay, Event::Evicted { replica: r as u32, evicted_at: now, path: ev.path, remaining_tokens: ev.remaining_tokens });
        }
        Ok(())
    };

    loop {
        let arrival = stream.requests.get(next).map(|r| r.arrived_at);
        let event = queue.peek_time().filter(|&t| arrival.is_some_and(|a| t <= a) || (arrival.is_none() && t <= horizon));
        if event.is_some() {
            let (now, ev) = queue.pop().expect("peeked");
            match ev {
                Event::StepEnd(r) => {
                    let r = r as usize;
                    completed.clear();
                    replicas[r].finish_step(now, stream, &mut states, &cfg, &mut completed);
                    for &id in &completed {
                        let (q, st) = (&stream.requests[id as usize], &states[id as usize]);
                        done += 1;
                        let c = Completion {
                            request_id: id as u64,
                            replica: r as u32,
                            arrived_at: seconds(q.arrived_at),
                            completed_at: seconds(now),
                            ttft: seconds(st.first_token_at.unwrap_or(now) - q.arrived_at),
                            prompt_tokens: q.prompt_tokens,
                            cached_tokens: st.cached_tokens,
                            output_tokens: q.output_tokens,
                        };
                        router.on_complete(&c).into_result().map_err(|e| RunError(e.into()))?;
                    }
                    start(r, now, &mut replicas, &mut states, &mut queue, schedulers)?;
                    #[cfg(debug_assertions)]
                    if replicas[r].steps % 256 == 0 {
                        replicas[r].cache.check();
                    }
                }
                Event::Evicted { replica, evicted_at, path, remaining_tokens } => {
                    let e = Eviction { replica, evicted_at: seconds(evicted_at), path: RSlice::from_slice(&path), remaining_tokens };
                    router.on_evict(&e).into_result().map_err(|e| RunError(e.into()))?;
                }
            }
            continue;
        }
        let Some(now) = arrival else { break };
        let id = next;
        next += 1;
        let q = &stream.requests[id];
        let prompt = stream.prompt(id);
        for (v, rep) in views.iter_mut().zip(&replicas) {
            *v = rep.view(&cfg);
            if caps.needs_exact_match {
                v.matched_tokens = rep.cache.cached_or_pending_prefix(prompt, &rep.pending);
            }
        }
        let req = Request {
            id: id as u64,
            arrived_at: seconds(now),
            prompt_tokens: q.prompt_tokens,
            size_hint: RNone,
            segments: RSlice::from_slice(prompt),
        };
        let r = router.route(&req, RSlice::from_slice(&views)).into_result().map_err(|e| RunError(e.into()))? as usize;
        if r >= n {
            return Err(fail(format!("returned replica {r}, but there are only {n} replicas (valid: 0..{})", n - 1)));
        }
        router.on_dispatch(&req, r as u32).into_result().map_err(|e| RunError(e.into()))?;
        replicas[r].enqueue(id as u32, prompt, q.output_tokens, &mut states[id], &cfg);
        if !replicas[r].busy {
            start(r, now, &mut replicas, &mut states, &mut queue, schedulers)?;
        }
        if next == half.max(1) {
            waiting_at_half = replicas.iter().map(|r| r.waiting.len() as u64).sum();
        }
        if next == total {
            waiting_at_end = replicas.iter().map(|r| r.waiting.len() as u64).sum();
        }
        if next % sample_every == 0 {
            replication.sample(&replicas);
        }
    }

    debug_assert_eq!(done, states.iter().filter(|s| s.completed_at.is_some()).count(), "every request completes once");
    let records: Vec<RequestRecord> = stream
        .requests
        .iter()
        .zip(&states)
        .map(|(q, st)| {
            let t = |x: Option<SimTime>| x.map_or(f64::NAN, seconds);
            RequestRecord {
                replica: st.replica,
                arrived_at_s: seconds(q.arrived_at),
                admitted_at_s: t(st.admitted_at),
                first_token_at_s: t(st.first_token_at),
                completed_at_s: t(st.completed_at),
                prompt_tokens: q.prompt_tokens,
                cached_tokens: st.cached_tokens,
                output_tokens: q.output_tokens,
                preemptions: st.preemptions,
            }
        })
        .collect();
    let mut metrics = summarize(&records, &replicas, waiting_at_half, waiting_at_end, replication.factor());
    if let Ok(stats) = router.report().into_result() {
        for s in stats {
            metrics.push(s.name.to_string(), s.value);
        }
    }
    Ok(RunOutcome { metrics, records })
}

/// Time-sampled replication factor: Σ cached tokens ÷ tokens of the union, averaged.
#[derive(Default)]
struct Replication {
    union: HashMap<u64, u32>,
    sum: f64,
    samples: u32,
}

impl Replication {
    fn sample(&mut self, replicas: &[Replica]) {
        self.union.clear();
        let mut cached = 0u64;
        for rep in replicas {
            for (path, tokens) in rep.cache.contents() {
                cached += tokens as u64;
                let u = self.union.entry(path).or_default();
                *u = (*u).max(tokens);
            }
        }
        let union: u64 = self.union.values().map(|&t| t as u64).sum();
        if union > 0 {
            self.sum += cached as f64 / union as f64;
            self.samples += 1;
        }
    }

    fn factor(&self) -> f64 {
        if self.samples == 0 { 1.0 } else { self.sum / self.samples as f64 }
    }
}

/// Requests with less than this fraction of their prompt cached at admission are "low-hit".
const LOW_HIT: f64 = 0.5;

fn summarize(records: &[RequestRecord], replicas: &[Replica], waiting_at_half: u64, waiting_at_end: u64, replication_factor: f64) -> Metrics {
    let total = records.len();
    let done: Vec<&RequestRecord> = records.iter().filter(|r| r.completed_at_s.is_finite()).collect();
    let mut latency: Vec<f64> = done.iter().map(|r| r.completed_at_s - r.arrived_at_s).collect();
    let mut ttft: Vec<f64> = done.iter().map(|r| r.first_token_at_s - r.arrived_at_s).collect();
    let tpot: Vec<f64> = done
        .iter()
        .filter(|r| r.output_tokens > 1)
        .map(|r| (r.completed_at_s - r.first_token_at_s) / (r.output_tokens - 1) as f64)
        .collect();
    let mean = |xs: &[f64]| if xs.is_empty() { f64::NAN } else { xs.iter().sum::<f64>() / xs.len() as f64 };
    let admitted = records.iter().filter(|r| r.admitted_at_s.is_finite());
    let (cached, prompt) = admitted.fold((0u64, 0u64), |(c, p), r| (c + r.cached_tokens as u64, p + r.prompt_tokens as u64));
    let first = records.first().map_or(0.0, |r| r.arrived_at_s);
    let last_done = done.iter().map(|r| r.completed_at_s).fold(f64::NAN, f64::max);
    let unfinished = total - done.len();
    let second_half = (total - total / 2).max(1) as f64;
    let growing = waiting_at_end as f64 - waiting_at_half as f64 > 0.05 * second_half;
    let busiest = replicas.iter().map(|r| r.dispatched).max().unwrap_or(0);
    let mut m = Metrics::new();
    m.push("requests", total as f64);
    m.push("completed", done.len() as f64);
    m.push("unfinished", unfinished as f64);
    m.push("overloaded", (unfinished > 0 || growing) as u8 as f64);
    m.push("latency_mean_s", mean(&latency));
    m.push("latency_p50_s", quantile(&mut latency, 0.50));
    m.push("latency_p90_s", quantile(&mut latency, 0.90));
    m.push("latency_p99_s", quantile(&mut latency, 0.99));
    // The cold requests' tail: what a cache-favouring local scheduler could starve.
    let mut low_hit: Vec<f64> = done
        .iter()
        .filter(|r| (r.cached_tokens as f64) < LOW_HIT * r.prompt_tokens as f64)
        .map(|r| r.completed_at_s - r.arrived_at_s)
        .collect();
    m.push("latency_p99_low_hit_s", quantile(&mut low_hit, 0.99));
    m.push("ttft_mean_s", mean(&ttft));
    m.push("ttft_p99_s", quantile(&mut ttft, 0.99));
    m.push("tpot_mean_s", mean(&tpot));
    m.push("throughput_rps", if last_done > first { done.len() as f64 / (last_done - first) } else { f64::NAN });
    m.push("hit_rate", if prompt > 0 { cached as f64 / prompt as f64 } else { 0.0 });
    m.push("replication_factor", replication_factor);
    m.push("busiest_replica_share", if total > 0 { busiest as f64 / total as f64 } else { f64::NAN });
    m.push("preemptions", replicas.iter().map(|r| r.preemptions).sum::<u64>() as f64);
    m
}
