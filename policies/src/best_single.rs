//! `best_single`: the best allocation that uses one model in every module.
//!
//! Algorithm: evaluate the K allocations (m, m, ..., m) in model order; return the one with the
//! highest training accuracy, the first on ties. K evaluations; the starting allocation plays no
//! part.
//!
//! Parameters: none.
//!
//! Source: the "best fixed model" baseline of LLMSelector (Chen, Davis, Hanin, Bailis, Zaharia,
//! Zou, Stoica 2025; github.com/LLMSELECTOR/LLMSELECTOR), which mixing models beats by 5–70% on
//! real systems.

use routelab_policy_api::*;

use crate::NoConfig;
use crate::selection::accuracy;

pub struct BestSingle;

impl Policy for BestSingle {
    const NAME: &'static str = "best_single";
    const DESCRIPTION: &'static str = "the best allocation that uses one model everywhere";
    type Config = NoConfig;
    type Context = SelectorContext;
    fn new(_: NoConfig, _: &SelectorContext) -> Result<Self, String> {
        Ok(BestSingle)
    }
}

impl SelectorPolicy for BestSingle {
    fn select(&mut self, problem: &Problem, evaluator: &mut dyn EvaluateFn) -> Result<Vec<u32>, String> {
        let (k, l) = (problem.models.len(), problem.modules.len());
        if k == 0 || l == 0 {
            return Err(format!("nothing to select: {k} models, {l} modules"));
        }
        let mut best = (f64::NEG_INFINITY, 0u32);
        for model in 0..k as u32 {
            let acc = accuracy(&evaluator.evaluate(&vec![model; l])?);
            if acc > best.0 {
                best = (acc, model);
            }
        }
        Ok(vec![best.1; l])
    }
}
