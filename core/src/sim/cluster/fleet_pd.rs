//! Autoscaling on a disaggregated cluster (`autoscaling.pools`; no mixed instances): when a
//! draining prefill or decode instance is done. The scaler, the slots and their lives are
//! `fleet.rs`'s; each pool is one of its pools (prefill slots first, then decode), a scale-up
//! joins and a drain leaves its pool's candidates through `routable.rs`, as crashes do.
//!
//! A draining instance has left its pool's candidates: the router places no new request on it.
//! What was placed on it before it left, it finishes:
//!
//! - a **prefill** instance finishes its queued and running prefills, the prompts on their way
//!   into it (a prefix migration or a shared-tier load) included, and waits until the KV of every
//!   request it handed off has reached its decode instance (the transfer reads the prefill
//!   instance's memory: NIXL's and Mooncake's transfers pull from the sender's GPU), then goes
//!   off;
//! - a **decode** instance finishes its decodes, and the requests the router had paired with it
//!   before it left: those still prefilling on a prefill instance (or on their way to one) hand
//!   off to it, wait for its memory, transfer and decode there as if it had not left. It goes off
//!   once none is left: nothing queued or running, no hand-off waiting for its memory, no
//!   transfer in flight, no request bound for it before its hand-off.
//!
//! A draining instance that crashes goes off at once (`failures.rs`); its requests are lost and
//! retried as any crash's.

use super::ClusterSim;
use super::fleet::Slot;
use super::replica::Phase;
use crate::ids::{ReplicaId, RequestId};
use crate::time::SimTime;

impl ClusterSim<'_> {
    /// Whether slot `slot` (idle) holds nothing more on a disaggregated cluster (module docs);
    /// `true` on an aggregated one.
    pub(super) fn pd_drained(&self, slot: ReplicaId) -> bool {
        let Some(pd) = &self.pd else { return true };
        // Prompts on their way into it (a migration or a tier load) join its queue when they land.
        if pd.in_flight.iter().any(|&id| pd.migrating[id].0 == slot) {
            return false;
        }
        let Some(k) = pd.decode_row(slot) else { return pd.handing[slot] == 0 };
        if !pd.waiting[k].is_empty() || pd.active[k] > 0 {
            return false;
        }
        // Requests bound for it still before their hand-off, on a prefill instance or on their way.
        !self.bound_before_handoff(slot).any(|_| true)
    }

    /// The requests bound for decode instance `slot` that are still before their hand-off: queued
    /// or running on a prefill candidate (a mixed instance included), or on their way to one.
    pub(super) fn bound_before_handoff(&self, slot: ReplicaId) -> impl Iterator<Item = RequestId> + '_ {
        let pd = self.pd.as_ref().expect("disaggregated");
        let prefilling = self.replicas[..pd.prefill_end].iter().flat_map(|r| r.waiting().iter().chain(r.running()));
        prefilling.chain(&pd.in_flight).copied().filter(move |&id| {
            let st = self.state(id);
            st.handoff && st.phase != Phase::Transfer && pd.decode_of[id] == Some(slot)
        })
    }

    /// Every draining instance that holds nothing more goes off at `now` (after a transfer's end
    /// or a crash, which free a draining instance without a step of its own ending).
    pub(super) fn settle_drains(&mut self, now: SimTime) {
        let Some(f) = &self.fleet else { return };
        let draining: Vec<ReplicaId> =
            ReplicaId::each(0..f.slots.len()).filter(|&s| f.slots[s] == Slot::Draining).collect();
        for s in draining {
            self.drained_if_idle(now, s);
        }
    }
}
