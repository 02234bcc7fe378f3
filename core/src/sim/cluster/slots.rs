//! The replicas of a run, as slots that remember which of them changed since the router's views
//! were last refreshed, so that an arrival refreshes only those views: O(replicas changed since
//! the last arrival), not O(replicas) (issue 30: a 1,000-replica day spent most of its time
//! rebuilding views that had not moved).
//!
//! A view is a function of its replica's state alone ([`Replica::view`]), so the one way to
//! change that state — `&mut` through [`IndexMut`], by [`ReplicaId`] — marks the slot; reading ([`Deref`] to a slice, [`Index`] by a [`ReplicaId`] or a range of positions) does not. There is no `DerefMut`: a mutable
//! path that does not mark does not compile. Marking is conservative (a `&mut` that changes
//! nothing a view shows still marks). Whatever rewrites or reshapes the views themselves (a
//! crash, a scale decision) calls [`Slots::mark_all`], and the next refresh rebuilds them all.

use std::ops::{Deref, Index, IndexMut, Range, RangeFrom, RangeTo};

use super::replica::Replica;
use super::replica_pool;
use crate::ids::{ReplicaId, RequestId, RouterIndex};

/// The replicas, by slot, and the slots changed since [`Slots::take_changed`].
pub(super) struct Slots {
    items: Vec<Replica>,
    /// Slots marked since the last take, each once (`marked` says which).
    changed: Vec<ReplicaId>,
    marked: Vec<bool>,
    /// Every view must be rebuilt (at the start, and after [`Slots::mark_all`]).
    all: bool,
}

/// What the views need after [`Slots::take_changed`].
pub(super) enum Changed {
    /// Every view.
    All,
    /// The views of these slots (routable or not).
    Slots(Vec<ReplicaId>),
}

impl Slots {
    pub(super) fn new(items: Vec<Replica>) -> Self {
        let marked = vec![false; items.len()];
        Self { items, changed: Vec::new(), marked, all: true }
    }

    fn mark(&mut self, slot: ReplicaId) {
        if !self.all && !self.marked[slot] {
            self.marked[slot] = true;
            self.changed.push(slot);
        }
    }

    /// Every slot, in order.
    pub(super) fn ids(&self) -> impl Iterator<Item = ReplicaId> + use<> {
        ReplicaId::each(0..self.items.len())
    }

    /// Every view is to be rebuilt at the next refresh.
    pub(super) fn mark_all(&mut self) {
        self.all = true;
    }

    /// The slots changed since the last call (and clears the marks); hand the list back with
    /// [`Slots::give_back`] so that its room is reused.
    pub(super) fn take_changed(&mut self) -> Changed {
        for &s in &self.changed {
            self.marked[s] = false;
        }
        if std::mem::take(&mut self.all) {
            self.changed.clear();
            return Changed::All;
        }
        Changed::Slots(std::mem::take(&mut self.changed))
    }

    /// Returns the list [`Slots::take_changed`] handed out (emptied).
    pub(super) fn give_back(&mut self, mut list: Vec<ReplicaId>) {
        if self.changed.is_empty() {
            list.clear();
            self.changed = list;
        }
    }
}

impl super::ClusterSim<'_> {
    /// Refreshes the router's view of every routable replica (and its `prefilling` signal) for
    /// request `id`: the views of the replicas changed since the last refresh (all of them after
    /// [`Slots::mark_all`]), and `matched_tokens` of every replica when the router asks for
    /// exact matches (that depends on the request). The same views as rebuilding them all
    /// (checked in debug builds).
    pub(super) fn refresh_views(&mut self, id: RequestId) {
        match self.replicas.take_changed() {
            Changed::All => {
                for k in 0..self.routable.len() {
                    self.refresh_view(RouterIndex::new(k));
                }
            }
            Changed::Slots(list) => {
                for &slot in &list {
                    let k = self.index_of[slot];
                    if self.routable.get(k.index()) == Some(&slot) {
                        self.refresh_view(k);
                    }
                }
                self.replicas.give_back(list);
            }
        }
        if self.router.capabilities().needs_exact_match() {
            let prompt = self.stream.prompt(id.index());
            for (v, &slot) in self.views.iter_mut().zip(&self.routable) {
                v.matched_tokens = self.replicas[slot].matched_tokens(prompt);
            }
        }
        #[cfg(debug_assertions)]
        self.check_views();
        self.refresh_lora(id);
        self.refresh_tier_matches(id);
    }

    /// Rebuilds the view of the replica at router index `k`.
    fn refresh_view(&mut self, k: RouterIndex) {
        let slot = self.routable[k];
        let rep = &self.replicas[slot];
        self.views[k] = rep.view(&self.cfgs[replica_pool(self.pd.as_ref(), &self.gpu_pool, slot)]);
        let prefilling = rep.prefilling_len() as u32;
        let (router, local) = self.router_at(k);
        router.set_prefilling(local, prefilling);
    }

    /// Every view equals its replica's (all of them up to 64 replicas, else every 256th
    /// refresh: O(1) a refresh).
    #[cfg(debug_assertions)]
    fn check_views(&self) {
        if self.routable.len() > 64 && self.arrived % 256 != 0 {
            return;
        }
        assert_eq!(self.views.len(), self.routable.len());
        for (k, (v, &slot)) in self.views.iter().zip(&self.routable).enumerate() {
            let fresh = self.replicas[slot].view(&self.cfgs[replica_pool(self.pd.as_ref(), &self.gpu_pool, slot)]);
            let seen = routelab_policy_api::ReplicaView { matched_tokens: 0, ..*v };
            assert_eq!(seen, fresh, "view {k} (slot {slot}) is stale");
        }
    }
}

impl Deref for Slots {
    type Target = [Replica];
    fn deref(&self) -> &[Replica] {
        &self.items
    }
}

impl Index<ReplicaId> for Slots {
    type Output = Replica;
    fn index(&self, slot: ReplicaId) -> &Replica {
        &self.items[slot]
    }
}

/// A run of slots by position (a disaggregated cluster's pools: `..decode_start`,
/// `prefill_end..`), read only.
macro_rules! index_by_positions {
    ($($range:ty),*) => {$(
        impl Index<$range> for Slots {
            type Output = [Replica];
            fn index(&self, slots: $range) -> &[Replica] {
                &self.items[slots]
            }
        }
    )*};
}
index_by_positions!(Range<usize>, RangeFrom<usize>, RangeTo<usize>);

impl IndexMut<ReplicaId> for Slots {
    fn index_mut(&mut self, slot: ReplicaId) -> &mut Replica {
        self.mark(slot);
        &mut self.items[slot]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slots(n: usize) -> Slots {
        Slots::new((0..n as u32).map(|r| Replica::new(crate::ids::ReplicaId::from_u32(r))).collect())
    }

    fn changed(s: &mut Slots) -> Option<Vec<u32>> {
        match s.take_changed() {
            Changed::All => None,
            Changed::Slots(v) => {
                let out = v.iter().map(|r| r.raw()).collect();
                s.give_back(v);
                Some(out)
            }
        }
    }

    #[test]
    fn only_mutable_access_marks_and_each_slot_once() {
        let mut s = slots(4);
        let r = ReplicaId::from_u32;
        assert!(changed(&mut s).is_none(), "everything is new at the start");
        assert_eq!(changed(&mut s), Some(vec![]));
        let _ = s[r(1)].waiting().len() + s.iter().count();
        assert_eq!(changed(&mut s), Some(vec![]), "reads mark nothing");
        let _ = &mut s[r(2)];
        let _ = &mut s[r(0)];
        let _ = &mut s[r(2)];
        assert_eq!(changed(&mut s), Some(vec![2, 0]));
        assert_eq!(changed(&mut s), Some(vec![]), "taking clears the marks");
        let _ = &mut s[r(3)];
        s.mark_all();
        assert!(changed(&mut s).is_none());
        let _ = &mut s[r(3)];
        assert_eq!(changed(&mut s), Some(vec![3]), "a mark taken with `All` is not left behind");
    }
}
