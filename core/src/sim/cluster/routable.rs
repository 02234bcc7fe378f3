//! The routable set — the replicas routers see — and the one way a replica joins or leaves it,
//! whatever the reason: a crashed replica restarting and a loaded one becoming ready join; a
//! crash and a drain leave. Each keeps the router indices, the views and the router's
//! `on_replica_change` in step.
//!
//! A replica joins at the top index with a default view (refreshed before the next decision).
//! One that leaves takes its index out and those above move down one (`Vec::remove`; a drain
//! takes the top one). An eviction notice from a replica that is not routable now, or that was
//! cut before the replica last joined, is stale: the router forgot that replica when it left
//! (and the index may name another one by now), so it is not delivered.

use routelab_policy_api::{ReplicaChange, ReplicaView};

use super::ClusterSim;
use crate::error::RunError;
use crate::time::{SimTime, seconds};

impl ClusterSim<'_> {
    /// Slot `slot` becomes routable at `now`, at the top index, and the router hears it.
    pub(super) fn join_routable(&mut self, now: SimTime, slot: u32) -> Result<(), RunError> {
        let s = slot as usize;
        self.index_of[s] = self.routable.len() as u32;
        self.routable.push(slot);
        self.views.push(ReplicaView::default());
        self.replicas.mark_all();
        self.routable_since[s] = now;
        self.replicas_changed(now, s, true)
    }

    /// Slot `slot` (routable) stops taking requests at `now`: the replicas above it move down one
    /// index, and the router hears it. Its `index_of` stays what it was (a draining replica's
    /// completions name it).
    pub(super) fn leave_routable(&mut self, now: SimTime, slot: u32) -> Result<(), RunError> {
        let pos = self.index_of[slot as usize] as usize;
        debug_assert_eq!(self.routable.get(pos), Some(&slot), "a leaving replica is routable");
        self.routable.remove(pos);
        self.views.remove(pos);
        self.replicas.mark_all();
        for &above in &self.routable[pos..] {
            self.index_of[above as usize] -= 1;
        }
        self.replicas_changed(now, slot as usize, false)
    }

    fn replicas_changed(&mut self, now: SimTime, s: usize, joined: bool) -> Result<(), RunError> {
        let change =
            ReplicaChange { at: seconds(now), replica: self.index_of[s], joined, routable: self.routable.len() as u32 };
        self.router.replicas_changed(&change)
    }

    /// Whether slot `slot` is routable now.
    pub(super) fn is_routable(&self, slot: usize) -> bool {
        self.routable.get(self.index_of[slot] as usize) == Some(&(slot as u32))
    }

    /// Whether an eviction notice of `slot` cut at `evicted_at` is stale (module docs).
    pub(super) fn stale_eviction(&self, slot: usize, evicted_at: SimTime) -> bool {
        !self.is_routable(slot) || evicted_at < self.routable_since[slot]
    }
}
