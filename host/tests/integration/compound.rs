//! The compound world end to end: the case study's facts, budgets, the stopping rule,
//! determinism, bad input and the exhaustive guard.

use std::path::{Path, PathBuf};

use routelab_core::plugin::{Loader, PolicySpec};
use routelab_core::sim::compound::{self, CompoundOutcome, Split, World, evaluator::TrainingEvaluator};
use routelab_core::workload::compound::CompoundSpec;
use routelab_core::workload::{self, Workload};
use routelab_policy_api::{Evaluator, RSlice, SelectorBox, SelectorContext};

fn workload_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../workloads/compound").join(name)
}

fn load(name: &str) -> Workload {
    workload::load(&workload_path(name)).unwrap_or_else(|e| panic!("{e}"))
}

fn case_study() -> CompoundSpec {
    load("case_study.yaml").compound.unwrap()
}

fn selector(spec: &CompoundSpec, policy: &str, seed: u64) -> Result<SelectorBox, String> {
    Loader::new()
        .selector(&PolicySpec::parse(policy).unwrap(), &compound::selector_context(spec, seed))
        .map_err(|e| e.to_string())
}

/// Creates the selector (whose constructor may refuse the problem) and runs it.
fn run(spec: &CompoundSpec, policy: &str, seed: u64, start: Option<&[&str]>) -> Result<CompoundOutcome, String> {
    let start: Option<Vec<String>> = start.map(|s| s.iter().map(|n| n.to_string()).collect());
    compound::run(spec, &mut selector(spec, policy, seed)?, policy, seed, start.as_deref()).map_err(|e| e.to_string())
}

fn names(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn case_study_table_has_cc_as_greedy_local_optimum_and_ab_as_global_optimum() {
    let spec = case_study();
    let world = World::new(&spec, 1);
    let acc = |a: [u32; 2]| world.accuracy(&a, Split::Train);
    let (a, b, c) = (0, 1, 2);
    for k in 0..5 {
        if k != c {
            assert!(acc([k, c]) < acc([c, c]), "swapping locate to model {k} must lower C+C's accuracy");
            assert!(acc([c, k]) < acc([c, c]), "swapping solve to model {k} must lower C+C's accuracy");
        }
    }
    assert_eq!(compound::best_allocation(&world).unwrap().0, vec![a, b]);
    // The calibration the lesson needs: a weak trap (below one half) and a near-perfect optimum.
    assert!(acc([c, c]) < 0.5, "C+C: {}", acc([c, c]));
    assert!(world.accuracy(&[a, b], Split::Test) > 0.95, "A+B test: {}", world.accuracy(&[a, b], Split::Test));
    let table = compound::training_table(&spec, 1);
    assert_eq!(table.lines().count(), 7, "title, header and five rows:\n{table}");
    assert!(table.contains(&format!("{:.3}", acc([a, b]))), "{table}");
}

#[test]
fn greedy_from_cc_stays_at_cc() {
    let out = run(&case_study(), "greedy", 1, Some(&["C", "C"])).unwrap();
    assert_eq!(out.allocation, names(&["C", "C"]));
    // Two rounds without a change fill the trace with L+1 = 3 copies: 2 × 5 evaluations.
    assert_eq!(out.metrics.get("evaluations"), Some(10.0));
    assert!(out.metrics.get("gap_to_exhaustive").unwrap() > 0.1);
}

#[test]
fn llmselector_from_cc_reaches_ab_also_with_a_noisy_diagnoser() {
    let mut spec = case_study();
    for accuracy in [1.0, 0.8] {
        spec.diagnoser_accuracy = accuracy;
        let out = run(&spec, "llmselector", 1, Some(&["C", "C"])).unwrap();
        assert_eq!(out.allocation, names(&["A", "B"]), "diagnoser accuracy {accuracy}");
        assert!(out.metrics.get("test_accuracy").unwrap() > 0.9, "{:?}", out.metrics);
        assert_eq!(out.metrics.get("gap_to_exhaustive"), Some(0.0));
        assert_eq!(out.metrics.get("cost_per_question"), Some(8.0));
    }
}

#[test]
fn from_all_25_starts_greedy_fails_on_some_and_llmselector_on_none() {
    let spec = case_study();
    let mut loader = Loader::new();
    let mut count = |policy: &str| {
        let spec_p = PolicySpec::parse(policy).unwrap();
        let factory = loader.resolve(&spec_p, routelab_policy_api::PolicyKind::Selector).unwrap();
        let make = || factory.selector(&SelectorContext { seed: 3, ..compound::selector_context(&spec, 1) });
        compound::all_starts(&spec, &make, 1).unwrap()
    };
    let greedy = count("greedy");
    assert_eq!(greedy.starts, 25);
    assert_eq!(greedy.optimum, names(&["A", "B"]));
    // Greedy's first round replaces the locate model whatever it was, so a start's fate is its
    // solve model's: the C and D columns lead into the C+C and D+D traps.
    let solved_by = |start: &Vec<String>| start[1].clone();
    assert_eq!(greedy.failed_from.len(), 10, "{greedy:?}");
    assert!(greedy.failed_from.iter().all(|s| solved_by(s) == "C" || solved_by(s) == "D"), "{greedy:?}");
    let llm = count("llmselector");
    assert_eq!(llm.successes, 25, "{llm:?}");
    assert!(llm.failed_from.is_empty());
}

#[test]
fn llmselector_stops_after_l_unchanged_rounds_so_k_times_l_is_its_minimum() {
    let spec = case_study();
    let out = run(&spec, "llmselector", 1, Some(&["A", "B"])).unwrap();
    assert_eq!(out.allocation, names(&["A", "B"]));
    assert_eq!(out.metrics.get("selector.rounds"), Some(2.0));
    assert_eq!(out.metrics.get("evaluations"), Some(10.0), "K·L = 5·2");
    // From C+C: A+C, A+B, then two confirming rounds.
    let out = run(&spec, "llmselector", 1, Some(&["C", "C"])).unwrap();
    assert_eq!(out.metrics.get("selector.rounds"), Some(4.0));
    assert_eq!(out.metrics.get("evaluations"), Some(20.0));

    // Debate (6 modules): restarting at a converged allocation costs exactly K·L = 30.
    let debate = load("noisy_diagnoser.yaml").compound.unwrap().variants()[0].1.clone();
    let first = run(&debate, "llmselector", 2, None).unwrap();
    let fixed: Vec<&str> = first.allocation.iter().map(String::as_str).collect();
    let again = run(&debate, "llmselector", 2, Some(&fixed)).unwrap();
    assert_eq!(again.allocation, first.allocation);
    assert_eq!(again.metrics.get("evaluations"), Some(30.0));
}

#[test]
fn budget_counts_every_evaluation_and_stops_the_loop_before_a_round_it_cannot_pay() {
    let mut spec = case_study();
    spec.budget = Some(12);
    let out = run(&spec, "llmselector", 1, Some(&["C", "C"])).unwrap();
    assert_eq!(out.metrics.get("evaluations"), Some(10.0), "a third round of 5 does not fit in 12");
    assert_eq!(out.metrics.get("selector.converged"), Some(0.0));
    assert_eq!(out.allocation, names(&["A", "B"]));
    let out = run(&spec, "random_search", 1, None).unwrap();
    assert_eq!(out.metrics.get("evaluations"), Some(12.0));
    let err = run(&spec, "exhaustive", 1, None).unwrap_err();
    assert!(err.contains("needs 25 evaluations but the budget leaves 12"), "{err}");

    let world = World::new(&spec, 1);
    let mut ev = TrainingEvaluator::new(&world, Some(2));
    assert!(ev.evaluate(RSlice::from_slice(&[0, 0])).is_ok());
    assert!(ev.evaluate(RSlice::from_slice(&[1, 0])).is_ok());
    assert_eq!(ev.remaining().into_option(), Some(0));
    let spent = ev.evaluate(RSlice::from_slice(&[2, 0])).into_result().unwrap_err().message;
    assert!(spent.contains("budget of 2"), "{spent}");
    assert_eq!(Evaluator::evaluations(&ev), 2);
    let bad = ev.evaluate(RSlice::from_slice(&[9, 0])).into_result().unwrap_err().message;
    assert!(bad.contains("not an allocation"), "{bad}");
}

#[test]
fn the_evaluation_reports_faults_question_major_and_only_for_wrong_answers() {
    let world = World::new(&case_study(), 1);
    let e = world.evaluate_training(&[1, 0], 0); // B locates badly, A solves badly
    assert_eq!(e.correct.len(), 300);
    assert_eq!(e.faults.len(), 600);
    for q in 0..300 {
        let blamed = e.faults[2 * q] as u8 + e.faults[2 * q + 1] as u8;
        // locate_solve blames exactly the first failing module of a wrong answer.
        assert_eq!(blamed, !e.correct[q] as u8, "question {q}");
    }
    assert_eq!(e.cost_per_question, 8.0);
}

#[test]
fn same_seed_same_outcome_for_every_selector() {
    let spec = load("random_pools.yaml").compound.unwrap().variants()[1].1.clone();
    let mut noisy = spec.clone();
    noisy.diagnoser_accuracy = 0.7;
    for policy in ["llmselector", "greedy", "random_search", "exhaustive", "best_single", "llmselector_cost"] {
        for s in [&spec, &noisy] {
            let a = run(s, policy, 4, None).unwrap();
            let b = run(s, policy, 4, None).unwrap();
            assert_eq!(a, b, "{policy}");
        }
    }
    assert_ne!(World::new(&spec, 4).difficulty, World::new(&spec, 5).difficulty);
    assert_ne!(World::new(&spec, 4).models, World::new(&spec, 5).models, "each seed draws its own pool");
}

fn parse_error(yaml: &str) -> String {
    workload::parse(yaml, Path::new("w.yaml")).unwrap_err().to_string()
}

const CASE_MODELS: &str = "  models:\n    - {name: A, price: 5}\n    - {name: B, price: 3}\n";

#[test]
fn bad_input_is_rejected_with_the_field_and_a_fix() {
    let base = format!("compound:\n  system: locate_solve\n{CASE_MODELS}");
    assert!(workload::parse(&base, Path::new("w.yaml")).is_ok());

    let e = parse_error(&format!("{base}  start: [A, Z]\n"));
    assert!(e.contains("compound.start[1]") && e.contains("unknown model 'Z'") && e.contains("A, B"), "{e}");
    let e = parse_error(&format!("{base}  start: [A]\n"));
    assert!(e.contains("2 modules"), "{e}");
    let e = parse_error(&format!("{base}  budget: 1\n"));
    assert!(e.contains("compound.budget") && e.contains("below one round"), "{e}");
    for bad in ["1.5", "-0.1"] {
        let e = parse_error(&format!("{base}  diagnoser_accuracy: {bad}\n"));
        assert!(e.contains("compound.diagnoser_accuracy") && e.contains("[0, 1]"), "{e}");
    }
    let e = parse_error(&format!(
        "{base}  variants:\n    - {{diagnoser_accuracy: 0.9}}\n    - {{diagnoser_accuracy: 2}}\n"
    ));
    assert!(e.contains("compound.variants[1].diagnoser_accuracy"), "{e}");
    let e = parse_error(&format!("{base}  pool: {{models: 3}}\n"));
    assert!(e.contains("both `models` and `pool`"), "{e}");
    let e = parse_error("compound:\n  system: debate\n  pool: {models: 27}\n");
    assert!(e.contains("compound.pool.models"), "{e}");
    let e = parse_error("compound:\n  system: debate\n  models:\n    - {name: A, specialties: {lcoate: 1}}\n");
    assert!(e.contains("unknown skill 'lcoate'"), "{e}");
    let e = parse_error("compound:\n  system: debate\n  models:\n    - {name: A}\n    - {name: A}\n");
    assert!(e.contains("named twice"), "{e}");
    let e = parse_error(&format!("{base}  diagnoser: 1\n"));
    assert!(e.contains("unknown field"), "{e}");
    let e = parse_error("compound:\n  system: tree_search\n  pool: {models: 3}\n");
    assert!(e.contains("unknown variant"), "{e}");

    // The command line's --start goes through the same check; run() refuses it too.
    let spec = case_study();
    let e = spec.resolve_allocation(&names(&["C", "F"]), "--start").unwrap_err();
    assert_eq!(e.path, "--start[1]");
    let e = run(&spec, "llmselector", 1, Some(&["C", "F"])).unwrap_err();
    assert!(e.contains("unknown model 'F'"), "{e}");
}

#[test]
fn exhaustive_refuses_a_space_above_its_guard() {
    let spec: CompoundSpec =
        serde_norway::from_str("system: debate\npool: {models: 10}\nquestions: {train: 20, test: 20}\n").unwrap();
    spec.validate().unwrap();
    let e = run(&spec, "exhaustive", 1, None).unwrap_err();
    assert!(e.contains("1000000 allocations (10 models ^ 6 modules)") && e.contains("max_allocations = 100000"), "{e}");
    assert!(e.contains("exhaustive{max_allocations: N}"), "{e}");
    assert!(routelab_policies::exhaustive::check_space(10, 6, 100_000).is_err());
    assert_eq!(routelab_policies::exhaustive::check_space(5, 6, 100_000), Ok(15_625));
    // Under a raised guard the small case study runs; over a lowered one it is refused.
    assert!(run(&case_study(), "exhaustive{max_allocations: 24}", 1, None).unwrap_err().contains("above its guard"));
    // No gap_to_exhaustive above GAP_SPACE_LIMIT, but the run itself works.
    let out = run(&spec, "llmselector", 1, None).unwrap();
    assert_eq!(out.metrics.get("gap_to_exhaustive"), None);
}

#[test]
fn every_compound_workload_parses_and_expands_its_variants() {
    let expect =
        [("case_study.yaml", 1), ("random_pools.yaml", 3), ("noisy_diagnoser.yaml", 7), ("non_monotone.yaml", 4)];
    for (file, n) in expect {
        let w = load(file);
        let variants = w.compound.as_ref().unwrap().variants();
        assert_eq!(variants.len(), n, "{file}");
        for (label, spec) in &variants {
            assert!(spec.variants.is_empty());
            spec.validate().unwrap_or_else(|e| panic!("{file} {label}: {e:?}"));
        }
        assert!(!w.policies.is_empty(), "{file}");
    }
    let pools = load("random_pools.yaml").compound.unwrap();
    let systems: Vec<&str> = pools.variants().iter().map(|(_, s)| s.system.as_str()).collect();
    assert_eq!(systems, ["locate_solve", "self_refine", "debate"]);
    let e = run(&pools, "llmselector", 1, None).unwrap_err();
    assert!(e.contains("variants"), "{e}");
}

#[test]
fn cost_aware_llmselector_trades_accuracy_for_price_as_lambda_grows() {
    let spec = case_study();
    let at = |lambda: f64| run(&spec, &format!("llmselector_cost{{lambda: {lambda}}}"), 1, Some(&["C", "C"])).unwrap();
    let free = at(0.0);
    assert_eq!(free.allocation, names(&["A", "B"]), "λ = 0 is llmselector");
    let costly = at(4.0);
    assert!(costly.metrics.get("cost_per_question").unwrap() < free.metrics.get("cost_per_question").unwrap());
}

/// Selectors loaded from the built plugin library give identical results to the linked-in ones.
#[test]
fn selectors_loaded_from_the_plugin_library_match_the_linked_in_ones() {
    let lib = &crate::common::plugins().builtin;
    let spec = case_study();
    let mut loader = Loader::new();
    for policy in ["llmselector", "greedy", "random_search", "exhaustive", "best_single", "llmselector_cost"] {
        let linked = run(&spec, policy, 1, Some(&["C", "C"])).unwrap();
        let spec_p = PolicySpec::parse(&format!("{}:{policy}", lib.display())).unwrap();
        let mut loaded = loader.selector(&spec_p, &compound::selector_context(&spec, 1)).unwrap();
        let start = names(&["C", "C"]);
        let from_lib = compound::run(&spec, &mut loaded, policy, 1, Some(&start)).unwrap();
        assert_eq!(linked, from_lib, "{policy}");
    }
}

#[test]
fn a_fresh_noisy_diagnoser_costs_evaluations_and_a_frozen_one_can_cycle_to_max_rounds() {
    let variants = load("noisy_diagnoser.yaml").compound.unwrap().variants();
    let find = |label: &str| variants.iter().find(|(l, _)| l == label).unwrap_or_else(|| panic!("{label}")).1.clone();
    let (exact, fresh, frozen) = (
        find("diagnoser_accuracy=1"),
        find("diagnoser_accuracy=0.6"),
        find("diagnoser_accuracy=0.6, diagnoser_noise=frozen"),
    );
    let (mut exact_evaluations, mut fresh_evaluations, mut frozen_cycles) = (0.0, 0.0, 0);
    for seed in 1..=10 {
        let m = |spec: &CompoundSpec| run(spec, "llmselector", seed, None).unwrap().metrics;
        exact_evaluations += m(&exact).get("evaluations").unwrap();
        let fresh = m(&fresh);
        assert_eq!(fresh.get("selector.converged"), Some(1.0), "seed {seed}: fresh noise breaks cycles");
        fresh_evaluations += fresh.get("evaluations").unwrap();
        frozen_cycles += (m(&frozen).get("selector.converged") == Some(0.0)) as u32;
    }
    assert!(fresh_evaluations > 3.0 * exact_evaluations, "{fresh_evaluations} vs {exact_evaluations}");
    assert!(frozen_cycles > 0, "a frozen diagnoser at 0.6 cycles until max_rounds on some pool");
}
