//! The segment-level prefix tree ([`PrefixTree`], whose docs say what it is: this module is
//! private, its items are re-exported from `toolkit`).

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

use crate::Segment;

mod node;
use node::Node;

/// Index of a node in a [`PrefixTree`]. The root is never returned.
pub type NodeId = u32;

const ROOT: NodeId = 0;

/// The path hash of the root (the empty prefix): FNV-1a's offset basis.
pub const ROOT_PATH_HASH: u64 = 0xcbf2_9ce4_8422_2325;

/// The path hash of `parent`'s path extended by a segment with id `segment_id` (FNV-style
/// multiply, then a rotation so consecutive ids spread).
pub fn extend_path_hash(parent: u64, segment_id: u64) -> u64 {
    (parent ^ segment_id).wrapping_mul(0x0000_0100_0000_01B3).rotate_left(17)
}

/// Path hashes are well mixed already: a map keyed by them hashes them as themselves.
#[derive(Default)]
struct IdentityHasher(u64);

impl Hasher for IdentityHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) | u64::from(*b);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}
/// Parent of a collected node (its slot waits in the free list).
const DEAD: NodeId = NodeId::MAX;

/// A segment-level prefix tree shared by all replicas, recording which replicas hold each node.
///
/// A node is one [`Segment`] (a system prompt, a document, a question); a path from the root is a
/// prompt prefix. Each node records, for the replicas that hold it (a sparse set: memory grows with
/// the holdings, not with nodes × replicas), how many of its tokens the replica holds (fewer than
/// the segment's: partly evicted) and when the replica last used it. Per
/// replica, the tree keeps its *leaves* — held nodes with no held child — ordered by last use, so
/// least-recently-used eviction (or planning one, for a cost estimate) walks them in order
/// without scanning the tree.
///
/// Routers use it as their picture of the replicas' caches: SGLang-style routers insert what they
/// dispatch and evict LRU when a replica's tree grows too large; Preble inserts at dispatch and
/// removes what replicas report evicted. Every choice here is deterministic: children are kept in
/// a `BTreeMap`, and time is an access counter, ties broken by node id.
///
/// Each node also carries its *path hash* — a 64-bit hash of the segment ids from the root down to
/// it ([`extend_path_hash`] from [`ROOT_PATH_HASH`]) — and the tokens above it, so a router can key
/// per-prefix statistics by node without walking to the root, and look a node up (or release it)
/// by hash, as engines that publish block-hash removal events address them. The lookup by hash
/// costs a hash-map entry a node (≈ 20–40 bytes, a sixth of a node's memory); a router that never
/// looks nodes up by hash makes its tree [`PrefixTree::without_hash_index`].
///
/// # Example
///
/// Two replicas, prompts of a shared system prompt and one document each: each replica's match
/// on a new request, the holders of a node, and least-recently-used eviction.
///
/// ```
/// use routelab_policy_api::{PrefixTree, Segment};
///
/// let system = Segment { id: 1, tokens: 1000 };
/// let (doc_a, doc_b) = (Segment { id: 2, tokens: 200 }, Segment { id: 3, tokens: 300 });
/// let mut tree = PrefixTree::new(2);
/// assert_eq!(tree.insert(&[system, doc_a], 0), 1200); // tokens newly held by replica 0
/// tree.insert(&[system, doc_b], 1);
///
/// // A request for document B: replica 0 holds the system prompt, replica 1 all of it.
/// let prompt = [system, doc_b, Segment { id: 4, tokens: 20 }];
/// assert_eq!(tree.match_tokens(&prompt, 0), 1000);
/// let mut matched = [0; 2];
/// tree.match_each(&prompt, &mut matched);
/// assert_eq!(matched, [1000, 1300]);
/// assert_eq!(tree.longest_match(&prompt).0, 1300);
///
/// // Nodes: the system prompt is held by both replicas, and found by path or path hash.
/// let node = tree.find(&[system]).unwrap();
/// assert_eq!(tree.holders(node).collect::<Vec<_>>(), [0, 1]);
/// assert_eq!(tree.find_hash(tree.path_hash(node)), Some(node));
/// assert_eq!(tree.context_tokens(tree.find(&[system, doc_b]).unwrap()), 1000);
///
/// // Replica 0 also reads document C, then document A again: C is now its least recently used
/// // leaf. Eviction takes leaves whole, oldest first, never a node a held child still needs.
/// let doc_c = Segment { id: 5, tokens: 100 };
/// tree.insert(&[system, doc_c], 0);
/// tree.insert(&[system, doc_a], 0);
/// let (a, c) = (tree.find(&[system, doc_a]).unwrap(), tree.find(&[system, doc_c]).unwrap());
/// assert_eq!(tree.plan_eviction(0, 150), [(c, 100), (a, 200)]); // a plan, nothing evicted
/// assert_eq!(tree.evict_lru(0, 50), 100);
/// assert_eq!(tree.held_tokens(0), 1200);
/// assert_eq!((tree.held(a, 0), tree.held(c, 0)), (200, 0));
/// ```
#[derive(Clone, Debug)]
pub struct PrefixTree {
    replicas: usize,
    nodes: Vec<Node>,
    free: Vec<NodeId>,
    held_tokens: Vec<u64>,
    /// Per replica: its leaves by (last use, id), least recent first.
    leaves: Vec<BTreeSet<(u64, NodeId)>>,
    clock: u64,
    /// Live nodes by path hash (`None`: made [`Self::without_hash_index`]).
    by_hash: Option<HashMap<u64, NodeId, BuildHasherDefault<IdentityHasher>>>,
}

impl PrefixTree {
    /// An empty tree (just the root) over `replicas` replicas.
    pub fn new(replicas: usize) -> Self {
        Self::empty(replicas, Some(HashMap::default()))
    }

    // since 0.5.12 {
    /// Added in 0.5.12. [`Self::new`] without the index of nodes by path hash: everything works
    /// the same but [`Self::find_hash`] and [`Self::release_hash`], which panic; a node costs
    /// that much less.
    pub fn without_hash_index(replicas: usize) -> Self {
        Self::empty(replicas, None)
    }

    /// Added in 0.5.12. Nodes in the tree (the root not counted): one per distinct prefix some
    /// replica holds.
    pub fn node_count(&self) -> usize {
        self.nodes.len() - 1 - self.free.len()
    }
    // } since 0.5.12

    /// An empty tree (just the root), with or without the index by path hash.
    fn empty(replicas: usize, by_hash: Option<HashMap<u64, NodeId, BuildHasherDefault<IdentityHasher>>>) -> Self {
        let root = Node::new(Segment { id: u64::MAX, tokens: 0 }, ROOT, ROOT_PATH_HASH, 0);
        Self {
            replicas,
            nodes: vec![root],
            free: Vec::new(),
            held_tokens: vec![0; replicas],
            leaves: vec![BTreeSet::new(); replicas],
            clock: 0,
            by_hash,
        }
    }

    /// The number of replicas the tree tracks.
    pub fn replicas(&self) -> usize {
        self.replicas
    }

    /// Tokens replica `r` holds in the tree.
    pub fn held_tokens(&self, r: usize) -> u64 {
        self.held_tokens[r]
    }

    /// The segment of a node.
    pub fn segment(&self, node: NodeId) -> Segment {
        self.nodes[node as usize].segment()
    }

    /// The hash of the path from the root to `node` (see [`extend_path_hash`]).
    pub fn path_hash(&self, node: NodeId) -> u64 {
        self.nodes[node as usize].path_hash
    }

    /// Tokens of the segments above `node` (its context when it is computed).
    pub fn context_tokens(&self, node: NodeId) -> u64 {
        self.nodes[node as usize].context_tokens
    }

    /// The live node whose path hashes to `hash`, if any. (Two paths with the same 64-bit hash
    /// would share an entry, the later one winning; at 2^-64 per pair this is left to chance.)
    ///
    /// # Panics
    ///
    /// On a tree made [`Self::without_hash_index`].
    pub fn find_hash(&self, hash: u64) -> Option<NodeId> {
        let by_hash = self.by_hash.as_ref().expect("find_hash on a tree made without_hash_index");
        by_hash.get(&hash).copied()
    }

    /// [`Self::release`] of the node with path hash `hash`: a hash-addressed removal event.
    /// Unknown hashes are ignored. Returns the tokens released. Panics as `find_hash` does.
    pub fn release_hash(&mut self, hash: u64, r: usize, remaining: u32) -> u64 {
        match self.find_hash(hash) {
            Some(n) => self.release(n, r, remaining),
            None => 0,
        }
    }

    /// The node above `node` (`None` at the top).
    pub fn parent(&self, node: NodeId) -> Option<NodeId> {
        let p = self.nodes[node as usize].parent;
        (p != ROOT && p != DEAD).then_some(p)
    }

    /// Tokens of `node` replica `r` holds.
    pub fn held(&self, node: NodeId, r: usize) -> u32 {
        self.nodes[node as usize].held(r)
    }

    /// Replicas holding any of `node`, in index order.
    pub fn holders(&self, node: NodeId) -> impl Iterator<Item = usize> + '_ {
        self.nodes[node as usize].holds.as_slice().iter().filter(|h| h.tokens > 0).map(|h| h.replica as usize)
    }

    fn is_leaf(&self, node: NodeId, r: usize) -> bool {
        self.nodes[node as usize].hold(r).is_some_and(|h| h.tokens > 0 && h.held_children == 0)
    }

    fn set_leaf_entry(&mut self, node: NodeId, r: usize, was_leaf_at: Option<u64>) {
        if let Some(t) = was_leaf_at {
            self.leaves[r].remove(&(t, node));
        }
        if node != ROOT && self.is_leaf(node, r) {
            self.leaves[r].insert((self.nodes[node as usize].used(r), node));
        }
    }

    fn child(&mut self, parent: NodeId, seg: Segment) -> NodeId {
        if let Some(c) = self.nodes[parent as usize].child(seg.id) {
            return c;
        }
        let up = &self.nodes[parent as usize];
        let path_hash = extend_path_hash(up.path_hash, seg.id);
        let context_tokens = up.context_tokens + if parent == ROOT { 0 } else { u64::from(up.segment_tokens) };
        let n = Node::new(seg, parent, path_hash, context_tokens);
        let id = match self.free.pop() {
            Some(id) => {
                self.nodes[id as usize] = n;
                id
            }
            None => {
                self.nodes.push(n);
                (self.nodes.len() - 1) as NodeId
            }
        };
        self.nodes[parent as usize].add_child(seg.id, id);
        if let Some(by_hash) = &mut self.by_hash {
            by_hash.insert(path_hash, id);
        }
        id
    }

    /// Records that replica `r` holds the whole prompt `path` (e.g. a request was dispatched
    /// there) and marks it used now. Returns the tokens newly held.
    pub fn insert(&mut self, path: &[Segment], r: usize) -> u64 {
        self.clock += 1;
        let clock = self.clock;
        let mut added = 0u64;
        let mut node = ROOT;
        for &seg in path {
            let c = self.child(node, seg);
            // Every node on the path but the last ends up holding the next one, so only the last
            // can be r's leaf afterwards: old leaf entries go now, the one new entry is added after
            // the walk (not inserted and removed again one step later for every segment).
            let (was_leaf_at, was_held) = match self.nodes[c as usize].hold(r) {
                Some(h) => ((h.tokens > 0 && h.held_children == 0).then_some(h.used), h.tokens > 0),
                None => (None, false),
            };
            if let Some(t) = was_leaf_at {
                self.leaves[r].remove(&(t, c));
            }
            if !was_held {
                self.nodes[node as usize].hold_mut(r).held_children += 1;
            }
            let h = self.nodes[c as usize].hold_mut(r);
            added += u64::from(seg.tokens - h.tokens.min(seg.tokens));
            h.tokens = seg.tokens;
            h.used = clock;
            node = c;
        }
        if node != ROOT && self.is_leaf(node, r) {
            self.leaves[r].insert((clock, node));
        }
        self.held_tokens[r] += added;
        added
    }

    /// Tokens of `path`'s leading segments replica `r` holds (a partly held segment counts its
    /// held tokens and ends the match).
    pub fn match_tokens(&self, path: &[Segment], r: usize) -> u32 {
        let mut node = ROOT;
        let mut total = 0;
        for seg in path {
            let Some(c) = self.nodes[node as usize].child(seg.id) else { break };
            let held = self.nodes[c as usize].held(r);
            total += held;
            if held < seg.tokens {
                break;
            }
            node = c;
        }
        total
    }

    /// [`Self::match_tokens`] for every replica at once, into `out` (length = replicas).
    /// Allocates nothing: a replica is still matching exactly when its count equals the tokens of
    /// the path so far (a node holds at most its segment's tokens, so any shortfall is final).
    pub fn match_each(&self, path: &[Segment], out: &mut [u32]) {
        out.iter_mut().for_each(|x| *x = 0);
        let mut whole = 0u32;
        let mut node = ROOT;
        for seg in path {
            let Some(c) = self.nodes[node as usize].child(seg.id) else { break };
            // Replicas without an entry hold none of it: their count stays behind `whole`, unless
            // the segment is empty, which every replica still matching holds whole.
            let mut any_whole = seg.tokens == 0;
            for h in self.nodes[c as usize].holds.as_slice() {
                let count = &mut out[h.replica as usize];
                if *count == whole {
                    *count += h.tokens;
                    any_whole |= h.tokens >= seg.tokens;
                }
            }
            if !any_whole {
                break;
            }
            whole += seg.tokens;
            node = c;
        }
    }

    /// The longest prefix of `path` any replica holds whole: its token count and deepest node.
    pub fn longest_match(&self, path: &[Segment]) -> (u32, Option<NodeId>) {
        let mut node = ROOT;
        let mut total = 0;
        let mut deepest = None;
        for seg in path {
            let Some(c) = self.nodes[node as usize].child(seg.id) else { break };
            if seg.tokens > 0 && !self.nodes[c as usize].holds.as_slice().iter().any(|h| h.tokens >= seg.tokens) {
                break;
            }
            total += seg.tokens;
            deepest = Some(c);
            node = c;
        }
        (total, deepest)
    }

    /// The node at the end of `path`, if the tree has it.
    pub fn find(&self, path: &[Segment]) -> Option<NodeId> {
        let mut node = ROOT;
        for seg in path {
            node = self.nodes[node as usize].child(seg.id)?;
        }
        (node != ROOT).then_some(node)
    }

    /// Replica `r` now holds only `remaining` tokens of `node` (0: none) — and none of anything
    /// below it, in either case. Returns the tokens released.
    pub fn release(&mut self, node: NodeId, r: usize, remaining: u32) -> u64 {
        let mut freed = 0u64;
        // The subtree below first, deepest first: a replica cannot keep a suffix without all of
        // its prefix, whether the node goes wholly or in part.
        let mut stack: Vec<NodeId> = self.nodes[node as usize].children().collect();
        let mut order = Vec::new();
        while let Some(n) = stack.pop() {
            if self.nodes[n as usize].held(r) > 0 {
                order.push(n);
                stack.extend(self.nodes[n as usize].children());
            }
        }
        for &n in order.iter().rev() {
            freed += self.drop_hold(n, r);
        }
        if remaining == 0 {
            freed += self.drop_hold(node, r);
        } else {
            let n = &mut self.nodes[node as usize];
            if let Some(h) = n.holds.as_mut_slice().iter_mut().find(|h| h.replica as usize == r) {
                let before = h.tokens;
                h.tokens = remaining.min(before);
                let cut = u64::from(before - h.tokens);
                self.held_tokens[r] -= cut;
                freed += cut;
            }
        }
        for &n in order.iter().rev() {
            self.collect(n);
        }
        self.collect(node);
        freed
    }

    /// Drops replica `r`'s hold on one node whose held children are already gone.
    fn drop_hold(&mut self, node: NodeId, r: usize) -> u64 {
        let n = &mut self.nodes[node as usize];
        let Some(h) = n.hold(r).copied().filter(|h| h.tokens > 0) else { return 0 };
        self.leaves[r].remove(&(h.used, node));
        n.hold_mut(r).tokens = 0;
        n.prune(r);
        self.held_tokens[r] -= u64::from(h.tokens);
        let parent = self.nodes[node as usize].parent;
        let up = &mut self.nodes[parent as usize];
        up.hold_mut(r).held_children -= 1;
        up.prune(r);
        let held = h.tokens;
        if parent != ROOT {
            self.set_leaf_entry(parent, r, None);
        }
        u64::from(held)
    }

    /// Removes `node` and its ancestors while nobody holds them and they have no children.
    fn collect(&mut self, mut node: NodeId) {
        while node != ROOT {
            let n = &self.nodes[node as usize];
            if n.parent == DEAD || n.has_children() || n.holds.as_slice().iter().any(|h| h.tokens > 0) {
                return;
            }
            let (parent, id, hash) = (n.parent, n.segment_id, n.path_hash);
            self.nodes[parent as usize].remove_child(id);
            if let Some(by_hash) = &mut self.by_hash {
                if by_hash.get(&hash) == Some(&node) {
                    by_hash.remove(&hash);
                }
            }
            self.nodes[node as usize].parent = DEAD;
            self.free.push(node);
            node = parent;
        }
    }

    /// Replica `r` reports an eviction of the node at `path` down to `remaining` tokens
    /// (as [`crate::Eviction`] carries it). Unknown paths are ignored. Returns tokens released.
    pub fn release_path(&mut self, path: &[Segment], r: usize, remaining: u32) -> u64 {
        match self.find(path) {
            Some(n) => self.release(n, r, remaining),
            None => 0,
        }
    }

    /// Evicts replica `r`'s least-recently-used leaves, whole, until at least `tokens` are freed
    /// or nothing is left. Returns the tokens freed.
    pub fn evict_lru(&mut self, r: usize, tokens: u64) -> u64 {
        let mut freed = 0;
        while freed < tokens {
            let Some(&(_, node)) = self.leaves[r].first() else { break };
            freed += self.release(node, r, 0);
        }
        freed
    }

    /// The nodes LRU eviction on replica `r` would take, in order, until `tokens` are freed —
    /// without evicting anything: `(node, tokens)` pairs. For cost estimates (Preble's M).
    pub fn plan_eviction(&self, r: usize, tokens: u64) -> Vec<(NodeId, u32)> {
        let mut out = Vec::new();
        self.plan_eviction_each(r, tokens, |node, held| out.push((node, held)));
        out
    }

    /// [`Self::plan_eviction`] handing each `(node, tokens)` to `visit` instead of collecting
    /// them (a cost estimate per decision need not allocate the plan).
    pub fn plan_eviction_each(&self, r: usize, tokens: u64, mut visit: impl FnMut(NodeId, u32)) {
        let mut freed = 0u64;
        let mut leaves = self.leaves[r].iter().copied().peekable();
        // Parents that become leaves as their last held child is planned away.
        let mut promoted: BinaryHeap<Reverse<(u64, NodeId)>> = BinaryHeap::new();
        // (parent, held children not yet planned away); few entries, so a list beats a map.
        let mut children_left: Vec<(NodeId, u32)> = Vec::new();
        while freed < tokens {
            let next = match (leaves.peek(), promoted.peek()) {
                (Some(a), Some(Reverse(b))) => {
                    if a <= b {
                        leaves.next()
                    } else {
                        promoted.pop().map(|Reverse(x)| x)
                    }
                }
                (Some(_), None) => leaves.next(),
                (None, Some(_)) => promoted.pop().map(|Reverse(x)| x),
                (None, None) => None,
            };
            let Some((_, node)) = next else { break };
            let held = self.nodes[node as usize].held(r);
            visit(node, held);
            freed += held as u64;
            let parent = self.nodes[node as usize].parent;
            if parent != ROOT {
                let i = match children_left.iter().position(|(p, _)| *p == parent) {
                    Some(i) => i,
                    None => {
                        children_left.push((parent, self.nodes[parent as usize].held_children(r)));
                        children_left.len() - 1
                    }
                };
                let left = &mut children_left[i].1;
                *left -= 1;
                if *left == 0 {
                    promoted.push(Reverse((self.nodes[parent as usize].used(r), parent)));
                }
            }
        }
    }

    /// Checks the bookkeeping against a recount (for tests).
    #[doc(hidden)]
    pub fn check(&self) {
        let mut live = 0;
        let mut stack = vec![ROOT];
        while let Some(n) = stack.pop() {
            for c in self.nodes[n as usize].children() {
                let (up, node) = (&self.nodes[n as usize], &self.nodes[c as usize]);
                assert_eq!(node.path_hash, extend_path_hash(up.path_hash, node.segment_id), "path hash of {c}");
                let above = if n == ROOT { 0 } else { u64::from(up.segment_tokens) };
                assert_eq!(node.context_tokens, up.context_tokens + above, "context of {c}");
                if let Some(by_hash) = &self.by_hash {
                    assert_eq!(by_hash.get(&node.path_hash), Some(&c), "node {c} by its hash");
                }
                live += 1;
                stack.push(c);
            }
        }
        if let Some(by_hash) = &self.by_hash {
            assert_eq!(by_hash.len(), live, "only live nodes are found by hash");
        }
        for r in 0..self.replicas {
            let mut total = 0u64;
            let mut leaves = BTreeSet::new();
            let mut stack = vec![ROOT];
            while let Some(n) = stack.pop() {
                let node = &self.nodes[n as usize];
                let held_children = node.children().filter(|&c| self.nodes[c as usize].held(r) > 0).count();
                assert_eq!(held_children, node.held_children(r) as usize, "held children of {n} on {r}");
                if let Some(h) = node.hold(r) {
                    assert!(h.tokens > 0 || h.held_children > 0, "empty entry of {r} kept on node {n}");
                }
                if n != ROOT {
                    total += u64::from(node.held(r));
                    if node.held(r) > 0 && held_children == 0 {
                        leaves.insert((node.used(r), n));
                    }
                    assert!(node.held(r) > 0 || held_children == 0, "node {n} unheld on {r} but has held children");
                }
                stack.extend(node.children());
            }
            assert_eq!(total, self.held_tokens[r], "held tokens on {r}");
            assert_eq!(leaves, self.leaves[r], "leaves of {r}");
        }
    }
}

#[cfg(test)]
mod tests;
