//! `threshold_affinity`: prefix affinity only when the match is worth it, otherwise load.
//!
//! Algorithm: if the best replica's `matched_tokens` (cache + in flight) covers at least
//! `threshold` of the prompt, go there (ties by least outstanding work); otherwise go to the
//! replica with the least outstanding work (ties uniformly at random).
//! Parameters: `threshold` (default 0.5), a fraction of the prompt in [0, 1].
//! Source: the routing lecture's middle ground between load balancing and affinity (docs/experiments.md);
//! the same rule, with the router's own approximate trees, is the heart of SGLang's
//! `cache_aware` policy (`sglang_cache_aware`).

use routelab_policy_api::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Minimum matched fraction of the prompt for an affinity decision.
    pub threshold: f64,
}

impl Default for Config {
    fn default() -> Self {
        Self { threshold: 0.5 }
    }
}

pub struct ThresholdAffinity {
    threshold: f64,
    rng: PolicyRng,
    affinity: u64,
    load: u64,
}

impl Policy for ThresholdAffinity {
    const NAME: &'static str = "threshold_affinity";
    const DESCRIPTION: &'static str = "best prefix match if it covers ≥ threshold of the prompt, else least work left";
    type Config = Config;
    type Context = RouterContext;
    fn new(c: Config, ctx: &RouterContext) -> Result<Self, String> {
        if !(0.0..=1.0).contains(&c.threshold) {
            return Err(format!("threshold must be in [0, 1] (got {})", c.threshold));
        }
        Ok(Self { threshold: c.threshold, rng: policy_rng(ctx.seed), affinity: 0, load: 0 })
    }
}

impl RouterPolicy for ThresholdAffinity {
    fn capabilities(&self) -> Capabilities {
        Capabilities::NEEDS_EXACT_MATCH | Capabilities::NEEDS_OUTSTANDING_WORK
    }

    fn route(&mut self, request: &Request<'_>, replicas: &Replicas<'_>) -> usize {
        let best = crate::max_affinity::best_match(replicas);
        let matched = replicas[best].matched_tokens as f64;
        if request.prompt_tokens > 0 && matched > 0.0 && matched >= self.threshold * request.prompt_tokens as f64 {
            self.affinity += 1;
            best
        } else {
            self.load += 1;
            argmin_random_tie(replicas.iter().map(|r| r.outstanding_work), &mut self.rng).expect("replicas")
        }
    }

    fn report(&self) -> Vec<(String, f64)> {
        vec![("affinity_decisions".into(), self.affinity as f64), ("load_decisions".into(), self.load as f64)]
    }
}
