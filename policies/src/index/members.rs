//! Which per-replica state each routable index names while replicas come and go
//! (`Router::on_replica_change`: autoscaling, crashes).
//!
//! A router keeps its per-replica state by *id*, `0..slots` (the `replicas` its context gives).
//! The host's indices are positions among the routable replicas: one that leaves takes its
//! index out and those above move down one (`Vec::remove`; a crash may take any index,
//! autoscaling's drain the top one); one that joins takes the top index. [`Members`] maps index
//! → id: a leaving replica's id is freed (the router drops what it knew of it, as upstream
//! routers drop a removed worker), a joining one takes the lowest free id, whose state is empty
//! (the replica starts cold). Until the first change the map is the identity, so a fixed fleet
//! routes exactly as without it.
//!
//! A completion names the index its request was placed at, and a drained replica's requests
//! finish after it left — when a replica that joined since may hold that index. So a router
//! that counts what it placed records each placement ([`Members::place`]) and settles it by
//! request id ([`Members::finish`]): a request whose replica left is nobody's any more.

use routelab_policy_api::{ReplicaChange, mix64};

use crate::index::block_index::KeyMap;

/// A change, by id: what the router should reset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Member {
    /// The replica with this id left: drop its state.
    Left(usize),
    /// A cold replica joined with this id (its state is empty already).
    Joined(usize),
}

/// Index → id of the routable replicas (see the module docs).
#[derive(Clone, Debug)]
pub struct Members {
    slots: usize,
    /// `None`: no change yet (identity).
    ids: Option<Vec<usize>>,
    /// Ids not in use, lowest last (popped first).
    free: Vec<usize>,
    /// Per id: its routable index (`usize::MAX`: none); kept with `ids`.
    at: Vec<usize>,
    /// In-flight requests (by mixed id) → the id they were placed on.
    placed: KeyMap<usize>,
}

impl Members {
    /// Ids for `slots` replicas (the router context's `replicas`).
    pub fn new(slots: usize) -> Self {
        Self { slots, ids: None, free: Vec::new(), at: Vec::new(), placed: KeyMap::default() }
    }

    /// The id of routable index `i` (`i` below the routable count).
    #[inline]
    pub fn id(&self, i: usize) -> usize {
        self.ids.as_ref().map_or(i, |ids| ids[i])
    }

    /// The id of index `i` if a replica holds it now (a completion may name the index a
    /// replica had before it left).
    pub fn get(&self, i: usize) -> Option<usize> {
        match &self.ids {
            None => (i < self.slots).then_some(i),
            Some(ids) => ids.get(i).copied(),
        }
    }

    /// How many replicas are routable now.
    pub fn routable(&self) -> usize {
        self.ids.as_ref().map_or(self.slots, Vec::len)
    }

    /// The routable index of id `id`, if it holds one.
    pub fn index_of(&self, id: usize) -> Option<usize> {
        match &self.ids {
            None => (id < self.slots).then_some(id),
            Some(_) => self.at.get(id).copied().filter(|&i| i != usize::MAX),
        }
    }

    /// `request` was placed at routable index `i`: its id, recorded until [`Self::finish`].
    pub fn place(&mut self, request: u64, i: usize) -> usize {
        let id = self.id(i);
        self.placed.insert(mix64(request), id);
        id
    }

    /// `request` finished (or was abandoned): the id it was placed on, unless that replica left
    /// since (its state is gone) or the request was never placed.
    pub fn finish(&mut self, request: u64) -> Option<usize> {
        self.placed.remove(&mix64(request))
    }

    /// Applies `change`; `None` if it names an index that does not exist (ignored).
    pub fn change(&mut self, change: &ReplicaChange) -> Option<Member> {
        let ids = self.ids.get_or_insert_with(|| {
            // Routable before the change: one fewer after a leave, one more after a join.
            let before = if change.joined { change.routable.saturating_sub(1) } else { change.routable + 1 } as usize;
            let before = before.min(self.slots);
            self.free = (before..self.slots).rev().collect();
            (0..before).collect()
        });
        let k = change.replica as usize;
        let member = if change.joined {
            let id = self.free.pop()?;
            ids.insert(k.min(ids.len()), id);
            Member::Joined(id)
        } else {
            if k >= ids.len() {
                return None;
            }
            let id = ids.remove(k);
            self.placed.retain(|_, &mut p| p != id);
            let at = self.free.partition_point(|&f| f > id);
            self.free.insert(at, id);
            Member::Left(id)
        };
        self.at.clear();
        self.at.resize(self.slots, usize::MAX);
        for (i, &id) in ids.iter().enumerate() {
            self.at[id] = i;
        }
        Some(member)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(replica: u32, joined: bool, routable: u32) -> ReplicaChange {
        ReplicaChange { at: 0.0, replica, joined, routable }
    }

    #[test]
    fn a_leave_shifts_the_indices_above_and_a_join_takes_the_lowest_free_id() {
        let mut m = Members::new(4);
        assert_eq!((m.id(3), m.get(4)), (3, None));
        // 4 routable; index 1 crashes: indices 2 and 3 now name ids 2 and 3 at 1 and 2.
        assert_eq!(m.change(&change(1, false, 3)), Some(Member::Left(1)));
        assert_eq!([m.id(0), m.id(1), m.id(2)], [0, 2, 3]);
        assert_eq!(m.get(3), None, "a completion naming the old top index is nobody's now");
        assert_eq!(m.change(&change(0, false, 2)), Some(Member::Left(0)));
        // Joins take the top index and the lowest free id.
        assert_eq!(m.change(&change(2, true, 3)), Some(Member::Joined(0)));
        assert_eq!(m.change(&change(3, true, 4)), Some(Member::Joined(1)));
        assert_eq!([m.id(0), m.id(1), m.id(2), m.id(3)], [2, 3, 0, 1]);
    }

    #[test]
    fn autoscaling_starts_below_the_slots() {
        // 8 slots, 2 routable at the start: the first change is a join at index 2.
        let mut m = Members::new(8);
        assert_eq!(m.change(&change(2, true, 3)), Some(Member::Joined(2)));
        assert_eq!(m.change(&change(2, false, 2)), Some(Member::Left(2)));
        assert_eq!(m.get(2), None);
    }

    #[test]
    fn a_drained_replicas_completions_are_nobodys_once_its_index_is_taken_again() {
        let mut m = Members::new(3);
        assert_eq!((m.place(10, 2), m.place(11, 0)), (2, 0));
        // Index 2 drains (request 10 still on it), and a cold replica joins at index 2.
        assert_eq!(m.change(&change(2, false, 2)), Some(Member::Left(2)));
        assert_eq!(m.change(&change(2, true, 3)), Some(Member::Joined(2)));
        assert_eq!(m.place(12, 2), 2);
        assert_eq!(m.finish(10), None, "request 10's replica left: not the newcomer's");
        assert_eq!((m.finish(12), m.finish(11), m.finish(11)), (Some(2), Some(0), None));
        assert_eq!((m.routable(), m.index_of(2), m.index_of(1)), (3, Some(2), Some(1)));
    }
}
