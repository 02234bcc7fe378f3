//! Replica failures (`cluster.failures`): scheduled crashes and, with `mtbf_s`, random ones
//! (each replica's time to its next crash drawn exponential from the run's `failures` stream
//! after each start, in event order, so a seed replays exactly).
//!
//! A crash at `t`: the replica stops at once. The router hears, in this order, `on_abandon` for
//! every request that was on it (waiting or running, in id order; `replica` is its index,
//! `output_tokens` what it had streamed), then `on_replica_change` (left): the replica leaves
//! the routable set and the replicas above it move down one index (as `Vec::remove`; a router
//! keeping a list per replica removes that entry). Its KV state is gone (GPU cache, CPU tier;
//! a shared remote tier stays), and eviction notices still on their way are dropped.
//!
//! The rule for the lost requests follows Dynamo's request migration (`lib/llm/src/migration.rs`,
//! `migration_limit`: a request whose stream breaks is sent again to another worker with the
//! tokens generated so far, which the new worker prefills with the prompt, up to the limit of
//! attempts): each is routed again at `t` as a new decision, up to `max_retries` times; it keeps
//! its arrival time, its first token (if it had one: the client has seen it) and the tokens it
//! had generated, which the new replica recomputes with the prompt, as after a preemption. One
//! lost more often, or lost while no replica is up, fails (`End::Failed`); so does a request
//! that arrives while every replica is down (the gateway has nowhere to send it).
//!
//! `restart_s` later the replica is routable again (`on_replica_change`, joined, at the top
//! index) with empty caches. A step that was in flight at the crash is void; if the replica
//! comes back before that step would have ended, it starts its first step then.
//!
//! On a disaggregated cluster a crash takes the instance out of its pool's candidates; what
//! else it loses, the router's notices and the P/D retry rule are in `pd_failures.rs`.
//!
//! In lock-step groups (`lockstep.rs`: the data-parallel engines of a MoE, whose expert layers
//! are collectives over the group) a crash of any member takes the whole group down: every
//! member's requests are lost (the router hears them in id order, then each member leave, in
//! slot order), a group step in flight ends void, and the members come back together
//! `restart_s` later, joining in slot order. `crashes` counts the group's crash once; each
//! member draws its own random crashes, so a group of N fails N times as often as a replica.
//!
//! In an autoscaled fleet (`fleet.rs`) a crash ends the slot's life as the Kubernetes kubelet
//! restarting a crashed pod would: a **ready** replica leaves the routable set as above and
//! loads again — still paid for, counted by the scaler as loading, cancellable by a scale-down
//! like any loading replica (the newest loading) — for `restart_s`, then joins cold; a
//! **loading** one starts its load again, `restart_s` from the crash; a **draining** one was
//! going: its requests are lost and retried as above, and it goes off at once. A crash of an
//! **off** slot is ignored. Random crashes are drawn for the slots up at the start, for a slot
//! when a scale-up starts it and when it comes back from a crash; a draw made in a life that
//! has ended since (by a crash, or the slot going off) is void, so each live replica has one
//! pending random crash (on a fixed cluster too: a scheduled crash voids the random one pending).
//!
//! A slowdown (`failures.slowdowns`) multiplies the duration of every step its replica starts
//! in its window (`form_step`): the replica stays routable, its queues grow, and only a router
//! that reads load (or learns latency) sees it. In lock-step a slow member slows its group.
//!
//! A lost KV event (`failures.kv_event_loss`): each eviction event a replica's step produces is
//! dropped with that probability, drawn from the run's `failures.kv_events` stream (its own, so
//! the crash draws do not move), before it is queued for the router; the cache itself is cut.
//!
//! Metrics (only with `failures`): `crashes`, `kv_events_lost`, `requests_lost` (on a replica when it crashed,
//! counting each loss), `retried_requests` (routings again), `failed_requests`, `availability`
//! (the share of replica-time not down after a crash: over the slots × the run until its last
//! completion; with autoscaling, over the replica-time paid for).

use rand::RngExt;
use rand_distr::{Distribution, Exp};
use routelab_policy_api::Request;

use super::fleet::Slot;
use super::replica::Phase;
use super::{ClusterSim, End, Event};
use crate::error::RunError;
use crate::ids::{ReplicaId, RequestId};
use crate::metrics::Metrics;
use crate::seeds::SimRng;
use crate::time::{SimTime, seconds, ticks};
use crate::workload::cluster::failures::Failures as Spec;

/// The failure process and what it cost.
pub(super) struct Failures {
    spec: Spec,
    rng: SimRng,
    /// Draws which eviction events are lost (`kv_event_loss`).
    event_rng: SimRng,
    events_lost: u64,
    /// Per slot: down since when (`None`: up).
    down_since: Vec<Option<SimTime>>,
    /// Every finished down time, (from, until).
    down_spans: Vec<(SimTime, SimTime)>,
    /// Per slot: a step from before its crash has yet to reach its (void) end.
    void_step: Vec<bool>,
    /// Per slot: its lives so far (a crash, or going off, ends one); a random crash drawn in an
    /// earlier life is void.
    life: Vec<u32>,
    /// Per request: times it was routed again.
    retries: Vec<u32>,
    crashes: u64,
    lost: u64,
    retried: u64,
    failed: u64,
}

impl Failures {
    pub(super) fn new(spec: &Spec, slots: usize, requests: usize, run_seed: u64) -> Self {
        Self {
            spec: spec.clone(),
            rng: crate::seeds::stream(run_seed, "failures"),
            event_rng: crate::seeds::stream(run_seed, "failures.kv_events"),
            events_lost: 0,
            down_since: vec![None; slots],
            down_spans: Vec::new(),
            void_step: vec![false; slots],
            life: vec![0; slots],
            retries: vec![0; requests],
            crashes: 0,
            lost: 0,
            retried: 0,
            failed: 0,
        }
    }

    /// When slot `slot`, started at `now`, next crashes at random, as the event to queue (`None`
    /// without `mtbf_s`).
    fn next_crash(&mut self, slot: ReplicaId, now: SimTime) -> Option<(SimTime, Event)> {
        let mtbf = self.spec.mtbf_s?;
        let x: f64 = Exp::new(1.0 / mtbf).expect("mtbf_s > 0 (validated)").sample(&mut self.rng);
        let at = now.saturating_add(ticks(x.min(crate::workload::limits::MAX_HORIZON)));
        Some((at, Event::Crash { slot, life: self.life[slot] }))
    }

    /// Whether the next eviction event is lost on its way to the router (`kv_event_loss`).
    pub(super) fn loses_kv_event(&mut self) -> bool {
        let p = self.spec.kv_event_loss;
        let lost = p > 0.0 && self.event_rng.random::<f64>() < p;
        self.events_lost += u64::from(lost);
        lost
    }

    /// The factor on a step `slot` starts at `now` (1 when no slowdown holds).
    pub(super) fn slow_factor(&self, slot: ReplicaId, now: SimTime) -> f64 {
        let at = seconds(now);
        self.spec.slowdowns.iter().filter(|d| d.replica == slot.raw()).map(|d| d.factor_at(at)).product()
    }

    /// Slot `slot`'s down time (if it is down) ends at `now`.
    fn up(&mut self, slot: ReplicaId, now: SimTime) {
        if let Some(since) = self.down_since[slot].take() {
            self.down_spans.push((since, now));
        }
    }

    /// The run's figures (module docs); `end` is its last completion, `replica_seconds` the
    /// replica-time availability is a share of (the slots × `end` of a fixed cluster; with
    /// autoscaling, the time paid for).
    pub(super) fn push_metrics(&self, m: &mut Metrics, end: SimTime, replica_seconds: f64) {
        let open = self.down_since.iter().flatten().map(|&since| (since, end));
        let down: f64 =
            self.down_spans.iter().copied().chain(open).map(|(a, b)| seconds(b.min(end).saturating_sub(a))).sum();
        m.push("crashes", self.crashes as f64);
        m.push("kv_events_lost", self.events_lost as f64);
        m.push("requests_lost", self.lost as f64);
        m.push("retried_requests", self.retried as f64);
        m.push("failed_requests", self.failed as f64);
        let total = replica_seconds;
        m.push("availability", if total == 0.0 { f64::NAN } else { 1.0 - down / total });
    }
}

/// The `life` of a scheduled crash's event: it holds in whatever life its slot is then.
pub(super) const SCHEDULED: u32 = u32::MAX;

impl ClusterSim<'_> {
    /// Makes replicas fail as `cluster.failures` says, with the random crashes drawn from
    /// `run_seed`'s `failures` stream (a no-op without `failures:`).
    pub fn with_failures(mut self, spec: Option<&Spec>, run_seed: u64) -> Self {
        let Some(spec) = spec else { return self };
        let mut f = Failures::new(spec, self.replicas.len(), self.stream.requests.len(), run_seed);
        for c in &spec.crashes {
            self.queue.push(ticks(c.at_s), Event::Crash { slot: ReplicaId::from_u32(c.replica), life: SCHEDULED });
        }
        // The replicas up at the start (every slot of a fixed cluster; with autoscaling, the
        // starting ones: the others draw theirs when they start).
        let up: Vec<ReplicaId> = self.replicas.ids().filter(|&s| self.is_routable(s)).collect();
        for slot in up {
            if let Some((at, event)) = f.next_crash(slot, SimTime::ZERO) {
                self.queue.push(at, event);
            }
        }
        self.failures = Some(f);
        self
    }

    /// Whether `slot` is down (crashed, not yet restarted).
    pub(super) fn is_down(&self, slot: ReplicaId) -> bool {
        self.failures.as_ref().is_some_and(|f| f.down_since[slot].is_some())
    }

    /// Replica `slot` crashes at `now` (ignored if it is down or off, if `life` — a random
    /// crash's — has ended, or once every request has ended).
    pub(super) fn on_crash(&mut self, now: SimTime, slot: ReplicaId, life: u32) -> Result<(), RunError> {
        let f = self.failures.as_ref().expect("crash events come with failures");
        let ended = life != SCHEDULED && life != f.life[slot];
        let state = self.fleet.as_ref().map(|fleet| fleet.slots[slot]);
        if ended || self.is_down(slot) || state == Some(Slot::Off) || self.done == self.states.len() {
            return Ok(());
        }
        // A lock-step group fails whole (its collectives break): every member goes down.
        let group = self.group_of(slot);
        // Each lost request with the member it was on.
        let mut lost: Vec<(RequestId, ReplicaId)> = Vec::new();
        for m in group.clone() {
            let rep = &self.replicas[m];
            lost.extend(rep.waiting().iter().chain(rep.running()).map(|&id| (id, m)));
        }
        // P/D: what else the crash loses (`pd_failures.rs`).
        if self.pd.is_some() {
            let mut more = Vec::new();
            self.pd_crash_losses(slot, &mut more);
            lost.extend(more.into_iter().map(|id| (id, slot)));
        }
        lost.sort_unstable();
        // What each lost request had streamed, before the replicas' state goes.
        let produced: Vec<u32> = lost.iter().map(|&(id, m)| self.replicas[m].produced_now(self.state(id))).collect();
        // The router hears, in id order, of every request lost now (but an orphan lost again on
        // its prefill instance: it heard of that one when it was orphaned) and, on a P/D
        // decode instance, of every request the crash orphans.
        let orphaned = |sim: &Self, id: RequestId| sim.pd.as_ref().is_some_and(|pd| pd.orphan[id]);
        let mut notices: Vec<(RequestId, ReplicaId, u32)> = lost
            .iter()
            .zip(&produced)
            .filter(|&(&(id, _), _)| !orphaned(self, id))
            .map(|(&(id, m), &out)| (id, m, out))
            .collect();
        if self.pd.is_some() {
            let orphans = self.pd_orphans(slot);
            notices.extend(orphans.into_iter().map(|id| (id, slot, self.state(id).produced)));
            notices.sort_unstable();
        }
        for &(id, m, out) in &notices {
            self.abandon(now, id, self.abandoned_index(id, m), out)?;
        }
        // Out of the routable set, member by member: the ones above move down one index (a
        // draining or loading replica of an autoscaled fleet has left it already, or not joined
        // it yet).
        if state.is_none_or(|st| st == Slot::Ready) {
            for m in group.clone() {
                self.leave_routable(now, m)?;
            }
        }
        // Cold: a new replica keeps only the counters the summary reads. A step in flight (a
        // group's: the group was busy) ends void.
        let was_busy = match self.lockstep {
            1 => self.replicas[slot].busy(),
            _ => self.group_busy[self.group_index(slot)],
        };
        for m in group.clone() {
            for (id, st) in self.replicas[m].cold_restart(self.tier_spec.as_ref()) {
                self.states[id] = super::kept::Kept::Here(st);
            }
        }
        let f = self.failures.as_mut().expect("crash events come with failures");
        for m in group.clone() {
            f.void_step[m] = was_busy;
            f.life[m] += 1;
        }
        f.crashes += 1;
        f.lost += notices.len() as u64;
        let restart = ticks(f.spec.restart_s);
        match state {
            // A fixed cluster's replica (or group) restarts.
            None => {
                for m in group {
                    f.down_since[m] = Some(now);
                }
                self.queue.push(now + restart, Event::Restart(slot));
            }
            // A draining one was going: it is gone.
            Some(Slot::Draining) => self.slot_off(now, slot),
            // A ready or loading one restarts as a loading one (`fleet.rs`).
            Some(_) => {
                f.down_since[slot] = Some(now);
                let generation = self.fleet.as_mut().expect("a fleet").restart(slot);
                self.queue.push(now + restart, Event::Loaded { slot, generation });
            }
        }
        for (&(id, _), &out) in lost.iter().zip(&produced) {
            if let Some(pd) = self.pd.as_mut() {
                pd.orphan[id] = false;
            }
            self.retry_or_fail(now, id, out)?;
        }
        if self.pd.is_some() {
            // Its losses may have freed a draining instance (`fleet_pd.rs`).
            self.settle_drains(now);
        }
        Ok(())
    }

    /// The slots that fail and restart with `s`: its lock-step group (`s` alone without one),
    /// in slot order.
    fn group_of(&self, s: ReplicaId) -> impl Iterator<Item = ReplicaId> + Clone + use<> {
        self.group_members(self.group_index(s))
    }

    /// Request `id`, lost at `now` with `produced` tokens out, is routed again or fails.
    pub(super) fn retry_or_fail(&mut self, now: SimTime, id: RequestId, produced: u32) -> Result<(), RunError> {
        let nowhere = self.nowhere_to_route();
        let f = self.failures.as_mut().expect("failures");
        if f.retries[id] >= f.spec.max_retries || nowhere {
            return self.fail_request(id);
        }
        f.retries[id] += 1;
        f.retried += 1;
        let st = self.state_mut(id);
        st.path.clear();
        st.generation += 1;
        st.prefill_done = 0;
        st.produced = produced;
        st.phase = Phase::Waiting;
        if self.pd.is_some() {
            self.pd_reset(id);
            self.refresh_views(id);
            return self.place(now, id);
        }
        self.refresh_views(id);
        let stream = self.stream.whole().expect("crashes run on whole streams (`LazyStream::fits`)");
        let q = &stream.requests[id];
        let prompt = stream.prompt(id.index());
        let req =
            Request::new(id.raw() as u64, seconds(self.state(id).arrived_at), q.prompt_tokens).with_segments(prompt);
        let r = self.routable[self.router.dispatch(&req, &self.infos[id], &self.views)? as usize];
        let cfg = &self.cfgs[super::replica_pool(None, &self.gpu_pool, r)];
        // As after a preemption, the new replica recomputes the generated tokens with the prompt.
        let st = super::kept::hand(&mut self.states, id, r);
        self.replicas[r].enqueue(now, id, prompt, q.output_tokens, st, cfg);
        if self.idle(r) {
            self.start_step(r, now)?;
        }
        Ok(())
    }

    /// Request `id` fails: it was lost once too often, or no replica was up.
    pub(super) fn fail_request(&mut self, id: RequestId) -> Result<(), RunError> {
        // Not bound for a decode instance any more (`pd_failures.rs` looks for such requests),
        // nor held by its prefill instance (`fleet_pd.rs`).
        self.state_mut(id).handoff = false;
        if let Some(pd) = self.pd.as_mut() {
            pd.handed_over(id);
        }
        // Events still on their way for it (a transfer's end, a migration's) are void.
        self.state_mut(id).generation += 1;
        let f = self.failures.as_mut().expect("only failures fail requests");
        f.failed += 1;
        self.ends[id] = End::Failed;
        self.done += 1;
        self.abandon_dependents(id);
        Ok(())
    }

    /// Whether a request has nowhere to go: no replica is routable (on a disaggregated
    /// cluster, either pool has none).
    pub(super) fn nowhere_to_route(&self) -> bool {
        match &self.pd {
            Some(pd) => pd.r_prefill_end() == 0 || self.routable.len() == pd.r_decode_start,
            None => self.routable.is_empty(),
        }
    }

    /// Replica `slot` (with its lock-step group, member by member) is back at `now`, cold: it
    /// takes requests at the top index.
    pub(super) fn on_restart(&mut self, now: SimTime, slot: ReplicaId) -> Result<(), RunError> {
        for m in self.group_of(slot) {
            debug_assert!(self.is_down(m), "a restarting replica is down");
            self.arm_crash(now, m);
            self.join_routable(now, m)?;
        }
        self.release_held(now)
    }

    /// Slot `s` started (or restarted) at `now`: its next random crash is queued (with
    /// `mtbf_s`, while requests remain), and a down time it had ends.
    pub(super) fn arm_crash(&mut self, now: SimTime, s: ReplicaId) {
        let live = self.done < self.states.len();
        let Some(f) = self.failures.as_mut() else { return };
        f.up(s, now);
        if let Some((at, event)) = f.next_crash(s, now).filter(|_| live) {
            self.queue.push(at, event);
        }
    }

    /// Slot `s` of an autoscaled fleet goes off at `now` (drained, cancelled, or crashed while
    /// draining): it stops being paid for, its life ends (a random crash drawn in it is void),
    /// and a down time it had ends.
    pub(super) fn slot_off(&mut self, now: SimTime, s: ReplicaId) {
        self.fleet.as_mut().expect("slots go off in autoscaled fleets").off(s, now);
        if let Some(f) = self.failures.as_mut() {
            f.up(s, now);
            f.life[s] += 1;
        }
    }

    /// Group `g`'s step ended at `now`: `true` if it was void (begun before its crash); the
    /// group, if back up with work, starts its first step.
    pub(super) fn void_group_step_ended(&mut self, now: SimTime, g: usize) -> Result<bool, RunError> {
        let first = self.group_first(g);
        let group = self.group_of(first);
        let Some(f) = self.failures.as_mut() else { return Ok(false) };
        if !f.void_step[first] {
            return Ok(false);
        }
        for m in group.clone() {
            f.void_step[m] = false;
            self.replicas[m].void_step_ended();
        }
        self.group_busy[g] = false;
        if !self.is_down(first) {
            self.start_group_step(g, now)?;
        }
        Ok(true)
    }

    /// A step of `slot` ended at `now`: `true` if it was void (begun before a crash); the
    /// replica, if back up with work, starts its first step.
    pub(super) fn void_step_ended(&mut self, now: SimTime, slot: ReplicaId) -> Result<bool, RunError> {
        let Some(f) = self.failures.as_mut() else { return Ok(false) };
        if !std::mem::take(&mut f.void_step[slot]) {
            return Ok(false);
        }
        self.replicas[slot].void_step_ended();
        if !self.is_down(slot) {
            self.start_step(slot, now)?;
        }
        Ok(true)
    }
}
