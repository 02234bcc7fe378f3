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

use rand::SeedableRng;
use rand_distr::{Distribution, Normal};
use routelab_policy_api::Evaluation;

use super::systems::{Judged, MAX_MODULES, Rules, judge};
use crate::seeds::{SimRng, mix, stream, stream_seed};
use crate::workload::compound::{CompoundSpec, DiagnoserNoise, SKILLS, System, pool_model_name};

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
    /// Row `module * models + model`: the module's part done right.
    ok: Bits,
    /// Row `model`: a critic judging its own model's wrong answer finds the error (self_refine
    /// with the penalty; no rows otherwise).
    self_critique_ok: Bits,
    diagnoser_accuracy: f64,
    diagnoser_noise: DiagnoserNoise,
    diagnoser_seed: u64,
}

/// A uniform number in [0, 1) from a hash of `seed` and `parts`.
fn unit(seed: u64, parts: &[u64]) -> f64 {
    let h = parts.iter().fold(mix(seed), |h, &p| mix(h ^ p));
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// Per-question booleans packed 64 to a word, in rows (one per module and model): the world
/// judges 64 questions with a few word operations instead of one question at a time. A row holds
/// the training questions from word 0, then the test questions from word `train_words`, so each
/// split starts on a word.
#[derive(Clone, Debug)]
struct Bits {
    train: usize,
    test: usize,
    train_words: usize,
    words: usize,
    rows: Vec<u64>,
}

impl Bits {
    fn new(train: usize, test: usize) -> Self {
        let train_words = train.div_ceil(64);
        Self { train, test, train_words, words: train_words + test.div_ceil(64), rows: Vec::new() }
    }

    fn row(&self, i: usize) -> &[u64] {
        &self.rows[i * self.words..(i + 1) * self.words]
    }

    /// The words of `split`, each with the mask of its questions (the last word of a split may
    /// be partly padding) and the question of its bit 0.
    fn split_words(&self, split: Split) -> impl Iterator<Item = (usize, u64, usize)> + use<> {
        let (words, first_question, count) = match split {
            Split::Train => (0..self.train_words, 0, self.train),
            Split::Test => (self.train_words..self.words, self.train, self.test),
        };
        let first_word = words.start;
        words.map(move |w| {
            let left = count - (w - first_word) * 64;
            let mask = if left >= 64 { !0 } else { (1u64 << left) - 1 };
            (w, mask, first_question + (w - first_word) * 64)
        })
    }

    /// Appends a row: bit `q` of the training words, or bit `q − train` of the test words.
    fn push_row(&mut self, mut f: impl FnMut(usize) -> bool) {
        let at = self.rows.len();
        self.rows.resize(at + self.words, 0);
        for q in 0..self.train + self.test {
            if f(q) {
                let (word, bit) = if q < self.train {
                    (q / 64, q % 64)
                } else {
                    (self.train_words + (q - self.train) / 64, (q - self.train) % 64)
                };
                self.rows[at + word] |= 1 << bit;
            }
        }
    }
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
            if same_day {
                unit(luck_seed, &[1, k as u64, q as u64])
            } else {
                unit(luck_seed, &[2, k as u64, s as u64, q as u64])
            }
        };
        let modules = spec.system.modules();
        let independent_calls = spec.system == System::Debate && !spec.same_wrong_answer;
        let mut ok = Bits::new(spec.questions.train as usize, spec.questions.test as usize);
        for (j, (_, skill)) in modules.iter().enumerate() {
            let s = skill_index(skill);
            for (k, model) in models.iter().enumerate() {
                ok.push_row(|q| {
                    let u = if independent_calls && *skill == "generate" {
                        unit(luck_seed, &[4, k as u64, j as u64, q as u64])
                    } else {
                        luck(k, s, q)
                    };
                    u < logistic(model.ability[s] - difficulty[q])
                });
            }
        }
        let mut self_critique_ok = Bits::new(spec.questions.train as usize, spec.questions.test as usize);
        if spec.system == System::SelfRefine && spec.self_critique_penalty {
            let s = skill_index("critique");
            for (k, model) in models.iter().enumerate() {
                self_critique_ok.push_row(|q| {
                    luck(k, s, q) < logistic(model.ability[s] - difficulty[q]) * spec.self_critique_factor
                });
            }
        }
        World {
            system: spec.system,
            models,
            difficulty,
            train: spec.questions.train as usize,
            rules: Rules { self_critique_penalty: spec.self_critique_penalty },
            ok,
            self_critique_ok,
            diagnoser_accuracy: spec.diagnoser_accuracy,
            diagnoser_noise: spec.diagnoser_noise,
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

    /// Each module's row of outcome bits for `allocation`.
    fn rows<'a>(&'a self, allocation: &[u32]) -> [&'a [u64]; MAX_MODULES] {
        let mut rows: [&[u64]; MAX_MODULES] = [&[]; MAX_MODULES];
        for (j, &m) in allocation.iter().enumerate() {
            rows[j] = self.ok.row(j * self.models.len() + m as usize);
        }
        rows
    }

    /// The 64 questions of word `w` under `allocation`.
    fn judge_word(&self, rows: &[&[u64]; MAX_MODULES], allocation: &[u32], w: usize) -> Judged {
        let ok: [u64; MAX_MODULES] = std::array::from_fn(|j| if j < allocation.len() { rows[j][w] } else { 0 });
        let self_critique_ok = if self.self_critique_ok.rows.is_empty() {
            0
        } else {
            self.self_critique_ok.row(allocation[0] as usize)[w]
        };
        judge(self.system, self.rules, allocation, &ok, self_critique_ok)
    }

    /// Questions of `split` that `allocation` answers right.
    pub fn correct_count(&self, allocation: &[u32], split: Split) -> usize {
        let rows = self.rows(allocation);
        self.ok
            .split_words(split)
            .map(|(w, mask, _)| (self.judge_word(&rows, allocation, w).correct & mask).count_ones() as usize)
            .sum()
    }

    pub fn accuracy(&self, allocation: &[u32], split: Split) -> f64 {
        self.correct_count(allocation, split) as f64 / self.range(split).len() as f64
    }

    /// Runs `allocation` on the training set: correctness per question and the diagnoser's verdict
    /// per (question, module). `call` numbers the evaluations of one selection from 0 (the
    /// evaluator's count before this one).
    ///
    /// The diagnoser is right with probability `diagnoser_accuracy`, independently per question
    /// and module. With [`DiagnoserNoise::Fresh`] every call draws again (an LLM sampled at
    /// temperature > 0: the current allocation, re-evaluated each round, gets new verdicts);
    /// with [`DiagnoserNoise::Frozen`] the draw depends on the allocation only, so the same
    /// allocation always gets the same verdicts (temperature 0, or a response cache).
    pub fn evaluate_training(&self, allocation: &[u32], call: u64) -> Evaluation {
        let l = self.modules();
        let rows = self.rows(allocation);
        let noisy = self.diagnoser_accuracy < 1.0;
        // A verdict flips when `unit(key, &[q, j]) >= diagnoser_accuracy`: computed as
        // `hash >> 11 >= flip_at` (the same test on the same 53 bits, exact in integers), with
        // the key hashed once per evaluation and once per question.
        let allocation_key = allocation.iter().fold(self.diagnoser_seed, |h, &k| mix(h ^ k as u64));
        let key = mix(match self.diagnoser_noise {
            DiagnoserNoise::Frozen => allocation_key,
            DiagnoserNoise::Fresh => mix(allocation_key ^ mix(call)),
        });
        let flip_at = (self.diagnoser_accuracy * (1u64 << 53) as f64).ceil() as u64;
        let mut correct = vec![false; self.train];
        let mut faults = vec![false; self.train * l];
        for (w, mask, first) in self.ok.split_words(Split::Train) {
            let judged = self.judge_word(&rows, allocation, w);
            for_each_bit(judged.correct & mask, |b| correct[first + b] = true);
            if !noisy {
                for (j, &blamed) in judged.faults[..l].iter().enumerate() {
                    for_each_bit(blamed & mask, |b| faults[(first + b) * l + j] = true);
                }
                continue;
            }
            // Only wrong answers get verdicts, right or wrong.
            for_each_bit(!judged.correct & mask, |b| {
                let q = first + b;
                let question_key = mix(key ^ q as u64);
                for (j, verdict) in faults[q * l..(q + 1) * l].iter_mut().enumerate() {
                    let flip = mix(question_key ^ j as u64) >> 11 >= flip_at;
                    *verdict = (judged.faults[j] >> b & 1 == 1) != flip;
                }
            });
        }
        Evaluation {
            correct: correct.into(),
            faults: faults.into(),
            cost_per_question: self.cost_per_question(allocation),
        }
    }
}

/// Calls `f` with the index of every set bit of `word`, lowest first.
fn for_each_bit(mut word: u64, mut f: impl FnMut(usize)) {
    while word != 0 {
        f(word.trailing_zeros() as usize);
        word &= word - 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(system: &str, train: u32, test: u32, diagnoser_accuracy: f64) -> CompoundSpec {
        let yaml = format!(
            "system: {system}\npool: {{models: 4}}\nquestions: {{train: {train}, test: {test}}}\n\
             self_critique_penalty: true\ndiagnoser_accuracy: {diagnoser_accuracy}\n"
        );
        let spec: CompoundSpec = serde_norway::from_str(&yaml).unwrap();
        spec.validate().unwrap();
        spec
    }

    /// Question `q` is the same question in two worlds of one seed that split the questions
    /// differently (difficulties are drawn in order, luck and verdicts hash `q`), so the test
    /// split of one, which starts mid-word, must agree with the training set of the other.
    #[test]
    fn both_splits_agree_question_by_question_across_word_boundaries() {
        for system in ["locate_solve", "self_refine", "debate"] {
            let (split, whole) =
                (World::new(&spec(system, 100, 70, 0.7), 5), World::new(&spec(system, 170, 1, 0.7), 5));
            let l = split.modules();
            for code in 0..4u32.pow(l as u32) {
                let a: Vec<u32> = (0..l).map(|j| code / 4u32.pow(j as u32) % 4).collect();
                let e = whole.evaluate_training(&a, 0);
                let right = |r: Range<usize>| e.correct[r].iter().filter(|c| **c).count();
                assert_eq!(split.correct_count(&a, Split::Train), right(0..100), "{system} {a:?}");
                assert_eq!(split.correct_count(&a, Split::Test), right(100..170), "{system} {a:?}");
                let head = split.evaluate_training(&a, 0);
                assert_eq!(head.correct[..], e.correct[..100], "{system} {a:?}");
                assert_eq!(head.faults[..], e.faults[..100 * l], "{system} {a:?}");
                // Verdicts only on wrong answers.
                for q in 0..170 {
                    assert!(
                        !e.correct[q] || e.faults[q * l..(q + 1) * l].iter().all(|f| !f),
                        "{system} {a:?} question {q}"
                    );
                }
            }
        }
    }

    /// Fresh noise redraws the verdicts of a re-evaluated allocation; frozen noise repeats them.
    /// Either way the diagnoser is right on about `diagnoser_accuracy` of the verdicts it gives.
    #[test]
    fn fresh_noise_redraws_verdicts_on_every_call_and_frozen_noise_repeats_them() {
        let mut spec = spec("debate", 1000, 1, 0.7);
        let world = World::new(&spec, 3);
        spec.diagnoser_accuracy = 1.0;
        let truth = World::new(&spec, 3).evaluate_training(&[0, 1, 2, 3, 0, 1], 0);
        let agreement = |e: &Evaluation| {
            let wrong: Vec<usize> = (0..1000).filter(|&q| !e.correct[q]).collect();
            let same = wrong.iter().flat_map(|&q| q * 6..q * 6 + 6).filter(|&i| e.faults[i] == truth.faults[i]).count();
            same as f64 / (wrong.len() * 6) as f64
        };
        for noise in [DiagnoserNoise::Fresh, DiagnoserNoise::Frozen] {
            let world = World { diagnoser_noise: noise, ..world.clone() };
            let (first, again) =
                (world.evaluate_training(&[0, 1, 2, 3, 0, 1], 0), world.evaluate_training(&[0, 1, 2, 3, 0, 1], 1));
            assert_eq!(first.correct, truth.correct, "noise never changes the answers");
            assert_eq!(first.faults == again.faults, noise == DiagnoserNoise::Frozen, "{noise:?}");
            for e in [&first, &again] {
                assert!((agreement(e) - 0.7).abs() < 0.03, "{noise:?}: {}", agreement(e));
            }
        }
    }
}
