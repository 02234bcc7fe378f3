//! The `routelab` binary as a user meets it: bad input, JSON keys, the scaffold, the demo.

use std::path::PathBuf;
use std::process::{Command, Output};

use crate::common::*;

fn routelab(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_routelab")).args(args).current_dir(workspace()).output().expect("routelab runs")
}

fn scratch(name: &str) -> PathBuf {
    fixture("cli", name)
}

/// Writes `yaml` to a file and runs `validate` on it; returns (exit code, stderr).
fn validate(name: &str, yaml: &str) -> (i32, String) {
    let p = scratch(name);
    std::fs::write(&p, yaml).unwrap();
    let out = routelab(&["validate", p.to_str().unwrap()]);
    (out.status.code().unwrap(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn bad_workloads_name_file_field_and_fix_with_exit_2() {
    let cases = [
        (
            "unknown_field.yaml",
            "dispatch: {servers: 4, requests: 10, utilisaton: 0.5}\n",
            "dispatch.utilisaton",
            "unknown field `utilisaton`",
        ),
        ("wrong_type.yaml", "dispatch:\n  servers: many\n  requests: 10\n", "dispatch.servers", "invalid type"),
        ("rho_one.yaml", "dispatch: {servers: 4, requests: 10, utilisation: 1.0}\n", "dispatch.utilisation", "(0, 1)"),
        ("zero_servers.yaml", "dispatch: {servers: 0, requests: 10}\n", "dispatch.servers", "at least 1"),
        (
            "bad_cv.yaml",
            "dispatch: {servers: 2, requests: 10, service: {lognormal: {cv: -1}}}\n",
            "dispatch.service.lognormal.cv",
            "positive",
        ),
        ("no_world.yaml", "seed: 3\n", "", "no world section"),
    ];
    for (file, yaml, field, what) in cases {
        let (code, err) = validate(file, yaml);
        assert_eq!(code, 2, "{file}: {err}");
        assert!(err.contains(file), "{file}: message lacks the file: {err}");
        if !field.is_empty() {
            assert!(err.contains(&format!("field `{field}`")), "{file}: message lacks the field path: {err}");
        }
        assert!(err.contains(what), "{file}: {err}");
        assert!(err.contains("fix:"), "{file}: no fix offered: {err}");
    }
    // Wrong type reports the line.
    let (_, err) = validate("wrong_type.yaml", "dispatch:\n  servers: many\n  requests: 10\n");
    assert!(err.contains("wrong_type.yaml:2"), "{err}");
}

#[test]
fn missing_workload_and_unknown_policy_exit_2_but_others_report() {
    let out = routelab(&["compare", "no/such.yaml", "--policies", "random"]);
    assert_eq!(out.status.code(), Some(2));
    let p = scratch("small.yaml");
    std::fs::write(&p, "dispatch: {servers: 4, utilisation: 0.5, requests: 2000}\n").unwrap();
    let out = routelab(&["compare", p.to_str().unwrap(), "--policies", "random,bogus,round_robin"]);
    assert_eq!(out.status.code(), Some(2));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no router named 'bogus'"), "{stderr}");
    assert!(stdout.contains("round_robin") && stdout.contains("random"), "{stdout}");
}

/// `compare --json` writes the documented keys (docs/output.md).
#[test]
fn compare_json_has_the_documented_keys() {
    let p = scratch("j.yaml");
    std::fs::write(&p, "name: j\nseeds: 2\ndispatch: {servers: 4, utilisation: 0.6, requests: 4000}\n").unwrap();
    let json = scratch("j.json");
    let csv = scratch("j.csv");
    let out = routelab(&[
        "compare",
        p.to_str().unwrap(),
        "--policies",
        "random,power_of_two{d: 3}",
        "--json",
        json.to_str().unwrap(),
        "--csv",
        csv.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["routelab"], env!("CARGO_PKG_VERSION"));
    assert_eq!(v["command"], "compare");
    let w = &v["workloads"][0];
    for k in ["name", "world", "seed", "seeds", "resolved", "results"] {
        assert!(!w[k].is_null(), "missing workload key {k}");
    }
    assert_eq!(w["world"], "dispatch");
    assert_eq!(w["resolved"]["dispatch"]["servers"], 4);
    let r = &w["results"][1];
    assert_eq!(r["policy"], "power_of_two{d: 3}");
    assert_eq!(r["config"], "{d: 3}");
    for k in ["response_mean", "response_p50", "response_p99", "requests", "response_mean_ci95"] {
        assert!(r["metrics"][k].is_number(), "missing metric {k}: {}", r["metrics"]);
    }
    assert_eq!(r["per_seed"].as_array().unwrap().len(), 2);
    let csv = std::fs::read_to_string(&csv).unwrap();
    assert!(csv.starts_with("workload,world,seed,seeds,policy,error,requests,"), "{csv}");
    assert!(csv.lines().next().unwrap().contains(",response_mean,"), "{csv}");
    assert_eq!(csv.lines().count(), 3);
}

/// The demo shows the three worlds: max affinity overloads while threshold affinity beats round
/// robin on long documents; JSQ beats random; LLMSelector leaves greedy's local optimum.
#[test]
fn demo_shows_the_dilemma_the_classics_and_llmselector() {
    let out = routelab(&["demo"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let s = String::from_utf8_lossy(&out.stdout);
    let row = |name: &str| {
        s.lines()
            .find(|l| l.starts_with(&format!("│ {name} ")))
            .unwrap_or_else(|| panic!("no row {name}:\n{s}"))
            .to_string()
    };
    assert!(row("max_affinity").contains("overloaded"), "{s}");
    for p in ["preble", "sglang_cache_aware", "least_requests", "power_of_two", "least_work_left"] {
        row(p);
    }
    assert!(row("llmselector").contains("A+B") && row("greedy").contains("C+C"), "{s}");
}

/// `new-policy` generates a crate per kind whose printed next commands work as printed: the build,
/// then a comparison that loads the library where that kind plugs in.
#[test]
fn new_policy_prints_commands_that_work_for_every_kind() {
    // One target directory for the three crates, as the scaffold's README recommends.
    let shared_target = target_dir().join("test-fixtures/scaffold-target");
    let bin_dir = std::path::Path::new(env!("CARGO_BIN_EXE_routelab")).parent().unwrap().to_path_buf();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    for kind in ["router", "scheduler", "selector"] {
        let dir = target_dir().join(format!("test-fixtures/new-{kind}"));
        let _ = std::fs::remove_dir_all(&dir);
        let out = Command::new(env!("CARGO_BIN_EXE_routelab"))
            .args(["new-policy", dir.to_str().unwrap(), "--kind", kind])
            .env("CARGO_TARGET_DIR", &shared_target)
            .output()
            .unwrap();
        let printed = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
        assert!(readme.contains("CARGO_TARGET_DIR"), "the README says how to share a target directory");
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
        assert!(
            manifest.contains(&format!("version = \"{}\", path = ", routelab_policy_api::API_VERSION)),
            "{manifest}"
        );
        std::fs::copy(workspace().join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
        let commands: Vec<&str> = printed.lines().skip_while(|l| *l != "next:").skip(1).map(str::trim).collect();
        assert_eq!(commands.len(), 2, "{printed}");
        assert!(commands[1].starts_with("routelab compare "), "{printed}");
        // From another directory, as a user would after `new-policy`.
        for c in &commands {
            let out = Command::new("sh")
                .args(["-c", c])
                .current_dir(std::env::temp_dir())
                .env("PATH", &path)
                .env("CARGO_TARGET_DIR", &shared_target)
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "{kind}: `{c}` failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
            if c.starts_with("routelab") {
                assert!(stdout.contains(&format!("new_{kind}")), "{kind}: the plugin's row is missing:\n{stdout}");
            }
        }
        if kind == "router" {
            // The template breaks ties with draws from its seeded PolicyRng exactly as
            // least_requests does, so the two agree run for run: the RNG re-exports work.
            let lib = shared_target.join("release/libnew_router.so");
            let p = scratch("np.yaml");
            std::fs::write(&p, "dispatch: {servers: 4, utilisation: 0.5, requests: 2000}\n").unwrap();
            let spec = format!("{}:new_router,least_requests", lib.display());
            let json = scratch("np.json");
            let out =
                routelab(&["compare", p.to_str().unwrap(), "--policies", &spec, "--json", json.to_str().unwrap()]);
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
            let results = v["workloads"][0]["results"].as_array().unwrap();
            assert_eq!(results[0]["per_seed"], results[1]["per_seed"]);
        }
    }
}

/// `sweep --set` runs one comparison per value and draws a curve per policy; `--plot` on
/// `compare` draws bars.
#[test]
fn sweep_and_plots() {
    let p = scratch("sweep.yaml");
    std::fs::write(&p, "name: sw\ndispatch: {servers: 4, utilisation: 0.5, requests: 3000}\n").unwrap();
    let dir = scratch("plots");
    let _ = std::fs::remove_dir_all(&dir);
    let json = scratch("sweep.json");
    let out = routelab(&[
        "sweep",
        p.to_str().unwrap(),
        "--policies",
        "random,least_requests",
        "--set",
        "utilisation=0.3,0.6,0.9",
        "--plot",
        dir.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let ws = v["workloads"].as_array().unwrap();
    assert_eq!(ws.len(), 3);
    assert_eq!(ws[2]["resolved"]["dispatch"]["utilisation"], 0.9);
    // Higher load, longer responses for random.
    let r = |i: usize| ws[i]["results"][0]["metrics"]["response_mean"].as_f64().unwrap();
    assert!(r(0) < r(1) && r(1) < r(2), "{} {} {}", r(0), r(1), r(2));
    let svg = std::fs::read_to_string(dir.join("sw_sweep_utilisation_response_mean.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("least_requests") && svg.contains("random"));
    let out = routelab(&[
        "compare",
        p.to_str().unwrap(),
        "--policies",
        "random,round_robin",
        "--plot",
        dir.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    let svg = std::fs::read_to_string(dir.join("sw_response_mean.svg")).unwrap();
    assert!(svg.contains("round_robin"));
    // A bad field path is bad input.
    let out = routelab(&["sweep", p.to_str().unwrap(), "--policies", "random", "--set", "nonsense=1,2"]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Issue 5's command: per selector, the allocation by model names, accuracies, evaluations, cost.
#[test]
fn case_study_from_cc_reports_allocations_and_greedy_stays_stuck() {
    let json = scratch("cs.json");
    let out = routelab(&[
        "compare",
        "workloads/compound/case_study.yaml",
        "--policies",
        "greedy,llmselector",
        "--start",
        "C,C",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rs = v["workloads"][0]["results"].as_array().unwrap();
    assert_eq!(rs[0]["allocation"][0], serde_json::json!(["C", "C"]));
    assert_eq!(rs[1]["allocation"][0], serde_json::json!(["A", "B"]));
    for r in rs {
        for k in ["train_accuracy", "test_accuracy", "evaluations", "cost_per_question"] {
            assert!(r["metrics"][k].is_number(), "{} lacks {k}", r["policy"]);
        }
    }
    assert!(rs[1]["metrics"]["test_accuracy"].as_f64().unwrap() > rs[0]["metrics"]["test_accuracy"].as_f64().unwrap());
}

#[test]
fn bad_compound_input_exits_2() {
    let big = scratch("big.yaml");
    std::fs::write(&big, "compound:\n  system: debate\n  pool: {models: 10}\n").unwrap();
    let diag = scratch("diag.yaml");
    std::fs::write(&diag, "compound:\n  system: debate\n  pool: {models: 5}\n  diagnoser_accuracy: 1.5\n").unwrap();
    let budget = scratch("budget.yaml");
    std::fs::write(&budget, "compound:\n  system: debate\n  pool: {models: 10}\n  budget: 5\n").unwrap();
    let cases: [(&[&str], &str); 4] = [
        (
            &["compare", "workloads/compound/case_study.yaml", "--policies", "greedy", "--start", "C,Z"],
            "unknown model 'Z'",
        ),
        (&["compare", big.to_str().unwrap(), "--policies", "exhaustive,best_single"], "max_allocations"),
        (&["validate", diag.to_str().unwrap()], "diagnoser_accuracy"),
        (&["validate", budget.to_str().unwrap()], "below one round"),
    ];
    for (args, what) in cases {
        let out = routelab(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(what), "{args:?}: {err}");
    }
}

/// Issue 32: every `routelab` command the README's "Install" and "Using it" blocks show runs as
/// written, from a directory outside the repository, with only the binary on PATH (as after
/// `cargo install`). Left out: `bench` (minutes of measurement; its Mooncake row reads the
/// built-in `mooncake_conversation`, which `builtin` resolves from anywhere) and `cargo` lines. The
/// completion script goes to a local file instead of `~/.local`; `diff` compares the run's
/// `after.json` with a copy of itself, so it must report that nothing moved.
#[test]
fn readme_commands_run_as_written_from_another_directory() {
    let readme = std::fs::read_to_string(workspace().join("README.md")).unwrap();
    let mut commands = Vec::new();
    for section in ["## Install", "## Using it"] {
        let block = readme.split(section).nth(1).and_then(|s| s.split("```sh").nth(1)).unwrap();
        for line in block.split("```").next().unwrap().lines() {
            let command = line.split("  #").next().unwrap().split(" # ").next().unwrap().trim();
            if (command.starts_with("routelab ") || command.starts_with("for "))
                && !command.starts_with("routelab bench")
            {
                commands
                    .push(command.replace("~/.local/share/bash-completion/completions/routelab", "completion.bash"));
            }
        }
    }
    assert!(commands.len() >= 25, "{commands:?}");
    let dir = std::env::temp_dir().join(format!("routelab-readme-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_routelab")).parent().unwrap().to_path_buf();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    for command in &commands {
        if command.starts_with("routelab diff before.json after.json") {
            std::fs::copy(dir.join("after.json"), dir.join("before.json")).unwrap();
        }
        let out = Command::new("sh").arg("-c").arg(command).current_dir(&dir).env("PATH", &path).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "`{command}` failed from {}: {err}", dir.display());
        assert!(!err.lines().any(|l| l.starts_with("error:")), "`{command}`: {err}");
    }
    assert!(std::fs::read_to_string(dir.join("all.json")).unwrap().contains("tool_use"));
    assert!(std::fs::read_to_string(dir.join("completion.bash")).unwrap().contains("routelab"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `routelab bench --json`: one figure per router and replica count, each with as many samples as
/// `--runs`, the median among them (no timing is asserted: only the shape of what was measured),
/// then the router's memory per remembered prompt.
#[test]
fn bench_json_has_every_figure_with_its_runs() {
    let json = scratch("bench.json");
    let out = routelab(&[
        "bench",
        "--routers",
        "round_robin",
        "--runs",
        "3",
        "--warmup",
        "0",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("median of 3 runs"));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["runs"], 3);
    let figures = v["figures"].as_array().unwrap();
    let names: Vec<&str> = figures.iter().map(|f| f["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["round_robin 8 replicas", "round_robin 64 replicas", "round_robin"]);
    // The memory section: round_robin remembers nothing per prompt (a prefix router's hundreds
    // of bytes would show).
    let memory = &figures[2];
    assert_eq!((memory["section"].as_str(), memory["unit"].as_str()), (Some("router_memory"), Some("bytes/prompt")));
    assert!(memory["median"].as_f64().unwrap().abs() < 16.0, "{memory}");
    for f in &figures[..2] {
        let samples: Vec<f64> = f["samples"].as_array().unwrap().iter().map(|s| s.as_f64().unwrap()).collect();
        assert_eq!(samples.len(), 3);
        let median = f["median"].as_f64().unwrap();
        assert!(samples.contains(&median) && samples.iter().all(|s| *s > 0.0), "{f}");
        assert_eq!(f["section"], "decisions");
    }
}

/// `routelab bench --admission --json`: the three variants of one tool_use run (no admission,
/// admit_all, admit_all with classes), each sampled `--runs` times, and each variant's per-round
/// time ratio printed (no timing is asserted: only the shape of what was measured).
#[test]
fn bench_admission_measures_three_variants_of_one_run() {
    let json = scratch("bench_admission.json");
    let out = routelab(&["bench", "--admission", "--runs", "1", "--warmup", "0", "--json", json.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.matches("(rounds ").count(), 3, "a time ratio per variant: {stdout}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let figures = v["figures"].as_array().unwrap();
    let names: Vec<&str> = figures.iter().map(|f| f["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["no admission", "admit_all", "admit_all + 2 classes, 2 tenants"]);
    for f in figures {
        assert_eq!(f["section"], "admission");
        assert_eq!(f["samples"].as_array().unwrap().len(), 1);
        assert!(f["median"].as_f64().unwrap() > 0.0, "{f}");
    }
}

/// `routelab bench --agentic --json`: the three agentic presets replayed whole with
/// least_work_left, each figure in calls/s and each line naming how many LLM calls its replay
/// simulated (no timing is asserted: only the shape of what was measured).
#[test]
fn bench_agentic_replays_the_three_agentic_presets() {
    let json = scratch("bench_agentic.json");
    let out = routelab(&["bench", "--agentic", "--runs", "1", "--warmup", "0", "--json", json.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let figures = v["figures"].as_array().unwrap();
    let names: Vec<&str> = figures.iter().map(|f| f["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["coding_agent", "research_agent", "chat_tools"]);
    for f in figures {
        assert_eq!((f["section"].as_str(), f["unit"].as_str()), (Some("agentic"), Some("calls/s")), "{f}");
        assert!(f["median"].as_f64().unwrap() > 0.0, "{f}");
        let name = f["name"].as_str().unwrap();
        let line = stdout.lines().find(|l| l.trim_start().starts_with(name)).unwrap_or_else(|| panic!("{stdout}"));
        let calls: f64 = line.rsplit('(').next().unwrap().trim_end_matches(" calls)").parse().unwrap();
        // Every preset's whole stream: thousands of calls, not a truncated or empty replay.
        assert!(calls >= 3000.0, "{line}");
    }
}

/// `export-trace` of a Mooncake replay writes the shipped trace back byte for byte (same ids,
/// numbered in order of first appearance, same timestamps and lengths); a workload without a
/// request stream is bad input.
#[test]
fn export_trace_round_trips_the_shipped_mooncake_traces() {
    for (workload, trace) in [
        ("workloads/cluster/mooncake_synthetic.yaml", "workloads/traces/mooncake-fast25/synthetic_trace.jsonl"),
        ("workloads/cluster/mooncake_conversation.yaml", "workloads/traces/mooncake-fast25/conversation_trace.jsonl"),
        ("workloads/cluster/example_requests.yaml", "workloads/traces/example-requests/trace.jsonl"),
    ] {
        let out = scratch("export.jsonl");
        let run = routelab(&["export-trace", workload, "--format", "mooncake", "--out", out.to_str().unwrap()]);
        assert_eq!(run.status.code(), Some(0), "{}", String::from_utf8_lossy(&run.stderr));
        let want = std::fs::read(workspace().join(trace)).unwrap();
        assert!(std::fs::read(&out).unwrap() == want, "{workload}: the export differs from {trace}");
    }
    let run = routelab(&["export-trace", "exp_rho09", "--out", scratch("none.jsonl").to_str().unwrap()]);
    assert_eq!(run.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&run.stderr).contains("only cluster workloads"));
}

/// `routelab import` turns the shipped OpenAI-style request log into exactly the trace
/// `example_requests` replays (docs/your-traffic.md's first step), and refuses to write over its
/// input.
#[test]
fn import_turns_the_shipped_request_log_into_the_shipped_trace() {
    let log = workspace().join("workloads/traces/example-requests/requests.jsonl");
    let out = scratch("imported.jsonl");
    let run = routelab(&["import", log.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("209 requests"), "{stderr}");
    let want = std::fs::read(workspace().join("workloads/traces/example-requests/trace.jsonl")).unwrap();
    assert!(std::fs::read(&out).unwrap() == want, "the import differs from the shipped trace");
    let copy = scratch("log-copy.jsonl");
    std::fs::copy(&log, &copy).unwrap();
    let run = routelab(&["import", copy.to_str().unwrap(), "--out", copy.to_str().unwrap()]);
    assert_eq!(run.status.code(), Some(2));
    assert!(std::fs::read(&copy).unwrap() == std::fs::read(&log).unwrap(), "import overwrote its input");
}

/// The Mooncake conversation trace's reuse with an infinite cache, counted as Dynamo counts it
/// (block references whose `hash_id` an earlier request had): Dynamo publishes 36.64%, 105,710
/// of 288,500; the replay's segments are the trace's blocks, so the counts are the same.
#[test]
fn validate_prints_the_mooncake_traces_block_reuse_as_dynamo_counts_it() {
    let out = routelab(&["validate", "workloads/cluster/mooncake_conversation.yaml"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("repeated segments     36.64% (105710 of 288500 segment references"), "{stdout}");
}

/// Issue 32: `validate X > w.yaml` writes a workload: every line but the resolved form is a
/// comment, so validating the output gives the same resolved form; the estimate counts a
/// replayed trace's requests (it used to say 0.0 s for Mooncake's 12,031).
#[test]
fn validate_output_round_trips_as_a_workload() {
    let first = routelab(&["validate", "mooncake_conversation"]);
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    let text = String::from_utf8(first.stdout).unwrap();
    assert!(text.starts_with("# workloads/cluster/mooncake_conversation.yaml: ok (cluster world)"), "{text}");
    let estimate = text.lines().find(|l| l.starts_with("# estimate:")).unwrap();
    assert!(!estimate.contains(" 0.0 s per run"), "{estimate}");
    let copy = scratch("validated.yaml");
    std::fs::write(&copy, &text).unwrap();
    let second = routelab(&["validate", copy.to_str().unwrap()]);
    assert!(second.status.success(), "{}", String::from_utf8_lossy(&second.stderr));
    let body = |t: &str| t.lines().filter(|l| !l.starts_with('#')).map(str::to_string).collect::<Vec<_>>();
    assert_eq!(body(&String::from_utf8(second.stdout).unwrap()), body(&text));
}

/// The README's two commands: one profile for both (the tests reuse the demo's build instead of
/// building the workspace again), `.ci/run` runs the test command exactly as written, and every
/// `cargo install` the README shows uses the lock file's versions.
#[test]
fn readme_commands_share_one_build_and_ci_runs_the_test_command() {
    let readme = std::fs::read_to_string(workspace().join("README.md")).unwrap();
    let block = readme.split("## The two commands").nth(1).and_then(|s| s.split("```sh").nth(1)).unwrap();
    let commands: Vec<&str> = block
        .split("```")
        .next()
        .unwrap()
        .lines()
        .map(|l| l.split(" #").next().unwrap().trim())
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(commands.len(), 2, "{commands:?}");
    let profile = |c: &str| c.split_whitespace().skip_while(|w| *w != "--profile").nth(1).map(str::to_string);
    assert!(commands[0].starts_with("cargo run ") && commands[1].starts_with("cargo test "), "{commands:?}");
    assert_eq!(profile(commands[0]), Some("checked".into()), "{}", commands[0]);
    assert_eq!(profile(commands[0]), profile(commands[1]), "the two commands build under different profiles");
    let ci = std::fs::read_to_string(workspace().join(".ci/run")).unwrap();
    assert!(ci.lines().any(|l| l.trim() == commands[1]), ".ci/run does not run `{}` as written", commands[1]);
    for line in readme.lines().filter(|l| l.trim_start().starts_with("cargo install")) {
        assert!(line.contains("--locked"), "{line}");
    }
}

/// `routelab epp` refuses what the picker cannot honour with exit 2 before anything starts, and a
/// build without the `epp` feature says how to get it (serve/src/epp/tests.rs tests the picker
/// itself, with the feature).
#[test]
fn epp_refuses_proxy_only_flags_and_names_its_feature_with_exit_2() {
    let out = routelab(&["epp", "--backend", "http://127.0.0.1:9", "--record", "/tmp/never-written.jsonl"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--record") && err.contains("routelab serve"), "{err}");
    let out = routelab(&["epp", "--backend", "http://127.0.0.1:9", "--destination-header", "x y"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--destination-header"));
    if !cfg!(feature = "epp") {
        let out = routelab(&["epp", "--backend", "http://127.0.0.1:9"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains("--features epp"), "{err}");
    }
}
