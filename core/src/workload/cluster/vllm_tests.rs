//! A calibrated cluster runs by vLLM's rules unless it says otherwise; the roofline does not.

use std::path::Path;

use super::*;
use crate::plugin::{Loader, PolicySpec};
use crate::runner;
use crate::workload::{Workload, parse};

/// A small calibrated cluster busy enough that the engine rules move its figures; `extra` is
/// spliced into its `cluster:` section.
fn calibrated(extra: &str) -> String {
    format!(
        "seed: 7\ncluster:\n  replicas: 2\n  gpu: rtx-pro-6000\n  model: llama-3.1-8b\n  calibration: rtx-pro-6000\n{extra}\
         \x20 generator: {{system_prompt_tokens: 200, suffix_tokens: {{uniform: {{min: 500, max: 3000}}}}, \
         output_tokens: {{uniform: {{min: 20, max: 200}}}}}}\n  arrivals: {{poisson: {{rate: 40}}}}\n  requests: 300\n"
    )
}

/// vLLM's rules and knobs (RTX PRO 6000: 96 GB, not an A100) written out by hand.
const WRITTEN_OUT: &str = "  memory_fraction: 0.9\n  chunk_tokens: 8192\n  budget_counts_decode: true\n  \
                           max_batch_requests: 1024\n  reservation: {estimate: {output_tokens: 1}}\n  scheduler: fcfs\n";

fn cluster(w: &Workload) -> &ClusterSpec {
    w.cluster.as_ref().unwrap()
}

fn run(w: Workload) -> String {
    let prepared = runner::prepare(w, Path::new("w.yaml")).unwrap();
    let policy = PolicySpec::parse("least_requests").unwrap();
    let result = runner::run_workload(&mut Loader::new(), &prepared, &[policy], &|_| {}, &|_| {});
    assert!(result.results[0].error.is_none(), "{:?}", result.results[0].error);
    serde_json::to_string(&result.results).unwrap()
}

#[test]
fn a_calibrated_workload_without_the_fields_runs_by_vllms_rules() {
    let w = parse(&calibrated(""), Path::new("w.yaml")).unwrap();
    let c = cluster(&w);
    assert_eq!((c.chunk_tokens, c.max_batch_requests), (8192, 1024));
    assert!(c.budget_counts_decode);
    assert_eq!(c.reservation, Reservation::Estimate { output_tokens: 1 });
    assert_eq!((c.memory_fraction, c.scheduler.as_str()), (0.9, "fcfs"));
    // The same as the workload with every field written out, and the same run.
    let written = parse(&calibrated(WRITTEN_OUT), Path::new("w.yaml")).unwrap();
    assert_eq!(w, written);
    let by_default = run(w);
    assert_eq!(by_default, run(written));
    // ... which is not the lecture's engine's run.
    let lecture =
        "  chunk_tokens: 512\n  budget_counts_decode: false\n  max_batch_requests: 256\n  reservation: full\n";
    assert_ne!(by_default, run(parse(&calibrated(lecture), Path::new("w.yaml")).unwrap()));
}

#[test]
fn a_field_the_workload_writes_out_wins() {
    let w = parse(&calibrated("  chunk_tokens: 512\n  reservation: full\n  scheduler: lpm\n"), Path::new("w.yaml"))
        .unwrap();
    let c = cluster(&w);
    assert_eq!((c.chunk_tokens, c.reservation.clone(), c.scheduler.as_str()), (512, Reservation::Full, "lpm"));
    // The rest still vLLM's.
    assert_eq!(c.max_batch_requests, 1024);
    assert!(c.budget_counts_decode);
    // Written out at the lecture's default value: still the workload's.
    let w = parse(&calibrated("  budget_counts_decode: false\n"), Path::new("w.yaml")).unwrap();
    assert!(!cluster(&w).budget_counts_decode);
}

#[test]
fn the_roofline_keeps_the_lectures_engine() {
    let w = parse(&calibrated("").replace("  calibration: rtx-pro-6000\n", ""), Path::new("w.yaml")).unwrap();
    let c = cluster(&w);
    assert_eq!((c.chunk_tokens, c.max_batch_requests, c.budget_counts_decode), (512, 256, false));
    assert_eq!(c.reservation, Reservation::Full);
}

#[test]
fn a_calibration_set_from_the_command_line_brings_the_rules() {
    let doc: serde_norway::Value =
        serde_norway::from_str(&calibrated("").replace("  calibration: rtx-pro-6000\n", "")).unwrap();
    let w = runner::parse_with_sets(&doc, Path::new("w.yaml"), &[("calibration", "rtx-pro-6000")]).unwrap();
    assert_eq!(cluster(&w).chunk_tokens, 8192);
    let sets = [("calibration", "rtx-pro-6000"), ("chunk_tokens", "1024")];
    let w = runner::parse_with_sets(&doc, Path::new("w.yaml"), &sets).unwrap();
    assert_eq!((cluster(&w).chunk_tokens, cluster(&w).max_batch_requests), (1024, 1024));
}

#[test]
fn vllms_default_knobs_follow_the_gpus_memory_and_spare_the_a100() {
    let knobs = |gpu: &str| VllmEngine::defaults_for(&crate::step_model::gpu(gpu).unwrap());
    for gpu in ["rtx-pro-6000", "h100", "h200"] {
        assert_eq!(knobs(gpu), VllmEngine::LARGE_GPU, "{gpu}");
    }
    for gpu in ["a100-80", "a100-40", "rtx4090", "l40s", "a6000"] {
        assert_eq!(knobs(gpu), VllmEngine::SMALL_GPU, "{gpu}");
    }
}
