//! Several models on one cluster (`cluster.models`): bad specs exit 2 naming file, line and
//! field; a trace naming an unknown model likewise; the preset runs the same linked and loaded.

use std::process::Command;

use crate::common::*;

fn scratch(name: &str) -> std::path::PathBuf {
    fixture("models", name)
}

/// Runs `args`, expects exit 2 and every `wanted` fragment in stderr.
fn bad(args: &[&str], wanted: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_routelab")).args(args).current_dir(workspace()).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    for w in wanted {
        assert!(err.contains(w), "{args:?}: stderr lacks {w:?}: {err}");
    }
    assert!(!err.contains("panicked"), "{args:?}: {err}");
}

#[test]
fn bad_model_specs_name_file_line_and_field() {
    let w = scratch("models.yaml");
    let body = "cluster:\n  replicas: 3\n  generator: {suffix_tokens: 100, output_tokens: 10}\n  models:\n    \
                - {name: chat, replicas: 2, share: 0.8}\n    - {name: coder, replicas: 1, share: 0.2}\n  \
                arrivals: {poisson: {rate: 1}}\n  requests: 10\npolicies: [round_robin]\n";
    std::fs::write(&w, body).unwrap();
    let path = w.to_str().unwrap();
    std::fs::write(&w, body.replace("share: 0.2", "share: -1")).unwrap();
    bad(&["validate", path], &["models.yaml:6", "cluster.models[1].share", "positive"]);
    std::fs::write(&w, body.replace("name: coder", "name: chat")).unwrap();
    bad(&["compare", path], &["models.yaml:6", "cluster.models[1].name", "named twice"]);
    std::fs::write(&w, body.replace("replicas: 3", "replicas: 4")).unwrap();
    bad(&["validate", path], &["cluster.replicas", "served by 3 replicas", "replicas: 3"]);
    std::fs::write(&w, body.replace("replicas: 1,", "replicas: 0,")).unwrap();
    bad(&["validate", path], &["cluster.models[1].replicas", "at least 1"]);
    std::fs::write(&w, body.replace("  requests: 10\n", "  requests: 10\n  lora: {adapters: 2}\n")).unwrap();
    bad(&["validate", path], &["cluster.models", "`lora`"]);
}

/// A Mooncake trace naming a model the workload does not serve: exit 2 naming the trace, its
/// line and the field.
#[test]
fn a_trace_naming_an_unknown_model_is_bad_input() {
    let trace = scratch("models.jsonl");
    std::fs::write(
        &trace,
        "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 4, \"hash_ids\": [1, 2], \"model\": \"chat\"}\n\
         {\"timestamp\": 5, \"input_length\": 600, \"output_length\": 4, \"hash_ids\": [1, 3], \"model\": \"vision\"}\n",
    )
    .unwrap();
    let w = scratch("trace.yaml");
    std::fs::write(
        &w,
        "cluster:\n  replicas: 2\n  models: [{name: chat, replicas: 1, share: 1}, {name: coder, replicas: 1, share: 1}]\n  \
         generator: {output_tokens: 4}\n  arrivals: {trace: {path: models.jsonl, format: mooncake}}\npolicies: [round_robin]\n",
    )
    .unwrap();
    bad(&["validate", w.to_str().unwrap()], &["models.jsonl:2", "field `model`", "`vision`", "chat, coder"]);
}

/// The two-model preset, shortened: every router's figures are the same linked in and loaded
/// from the plugin library (one router per model either way), and each model's requests add
/// up to the run's.
#[test]
fn two_models_run_the_same_linked_and_loaded() {
    let lib = &plugins().builtin;
    let yaml = std::fs::read_to_string(workspace().join("workloads/cluster/lora/two_models.yaml"))
        .unwrap()
        .replace("requests: 8000", "requests: 1200")
        .replace("seeds: 3", "seeds: 2");
    let names = ["round_robin", "dynamo_kv", "llm_d"];
    let linked: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    let loaded: Vec<String> = names.iter().map(|s| format!("{}:{s}", lib.display())).collect();
    let a = compare_text(&yaml, "two_models.yaml", &linked);
    let b = compare_text(&yaml, "two_models.yaml", &loaded);
    for (x, y) in a.results.iter().zip(&b.results) {
        assert!(x.error.is_none() && y.error.is_none(), "{:?} {:?}", x.error, y.error);
        assert_eq!(x.per_seed, y.per_seed, "{} differs when loaded", x.policy);
        let m = &x.metrics;
        let (chat, coder) = (m.get("model.chat.requests").unwrap(), m.get("model.coder.requests").unwrap());
        assert!((chat + coder - 1200.0).abs() < 1e-9 && chat > 2.0 * coder, "{chat} + {coder}");
        assert_eq!(m.get("model.chat.served_elsewhere"), Some(0.0));
    }
}
