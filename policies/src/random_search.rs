//! `random_search`: evaluate random allocations up to a budget and keep the best.
//!
//! Algorithm: evaluate the starting allocation (given, else seeded random), then distinct
//! allocations drawn uniformly at random (no allocation twice) until `evaluations` are spent or
//! the space is exhausted; return the one with the highest training accuracy, the first
//! evaluated on ties.
//!
//! Parameters: `evaluations` (default: the run's budget if it has one, else 2·K·L — about what
//! LLMSelector spends when it improves L times and then confirms for L rounds).
//!
//! Source: the random-search baseline of LLMSelector (Chen, Davis, Hanin, Bailis, Zaharia, Zou,
//! Stoica 2025; github.com/LLMSELECTOR/LLMSELECTOR), compared at an equal budget.

use std::collections::HashSet;

use rand::RngExt;
use routelab_policy_api::*;
use serde::{Deserialize, Serialize};

use crate::selection::{accuracy, space_size, start_allocation};

#[derive(Serialize, Deserialize, Debug, Clone, Default)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Allocations to evaluate; omitted: the run's budget, else 2·K·L.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub evaluations: Option<u64>,
}

pub struct RandomSearch {
    config: Config,
    rng: PolicyRng,
}

impl Policy for RandomSearch {
    const NAME: &'static str = "random_search";
    const DESCRIPTION: &'static str = "random allocations up to a budget, keep the best";
    type Config = Config;
    type Context = SelectorContext;
    fn new(config: Config, ctx: &SelectorContext) -> Result<Self, String> {
        if config.evaluations == Some(0) {
            return Err("evaluations must be at least 1".into());
        }
        Ok(Self { config, rng: policy_rng(ctx.seed) })
    }
}

impl SelectorPolicy for RandomSearch {
    fn select(&mut self, problem: &Problem, evaluator: &mut dyn EvaluateFn) -> Result<Vec<u32>, String> {
        let (k, l) = (problem.models.len(), problem.modules.len());
        let start = start_allocation(problem, &mut self.rng)?;
        let wanted = self.config.evaluations.or(problem.budget.into_option()).unwrap_or(2 * (k * l) as u64);
        let n = [Some(wanted), evaluator.remaining(), space_size(k, l)].into_iter().flatten().min().unwrap_or(wanted);
        let mut seen: HashSet<Vec<u32>> = HashSet::new();
        let mut best = (f64::NEG_INFINITY, start.clone());
        let mut next = start;
        for _ in 0..n {
            let acc = accuracy(&evaluator.evaluate(&next)?);
            if acc > best.0 {
                best = (acc, next.clone());
            }
            seen.insert(next.clone());
            // `n` never exceeds the space, so an unseen allocation exists while more are wanted.
            while seen.len() < n as usize && seen.contains(&next) {
                next = (0..l).map(|_| self.rng.random_range(0..k as u32)).collect();
            }
        }
        Ok(best.1)
    }
}
