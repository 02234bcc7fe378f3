//! The cluster world: N LLM replicas (continuous batching, chunked prefill, a segment-level
//! prefix cache, KV memory) behind a router, with a local scheduler inside each replica.
//!
//! The loop merges the (pre-generated, policy-independent) arrivals with an event queue of step
//! ends and delayed eviction notices, keyed (time, sequence) in integer nanoseconds; an event at
//! the same time as an arrival runs first, so the router sees every step that has ended. A replica
//! that has work runs steps back to back; an idle one starts a step when a request arrives.
//! On up to 16 replicas, a replica's step end waits in its own slot of the queue, outside the
//! heap ([`EventQueue::with_slots`]): popped in the same (time, sequence) order as any event,
//! without the heap push and pop that each step used to cost.
//! Calls of agent sessions (`generator.session`) that wait for other calls are not arrivals of
//! the stream: when the last of their parents completes, an [`Event::Release`] is queued a tool
//! pause later, and the call arrives then (closed loop: its arrival time depends on the policy).
//!
//! What routers see: [`ReplicaView`] per replica (`outstanding_work` = remaining prefill + output
//! tokens; `matched_tokens` only for routers whose capabilities ask for exact matches, counting
//! cached segments and segments of requests dispatched there and not yet computed); `on_dispatch`
//! after each decision; `on_complete` when a request's last token is out; `on_evict` (only with
//! `wants_evictions`) `eviction_delay_s` after each cut of a replica's cache.
//!
//! Metrics (keys as in docs/output.md): latency = arrival → last token; TTFT = arrival → first token; TPOT =
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
//! With `slo:`, `slo_attainment` and `goodput_rps` follow ([`push_slo_metrics`]).
//! Percentiles are nearest-rank over every request's record, or, when `cluster.summary` says
//! sketch (by default above 10^6 requests), read from HDR histograms within [`crate::sketch`]'s
//! bound; everything else is a count or a sum either way (`summary::Tally`). A sketched run also
//! hands each request's record to the summary as soon as it and every earlier request have ended,
//! and drops its state (`window::Window`), so that the simulator's per-request memory follows
//! the requests from the oldest unfinished one to the newest arrival, not the run's length (not
//! with KV tiers, whose figures read every request's state at the end; disaggregated clusters and
//! agent sessions are always exact).
//! A router's own `report()` figures follow the host's as `router.<name>`, then the schedulers'
//! summed over replicas as `scheduler.<name>`.
//!
//! [`ClusterSim::build`] checks and wires everything (bad input is a [`SetupError`] before the
//! first event); [`ClusterSim::run`] only runs, one handler per event.

#[cfg(test)]
mod async_sched_tests;
mod build;
#[cfg(test)]
mod class_tests;
mod contexts;
#[cfg(test)]
mod decision_log_tests;
#[cfg(test)]
mod decode_step_tests;
mod failures;
#[cfg(test)]
mod failures_tests;
mod feed;
mod finish;
mod fleet;
mod fleet_pd;
#[cfg(test)]
mod fleet_pd_tests;
#[cfg(test)]
mod fleet_tests;
mod kept;
mod kv_tier;
mod lockstep;
#[cfg(test)]
mod lockstep_tests;
mod lora;
#[cfg(test)]
mod lora_tests;
mod models;
#[cfg(test)]
mod models_tests;
mod pd;
#[cfg(test)]
mod pd_admission_tests;
mod pd_failures;
#[cfg(test)]
mod pd_failures_tests;
#[cfg(test)]
mod pd_tests;
#[cfg(test)]
mod pools_tests;
pub mod prefix_cache;
#[cfg(test)]
mod priority_tests;
pub mod replica;
mod routable;
mod runs;
#[cfg(test)]
mod runs_tests;
#[cfg(test)]
mod session_tests;
mod sessions;
#[cfg(test)]
mod sketch_tests;
mod slots;
mod steps;
mod summary;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tier_tests;
pub mod tiers;
mod window;
pub use feed::Feed;

use std::borrow::Cow;

use abi_stable::std_types::RSlice;
use routelab_policy_api::{Eviction, ReplicaView, Request, RouterBox, Segment, World};

use self::kv_tier::KvTier;
use self::pd::Pd;
use self::tiers::ReplicaTiers;

pub use self::contexts::{
    admission_context, check_fit, check_fits, gateway_router_context, request_info, request_infos, router_context,
    router_context_for, router_context_for_model, scaler_context, scheduler_context,
};
use self::replica::{Phase, Replica, ReplicaConfig, RequestState};
use self::summary::{Replication, Tally};
pub use self::summary::{RequestRecord, RunOutcome, push_slo_metrics};
use self::window::Window;
use super::SetupError;
use super::event_queue::EventQueue;
use crate::error::{Role, RunError};
use crate::facts::RequestInfo;
use crate::handle::{AdmissionHandle, Admitted, RouterHandle, SchedulerHandle, Schedulers};
use crate::ids::{ReplicaId, RequestId, RouterIndex};
use crate::step_model::{Pricer, StepModel};
use crate::time::{SimTime, seconds, ticks};
use crate::workload::cluster::{ClusterSpec, Preemption, StepModels};

enum Event {
    StepEnd(ReplicaId),
    /// A request's KV cache reached its decode instance (disaggregated clusters); void if the
    /// request was lost in a crash since (its `generation` moved on).
    TransferEnd {
        id: RequestId,
        generation: u32,
    },
    /// A prompt's prefix, copied between prefill instances, landed (disaggregated clusters);
    /// void if the request was lost in a crash since.
    MigrationEnd {
        id: RequestId,
        generation: u32,
    },
    /// The gateway scrapes every replica's engine metrics (only for routers that read them).
    Scrape,
    /// A call of an agent session is sent: what it waited for is done, and its tool has run.
    Release(RequestId),
    /// The scaler decides (autoscaling).
    Scale,
    /// A started replica finished loading the model (unless its load was cancelled since).
    Loaded {
        slot: ReplicaId,
        generation: u32,
    },
    /// A replica crashes (`cluster.failures`): a scheduled crash (`life` is
    /// [`failures::SCHEDULED`]) or a random one drawn in the slot's `life`th life (void if that
    /// life has ended since); and it comes back.
    Crash {
        slot: ReplicaId,
        life: u32,
    },
    Restart(ReplicaId),
    /// Boxed: rare, and unboxed it would double every queued event's size.
    Evicted(Box<Evicted>),
}

/// A cut of a replica's cache, on its way to the router.
struct Evicted {
    replica: ReplicaId,
    evicted_at: SimTime,
    path: Vec<Segment>,
    remaining_tokens: u32,
}

/// The pool a replica belongs to: which engine configuration and step pricer it runs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ReplicaPool {
    /// A disaggregated cluster's prefill instances.
    Prefill,
    /// A disaggregated cluster's decode instances, and every replica of an aggregated cluster
    /// without GPU pools.
    Decode,
    /// A disaggregated cluster's mixed instances.
    Mixed,
    /// GPU pool `k`: `cluster.pools[k]`, or the `k`-th model with its own hardware.
    Gpu(u8),
}

/// One value per [`ReplicaPool`].
#[derive(Clone, Debug)]
pub(super) struct ByPool<T> {
    pub(super) prefill: T,
    pub(super) decode: T,
    pub(super) mixed: T,
    pub(super) gpu: Vec<T>,
}

impl<T> std::ops::Index<ReplicaPool> for ByPool<T> {
    type Output = T;
    fn index(&self, pool: ReplicaPool) -> &T {
        match pool {
            ReplicaPool::Prefill => &self.prefill,
            ReplicaPool::Decode => &self.decode,
            ReplicaPool::Mixed => &self.mixed,
            ReplicaPool::Gpu(k) => &self.gpu[k as usize],
        }
    }
}

/// The disaggregation pool of replica `r` (`Decode` on an aggregated cluster).
fn pool_of(pd: Option<&Pd>, r: ReplicaId) -> ReplicaPool {
    match pd {
        Some(pd) if pd.is_prefill_only(r) => ReplicaPool::Prefill,
        Some(pd) if pd.prefills(r) => ReplicaPool::Mixed,
        _ => ReplicaPool::Decode,
    }
}

/// The pool of replica `r`: its GPU pool's (`cluster.pools` or the models' own hardware), else
/// [`pool_of`]'s.
fn replica_pool(pd: Option<&Pd>, gpu_pool: &[u8], r: ReplicaId) -> ReplicaPool {
    match gpu_pool.get(r.index()) {
        Some(&p) => ReplicaPool::Gpu(p),
        None => pool_of(pd, r),
    }
}

/// How a request ended, beyond finishing or not (admission control's outcomes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum End {
    /// Not turned away: it finished, or was unfinished at the horizon (or is still running).
    #[default]
    Served,
    /// Refused on arrival (a rate limit, predicted overload, a P/D router's rejection).
    Rejected,
    /// Dropped as sheddable (on arrival or while held).
    Shed,
    /// Lost in replica crashes more often than `failures.max_retries`, or arrived (or was lost)
    /// while no replica was up.
    Failed,
}

/// Figures sampled while requests arrive (overload detection, replication factor).
struct Probes {
    half: usize,
    waiting_at_half: u64,
    waiting_at_end: u64,
    sample_every: usize,
    replication: Replication,
}

/// One run of the cluster world over a generated stream: the replicas, the policies and the
/// event queue, with one handler per event.
pub struct ClusterSim<'a> {
    stream: Feed<'a>,
    /// Per pool: prefill, decode and mixed differ on a disaggregated cluster only.
    cfgs: ByPool<ReplicaConfig>,
    pricers: ByPool<Pricer>,
    /// Per slot: its GPU pool (empty without pools: [`ClusterSpec::replica_pools`]).
    gpu_pool: Vec<u8>,
    /// Disaggregation state; `None` on an aggregated cluster.
    pd: Option<Pd>,
    eviction_delay: SimTime,
    /// Between metric scrapes; `None` when the router reads none or they are always fresh.
    scrape_interval: Option<SimTime>,
    /// No event after this time runs (`drain_s` after the last arrival).
    horizon: SimTime,
    router: RouterHandle,
    schedulers: Vec<SchedulerHandle>,
    replicas: slots::Slots,
    /// Per request, by id ([`Window`]: a sketched run drops the requests that have ended).
    states: Window<kept::Kept>,
    queue: EventQueue<Event>,
    views: Vec<ReplicaView>,
    /// Scratch: requests finished by the step being handled.
    completed: Vec<RequestId>,
    /// The next request of the stream to arrive by itself (calls that wait for others are sent
    /// by [`Event::Release`]).
    next: usize,
    /// Requests arrived so far, and the last one.
    arrived: usize,
    last_arrived: RequestId,
    /// Agent sessions: per request, the calls it still waits for, and the calls waiting for it.
    waiting_for: Vec<u32>,
    dependents: Vec<Vec<RequestId>>,
    done: usize,
    probes: Probes,
    /// The workload's per-request SLO, measured at the end.
    slo: Option<crate::workload::slo::Slo>,
    /// The admission policy in front of the router (`None`: every request is admitted on arrival,
    /// without a call).
    admission: Option<AdmissionHandle>,
    /// Every request's class, tenant and SLO (by request id).
    infos: Window<RequestInfo>,
    /// How each request ended, beyond finishing (admission's rejections and sheds).
    ends: Window<End>,
    /// When each request was handed to the router (its arrival, unless admission held it).
    dispatched_at: Window<SimTime>,
    /// The workload's classes and tenants, for the per-class and per-tenant metrics.
    classes: Vec<crate::workload::cluster::classes::ClassSpec>,
    tenants: Vec<crate::workload::cluster::classes::TenantSpec>,
    /// Whether the workload names an admission policy other than `admit_all` (then the run
    /// reports `rejected_requests`, `shed_requests`, `held_requests`, `admission_wait_mean_s`).
    admission_metrics: bool,
    /// The remote KV tier every replica shares (`kv_tiers.remote`), if any.
    remote_tier: Option<KvTier>,
    /// Whether the summary keeps every request's record (exact percentiles, records in the
    /// outcome) or sketches the distributions ([`crate::sketch`]).
    exact: bool,
    /// Replicas per lock-step group (`lockstep.rs`; 1 = every replica steps alone), and per
    /// group whether its step is in flight.
    lockstep: usize,
    group_busy: Vec<bool>,
    /// The summary, fed each request's record in request order.
    tally: Tally<'static>,
    /// Whether requests that ended leave the windows as the run goes (a sketched run whose
    /// end reads no per-request state: not with KV tiers), so that memory follows the requests
    /// in flight, not the run's length.
    retiring: bool,
    /// The replicas routers see, as slots: `routable[k]` is the slot at router index `k` (all
    /// of them, in order, on a fixed fleet).
    routable: Vec<ReplicaId>,
    /// Per slot: its router index while ready (and the one its completions keep while draining).
    index_of: Vec<RouterIndex>,
    /// Per slot: when it last became routable (`routable.rs`).
    routable_since: Vec<SimTime>,
    /// The scaler and the slots' lives (`cluster.autoscaling`); `None` on a fixed fleet.
    fleet: Option<fleet::Fleet>,
    autoscaling: Option<crate::workload::cluster::autoscaling::Autoscaling>,
    /// What a cold replica's tiers are rebuilt from: spec, KV bytes per token, layers.
    tier_spec: Option<(crate::workload::cluster::kv_tiers::KvTiers, f64, u32)>,
    cost_per_hour: Option<f64>,
    /// Replica crashes and their toll (`cluster.failures`); `None`: replicas never fail.
    failures: Option<failures::Failures>,
    /// Several models (`cluster.models`): their routers and replicas; `None`: one model.
    models: Option<Box<models::Models>>,
    /// Plain decode steps advanced without queued events (`runs.rs`); `None`: every step queued
    /// (always, when `decode_runs` is off: the tests compare both).
    runs: Option<runs::DecodeRuns>,
    decode_runs: bool,
}

impl<'a> ClusterSim<'a> {
    /// Holds the state of every request below `upto` (a request's state is added when it
    /// arrives, or all at the start when the run keeps them all).
    fn held_up_to(&mut self, upto: usize) {
        while self.states.len() < upto {
            let i = self.states.len();
            let at = self.stream.arrival(i).expect("a request of the stream");
            self.states.push(kept::Kept::Here(RequestState { arrived_at: at, ..Default::default() }));
            self.infos.push(request_info(&self.classes, self.slo.as_ref(), &self.stream, i));
            self.ends.push(End::Served);
            self.dispatched_at.push(at);
        }
    }

    /// Puts `admission` (labelled `label`) in front of the router: it decides on every arrival
    /// whether the request is routed now, held, rejected or shed — on a disaggregated cluster
    /// too, before the P/D router's pair (its views: every instance, prefill, mixed, then decode).
    pub fn with_admission(
        mut self,
        admission: routelab_policy_api::AdmissionBox,
        label: &str,
    ) -> Result<Self, SetupError> {
        self.admission = Some(AdmissionHandle::new(admission, World::Cluster, label));
        Ok(self)
    }

    /// Runs every arrival and every event up to the horizon, then summarises. An event at the
    /// same time as an arrival runs first.
    pub fn run(mut self) -> Result<RunOutcome, RunError> {
        if !self.models_ready() {
            let m = "a cluster of several models runs with one router per model (with_model_routers)";
            return Err(RunError::failed(Role::Policy, self.router.label(), m.to_string()));
        }
        self.run_to_horizon()?;
        self.finish()
    }

    /// Every arrival and every event up to the horizon, and every planned decode step.
    fn run_to_horizon(&mut self) -> Result<(), RunError> {
        self.start_decode_runs();
        self.run_events()?;
        self.catch_up_all(self.horizon);
        Ok(())
    }

    /// Every arrival and every event up to the horizon.
    fn run_events(&mut self) -> Result<(), RunError> {
        loop {
            self.retire();
            self.skip_dependents();
            let arrival = self.stream.arrival(self.next);
            let due = self.queue.peek_time().filter(|&t| match arrival {
                Some(a) => t <= a,
                None => t <= self.horizon,
            });
            if due.is_some() {
                let (now, event) = self.queue.pop().expect("peeked");
                match event {
                    Event::StepEnd(r) => self.on_step_end(now, r)?,
                    Event::TransferEnd { id, generation } => {
                        if self.state(id).generation == generation {
                            self.on_transfer_end(now, id)?
                        }
                    }
                    Event::MigrationEnd { id, generation } => {
                        if self.state(id).generation == generation {
                            self.on_migration_end(now, id)?
                        }
                    }
                    Event::Scrape => self.on_scrape(now),
                    Event::Release(id) => self.on_release(now, id)?,
                    Event::Scale => self.on_scale(now)?,
                    Event::Loaded { slot, generation } => self.on_loaded(now, slot, generation)?,
                    Event::Crash { slot, life } => self.on_crash(now, slot, life)?,
                    Event::Restart(slot) => self.on_restart(now, slot)?,
                    Event::Evicted(e) => self.on_evicted(e.replica, e.evicted_at, &e.path, e.remaining_tokens)?,
                }
                continue;
            }
            let Some(now) = arrival else { break };
            self.on_arrival(now)?;
        }
        Ok(())
    }

    /// The router places request `id` at `now` (views fresh), and an idle replica starts.
    fn place(&mut self, now: SimTime, id: RequestId) -> Result<(), RunError> {
        let arrived_at = seconds(self.state(id).arrived_at);
        if self.nowhere_to_route() {
            // Every replica (of a pool) is down (failures): the gateway has nowhere to send it.
            return self.fail_request(id);
        }
        if self.pd.is_some() {
            // The router's request borrows the prompt while the handler changes the run.
            let prompt = self.stream.prompt(id.index()).to_vec();
            let req = Request::new(id.raw() as u64, arrived_at, self.stream.request(id.index()).prompt_tokens)
                .with_segments(&prompt);
            return self.on_arrival_pd(now, id, &req);
        }
        let stream = &*self.stream;
        let q = stream.request(id.index());
        let prompt = stream.prompt(id.index());
        let req = Request::new(id.raw() as u64, arrived_at, q.prompt_tokens).with_segments(prompt);
        // The request's model's router, shown its model's replicas only (`models.rs`).
        let n = self.routable.len();
        let (router, range) =
            models::router_of(&mut self.router, self.models.as_deref_mut(), stream.model(id.index()) as usize, n);
        let k = range.router_index(router.dispatch(&req, &self.infos[id], &self.views[range.views()])?);
        let r = self.routable[k];
        let cfg = &self.cfgs[replica_pool(None, &self.gpu_pool, r)];
        let st = kept::hand(&mut self.states, id, r);
        self.replicas[r].enqueue(now, id, prompt, q.output_tokens, st, cfg);
        self.lora_enqueued(r, id);
        self.end_decode_run(r);
        if self.idle(r) {
            self.start_step(r, now)?;
        }
        Ok(())
    }

    /// Capacity may have freed at `now`: the admission policy releases (or sheds) held requests
    /// until it waits.
    fn release_held(&mut self, now: SimTime) -> Result<(), RunError> {
        while self.admission.as_ref().is_some_and(|a| a.held() > 0) {
            let probe = self.last_arrived;
            self.refresh_views(probe);
            let a = self.admission.as_mut().expect("checked");
            let Some((id, admit)) = a.next(seconds(now), &self.views)? else { break };
            let id = RequestId::try_from_u64(id).expect("a held request's id (the handle checks it)");
            if admit {
                self.dispatched_at[id] = now;
                self.refresh_views(id);
                self.place(now, id)?;
            } else {
                self.ends[id] = End::Shed;
                self.done += 1;
                self.abandon_dependents(id);
            }
        }
        Ok(())
    }

    /// The next request arrives at `now`: the admission policy (if any) decides, the router
    /// places it, and an idle replica starts.
    fn on_arrival(&mut self, now: SimTime) -> Result<(), RunError> {
        let i = self.next;
        self.next += 1;
        self.held_up_to(i + 1);
        self.arrive(now, RequestId::new(i))
    }

    /// Request `id` arrives at `now` (from the stream, or released by its session).
    fn arrive(&mut self, now: SimTime, id: RequestId) -> Result<(), RunError> {
        self.catch_up_all(now);
        self.arrived += 1;
        self.last_arrived = id;
        if let Some(f) = &mut self.fleet {
            let q = self.stream.request(id.index());
            f.arrived(id, q.prompt_tokens, q.output_tokens);
        }
        self.refresh_views(id);
        let admitted = match &mut self.admission {
            None => Admitted::Now,
            Some(a) => {
                let q = self.stream.request(id.index());
                let req = Request::new(id.raw() as u64, seconds(now), q.prompt_tokens)
                    .with_segments(self.stream.prompt(id.index()));
                a.arrive(&req, &self.infos[id], &self.views)?
            }
        };
        match admitted {
            Admitted::Now => self.place(now, id)?,
            Admitted::Held => self.end_decode_runs(),
            Admitted::Rejected | Admitted::Shed => {
                self.ends[id] = if admitted == Admitted::Rejected { End::Rejected } else { End::Shed };
                self.done += 1;
                self.abandon_dependents(id);
            }
        }
        let p = &mut self.probes;
        let waiting = || self.replicas.iter().map(|r| r.waiting().len() as u64).sum();
        if self.arrived == p.half.max(1) {
            p.waiting_at_half = waiting();
        }
        if self.arrived == self.stream.len() {
            p.waiting_at_end = waiting();
        }
        if self.arrived % p.sample_every == 0 {
            p.replication.sample(&self.replicas);
        }
        Ok(())
    }

    /// The gateway scrapes every replica's metrics at `now`, and the next scrape is due one
    /// interval later while requests remain (to arrive or to finish).
    fn on_scrape(&mut self, now: SimTime) {
        for (v, &slot) in self.views.iter_mut().zip(&self.routable) {
            let pool = replica_pool(self.pd.as_ref(), &self.gpu_pool, slot);
            *v = self.replicas[slot].view(&self.cfgs[pool]);
        }
        for m in 0..self.model_count() {
            let n = self.routable.len();
            let (router, range) = models::router_of(&mut self.router, self.models.as_deref_mut(), m, n);
            router.scrape(&self.views[range.views()], seconds(now));
        }
        if self.done < self.stream.len() {
            let interval = self.scrape_interval.expect("scrapes are scheduled only with an interval");
            self.queue.push(now + interval, Event::Scrape);
        }
    }

    /// A cut of `replica`'s cache at `evicted_at` reaches the router (`eviction_delay_s` later).
    fn on_evicted(
        &mut self,
        replica: ReplicaId,
        evicted_at: SimTime,
        path: &[Segment],
        remaining_tokens: u32,
    ) -> Result<(), RunError> {
        let changing = self.failures.is_some() || self.fleet.is_some();
        if changing && self.stale_eviction(replica, evicted_at) {
            return Ok(());
        }
        if self.pd.is_some() {
            // The instance index: a router index (`Pd::r_decode_start`).
            let replica = self.index_of[replica].raw();
            let e =
                Eviction { replica, evicted_at: seconds(evicted_at), path: RSlice::from_slice(path), remaining_tokens };
            return self.router.evicted(&e);
        }
        let (router, local) = self.router_at(self.index_of[replica]);
        let e = Eviction {
            replica: local as u32,
            evicted_at: seconds(evicted_at),
            path: RSlice::from_slice(path),
            remaining_tokens,
        };
        router.evicted(&e)
    }
}
