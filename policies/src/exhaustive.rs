//! `exhaustive`: evaluate every one of the K^L allocations and keep the best.
//!
//! Algorithm: enumerate allocations in lexicographic order (module 0 most significant), evaluate
//! each on the training set, return the highest training accuracy (the first on ties). Its
//! constructor refuses, with an error that says what to do, when K^L (from the context's problem
//! shape) is above `max_allocations` or above the budget: bad input, before any run.
//! The starting allocation plays no part.
//!
//! Parameters: `max_allocations` (default 100000; 10 models × 6 modules is 10^6).
//!
//! Source: the exhaustive-search reference of LLMSelector (Chen et al. 2025; the open-source
//! `OptimizerFullSearch`, github.com/LLMSELECTOR/LLMSELECTOR, which shuffles and truncates to its
//! budget instead of refusing).

use routelab_policy_api::*;
use serde::{Deserialize, Serialize};

use crate::selection::{accuracy, space_size};

#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Largest K^L this selector will enumerate.
    pub max_allocations: u64,
}

impl Default for Config {
    fn default() -> Self {
        Self { max_allocations: 100_000 }
    }
}

/// The guard of [`Exhaustive`]: `Err` with what to do when `models^modules` is above
/// `max_allocations`, else the size of the space.
pub fn check_space(models: usize, modules: usize, max_allocations: u64) -> Result<u64, String> {
    match space_size(models, modules) {
        Some(n) if n <= max_allocations => Ok(n),
        n => Err(format!(
            "exhaustive search over {} allocations ({models} models ^ {modules} modules) is above its guard \
             max_allocations = {max_allocations}; raise it (exhaustive{{max_allocations: N}}) or use llmselector",
            n.map_or("more than 2^64".to_string(), |n| n.to_string())
        )),
    }
}

/// Checks the space `models^modules` against the guard and the budget.
fn check(models: usize, modules: usize, budget: Option<u64>, max_allocations: u64) -> Result<u64, String> {
    let space = check_space(models, modules, max_allocations)?;
    match budget {
        Some(left) if left < space => Err(format!(
            "exhaustive search needs {space} evaluations but the budget leaves {left}; raise or remove the budget"
        )),
        _ => Ok(space),
    }
}

/// The selector; see the module docs.
pub struct Exhaustive {
    config: Config,
}

impl Policy for Exhaustive {
    const NAME: &'static str = "exhaustive";
    const DESCRIPTION: &'static str = "every allocation (K^L), refused above max_allocations";
    type Config = Config;
    type Context = SelectorContext;
    fn new(config: Config, ctx: &SelectorContext) -> Result<Self, String> {
        check(ctx.models as usize, ctx.modules as usize, ctx.budget.into_option(), config.max_allocations)?;
        Ok(Self { config })
    }
}

impl SelectorPolicy for Exhaustive {
    fn select(&mut self, problem: &Problem, evaluator: &mut dyn EvaluateFn) -> Result<Vec<u32>, String> {
        let (k, l) = (problem.models.len(), problem.modules.len());
        // The problem is authoritative; the context's shape only let the constructor refuse early.
        check(k, l, evaluator.remaining(), self.config.max_allocations)?;
        if k == 0 || l == 0 {
            return Err(format!("nothing to select: {k} models, {l} modules"));
        }
        let mut a = vec![0u32; l];
        let mut best = (f64::NEG_INFINITY, a.clone());
        loop {
            let acc = accuracy(&evaluator.evaluate(&a)?);
            if acc > best.0 {
                best = (acc, a.clone());
            }
            // Next allocation, odometer style; done when it wraps.
            let mut j = l;
            loop {
                if j == 0 {
                    return Ok(best.1);
                }
                j -= 1;
                a[j] += 1;
                if (a[j] as usize) < k {
                    break;
                }
                a[j] = 0;
            }
        }
    }
}
