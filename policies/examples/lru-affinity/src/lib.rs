//! `lru_affinity`: a prefix-aware router written only against routelab-policy-api and its
//! toolkit — the example of a user policy that keeps its own picture of every replica's cache.
//!
//! Algorithm: the router records each dispatched prompt in a [`PrefixTree`] under the replica it
//! chose, and trims each replica's share of the tree least-recently-used first whenever it exceeds
//! `cache_fraction` × the replica's KV capacity — a model of the replica's own LRU cache, with no
//! eviction events needed. A request goes to the replica whose modelled cache matches the most of
//! its prompt when that covers at least `min_match` of it and that replica has at most `slack`
//! more outstanding requests than the least loaded; otherwise to the least loaded.
//! Parameters (defaults): `min_match` 0.5, `slack` 4, `cache_fraction` 0.9.
//! Source: a teaching example for routelab (compare it with `sglang_cache_aware`, whose tree is
//! trimmed on a timer, and `preble`, which listens to real evictions).
//!
//! Build: `cargo build --release`; load: `routelab compare WORKLOAD --policies
//! ./target/release/liblru_affinity.so,sglang_cache_aware`.

use routelab_policy_api::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub min_match: f64,
    pub slack: u32,
    pub cache_fraction: f64,
}

impl Default for Config {
    fn default() -> Self {
        Self { min_match: 0.5, slack: 4, cache_fraction: 0.9 }
    }
}

pub struct LruAffinity {
    cfg: Config,
    budget_tokens: u64,
    tree: PrefixTree,
    matches: Vec<u32>,
    affinity: u64,
    load: u64,
}

impl Policy for LruAffinity {
    const NAME: &'static str = "lru_affinity";
    const DESCRIPTION: &'static str = "longest match in a modelled LRU cache per replica, with a load slack";
    type Config = Config;
    type Context = RouterContext;
    fn new(cfg: Config, ctx: &RouterContext) -> Result<Self, String> {
        if !(0.0..=1.0).contains(&cfg.min_match) || !(cfg.cache_fraction > 0.0) {
            return Err("min_match must be in [0, 1] and cache_fraction positive".into());
        }
        let budget = if ctx.kv_capacity_tokens == 0 {
            u64::MAX
        } else {
            (ctx.kv_capacity_tokens as f64 * cfg.cache_fraction) as u64
        };
        Ok(Self {
            cfg,
            budget_tokens: budget,
            tree: PrefixTree::new(ctx.replica_count()),
            matches: vec![0; ctx.replica_count()],
            affinity: 0,
            load: 0,
        })
    }
}

impl RouterPolicy for LruAffinity {
    fn route(&mut self, request: &Request<'_>, replicas: &Replicas<'_>) -> usize {
        let least = (0..replicas.len()).min_by_key(|&i| replicas[i].outstanding_requests).expect("replicas");
        self.tree.match_each(request.segments(), &mut self.matches);
        let best = (0..replicas.len()).max_by_key(|&i| (self.matches[i], std::cmp::Reverse(i))).expect("replicas");
        let covers =
            request.prompt_tokens > 0 && self.matches[best] as f64 >= self.cfg.min_match * request.prompt_tokens as f64;
        let calm = replicas[best].outstanding_requests <= replicas[least].outstanding_requests + self.cfg.slack;
        if covers && calm {
            self.affinity += 1;
            best
        } else {
            self.load += 1;
            least
        }
    }

    fn on_dispatch(&mut self, request: &Request<'_>, replica: usize) {
        self.tree.insert(request.segments(), replica);
        let held = self.tree.held_tokens(replica);
        if held > self.budget_tokens {
            self.tree.evict_lru(replica, held - self.budget_tokens);
        }
    }

    fn report(&self) -> Vec<(String, f64)> {
        vec![("affinity_decisions".into(), self.affinity as f64), ("load_decisions".into(), self.load as f64)]
    }
}

fn registry() -> Vec<Entry> {
    vec![router::<LruAffinity>()]
}

export_policies!(registry);
