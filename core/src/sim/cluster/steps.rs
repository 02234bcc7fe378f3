//! A replica's step, from start to end: forming it (batch, tiers, slowdowns) and queuing its
//! end and the evictions it caused; at its end, finishing its requests, reporting completions
//! to the router (and admission, and the scaler), and starting the next step.

use routelab_policy_api::{Completion, PdPool};

use super::replica::Phase;
use super::{ClusterSim, Event, Evicted, models, replica_pool};
use crate::error::RunError;
use crate::ids::{ReplicaId, RequestId};
use crate::time::{SimTime, seconds, ticks};

impl ClusterSim<'_> {
    /// Replica `r`'s step ends at `now`: finished requests complete, and its next step starts.
    pub(super) fn on_step_end(&mut self, now: SimTime, r: ReplicaId) -> Result<(), RunError> {
        self.decode_run_ended(r, now);
        if self.lockstep > 1 {
            return self.on_group_step_end(now, self.group_index(r));
        }
        if self.void_step_ended(now, r)? {
            return Ok(());
        }
        if !self.next_decode_step(now, r) {
            self.finish_replica_step(now, r)?;
            self.start_step(r, now)?;
            self.drained_if_idle(now, r);
        }
        self.release_held(now)
    }

    /// Replica `r`'s step that ended at `now` was a plain decode step, and so is its next
    /// ([`super::replica::Replica::next_decode_step`]): the next one starts; `false` (nothing
    /// done) when the general path must run. It completed nothing, and the replica stays busy,
    /// so nothing else of the general path applies.
    fn next_decode_step(&mut self, now: SimTime, r: ReplicaId) -> bool {
        let pool = replica_pool(self.pd.as_ref(), &self.gpu_pool, r);
        let Some(step) = self.replicas[r].next_decode_step(now, &self.cfgs[pool], &self.pricers[pool]) else {
            return false;
        };
        self.audit_cache(r);
        let step = self.slowed(r, now, step);
        self.queue_evictions(r, now);
        self.begin_decode_step(r, now, step);
        true
    }

    /// Replica `r`'s step ended at `now`: its finished requests complete (or hand off).
    pub(super) fn finish_replica_step(&mut self, now: SimTime, r: ReplicaId) -> Result<(), RunError> {
        self.completed.clear();
        let cfg = &self.cfgs[replica_pool(self.pd.as_ref(), &self.gpu_pool, r)];
        self.replicas[r].tier_loads_ended(self.remote_tier.as_mut());
        self.replicas[r].finish_step(now, &self.stream, cfg, &mut self.completed);
        for k in 0..self.completed.len() {
            let id = self.completed[k];
            self.take_back(id);
            if self.state(id).phase == Phase::Transfer {
                self.on_handoff(now, r, id)?;
            } else {
                self.report_completion(now, r, id)?;
            }
        }
        if !self.completed.is_empty() {
            // Memory freed: handed-off requests waiting for it may start their transfers.
            self.start_transfers(now, r);
        }
        self.audit_cache(r);
        Ok(())
    }

    /// The O(nodes) check of replica `r`'s cache every max(256, nodes) steps (a power of two):
    /// O(1) per step. Debug builds only.
    pub(super) fn audit_cache(&self, r: ReplicaId) {
        #[cfg(debug_assertions)]
        if self.replicas[r].steps() % (self.replicas[r].cache().nodes() as u64).max(256).next_power_of_two() == 0 {
            self.replicas[r].cache().check();
        }
        let _ = r;
    }

    /// Request `id` finished on replica `r` at `now`: the router hears of it (on a disaggregated
    /// cluster, `replica` indexes the decode candidates).
    pub(super) fn report_completion(&mut self, now: SimTime, r: ReplicaId, id: RequestId) -> Result<(), RunError> {
        // Taken back from its replica when it finished.
        let (q, st) = (self.stream.request(id.index()), super::kept::here(&self.states, id));
        self.done += 1;
        let model = self.model_of_slot(r);
        let n = self.routable.len();
        let (router, range) = models::router_of(&mut self.router, self.models.as_deref_mut(), model, n);
        let replica = match &self.pd {
            Some(pd) => pd.pool_index(self.index_of[r], PdPool::Decode),
            None => range.local(self.index_of[r]),
        };
        let c = Completion {
            request_id: id.raw() as u64,
            replica,
            arrived_at: seconds(st.arrived_at),
            completed_at: seconds(now),
            ttft: seconds(st.first_token_at.unwrap_or(now) - st.arrived_at),
            prompt_tokens: q.prompt_tokens,
            cached_tokens: st.cached_tokens,
            output_tokens: q.output_tokens,
        };
        if let Some(a) = &mut self.admission {
            a.complete(&c)?;
        }
        if let Some(f) = &mut self.fleet {
            let latency = c.completed_at - c.arrived_at;
            let tpot = if c.output_tokens > 1 { (latency - c.ttft) / (c.output_tokens - 1) as f64 } else { f64::NAN };
            let met = self.slo.as_ref().is_some_and(|s| s.met(c.ttft, tpot, latency));
            f.completed(id, now, c.ttft, tpot, met);
        }
        router.complete(&c)?;
        self.release_dependents(now, id);
        Ok(())
    }

    /// Starts replica `r`'s next step at `now` if it has work (in lock-step: its group's step);
    /// queues its end and its evictions.
    pub(super) fn start_step(&mut self, r: ReplicaId, now: SimTime) -> Result<(), RunError> {
        if self.lockstep > 1 {
            return self.start_group_step(self.group_index(r), now);
        }
        if let Some(d) = self.form_step(r, now)? {
            self.begin_step(r, now, d);
        }
        Ok(())
    }

    /// Replica `r`'s step of `d` seconds starts at `now`: its end is queued.
    fn begin_step(&mut self, r: ReplicaId, now: SimTime, d: f64) {
        let t = ticks(d).max(SimTime::TICK);
        self.replicas[r].step_began(now, t);
        self.queue_step_end(now + t, r);
    }

    /// Queues replica `r`'s step end at `at`: in `r`'s slot of the queue when it has one and it
    /// is free (the queue keys its slots by the replica's raw id; `build.rs` maps a key back to
    /// [`Event::StepEnd`]), else in the heap.
    pub(super) fn queue_step_end(&mut self, at: SimTime, r: ReplicaId) {
        self.queue.push_slot(at, r.raw());
    }

    /// Forms replica `r`'s step at `now` and returns its duration (`None`: nothing to run);
    /// marks the replica busy or idle and queues the evictions the step caused.
    pub(super) fn form_step(&mut self, r: ReplicaId, now: SimTime) -> Result<Option<f64>, RunError> {
        let pool = replica_pool(self.pd.as_ref(), &self.gpu_pool, r);
        let rep = &mut self.replicas[r];
        let (cfg, pricer) = (&self.cfgs[pool], &self.pricers[pool]);
        let remote = self.remote_tier.as_mut();
        let step = rep.start_step_tiered(now, &self.stream, cfg, pricer, &mut self.schedulers[r], remote)?;
        let step = step.map(|d| self.slowed(r, now, d));
        self.queue_evictions(r, now);
        Ok(step)
    }

    /// A step of `d` seconds that replica `r` starts at `now`, as long as a slow replica's
    /// takes (`failures.slowdowns`; × 1 leaves it exact).
    fn slowed(&self, r: ReplicaId, now: SimTime, d: f64) -> f64 {
        match &self.failures {
            Some(f) => d * f.slow_factor(r, now),
            None => d,
        }
    }

    /// Queues the notices of the cuts replica `r`'s cache made for the step starting at `now`
    /// (each lost with `failures.kv_event_loss`).
    fn queue_evictions(&mut self, r: ReplicaId, now: SimTime) {
        // Most steps cut nothing, or nothing the router hears of: no drain to build and drop.
        if !self.replicas[r].has_evictions() {
            return;
        }
        let replica = self.replicas[r].id();
        debug_assert_eq!(replica, r, "a replica's id is its slot");
        for ev in self.replicas[r].drain_evictions() {
            if self.failures.as_mut().is_some_and(|f| f.loses_kv_event()) {
                continue;
            }
            let event = Event::Evicted(Box::new(Evicted {
                replica,
                evicted_at: now,
                path: ev.path,
                remaining_tokens: ev.remaining_tokens,
            }));
            self.queue.push(now + self.eviction_delay, event);
        }
    }
}
