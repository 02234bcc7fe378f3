//! Decode runs: a replica's plain decode steps advanced without one queued event each.
//!
//! Most engine steps of a long decode are plain ([`Replica::next_decode_step`]): the batch is
//! fixed and only its context grows, so while nothing from outside touches the replica, the
//! ends of its next steps are known when one forms ([`Replica::plan_decode_run`]: until a
//! request finishes, the KV runs out, or a step would cut a cache the router hears of). Only
//! the last of them is queued; the ones before it are applied when something may read the
//! replica — every arrival ([`ClusterSim::catch_up_all`], before the views are refreshed), the
//! replica's own queued step end, and the end of the run (up to the horizon). An arrival placed
//! on a replica mid-run ends its run: the step in flight ends as a queued event.
//!
//! Exact: each step is applied with the same arithmetic, at the same time, in the same order
//! per replica as when each end was queued; what reads a replica sees it as the queue would
//! have left it. The one order the queue decides that a run does not keep is a tie to the
//! nanosecond between a planned step end and a session's release queued before that step
//! formed (the step then runs first); every shipped workload's output is byte-identical.
//!
//! On only where nothing else reads or changes replicas between arrivals: one replica per step
//! (no lock-step), no P/D, failures, autoscaling, scrapes or remote KV tier, and every step end
//! in a queue slot (up to 16 replicas, `build.rs`); and, behind an admission policy, only while
//! it holds no request (a held request may be released at any step end). Elsewhere every step
//! is queued as before.
//!
//! [`Replica::next_decode_step`]: super::replica::Replica::next_decode_step
//! [`Replica::plan_decode_run`]: super::replica::Replica::plan_decode_run

use super::{ClusterSim, replica_pool};
use crate::ids::ReplicaId;
use crate::time::{SimTime, ticks};

/// Plain decode steps planned ahead at most: a run an arrival ends wastes at most this many
/// steps' pricing, and a long one queues an event every this many steps.
const MAX_RUN: u64 = 64;

/// Per slot: the planned step ends of its run and the next to apply.
pub(super) struct DecodeRuns {
    /// T₁, …, T_{m+1} ([`super::replica::Replica::plan_decode_run`]): the ends before the last
    /// are not queued; the last one is. Empty: no run.
    ends: Vec<Vec<SimTime>>,
    next: Vec<usize>,
    /// Slots whose run has ends not yet applied (each once: `listed`).
    active: Vec<ReplicaId>,
    listed: Vec<bool>,
    /// Planned step ends applied (the tests' measure of how much the runs carry).
    applied: u64,
}

impl DecodeRuns {
    fn new(slots: usize) -> Self {
        Self {
            ends: vec![Vec::new(); slots],
            next: vec![0; slots],
            active: Vec::new(),
            listed: vec![false; slots],
            applied: 0,
        }
    }

    /// Whether slot `r` has planned ends not yet applied.
    fn pending(&self, r: ReplicaId) -> bool {
        self.next[r] + 1 < self.ends[r].len()
    }
}

impl ClusterSim<'_> {
    /// Every step queued, none advanced in a run (what the runs are compared with).
    #[cfg(test)]
    pub(super) fn without_decode_runs(mut self) -> Self {
        self.decode_runs = false;
        self
    }

    /// Planned step ends applied so far (`None`: runs are off).
    #[cfg(test)]
    pub(super) fn decode_run_steps(&self) -> Option<u64> {
        self.runs.as_ref().map(|r| r.applied)
    }

    /// Turns decode runs on where they are exact (the module's doc), at the start of the run.
    pub(super) fn start_decode_runs(&mut self) {
        let quiet = self.pd.is_none()
            && self.failures.is_none()
            && self.fleet.is_none()
            && self.scrape_interval.is_none()
            && self.remote_tier.is_none()
            && self.lockstep == 1;
        let slotted = self.replicas.ids().all(|r| self.queue.has_slot(r.raw()));
        if quiet && slotted && self.decode_runs {
            self.runs = Some(DecodeRuns::new(self.replicas.len()));
        }
    }

    /// Replica `r`'s plain decode step of `d` seconds starts at `now` (as `begin_step`), and
    /// the steps after it are planned: only the run's last end is queued.
    pub(super) fn begin_decode_step(&mut self, r: ReplicaId, now: SimTime, d: f64) {
        let t = ticks(d).max(SimTime::TICK);
        self.replicas[r].step_began(now, t);
        // A held request may be released at any step end (`release_held` reads the views).
        let holding = self.admission.as_ref().is_some_and(|a| a.held() > 0);
        let Some(runs) = self.runs.as_mut().filter(|_| !holding) else {
            self.queue_step_end(now + t, r);
            return;
        };
        let pool = replica_pool(None, &self.gpu_pool, r);
        let ends = &mut runs.ends[r];
        self.replicas[r].plan_decode_run(now + t, &self.cfgs[pool], &self.pricers[pool], MAX_RUN, ends);
        runs.next[r] = 0;
        let last = *ends.last().expect("T₁ at least");
        if runs.pending(r) && !runs.listed[r] {
            runs.listed[r] = true;
            runs.active.push(r);
        }
        self.queue_step_end(last, r);
    }

    /// Applies replica `r`'s planned step ends up to `t` (inclusive).
    fn catch_up(&mut self, r: ReplicaId, t: SimTime) {
        let Some(runs) = &mut self.runs else { return };
        let ends = &runs.ends[r];
        let mut i = runs.next[r];
        if i + 1 >= ends.len() || ends[i] > t {
            return;
        }
        let first = i;
        while i + 1 < ends.len() && ends[i] <= t {
            i += 1;
        }
        let cfg = &self.cfgs[replica_pool(None, &self.gpu_pool, r)];
        self.replicas[r].advance_plain_decodes(&ends[first..=i], cfg);
        runs.applied += (i - first) as u64;
        runs.next[r] = i;
        self.audit_cache(r);
    }

    /// Applies every run's planned step ends up to `t` (inclusive): before an arrival reads
    /// the replicas, and at the end of the run.
    pub(super) fn catch_up_all(&mut self, t: SimTime) {
        let Some(runs) = &mut self.runs else { return };
        let mut active = std::mem::take(&mut runs.active);
        for &r in &active {
            self.catch_up(r, t);
        }
        let runs = self.runs.as_mut().expect("on");
        active.retain(|&r| {
            let keep = runs.pending(r);
            runs.listed[r] = keep;
            keep
        });
        runs.active = active;
    }

    /// Replica `r`'s queued step end at `now`: the planned ends before it are applied and its
    /// run is over.
    pub(super) fn decode_run_ended(&mut self, r: ReplicaId, now: SimTime) {
        if self.runs.is_none() {
            return;
        }
        self.catch_up(r, now);
        let runs = self.runs.as_mut().expect("on");
        debug_assert!(!runs.pending(r), "a queued step end before its run's planned ones");
        runs.ends[r].clear();
        runs.next[r] = 0;
    }

    /// The admission policy holds a request (caught up to now): from here every step end may
    /// release it, so every step in flight ends as a queued event, and no run is planned while
    /// a request is held.
    pub(super) fn end_decode_runs(&mut self) {
        let Some(runs) = &mut self.runs else { return };
        for r in std::mem::take(&mut runs.active) {
            self.runs.as_mut().expect("on").listed[r] = false;
            self.end_decode_run(r);
        }
    }

    /// Something from outside changes replica `r` at `now` (a request placed on it), which has
    /// been caught up to `now`: the step in flight ends as a queued event, and its run is over.
    pub(super) fn end_decode_run(&mut self, r: ReplicaId) {
        let Some(runs) = &mut self.runs else { return };
        if runs.pending(r) {
            let in_flight = runs.ends[r][runs.next[r]];
            self.queue.reschedule_slot(r.raw(), in_flight);
        }
        runs.ends[r].clear();
        runs.next[r] = 0;
    }
}
