//! The three systems' end-to-end logic: from each module's outcome on one question to the final
//! answer's correctness and the true per-module faults the diagnoser is asked about.
//!
//! A module is at fault for a wrong answer when its own output was wrong and that wrong output
//! reached the final answer: the first broken link of the chain, not the modules downstream that
//! merely received bad input.

use crate::workload::compound::System;

/// The largest system (debate) has six modules.
pub const MAX_MODULES: usize = 6;

/// The switches of the world that change how module outcomes combine. (Debate's other switch,
/// `same_wrong_answer`, changes the outcomes themselves: see [`judge`].)
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rules {
    /// self_refine: a critic that is the generator's own model uses its self-critique outcome.
    pub self_critique_penalty: bool,
}

/// The results of 64 questions under one allocation, one question per bit (bit `i` of every word
/// is the same question).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Judged {
    /// The end-to-end answer is right.
    pub correct: u64,
    /// Per module: it caused the error (never set where `correct` is).
    pub faults: [u64; MAX_MODULES],
}

/// Judges 64 questions at once. `ok[j]`: module `j` did its part right (bit per question);
/// `self_critique_ok`: the critic's outcome when it judges its own model's wrong answer
/// (self_refine with the penalty on). Bits past the last question may be anything: callers mask.
///
/// Each system's logic is written with whole words of booleans; the tests check it against a
/// question-at-a-time statement of the same rules for every combination of outcomes.
pub fn judge(
    system: System,
    rules: Rules,
    allocation: &[u32],
    ok: &[u64; MAX_MODULES],
    self_critique_ok: u64,
) -> Judged {
    let mut faults = [0u64; MAX_MODULES];
    let correct = match system {
        System::LocateSolve => {
            // The solver of a wrongly located item cannot be blamed: only the first failure counts.
            faults[0] = !ok[0];
            faults[1] = ok[0] & !ok[1];
            ok[0] & ok[1]
        }
        System::SelfRefine => {
            let generated_right = ok[0];
            let critic_right = if rules.self_critique_penalty && allocation[1] == allocation[0] {
                (generated_right & ok[1]) | (!generated_right & self_critique_ok)
            } else {
                ok[1]
            };
            // A right critic flags exactly the wrong answers; a wrong one misses an error or raises
            // a false alarm. A flagged answer is rewritten by the refiner.
            let flagged = generated_right ^ critic_right;
            let correct = (flagged & ok[2]) | (!flagged & generated_right);
            let wrong = !correct;
            // The generator when its error went unflagged; the critic whenever it was wrong (a
            // missed error or a false alarm); the refiner when it broke or failed to fix a flagged one.
            faults[0] = wrong & !generated_right & !flagged;
            faults[1] = wrong & !critic_right;
            faults[2] = wrong & flagged & !ok[2];
            correct
        }
        System::Debate => {
            // Three generators answer; each debater picks among those answers: a right debater
            // picks the right one when present, a wrong one the most common wrong answer. Picks
            // are then the right answer or one wrong answer, so the plurality of three picks is
            // right exactly when two debaters pick right (or every generator was right). Which
            // wrong answer a model gives does not matter here; `same_wrong_answer` decides whether
            // one model's generator slots share their outcomes `ok` (the world's luck).
            let any_right = ok[0] | ok[1] | ok[2];
            let all_right = ok[0] & ok[1] & ok[2];
            let debaters_agree = (ok[3] & ok[4]) | (ok[3] & ok[5]) | (ok[4] & ok[5]);
            let correct = all_right | (any_right & debaters_agree);
            let wrong = !correct;
            // No right answer to pick: the generators are at fault; else the debaters who missed it.
            faults[..3].fill(wrong & !any_right);
            for d in 3..6 {
                faults[d] = wrong & any_right & !ok[d];
            }
            correct
        }
    };
    Judged { correct, faults }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OFF: Rules = Rules { self_critique_penalty: false };

    /// One question (bit 0): its correctness and faults.
    fn one(
        system: System,
        rules: Rules,
        allocation: &[u32],
        ok: &[bool],
        self_critique_ok: bool,
    ) -> (bool, [bool; MAX_MODULES]) {
        let words: [u64; MAX_MODULES] = std::array::from_fn(|j| ok.get(j).copied().unwrap_or(false) as u64);
        let j = judge(system, rules, allocation, &words, self_critique_ok as u64);
        (j.correct & 1 == 1, j.faults.map(|f| f & 1 == 1))
    }

    #[test]
    fn locate_solve_blames_the_first_failure_only() {
        let (correct, faults) = one(System::LocateSolve, OFF, &[0, 1], &[false, false], false);
        assert!(!correct);
        assert_eq!(&faults[..2], &[true, false]);
        assert_eq!(&one(System::LocateSolve, OFF, &[0, 1], &[true, false], false).1[..2], &[false, true]);
        assert!(one(System::LocateSolve, OFF, &[0, 1], &[true, true], false).0);
    }

    #[test]
    fn self_refine_critic_of_its_own_model_uses_the_penalised_outcome() {
        let on = Rules { self_critique_penalty: true };
        // Wrong generation, a critic that would find it, a refiner that fixes it.
        let ok = [false, true, true];
        assert!(one(System::SelfRefine, on, &[0, 1, 2], &ok, false).0, "another model's critic finds it");
        let (correct, faults) = one(System::SelfRefine, on, &[0, 0, 2], &ok, false);
        assert!(!correct, "the penalised self-critic misses it");
        assert_eq!(&faults[..3], &[true, true, false]);
        assert!(one(System::SelfRefine, OFF, &[0, 0, 2], &ok, false).0, "switch off: no penalty");
        // A false alarm on a right answer, then a failing refiner: critic and refiner at fault.
        let (correct, faults) = one(System::SelfRefine, OFF, &[0, 1, 2], &[true, false, false], false);
        assert_eq!((correct, &faults[..3]), (false, &[false, true, true][..]));
    }

    #[test]
    fn debate_needs_a_right_answer_and_two_right_debaters() {
        let a = [0, 1, 2, 0, 0, 0];
        assert!(one(System::Debate, OFF, &a, &[false, false, true, true, true, false], false).0);
        let (correct, faults) = one(System::Debate, OFF, &a, &[false, false, true, true, false, false], false);
        assert!(!correct);
        assert_eq!(faults, [false, false, false, false, true, true]);
        let (_, faults) = one(System::Debate, OFF, &a, &[false, false, false, true, true, true], false);
        assert_eq!(faults, [true, true, true, false, false, false]);
    }

    /// The rules stated one question at a time, as the world first computed them: the oracle the
    /// word-wide [`judge`] must agree with.
    mod reference {
        use super::super::*;

        const RIGHT: u32 = 0;

        /// `same_wrong_answer`: a model's wrong answer is the same in every slot it fills.
        pub fn judge(
            system: System,
            rules: Rules,
            same_wrong_answer: bool,
            allocation: &[u32],
            ok: &[bool; MAX_MODULES],
            self_critique_ok: bool,
        ) -> (bool, [bool; MAX_MODULES]) {
            let mut faults = [false; MAX_MODULES];
            let correct = match system {
                System::LocateSolve => {
                    faults[0] = !ok[0];
                    faults[1] = ok[0] && !ok[1];
                    ok[0] && ok[1]
                }
                System::SelfRefine => {
                    let generated_right = ok[0];
                    let critic_right =
                        if !generated_right && rules.self_critique_penalty && allocation[1] == allocation[0] {
                            self_critique_ok
                        } else {
                            ok[1]
                        };
                    let flagged = generated_right != critic_right;
                    let correct = if flagged { ok[2] } else { generated_right };
                    if !correct {
                        faults[0] = !generated_right && !flagged;
                        faults[1] = generated_right == flagged;
                        faults[2] = flagged && !ok[2];
                    }
                    correct
                }
                System::Debate => return debate(same_wrong_answer, allocation, ok),
            };
            (correct, faults)
        }

        /// Answers as ids (0 right); each debater picks the right answer if it is right and the
        /// answer is present, else the most common wrong one; the plurality of picks wins.
        fn debate(
            same_wrong_answer: bool,
            allocation: &[u32],
            ok: &[bool; MAX_MODULES],
        ) -> (bool, [bool; MAX_MODULES]) {
            let mut answers = [RIGHT; 3];
            for g in 0..3 {
                if !ok[g] {
                    answers[g] = 1 + if same_wrong_answer { allocation[g] } else { 100 + g as u32 };
                }
            }
            let right_available = answers.contains(&RIGHT);
            let wrong: Vec<u32> = answers.iter().copied().filter(|&a| a != RIGHT).collect();
            let mut picks = [RIGHT; 3];
            for d in 0..3 {
                picks[d] = if (ok[3 + d] && right_available) || wrong.is_empty() { RIGHT } else { plurality(&wrong) };
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
            (correct, faults)
        }

        /// The most common value; on ties the one that appears first.
        pub fn plurality(xs: &[u32]) -> u32 {
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
    }

    #[test]
    fn plurality_breaks_ties_by_first_appearance() {
        assert_eq!(reference::plurality(&[3, 5, 5]), 5);
        assert_eq!(reference::plurality(&[3, 5, 7]), 3);
        assert_eq!(reference::plurality(&[0, 2, 0]), 0);
    }

    #[test]
    fn the_word_wide_judge_agrees_with_the_question_at_a_time_rules_on_every_case() {
        let mut cases = 0;
        for system in [System::LocateSolve, System::SelfRefine, System::Debate] {
            let l = system.modules().len();
            // Bit i of module j's word: module j did its part right in combination i.
            let ok: [u64; MAX_MODULES] =
                std::array::from_fn(|j| (0..1u64 << l).filter(|i| i >> j & 1 == 1).fold(0, |w, i| w | 1 << i));
            for (penalty, same_wrong_answer) in [(false, false), (false, true), (true, false), (true, true)] {
                let rules = Rules { self_critique_penalty: penalty };
                // Every allocation over three models: equal and different models in every slot.
                for code in 0..3u32.pow(l as u32) {
                    let allocation: Vec<u32> = (0..l).map(|j| code / 3u32.pow(j as u32) % 3).collect();
                    for self_critique_ok in [false, true] {
                        let judged = judge(system, rules, &allocation, &ok, if self_critique_ok { !0 } else { 0 });
                        for i in 0..1usize << l {
                            let oks: [bool; MAX_MODULES] = std::array::from_fn(|j| j < l && i >> j & 1 == 1);
                            let (correct, faults) =
                                reference::judge(system, rules, same_wrong_answer, &allocation, &oks, self_critique_ok);
                            let case = format!(
                                "{system:?} {rules:?} same wrong answer {same_wrong_answer} {allocation:?} ok {oks:?} self-critique {self_critique_ok}"
                            );
                            assert_eq!(judged.correct >> i & 1 == 1, correct, "{case}");
                            assert_eq!(judged.faults.map(|f| f >> i & 1 == 1), faults, "{case}");
                            cases += 1;
                        }
                    }
                }
            }
        }
        assert_eq!(cases, 4 * 2 * (9 * 4 + 27 * 8 + 729 * 64));
    }
}
