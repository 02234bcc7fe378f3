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
    // A model's own hardware: an unknown GPU, a TP degree outside 1/2/4/8.
    std::fs::write(&w, body.replace("share: 0.2}", "share: 0.2, gpu: b9000}")).unwrap();
    bad(&["validate", path], &["models.yaml:6", "cluster.models[1].gpu", "b9000", "fix:"]);
    std::fs::write(&w, body.replace("share: 0.2}", "share: 0.2, gpu: h100, tp: 3}")).unwrap();
    bad(&["compare", path], &["models.yaml:6", "cluster.models[1].tp", "1, 2, 4 or 8", "fix:"]);
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

/// `routelab import --workload W` carries each log line's `model` (inline, or the request
/// body's `request.model`) into the trace when W serves several models: the replay under W
/// counts each model's requests as the log gives them. A model W does not serve, a line
/// without a model, or several models with no workload to name them: exit 2 naming the log's
/// file, line and field, and the fix.
#[test]
fn import_carries_each_requests_model_into_a_several_models_workload() {
    let line = |t: f64, model: &str| match model {
        "" => format!("{{\"timestamp\": {t}, \"prompt\": \"request at {t}\", \"output_tokens\": 5}}\n"),
        m if t < 1.0 => {
            format!(
                "{{\"timestamp\": {t}, \"request\": {{\"model\": \"{m}\", \"prompt\": \"request at {t}\"}}, \"output_tokens\": 5}}\n"
            )
        }
        m => format!(
            "{{\"timestamp\": {t}, \"model\": \"{m}\", \"prompt\": \"request at {t}\", \"output_tokens\": 5}}\n"
        ),
    };
    let log_of = |rows: &[(f64, &str)]| rows.iter().map(|&(t, m)| line(t, m)).collect::<String>();
    let log = scratch("import-log.jsonl");
    // Out of time order: the trace's rows are sorted, each keeping its own model.
    std::fs::write(&log, log_of(&[(0.0, "coder"), (1.5, "chat"), (0.5, "chat"), (2.0, "coder"), (2.5, "chat")]))
        .unwrap();
    let trace = scratch("import-trace.jsonl");
    let workload = scratch("import.yaml");
    let yaml = format!(
        "name: imported\nseeds: 1\ncluster:\n  replicas: 3\n  generator: {{output_tokens: 16}}\n  models:\n    \
         - {{name: chat, replicas: 2, share: 1}}\n    - {{name: coder, replicas: 1, share: 1}}\n  \
         arrivals: {{trace: {{path: {}, format: mooncake}}}}\n",
        trace.display()
    );
    std::fs::write(&workload, &yaml).unwrap();
    let (log_s, trace_s, workload_s) = (log.to_str().unwrap(), trace.to_str().unwrap(), workload.to_str().unwrap());
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_routelab")).args(args).current_dir(workspace()).output().unwrap()
    };
    let out = run(&["import", log_s, "--out", trace_s, "--workload", workload_s]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let models: Vec<String> = std::fs::read_to_string(&trace)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["model"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(models, ["coder", "chat", "chat", "coder", "chat"]);
    let result = compare_text(&yaml, workload_s, &["round_robin".to_string()]);
    let count = |k: &str| metric(&result, "round_robin", k);
    assert_eq!((count("model.chat.requests"), count("model.coder.requests")), (3.0, 2.0));
    assert_eq!((count("model.chat.served_elsewhere"), count("model.coder.served_elsewhere")), (0.0, 0.0));

    let bad = |rows: &[(f64, &str)], workload: Option<&str>, wanted: &[&str]| {
        std::fs::write(&log, log_of(rows)).unwrap();
        let mut args = vec!["import", log_s, "--out", trace_s];
        args.extend(workload.map(|w| ["--workload", w]).into_iter().flatten());
        let out = run(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{rows:?}: {err}");
        for w in wanted.iter().chain(&["fix:"]) {
            assert!(err.contains(w), "{rows:?}: stderr lacks {w:?}: {err}");
        }
    };
    let w = Some(workload_s);
    bad(&[(0.0, "chat"), (1.0, "vision")], w, &["import-log.jsonl:2: field `model`", "`vision`", "chat, coder"]);
    bad(&[(1.0, "chat"), (0.5, "vision")], w, &["import-log.jsonl:2: field `request.model`", "`vision`"]);
    bad(&[(1.0, "chat"), (2.0, "")], w, &["import-log.jsonl:2: field `model`", "names no model", "chat, coder"]);
    bad(&[(1.0, "chat"), (2.0, "coder")], None, &["import-log.jsonl:2: field `model`", "`chat`", "--workload"]);
    // One model and no workload: the trace names none (one model serves it).
    std::fs::write(&log, log_of(&[(1.0, "chat"), (2.0, "chat")])).unwrap();
    let out = run(&["import", log_s, "--out", trace_s]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!std::fs::read_to_string(&trace).unwrap().contains("\"model\""));
}
