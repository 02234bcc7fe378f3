//! One replica's prefix cache: a radix tree over prompt segments with KV memory accounting.
//!
//! A node is one segment under a given path of segments (so the same document after two different
//! system prompts is two nodes). Each node holds `tokens` of KV memory (allocated) of which the
//! leading `computed` are written; a request allocates its uncached segments at admission and
//! marks them computed as its prefill advances, so another request matches only computed tokens.
//!
//! Pinning: an admitted request pins every node on its path; pinned nodes are never evicted.
//! Eviction: unpinned leaves, least recently used first (a node is "used" when a request pins or
//! releases it); the last victim is cut partially (its trailing tokens go, its leading tokens stay
//! matchable) when only part of its space is needed. When a node's last pinner leaves before the
//! node was fully computed (preemption), its uncomputed tail is freed, so an unpinned node is
//! always fully computed: `tokens == computed`.

use std::collections::BTreeSet;

use routelab_policy_api::Segment;

use crate::seeds::{MixMap, mix};

/// The root's index; it holds no tokens.
pub const ROOT: u32 = 0;

/// Hash of a segment path, extended one segment at a time from 0 (the empty path). Equal paths
/// hash equal on every replica, which is how the host counts the union of cached content.
pub fn extend_path_hash(path_hash: u64, segment_id: u64) -> u64 {
    mix(path_hash ^ mix(segment_id))
}

#[derive(Clone, Debug)]
struct Node {
    segment: Segment,
    parent: u32,
    tokens: u32,
    computed: u32,
    pins: u32,
    children: u32,
    last_used: u64,
    path_hash: u64,
    /// A child of this node (the last one inserted, while it lives), or [`NO_HINT`]: a chain of
    /// single children (an agent's growing context) is walked without hashing.
    hint: u32,
}

/// A node's `hint` when it names no child.
const NO_HINT: u32 = u32::MAX;

/// The evictable nodes, (last_used, index) in order, and the first of them once asked for: a
/// replica evicts a few tokens off its oldest leaf nearly every step, and on a large fleet the
/// B-tree's walk down to its first leaf was a cache miss a level.
#[derive(Debug, Default)]
struct Lru {
    set: BTreeSet<(u64, u32)>,
    /// `set`'s first key, when known (`None`: ask `set`).
    first: Option<(u64, u32)>,
}

impl Lru {
    fn insert(&mut self, key: (u64, u32)) {
        if self.first.is_some_and(|f| key < f) {
            self.first = Some(key);
        }
        self.set.insert(key);
    }

    fn remove(&mut self, key: &(u64, u32)) {
        if self.first == Some(*key) {
            self.first = None;
        }
        self.set.remove(key);
    }

    fn first(&mut self) -> Option<(u64, u32)> {
        if self.first.is_none() {
            self.first = self.set.first().copied();
        }
        self.first
    }

    fn pop_first(&mut self) {
        self.first = None;
        self.set.pop_first();
    }

    fn contains(&self, key: &(u64, u32)) -> bool {
        self.set.contains(key)
    }
}

/// What admitting a prompt would take.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AdmitPlan {
    /// Leading prompt tokens already computed here.
    pub cached_tokens: u32,
    /// Tokens of matched nodes nobody pins now (they become pinned).
    pub newly_pinned_tokens: u64,
    /// Tokens to allocate: uncached segments, and the evicted tail of a partially evicted one.
    pub new_tokens: u64,
}

/// A cut of cached content: the path to the cut node and what is left of it.
#[derive(Clone, Debug, PartialEq)]
pub struct EvictionEvent {
    pub path: Vec<Segment>,
    pub remaining_tokens: u32,
}

#[derive(Debug)]
pub struct PrefixCache {
    nodes: Vec<Node>,
    free_slots: Vec<u32>,
    children: MixMap<(u32, u64), u32>,
    /// Evictable nodes: unpinned leaves, by (last_used, index).
    lru: Lru,
    clock: u64,
    total_tokens: u64,
    pinned_tokens: u64,
    evicted_tokens: u64,
    /// With a KV tier below: (path hash, depth, tokens) of each whole segment whose first cut
    /// an eviction made (it goes down whole, once, before its tokens are dropped here).
    offloaded: Option<Vec<(u64, u32, u32)>>,
}

impl Default for PrefixCache {
    fn default() -> Self {
        Self::new()
    }
}

impl PrefixCache {
    pub fn new() -> Self {
        let root = Node {
            segment: Segment { id: 0, tokens: 0 },
            parent: ROOT,
            tokens: 0,
            computed: 0,
            pins: 0,
            children: 0,
            last_used: 0,
            path_hash: 0,
            hint: NO_HINT,
        };
        Self {
            nodes: vec![root],
            free_slots: Vec::new(),
            children: MixMap::default(),
            lru: Lru::default(),
            clock: 0,
            total_tokens: 0,
            pinned_tokens: 0,
            evicted_tokens: 0,
            offloaded: None,
        }
    }

    /// A cache with a tier below: evictions are collected for [`PrefixCache::take_offloaded`].
    pub fn with_offload() -> Self {
        Self { offloaded: Some(Vec::new()), ..Self::new() }
    }

    /// The whole segments evicted since the last call, as (path hash, depth, tokens), in
    /// eviction order; moves them into `into` (cleared first).
    pub fn take_offloaded(&mut self, into: &mut Vec<(u64, u32, u32)>) {
        into.clear();
        if let Some(v) = &mut self.offloaded {
            std::mem::swap(v, into);
        }
    }

    /// KV tokens held by the tree (computed or allocated for a running prefill).
    pub fn total_tokens(&self) -> u64 {
        self.total_tokens
    }

    /// KV tokens of nodes some running request pins (not evictable).
    pub fn pinned_tokens(&self) -> u64 {
        self.pinned_tokens
    }

    /// Nodes holding tokens (the cost of [`PrefixCache::check`]).
    pub fn nodes(&self) -> usize {
        self.children.len()
    }

    /// Tokens evicted so far.
    pub fn evicted_tokens(&self) -> u64 {
        self.evicted_tokens
    }

    fn child(&self, parent: u32, segment_id: u64) -> Option<u32> {
        let hint = self.nodes[parent as usize].hint;
        // The hint is a live child of `parent` (`remove` clears it), so its id decides.
        if hint != NO_HINT && self.nodes[hint as usize].segment.id == segment_id {
            return Some(hint);
        }
        self.children.get(&(parent, segment_id)).copied()
    }

    /// Leading tokens of `prompt` computed in this cache.
    pub fn cached_prefix(&self, prompt: &[Segment]) -> u32 {
        let mut node = ROOT;
        let mut cached = 0;
        for s in prompt {
            let Some(c) = self.child(node, s.id) else { break };
            let n = &self.nodes[c as usize];
            cached += n.computed;
            if n.computed < s.tokens {
                break;
            }
            node = c;
        }
        cached
    }

    /// The exact match a router asks for: leading tokens computed here, or belonging to requests
    /// dispatched here and not yet computed (`pending` counts those by path hash).
    pub fn cached_or_pending_prefix(&self, prompt: &[Segment], pending: &MixMap<u64, u32>) -> u32 {
        let mut node = Some(ROOT);
        let mut hash = 0;
        let mut matched = 0;
        for s in prompt {
            hash = extend_path_hash(hash, s.id);
            let cached = node.and_then(|p| self.child(p, s.id));
            let computed = cached.map_or(0, |c| self.nodes[c as usize].computed);
            if computed >= s.tokens || pending.contains_key(&hash) {
                matched += s.tokens;
                node = cached.filter(|_| computed >= s.tokens);
            } else {
                return matched + computed;
            }
        }
        matched
    }

    /// What admitting `prompt` needs; changes nothing.
    pub fn plan(&self, prompt: &[Segment]) -> AdmitPlan {
        self.plan_with(prompt, |_| {})
    }

    /// [`PrefixCache::plan`], filling `matched` with the nodes of `prompt`'s leading segments
    /// held here: what [`PrefixCache::admit`] pins first, so handing it `matched` spares it the
    /// walk (on agentic prompts of a hundred segments, a hash lookup each).
    pub fn plan_path(&self, prompt: &[Segment], matched: &mut Vec<u32>) -> AdmitPlan {
        matched.clear();
        matched.reserve(prompt.len());
        self.plan_with(prompt, |c| matched.push(c))
    }

    fn plan_with(&self, prompt: &[Segment], mut on_match: impl FnMut(u32)) -> AdmitPlan {
        let mut plan = AdmitPlan::default();
        let mut node = ROOT;
        let mut counting = true;
        for (k, s) in prompt.iter().enumerate() {
            match self.child(node, s.id) {
                Some(c) => {
                    on_match(c);
                    let n = &self.nodes[c as usize];
                    if counting {
                        plan.cached_tokens += n.computed;
                        counting = n.computed >= s.tokens;
                    }
                    if n.pins == 0 {
                        plan.newly_pinned_tokens += n.tokens as u64;
                    }
                    plan.new_tokens += (s.tokens - n.tokens) as u64;
                    node = c;
                }
                None => {
                    plan.new_tokens += prompt[k..].iter().map(|s| s.tokens as u64).sum::<u64>();
                    break;
                }
            }
        }
        plan
    }

    /// Pins `prompt`'s path, evicts `evict_tokens` of unpinned content, then allocates what is
    /// missing. `path` comes in holding the nodes of a leading part of that path (what
    /// [`PrefixCache::plan_path`] found, or nothing), and leaves holding the node of each
    /// segment. Evictions go to `events` if given.
    pub fn admit(
        &mut self,
        prompt: &[Segment],
        path: &mut Vec<u32>,
        evict_tokens: u64,
        events: Option<&mut Vec<EvictionEvent>>,
    ) {
        self.clock += 1;
        debug_assert!(self.is_leading_path(prompt, path), "admitting with a path that is not the prompt's own");
        // A request's path starts empty: one allocation, not a doubling per few segments.
        path.reserve(prompt.len() - path.len());
        let mut node = ROOT;
        for &c in path.iter() {
            self.pin(c);
            node = c;
        }
        let mut matched = path.len();
        for s in &prompt[matched..] {
            let Some(c) = self.child(node, s.id) else { break };
            self.pin(c);
            path.push(c);
            node = c;
            matched += 1;
        }
        self.evict(evict_tokens, events);
        for &c in path.iter() {
            let n = &mut self.nodes[c as usize];
            let grow = n.segment.tokens - n.tokens;
            n.tokens += grow;
            self.total_tokens += grow as u64;
            self.pinned_tokens += grow as u64;
        }
        for s in &prompt[matched..] {
            let c = self.insert(node, *s, 0);
            self.pin(c);
            path.push(c);
            node = c;
        }
    }

    /// Whether `path` is the chain of nodes of `prompt`'s first `path.len()` segments.
    fn is_leading_path(&self, prompt: &[Segment], path: &[u32]) -> bool {
        let mut parent = ROOT;
        path.len() <= prompt.len()
            && path.iter().zip(prompt).all(|(&c, s)| {
                let n = &self.nodes[c as usize];
                let ok = n.parent == parent && n.segment.id == s.id && self.child(parent, s.id) == Some(c);
                parent = c;
                ok
            })
    }

    fn pin(&mut self, c: u32) {
        let clock = self.clock;
        let n = &mut self.nodes[c as usize];
        if n.pins == 0 {
            self.pinned_tokens += n.tokens as u64;
            // Only unpinned leaves are in the LRU: an inner node of a long path costs no search.
            if n.children == 0 {
                self.lru.remove(&(n.last_used, c));
            }
        }
        n.pins += 1;
        n.last_used = clock;
    }

    /// A new unpinned child of `parent` holding `segment` with `computed` tokens written
    /// (allocates the whole segment).
    fn insert(&mut self, parent: u32, segment: Segment, computed: u32) -> u32 {
        let path_hash = extend_path_hash(self.nodes[parent as usize].path_hash, segment.id);
        let node = Node {
            segment,
            parent,
            tokens: segment.tokens,
            computed,
            pins: 0,
            children: 0,
            last_used: self.clock,
            path_hash,
            hint: NO_HINT,
        };
        let c = match self.free_slots.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        let p = &mut self.nodes[parent as usize];
        if p.children == 0 && p.pins == 0 && parent != ROOT {
            self.lru.remove(&(p.last_used, parent));
        }
        p.children += 1;
        p.hint = c;
        self.children.insert((parent, segment.id), c);
        self.total_tokens += segment.tokens as u64;
        c
    }

    /// Caches a finished request's output (reused by a later turn) under `parent`, computed and
    /// unpinned. The caller moves those tokens from its private KV to the tree.
    pub fn insert_computed(&mut self, parent: u32, segment: Segment) {
        if self.child(parent, segment.id).is_some() || segment.tokens == 0 {
            return;
        }
        self.clock += 1;
        let c = self.insert(parent, segment, segment.tokens);
        self.lru.insert((self.nodes[c as usize].last_used, c));
    }

    /// Marks the first `computed` tokens of `node` as written (never lowers it).
    pub fn mark_computed(&mut self, node: u32, computed: u32) {
        let n = &mut self.nodes[node as usize];
        debug_assert!(computed <= n.tokens, "computing past the allocation");
        n.computed = n.computed.max(computed);
    }

    /// Unpins a request's path (deepest first), freeing uncomputed tails nobody else pins.
    pub fn release(&mut self, path: &[u32]) {
        self.clock += 1;
        for &c in path.iter().rev() {
            let clock = self.clock;
            let n = &mut self.nodes[c as usize];
            n.pins -= 1;
            n.last_used = clock;
            if n.pins > 0 {
                continue;
            }
            self.pinned_tokens -= n.tokens as u64;
            let uncomputed = n.tokens - n.computed;
            n.tokens = n.computed;
            self.total_tokens -= uncomputed as u64;
            if n.children == 0 {
                if n.tokens == 0 {
                    self.remove(c);
                } else {
                    self.lru.insert((clock, c));
                }
            }
        }
    }

    fn remove(&mut self, c: u32) {
        let (parent, id) = {
            let n = &self.nodes[c as usize];
            debug_assert!(n.children == 0 && n.pins == 0 && n.tokens == 0);
            (n.parent, n.segment.id)
        };
        self.children.remove(&(parent, id));
        self.free_slots.push(c);
        let p = &mut self.nodes[parent as usize];
        p.children -= 1;
        if p.hint == c {
            p.hint = NO_HINT;
        }
        if p.children == 0 && p.pins == 0 && parent != ROOT {
            self.lru.insert((p.last_used, parent));
        }
    }

    /// Evicts up to `tokens` tokens of unpinned leaves, least recently used first; returns how
    /// many were evicted (less only when nothing evictable is left).
    pub fn evict(&mut self, mut tokens: u64, mut events: Option<&mut Vec<EvictionEvent>>) -> u64 {
        let mut evicted = 0;
        while tokens > 0 {
            // Peeked, not popped: a victim cut partially keeps its place (and its key), so the
            // common case (a few tokens off the oldest leaf each step) costs no reinsertion.
            let Some((_, c)) = self.lru.first() else { break };
            let whole = self.nodes[c as usize].tokens == self.nodes[c as usize].segment.tokens;
            if whole && self.offloaded.is_some() {
                let (hash, seg_tokens) = (self.nodes[c as usize].path_hash, self.nodes[c as usize].segment.tokens);
                let depth = self.depth_of(c);
                if let Some(v) = &mut self.offloaded {
                    v.push((hash, depth, seg_tokens));
                }
            }
            let n = &mut self.nodes[c as usize];
            let cut = (n.tokens as u64).min(tokens) as u32;
            n.tokens -= cut;
            n.computed = n.computed.min(n.tokens);
            let remaining = n.tokens;
            self.total_tokens -= cut as u64;
            self.evicted_tokens += cut as u64;
            tokens -= cut as u64;
            evicted += cut as u64;
            if let Some(ev) = events.as_deref_mut() {
                ev.push(EvictionEvent { path: self.path_of(c), remaining_tokens: remaining });
            }
            if remaining == 0 {
                // Out of the LRU before `remove` may put its parent in.
                self.lru.pop_first();
                self.remove(c);
            }
        }
        evicted
    }

    /// Segments from the root to `node` (0 for a child of the root).
    fn depth_of(&self, mut node: u32) -> u32 {
        let mut depth = 0;
        while self.nodes[node as usize].parent != ROOT {
            node = self.nodes[node as usize].parent;
            depth += 1;
        }
        depth
    }

    /// Segments from the root to `node`, `node`'s last.
    pub fn path_of(&self, mut node: u32) -> Vec<Segment> {
        let mut path = Vec::new();
        while node != ROOT {
            let n = &self.nodes[node as usize];
            path.push(n.segment);
            node = n.parent;
        }
        path.reverse();
        path
    }

    /// (path hash, parent's path hash (0 under the root), segment) of every node whose segment
    /// is wholly computed: what an engine's prefix cache holds as full blocks (the emulator
    /// publishes it as KV events).
    pub fn computed_segments(&self) -> impl Iterator<Item = (u64, u64, Segment)> + '_ {
        self.children.values().filter_map(|&c| {
            let n = &self.nodes[c as usize];
            (n.computed == n.segment.tokens).then(|| (n.path_hash, self.nodes[n.parent as usize].path_hash, n.segment))
        })
    }

    /// (path hash, tokens) of every node holding tokens.
    pub fn contents(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.children.values().map(|&c| {
            let n = &self.nodes[c as usize];
            (n.path_hash, n.tokens)
        })
    }

    /// Checks the accounting against the tree (debug builds and tests; O(nodes)).
    pub fn check(&self) {
        let mut total = 0u64;
        let mut pinned = 0u64;
        for c in self.children.values().copied().chain([ROOT]) {
            let n = &self.nodes[c as usize];
            if n.hint != NO_HINT {
                let id = self.nodes[n.hint as usize].segment.id;
                assert_eq!(self.children.get(&(c, id)), Some(&n.hint), "node {c}'s hint is not its child: {n:?}");
            }
            if c == ROOT {
                continue;
            }
            assert!(n.computed <= n.tokens && n.tokens <= n.segment.tokens, "node {c}: {n:?}");
            assert!(n.pins > 0 || n.computed == n.tokens, "unpinned node {c} not fully computed: {n:?}");
            total += n.tokens as u64;
            if n.pins > 0 {
                pinned += n.tokens as u64;
            }
            assert_eq!(
                n.pins == 0 && n.children == 0,
                self.lru.contains(&(n.last_used, c)),
                "lru membership of {c}: {n:?}"
            );
        }
        assert!(self.lru.first.is_none_or(|f| self.lru.set.first() == Some(&f)), "the LRU's first key is stale");
        assert_eq!(total, self.total_tokens, "total tokens");
        assert_eq!(pinned, self.pinned_tokens, "pinned tokens");
    }
}

#[cfg(test)]
#[path = "prefix_cache_tests.rs"]
mod tests;
