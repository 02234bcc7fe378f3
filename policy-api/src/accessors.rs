//! Typed accessors on the boundary types: plain slices for their `RSlice` fields, `usize` indices
//! for their `u32` ones, and the figures policies otherwise compute with casts. Inherent methods
//! only (in impl blocks of their own, so the `#[repr(C)]` definitions in [`crate::types`] stay as
//! they are): they change no layout, cross no boundary, and are compiled into each plugin.

use crate::types::{Completion, Eviction, ReplicaView, Request, RouterContext, SchedulerContext, Segment, Waiting};

impl<'a> Request<'a> {
    /// The prompt's segments as a plain slice, for the lifetime of the data (the field
    /// `segments` is the ABI's `RSlice`).
    ///
    /// ```
    /// use routelab_policy_api::{Request, Segment};
    ///
    /// let prompt = [Segment { id: 1, tokens: 100 }, Segment { id: 2, tokens: 20 }];
    /// let request = Request::new(0, 0.0, 120).with_segments(&prompt).with_facts(&[2.0]);
    /// let tokens: u32 = request.segments().iter().map(|s| s.tokens).sum();
    /// assert_eq!((tokens, request.facts()), (request.prompt_tokens, &[2.0][..]));
    /// ```
    #[inline]
    pub fn segments(&self) -> &'a [Segment] {
        self.segments.as_slice()
    }

    /// The request facts the policy asked for, one per name in the order asked (see
    /// [`Request::fact`] for one of them).
    #[inline]
    pub fn facts(&self) -> &'a [f64] {
        self.facts.as_slice()
    }
}

impl<'a> Eviction<'a> {
    /// Segments from the root of the cache to the evicted node, the evicted one last, as a plain
    /// slice (what [`crate::PrefixTree::release_path`] takes).
    #[inline]
    pub fn path(&self) -> &'a [Segment] {
        self.path.as_slice()
    }

    /// The replica whose cache lost the content, as an index into the router's views.
    #[inline]
    pub fn replica_index(&self) -> usize {
        self.replica as usize
    }
}

impl Completion {
    /// The replica that served the request, as an index into the router's views (the index the
    /// router returned).
    #[inline]
    pub fn replica_index(&self) -> usize {
        self.replica as usize
    }
}

impl ReplicaView {
    /// KV cache tokens in use over capacity, in 0..=1 (0 where the capacity is 0: the dispatch
    /// world).
    ///
    /// ```
    /// use routelab_policy_api::ReplicaView;
    ///
    /// let v = ReplicaView { kv_used_tokens: 3_000, kv_capacity_tokens: 4_000, ..Default::default() };
    /// assert_eq!((v.kv_utilisation(), v.kv_free_tokens()), (0.75, 1_000));
    /// assert_eq!(ReplicaView::default().kv_utilisation(), 0.0);
    /// ```
    #[inline]
    pub fn kv_utilisation(&self) -> f64 {
        if self.kv_capacity_tokens == 0 { 0.0 } else { self.kv_used_tokens as f64 / self.kv_capacity_tokens as f64 }
    }

    /// KV cache tokens not in use (0, not a wrap-around, if a host ever reports more used than
    /// capacity).
    #[inline]
    pub fn kv_free_tokens(&self) -> u64 {
        self.kv_capacity_tokens.saturating_sub(self.kv_used_tokens)
    }
}

impl RouterContext {
    /// Number of replicas as a length: what per-replica state is sized with.
    ///
    /// ```
    /// use routelab_policy_api::{RouterContext, World};
    ///
    /// let ctx = RouterContext::new(World::Cluster, 4, 7);
    /// let in_flight = vec![0u32; ctx.replica_count()];
    /// assert_eq!(in_flight.len(), 4);
    /// ```
    #[inline]
    pub fn replica_count(&self) -> usize {
        self.replicas as usize
    }
}

impl SchedulerContext {
    /// Index of the replica this scheduler serves.
    #[inline]
    pub fn replica_index(&self) -> usize {
        self.replica as usize
    }
}

impl<'a> Waiting<'a> {
    /// The waiting requests as a plain slice, for the lifetime of the data (`Waiting` also
    /// dereferences to it, for the borrow's lifetime).
    #[inline]
    pub fn rows(&self) -> &'a [crate::types::WaitingRequest] {
        self.rows.as_slice()
    }

    /// Every request fact of waiting request `row`, in the order the scheduler asked for them.
    #[inline]
    pub fn facts_of(&self, row: usize) -> &'a [f64] {
        let k = self.fact_columns as usize;
        &self.facts.as_slice()[row * k..(row + 1) * k]
    }
}
