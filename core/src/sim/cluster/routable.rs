//! The routable set — the replicas routers see — and the one way a replica joins or leaves it,
//! whatever the reason: a crashed replica restarting and a loaded one becoming ready join; a
//! crash and a drain leave. Each keeps the router indices, the views and the router's
//! `on_replica_change` in step.
//!
//! A replica joins at the top index with a default view (refreshed before the next decision).
//! One that leaves takes its index out and those above move down one (`Vec::remove`; a drain
//! takes the top one). On a disaggregated cluster the routable set is the prefill-only
//! instances, the mixed ones, then the decode-only ones (`Pd::r_decode_start`, `Pd::r_mixed`):
//! the prefill candidates are the first two ranges, the decode candidates the last two. A
//! prefill-only instance joins at the top of its range (the mixed and decode candidates move up
//! one router index, the decode pool's indices unchanged), a mixed one at the top of the mixed
//! range (the top prefill index; the decode-only candidates move up one), a decode-only one at
//! the top; the router hears each change in its pool's indices (`on_pool_change`), a mixed
//! instance's in both pools' at once (`on_mixed_change`). A draining decode instance
//! (autoscaling, which never runs with mixed instances) moves with the decode candidates, so
//! its completions keep the decode index they were placed at.
//!
//! An eviction notice from a replica that is not routable now, or that was cut before the
//! replica last joined, is stale: the router forgot that replica when it left (and the index
//! may name another one by now), so it is not delivered.

use routelab_policy_api::{PdPool, ReplicaChange, ReplicaView};

use super::ClusterSim;
use crate::error::RunError;
use crate::ids::{ReplicaId, RouterIndex};
use crate::time::{SimTime, seconds};

impl ClusterSim<'_> {
    /// Slot `slot` becomes routable at `now`, at the top index, and the router hears it.
    pub(super) fn join_routable(&mut self, now: SimTime, slot: ReplicaId) -> Result<(), RunError> {
        let pos = match self.pd.as_mut() {
            Some(pd) if pd.is_prefill_only(slot) => {
                pd.r_decode_start += 1;
                pd.r_decode_start - 1
            }
            Some(pd) if pd.is_mixed(slot) => {
                pd.r_mixed += 1;
                pd.r_prefill_end() - 1
            }
            _ => self.routable.len(),
        };
        if self.pd.as_ref().is_some_and(|pd| pd.is_prefill_only(slot)) {
            self.shift_draining_decodes(true);
        }
        self.routable.insert(pos, slot);
        self.views.insert(pos, ReplicaView::default());
        for k in pos..self.routable.len() {
            self.index_of[self.routable[k]] = RouterIndex::new(k);
        }
        self.replicas.mark_all();
        self.routable_since[slot] = now;
        self.replicas_changed(now, slot, true)
    }

    /// Slot `slot` (routable) stops taking requests at `now`: the replicas above it move down one
    /// index, and the router hears it. Its `index_of` stays what it was (a draining replica's
    /// completions name it).
    pub(super) fn leave_routable(&mut self, now: SimTime, slot: ReplicaId) -> Result<(), RunError> {
        let pos = self.index_of[slot].index();
        debug_assert_eq!(self.routable.get(pos), Some(&slot), "a leaving replica is routable");
        self.routable.remove(pos);
        self.views.remove(pos);
        match self.pd.as_mut() {
            Some(pd) if pd.is_prefill_only(slot) => {
                pd.r_decode_start -= 1;
                self.shift_draining_decodes(false);
            }
            Some(pd) if pd.is_mixed(slot) => pd.r_mixed -= 1,
            _ => {}
        }
        self.replicas.mark_all();
        for &above in &self.routable[pos..] {
            let k = &mut self.index_of[above];
            *k = RouterIndex::new(k.index() - 1);
        }
        self.replicas_changed(now, slot, false)
    }

    fn replicas_changed(&mut self, now: SimTime, s: ReplicaId, joined: bool) -> Result<(), RunError> {
        if let Some(pd) = &self.pd {
            // In each of the instance's pools' own indices.
            let (at, n, k) = (seconds(now), self.routable.len(), self.index_of[s]);
            let change = |pool, routable: usize| ReplicaChange {
                at,
                replica: pd.pool_index(k, pool),
                joined,
                routable: routable as u32,
            };
            let prefill = || change(PdPool::Prefill, pd.r_prefill_end());
            let decode = || change(PdPool::Decode, n - pd.r_decode_start);
            return if pd.is_mixed(s) {
                let (p, d) = (prefill(), decode());
                self.router.mixed_changed(&p, &d, n)
            } else if pd.is_prefill_only(s) {
                let p = prefill();
                self.router.pool_changed(ReplicaChange::PREFILL, &p, n)
            } else {
                let d = decode();
                self.router.pool_changed(ReplicaChange::DECODE, &d, n)
            };
        }
        let change = ReplicaChange {
            at: seconds(now),
            replica: self.index_of[s].raw(),
            joined,
            routable: self.routable.len() as u32,
        };
        self.router.replicas_changed(&change)
    }

    /// A prefill instance joined (`up`) or left: the draining decode instances (autoscaling) move
    /// with the decode candidates, so that their completions keep naming the decode index they
    /// were placed at (router index − `r_decode_start`).
    fn shift_draining_decodes(&mut self, up: bool) {
        let (Some(pd), Some(f)) = (&self.pd, &self.fleet) else { return };
        for s in ReplicaId::each(pd.decode_start..f.slots.len()) {
            if f.slots[s] == super::fleet::Slot::Draining {
                let k = self.index_of[s].index();
                self.index_of[s] = RouterIndex::new(if up { k + 1 } else { k - 1 });
            }
        }
    }

    /// Whether slot `slot` is routable now.
    pub(super) fn is_routable(&self, slot: ReplicaId) -> bool {
        self.routable.get(self.index_of[slot].index()) == Some(&slot)
    }

    /// Whether an eviction notice of `slot` cut at `evicted_at` is stale (module docs).
    pub(super) fn stale_eviction(&self, slot: ReplicaId, evicted_at: SimTime) -> bool {
        !self.is_routable(slot) || evicted_at < self.routable_since[slot]
    }
}
