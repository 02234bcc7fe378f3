//! A [`PrefixTree`](super::PrefixTree) node, laid out for trees of millions of nodes.
//!
//! Most nodes of a router's tree are a prompt's own tail: one replica holds it and it has no
//! children. So the one holder sits inline (a second one moves both to the heap), and the child
//! map is allocated only once a node has a child: 64 bytes a node, where a `Segment`, a
//! `BTreeMap` and a `Vec` of holders took 88 plus a 32-byte heap block for the one holder
//! (docs/performance.md, "sglang_cache_aware's day", has the measurements).

use std::collections::BTreeMap;

use super::NodeId;
use crate::Segment;

/// One replica's stake in a node. Packed to 4-byte alignment (20 bytes, not 24) so that one fits
/// inline in [`Holds`] beside its tag; `used` is read and written by value, never by reference.
#[derive(Clone, Copy, Debug)]
#[repr(C, packed(4))]
pub(super) struct Hold {
    pub(super) replica: u32,
    /// Tokens of the node's segment held (0 only for the root, which holds nothing itself).
    pub(super) tokens: u32,
    /// Children this replica holds (a held node with none is that replica's leaf).
    pub(super) held_children: u32,
    /// Last access (the tree's counter).
    pub(super) used: u64,
}

/// The replicas with a stake in a node, in replica order: none, one inline, or more on the heap.
#[derive(Clone, Debug, Default)]
pub(super) enum Holds {
    #[default]
    None,
    One(Hold),
    /// Boxed so that the enum stays 24 bytes (a `Vec` inline would make it 32 for every node).
    #[allow(clippy::box_collection)]
    Many(Box<Vec<Hold>>),
}

impl Holds {
    pub(super) fn as_slice(&self) -> &[Hold] {
        match self {
            Holds::None => &[],
            Holds::One(h) => std::slice::from_ref(h),
            Holds::Many(v) => v,
        }
    }

    pub(super) fn as_mut_slice(&mut self) -> &mut [Hold] {
        match self {
            Holds::None => &mut [],
            Holds::One(h) => std::slice::from_mut(h),
            Holds::Many(v) => v,
        }
    }

    /// Inserts `h` at position `i` of the slice.
    pub(super) fn insert(&mut self, i: usize, h: Hold) {
        *self = match std::mem::take(self) {
            Holds::None => Holds::One(h),
            Holds::One(first) => {
                let mut v = Vec::with_capacity(2);
                v.push(first);
                v.insert(i, h);
                Holds::Many(Box::new(v))
            }
            Holds::Many(mut v) => {
                v.insert(i, h);
                Holds::Many(v)
            }
        };
    }

    /// Removes position `i` of the slice (a last one moves back inline).
    pub(super) fn remove(&mut self, i: usize) {
        *self = match std::mem::take(self) {
            Holds::None => unreachable!("removing from no holds"),
            Holds::One(_) => Holds::None,
            Holds::Many(mut v) => {
                v.remove(i);
                match v.len() {
                    1 => Holds::One(v[0]),
                    _ => Holds::Many(v),
                }
            }
        };
    }
}

#[derive(Clone, Debug)]
pub(super) struct Node {
    pub(super) segment_id: u64,
    /// Hash of the segment ids from the root to this node.
    pub(super) path_hash: u64,
    /// Tokens of the segments above this node.
    pub(super) context_tokens: u64,
    /// Children by segment id; `None` until the first. Boxed: 8 bytes in the many nodes without
    /// children, where a `BTreeMap` inline takes 24.
    #[allow(clippy::box_collection)]
    children: Option<Box<BTreeMap<u64, NodeId>>>,
    /// The replicas with a stake in this node, by replica index: an entry exists while the
    /// replica holds tokens of it or holds any of its children.
    pub(super) holds: Holds,
    pub(super) segment_tokens: u32,
    pub(super) parent: NodeId,
}

impl Node {
    pub(super) fn new(segment: Segment, parent: NodeId, path_hash: u64, context_tokens: u64) -> Self {
        Node {
            segment_id: segment.id,
            path_hash,
            context_tokens,
            children: None,
            holds: Holds::None,
            segment_tokens: segment.tokens,
            parent,
        }
    }

    pub(super) fn segment(&self) -> Segment {
        Segment { id: self.segment_id, tokens: self.segment_tokens }
    }

    pub(super) fn child(&self, segment_id: u64) -> Option<NodeId> {
        self.children.as_ref()?.get(&segment_id).copied()
    }

    /// The children, in segment-id order.
    pub(super) fn children(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.children.iter().flat_map(|m| m.values().copied())
    }

    pub(super) fn has_children(&self) -> bool {
        self.children.is_some()
    }

    pub(super) fn add_child(&mut self, segment_id: u64, child: NodeId) {
        self.children.get_or_insert_with(Box::default).insert(segment_id, child);
    }

    pub(super) fn remove_child(&mut self, segment_id: u64) {
        if let Some(m) = &mut self.children {
            m.remove(&segment_id);
            if m.is_empty() {
                self.children = None;
            }
        }
    }

    pub(super) fn hold(&self, r: usize) -> Option<&Hold> {
        let holds = self.holds.as_slice();
        let i = holds.binary_search_by_key(&r, |h| h.replica as usize).ok()?;
        Some(&holds[i])
    }

    /// Replica `r`'s entry, created empty if it has none.
    pub(super) fn hold_mut(&mut self, r: usize) -> &mut Hold {
        let i = match self.holds.as_slice().binary_search_by_key(&r, |h| h.replica as usize) {
            Ok(i) => i,
            Err(i) => {
                let replica = u32::try_from(r).expect("replica indices fit in u32 (RouterContext::replicas)");
                self.holds.insert(i, Hold { replica, tokens: 0, held_children: 0, used: 0 });
                i
            }
        };
        &mut self.holds.as_mut_slice()[i]
    }

    /// Drops replica `r`'s entry once it holds neither the node nor any child.
    pub(super) fn prune(&mut self, r: usize) {
        if let Ok(i) = self.holds.as_slice().binary_search_by_key(&r, |h| h.replica as usize) {
            let h = self.holds.as_slice()[i];
            if h.tokens == 0 && h.held_children == 0 {
                self.holds.remove(i);
            }
        }
    }

    pub(super) fn held(&self, r: usize) -> u32 {
        self.hold(r).map_or(0, |h| h.tokens)
    }

    pub(super) fn used(&self, r: usize) -> u64 {
        self.hold(r).map_or(0, |h| h.used)
    }

    pub(super) fn held_children(&self, r: usize) -> u32 {
        self.hold(r).map_or(0, |h| h.held_children)
    }
}
