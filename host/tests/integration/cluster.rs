//! The cluster world through the CLI and the plugin library: documented JSON keys, bit-identical
//! results when policies are loaded from libraries, the example prefix-aware plugin, trace replay
//! and bad input.

use std::process::Command;

use crate::common::*;

fn routelab(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_routelab")).args(args).current_dir(workspace()).output().expect("routelab runs")
}

fn scratch(name: &str) -> std::path::PathBuf {
    fixture("cluster", name)
}

/// Issue 3's command: long_doc_qa, three classic routers, three seeds, JSON with the documented keys.
#[test]
fn long_doc_qa_json_has_the_cluster_keys() {
    let json = scratch("ldq.json");
    let out = routelab(&[
        "compare",
        "workloads/cluster/long_doc_qa.yaml",
        "--policies",
        "round_robin,least_requests,least_work_left",
        "--seeds",
        "3",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let w = &v["workloads"][0];
    assert_eq!(w["world"], "cluster");
    assert_eq!(w["seeds"], 3);
    for r in w["results"].as_array().unwrap() {
        for k in routelab_core::metrics::CLUSTER_KEYS {
            assert!(r["metrics"][k].is_number(), "{} lacks {k}", r["policy"]);
        }
        assert_eq!(r["per_seed"].as_array().unwrap().len(), 3);
        assert_eq!(r["metrics"]["completed"], r["metrics"]["requests"]);
    }
}

/// Every router, loaded from the built plugin library, gives bit-identical cluster metrics
/// (Preble's own figures included) to the linked-in one.
#[test]
fn cluster_results_are_bit_identical_from_the_plugin_library() {
    let lib = &plugins().builtin;
    let yaml = std::fs::read_to_string(workspace().join("workloads/cluster/long_doc_qa.yaml"))
        .unwrap()
        .replace("requests: 1000", "requests: 300")
        .replace("seeds: 3", "seeds: 2");
    let names = [
        "round_robin",
        "least_work_left",
        "threshold_affinity",
        "sglang_cache_aware",
        "preble",
        "preble{rebalance: false, pd_pairing: false}",
    ];
    let linked: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    let loaded: Vec<String> = names.iter().map(|s| format!("{}:{s}", lib.display())).collect();
    let a = compare_text(&yaml, "ldq.yaml", &linked);
    let b = compare_text(&yaml, "ldq.yaml", &loaded);
    for (x, y) in a.results.iter().zip(&b.results) {
        assert!(x.error.is_none() && y.error.is_none(), "{:?} {:?}", x.error, y.error);
        assert_eq!(x.per_seed, y.per_seed, "{} differs when loaded", x.policy);
    }
    let preble = &a.results[4].metrics;
    for k in [
        "router.cost_l_mean_s",
        "router.cost_m_mean_s",
        "router.cost_p_mean_s",
        "router.exploit_decisions",
        "router.explore_decisions",
    ] {
        assert!(preble.get(k).is_some(), "preble lacks {k}");
    }
}

/// The policies-as-plugins story: `policies/examples/lru-affinity`, a prefix-aware router written
/// only against policy-api and its toolkit, loaded by path, against the built-ins.
#[test]
fn example_prefix_router_plugin_competes_with_the_builtins() {
    let lib = &plugins().lru_affinity;
    let yaml = std::fs::read_to_string(workspace().join("workloads/cluster/long_doc_qa.yaml")).unwrap();
    let w = compare_text(
        &yaml,
        "ldq.yaml",
        &["round_robin".into(), lib.display().to_string(), "sglang_cache_aware".into()],
    );
    // A plugin given by path alone is shown by its library's name, not its path.
    let label = "lru_affinity".to_string();
    assert_eq!(w.results[1].policy, label);
    let rr_hit = metric(&w, "round_robin", "hit_rate");
    let mine_hit = metric(&w, &label, "hit_rate");
    assert!(mine_hit > rr_hit + 0.1, "lru_affinity hit rate {mine_hit} vs round robin {rr_hit}");
    assert_eq!(metric(&w, &label, "overloaded"), 0.0);
    assert!(metric(&w, &label, "latency_mean_s") < metric(&w, "round_robin", "latency_mean_s"));
    assert!(metric(&w, &label, "router.affinity_decisions") > 0.0, "the plugin's own figures are reported");
}

/// The Azure conversation trace shipped in `workloads/traces/` replays end to end, every row.
#[test]
fn azure_conversation_trace_replays_end_to_end() {
    let json = scratch("azure.json");
    let args = [
        "compare",
        "workloads/cluster/azure_conv.yaml",
        "--policies",
        "round_robin,least_work_left",
        "--json",
        json.to_str().unwrap(),
    ];
    let out = routelab(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = 19_366.0;
    for r in v["workloads"][0]["results"].as_array().unwrap() {
        assert_eq!(r["metrics"]["requests"].as_f64(), Some(rows), "{}", r["policy"]);
        assert!(r["metrics"]["completed"].as_f64().unwrap() > 0.9 * rows);
    }
    // A missing trace says where the public dataset lives; exit 2.
    let out = routelab(&["validate", "workloads/cluster/azure_conv.yaml", "--trace", "no/such/trace.csv"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no/such/trace.csv") && err.contains("AzurePublicDataset"), "{err}");
}

/// The Mooncake conversation trace shipped in `workloads/traces/` replays end to end, every row,
/// with its prefix sharing reaching the caches.
#[test]
fn mooncake_conversation_trace_replays_end_to_end() {
    let json = scratch("mooncake.json");
    let args = [
        "compare",
        "workloads/cluster/mooncake_conversation.yaml",
        "--policies",
        "round_robin,least_requests",
        "--json",
        json.to_str().unwrap(),
    ];
    let out = routelab(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = 12_031.0;
    for r in v["workloads"][0]["results"].as_array().unwrap() {
        assert_eq!(r["metrics"]["requests"].as_f64(), Some(rows), "{}", r["policy"]);
        assert_eq!(r["metrics"]["completed"].as_f64(), Some(rows), "{}", r["policy"]);
        // Requests share hash ids (block 0 opens most prompts): some prompt tokens hit the cache.
        assert!(r["metrics"]["hit_rate"].as_f64().unwrap() > 0.01, "{}", r["metrics"]);
    }
}

/// Bad Mooncake rows are bad input naming file, line and field, exit 2.
#[test]
fn bad_mooncake_rows_exit_2_with_line_and_field() {
    let ok = "{\"timestamp\": 0, \"input_length\": 1000, \"output_length\": 5, \"hash_ids\": [0, 1]}\n";
    let cases = [
        ("malformed.jsonl", format!("{ok}{{\"timestamp\": 3, \"input_length\": 10,\n"), ":2", "JSON"),
        (
            "missing.jsonl",
            format!("{ok}{ok}{{\"timestamp\": 3, \"output_length\": 1, \"hash_ids\": [0]}}\n"),
            ":3",
            "input_length",
        ),
        (
            "long_ids.jsonl",
            format!(
                "{ok}{{\"timestamp\": 3, \"input_length\": 1024, \"output_length\": 1, \"hash_ids\": [0, 1, 2]}}\n"
            ),
            ":2",
            "hash_ids",
        ),
    ];
    for (name, text, line, field) in cases {
        let p = scratch(name);
        std::fs::write(&p, text).unwrap();
        let out =
            routelab(&["validate", "workloads/cluster/mooncake_conversation.yaml", "--trace", p.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(err.contains(&format!("{name}{line}")) && err.contains(field) && err.contains("fix:"), "{name}: {err}");
    }
}

#[test]
fn bad_cluster_input_exits_2_with_field_and_fix() {
    let base = std::fs::read_to_string(workspace().join("workloads/cluster/long_doc_qa.yaml")).unwrap();
    let cases = [
        ("too_big.yaml", base.replace("model: mistral-7b", "model: llama-3-70b"), "cluster.model", "fit"),
        ("zipf.yaml", base.replace("{zipf: {s: 1.1}}", "{zipf: {s: 0.0}}"), "zipf", "s"),
        (
            "chunk.yaml",
            base.replace("  replicas: 4\n", "  replicas: 4\n  chunk_tokens: 0\n  max_step_tokens: 8192\n"),
            "chunk_tokens",
            "0",
        ),
    ];
    for (name, yaml, field, what) in cases {
        let p = scratch(name);
        std::fs::write(&p, yaml).unwrap();
        let out = routelab(&["validate", p.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(
            err.contains(name) && err.contains(field) && err.contains(what) && err.contains("fix:"),
            "{name}: {err}"
        );
    }
    // A malformed trace row names its line.
    let trace = scratch("bad_trace.csv");
    std::fs::write(
        &trace,
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6962430,945,160\n2023-11-16 18:15:47.0,oops,1\n",
    )
    .unwrap();
    let out = routelab(&["validate", "workloads/cluster/azure_conv.yaml", "--trace", trace.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("bad_trace.csv:3") && err.contains("ContextTokens"), "{err}");
}

#[test]
fn step_model_prints_the_calibration_anchors() {
    let out = routelab(&["step-model", "--gpu", "a6000", "--model", "mistral-7b"]);
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(s.contains("219089") && s.contains("131072"), "{s}");
    let out = routelab(&["step-model", "--gpu", "a6000", "--model", "llama-3-70b"]);
    assert_eq!(out.status.code(), Some(2));
}

/// Exercise 3: E2 exploits replica 2, whose prefill is ~9× shorter.
#[test]
fn exercise_3_exploits_the_cached_document() {
    let text = routelab::exercises::routing::exercise3();
    assert!(
        text.contains("EXPLOIT") && text.contains("longest match: {2}") && text.contains("chose replica 2"),
        "{text}"
    );
}

/// Every figure docs/exercises.md quotes for an exercise is in what the exercise prints.
fn prints_what_the_docs_quote(exercise: &str, output: &str, figures: &[&str]) {
    let docs = std::fs::read_to_string(workspace().join("docs/exercises.md")).expect("docs/exercises.md");
    for f in figures {
        assert!(docs.contains(f), "docs/exercises.md no longer quotes {f} for exercise {exercise}");
        assert!(
            output.contains(f),
            "exercise {exercise} no longer prints {f} (docs/exercises.md quotes it):\n{output}"
        );
    }
}

/// Issue 31: exercise 3 prices both conventions, and `step-model --tokens --cached` prints the same.
#[test]
fn exercise_3_prints_what_the_docs_quote() {
    let text = routelab::exercises::routing::exercise3();
    let figures = ["0.462 s", "4.211 s", "9.1×", "0.267 s", "4.210 s", "15.8×", "3.748 s", "14.1×"];
    prints_what_the_docs_quote("3", &text, &figures);
    let out = routelab(&["step-model", "--tokens", "23000", "--cached", "21013"]);
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{s}");
    assert!(s.contains("1987 new tokens") && s.contains("0.462 s  with") && s.contains("0.267 s  without"), "{s}");
    let out = routelab(&["step-model", "--tokens", "100", "--cached", "200"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--cached") && err.contains("at most --tokens"), "{err}");
}

/// Issue 31: exercise 5 answers the lecture's question (6 of 55; a round of 10 + 9 + … + 1) and its
/// run is the one the docs describe.
#[test]
fn exercise_5_prints_what_the_docs_quote() {
    let text = routelab::exercises::cluster::exercise5();
    let figures = ["floor(0.63 × 10) = 6", "7 of 55", "55 requests in the round", "11.84", "40.53", "16.04", "46.68"];
    prints_what_the_docs_quote("5", &text, &figures);
    assert!(text.contains("it gets 6."), "{text}");
    assert!(text.contains("but less than under FCFS"), "the run and its explanation disagree: {text}");
}

/// Exercise 8: with prompt eviction events Preble's belief is exact; delays and SGLang's timer-trimmed
/// trees make mistakes, the untrimmed tree the most.
#[test]
fn exercise_8_measures_phantom_cache_beliefs() {
    let rows = routelab::exercises::routing::exercise8_rows(1);
    let mistakes = |i: usize| rows[i].1[1];
    assert_eq!(rows[3].1[0], 1000.0);
    assert_eq!(mistakes(3), 0.0, "preble with undelayed eviction events never believes a phantom");
    assert!(mistakes(0) > mistakes(1) && mistakes(1) > mistakes(2) && mistakes(2) > 0.0, "{rows:?}");
    assert!(mistakes(5) > mistakes(4) && mistakes(4) > 0.0, "longer delays, more mistakes: {rows:?}");
}

/// Exercise 9 answers from runs: every layout and decision order has a finite figure, and the
/// Preble comparison counts pairings when on and none when off.
#[test]
fn exercise_9_compares_layouts_decision_orders_and_pairing() {
    let text = routelab::exercises::pd::exercise9();
    for needle in
        ["8 aggregated", "4P4D", "6P2D", "pd_llm_d", "pd_dynamo", "pd_aibrix", "pd_mooncake", "Pairing on vs off"]
    {
        assert!(text.contains(needle), "{needle}: {text}");
    }
    assert!(!text.contains("NaN") && !text.contains("inf"), "{text}");
    assert!(text.contains("paired 0") && !text.contains("paired NaN"), "{text}");
    prints_what_the_docs_quote(
        "9",
        &text,
        &["68–79%", "96–97%", "939–1460 ms", "106–269 ms", "written back to the prefill side"],
    );
    assert!(text.contains("near saturation"), "{text}");
}

/// The shipped agent-session trace replays (every call, its sessions counted); a bad session
/// field in a swapped-in trace stops the run with exit 2 naming the file, line and field.
#[test]
fn a_session_trace_replays_and_a_bad_wait_names_file_line_and_field() {
    // By its absolute path: the trace's path is relative to the workload file.
    let file = workspace().join("workloads/cluster/agentic/recorded_sessions.yaml");
    let text = std::fs::read_to_string(&file).unwrap();
    let w = compare_text(&text, file.to_str().unwrap(), &["least_work_left".to_string()]);
    assert_eq!(metric(&w, "least_work_left", "completed"), 68.0);
    assert_eq!(metric(&w, "least_work_left", "sessions_completed"), 12.0);
    let shipped = std::fs::read_to_string(workspace().join("workloads/traces/agent-sessions/sessions.jsonl")).unwrap();
    let mut lines: Vec<String> = shipped.lines().map(String::from).collect();
    let k = lines.iter().position(|l| l.contains("\"wait_s\"")).unwrap();
    lines[k] = lines[k].replace("\"wait_s\": ", "\"wait_s\": -");
    let bad = scratch("bad_sessions.jsonl");
    std::fs::write(&bad, lines.join("\n")).unwrap();
    let out =
        routelab(&["compare", "workloads/cluster/agentic/recorded_sessions.yaml", "--trace", bad.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(&format!("bad_sessions.jsonl:{}", k + 1)), "{err}");
    assert!(err.contains("wait_s"), "{err}");
}
