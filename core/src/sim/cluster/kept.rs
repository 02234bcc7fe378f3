//! Where the cluster world keeps a request's state: on the replica that holds it while it is
//! queued or running there (the replica owns it: `replica/mod.rs`), in the run's table
//! otherwise — before it arrives, between a P/D hand-off and its admission on the decode
//! instance, and after it ended.

use super::ClusterSim;
use super::replica::RequestState;
use super::window::Window;
use crate::ids::{ReplicaId, RequestId};

/// A request's entry in the run's table.
pub(super) enum Kept {
    Here(RequestState),
    /// Held by this replica.
    On(ReplicaId),
}

/// Hands request `id`'s state, kept in `table`, to replica `r`, which holds it from now on.
pub(super) fn hand(table: &mut Window<Kept>, id: RequestId, r: ReplicaId) -> RequestState {
    match std::mem::replace(&mut table[id], Kept::On(r)) {
        Kept::Here(st) => st,
        Kept::On(s) => panic!("request {id} is held by replica {s} already"),
    }
}

/// Request `id`'s state, kept in `table` (not on a replica).
pub(super) fn here(table: &Window<Kept>, id: RequestId) -> &RequestState {
    match &table[id] {
        Kept::Here(st) => st,
        Kept::On(r) => panic!("request {id}'s state is held by replica {r}"),
    }
}

/// Request `id`'s state, kept in `table` (not on a replica).
pub(super) fn here_mut(table: &mut Window<Kept>, id: RequestId) -> &mut RequestState {
    match &mut table[id] {
        Kept::Here(st) => st,
        Kept::On(r) => panic!("request {id}'s state is held by replica {r}"),
    }
}

impl ClusterSim<'_> {
    /// Request `id`'s state, wherever it is kept.
    pub(super) fn state(&self, id: RequestId) -> &RequestState {
        match &self.states[id] {
            Kept::Here(st) => st,
            &Kept::On(r) => self.replicas[r].state(id),
        }
    }

    /// Request `id`'s state, kept in the run's table: a replica changes the states it holds
    /// itself.
    pub(super) fn state_mut(&mut self, id: RequestId) -> &mut RequestState {
        here_mut(&mut self.states, id)
    }

    /// The table keeps request `id`'s state again: its replica finished it or handed it off.
    pub(super) fn take_back(&mut self, id: RequestId) {
        let Kept::On(r) = self.states[id] else { panic!("request {id} is not held by a replica") };
        self.states[id] = Kept::Here(self.replicas[r].release(id));
    }
}
