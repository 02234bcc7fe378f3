//! Autoscaling in the loop (`cluster.autoscaling`): a scaler (policy-api 0.5.4) asked every
//! `interval_s` how many replicas each pool should have, and the replicas' lives.
//!
//! Pools: an aggregated cluster is one pool of `max_replicas` slots. A disaggregated one (no
//! mixed instances) is two, asked in the order prefill, decode, each with its own slots
//! (`autoscaling.pools.*.max_replicas`: prefill slots first, then decode) and bounds; each
//! answer is applied to its pool's slots alone, and a scale-up also stops at the fleet's budget
//! (`max_replicas` slots paid for at once over both pools, draining ones included; scale-downs
//! go first, so a cancelled load frees budget in the same decision). A joining instance takes
//! the top index of its pool's candidates and a drained one leaves them (`routable.rs`, as a
//! crash's); when a draining P/D instance is done is `fleet_pd.rs`'s.
//!
//! In each pool a slot is off, loading, ready or draining. A scale-up turns off slots (lowest
//! first) into loading ones with cold caches (GPU and CPU tier emptied; the shared remote tier
//! stays); each becomes ready — routable — `model_load_s` later. A
//! scale-down first cancels loading replicas (newest first: Kubernetes deletes not-ready pods
//! first), then drains ready ones, newest first: a draining replica takes no new request,
//! finishes every request dispatched to it (queued ones included), then goes off. Billing runs
//! from the scale-up decision (a loading replica is paid for) until the slot goes off.
//!
//! Routers see the ready replicas only, indexed in the order they became ready; since scale-down
//! drains the newest, the ready set is a stack and a replica keeps its index while it is ready
//! (`Router::on_replica_change` says when the set changes; `completion.replica` is the index the
//! request was placed at, which a replica that joins later may take again). A draining
//! replica's eviction notices are not delivered: the router forgot it when it left
//! (`routable.rs`, which both joins and leaves go through, as a crash's do).
//!
//! A crash (`cluster.failures`) of a ready or loading replica makes it a loading one again for
//! `restart_s`; of a draining one, an off one (`failures.rs` has the rules).
//!
//! What the scaler is told at each decision: the ready replicas' views (with `kv_used_tokens`
//! the KV running requests hold, as vLLM's `kv_cache_usage_perc` counts: cached blocks no
//! request references are free) and the figures of
//! `policy-api`'s `facts::fleet` — counts, queue, KV utilisation (means over ready replicas),
//! the last interval's arrival rate, mean prompt and output tokens, mean TTFT and TPOT of the
//! requests finished in it, and the SLO attainment of every request finished so far. Its answer
//! is clamped to `[min_replicas, max_replicas]`, and to the slots free (draining ones count).
//! On a disaggregated cluster each pool's `Pool` has its own ready instances' views, counts
//! (ready, loading, draining), bounds, queue and KV figures; the arrival rate, token means, TTFT,
//! TPOT and SLO attainment are the fleet's, the same in both.
//!
//! Metrics (only with `autoscaling` or `cost_per_hour`): `replica_seconds` (over the run, until
//! its last event), `replicas_mean` (÷ that time), `cost` (× `cost_per_hour` / 3600, with a
//! price), and with a scaler `replicas_max`, `scale_ups`, `scale_downs` (decisions that raised /
//! lowered the target), `replicas_started`, `slo_attainment_scaling` (over requests that arrived
//! while replicas were loading, or loading again after a crash: how the SLO fares during
//! scale-out; NaN if none did). On a disaggregated cluster `replica_seconds_prefill` and
//! `replica_seconds_decode` split the bill by pool (`replica_seconds` is their sum; `scale_ups`
//! and `scale_downs` count each pool's raised or lowered target), and `prefill_utilisation` /
//! `decode_utilisation` are each pool's busy time ÷ its paid replica-seconds (what the pool was
//! billed for, loading and draining time included; a fixed P/D cluster's stay over every
//! instance from the first arrival to the last completion).

use abi_stable::std_types::{RSlice, RVec};
use routelab_policy_api::{Fact, Pool, ReplicaView, ScalerBox, facts::fleet};

use super::replica::Replica;
use super::{ClusterSim, Event};
use crate::error::{Role, RunError};
use crate::handle::report_of;
use crate::ids::{ReplicaId, RequestId};
use crate::metrics::Metrics;
use crate::time::{SimTime, seconds, ticks};
use crate::workload::cluster::autoscaling::Autoscaling;

/// A slot's life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Slot {
    Off,
    Loading,
    Ready,
    Draining,
}

/// One pool the scaler decides for: its slots and bounds, and what its replicas cost.
pub(super) struct FleetPool {
    pub(super) slots: std::ops::Range<usize>,
    min: u32,
    max: u32,
    replica_seconds: f64,
}

/// The scaler and the slots' states.
pub(super) struct Fleet {
    scaler: ScalerBox,
    label: String,
    spec: Autoscaling,
    interval: SimTime,
    pub(super) slots: Vec<Slot>,
    /// The pools, in the order the scaler answers for them: one on an aggregated cluster; the
    /// prefill then the decode pool on a disaggregated one.
    pub(super) pools: Vec<FleetPool>,
    /// Per slot: bumped at every scale-up, so a cancelled load's event is recognised.
    generation: Vec<u32>,
    /// Loading slots in the order they were started.
    loading: Vec<ReplicaId>,
    /// Per slot: since when it is paid for (not off).
    on_since: Vec<SimTime>,
    replica_seconds: f64,
    replicas_max: u32,
    scale_ups: u64,
    scale_downs: u64,
    started: u64,
    /// The last interval's arrivals: count, prompt and output tokens.
    win_arrivals: u64,
    win_prompt: u64,
    win_output: u64,
    /// The last interval's completions: count, TTFT sum, TPOT sum and count.
    win_done: u64,
    win_ttft: f64,
    win_tpot: f64,
    win_tpot_n: u64,
    /// Requests finished so far, and how many met the SLO.
    finished: u64,
    met: u64,
    /// Per request: whether it arrived while a replica was loading; how many did, and how many
    /// of those met the SLO.
    during_scale_out: Vec<bool>,
    scaling_n: u64,
    scaling_met: u64,
    /// The last time anything happened (billing ends there).
    pub(super) last: SimTime,
    /// Whether the workload has an SLO (attainment is NaN without).
    has_slo: bool,
}

impl Fleet {
    /// `ready`: the slots up at the start.
    pub(super) fn new(
        scaler: ScalerBox,
        label: &str,
        spec: &Autoscaling,
        ready: &[ReplicaId],
        requests: usize,
        has_slo: bool,
    ) -> Self {
        let n = spec.slots() as usize;
        let mut slots = vec![Slot::Off; n];
        for &s in ready {
            slots[s.index()] = Slot::Ready;
        }
        let pool = |slots, min, max| FleetPool { slots, min, max, replica_seconds: 0.0 };
        let pools = match &spec.pools {
            None => vec![pool(0..n, spec.min_replicas, spec.max_replicas)],
            Some(p) => {
                let split = p.prefill.max_replicas as usize;
                vec![
                    pool(0..split, p.prefill.min_replicas, p.prefill.max_replicas),
                    pool(split..n, p.decode.min_replicas, p.decode.max_replicas),
                ]
            }
        };
        Self {
            scaler,
            label: label.to_string(),
            spec: spec.clone(),
            interval: ticks(spec.interval_s).max(SimTime::TICK),
            slots,
            pools,
            generation: vec![0; n],
            loading: Vec::new(),
            on_since: vec![SimTime::ZERO; n],
            replica_seconds: 0.0,
            replicas_max: ready.len() as u32,
            scale_ups: 0,
            scale_downs: 0,
            started: 0,
            win_arrivals: 0,
            win_prompt: 0,
            win_output: 0,
            win_done: 0,
            win_ttft: 0.0,
            win_tpot: 0.0,
            win_tpot_n: 0,
            finished: 0,
            met: 0,
            during_scale_out: vec![false; requests],
            scaling_n: 0,
            scaling_met: 0,
            last: SimTime::ZERO,
            has_slo,
        }
    }

    fn count(&self, s: Slot) -> u32 {
        self.slots.iter().filter(|&&x| x == s).count() as u32
    }

    /// Slots of pool `k` in state `s`.
    fn count_in(&self, k: usize, s: Slot) -> u32 {
        self.slots[self.pools[k].slots.clone()].iter().filter(|&&x| x == s).count() as u32
    }

    /// The pool slot `slot` belongs to.
    fn pool_of(&self, slot: ReplicaId) -> usize {
        self.pools.iter().position(|p| p.slots.contains(&slot.index())).expect("every slot is in a pool")
    }

    /// Slot `slot` stops being paid for at `now` (through [`ClusterSim::slot_off`] while the
    /// run goes on).
    pub(super) fn off(&mut self, slot: ReplicaId, now: SimTime) {
        self.slots[slot] = Slot::Off;
        let paid = seconds(now - self.on_since[slot]);
        self.replica_seconds += paid;
        let k = self.pool_of(slot);
        self.pools[k].replica_seconds += paid;
    }

    /// Slot `slot` (ready or loading) crashed: it loads again, still paid for, as the newest
    /// loading replica; returns the generation its `Loaded` event must carry.
    pub(super) fn restart(&mut self, slot: ReplicaId) -> u32 {
        self.slots[slot] = Slot::Loading;
        self.generation[slot] += 1;
        self.loading.retain(|&x| x != slot);
        self.loading.push(slot);
        self.generation[slot]
    }

    /// Pool `k`'s replica-seconds paid for until the run's `end` (its last completion): what
    /// [`Fleet::push_metrics`] bills the pool, the same figure to the bit, before it has run.
    pub(super) fn pool_paid_seconds(&self, k: usize, end: SimTime) -> f64 {
        let end = end.max(self.last);
        let on = self.pools[k].slots.clone().filter(|&s| self.slots[s] != Slot::Off);
        on.fold(self.pools[k].replica_seconds, |paid, s| paid + seconds(end.max(self.on_since[s]) - self.on_since[s]))
    }

    /// Replica-seconds paid for (all of the run's once [`Fleet::push_metrics`] has run).
    pub(super) fn replica_seconds(&self) -> f64 {
        self.replica_seconds
    }

    /// Request `id` arrived with these sizes.
    pub(super) fn arrived(&mut self, id: RequestId, prompt: u32, output: u32) {
        self.win_arrivals += 1;
        self.win_prompt += prompt as u64;
        self.win_output += output as u64;
        self.during_scale_out[id] = !self.loading.is_empty();
        self.scaling_n += self.during_scale_out[id] as u64;
    }

    /// Request `id` finished at `now` with these times (seconds; `tpot` NaN for one output
    /// token), meeting the SLO or not.
    pub(super) fn completed(&mut self, id: RequestId, now: SimTime, ttft: f64, tpot: f64, met: bool) {
        self.scaling_met += (met && self.during_scale_out[id]) as u64;
        self.last = self.last.max(now);
        self.win_done += 1;
        self.win_ttft += ttft;
        if tpot.is_finite() {
            self.win_tpot += tpot;
            self.win_tpot_n += 1;
        }
        self.finished += 1;
        self.met += met as u64;
    }

    /// Pool `k`'s figures (counts, bounds, queue and KV of its ready replicas `views`) and the
    /// fleet's (arrivals, latencies, SLO attainment).
    fn facts(&self, k: usize, views: &[ReplicaView]) -> Vec<Fact> {
        let nan_div = |a: f64, b: u64| if b == 0 { f64::NAN } else { a / b as f64 };
        let (ready, loading) = (self.count_in(k, Slot::Ready), self.count_in(k, Slot::Loading));
        let kv = views.iter().map(|v| v.kv_used_tokens as f64 / v.kv_capacity_tokens.max(1) as f64).sum::<f64>();
        vec![
            Fact::new(fleet::REPLICAS, (ready + loading) as f64),
            Fact::new(fleet::READY_REPLICAS, ready as f64),
            Fact::new(fleet::LOADING_REPLICAS, loading as f64),
            Fact::new(fleet::DRAINING_REPLICAS, self.count_in(k, Slot::Draining) as f64),
            Fact::new(fleet::MIN_REPLICAS, self.pools[k].min as f64),
            Fact::new(fleet::MAX_REPLICAS, self.pools[k].max as f64),
            Fact::new(fleet::WAITING, views.iter().map(|v| v.waiting as f64).sum()),
            Fact::new(fleet::RUNNING, views.iter().map(|v| v.running as f64).sum()),
            Fact::new(fleet::KV_UTILISATION, nan_div(kv, views.len() as u64)),
            Fact::new(fleet::ARRIVAL_RATE, self.win_arrivals as f64 / seconds(self.interval)),
            Fact::new(fleet::PROMPT_TOKENS_MEAN, nan_div(self.win_prompt as f64, self.win_arrivals)),
            Fact::new(fleet::OUTPUT_TOKENS_MEAN, nan_div(self.win_output as f64, self.win_arrivals)),
            Fact::new(fleet::TTFT_MEAN_S, nan_div(self.win_ttft, self.win_done)),
            Fact::new(fleet::TPOT_MEAN_S, nan_div(self.win_tpot, self.win_tpot_n)),
            Fact::new(
                fleet::SLO_ATTAINMENT,
                if self.has_slo { nan_div(self.met as f64, self.finished) } else { f64::NAN },
            ),
        ]
    }

    /// The run's figures (see the module docs); `end` is when the run's last event happened.
    pub(super) fn push_metrics(&mut self, m: &mut Metrics, end: SimTime, cost_per_hour: Option<f64>) {
        for s in ReplicaId::each(0..self.slots.len()) {
            if self.slots[s] != Slot::Off {
                self.off(s, end.max(self.on_since[s]));
            }
        }
        push_cost(m, self.replica_seconds, end, cost_per_hour);
        if let [prefill, decode] = &self.pools[..] {
            m.push("replica_seconds_prefill", prefill.replica_seconds);
            m.push("replica_seconds_decode", decode.replica_seconds);
        }
        m.push("replicas_max", self.replicas_max as f64);
        m.push("scale_ups", self.scale_ups as f64);
        m.push("scale_downs", self.scale_downs as f64);
        m.push("replicas_started", self.started as f64);
        let (met, n) = (self.scaling_met, self.scaling_n);
        m.push("slo_attainment_scaling", if n == 0 || !self.has_slo { f64::NAN } else { met as f64 / n as f64 });
    }

    /// The scaler's own figures as `scaler.<name>`.
    pub(super) fn report(&self) -> Result<Vec<(String, f64)>, RunError> {
        report_of(Role::Scaler, &self.label, "scaler", self.scaler.report())
    }
}

/// `replica_seconds`, `replicas_mean` and, with a price, `cost`.
pub(super) fn push_cost(m: &mut Metrics, replica_seconds: f64, end: SimTime, cost_per_hour: Option<f64>) {
    m.push("replica_seconds", replica_seconds);
    m.push("replicas_mean", if end == SimTime::ZERO { f64::NAN } else { replica_seconds / seconds(end) });
    if let Some(c) = cost_per_hour {
        m.push("cost", replica_seconds * c / 3600.0);
    }
}

impl ClusterSim<'_> {
    /// Puts `scaler` (labelled `label`) in charge of the replica count (`cluster.autoscaling`).
    pub fn with_scaler(mut self, scaler: ScalerBox, label: &str) -> Result<Self, super::SetupError> {
        let Some(spec) = self.autoscaling.clone() else {
            return Err(super::SetupError::new(
                "autoscaling",
                "a scaler was given for a cluster without `autoscaling:`",
                "add an `autoscaling:` section",
            ));
        };
        let fleet = Fleet::new(scaler, label, &spec, &self.routable, self.states.len(), self.slo.is_some());
        self.queue.push(fleet.interval, Event::Scale);
        self.fleet = Some(fleet);
        Ok(self)
    }

    /// The scaler decides at `now`; the fleet follows; the next decision is queued while
    /// requests remain.
    pub(super) fn on_scale(&mut self, now: SimTime) -> Result<(), RunError> {
        if self.done == self.states.len() {
            // Every request has ended: the run is over, and so is the bill.
            return Ok(());
        }
        // The scaler reads the router's views, KV use counted as vLLM's `kv_cache_usage_perc`
        // counts it ([`Replica::kv_referenced_tokens`]).
        for (k, &slot) in self.routable.iter().enumerate() {
            let pool = super::pool_of(self.pd.as_ref(), slot);
            self.views[k] = self.replicas[slot].view(&self.cfgs[pool]);
        }
        let ranges: Vec<std::ops::Range<usize>> =
            (0..self.fleet.as_ref().expect("fleet").pools.len()).map(|k| self.pool_routable(k)).collect();
        let f = self.fleet.as_mut().expect("scale events come with a fleet");
        f.last = f.last.max(now);
        let facts: Vec<Vec<Fact>> =
            ranges.iter().enumerate().map(|(k, r)| f.facts(k, &self.views[r.clone()])).collect();
        let pools: Vec<Pool> = ranges
            .iter()
            .zip(&facts)
            .map(|(r, facts)| Pool {
                replicas: routelab_policy_api::Replicas {
                    views: RSlice::from_slice(&self.views[r.clone()]),
                    signals: RSlice::from_slice(&[]),
                    signal_columns: 0,
                },
                facts: RSlice::from_slice(facts),
            })
            .collect();
        let label = f.label.clone();
        let answer: RVec<u32> = f
            .scaler
            .desired(seconds(now), RSlice::from_slice(&pools))
            .into_result()
            .map_err(|e| RunError::erred(Role::Scaler, &label, "desired", e.into()))?;
        let n = pools.len();
        if answer.len() != n {
            let s = if n == 1 { "" } else { "s" };
            return Err(RunError::refused(
                Role::Scaler,
                &label,
                format!("answered {} replica counts for {n} pool{s} (answer one per pool)", answer.len()),
            ));
        }
        // Per pool: (desired, current).
        let moves: Vec<(u32, u32)> = (0..n)
            .map(|k| {
                let desired = answer[k].clamp(f.pools[k].min, f.pools[k].max);
                (desired, f.count_in(k, Slot::Ready) + f.count_in(k, Slot::Loading))
            })
            .collect();
        for &(desired, current) in &moves {
            if desired > current {
                f.scale_ups += 1;
            } else if desired < current {
                f.scale_downs += 1;
            }
        }
        f.win_arrivals = 0;
        f.win_prompt = 0;
        f.win_output = 0;
        f.win_done = 0;
        f.win_ttft = 0.0;
        f.win_tpot = 0.0;
        f.win_tpot_n = 0;
        // Scale-downs first: a cancelled load frees budget (`max_replicas`) a scale-up may use.
        for (k, &(desired, current)) in moves.iter().enumerate() {
            if desired < current {
                self.scale_down(now, k, current - desired)?;
            }
        }
        for (k, &(desired, current)) in moves.iter().enumerate() {
            if desired > current {
                self.scale_up(now, k, desired - current);
            }
        }
        let f = self.fleet.as_mut().expect("checked");
        f.replicas_max = f.replicas_max.max(f.count(Slot::Ready) + f.count(Slot::Loading) + f.count(Slot::Draining));
        let next = now + f.interval;
        self.queue.push(next, Event::Scale);
        Ok(())
    }

    /// Pool `k`'s ready replicas as router indices: all of them on an aggregated cluster; on a
    /// disaggregated one the prefill candidates (pool 0) or the decode ones (pool 1).
    fn pool_routable(&self, k: usize) -> std::ops::Range<usize> {
        match (&self.pd, k) {
            (None, _) => 0..self.routable.len(),
            (Some(pd), 0) => 0..pd.r_decode_start,
            (Some(pd), _) => pd.r_decode_start..self.routable.len(),
        }
    }

    /// Starts up to `n` replicas on pool `k`'s free slots, lowest first, with cold caches,
    /// within the fleet's budget (`max_replicas` paid for at once, draining ones included).
    fn scale_up(&mut self, now: SimTime, k: usize, n: u32) {
        let load = ticks(self.fleet.as_ref().expect("fleet").spec.model_load_s);
        for _ in 0..n {
            let f = self.fleet.as_mut().expect("fleet");
            if f.slots.len() as u32 - f.count(Slot::Off) >= f.spec.max_replicas {
                break;
            }
            let range = f.pools[k].slots.clone();
            let Some(slot) =
                f.slots[range.clone()].iter().position(|&s| s == Slot::Off).map(|i| ReplicaId::new(range.start + i))
            else {
                break;
            };
            f.slots[slot] = Slot::Loading;
            f.generation[slot] += 1;
            f.loading.push(slot);
            f.on_since[slot] = now;
            f.started += 1;
            let generation = f.generation[slot];
            let rep = &mut self.replicas[slot];
            // (A step from before a crash may still be running, void: `failures.rs`.)
            debug_assert!(!rep.has_work(), "an off replica has no work");
            rep.cold_start(self.tier_spec.as_ref());
            self.queue.push(now + load, Event::Loaded { slot, generation });
            self.arm_crash(now, slot);
        }
    }

    /// Cancels pool `k`'s loading replicas (newest first), then drains its ready ones (newest
    /// first), keeping one ready.
    fn scale_down(&mut self, now: SimTime, k: usize, mut n: u32) -> Result<(), RunError> {
        while n > 0 {
            let f = self.fleet.as_mut().expect("fleet");
            let range = f.pools[k].slots.clone();
            let Some(i) = f.loading.iter().rposition(|&s| range.contains(&s.index())) else { break };
            let slot = f.loading.remove(i);
            self.slot_off(now, slot);
            n -= 1;
        }
        while n > 0 && self.pool_routable(k).len() > 1 {
            let slot = self.routable[self.pool_routable(k).end - 1];
            self.fleet.as_mut().expect("fleet").slots[slot] = Slot::Draining;
            self.leave_routable(now, slot)?;
            self.drained_if_idle(now, slot);
            n -= 1;
        }
        Ok(())
    }

    /// A draining replica with nothing left goes off at `now`.
    pub(super) fn drained_if_idle(&mut self, now: SimTime, slot: ReplicaId) {
        let Some(f) = self.fleet.as_ref() else { return };
        let rep: &Replica = &self.replicas[slot];
        if f.slots[slot] == Slot::Draining && !rep.busy() && !rep.has_work() && self.pd_drained(slot) {
            self.slot_off(now, slot);
        }
    }

    /// Slot `slot` finished loading at `now` (unless its load was cancelled): it takes requests.
    pub(super) fn on_loaded(&mut self, now: SimTime, slot: ReplicaId, generation: u32) -> Result<(), RunError> {
        let f = self.fleet.as_mut().expect("load events come with a fleet");
        if f.slots[slot] != Slot::Loading || f.generation[slot] != generation {
            return Ok(());
        }
        f.slots[slot] = Slot::Ready;
        f.loading.retain(|&x| x != slot);
        f.last = f.last.max(now);
        if self.is_down(slot) {
            // Back from a crash (`failures.rs`): its down time ends, its next crash is drawn.
            self.arm_crash(now, slot);
        }
        self.join_routable(now, slot)
    }
}
