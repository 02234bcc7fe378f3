//! `llmselector`: LLMSelector — change one module at a time, score the candidates of the
//! nominated module with an LLM diagnoser's per-module verdicts.
//!
//! Algorithm (the loop in [`crate::selection`]): from the given or a seeded random allocation,
//! nominate modules round robin from module 0; evaluate all K single-module swaps of the nominated
//! module (the current allocation is one of them); per training question score each candidate
//! `(1 − fault) + γ · correct`, where `fault` is the diagnoser's verdict that the nominated module
//! caused the question's error; keep every candidate tied for that question's best; move to the
//! candidate tied for best on the most questions (first inserted on ties: question order, then
//! model order); stop when the last L+1 allocations of the trace are identical or the budget
//! cannot pay for another round of K evaluations.
//!
//! Parameters: `gamma` (γ, default 1.0): weight of end-to-end correctness; any γ > 0 ranks a
//! right answer above every wrong one and then uses the verdict, γ = 0 trusts the diagnoser alone.
//! `max_rounds` (default 1000): a cap against cycles (the open-source loop has an unused
//! `max_iter=1000`).
//!
//! The diagnoser is the host's (the workload's `diagnoser_accuracy` and `diagnoser_noise`): the
//! selector sees its verdicts for every module of each evaluated allocation and reads only the
//! nominated module's, as the open-source loop asks its diagnoser only about that module.
//!
//! Source: Chen, Davis, Hanin, Bailis, Zaharia, Zou, Stoica, "Optimizing Model Selection for
//! Compound AI Systems" (2025), Algorithm 1; open-source implementation
//! `OptimizerLLMDiagnoser.optimize` / `update_model` / `compute_score_onerow` in
//! `llmselector/llmselector/compoundai/optimizer.py` of github.com/LLMSELECTOR/LLMSELECTOR
//! (commit 2f3c40e1), whose per-question score is `beta · correct + alpha · (1 − error)`. Its
//! diagnoser (`compoundai/diagnoser.py`, same commit) is called with `temperature=0` and every
//! LLM reply goes through a response cache keyed by model, prompt and temperature
//! (`compoundai/llm.py`), so the same trace always gets the same verdict: routelab's
//! `diagnoser_noise: frozen`. An LLM diagnoser sampled at temperature > 0 without that cache
//! gives a re-evaluated allocation new verdicts: `diagnoser_noise: fresh`, the default.

use routelab_policy_api::*;
use serde::{Deserialize, Serialize};

use crate::selection::{Search, coordinate_search, start_allocation};

#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Weight γ of end-to-end correctness in a candidate's per-question score.
    pub gamma: f64,
    /// Most rounds (K evaluations each).
    pub max_rounds: u32,
}

impl Default for Config {
    fn default() -> Self {
        Self { gamma: 1.0, max_rounds: 1000 }
    }
}

pub struct LlmSelector {
    config: Config,
    rng: PolicyRng,
    last: Option<Search>,
}

impl Policy for LlmSelector {
    const NAME: &'static str = "llmselector";
    const DESCRIPTION: &'static str =
        "LLMSelector: one module at a time, candidates scored by the diagnoser's verdicts";
    type Config = Config;
    type Context = SelectorContext;
    fn new(config: Config, ctx: &SelectorContext) -> Result<Self, String> {
        if !(config.gamma >= 0.0 && config.gamma.is_finite()) {
            return Err(format!("gamma must be a non-negative number (got {})", config.gamma));
        }
        Ok(Self { config, rng: policy_rng(ctx.seed), last: None })
    }
}

impl SelectorPolicy for LlmSelector {
    fn select(&mut self, problem: &Problem, evaluator: &mut dyn EvaluateFn) -> Result<Vec<u32>, String> {
        let start = start_allocation(problem, &mut self.rng)?;
        let modules = problem.modules.len();
        let gamma = self.config.gamma;
        let score = |e: &Evaluation, q: usize, module: usize, _model: u32| {
            let fault = e.faults[q * modules + module] as u8 as f64;
            (1.0 - fault) + gamma * e.correct[q] as u8 as f64
        };
        let search = coordinate_search(problem, evaluator, start, self.config.max_rounds, &score, &[])?;
        let chosen = search.allocation.clone();
        self.last = Some(search);
        Ok(chosen)
    }

    fn report(&self) -> Vec<(String, f64)> {
        self.last.as_ref().map(Search::report).unwrap_or_default()
    }
}
