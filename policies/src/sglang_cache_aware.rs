//! `sglang_cache_aware`: the SGLang model gateway's `cache_aware` policy.
//!
//! Algorithm (per request):
//! 1. Load = the router's own count of in-flight requests per replica (+1 at dispatch, −1 at
//!    completion). If `max − min > balance_abs_threshold` AND `max > balance_rel_threshold · min`,
//!    the system is imbalanced: go to the least-loaded replica (lowest index on ties;
//!    `imbalanced: least_load`). With `imbalanced: keep_affinity` (SGLang PR #32195), look
//!    instead among the replicas with load ≤ `min + balance_abs_threshold` for the longest
//!    match on the router's tree (ties to the lower load, then the lowest index) and go there;
//!    only when none of them matches any token, go to the least-loaded replica as before.
//! 2. Otherwise match the prompt on the router's *approximate* tree — built only from what it
//!    dispatched, never asking the replicas. If the best replica's match rate (matched / prompt
//!    tokens) exceeds `cache_threshold`, go there (ties by load).
//! 3. Otherwise go to the least-loaded replica (`below_threshold: least_load`, current SGLang) or
//!    to the replica with the smallest tree (`smallest_tree`, older SGLang).
//!
//! The request is recorded in the chosen replica's tree in every branch. Every
//! `eviction_interval_s`, trees above `max_tree_tokens` are trimmed least-recently-used first;
//! the check runs at the first decision at or after each interval's end (the tree is read only at
//! decisions, so this is exactly a scheduled event, with no thread). The trees therefore drift
//! from the real caches: exercise 8 measures how far.
//!
//! Upstream's bound is the same (`sgl-router/src/policies/tree.rs` @ 026f853b,
//! `evict_tenant_by_size`, called by a thread every `eviction_interval_secs`): LRU leaves per
//! tenant until it holds at most `max_tree_size` characters (the trim goes down to the bound, not
//! below it). At the default 2^26 a tool_use replica reaches it after ≈ 300k requests, so memory
//! grows by a tree node, ≈ 137 bytes, per request until then (docs/performance.md,
//! "sglang_cache_aware's day"); a smaller `max_tree_tokens` bounds it sooner but changes decisions
//! once it trims. The tree is made without the toolkit's hash index, which it never reads.
//!
//! Parameters (defaults): `cache_threshold` 0.5, `balance_abs_threshold` 8,
//! `balance_rel_threshold` 1.5, `eviction_interval_s` 120, `max_tree_tokens` 67,108,864,
//! `below_threshold` least_load.
//!
//! Which defaults: neither of SGLang's two sets, but the lecture's mix. SGLang's command line
//! (`router_args.py`; the gateway's `main.rs` flags) uses 0.3 / 64 / 1.5 /
//! 120 s / 2^26; the Rust library's `CacheAwareConfig::default()` uses 0.5 / 32 / 1.1 / 30 s /
//! 10,000. Here `cache_threshold` is the library's, `balance_rel_threshold`, the eviction
//! interval and the tree size are the CLI's (2^26 counted in tokens here, characters there), and
//! `balance_abs_threshold` 8 is the lecture's simplification. For the CLI set pass
//! `sglang_cache_aware{cache_threshold: 0.3, balance_abs_threshold: 64}`.
//!
//! Source: SGLang router `sgl-router/src/policies/cache_aware.rs` @ 026f853b: the load guard
//! (`max − min > abs` AND `max > rel · min`, over the router's in-flight counts) and, below the
//! threshold, the smallest tenant tree (`below_threshold: smallest_tree`). SGLang model gateway
//! `smg` 1.13.0 (`src/policies/cache_aware.rs`) routes below the threshold by LeastLoad's
//! expected wait (`least_load` here approximates it by in-flight count) and has replaced the
//! guard by a spill gate against the fleet *mean* load; that gate is not modelled.
//!
//! Replicas coming and going (`on_replica_change`: autoscaling, crashes): the router's state is
//! kept by id (`index::members`); a replica that leaves loses its tree and its load count, as
//! upstream's `remove_worker` removes the worker's tenant from the tree (`tree.remove_tenant`,
//! `sgl-router/src/policies/cache_aware.rs` @ b6f20641), and one that joins starts empty
//! (`add_worker` inserts an empty prefix for it), so no stale affinity outlives a replica.
//!
//! `imbalanced: keep_affinity` follows sgl-project/sglang PR #32195 ("Keep cache affinity during
//! cache-aware load rebalancing", open at the time of writing): an imbalance used to discard all
//! locality, so every request routed during one paid a full prefill even when a lightly loaded
//! worker held its prefix; the PR keeps the longest cached prefix within the near-minimum-load
//! window `load ≤ min_load + balance_abs_threshold`, ties to the lighter worker, and falls back
//! to the shortest queue only when no worker in the window holds any of the prompt. SGLang PR
//! #33138 (merged 2026-07-31) breaks the least-load ties at random; routelab keeps the lowest
//! index, as shipped workloads' numbers rest on it.

use routelab_policy_api::*;
use serde::{Deserialize, Serialize};

use crate::index::members::{Member, Members};

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum BelowThreshold {
    LeastLoad,
    SmallestTree,
}

/// What an imbalanced fleet does.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Imbalanced {
    /// The least-loaded replica, locality dropped (SGLang's rule).
    LeastLoad,
    /// The longest match among the near-least-loaded replicas (SGLang PR #32195).
    KeepAffinity,
}

#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub cache_threshold: f64,
    pub balance_abs_threshold: u32,
    pub balance_rel_threshold: f64,
    pub eviction_interval_s: f64,
    pub max_tree_tokens: u64,
    pub below_threshold: BelowThreshold,
    pub imbalanced: Imbalanced,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            cache_threshold: 0.5,
            balance_abs_threshold: 8,
            balance_rel_threshold: 1.5,
            eviction_interval_s: 120.0,
            max_tree_tokens: 1 << 26,
            below_threshold: BelowThreshold::LeastLoad,
            imbalanced: Imbalanced::LeastLoad,
        }
    }
}

pub struct SglangCacheAware {
    cfg: Config,
    tree: PrefixTree,
    /// Per id (`index::members`): in-flight requests; `tree`'s tenants are ids too.
    in_flight: Vec<u32>,
    members: Members,
    next_eviction_at: f64,
    matches: Vec<u32>,
    cache_decisions: u64,
    balance_decisions: u64,
    below_threshold_decisions: u64,
    kept_affinity_decisions: u64,
    evicted_tokens: u64,
}

impl Policy for SglangCacheAware {
    const NAME: &'static str = "sglang_cache_aware";
    const DESCRIPTION: &'static str =
        "SGLang router: own approximate prefix trees, cache threshold, abs+rel load guard";
    type Config = Config;
    type Context = RouterContext;
    fn new(cfg: Config, ctx: &RouterContext) -> Result<Self, String> {
        if !(0.0..=1.0).contains(&cfg.cache_threshold) {
            return Err(format!("cache_threshold must be in [0, 1] (got {})", cfg.cache_threshold));
        }
        if !(cfg.balance_rel_threshold >= 1.0) {
            return Err(format!("balance_rel_threshold must be ≥ 1 (got {})", cfg.balance_rel_threshold));
        }
        if !(cfg.eviction_interval_s > 0.0) {
            return Err(format!("eviction_interval_s must be positive (got {})", cfg.eviction_interval_s));
        }
        let n = ctx.replica_count();
        Ok(Self {
            next_eviction_at: cfg.eviction_interval_s,
            cfg,
            tree: PrefixTree::without_hash_index(n),
            in_flight: vec![0; n],
            members: Members::new(n),
            matches: vec![0; n],
            cache_decisions: 0,
            balance_decisions: 0,
            below_threshold_decisions: 0,
            kept_affinity_decisions: 0,
            evicted_tokens: 0,
        })
    }
}

impl SglangCacheAware {
    /// The in-flight count of routable index `i`.
    fn load(&self, i: usize) -> u32 {
        self.in_flight[self.members.id(i)]
    }

    /// The least-loaded of the `n` routable replicas (lowest index on ties).
    fn least_loaded(&self, n: usize) -> usize {
        (0..n).min_by_key(|&i| self.load(i)).expect("replicas")
    }

    fn evict_due(&mut self, now: f64) {
        while now >= self.next_eviction_at {
            for r in 0..self.tree.replicas() {
                let held = self.tree.held_tokens(r);
                if held > self.cfg.max_tree_tokens {
                    self.evicted_tokens += self.tree.evict_lru(r, held - self.cfg.max_tree_tokens);
                }
            }
            self.next_eviction_at += self.cfg.eviction_interval_s;
        }
    }

    /// PR #32195's imbalanced pick: the longest match among the replicas with load ≤ `min +
    /// balance_abs_threshold`, ties to the lower load then the lowest index; `None` when none of
    /// them matches any token.
    fn keep_affinity(&mut self, request: &Request<'_>, min: u32, n: usize) -> Option<usize> {
        self.tree.match_each(request.segments(), &mut self.matches);
        let window = min.saturating_add(self.cfg.balance_abs_threshold);
        let matched = |r: usize| self.matches[self.members.id(r)];
        let mut best: Option<usize> = None;
        for r in (0..n).filter(|&r| self.load(r) <= window) {
            let better = match best {
                None => true,
                Some(b) => matched(r) > matched(b) || (matched(r) == matched(b) && self.load(r) < self.load(b)),
            };
            if better {
                best = Some(r);
            }
        }
        best.filter(|&b| matched(b) > 0)
    }

    /// The router's belief of how many of `segments`' tokens replica `r` has cached.
    pub fn believed_match(&self, segments: &[Segment], r: usize) -> u32 {
        self.tree.match_tokens(segments, self.members.id(r))
    }
}

impl RouterPolicy for SglangCacheAware {
    fn route(&mut self, request: &Request<'_>, replicas: &Replicas<'_>) -> usize {
        self.evict_due(request.arrived_at);
        let n = replicas.len();
        let (min, max) = (0..n).map(|i| self.load(i)).fold((u32::MAX, 0), |(lo, hi), l| (lo.min(l), hi.max(l)));
        if max - min > self.cfg.balance_abs_threshold && max as f64 > self.cfg.balance_rel_threshold * min as f64 {
            self.balance_decisions += 1;
            if self.cfg.imbalanced == Imbalanced::KeepAffinity {
                if let Some(r) = self.keep_affinity(request, min, n) {
                    self.kept_affinity_decisions += 1;
                    return r;
                }
            }
            return self.least_loaded(n);
        }
        self.tree.match_each(request.segments(), &mut self.matches);
        let matched = |i: usize| self.matches[self.members.id(i)];
        let mut best = 0;
        for i in 1..n {
            if matched(i) > matched(best) || (matched(i) == matched(best) && self.load(i) < self.load(best)) {
                best = i;
            }
        }
        let rate = if request.prompt_tokens == 0 { 0.0 } else { matched(best) as f64 / request.prompt_tokens as f64 };
        if rate > self.cfg.cache_threshold {
            self.cache_decisions += 1;
            return best;
        }
        self.below_threshold_decisions += 1;
        match self.cfg.below_threshold {
            BelowThreshold::LeastLoad => self.least_loaded(n),
            BelowThreshold::SmallestTree => {
                (0..n).min_by_key(|&i| self.tree.held_tokens(self.members.id(i))).expect("replicas")
            }
        }
    }

    fn on_dispatch(&mut self, request: &Request<'_>, replica: usize) {
        let id = self.members.place(request.id, replica);
        self.in_flight[id] += 1;
        self.tree.insert(request.segments(), id);
    }

    fn on_complete(&mut self, c: &Completion) {
        // A replica that left since (its state dropped) is nobody's now.
        if let Some(id) = self.members.finish(c.request_id) {
            let l = &mut self.in_flight[id];
            *l = l.saturating_sub(1);
        }
    }

    /// A replica that leaves is forgotten, its tree and its load (upstream `remove_worker` →
    /// `tree.remove_tenant`); one that joins starts with an empty tree (`add_worker` inserts
    /// the empty string for it).
    fn on_replica_change(&mut self, change: &ReplicaChange) {
        if let Some(Member::Left(id)) = self.members.change(change) {
            self.in_flight[id] = 0;
            let held = self.tree.held_tokens(id);
            self.tree.evict_lru(id, held);
        }
    }

    fn report(&self) -> Vec<(String, f64)> {
        let n = self.tree.replicas().max(1) as f64;
        let tree_tokens: u64 = (0..self.tree.replicas()).map(|r| self.tree.held_tokens(r)).sum();
        vec![
            ("cache_decisions".into(), self.cache_decisions as f64),
            ("balance_decisions".into(), self.balance_decisions as f64),
            ("below_threshold_decisions".into(), self.below_threshold_decisions as f64),
            ("kept_affinity_decisions".into(), self.kept_affinity_decisions as f64),
            ("router_tree_tokens_mean".into(), tree_tokens as f64 / n),
            ("router_evicted_tokens".into(), self.evicted_tokens as f64),
        ]
    }
}
