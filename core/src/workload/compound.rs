//! The `compound:` section: a compound AI system, a pool of models, generated questions and an LLM
//! diagnoser; a selector picks one model per module (docs/architecture.md).
//!
//! ```yaml
//! compound:
//!   system: locate_solve            # locate_solve (2 modules) | self_refine (3) | debate (6)
//!   models:                         # explicit models ...
//!     - {name: A, general: 0, specialties: {locate: 4, solve: -2}, price: 5}
//!   # pool: {models: 5}             # ... or a generated pool named A, B, C, ...
//!   questions: {train: 300, test: 1000, difficulty_sd: 1.0}
//!   diagnoser_accuracy: 1.0         # chance the diagnoser's verdict on a module is right
//!   diagnoser_noise: fresh          # fresh: each call draws its verdicts (T > 0) | frozen: one per trace (T = 0)
//!   self_critique_penalty: false    # a critic judging its own model's answer finds errors ...
//!   self_critique_factor: 0.3       # ... with its probability multiplied by this
//!   same_wrong_answer: false        # debate: a model wrong on a question is always wrong the same way
//!   start: [C, C]                   # optional starting allocation for every selector
//!   budget: 200                     # optional cap on evaluated allocations
//!   variants:                       # optional: run the workload once per entry, each overriding fields
//!     - {system: debate, diagnoser_accuracy: 0.8}
//! ```
//!
//! A model's chance to do a module right on a question is `logistic(general + specialty[skill] −
//! difficulty)`; each question has one difficulty shared across skills. Unknown fields are errors.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::FieldError;
use super::limits::{self, at_most};

/// Every skill a module may exercise; a model's `specialties` may name only these.
pub const SKILLS: [&str; 6] = ["locate", "solve", "generate", "critique", "refine", "debate"];

/// Largest ability, specialty or difficulty spread in logits (beyond ±40 a logistic is 0 or 1).
pub const MAX_LOGIT: f64 = 1000.0;
/// Largest price per call: sums over millions of calls stay finite and exact enough.
pub const MAX_PRICE: f64 = 1e12;

/// Most models a generated pool may have (they are named A..Z).
pub const MAX_POOL_MODELS: u32 = 26;

#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CompoundSpec {
    /// The compound system: `locate_solve` (2 modules), `self_refine` (3) or `debate` (6).
    pub system: System,
    /// Explicit models; exactly one of `models` and `pool`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models: Option<Vec<ModelSpec>>,
    /// A generated pool; exactly one of `models` and `pool`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<PoolSpec>,
    /// How many training and test questions, and their difficulty spread.
    #[serde(default)]
    pub questions: QuestionsSpec,
    /// Probability that the diagnoser's verdict on one module of a wrongly answered question is
    /// right, in [0, 1]. Correctly answered questions are always "no fault".
    #[serde(default = "one")]
    pub diagnoser_accuracy: f64,
    /// Whether the diagnoser's mistakes are drawn afresh on every evaluation or fixed per
    /// (allocation, question, module).
    #[serde(default)]
    pub diagnoser_noise: DiagnoserNoise,
    /// Switch: a critic that is the same model as the generator finds the generator's error with
    /// its probability multiplied by `self_critique_factor` (self_refine).
    #[serde(default)]
    pub self_critique_penalty: bool,
    /// Multiplies a self-critic's chance to find the error (with `self_critique_penalty`), in [0, 1].
    #[serde(default = "default_self_critique_factor")]
    pub self_critique_factor: f64,
    /// Switch (debate): on, a model wrong on a question is always wrong the same way, so one model
    /// in several generator slots gives one answer three times; off, every generator call is an
    /// independent sample and wrong answers differ.
    #[serde(default)]
    pub same_wrong_answer: bool,
    /// How often a model's luck on a question is shared across its skills ("good days together"),
    /// in [0, 1]: 1 means a model that finds a question easy finds it easy in every module.
    #[serde(default = "one")]
    pub skill_correlation: f64,
    /// Starting allocation (model names, one per module) for every selector; `--start` overrides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<Vec<String>>,
    /// Most allocations a selector may evaluate; at least one round (one per model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<u64>,
    /// Print the full training-accuracy table (2-module systems) before the results.
    #[serde(default, skip_serializing_if = "is_false")]
    pub print_training_table: bool,
    /// Run the workload once per entry, each overriding some fields (see [`CompoundSpec::variants`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub variants: Vec<Variant>,
}

fn one() -> f64 {
    1.0
}
fn default_self_critique_factor() -> f64 {
    0.3
}
fn is_false(b: &bool) -> bool {
    !*b
}

/// How a diagnoser with `diagnoser_accuracy` < 1 errs when it is shown the same allocation's
/// trace again (the LLMSelector loop re-evaluates the current allocation every round).
#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum DiagnoserNoise {
    /// Every evaluation draws its verdicts anew: an LLM diagnoser sampled at temperature > 0
    /// without a response cache.
    #[default]
    Fresh,
    /// One verdict per (allocation, question, module), the same whenever it is asked again: an
    /// LLM diagnoser at temperature 0, or any diagnoser behind a response cache keyed by the
    /// prompt (as the open-source LLMSelector's is).
    Frozen,
}

/// A compound AI system: its modules and the logic that turns their outcomes into an answer.
#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum System {
    /// Locate the item in a long table, then solve it.
    LocateSolve,
    /// Generate an answer, critique it, refine it if the critic flags an error.
    SelfRefine,
    /// Three generators answer; three debaters each pick among those answers; plurality wins.
    Debate,
}

impl System {
    /// The modules in pipeline order, as (module name, skill).
    pub fn modules(self) -> &'static [(&'static str, &'static str)] {
        match self {
            System::LocateSolve => &[("locate", "locate"), ("solve", "solve")],
            System::SelfRefine => &[("generate", "generate"), ("critique", "critique"), ("refine", "refine")],
            System::Debate => &[
                ("generator_1", "generate"),
                ("generator_2", "generate"),
                ("generator_3", "generate"),
                ("debater_1", "debate"),
                ("debater_2", "debate"),
                ("debater_3", "debate"),
            ],
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            System::LocateSolve => "locate_solve",
            System::SelfRefine => "self_refine",
            System::Debate => "debate",
        }
    }
}

/// One model of an explicit pool.
#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// Unique; no commas or spaces (allocations are written `A,B`).
    pub name: String,
    /// Ability in logits on every skill.
    #[serde(default)]
    pub general: f64,
    /// Added to `general` for the named skills (logits).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub specialties: BTreeMap<String, f64>,
    /// Price per call.
    #[serde(default = "one")]
    pub price: f64,
}

/// A generated pool: models named A, B, C, ..., each with a general level, a specialty per skill
/// and a price that grows with the general level.
#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PoolSpec {
    /// How many models, 1..=26.
    pub models: u32,
    /// Seed of the pool alone; omitted, each run seed draws its own pool (`seeds: 10` = 10 pools).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Mean and spread of the general level (logits).
    #[serde(default = "half")]
    pub general_mean: f64,
    /// Spread of the general level (logits).
    #[serde(default = "one")]
    pub general_sd: f64,
    /// Spread of each per-skill specialty around 0 (logits).
    #[serde(default = "one")]
    pub specialty_sd: f64,
    /// Price per call = `price_base · exp(price_per_level · general)`, rounded to cents.
    #[serde(default = "one")]
    pub price_base: f64,
    /// How fast the price grows with the general level.
    #[serde(default = "one")]
    pub price_per_level: f64,
}

fn half() -> f64 {
    0.5
}

/// The generated questions; the first `train` are the training set selectors see.
#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct QuestionsSpec {
    /// Training questions: the ones selectors evaluate allocations on.
    #[serde(default = "default_train")]
    pub train: u32,
    /// Held-out test questions the chosen allocation is scored on.
    #[serde(default = "default_test")]
    pub test: u32,
    /// Spread of the question difficulty (normal, mean 0, logits).
    #[serde(default = "one")]
    pub difficulty_sd: f64,
}

fn default_train() -> u32 {
    200
}
fn default_test() -> u32 {
    1000
}

impl Default for QuestionsSpec {
    fn default() -> Self {
        Self { train: default_train(), test: default_test(), difficulty_sd: 1.0 }
    }
}

/// One run of a workload with `variants`: the fields it names replace the base values.
#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct Variant {
    /// Shown in reports; by default the overridden fields (`system=debate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// Replaces `system`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<System>,
    /// Replaces `diagnoser_accuracy`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diagnoser_accuracy: Option<f64>,
    /// Replaces `diagnoser_noise`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diagnoser_noise: Option<DiagnoserNoise>,
    /// Replaces `self_critique_penalty`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub self_critique_penalty: Option<bool>,
    /// Replaces `self_critique_factor`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub self_critique_factor: Option<f64>,
    /// Replaces `same_wrong_answer`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub same_wrong_answer: Option<bool>,
    /// Replaces `skill_correlation`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skill_correlation: Option<f64>,
    /// Replaces `start`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<Vec<String>>,
    /// Replaces `budget`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<u64>,
}

impl Variant {
    /// `base` with this variant's fields, and the variant's label.
    fn apply(&self, base: &CompoundSpec) -> (String, CompoundSpec) {
        let mut spec = base.clone();
        spec.variants.clear();
        let mut label = Vec::new();
        if let Some(v) = self.system {
            // The base start names one model per module of the base system; a new system needs its own.
            if v != base.system && self.start.is_none() {
                spec.start = None;
            }
            spec.system = v;
            label.push(format!("system={}", v.as_str()));
        }
        if let Some(v) = self.diagnoser_accuracy {
            spec.diagnoser_accuracy = v;
            label.push(format!("diagnoser_accuracy={v}"));
        }
        if let Some(v) = self.diagnoser_noise {
            spec.diagnoser_noise = v;
            label.push(format!("diagnoser_noise={}", if v == DiagnoserNoise::Fresh { "fresh" } else { "frozen" }));
        }
        if let Some(v) = self.self_critique_penalty {
            spec.self_critique_penalty = v;
            label.push(format!("self_critique_penalty={v}"));
        }
        if let Some(v) = self.self_critique_factor {
            spec.self_critique_factor = v;
            label.push(format!("self_critique_factor={v}"));
        }
        if let Some(v) = self.same_wrong_answer {
            spec.same_wrong_answer = v;
            label.push(format!("same_wrong_answer={v}"));
        }
        if let Some(v) = self.skill_correlation {
            spec.skill_correlation = v;
            label.push(format!("skill_correlation={v}"));
        }
        if let Some(v) = &self.start {
            spec.start = Some(v.clone());
            label.push(format!("start={}", v.join(",")));
        }
        if let Some(v) = self.budget {
            spec.budget = Some(v);
            label.push(format!("budget={v}"));
        }
        (self.label.clone().unwrap_or_else(|| label.join(", ")), spec)
    }
}

impl CompoundSpec {
    /// The runs this workload stands for, as (label, spec without variants): one per entry of
    /// `variants`, or the workload itself (label "") when it has none. [`crate::sim::compound::run`]
    /// takes only specs without variants.
    pub fn variants(&self) -> Vec<(String, CompoundSpec)> {
        if self.variants.is_empty() {
            return vec![(String::new(), self.clone())];
        }
        self.variants.iter().map(|v| v.apply(self)).collect()
    }

    /// Number of models in the pool.
    pub fn model_count(&self) -> usize {
        match (&self.models, &self.pool) {
            (Some(m), _) => m.len(),
            (None, Some(p)) => p.models as usize,
            (None, None) => 0,
        }
    }

    /// Model names in pool order (generated pools: A, B, C, ...).
    pub fn model_names(&self) -> Vec<String> {
        match (&self.models, &self.pool) {
            (Some(m), _) => m.iter().map(|m| m.name.clone()).collect(),
            (None, Some(p)) => (0..p.models.min(MAX_POOL_MODELS)).map(pool_model_name).collect(),
            (None, None) => Vec::new(),
        }
    }

    /// Model indices for an allocation given by names (one per module). `path` names the field in
    /// errors (`start`, or `--start` for the command line).
    pub fn resolve_allocation(&self, names: &[String], path: &str) -> Result<Vec<u32>, FieldError> {
        let modules = self.system.modules();
        let known = self.model_names();
        if names.len() != modules.len() {
            let module_names: Vec<&str> = modules.iter().map(|m| m.0).collect();
            return Err(FieldError::new(
                path,
                format!(
                    "names {} models, but {} has {} modules ({})",
                    names.len(),
                    self.system.as_str(),
                    modules.len(),
                    module_names.join(", ")
                ),
                format!(
                    "give one model per module, e.g. {}",
                    vec![known.first().map_or("A", |s| s.as_str()); modules.len()].join(",")
                ),
            ));
        }
        names
            .iter()
            .enumerate()
            .map(|(i, n)| {
                known.iter().position(|k| k == n.trim()).map(|k| k as u32).ok_or_else(|| {
                    FieldError::new(
                        &format!("{path}[{i}]"),
                        format!("unknown model '{n}'"),
                        format!("use one of the pool's models: {}", known.join(", ")),
                    )
                })
            })
            .collect()
    }

    /// Checks values serde cannot: ranges, names, consistency. Paths are relative to `compound`.
    pub fn validate(&self) -> Result<(), FieldError> {
        self.validate_one()?;
        for (i, v) in self.variants.iter().enumerate() {
            let (_, spec) = v.apply(self);
            spec.validate_one().map_err(|e| e.under(&format!("variants[{i}]")))?;
        }
        Ok(())
    }

    fn validate_one(&self) -> Result<(), FieldError> {
        match (&self.models, &self.pool) {
            (Some(_), Some(_)) => {
                return Err(FieldError::new(
                    "",
                    "both `models` and `pool` given",
                    "keep one: explicit models or a generated pool",
                ));
            }
            (None, None) => {
                return Err(FieldError::new(
                    "",
                    "no models",
                    "add `models: [{name: A, general: 1, price: 1}, ...]` or `pool: {models: 5}`",
                ));
            }
            (Some(models), None) => validate_models(models)?,
            (None, Some(pool)) => pool.validate().map_err(|e| e.under("pool"))?,
        }
        let q = &self.questions;
        if q.train == 0 {
            return Err(FieldError::new("questions.train", "must be at least 1", "set e.g. `train: 200`"));
        }
        if q.test == 0 {
            return Err(FieldError::new("questions.test", "must be at least 1", "set e.g. `test: 1000`"));
        }
        at_most("questions.train", q.train, limits::MAX_QUESTIONS, "use e.g. `train: 200`")?;
        at_most("questions.test", q.test, limits::MAX_QUESTIONS, "use e.g. `test: 1000`")?;
        if !(q.difficulty_sd >= 0.0 && q.difficulty_sd <= MAX_LOGIT) {
            return Err(FieldError::new(
                "questions.difficulty_sd",
                format!("must be in [0, {MAX_LOGIT}] (got {:?})", q.difficulty_sd),
                "use e.g. 1.0 (logits)",
            ));
        }
        unit_interval("diagnoser_accuracy", self.diagnoser_accuracy, "use e.g. 1.0 (perfect) or 0.8")?;
        unit_interval("self_critique_factor", self.self_critique_factor, "use e.g. 0.3")?;
        unit_interval("skill_correlation", self.skill_correlation, "use e.g. 1.0 (good days together)")?;
        if let Some(start) = &self.start {
            self.resolve_allocation(start, "start")?;
        }
        if let Some(budget) = self.budget {
            let k = self.model_count() as u64;
            if budget < k {
                return Err(FieldError::new(
                    "budget",
                    format!("{budget} is below one round: a round evaluates one allocation per model ({k})"),
                    format!("set `budget: {k}` or more, or remove it for no limit"),
                ));
            }
        }
        Ok(())
    }
}

/// Name of the `i`-th model of a generated pool: A, B, C, ...
pub fn pool_model_name(i: u32) -> String {
    char::from(b'A' + i as u8).to_string()
}

fn unit_interval(path: &str, v: f64, fix: &str) -> Result<(), FieldError> {
    if (0.0..=1.0).contains(&v) {
        Ok(())
    } else {
        Err(FieldError::new(path, format!("must be in [0, 1] (got {v:?})"), fix))
    }
}

fn validate_models(models: &[ModelSpec]) -> Result<(), FieldError> {
    if models.is_empty() {
        return Err(FieldError::new("models", "is empty", "list at least one model"));
    }
    for (i, m) in models.iter().enumerate() {
        let at = |field: &str| format!("models[{i}]{field}");
        if m.name.is_empty() || m.name.contains(',') || m.name.contains(char::is_whitespace) {
            return Err(FieldError::new(
                &at(".name"),
                format!("'{}' is not a usable name", m.name),
                "use a non-empty name without commas or spaces (allocations are written A,B)",
            ));
        }
        if models[..i].iter().any(|o| o.name == m.name) {
            return Err(FieldError::new(
                &at(".name"),
                format!("'{}' is named twice", m.name),
                "give every model its own name",
            ));
        }
        if !(m.general.abs() <= MAX_LOGIT) {
            return Err(FieldError::new(
                &at(".general"),
                format!("must be in [-{MAX_LOGIT}, {MAX_LOGIT}] (got {:?})", m.general),
                "use e.g. 1.0 (logits)",
            ));
        }
        for (skill, level) in &m.specialties {
            if !SKILLS.contains(&skill.as_str()) {
                return Err(FieldError::new(
                    &at(&format!(".specialties.{skill}")),
                    format!("unknown skill '{skill}'"),
                    format!("use one of: {}", SKILLS.join(", ")),
                ));
            }
            if !(level.abs() <= MAX_LOGIT) {
                return Err(FieldError::new(
                    &at(&format!(".specialties.{skill}")),
                    format!("must be in [-{MAX_LOGIT}, {MAX_LOGIT}]"),
                    "use e.g. 2.0",
                ));
            }
        }
        if !(m.price >= 0.0 && m.price <= MAX_PRICE) {
            return Err(FieldError::new(
                &at(".price"),
                format!("must be in [0, {MAX_PRICE:.0e}] (got {:?})", m.price),
                "use e.g. 1.0 per call",
            ));
        }
    }
    Ok(())
}

impl PoolSpec {
    fn validate(&self) -> Result<(), FieldError> {
        if !(1..=MAX_POOL_MODELS).contains(&self.models) {
            return Err(FieldError::new(
                "models",
                format!("must be in 1..={MAX_POOL_MODELS} (got {})", self.models),
                "generated models are named A..Z; list models explicitly for more",
            ));
        }
        let bounded = [("general_mean", self.general_mean), ("price_per_level", self.price_per_level)];
        for (path, v) in bounded {
            if !(v.abs() <= MAX_LOGIT) {
                return Err(FieldError::new(
                    path,
                    format!("must be in [-{MAX_LOGIT}, {MAX_LOGIT}] (got {v:?})"),
                    "use e.g. 0.5",
                ));
            }
        }
        let non_negative = [("general_sd", self.general_sd), ("specialty_sd", self.specialty_sd)];
        for (path, v) in non_negative {
            if !(0.0..=MAX_LOGIT).contains(&v) {
                return Err(FieldError::new(path, format!("must be in [0, {MAX_LOGIT}] (got {v:?})"), "use e.g. 1.0"));
            }
        }
        // Prices are price_base · exp(price_per_level · general): keep the priciest model of a
        // pool (general up to 8 sd above the mean) finite and summable.
        let top = self.price_base.ln() + self.price_per_level.abs() * (self.general_mean.abs() + 8.0 * self.general_sd);
        if !(self.price_base >= 0.0 && (self.price_base == 0.0 || top <= MAX_PRICE.ln())) {
            return Err(FieldError::new(
                "price_base",
                format!(
                    "with price_per_level {} the priciest model could cost e^{top:.0} per call (at most {MAX_PRICE:.0e})",
                    self.price_per_level
                ),
                "use e.g. price_base: 1, price_per_level: 1",
            ));
        }
        Ok(())
    }
}
