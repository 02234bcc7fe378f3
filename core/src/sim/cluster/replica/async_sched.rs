//! vLLM's async scheduling: the engine forms each step's batch one step ahead.
//!
//! vLLM's engine core (`vllm/v1/engine/core.py` at commit 00080ee1, `step_with_batch_queue`,
//! two batches in flight; the `AsyncScheduler` of `vllm/v1/core/sched/async_scheduler.py` at
//! 014b2350 gives a running request an output placeholder so that its next token is scheduled
//! before the last one is known) runs its busy loop as: take in the requests that arrived
//! (`add_request` stamps `queued_ts`), schedule the next step and launch it behind the one on
//! the GPU, then block on that one's output. So, in steady state:
//!
//! - a request is **taken in** when the step in flight ends (on arrival if the engine is idle):
//!   [`Replica::pickup_at`], kept as the request's `queued_at` (vLLM's `queued_ts`, which the
//!   measured runs time TTFT from);
//! - the batch of the step that starts at time `t` was formed when the step before it started:
//!   only requests taken in by then can join it ([`Replica::look_ahead`]), so a request taken in
//!   at `t` joins the step after the next;
//! - a request that finishes at `t` still held its slot when that batch was formed: the slots
//!   it frees are refilled one step later (vLLM skips its decode, knowing its `max_tokens`, so
//!   the token budget is unaffected).
//!
//! When nothing continues into the step and nothing taken in could join it, the step formed
//! ahead was empty and the engine schedules at `t` what it takes in (no look-ahead). KV blocks
//! a finished request frees are not held back a step (KV never binds in the measured runs).
//! Off unless the replica's calibration declares `async_scheduling` (`ReplicaConfig`).

use super::{Held, Replica, ReplicaConfig};
use crate::time::SimTime;

impl Replica {
    /// When the engine takes in a request routed here at `now`: at the end of the step in
    /// flight, else at once (also at the very start of a step: vLLM's loop takes in what has
    /// arrived right after launching a step, before the next is formed).
    pub(super) fn pickup_at(&self, now: SimTime) -> SimTime {
        if now > self.step_started_at && now < self.step_ends_at { self.step_ends_at } else { now }
    }

    /// For the step formed at `now`: the latest `queued_at` that may join it, and how many of
    /// its slots requests that finished at `now` still hold. Without async scheduling, every
    /// waiting request may join and no slot is held.
    pub(super) fn look_ahead(&self, now: SimTime, states: &Held, cfg: &ReplicaConfig) -> (SimTime, u32) {
        if !cfg.async_scheduling {
            return (SimTime::MAX, 0);
        }
        let formed_earlier = self.step_ends_at == now && self.step_started_at < now;
        let held = if self.last_finish.0 == now { self.last_finish.1 } else { 0 };
        // Whether the step formed ahead had anything in it (KV aside): a request continuing, or
        // one taken in by then with a free slot.
        let continues = self.decoding > 0
            || !self.prefilling.is_empty()
            || (held < cfg.max_batch_requests
                && self.waiting.front().is_some_and(|&r| states[r].queued_at <= self.step_started_at));
        if !(formed_earlier && continues) {
            return (now, 0);
        }
        (self.step_started_at, held)
    }
}
