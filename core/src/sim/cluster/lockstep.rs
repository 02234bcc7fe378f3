//! Data-parallel engines of a mixture of experts step in lock-step.
//!
//! vLLM runs each data-parallel engine of a MoE as a `DPEngineCoreProc` (vllm/v1/engine/core.py,
//! `run_engine_core` and `DPEngineCoreProc.run_busy_loop`, commit 00080ee1): every engine of the
//! group takes part in every forward pass, because the expert layers' dispatch and combine are
//! collectives over the group; an engine with nothing ready runs `execute_dummy_batch()` while
//! any engine of the group still has unfinished requests (the group's "wave"). Dense models'
//! engines are independent ("Non-MoE DP ranks are completely independent"). So, here, with
//! `cluster.data_parallel` (by default `expert_parallel`) N > 1, each group of N consecutive
//! replicas steps together:
//!
//! - a group step starts when the last one ends and any member has work, or when a request
//!   reaches an idle group; every member forms its batch as it would alone;
//! - the group step lasts as long as the slowest member's: each member's step is priced with
//!   its experts on the group's real tokens ([`Pricer::lockstep_delta_s`]: the expert layers of
//!   an engine see every engine's tokens), and a member with nothing to run prices a one-token
//!   dummy step (vLLM's dummy batch runs one decode token);
//! - a request reaching a member while its group steps waits for the group's next step.
//!
//! A member that ran a dummy step counts no busy time. A member's crash (`cluster.failures`)
//! takes its group down and back whole (`failures.rs`).

use super::ClusterSim;
use crate::error::RunError;
use crate::ids::ReplicaId;
use crate::step_model::{Pricer, Step};
use crate::time::{SimTime, ticks};

impl ClusterSim<'_> {
    /// Whether replica `r` can start a step now (alone, or with its group).
    pub(super) fn idle(&self, r: ReplicaId) -> bool {
        match self.lockstep {
            1 => !self.replicas[r].busy(),
            _ => !self.group_busy[self.group_index(r)],
        }
    }

    /// The group slot `r` steps with (groups are numbered from 0, `lockstep` consecutive slots
    /// each; without lock-step every slot is its own group).
    pub(super) fn group_index(&self, r: ReplicaId) -> usize {
        r.index() / self.lockstep
    }

    /// Group `g`'s first member: its queue slot holds the group's step end, and it stands for the
    /// group (its void step, its down time).
    pub(super) fn group_first(&self, g: usize) -> ReplicaId {
        ReplicaId::new(g * self.lockstep)
    }

    /// Group `g`'s members, in slot order.
    pub(super) fn group_members(&self, g: usize) -> impl Iterator<Item = ReplicaId> + Clone + use<> {
        ReplicaId::each(g * self.lockstep..(g + 1) * self.lockstep)
    }

    /// Starts group `g`'s next step at `now` if any member has work; queues its end.
    pub(super) fn start_group_step(&mut self, g: usize, now: SimTime) -> Result<(), RunError> {
        let members = self.group_members(g);
        let mut steps = Vec::with_capacity(self.lockstep);
        for m in members.clone() {
            let d = self.form_step(m, now)?;
            // A dummy step runs one token through the experts with the others'.
            let tokens = d.map_or(1, |_| self.replicas[m].step_tokens());
            steps.push((d, tokens));
        }
        if steps.iter().all(|(d, _)| d.is_none()) {
            self.group_busy[g] = false;
            return Ok(());
        }
        // Aggregated clusters only (checked): every replica prices with the one pricer.
        let pricer: &Pricer = &self.pricers[super::ReplicaPool::Decode];
        let group: u64 = steps.iter().map(|&(_, t)| t).sum();
        let dummy = pricer.step_time_s(&Step::decode(1, 0));
        let slowest =
            steps.iter().map(|&(d, t)| d.unwrap_or(dummy) + pricer.lockstep_delta_s(t, group)).fold(0.0, f64::max);
        let t = ticks(slowest).max(SimTime::TICK);
        for (m, (d, _)) in members.zip(&steps) {
            let rep = &mut self.replicas[m];
            match d {
                Some(_) => rep.step_began(now, t),
                // A dummy step holds the engine too: what reaches it waits for the group's step.
                None => rep.dummy_step_began(now, t),
            }
        }
        self.group_busy[g] = true;
        self.queue_step_end(now + t, self.group_first(g));
        Ok(())
    }

    /// Group `g`'s step ends at `now`: every member that ran requests finishes its step, and the
    /// group's next step starts.
    pub(super) fn on_group_step_end(&mut self, now: SimTime, g: usize) -> Result<(), RunError> {
        if self.void_group_step_ended(now, g)? {
            return Ok(());
        }
        for m in self.group_members(g) {
            if self.replicas[m].busy() {
                self.finish_replica_step(now, m)?;
            }
        }
        self.group_busy[g] = false;
        self.start_group_step(g, now)?;
        self.release_held(now)
    }
}
