//! Helpers shared by the selectors (not a policy): the starting allocation, training accuracy,
//! the size of the search space, and the LLMSelector loop that `llmselector`, `greedy` and
//! `llmselector_cost` share with different per-question scores.
//!
//! The loop follows LLMSelector's open-source implementation (`OptimizerLLMDiagnoser.optimize`,
//! github.com/LLMSELECTOR/LLMSELECTOR, llmselector/llmselector/compoundai/optimizer.py at commit
//! 2f3c40e1):
//!
//! 1. start from the given allocation, else a seeded random one; the trace holds it;
//! 2. nominate module `round % L` (round robin from module 0);
//! 3. evaluate all K allocations that differ from the current one only in that module (the
//!    current allocation is one of them), in model order;
//! 4. per training question, score every candidate and keep every candidate tied for that
//!    question's best score;
//! 5. the next allocation is the one tied for best on the most questions; ties in that count go
//!    to the first inserted (question order, then model order), like Python's
//!    `Counter.most_common`; append it to the trace (a cost-aware variant first subtracts a
//!    price penalty from each candidate's share of questions);
//! 6. stop when the last L+1 allocations of the trace (the initial one included) are identical,
//!    when less than one round (K evaluations) of budget is left, or after `max_rounds` rounds.
//!
//! Budget: K evaluations per round, the current allocation included. (The open-source code counts
//! K−1 per round, since the current allocation's results are already known.)

use rand::RngExt;
use routelab_policy_api::{EvaluateFn, Evaluation, PolicyRng, Problem};

/// The selector's starting allocation: the problem's, checked, else a seeded random one.
pub fn start_allocation(problem: &Problem, rng: &mut PolicyRng) -> Result<Vec<u32>, String> {
    let (k, l) = (problem.models.len(), problem.modules.len());
    if k == 0 || l == 0 {
        return Err(format!("nothing to select: {k} models, {l} modules"));
    }
    match problem.start.as_ref().into_option() {
        Some(start) => {
            if start.len() != l || start.iter().any(|&m| m as usize >= k) {
                return Err(format!(
                    "start allocation {:?} needs one model index in 0..{k} for each of the {l} modules",
                    start.as_slice()
                ));
            }
            Ok(start.to_vec())
        }
        None => Ok((0..l).map(|_| rng.random_range(0..k as u32)).collect()),
    }
}

/// Fraction of training questions answered right.
pub fn accuracy(evaluation: &Evaluation) -> f64 {
    let n = evaluation.correct.len().max(1);
    evaluation.correct.iter().filter(|c| **c).count() as f64 / n as f64
}

/// K^L, or `None` past u64.
pub fn space_size(models: usize, modules: usize) -> Option<u64> {
    (models as u64).checked_pow(modules as u32)
}

/// Whether another `n` evaluations fit in the budget.
pub fn affordable(evaluator: &dyn EvaluateFn, n: u64) -> bool {
    evaluator.remaining().is_none_or(|left| left >= n)
}

/// A candidate's score on one question: `(evaluation, question, nominated module, candidate
/// model) -> score`; higher is better, compared exactly.
pub type QuestionScore<'a> = &'a dyn Fn(&Evaluation, usize, usize, u32) -> f64;

/// Why the loop stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The last L+1 allocations of the trace are identical.
    Converged,
    /// Less than one round of budget left.
    Budget,
    /// `max_rounds` rounds done.
    Rounds,
}

/// The loop's result: the last allocation, the whole trace and why it stopped.
#[derive(Clone, Debug, PartialEq)]
pub struct Search {
    pub allocation: Vec<u32>,
    /// The initial allocation and the one chosen after each round.
    pub trace: Vec<Vec<u32>>,
    pub stop: Stop,
}

impl Search {
    pub fn rounds(&self) -> usize {
        self.trace.len() - 1
    }

    /// The selector's figures: rounds done, and 1 if it stopped by the L+1 rule.
    pub fn report(&self) -> Vec<(String, f64)> {
        vec![("rounds".into(), self.rounds() as f64), ("converged".into(), (self.stop == Stop::Converged) as u8 as f64)]
    }
}

/// The LLMSelector loop (see the module docs) from `start`, scoring with `score`. `penalty[k]`
/// (empty: none) is subtracted from model `k`'s module score, the fraction of questions on which
/// it ties for best, before the round picks its winner (the cost-aware variant).
pub fn coordinate_search(
    problem: &Problem,
    evaluator: &mut dyn EvaluateFn,
    start: Vec<u32>,
    max_rounds: u32,
    score: QuestionScore<'_>,
    penalty: &[f64],
) -> Result<Search, String> {
    let (k, l) = (problem.models.len(), problem.modules.len());
    let mut trace = vec![start.clone()];
    let mut current = start;
    let stop = loop {
        if trace.len() > l && trace[trace.len() - l - 1..].iter().all(|a| *a == current) {
            break Stop::Converged;
        }
        if trace.len() > max_rounds as usize {
            break Stop::Rounds;
        }
        if !affordable(evaluator, k as u64) {
            break Stop::Budget;
        }
        let module = (trace.len() - 1) % l;
        let mut candidates = Vec::with_capacity(k);
        for model in 0..k as u32 {
            let mut a = current.clone();
            a[module] = model;
            let evaluation = evaluator.evaluate(&a)?;
            candidates.push((a, evaluation));
        }
        let questions = candidates[0].1.correct.len();
        // Tie counts in first-insertion order: (candidate, questions on which it ties for best).
        let mut counts: Vec<(usize, u64)> = Vec::with_capacity(k);
        let mut scores = vec![0.0; k];
        for q in 0..questions {
            for (c, (_, evaluation)) in candidates.iter().enumerate() {
                scores[c] = score(evaluation, q, module, c as u32);
            }
            let best = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            for c in (0..k).filter(|&c| scores[c] == best) {
                match counts.iter_mut().find(|(i, _)| *i == c) {
                    Some((_, n)) => *n += 1,
                    None => counts.push((c, 1)),
                }
            }
        }
        let winner = if penalty.is_empty() {
            // The first of the largest counts, like Counter.most_common (max_by_key takes the last).
            let mut winner = (counts.first().map_or(0, |&(c, _)| c), 0);
            for &(c, n) in &counts {
                if n > winner.1 {
                    winner = (c, n);
                }
            }
            winner.0
        } else {
            // A penalty can make a candidate that never tied the best: rank them all, the
            // never-tied ones after the tied ones in model order.
            for c in 0..k {
                if !counts.iter().any(|&(i, _)| i == c) {
                    counts.push((c, 0));
                }
            }
            let module_score = |c: usize, n: u64| n as f64 / questions.max(1) as f64 - penalty[c];
            let mut winner = (counts[0].0, f64::NEG_INFINITY);
            for &(c, n) in &counts {
                if module_score(c, n) > winner.1 {
                    winner = (c, module_score(c, n));
                }
            }
            winner.0
        };
        current = candidates.swap_remove(winner).0;
        trace.push(current.clone());
    };
    Ok(Search { allocation: current, trace, stop })
}

#[cfg(test)]
mod tests {
    use super::*;
    use routelab_policy_api::{ModelInfo, ModuleInfo};

    /// Evaluations from a script: `(correct, faults)` of an allocation, per question.
    struct Scripted<F: Fn(&[u32]) -> (Vec<bool>, Vec<bool>)> {
        script: F,
        calls: u64,
    }

    impl<F: Fn(&[u32]) -> (Vec<bool>, Vec<bool>)> EvaluateFn for Scripted<F> {
        fn evaluate(&mut self, allocation: &[u32]) -> Result<Evaluation, String> {
            self.calls += 1;
            let (correct, faults) = (self.script)(allocation);
            Ok(Evaluation { correct: correct.into(), faults: faults.into(), cost_per_question: 0.0 })
        }
        fn evaluations(&self) -> u64 {
            self.calls
        }
        fn remaining(&self) -> Option<u64> {
            None
        }
    }

    /// Correctness only, no faults (two modules).
    fn correct_only(correct: Vec<bool>) -> (Vec<bool>, Vec<bool>) {
        let faults = vec![false; correct.len() * 2];
        (correct, faults)
    }

    fn problem(models: usize) -> Problem {
        Problem {
            modules: (0..2).map(|j| ModuleInfo { name: format!("m{j}").into(), skill: "solve".into() }).collect(),
            models: (0..models).map(|k| ModelInfo { name: format!("{k}").into(), price: 1.0 }).collect(),
            train_questions: 2,
            start: routelab_policy_api::abi_stable::std_types::RNone,
            budget: routelab_policy_api::abi_stable::std_types::RNone,
        }
    }

    fn end_to_end(e: &Evaluation, q: usize, _: usize, _: u32) -> f64 {
        e.correct[q] as u8 as f64
    }

    #[test]
    fn equal_tie_counts_go_to_the_first_inserted_candidate_not_the_lowest_model() {
        // Module 0: model 1 alone is right on question 0, model 0 alone on question 1. Both tie for
        // best once; model 1 was inserted first (question order), so it wins.
        let mut ev = Scripted { script: |a: &[u32]| correct_only(vec![a[0] == 1, a[0] == 0]), calls: 0 };
        let s = coordinate_search(&problem(2), &mut ev, vec![0, 0], 100, &end_to_end, &[]).unwrap();
        assert_eq!(s.trace[1], vec![1, 0]);
        // Then L = 2 more rounds without change: the trace ends with L+1 identical allocations.
        assert_eq!(s.stop, Stop::Converged);
        assert_eq!(s.trace.len(), 4);
        assert_eq!(ev.calls, 3 * 2, "K evaluations per round, the current allocation included");
    }

    #[test]
    fn the_most_ties_win_over_a_first_inserted_candidate() {
        let mut ev = Scripted { script: |a: &[u32]| correct_only(vec![a[0] == 1, a[0] == 2, a[0] == 2]), calls: 0 };
        let s = coordinate_search(&problem(3), &mut ev, vec![0, 0], 100, &end_to_end, &[]).unwrap();
        assert_eq!(s.allocation, vec![2, 0]);
    }

    #[test]
    fn a_diagnoser_cycle_never_converges_and_stops_at_max_rounds() {
        // The diagnoser blames module 0 when both modules agree and module 1 when they differ:
        // (0,0) → (1,0) → (1,1) → (0,1) → (0,0) → ...
        let mut ev = Scripted { script: |a: &[u32]| (vec![false], vec![a[0] == a[1], a[0] != a[1]]), calls: 0 };
        let diagnoser = |e: &Evaluation, q: usize, module: usize, _: u32| 1.0 - e.faults[q * 2 + module] as u8 as f64;
        let s = coordinate_search(&problem(2), &mut ev, vec![0, 0], 7, &diagnoser, &[]).unwrap();
        assert_eq!(s.trace[..5], [vec![0, 0], vec![1, 0], vec![1, 1], vec![0, 1], vec![0, 0]]);
        assert_eq!(s.rounds(), 7);
        assert_eq!(s.stop, Stop::Rounds);
    }
}
