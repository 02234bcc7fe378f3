//! `power_of_two` (power of d choices): sample `d` distinct replicas uniformly, join the one with
//! the fewest outstanding requests.
//!
//! Algorithm: draw `d` distinct indices (partial Fisher–Yates over a scratch permutation, O(d));
//! pick the one with the fewest `outstanding_requests`, the first sampled on ties.
//! Parameters: `d` (default 2; 1 is random, N is JSQ).
//! Source: Mitzenmacher, "The Power of Two Choices in Randomized Load Balancing" (1996/2001);
//! Azar, Broder, Karlin, Upfal (1994): maximum load ln ln n / ln d + O(1) in balls-into-bins.
//! Under stale information it barely degrades, unlike JSQ (Mitzenmacher 2000).

use rand::RngExt;
use routelab_policy_api::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Replicas sampled per request.
    pub d: u32,
}

impl Default for Config {
    fn default() -> Self {
        Self { d: 2 }
    }
}

pub struct PowerOfTwo {
    d: usize,
    rng: PolicyRng,
    /// Scratch permutation of 0..N, kept between calls; only its first d entries are shuffled.
    perm: Vec<u32>,
}

impl Policy for PowerOfTwo {
    const NAME: &'static str = "power_of_two";
    const DESCRIPTION: &'static str = "least loaded of d sampled replicas (d = 2 by default)";
    type Config = Config;
    type Context = RouterContext;
    fn new(cfg: Config, ctx: &RouterContext) -> Result<Self, String> {
        if cfg.d == 0 {
            return Err("d must be at least 1 (1 is random, the replica count is JSQ)".into());
        }
        Ok(Self { d: cfg.d as usize, rng: policy_rng(ctx.seed), perm: (0..ctx.replicas).collect() })
    }
}

impl RouterPolicy for PowerOfTwo {
    fn route(&mut self, _: &Request<'_>, replicas: &Replicas<'_>) -> usize {
        let n = replicas.len();
        if self.perm.len() != n {
            self.perm = (0..n as u32).collect();
        }
        let d = self.d.min(n);
        let mut best = usize::MAX;
        let mut best_load = u32::MAX;
        for k in 0..d {
            let j = self.rng.random_range(k..n);
            self.perm.swap(k, j);
            let i = self.perm[k] as usize;
            if replicas[i].outstanding_requests < best_load {
                best = i;
                best_load = replicas[i].outstanding_requests;
            }
        }
        best
    }
}
