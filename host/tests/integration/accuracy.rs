//! `routelab accuracy` and `calibrate` on the shipped measured runs (workloads/ground-truth/)
//! and layer timings (workloads/profiles/measured/): the errors pinned in a band, bad
//! measurement files refused with their file, line and field.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::*;

const LLAMA: &str = "workloads/ground-truth/RTXPRO6000_Llama-3.1-8B";
const QWEN: &str = "workloads/ground-truth/RTXPRO6000_Qwen3-32B";
const MOE: &str = "workloads/ground-truth/RTXPRO6000_Qwen3-30B-A3B-Instruct-2507";

fn routelab(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_routelab")).args(args).current_dir(workspace()).output().expect("routelab runs")
}

/// The signed error of `key` in each run of an `accuracy --json` document.
fn errors(args: &[&str], key: &str) -> Vec<f64> {
    // One file per call: tests that ask the same question run at once.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let json = fixture("accuracy", &format!("{n}-{key}-{}.json", args.join("_").replace(['/', '.'], "-")));
    let mut all: Vec<&str> = vec!["accuracy"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--json", json.to_str().unwrap()]);
    let out = routelab(&all);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    doc["runs"].as_array().unwrap().iter().map(|r| r["figures"][key]["error"].as_f64().unwrap()).collect()
}

/// The shipped profile was fitted on the Llama run's mean TPOT (its per-step overhead) and on
/// layer timings: on that run every mean lies within a few percent, and the roofline misses TTFT
/// by far more.
#[test]
fn the_calibrated_model_matches_the_llama_run_and_the_roofline_does_not() {
    for (key, band) in [("ttft_mean_s", 0.05), ("tpot_mean_s", 0.02), ("latency_mean_s", 0.02), ("ttft_p90_s", 0.05)] {
        let e = errors(&[LLAMA], key)[0];
        assert!(e.abs() < band, "{key}: error {e}");
    }
    let roofline = errors(&[LLAMA, "--calibration", "roofline"], "ttft_mean_s")[0];
    assert!(roofline < -0.15, "the roofline's TTFT error: {roofline}");
}

/// Held out: Qwen3-32B on two GPUs was fitted on nothing (its all-reduce comes from measured
/// kernel times, not from the run). Its errors are pinned where they stand (docs/accuracy.md:
/// −0.4% to −1.9% on these five since the dense base, the mixed attention and the overhead
/// scale with the model's shape; −7.9% to −10.4% before, when this band was −12% to −5%).
#[test]
fn the_held_out_tp2_run_stays_in_its_documented_band() {
    for key in ["ttft_mean_s", "tpot_mean_s", "latency_mean_s", "tpot_p99_s", "latency_p99_s"] {
        let e = errors(&[QWEN], key)[0];
        assert!((-0.04..0.01).contains(&e), "Qwen3-32B {key} error {e}");
    }
}

/// Held out: the mixture of experts on two data-parallel engines with its experts split across
/// them, priced by the experts its tokens touch, the engines in lock-step, behind vLLM's DP
/// balancer, scheduling one step ahead (docs/accuracy.md: −2.5% TPOT, −2.9% latency, −2.3% P99
/// latency, −15.5% TTFT mean, −10.7% TTFT P50; before async scheduling −16.8% and −24.5%, when
/// the TTFT band was −25% to −10%; with the engine's pickup but scheduling synchronously the P50
/// is −48%, so the P50's band holds the async engine in place).
#[test]
fn the_held_out_moe_run_stays_in_its_documented_band() {
    for key in ["tpot_mean_s", "latency_mean_s", "latency_p99_s"] {
        let e = errors(&[MOE], key)[0];
        assert!((-0.05..0.0).contains(&e), "Qwen3-30B-A3B {key} error {e}");
    }
    let ttft = errors(&[MOE], "ttft_mean_s")[0];
    assert!((-0.20..-0.10).contains(&ttft), "Qwen3-30B-A3B TTFT mean error {ttft}");
    let p50 = errors(&[MOE], "ttft_p50_s")[0];
    assert!((-0.16..-0.05).contains(&p50), "Qwen3-30B-A3B TTFT P50 error {p50}");
}

/// The replay's engine schedules as the profile declares (the shipped one: one step ahead, as
/// vLLM 0.19 does by default) unless the run's `engine_kwargs` say otherwise; a flag that is not
/// a boolean is bad input.
#[test]
fn a_run_that_turned_async_scheduling_off_is_replayed_synchronously() {
    let d = broken_copy("sync-engine");
    let meta = d.join("meta.json");
    let text = std::fs::read_to_string(&meta).unwrap();
    std::fs::write(&meta, text.replace("\"seed\": 42", "\"seed\": 42, \"async_scheduling\": false")).unwrap();
    let sync = errors(&[d.to_str().unwrap()], "ttft_p50_s")[0];
    let ahead = errors(&[LLAMA], "ttft_p50_s")[0];
    assert!(sync < ahead, "taken in at a step's end and scheduled at once, TTFT is shorter: {sync} vs {ahead}");
    std::fs::write(&meta, text.replace("\"seed\": 42", "\"seed\": 42, \"async_scheduling\": \"no\"")).unwrap();
    refused(&d, &["meta.json", "engine_kwargs.async_scheduling", "true or false"]);
}

/// A data-parallel run is replayed behind `vllm_dp_lb` unless `--router` names another: the
/// two balancers send some requests to different engines, so the TTFT differs.
#[test]
fn a_data_parallel_run_is_replayed_behind_vllm_s_balancer_unless_told_otherwise() {
    let own = errors(&[MOE], "ttft_p90_s")[0];
    let named = errors(&[MOE, "--router", "vllm_dp_lb"], "ttft_p90_s")[0];
    let jsq = errors(&[MOE, "--router", "least_requests"], "ttft_p90_s")[0];
    assert_eq!(own, named, "the default is vllm_dp_lb");
    assert_ne!(own, jsq, "least_requests balances differently");
    // One engine: the router does not matter.
    assert_eq!(errors(&[LLAMA], "ttft_p90_s"), errors(&[LLAMA, "--router", "least_requests"], "ttft_p90_s"));
}

/// A copy of the Llama run to break, in a fresh folder.
fn broken_copy(name: &str) -> PathBuf {
    let dir = fixture("accuracy", name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["meta.json", "requests.jsonl", "stream.jsonl", "llmservingsim_cluster_config.json"] {
        std::fs::copy(workspace().join(LLAMA).join(f), dir.join(f)).unwrap();
    }
    dir
}

fn edit_line(file: &Path, line: usize, edit: impl Fn(&str) -> String) {
    let text = std::fs::read_to_string(file).unwrap();
    let out: Vec<String> =
        text.lines().enumerate().map(|(i, l)| if i + 1 == line { edit(l) } else { l.to_string() }).collect();
    std::fs::write(file, out.join("\n") + "\n").unwrap();
}

fn refused(dir: &Path, wanted: &[&str]) {
    let out = routelab(&["accuracy", dir.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(out.stdout.is_empty(), "nothing ran: {}", String::from_utf8_lossy(&out.stdout));
    for w in wanted {
        assert!(err.contains(w), "stderr lacks {w:?}: {err}");
    }
}

#[test]
fn bad_measurement_files_exit_2_naming_file_line_and_field() {
    let d = broken_copy("missing-field");
    edit_line(&d.join("requests.jsonl"), 3, |l| l.replace("\"first_token_ts\"", "\"first_token\""));
    refused(&d, &["requests.jsonl", ":3", "first_token_ts", "missing"]);

    let d = broken_copy("unsorted");
    edit_line(&d.join("requests.jsonl"), 5, |l| l.replace("\"arrival_time\": 17771", "\"arrival_time\": 17770"));
    refused(&d, &["requests.jsonl", ":5", "arrival_time", "arrival order"]);

    let d = broken_copy("negative");
    edit_line(&d.join("requests.jsonl"), 7, |l| {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        let first = v["first_token_ts"].as_f64().unwrap();
        l.replace(&format!("\"last_token_ts\": {}", v["last_token_ts"]), &format!("\"last_token_ts\": {}", first - 1.0))
    });
    refused(&d, &["requests.jsonl", ":7", "last_token_ts", "before the first"]);

    let d = broken_copy("device");
    std::fs::remove_file(d.join("llmservingsim_cluster_config.json")).unwrap();
    edit_line(&d.join("meta.json"), 2, |l| format!("  \"device\": \"a toaster\",\n{l}"));
    refused(&d, &["meta.json", "device", "a toaster", "--gpu"]);

    let d = broken_copy("stream");
    edit_line(&d.join("stream.jsonl"), 4, |l| l.replace("\"output_toks\":", "\"output_toks\":1"));
    refused(&d, &["stream.jsonl", ":4", "output"]);
}

/// `calibrate` refits the shipped profile's kernel terms from the shipped layer timings.
#[test]
fn calibrate_refits_the_shipped_kernel_terms() {
    let out = routelab(&["calibrate", "workloads/profiles/measured/RTXPRO6000_Llama-3.1-8B_bf16_tp1"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let fitted: serde_json::Value = serde_norway::from_slice(&out.stdout).unwrap();
    let shipped: serde_json::Value = serde_norway::from_str(
        &std::fs::read_to_string(workspace().join("workloads/profiles/rtx-pro-6000.yaml")).unwrap(),
    )
    .unwrap();
    for k in [
        "dense_gb_s",
        "dense_tflops",
        "dense_base_share",
        "attention_tflops",
        "attention_gb_s",
        "attention_mixed_head_gb_s",
        "head_gb_s",
    ] {
        assert_eq!(fitted[k], shipped[k], "{k}");
    }
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("dense (per layer)") && err.contains("median error"), "{err}");
}

const SPLITWISE: &str = "workloads/profiles/measured/Splitwise_Llama-2-70B_A100-H100/perf_model.csv";

/// `calibrate --splitwise` fits a profile to whole steps and reports its error on a TP degree it
/// left out (core's `a_profile_fitted_on_tp2_and_tp8_predicts_tp4` pins the figures); the profile
/// it writes reads back as one a workload can name; a bad row is refused with exit 2 naming the
/// file, line and column; flags that belong to kernel-timing fits are refused beside it.
#[test]
fn calibrate_fits_whole_steps_and_refuses_a_bad_row() {
    let out_file = fixture("accuracy", "splitwise-h100.yaml");
    let out = routelab(&[
        "calibrate",
        "--splitwise",
        SPLITWISE,
        "--gpu",
        "h100",
        "--hold-out-tp",
        "4",
        "--out",
        out_file.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("whole steps, TP 2, 8 (fitted)") && err.contains("whole steps, TP 4 (held out)"), "{err}");
    let c: routelab_core::step_model::Calibration =
        serde_norway::from_str(&std::fs::read_to_string(&out_file).unwrap()).unwrap();
    assert_eq!((c.gpu.as_str(), c.fit["steps"].points), ("h100", 76));
    assert!(c.check().is_ok() && c.dense_gb_s <= 3350.0 && c.allreduce_s > 0.0, "{c:?}");

    let text = std::fs::read_to_string(workspace().join(SPLITWISE)).unwrap();
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    let mut f: Vec<String> = lines[2].split(',').map(String::from).collect();
    f[7] = "fast".into();
    lines[2] = f.join(",");
    let bad = fixture("accuracy", "splitwise-bad.csv");
    std::fs::write(&bad, lines.join("\n")).unwrap();
    let out = routelab(&["calibrate", "--splitwise", bad.to_str().unwrap(), "--gpu", "h100"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("splitwise-bad.csv:3") && err.contains("prompt_time"), "{err}");
    let out = routelab(&["calibrate", "--splitwise", SPLITWISE, "--gpu", "h100", "--allreduce", "x.csv"]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
}
