//! The three systems' end-to-end logic: from each module's outcome on one question to the final
//! answer's correctness and the true per-module faults the diagnoser is asked about.
//!
//! A module is at fault for a wrong answer when its own output was wrong and that wrong output
//! reached the final answer: the first broken link of the chain, not the modules downstream that
//! merely received bad input.

use crate::workload::compound::System;

/// The largest system (debate) has six modules.
pub const MAX_MODULES: usize = 6;

/// The non-monotone switches of the world (docs/architecture.md, the compound world).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rules {
    /// self_refine: a critic that is the generator's own model uses its self-critique outcome.
    pub self_critique_penalty: bool,
    /// debate: a model's wrong answer is the same in every slot it fills.
    pub same_wrong_answer: bool,
}

/// One question's end-to-end result under one allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Judgement {
    pub correct: bool,
    /// Per module: did it cause the error (always false when `correct`).
    pub faults: [bool; MAX_MODULES],
}

/// Judges one question. `ok[j]`: module `j` did its part right; `self_critique_ok`: the critic's
/// outcome when it judges its own model's wrong answer (self_refine with the penalty on).
pub fn judge(system: System, rules: Rules, allocation: &[u32], ok: &[bool; MAX_MODULES], self_critique_ok: bool) -> Judgement {
    let mut faults = [false; MAX_MODULES];
    let correct = match system {
        System::LocateSolve => {
            // The solver of a wrongly located item cannot be blamed: only the first failure counts.
            faults[0] = !ok[0];
            faults[1] = ok[0] && !ok[1];
            ok[0] && ok[1]
        }
        System::SelfRefine => {
            let generated_right = ok[0];
            let critic_right = if !generated_right && rules.self_critique_penalty && allocation[1] == allocation[0] {
                self_critique_ok
            } else {
                ok[1]
            };
            // A right critic flags exactly the wrong answers; a wrong one misses an error or raises
            // a false alarm. A flagged answer is rewritten by the refiner.
            let flagged = generated_right != critic_right;
            let correct = if flagged { ok[2] } else { generated_right };
            if !correct {
                faults[0] = !generated_right && !flagged;
                faults[1] = generated_right == flagged;
                faults[2] = flagged && !ok[2];
            }
            correct
        }
        System::Debate => return judge_debate(rules, allocation, ok),
    };
    Judgement { correct, faults }
}

/// The right answer; wrong answers are positive ids.
const RIGHT: u32 = 0;

/// Three generators answer; each debater picks among those answers (a right debater picks the
/// right one when present, a wrong one the most common wrong one); the plurality of picks wins,
/// the earliest debater's pick on a three-way tie.
fn judge_debate(rules: Rules, allocation: &[u32], ok: &[bool; MAX_MODULES]) -> Judgement {
    let mut answers = [RIGHT; 3];
    for g in 0..3 {
        if !ok[g] {
            // Same wrong answer: a model is wrong the same way wherever it sits; otherwise every
            // call is an independent sample with its own wrong answer.
            answers[g] = 1 + if rules.same_wrong_answer { allocation[g] } else { 100 + g as u32 };
        }
    }
    let right_available = answers.contains(&RIGHT);
    let mut wrong = [0u32; 3];
    let mut n_wrong = 0;
    for a in answers {
        if a != RIGHT {
            wrong[n_wrong] = a;
            n_wrong += 1;
        }
    }
    let mut picks = [RIGHT; 3];
    for d in 0..3 {
        let debater_right = ok[3 + d];
        picks[d] = if (debater_right && right_available) || n_wrong == 0 { RIGHT } else { plurality(&wrong[..n_wrong]) };
    }
    let correct = plurality(&picks) == RIGHT;
    let mut faults = [false; MAX_MODULES];
    if !correct {
        if right_available {
            for d in 0..3 {
                faults[3 + d] = picks[d] != RIGHT;
            }
        } else {
            faults[..3].fill(true);
        }
    }
    Judgement { correct, faults }
}

/// The most common value; on ties the one that appears first.
fn plurality(xs: &[u32]) -> u32 {
    let mut best = xs[0];
    let mut best_count = 0;
    for (i, &x) in xs.iter().enumerate() {
        if xs[..i].contains(&x) {
            continue;
        }
        let count = xs.iter().filter(|&&y| y == x).count();
        if count > best_count {
            best = x;
            best_count = count;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    const OFF: Rules = Rules { self_critique_penalty: false, same_wrong_answer: false };

    fn oks(v: &[bool]) -> [bool; MAX_MODULES] {
        let mut a = [false; MAX_MODULES];
        a[..v.len()].copy_from_slice(v);
        a
    }

    #[test]
    fn locate_solve_blames_the_first_failure_only() {
        let j = judge(System::LocateSolve, OFF, &[0, 1], &oks(&[false, false]), false);
        assert!(!j.correct);
        assert_eq!(&j.faults[..2], &[true, false]);
        let j = judge(System::LocateSolve, OFF, &[0, 1], &oks(&[true, false]), false);
        assert_eq!(&j.faults[..2], &[false, true]);
        assert!(judge(System::LocateSolve, OFF, &[0, 1], &oks(&[true, true]), false).correct);
    }

    #[test]
    fn self_refine_critic_of_its_own_model_uses_the_penalised_outcome() {
        let on = Rules { self_critique_penalty: true, ..OFF };
        // Wrong generation, a critic that would find it, a refiner that fixes it.
        let ok = oks(&[false, true, true]);
        assert!(judge(System::SelfRefine, on, &[0, 1, 2], &ok, false).correct, "another model's critic finds it");
        let same = judge(System::SelfRefine, on, &[0, 0, 2], &ok, false);
        assert!(!same.correct, "the penalised self-critic misses it");
        assert_eq!(&same.faults[..3], &[true, true, false]);
        assert!(judge(System::SelfRefine, OFF, &[0, 0, 2], &ok, false).correct, "switch off: no penalty");
        // A false alarm on a right answer, then a failing refiner: critic and refiner at fault.
        let j = judge(System::SelfRefine, OFF, &[0, 1, 2], &oks(&[true, false, false]), false);
        assert_eq!((j.correct, &j.faults[..3]), (false, &[false, true, true][..]));
    }

    #[test]
    fn debate_needs_a_right_answer_and_two_right_debaters() {
        let j = judge_debate(OFF, &[0, 1, 2, 0, 0, 0], &oks(&[false, false, true, true, true, false]));
        assert!(j.correct);
        let j = judge_debate(OFF, &[0, 1, 2, 0, 0, 0], &oks(&[false, false, true, true, false, false]));
        assert!(!j.correct);
        assert_eq!(&j.faults, &[false, false, false, false, true, true]);
        let j = judge_debate(OFF, &[0, 1, 2, 0, 0, 0], &oks(&[false, false, false, true, true, true]));
        assert_eq!(&j.faults, &[true, true, true, false, false, false]);
    }

    #[test]
    fn plurality_breaks_ties_by_first_appearance() {
        assert_eq!(plurality(&[3, 5, 5]), 5);
        assert_eq!(plurality(&[3, 5, 7]), 3);
        assert_eq!(plurality(&[0, 2, 0]), 0);
    }
}
