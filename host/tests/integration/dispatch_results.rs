//! The classic results of the dispatch world (docs/experiments.md), each an assertion with a tolerance taken from a stable run
//! (the figures in comments are what those runs gave; rerun with the command beside them).

use crate::common::*;

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

/// Random dispatch at ρ = 0.9 is 16 M/M/1 queues: mean response 1/(1−ρ) = 10.
/// `routelab exercise 2` gave 10.18 ± 0.21 with 10^6 requests × 5 seeds.
#[test]
fn random_dispatch_approaches_mm1_mean() {
    let yaml = "seed: 1\nseeds: 5\ndispatch: {servers: 16, utilisation: 0.9, requests: 1000000, warmup: 0.1}\n";
    let w = compare_text(yaml, "mm1.yaml", &s(&["random"]));
    let m = metric(&w, "random", "response_mean");
    assert!((m - 10.0).abs() < 0.5, "mean response {m}, theory 10");
}

/// Balls into bins, n = 10^5: random's maximum ≈ 7.8, two choices' ≈ 3.4 (5 seeds).
#[test]
fn two_choices_max_load_is_far_below_random() {
    let w = compare_file("workloads/dispatch/balls_1e5.yaml", &["random", "power_of_two"]);
    let random = metric(&w, "random", "max_load");
    let two = metric(&w, "power_of_two", "max_load");
    assert!(random >= 6.5, "random max load {random}");
    assert!(two <= 4.5, "two-choice max load {two}");
    assert!(random - two >= 3.0, "random {random} vs two-choice {two}");
}

/// ρ = 0.9, exponential: JSQ 1.60 and LWL 1.39 against random's 10.35 (3 seeds).
#[test]
fn jsq_and_lwl_beat_random_by_a_wide_margin() {
    let w = compare_file(
        "workloads/dispatch/exp_rho09.yaml",
        &["random", "round_robin", "least_requests", "least_work_left"],
    );
    let random = metric(&w, "random", "response_mean");
    for p in ["least_requests", "least_work_left"] {
        let m = metric(&w, p, "response_mean");
        assert!(m < 0.25 * random, "{p}: {m} vs random {random}");
    }
    assert!(metric(&w, "round_robin", "response_mean") < 0.8 * random);
}

/// Heavy tails: LWL's P99 is below JSQ's on every seed (ratios 0.44–0.60 over 5 seeds).
#[test]
fn lwl_tail_beats_jsq_with_heavy_tailed_sizes() {
    let w = compare_file("workloads/dispatch/heavy_tail_rho09.yaml", &["least_requests", "least_work_left"]);
    let jsq = per_seed(&w, "least_requests", "response_p99");
    let lwl = per_seed(&w, "least_work_left", "response_p99");
    for (j, l) in jsq.iter().zip(&lwl) {
        assert!(l < j, "LWL p99 {l} not below JSQ p99 {j}");
    }
    let ratio = metric(&w, "least_work_left", "response_p99") / metric(&w, "least_requests", "response_p99");
    assert!(ratio < 0.75, "LWL/JSQ p99 ratio {ratio}");
}

/// Stale information (refresh every 4): JSQ herds (13.4, worse than random's 10.4; 1.6 fresh)
/// while power-of-two barely degrades (4.0 stale, 2.9 fresh).
#[test]
fn jsq_herds_on_stale_information_while_power_of_two_holds() {
    let stale = compare_file("workloads/dispatch/stale_rho09.yaml", &["random", "least_requests", "power_of_two"]);
    let fresh = compare_file("workloads/dispatch/exp_rho09.yaml", &["least_requests", "power_of_two"]);
    let jsq_stale = metric(&stale, "least_requests", "response_mean");
    let jsq_fresh = metric(&fresh, "least_requests", "response_mean");
    let random_stale = metric(&stale, "random", "response_mean");
    assert!(jsq_stale > random_stale, "stale JSQ {jsq_stale} should herd past random {random_stale}");
    assert!(jsq_stale > 4.0 * jsq_fresh, "stale JSQ {jsq_stale} vs fresh {jsq_fresh}");
    let p2_stale = metric(&stale, "power_of_two", "response_mean");
    let p2_fresh = metric(&fresh, "power_of_two", "response_mean");
    assert!(p2_stale < 1.6 * p2_fresh, "power of two stale {p2_stale} vs fresh {p2_fresh}");
    assert!(p2_stale < 0.5 * jsq_stale);
}

/// Common random numbers and determinism: the same seed gives identical numbers, another seed
/// different ones.
#[test]
fn same_seed_same_numbers() {
    let yaml = |seed: u64| format!("seed: {seed}\ndispatch: {{servers: 8, utilisation: 0.8, requests: 20000}}\n");
    let a = compare_text(&yaml(3), "a.yaml", &s(&["power_of_two", "least_requests"]));
    let b = compare_text(&yaml(3), "a.yaml", &s(&["power_of_two", "least_requests"]));
    let c = compare_text(&yaml(4), "a.yaml", &s(&["power_of_two", "least_requests"]));
    assert_eq!(a.results[0].metrics, b.results[0].metrics);
    assert_eq!(a.results[1].metrics, b.results[1].metrics);
    assert_ne!(a.results[0].metrics, c.results[0].metrics);
}

/// Warm-up leaves the first requests out of the statistics.
#[test]
fn warmup_discards_leading_requests() {
    let yaml = "dispatch: {servers: 4, utilisation: 0.5, requests: 10000, warmup: 0.25}\n";
    let w = compare_text(yaml, "w.yaml", &s(&["round_robin"]));
    assert_eq!(metric(&w, "round_robin", "requests"), 7500.0);
}

/// Every service distribution is scaled to mean 1: utilisation achieved ≈ ρ.
#[test]
fn service_distributions_have_mean_one() {
    for service in [
        "exponential",
        "deterministic",
        "{lognormal: {cv: 2.0}}",
        "{bounded_pareto: {alpha: 1.5, min: 1.0, max: 100.0}}",
        "{bimodal: {p_large: 0.1, small: 1.0, large: 10.0}}",
        "{empirical: {values: [1.0, 2.0, 9.0]}}",
    ] {
        let yaml = format!("dispatch: {{servers: 4, utilisation: 0.5, requests: 200000, service: {service}}}\n");
        let w = compare_text(&yaml, "svc.yaml", &s(&["round_robin"]));
        let u = metric(&w, "round_robin", "utilisation");
        assert!((u - 0.5).abs() < 0.03, "{service}: utilisation {u}");
    }
}

/// Deterministic service with round robin at ρ < 1 never queues: D/D/1-like, response exactly 1.
#[test]
fn deterministic_round_robin_poisson_has_response_at_least_one() {
    let yaml = "dispatch: {servers: 4, utilisation: 0.3, requests: 10000, service: deterministic}\n";
    let w = compare_text(yaml, "d.yaml", &s(&["round_robin"]));
    assert!((metric(&w, "round_robin", "response_p50") - 1.0).abs() < 1e-6);
}

/// Trace arrivals are rescaled to the workload's utilisation. With the real Azure LLM code trace
/// shipped in `workloads/traces/`, least requests beats random on production's bursty arrivals.
#[test]
fn trace_arrivals_replay_at_the_requested_utilisation() {
    let path = workspace().join("workloads/traces/azure-llm-2023/AzureLLMInferenceTrace_code.csv");
    let yaml = format!(
        "dispatch: {{servers: 8, utilisation: 0.7, requests: 100000, arrivals: {{trace: {{path: '{}'}}}}}}\n",
        path.display()
    );
    let w = compare_text(&yaml, "trace.yaml", &s(&["random", "least_requests"]));
    let n = metric(&w, "random", "requests");
    assert!(n > 1000.0, "only {n} requests replayed");
    let u = metric(&w, "random", "utilisation");
    assert!((u - 0.7).abs() < 0.1, "utilisation achieved {u}");
    assert!(metric(&w, "least_requests", "response_mean") < metric(&w, "random", "response_mean"));
    assert!(w.notes.iter().any(|n| n.contains("trace arrivals")), "{:?}", w.notes);
}
