//! `exhaustive`: evaluate every one of the K^L allocations and keep the best.
//!
//! Algorithm: enumerate allocations in lexicographic order (module 0 most significant), evaluate
//! each on the training set, return the highest training accuracy (the first on ties). It refuses,
//! with an error that says what to do, when K^L is above `max_allocations` or above the budget.
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

/// The guard of [`Exhaustive`], for a host that wants to refuse before running: `Err` with the
/// message the selector would fail with when `models^modules` is above `max_allocations`.
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

pub struct Exhaustive {
    config: Config,
}

impl Policy for Exhaustive {
    const NAME: &'static str = "exhaustive";
    const DESCRIPTION: &'static str = "every allocation (K^L), refused above max_allocations";
    type Config = Config;
    type Context = SelectorContext;
    fn new(config: Config, _: &SelectorContext) -> Result<Self, String> {
        Ok(Self { config })
    }
}

impl SelectorPolicy for Exhaustive {
    fn select(&mut self, problem: &Problem, evaluator: &mut dyn EvaluateFn) -> Result<Vec<u32>, String> {
        let (k, l) = (problem.models.len(), problem.modules.len());
        let space = check_space(k, l, self.config.max_allocations)?;
        if let Some(left) = evaluator.remaining() {
            if left < space {
                return Err(format!(
                    "exhaustive search needs {space} evaluations but the budget leaves {left}; raise or remove the budget"
                ));
            }
        }
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
