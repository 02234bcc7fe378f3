//! `greedy`: LLMSelector's loop without the diagnoser — candidates scored by end-to-end
//! correctness only (coordinate ascent on training accuracy).
//!
//! Algorithm: the loop of [`crate::selection`] with per-question score `correct` (1 or 0). A
//! candidate then ties for best on every question it answers right and on every question no
//! candidate answers right, so the round picks the candidate with the highest training accuracy,
//! the first inserted on ties. It stops at a local optimum: when no single-module swap raises
//! training accuracy for L rounds in a row.
//!
//! Parameters: `max_rounds` (default 1000).
//!
//! Source: the open-source LLMSelector's `OptimizerLLMDiagnoser` with its default `alpha=0` (no
//! diagnoser), the paper's end-to-end greedy baseline (Chen et al. 2025, github.com/LLMSELECTOR).

use routelab_policy_api::*;
use serde::{Deserialize, Serialize};

use crate::selection::{Search, coordinate_search, start_allocation};

#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Most rounds (K evaluations each).
    pub max_rounds: u32,
}

impl Default for Config {
    fn default() -> Self {
        Self { max_rounds: 1000 }
    }
}

pub struct Greedy {
    config: Config,
    rng: PolicyRng,
    last: Option<Search>,
}

impl Policy for Greedy {
    const NAME: &'static str = "greedy";
    const DESCRIPTION: &'static str = "one module at a time, candidates scored by end-to-end training accuracy";
    type Config = Config;
    type Context = SelectorContext;
    fn new(config: Config, ctx: &SelectorContext) -> Result<Self, String> {
        Ok(Self { config, rng: policy_rng(ctx.seed), last: None })
    }
}

impl SelectorPolicy for Greedy {
    fn select(&mut self, problem: &Problem, evaluator: &mut dyn EvaluateFn) -> Result<Vec<u32>, String> {
        let start = start_allocation(problem, &mut self.rng)?;
        let score = |e: &Evaluation, q: usize, _module: usize, _model: u32| e.correct[q] as u8 as f64;
        let search = coordinate_search(problem, evaluator, start, self.config.max_rounds, &score, &[])?;
        let chosen = search.allocation.clone();
        self.last = Some(search);
        Ok(chosen)
    }

    fn report(&self) -> Vec<(String, f64)> {
        self.last.as_ref().map(Search::report).unwrap_or_default()
    }
}
