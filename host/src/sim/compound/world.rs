//! The seeded toy world: models with a general level and per-skill specialties, questions with one
//! difficulty shared across skills, and every module outcome precomputed once per run seed.
//!
//! Model `k` called in module `j` (skill `s`) does its part right on question `q` when its luck
//! `u < logistic(ability[k][s] − difficulty[q])`. The luck is per (model, question) and shared
//! across skills with probability `skill_correlation` ("good days together": a model that finds a
//! question easy finds it easy in every module), else drawn per skill. Debate generators without
//! `same_wrong_answer` are independent samples: their luck is drawn per call.
//!
//! Randomness is counter-based (a hash of seed, model, skill and question), so an outcome does not
//! depend on how many models or modules were drawn before it.

use std::ops::Range;

use abi_stable::std_types::RVec;
use rand::SeedableRng;
use rand_distr::{Distribution, Normal};
use routelab_policy_api::Evaluation;

use super::systems::{Judgement, MAX_MODULES, Rules, judge};
use crate::seeds::{SimRng, mix, stream, stream_seed};
use crate::workload::compound::{CompoundSpec, SKILLS, System, pool_model_name};

/// A model of the pool.
#[derive(Clone, Debug, PartialEq)]
pub struct Model {
    pub name: String,
    /// Price per call.
    pub price: f64,
    /// Ability in logits per skill, in [`SKILLS`] order: general level plus specialty.
    pub ability: [f64; SKILLS.len()],
}

/// Which questions: the training set selectors see, or the held-out test set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    Train,
    Test,
}

/// One run's world: models, questions and every module outcome.
#[derive(Clone, Debug)]
pub struct World {
    pub system: System,
    pub models: Vec<Model>,
    /// Question difficulties (logits); the first `train` are the training set.
    pub difficulty: Vec<f64>,
    pub train: usize,
    rules: Rules,
    /// `ok[(module * models + model) * questions + q]`: the module's part done right.
    ok: Vec<bool>,
    /// `self_critique_ok[model * questions + q]`: a critic judging its own model's wrong answer
    /// finds the error (self_refine with the penalty; empty otherwise).
    self_critique_ok: Vec<bool>,
    diagnoser_accuracy: f64,
    diagnoser_seed: u64,
}

/// A uniform number in [0, 1) from a hash of `seed` and `parts`.
fn unit(seed: u64, parts: &[u64]) -> f64 {
    let h = parts.iter().fold(mix(seed), |h, &p| mix(h ^ p));
    (h >> 11) as f64 / (1u64 << 53) as f64
}

fn logistic(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn skill_index(skill: &str) -> usize {
    SKILLS.iter().position(|s| *s == skill).expect("systems use known skills")
}

/// The pool's models: explicit, or generated from the pool's seed (or the run seed).
pub fn models(spec: &CompoundSpec, run_seed: u64) -> Vec<Model> {
    if let Some(models) = &spec.models {
        return models
            .iter()
            .map(|m| Model {
                name: m.name.clone(),
                price: m.price,
                ability: std::array::from_fn(|s| m.general + m.specialties.get(SKILLS[s]).copied().unwrap_or(0.0)),
            })
            .collect();
    }
    let pool = spec.pool.as_ref().expect("validated: models or pool");
    let mut rng = match pool.seed {
        Some(seed) => SimRng::seed_from_u64(stream_seed(seed, "compound.pool")),
        None => stream(run_seed, "compound.pool"),
    };
    let general = Normal::new(pool.general_mean, pool.general_sd).expect("validated spread");
    let specialty = Normal::new(0.0, pool.specialty_sd).expect("validated spread");
    (0..pool.models)
        .map(|i| {
            let level = general.sample(&mut rng);
            // Every skill is drawn, in a fixed order, so one pool seed gives the same models in
            // every system.
            let ability = std::array::from_fn(|_| level + specialty.sample(&mut rng));
            let price = (pool.price_base * (pool.price_per_level * level).exp() * 100.0).round().max(1.0) / 100.0;
            Model { name: pool_model_name(i), price, ability }
        })
        .collect()
}

impl World {
    /// Generates the world of `spec` for one run seed. `spec` must be validated.
    pub fn new(spec: &CompoundSpec, run_seed: u64) -> Self {
        let models = models(spec, run_seed);
        let n_questions = (spec.questions.train + spec.questions.test) as usize;
        let mut rng = stream(run_seed, "compound.questions");
        let spread = Normal::new(0.0, spec.questions.difficulty_sd).expect("validated spread");
        let difficulty: Vec<f64> = (0..n_questions).map(|_| spread.sample(&mut rng)).collect();

        let luck_seed = stream_seed(run_seed, "compound.luck");
        let luck = |k: usize, s: usize, q: usize| -> f64 {
            let same_day = unit(luck_seed, &[3, k as u64, s as u64, q as u64]) < spec.skill_correlation;
            if same_day { unit(luck_seed, &[1, k as u64, q as u64]) } else { unit(luck_seed, &[2, k as u64, s as u64, q as u64]) }
        };
        let modules = spec.system.modules();
        let independent_calls = spec.system == System::Debate && !spec.same_wrong_answer;
        let mut ok = Vec::with_capacity(modules.len() * models.len() * n_questions);
        for (j, (_, skill)) in modules.iter().enumerate() {
            let s = skill_index(skill);
            for (k, model) in models.iter().enumerate() {
                for (q, d) in difficulty.iter().enumerate() {
                    let u = if independent_calls && *skill == "generate" {
                        unit(luck_seed, &[4, k as u64, j as u64, q as u64])
                    } else {
                        luck(k, s, q)
                    };
                    ok.push(u < logistic(model.ability[s] - d));
                }
            }
        }
        let mut self_critique_ok = Vec::new();
        if spec.system == System::SelfRefine && spec.self_critique_penalty {
            let s = skill_index("critique");
            for (k, model) in models.iter().enumerate() {
                for (q, d) in difficulty.iter().enumerate() {
                    self_critique_ok.push(luck(k, s, q) < logistic(model.ability[s] - d) * spec.self_critique_factor);
                }
            }
        }
        World {
            system: spec.system,
            models,
            difficulty,
            train: spec.questions.train as usize,
            rules: Rules { self_critique_penalty: spec.self_critique_penalty, same_wrong_answer: spec.same_wrong_answer },
            ok,
            self_critique_ok,
            diagnoser_accuracy: spec.diagnoser_accuracy,
            diagnoser_seed: stream_seed(run_seed, "compound.diagnoser"),
        }
    }

    pub fn modules(&self) -> usize {
        self.system.modules().len()
    }

    pub fn questions(&self) -> usize {
        self.difficulty.len()
    }

    /// Number of allocations, K^L (`None` past u64).
    pub fn space(&self) -> Option<u64> {
        (self.models.len() as u64).checked_pow(self.modules() as u32)
    }

    pub fn range(&self, split: Split) -> Range<usize> {
        match split {
            Split::Train => 0..self.train,
            Split::Test => self.train..self.questions(),
        }
    }

    /// Whether `allocation` is one valid model index per module.
    pub fn is_allocation(&self, allocation: &[u32]) -> bool {
        allocation.len() == self.modules() && allocation.iter().all(|&k| (k as usize) < self.models.len())
    }

    pub fn names(&self, allocation: &[u32]) -> Vec<String> {
        allocation.iter().map(|&k| self.models[k as usize].name.clone()).collect()
    }

    pub fn cost_per_question(&self, allocation: &[u32]) -> f64 {
        allocation.iter().map(|&k| self.models[k as usize].price).sum()
    }

    /// Each module's outcome row for `allocation`.
    fn rows<'a>(&'a self, allocation: &[u32]) -> [&'a [bool]; MAX_MODULES] {
        let (k, n) = (self.models.len(), self.questions());
        let mut rows: [&[bool]; MAX_MODULES] = [&[]; MAX_MODULES];
        for (j, &m) in allocation.iter().enumerate() {
            let at = (j * k + m as usize) * n;
            rows[j] = &self.ok[at..at + n];
        }
        rows
    }

    fn judge_with(&self, rows: &[&[bool]; MAX_MODULES], allocation: &[u32], q: usize) -> Judgement {
        let ok: [bool; MAX_MODULES] = std::array::from_fn(|j| j < allocation.len() && rows[j][q]);
        let self_critique_ok =
            !self.self_critique_ok.is_empty() && self.self_critique_ok[allocation[0] as usize * self.questions() + q];
        judge(self.system, self.rules, allocation, &ok, self_critique_ok)
    }

    /// Questions of `split` that `allocation` answers right.
    pub fn correct_count(&self, allocation: &[u32], split: Split) -> usize {
        let rows = self.rows(allocation);
        self.range(split).filter(|&q| self.judge_with(&rows, allocation, q).correct).count()
    }

    pub fn accuracy(&self, allocation: &[u32], split: Split) -> f64 {
        self.correct_count(allocation, split) as f64 / self.range(split).len() as f64
    }

    /// Runs `allocation` on the training set: correctness per question and the diagnoser's verdict
    /// per (question, module). The diagnoser is right with probability `diagnoser_accuracy`,
    /// independently per (allocation, question, module) and the same every time the same
    /// allocation is shown to it (a temperature-0 LLM judging the same trace).
    pub fn evaluate_training(&self, allocation: &[u32]) -> Evaluation {
        let l = self.modules();
        let rows = self.rows(allocation);
        let noisy = self.diagnoser_accuracy < 1.0;
        let allocation_key = allocation.iter().fold(self.diagnoser_seed, |h, &k| mix(h ^ k as u64));
        let mut correct = RVec::with_capacity(self.train);
        let mut faults = RVec::with_capacity(self.train * l);
        for q in 0..self.train {
            let judged = self.judge_with(&rows, allocation, q);
            correct.push(judged.correct);
            for j in 0..l {
                let mut verdict = judged.faults[j];
                if !judged.correct && noisy && unit(allocation_key, &[q as u64, j as u64]) >= self.diagnoser_accuracy {
                    verdict = !verdict;
                }
                faults.push(verdict);
            }
        }
        Evaluation { correct, faults, cost_per_question: self.cost_per_question(allocation) }
    }
}
