//! Priority preemption (`cluster.preemption: priority`): which running request a replica gives
//! up for recomputation, and when, once requests carry class priorities.
//!
//! Algorithm, before each step of a replica:
//! 1. **For a waiting request of higher priority.** Take the most important request the
//!    scheduler is shown (highest class priority, earliest arrival). While it does not fit (the
//!    KV memory admission checks: its uncached prompt plus its reservation on top of what is
//!    committed, plus this step's growth under `estimate`) and some running request has a
//!    strictly lower priority, preempt the one of lowest priority, latest arrival first. The
//!    waiting request is then admitted by the batcher if the scheduler puts it first (the
//!    `priority` scheduler does); nothing is preempted for a request of equal priority.
//! 2. **When memory runs out mid-decode** (`estimate` reservation), the victim is the running
//!    request of lowest priority, latest arrival first, rather than the newest admitted.
//!
//! Victims are never requests whose KV is still arriving (P/D transfers). A preempted request
//! rejoins the waiting queue at its arrival position and recomputes its prompt and the tokens it
//! had generated (vLLM's recompute preemption, `mod.rs`).
//!
//! Parameters: none beyond `cluster.preemption` (`newest`, the default, keeps vLLM's FCFS
//! behaviour: victims by admission order, and only when memory runs out). Only KV memory triggers
//! step 1: a full batch (`max_batch_requests`) or an exhausted token budget does not.
//!
//! Sources: vLLM v1 `vllm/v1/core/sched/scheduler.py` @ 00024d314514900f361ad072af6931e403b7f589,
//! `schedule()`: when a running request cannot get KV blocks, `policy == PRIORITY` preempts
//! `max(self.running, key=lambda r: (r.priority, r.arrival_time))` (vLLM's priority: lower is
//! more important, so this is the least important, latest arrival; routelab's priority is the
//! inference extension's, higher is more important) — step 2. The v1 waiting loop stops at a
//! request that does not fit (`if new_blocks is None: break`) and never preempts for it; step 1
//! is vLLM v0's `_schedule_priority_preemption` (`vllm/core/scheduler.py` of the v0 engine,
//! which v1 replaced; read from an indexed copy whose commit was not recorded — the copies at
//! @0dce2b29 and @0054e1fa predate it): with the waiting queue sorted by (priority, arrival),
//! while the least important running request ranks below the waiting head and the head cannot be
//! allocated (`can_allocate != OK` or the budget is spent), preempt that running request by
//! recomputation and put it back at the front of the waiting queue.

use super::{Held, Phase, Replica, ReplicaConfig, reserve_tokens};
use crate::handle::SchedulerHandle;
use crate::ids::RequestId;
use crate::workload::cluster::{Preemption, Reservation};
use crate::workload::generate::RequestStream;

impl Replica {
    /// The running request to preempt when memory runs out: the newest admitted (`newest`), or
    /// the lowest priority, latest arrival (`priority`). `None` when nothing can be preempted.
    pub(super) fn memory_victim(
        &self,
        states: &Held,
        cfg: &ReplicaConfig,
        scheduler: &SchedulerHandle,
    ) -> Option<RequestId> {
        match cfg.preemption {
            Preemption::Newest => self.newest_running(states),
            Preemption::Priority => self.least_important_running(states, scheduler, i32::MAX),
        }
    }

    /// The running request of lowest priority below `below`, latest arrival (= highest id)
    /// first; requests whose KV is in transfer are skipped.
    fn least_important_running(&self, states: &Held, scheduler: &SchedulerHandle, below: i32) -> Option<RequestId> {
        self.running
            .iter()
            .copied()
            .filter(|&r| states[r].phase != Phase::Transfer && scheduler.priority(r) < below)
            .min_by_key(|&r| (scheduler.priority(r), std::cmp::Reverse(r)))
    }

    /// Step 1 of the module doc: preempts lower-priority running requests until the most
    /// important shown waiting request fits, or none of lower priority runs.
    pub(super) fn preempt_for_waiting(
        &mut self,
        stream: &RequestStream,
        states: &mut Held,
        cfg: &ReplicaConfig,
        scheduler: &SchedulerHandle,
    ) {
        if cfg.preemption != Preemption::Priority || self.waiting.is_empty() || self.running.is_empty() {
            return;
        }
        let Some(top) = self
            .waiting
            .iter()
            .take(cfg.scheduler_window as usize)
            .copied()
            .max_by_key(|&r| (scheduler.priority(r), std::cmp::Reverse(r)))
        else {
            return;
        };
        let priority = scheduler.priority(top);
        while !self.fits(top, stream, states, cfg) {
            let Some(victim) = self.least_important_running(states, scheduler, priority) else {
                break;
            };
            self.preempt(victim, stream, states, cfg);
        }
    }

    /// Whether waiting request `r` passes admission's memory check at the start of a step.
    fn fits(&self, r: RequestId, stream: &RequestStream, states: &Held, cfg: &ReplicaConfig) -> bool {
        let plan = self.cache.plan(stream.prompt(r.index()));
        let st = &states[r];
        // The step's own growth (one token per decoder and finishing prefill) comes first under
        // `estimate`; `full` reserved it at admission.
        let growth = match cfg.reservation {
            Reservation::Full => 0,
            Reservation::Estimate { .. } => self.decoding as u64 + self.prefilling.len() as u64,
        };
        self.committed_tokens(cfg)
            + growth
            + plan.newly_pinned_tokens
            + plan.new_tokens
            + reserve_tokens(cfg, st, stream.request(r.index()))
            <= cfg.kv_capacity_tokens
    }
}
