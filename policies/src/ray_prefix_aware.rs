//! `ray_prefix_aware`: Ray Serve LLM's prefix-aware request router
//! (`PrefixCacheAffinityRouter`, class `PrefixAwarePow2ReplicaRouter`).
//!
//! Algorithm (per request; queue length = requests the router sent to a replica and has not
//! seen finish — Ray's replica queue-length cache, incremented on send, decremented on done):
//! 1. If `max − min > imbalanced_threshold` over the replicas' queue lengths: power of two —
//!    two distinct replicas at random, the shorter queue (the first drawn on ties).
//! 2. Otherwise match the prompt on the router's prefix tree (every prompt it routed, under the
//!    replica it went to; trimmed as in the last paragraph). `rate` = longest match / prompt length.
//!    `rate ≥ match_rate_threshold`: candidates = the replicas with that longest match;
//!    otherwise the replicas whose share of the tree is smallest.
//! 3. Among the candidates, the shortest queue, ties uniformly at random.
//! 4. Record the prompt under the chosen replica.
//!
//! Eviction (Ray's `PrefixTree._run_eviction_loop`): every `eviction_interval_s`, each replica
//! whose share of the tree holds more than `eviction_threshold_tokens` loses its least recently
//! used leaves until it holds at most `eviction_target_tokens`. Here the check runs at the first
//! decision at or after each interval's end (the tree is read only then).
//!
//! Parameters (defaults): `imbalanced_threshold` 10, `match_rate_threshold` 0.1,
//! `do_eviction` true, `eviction_interval_s` 10, `eviction_threshold_tokens` 67,108,864 (2^26),
//! `eviction_target_tokens` 90% of the threshold (60,397,977).
//!
//! Source: ray-project/ray @ ff32243d,
//! `python/ray/llm/_internal/serve/request_router/prefix_aware/prefix_aware_router.py`
//! (`_prefix_match_best_replicas`, `on_request_routed`), `.../prefix_aware/prefix_tree.py`
//! (`prefix_match`, `get_smallest_tenants`), and
//! `python/ray/serve/_private/request_router/request_router.py` (candidates: the one with the
//! lowest queue length; queue-length cache `on_send_request` / `decrement_queue_len_cache`);
//! eviction: `prefix_aware_router.py` `initialize_state` (`do_eviction` False,
//! `eviction_threshold_chars` 400,000, `eviction_target_chars` 360,000, `eviction_interval_secs`
//! 10) and `prefix_tree.py` @ 81c8c490 (`start_eviction_loop`, `evict_tenant_by_lru`).
//!
//! Replicas coming and going (`on_replica_change`: crashes, autoscaling): state is kept by id
//! (`index::members`); a replica that leaves loses its tree and its queue-length entry, as
//! Ray's router removes a dead or removed replica's tenant (`PrefixCacheAffinityRouter`:
//! `on_replica_actor_died` and `update_replicas` → `_tree_actor.remove_tenants`, same file and
//! commit) and drops it from the queue-length cache; one that joins starts with none.
//!
//! Deviations, and why: Ray's tree holds characters of the concatenated message contents;
//! here it holds the prompt's segments (toolkit `PrefixTree`), so match and tree size are in
//! tokens. Ray returns *all* best candidates and takes the shortest queue among them (not a
//! two-sample among them); ties, which Ray resolves by set order, are uniform here. Ray's
//! eviction is off by default, and its tree then grows with every distinct prompt; here it is on
//! with a threshold of 2^26 tokens a replica (the bound `sglang_cache_aware` uses, 2^26 being
//! SGLang's `max_tree_size`), which no shipped workload reaches, so their results are those of
//! Ray's defaults (docs/performance.md, "Bounded router state"). Ray's own on-values, 400,000
//! and 360,000 characters, are `eviction_threshold_tokens: 100000, eviction_target_tokens:
//! 90000` at 4 characters a token; `do_eviction: false` is Ray's default, unbounded. Ray evicts
//! every node stamped with the oldest time together; here leaves go whole, oldest first
//! (`PrefixTree::evict_lru`), and a node is a segment, not a run of characters.

use rand::RngExt;
use routelab_policy_api::*;
use serde::{Deserialize, Serialize};

use crate::index::members::{Member, Members};

#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub imbalanced_threshold: u32,
    pub match_rate_threshold: f64,
    pub do_eviction: bool,
    pub eviction_interval_s: f64,
    pub eviction_threshold_tokens: u64,
    /// `None`: 90% of the threshold (Ray's 360,000 of 400,000).
    pub eviction_target_tokens: Option<u64>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            imbalanced_threshold: 10,
            match_rate_threshold: 0.1,
            do_eviction: true,
            eviction_interval_s: 10.0,
            eviction_threshold_tokens: 1 << 26,
            eviction_target_tokens: None,
        }
    }
}

pub struct RayPrefixAware {
    cfg: Config,
    rng: PolicyRng,
    /// Per id (`index::members`): the tree's tenants, the queue lengths, the matches.
    tree: PrefixTree,
    queue: Vec<u32>,
    matches: Vec<u32>,
    members: Members,
    candidates: Vec<usize>,
    pow2_decisions: u64,
    match_decisions: u64,
    smallest_tree_decisions: u64,
    /// Tokens a replica's share is trimmed to once over the threshold.
    eviction_target: u64,
    next_eviction_at: f64,
    evicted_tokens: u64,
}

impl Policy for RayPrefixAware {
    const NAME: &'static str = "ray_prefix_aware";
    const DESCRIPTION: &'static str =
        "Ray Serve LLM prefix-aware router: power of two when queues spread > 10, else best match or smallest tree";
    type Config = Config;
    type Context = RouterContext;
    fn new(cfg: Config, ctx: &RouterContext) -> Result<Self, String> {
        if !(0.0..=1.0).contains(&cfg.match_rate_threshold) {
            return Err(format!("match_rate_threshold must be in [0, 1] (got {})", cfg.match_rate_threshold));
        }
        if !(cfg.eviction_interval_s > 0.0 && cfg.eviction_interval_s.is_finite()) {
            return Err(format!("eviction_interval_s must be positive (got {})", cfg.eviction_interval_s));
        }
        let eviction_target =
            cfg.eviction_target_tokens.unwrap_or((cfg.eviction_threshold_tokens as u128 * 9 / 10) as u64);
        if eviction_target > cfg.eviction_threshold_tokens {
            return Err(format!(
                "eviction_target_tokens ({eviction_target}) must not exceed eviction_threshold_tokens ({})",
                cfg.eviction_threshold_tokens
            ));
        }
        let n = ctx.replica_count();
        Ok(Self {
            rng: policy_rng(ctx.seed),
            tree: PrefixTree::without_hash_index(n),
            queue: vec![0; n],
            matches: vec![0; n],
            members: Members::new(n),
            candidates: Vec::with_capacity(n),
            pow2_decisions: 0,
            match_decisions: 0,
            smallest_tree_decisions: 0,
            eviction_target,
            next_eviction_at: cfg.eviction_interval_s,
            evicted_tokens: 0,
            cfg,
        })
    }
}

impl RayPrefixAware {
    /// The queue length of routable index `i`.
    fn queue(&self, i: usize) -> u32 {
        self.queue[self.members.id(i)]
    }

    fn power_of_two(&mut self, n: usize) -> usize {
        let a = self.rng.random_range(0..n);
        if n == 1 {
            return a;
        }
        let mut b = self.rng.random_range(0..n - 1);
        if b >= a {
            b += 1;
        }
        if self.queue(b) < self.queue(a) { b } else { a }
    }

    /// Ray's eviction loop, for every interval that ended by `now`.
    fn evict_due(&mut self, now: f64) {
        while now >= self.next_eviction_at {
            for r in 0..self.queue.len() {
                let held = self.tree.held_tokens(r);
                if held > self.cfg.eviction_threshold_tokens {
                    self.evicted_tokens += self.tree.evict_lru(r, held - self.eviction_target);
                }
            }
            self.next_eviction_at += self.cfg.eviction_interval_s;
        }
    }
}

impl RouterPolicy for RayPrefixAware {
    fn route(&mut self, request: &Request<'_>, replicas: &Replicas<'_>) -> usize {
        if self.cfg.do_eviction {
            self.evict_due(request.arrived_at);
        }
        let n = replicas.len();
        let (lo, hi) = (0..n).map(|i| self.queue(i)).fold((u32::MAX, 0), |(a, b), q| (a.min(q), b.max(q)));
        if hi - lo > self.cfg.imbalanced_threshold {
            self.pow2_decisions += 1;
            return self.power_of_two(n);
        }
        self.tree.match_each(request.segments(), &mut self.matches);
        let (members, matches) = (&self.members, &self.matches);
        let matched = |i: usize| matches[members.id(i)];
        let best = (0..n).map(matched).max().unwrap_or(0);
        let rate = if request.prompt_tokens == 0 { 0.0 } else { best as f64 / request.prompt_tokens as f64 };
        self.candidates.clear();
        if rate >= self.cfg.match_rate_threshold {
            self.match_decisions += 1;
            self.candidates.extend((0..n).filter(|&i| matched(i) == best));
        } else {
            self.smallest_tree_decisions += 1;
            let held = |i: usize| self.tree.held_tokens(members.id(i));
            let smallest = (0..n).map(held).min().unwrap_or(0);
            self.candidates.extend((0..n).filter(|&i| held(i) == smallest));
        }
        let queues = self.candidates.iter().map(|&i| self.queue[self.members.id(i)]);
        let k = argmin_random_tie(queues, &mut self.rng).expect("candidates");
        self.candidates[k]
    }

    fn on_dispatch(&mut self, request: &Request<'_>, r: usize) {
        let id = self.members.place(request.id, r);
        self.queue[id] += 1;
        self.tree.insert(request.segments(), id);
    }

    fn on_complete(&mut self, c: &Completion) {
        if let Some(id) = self.members.finish(c.request_id) {
            let q = &mut self.queue[id];
            *q = q.saturating_sub(1);
        }
    }

    /// A replica that leaves is forgotten: its tenant and its queue length (upstream
    /// `remove_tenants`); one that joins starts with an empty tree.
    fn on_replica_change(&mut self, change: &ReplicaChange) {
        if let Some(Member::Left(id)) = self.members.change(change) {
            self.queue[id] = 0;
            let held = self.tree.held_tokens(id);
            self.tree.evict_lru(id, held);
        }
    }

    fn report(&self) -> Vec<(String, f64)> {
        vec![
            ("pow2_decisions".into(), self.pow2_decisions as f64),
            ("match_decisions".into(), self.match_decisions as f64),
            ("smallest_tree_decisions".into(), self.smallest_tree_decisions as f64),
            ("router_evicted_tokens".into(), self.evicted_tokens as f64),
        ]
    }
}
