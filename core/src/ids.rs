//! Typed ids of the cluster world, in place of raw integers, so that a request id cannot be
//! passed where a replica is meant (or read as `usize` in one place and `u32` in the next).
//!
//! - [`RequestId`]: a request of the run's stream, by its position in the stream (arrival
//!   order). It indexes every per-request table: the states (the cluster's `Window` or a list), the infos,
//!   the ends, a P/D cluster's per-request instances, an agent session's dependencies.
//! - [`ReplicaId`]: a replica slot of the cluster, by its position among all slots (every pool,
//!   every model, the slots autoscaling may start). It indexes the replicas, their schedulers
//!   and every per-slot table. It is not a router's index: routers see the routable replicas of
//!   their model (or their P/D pool) numbered from 0, and the cluster maps those to slots.
//! - [`RouterIndex`]: a routable replica, by its position in the cluster's routable set (the
//!   replicas routers are shown, in order: the views' index). It keys the routable set and is
//!   what a slot maps back to. A router sees a part of it numbered from 0 (its model's range, or
//!   on a P/D cluster its pool's: the decode candidates start at `Pd::r_decode_start`); the one
//!   conversion to a P/D pool's own index is `Pd::pool_index`.
//!
//! All three hold a `u32` (`#[repr(transparent)]`: as cheap as the integer). The checked
//! constructors range-check before the cast. Inside a run they never fail: `ClusterSim::build`
//! refuses a stream of more than `u32::MAX` requests, and the spec counts slots in a `u32`.

use std::fmt;
use std::ops::{Index, IndexMut, Range};

/// A request of the run's stream, by its position in it (arrival order).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestId(u32);

/// A replica slot of the cluster, by its position among all slots.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ReplicaId(u32);

/// A routable replica, by its position in the routable set (the views' index); not a slot,
/// and not yet the index a model's or a P/D pool's router sees (that one starts at its range).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RouterIndex(u32);

macro_rules! id_impls {
    ($t:ident, $what:literal) => {
        impl $t {
            /// The id of position `i`, if it fits in a `u32`.
            #[inline]
            pub fn try_new(i: usize) -> Option<Self> {
                u32::try_from(i).ok().map(Self)
            }

            /// The id of position `i`; a run's positions fit in a `u32` (checked at setup: see
            /// the module docs), so a larger one is a bug.
            #[inline]
            pub fn new(i: usize) -> Self {
                Self::try_new(i).unwrap_or_else(|| panic!(concat!($what, " {} past u32::MAX (bounded at setup)"), i))
            }

            /// The id of a `u64` the ABI carries, if it fits in a `u32`.
            #[inline]
            pub fn try_from_u64(raw: u64) -> Option<Self> {
                u32::try_from(raw).ok().map(Self)
            }

            /// The id as a policy or the ABI carries it.
            #[inline]
            pub const fn from_u32(raw: u32) -> Self {
                Self(raw)
            }

            /// The raw id, as the ABI carries it.
            #[inline]
            pub const fn raw(self) -> u32 {
                self.0
            }

            /// The position it indexes.
            #[inline]
            pub const fn index(self) -> usize {
                self.0 as usize
            }
        }

        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        /// A plain list indexed by this id: a per-request or per-slot table.
        impl<T> Index<$t> for Vec<T> {
            type Output = T;
            #[inline]
            fn index(&self, id: $t) -> &T {
                &self[id.index()]
            }
        }

        impl<T> IndexMut<$t> for Vec<T> {
            #[inline]
            fn index_mut(&mut self, id: $t) -> &mut T {
                &mut self[id.index()]
            }
        }

        impl<T> Index<$t> for [T] {
            type Output = T;
            #[inline]
            fn index(&self, id: $t) -> &T {
                &self[id.index()]
            }
        }

        impl<T> IndexMut<$t> for [T] {
            #[inline]
            fn index_mut(&mut self, id: $t) -> &mut T {
                &mut self[id.index()]
            }
        }
    };
}

impl ReplicaId {
    /// The slots at positions `range`, in order: where slots are enumerated, so that a loop
    /// over them hands out ids, not positions.
    #[inline]
    pub fn each(range: Range<usize>) -> impl DoubleEndedIterator<Item = Self> + ExactSizeIterator + Clone {
        range.map(Self::new)
    }
}

id_impls!(RequestId, "request");
id_impls!(ReplicaId, "replica");
id_impls!(RouterIndex, "router index");

#[cfg(test)]
mod tests {
    use super::{ReplicaId, RequestId, RouterIndex};

    #[test]
    fn ids_index_lists_and_check_their_range() {
        let v: Vec<u32> = (1..=3).map(|x| x * 10).collect();
        assert_eq!(v[RequestId::new(2)], 30);
        assert_eq!(v[ReplicaId::from_u32(1)], 20);
        assert_eq!(RequestId::try_new(u32::MAX as usize + 1), None);
        assert_eq!(RequestId::new(7).index(), 7);
        assert!(RequestId::new(1) < RequestId::new(2));
        let each: Vec<u32> = ReplicaId::each(2..5).map(ReplicaId::raw).collect();
        assert_eq!(each, vec![2, 3, 4]);
    }

    #[test]
    fn router_indices_are_checked_and_index_the_routable_set() {
        let routable: Vec<u32> = vec![4, 0, 7];
        assert_eq!(routable[RouterIndex::new(2)], 7);
        assert_eq!(RouterIndex::try_new(u32::MAX as usize), Some(RouterIndex::from_u32(u32::MAX)));
        assert_eq!(RouterIndex::try_new(u32::MAX as usize + 1), None);
        assert_eq!(RouterIndex::try_from_u64(u64::from(u32::MAX) + 1), None);
        assert_eq!((RouterIndex::new(5).index(), RouterIndex::new(5).raw()), (5, 5));
    }
}
