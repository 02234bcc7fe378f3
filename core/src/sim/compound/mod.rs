//! The compound world (LLMSelector): which model each module of a compound AI system calls.
//!
//! [`world`] generates models, questions and every module outcome from the run seed; [`systems`]
//! turns module outcomes into end-to-end answers and true faults; [`evaluator`] hands a selector
//! training-set evaluations with the diagnoser's verdicts and counts them; [`studies`] holds the
//! whole-space computations (training table, exhaustive optimum, every starting allocation).
//!
//! [`run`] scores one selector: it selects on the training set, then the host scores the chosen
//! allocation on the held-out test set.

pub mod evaluator;
pub mod studies;
pub mod systems;
pub mod world;

use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{RNone, ROption, RSome, RVec};
use routelab_policy_api::{Evaluator_TO, ModelInfo, ModuleInfo, Problem, SelectorBox};

pub use studies::{AllStarts, all_starts, best_allocation, training_table};
pub use world::{Split, World};

use crate::error::{Role, RunError};
use crate::metrics::Metrics;
use crate::seeds::stream_seed;
use crate::workload::compound::CompoundSpec;
use evaluator::TrainingEvaluator;

/// Largest space (K^L allocations) for which a run also computes `gap_to_exhaustive`.
pub const GAP_SPACE_LIMIT: u64 = 100_000;

/// One selector's result.
#[derive(Clone, Debug, PartialEq)]
pub struct CompoundOutcome {
    /// `train_accuracy`, `test_accuracy`, `evaluations`, `cost_per_question`, `distinct_models`
    /// (models the allocation mixes), `gap_to_exhaustive` (when K^L ≤ [`GAP_SPACE_LIMIT`]: the best
    /// allocation's training accuracy minus the chosen one's), then the selector's own figures
    /// as `selector.<name>` (`selector.rounds`, `selector.converged` for the LLMSelector loop).
    pub metrics: Metrics,
    /// The chosen allocation by model name, one per module.
    pub allocation: Vec<String>,
}

/// The seed to give a selector (`SelectorContext { seed }`) in run `run_seed`.
pub fn selector_seed(run_seed: u64) -> u64 {
    stream_seed(run_seed, "compound.selector")
}

/// What a selector is told at creation in run `run_seed` of `spec`: its seed and the problem's
/// shape, so it can refuse a problem it cannot handle before the run.
pub fn selector_context(spec: &CompoundSpec, run_seed: u64) -> routelab_policy_api::SelectorContext {
    let shape = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    routelab_policy_api::SelectorContext {
        seed: selector_seed(run_seed),
        modules: shape(spec.system.modules().len()),
        models: shape(spec.model_count()),
        train_questions: spec.questions.train,
        budget: spec.budget.into(),
        facts: Default::default(),
    }
}

/// Runs `selector` (labelled `label` in errors) on one seed of `spec`. `start` (model names, one
/// per module) overrides the workload's `start`. `spec` must be validated and without `variants`
/// (expand them with [`CompoundSpec::variants`]).
pub fn run(
    spec: &CompoundSpec,
    selector: &mut SelectorBox,
    label: &str,
    run_seed: u64,
    start: Option<&[String]>,
) -> Result<CompoundOutcome, RunError> {
    if !spec.variants.is_empty() {
        return Err(RunError::Run(format!(
            "the workload has {} variants: run each spec of CompoundSpec::variants() separately",
            spec.variants.len()
        )));
    }
    let world = World::new(spec, run_seed);
    let start = match start.or(spec.start.as_deref()) {
        Some(names) => Some(
            spec.resolve_allocation(names, "start")
                .map_err(|e| RunError::Run(format!("{}: {} ({})", e.path, e.message, e.fix)))?,
        ),
        None => None,
    };
    let optimum = match world.space() {
        Some(n) if n <= GAP_SPACE_LIMIT => best_allocation(&world).map(|(_, correct)| correct),
        _ => None,
    };
    select_and_score(&world, spec.budget, selector, label, start, optimum)
}

/// The selection problem a selector sees for `world`.
pub fn problem(world: &World, budget: Option<u64>, start: Option<Vec<u32>>) -> Problem {
    Problem {
        modules: world
            .system
            .modules()
            .iter()
            .map(|(name, skill)| ModuleInfo { name: (*name).into(), skill: (*skill).into() })
            .collect(),
        models: world.models.iter().map(|m| ModelInfo { name: m.name.as_str().into(), price: m.price }).collect(),
        train_questions: world.train as u32,
        start: match start {
            Some(a) => RSome(RVec::from(a)),
            None => RNone,
        },
        budget: ROption::from(budget),
    }
}

/// Lets `selector` choose on `world`'s training set, then scores its choice. `optimum_correct`:
/// training questions the best allocation answers (for `gap_to_exhaustive`).
pub fn select_and_score(
    world: &World,
    budget: Option<u64>,
    selector: &mut SelectorBox,
    label: &str,
    start: Option<Vec<u32>>,
    optimum_correct: Option<usize>,
) -> Result<CompoundOutcome, RunError> {
    let problem = problem(world, budget, start);
    let mut evaluator = TrainingEvaluator::new(world, budget);
    let chosen = selector
        .select(&problem, Evaluator_TO::from_ptr(&mut evaluator, TD_Opaque))
        .into_result()
        .map_err(|e| crate::handle::policy_error(label, "select", e.into()))?;
    if !world.is_allocation(&chosen) {
        return Err(RunError::refused(
            Role::Policy,
            label,
            format!(
                "returned {:?}, which is not an allocation: it needs one model index in 0..{} for each of the {} modules",
                chosen.as_slice(),
                world.models.len(),
                world.modules()
            ),
        ));
    }
    let train_correct = world.correct_count(&chosen, Split::Train);
    let mut metrics = Metrics::new();
    metrics.push("train_accuracy", train_correct as f64 / world.train as f64);
    metrics.push("test_accuracy", world.accuracy(&chosen, Split::Test));
    metrics.push("evaluations", evaluator.evaluations() as f64);
    metrics.push("cost_per_question", world.cost_per_question(&chosen));
    let mut distinct = chosen.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    metrics.push("distinct_models", distinct.len() as f64);
    if let Some(best) = optimum_correct {
        metrics.push("gap_to_exhaustive", (best as f64 - train_correct as f64) / world.train as f64);
    }
    for (k, v) in crate::handle::report_of(Role::Policy, label, "selector", selector.report())? {
        metrics.push(k, v);
    }
    Ok(CompoundOutcome { metrics, allocation: world.names(&chosen) })
}
