//! Issue 9's command-line cases: each ends in a clear error with exit code 2 (or quietly, for a
//! closed pipe) instead of being ignored, crashing or printing the same thing many times.

use std::io::Read;
use std::process::{Command, Output, Stdio};

use crate::common::*;

fn routelab(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_routelab")).args(args).current_dir(workspace()).output().expect("routelab runs")
}

fn scratch(name: &str) -> std::path::PathBuf {
    fixture("cli-errors", name)
}

/// Runs `args`, expects exit 2, no results printed, and every `wanted` fragment in stderr.
fn bad(args: &[&str], wanted: &[&str]) -> String {
    let out = routelab(args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    for w in wanted {
        assert!(err.contains(w), "{args:?}: stderr lacks {w:?}: {err}");
    }
    assert!(!err.contains("panicked"), "{args:?}: {err}");
    err
}

#[test]
fn unusable_output_paths_fail_before_any_run() {
    let out = routelab(&["compare", "exp_rho09", "--json", "/nonexistent-folder/out.json"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty(), "nothing ran: {}", String::from_utf8_lossy(&out.stdout));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--json"));
    bad(&["compare", "exp_rho09", "--csv", "/nonexistent-folder/out.csv"], &["--csv", "cannot be written"]);
    bad(&["sweep", "exp_rho09", "--set", "utilisation=0.5,0.6", "--plot", "/proc/no-plots-here"], &["--plot"]);
    let same = scratch("same.out");
    let same = same.to_str().unwrap();
    bad(&["compare", "exp_rho09", "--json", same, "--csv", same], &["also the --json file"]);
    // A folder where a file is wanted.
    bad(&["compare", "exp_rho09", "--json", target_dir().to_str().unwrap()], &["is a folder"]);
}

/// `routelab demo | head`: the reader goes away and the demo ends without a panic message.
#[test]
fn a_closed_pipe_ends_quietly() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_routelab"))
        .arg("demo")
        .current_dir(workspace())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // the reader is gone before the first line
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    let status = child.wait().unwrap();
    assert!(!err.contains("panicked") && !err.contains("Broken pipe"), "{err}");
    assert_ne!(status.code(), Some(101), "a panic's exit code: {err}");
}

#[test]
fn options_a_workload_cannot_use_are_errors() {
    bad(&["compare", "exp_rho09", "--seeds", "0"], &["--seeds"]);
    bad(&["compare", "exp_rho09", "--policies", "random", "--start", "C,C"], &["--start", "dispatch workload"]);
    let csv = "AzureLLMInferenceTrace_code";
    bad(&["compare", "case_study", "--policies", "greedy", "--trace", csv], &["--trace", "does not replay a trace"]);
    bad(&["compare", "exp_rho09", "--policies", "random", "--trace", csv], &["--trace"]);
    bad(&["validate", "exp_rho09", "--trace", csv], &["--trace"]);
    // A trace that is neither a file nor a built-in's name; a table column no run reports.
    bad(&["compare", "azure_conv", "--trace", "x.csv"], &["x.csv", "AzurePublicDataset"]);
    bad(&["compare", "tool_use", "--columns", "ttft_p99"], &["--columns", "did you mean `ttft_p99_s`"]);
    bad(&["compare", "exp_rho09", "--columns", "hit_rate"], &["--columns", "dispatch world"]);
    // `@scheduler` outside the cluster world used to run as the plain router.
    bad(&["compare", "exp_rho09", "--policies", "round_robin@nosuch"], &["round_robin@nosuch", "has none"]);
    bad(&["compare", "case_study", "--policies", "greedy@fcfs"], &["greedy@fcfs", "compound"]);
    bad(&["compare", "long_doc_qa", "--policies", "round_robin@lpm@fcfs"], &["more than one `@`"]);
    bad(&["compare", "exp_rho09", "--policies", "./target/libfoo.so:"], &["no policy name after"]);
    let dir = scratch("bad-name-policy");
    let _ = std::fs::remove_dir_all(&dir);
    bad(
        &["new-policy", dir.to_str().unwrap(), "--kind", "router", "--name", "bad name!"],
        &["--name", "cannot be a policy name"],
    );
    assert!(!dir.exists(), "nothing generated for a bad name");
}

#[test]
fn validate_checks_policy_and_scheduler_names() {
    let p = scratch("bad_policies.yaml");
    std::fs::write(&p, "policies: [random, round_robbin]\ndispatch: {servers: 4, requests: 100}\n").unwrap();
    bad(&["validate", p.to_str().unwrap()], &["policies[1]", "round_robbin", "did you mean `round_robin`"]);
    let base = std::fs::read_to_string(workspace().join("workloads/cluster/long_doc_qa.yaml")).unwrap();
    let p = scratch("bad_scheduler.yaml");
    std::fs::write(&p, base.replace("  replicas: 4\n", "  replicas: 4\n  scheduler: lpn\n")).unwrap();
    bad(&["validate", p.to_str().unwrap()], &["cluster.scheduler", "no scheduler named 'lpn'", "did you mean `lpm`"]);
    let p = scratch("selector_in_dispatch.yaml");
    std::fs::write(&p, "policies: [greedy]\ndispatch: {servers: 4, requests: 100}\n").unwrap();
    bad(&["validate", p.to_str().unwrap()], &["'greedy' in the built-ins is a selector, not a router"]);
}

/// A misspelt policy gets a suggestion, once for a whole sweep; a `--set` on an unknown field names it.
#[test]
fn misspelt_policies_and_unknown_set_fields() {
    let p = scratch("sweep.yaml");
    std::fs::write(&p, "name: sw\ndispatch: {servers: 4, utilisation: 0.5, requests: 2000}\n").unwrap();
    let out = routelab(&[
        "sweep",
        p.to_str().unwrap(),
        "--policies",
        "random,least_request",
        "--set",
        "utilisation=0.3,0.6,0.9",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.matches("no router named 'least_request'").count(), 1, "printed once: {err}");
    assert!(err.contains("did you mean `least_requests`"), "{err}");
    let err = bad(
        &["sweep", p.to_str().unwrap(), "--policies", "random", "--set", "dispatch.nonsense=1,2"],
        &["--set", "field `dispatch.nonsense`", "unknown field"],
    );
    // Issue 32: a misspelt key beside the one the file has is named as the typo, not blamed on
    // the value (it made `arrivals` a map of two keys).
    bad(
        &["sweep", "tool_use", "--policies", "round_robin", "--set", "arrivals.poison.rate=40,50"],
        &["--set", "field `cluster.arrivals.poison`", "has no field `poison` (did you mean `poisson`?)"],
    );
    assert!(!err.contains("sweep.yaml:"), "no line of the generated text: {err}");
}

/// Issue 26: a custom GPU or model mapping with a wrong field names that field and its line,
/// not "did not match any variant of untagged enum".
#[test]
fn a_bad_custom_gpu_or_model_names_the_field_not_the_untagged_enum() {
    let w = scratch("custom_gpu.yaml");
    let body = "cluster:\n  replicas: 2\n  gpu: {name: x, memory_gb: 48, bandwidth_gb_s: 768, tflop: 100}\n  \
                generator: {suffix_tokens: 100, output_tokens: 10}\n  arrivals: {poisson: {rate: 1}}\n  requests: 10\n\
                policies: [round_robin]\n";
    std::fs::write(&w, body).unwrap();
    let err = bad(&["compare", w.to_str().unwrap()], &[":3", "cluster.gpu.tflop", "tflops"]);
    assert!(!err.contains("untagged"), "{err}");
    let body = body.replace(
        "gpu: {name: x, memory_gb: 48, bandwidth_gb_s: 768, tflop: 100}",
        "model: {name: m, parameters: 7000000000, layers: 32, hidden: 4096, heads: 32, kv_heads: \"8\", head_dim: 128}",
    );
    std::fs::write(&w, body).unwrap();
    let err = bad(&["compare", w.to_str().unwrap()], &[":3", "cluster.model.kv_heads", "expected u32"]);
    assert!(!err.contains("untagged"), "{err}");
}

/// Issue 26: an error about a built-in workload named the temporary copy it is read from
/// (`/tmp/routelab-0.x-…/cluster/tool_use.yaml`); it names the built-in as the repository does.
#[test]
fn errors_about_built_in_workloads_name_the_built_in_not_a_temporary_path() {
    let tmp = std::env::temp_dir().display().to_string();
    let cases: [(&[&str], &str); 2] = [
        // In the message: the workload is a cluster one.
        (&["compare", "tool_use", "--start", "a"], "workloads/cluster/tool_use.yaml is a cluster workload"),
        // As the error's file.
        (&["export-trace", "exp_rho09", "--out", "/dev/null"], "workloads/dispatch/exp_rho09.yaml: field `cluster`"),
    ];
    for (args, wanted) in cases {
        let out = routelab(args);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(wanted), "{args:?}: stderr lacks {wanted:?}: {err}");
        assert!(!err.contains(&format!("{tmp}/routelab-")), "{args:?} shows the temporary copy: {err}");
    }
}

/// Issue 26: a replayed built-in's note (printed, and in the `--json` document) named the
/// temporary copy of its trace.
#[test]
fn a_built_in_trace_replay_is_named_as_the_repository_names_it() {
    let tmp = std::env::temp_dir().display().to_string();
    let json = scratch("builtin-notes.json");
    let args = ["compare", "azure_conv", "--policies", "round_robin", "--seeds", "1", "--json", json.to_str().unwrap()];
    let out = routelab(&args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{err}");
    let doc = std::fs::read_to_string(&json).unwrap();
    let wanted = "trace replay of workloads/cluster/../traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv";
    assert!(doc.contains(wanted), "the note lacks {wanted:?}:\n{doc}");
    for text in [&doc, &err, &String::from_utf8_lossy(&out.stdout).into_owned()] {
        assert!(!text.contains(&format!("{tmp}/routelab-")), "shows the temporary copy: {text}");
    }
}

/// Issue 26: `validate` only looked policies up by name, so a config every run refuses (a
/// scheduler's `groups: 0`, an unknown router field) passed it. It now builds them as `compare`
/// does: both refuse the same workloads, naming the field.
#[test]
fn validate_refuses_the_policy_configs_compare_refuses() {
    let base = std::fs::read_to_string(workspace().join("workloads/cluster/long_doc_qa.yaml")).unwrap();
    let with = |name: &str, from: &str, to: &str| {
        assert!(base.contains(from), "long_doc_qa.yaml changed: {from:?}");
        let p = scratch(name);
        std::fs::write(&p, base.replacen(from, to, 1)).unwrap();
        p
    };
    let cases = [
        (
            with(
                "bad_scheduler_config.yaml",
                "  replicas: 4\n",
                "  replicas: 4\n  scheduler: \"priority_groups{groups: 0}\"\n",
            ),
            "cluster.scheduler",
        ),
        (
            with(
                "bad_scheduler_field.yaml",
                "  replicas: 4\n",
                "  replicas: 4\n  scheduler: \"priority_groups{no_such_field: 1}\"\n",
            ),
            "cluster.scheduler",
        ),
        (
            with("bad_router_config.yaml", "policies: [", "policies: [\"least_requests{no_such_field: 1}\", "),
            "policies[0]",
        ),
    ];
    for (p, field) in &cases {
        let p = p.to_str().unwrap();
        let err = bad(&["validate", p], &[field]);
        assert!(err.contains("fix:"), "{err}");
        // Only the refused policy (the scheduler's with round_robin): nothing else runs.
        let only = if *field == "policies[0]" { "least_requests{no_such_field: 1}" } else { "round_robin" };
        let out = routelab(&["compare", p, "--seeds", "1", "--policies", only]);
        assert_eq!(out.status.code(), Some(2), "compare accepts what validate refused: {p}");
    }
    // The shipped workload itself passes both.
    assert_eq!(routelab(&["validate", "workloads/cluster/long_doc_qa.yaml"]).status.code(), Some(0));
}

/// A custom GPU with a NaN, negative or infinite rate passed validation: the roofline's `max()`
/// dropped the bad term, so a NaN bandwidth priced every step as compute-bound and the run
/// reported latencies with exit 0. On `cluster.gpu` and on a P/D pool's `gpu` alike it is now
/// refused, naming the field.
#[test]
fn a_custom_gpu_with_a_nan_negative_or_infinite_rate_is_refused() {
    let pd = "name: pd\ncluster:\n  replicas: 2\n  gpu: GPU\n  model: mistral-7b\n  disaggregation:\n    \
              prefill: {instances: 1, gpu: POOL}\n    decode: {instances: 1}\n    link: {bandwidth_gbps: 100}\n  \
              generator: {output_tokens: 8}\n  arrivals: {poisson: {rate: 1}}\n  requests: 10\n";
    let good = "{name: x, tflops: 100, bandwidth_gb_s: 1000, memory_gb: 80}";
    for (field, value) in [
        ("bandwidth_gb_s", ".nan"),
        ("bandwidth_gb_s", "-5"),
        ("tflops", ".nan"),
        ("tflops", "-1"),
        ("tflops", ".inf"),
        ("memory_gb", ".inf"),
    ] {
        let figures: Vec<String> = [("tflops", "100"), ("bandwidth_gb_s", "1000"), ("memory_gb", "80")]
            .iter()
            .map(|(f, v)| format!("{f}: {}", if *f == field { value } else { v }))
            .collect();
        let bad_gpu = format!("{{name: x, {}}}", figures.join(", "));
        for (place, yaml) in [
            ("cluster.gpu", pd.replace("GPU", &bad_gpu).replace("POOL", good)),
            ("cluster.disaggregation.prefill.gpu", pd.replace("GPU", good).replace("POOL", &bad_gpu)),
        ] {
            let p = scratch("bad_custom_gpu.yaml");
            std::fs::write(&p, &yaml).unwrap();
            bad(&["validate", p.to_str().unwrap()], &[&format!("{place}.{field}"), "positive, finite", "fix:"]);
        }
    }
    // The same mapping with every figure sound passes.
    let p = scratch("good_custom_gpu.yaml");
    std::fs::write(&p, pd.replace("GPU", good).replace("POOL", good)).unwrap();
    assert_eq!(routelab(&["validate", p.to_str().unwrap()]).status.code(), Some(0));
}

/// Issue 29: bad session and hint specs name the file, the line and the field, exit 2.
#[test]
fn bad_session_and_hint_specs_name_file_line_and_field() {
    let w = scratch("session.yaml");
    let body = "cluster:\n  replicas: 2\n  generator:\n    suffix_tokens: 100\n    output_tokens: 10\n    session:\n      \
                steps: 3\n      subagents: {probability: 1.5, burst: 2, steps: 2}\n  arrivals: {poisson: {rate: 1}}\n  \
                requests: 10\npolicies: [round_robin]\n";
    std::fs::write(&w, body).unwrap();
    bad(
        &["validate", w.to_str().unwrap()],
        &["session.yaml:8", "cluster.generator.session.subagents.probability", "[0, 1]"],
    );
    let pause = body.replace("steps: 3\n", "steps: 3\n      tool_pause_s: {lognormal: {mean: 2, cvv: 1, max: 9}}\n");
    std::fs::write(&w, pause.replace("1.5", "0.5")).unwrap();
    let err =
        bad(&["compare", w.to_str().unwrap()], &[":8", "cluster.generator.session.tool_pause_s.lognormal.cvv", "`cv`"]);
    assert!(!err.contains("untagged"), "{err}");
    std::fs::write(&w, body.replace("    session:", "    turns: 3\n    session:").replace("1.5", "0.5")).unwrap();
    bad(&["validate", w.to_str().unwrap()], &[":7", "cluster.generator.session", "turns"]);
    let hints =
        body.replace("  generator:", "  hints: {output_tokens: {noisy: {cv: 0}}}\n  generator:").replace("1.5", "0.5");
    std::fs::write(&w, hints).unwrap();
    bad(&["validate", w.to_str().unwrap()], &[":3", "cluster.hints.output_tokens.noisy.cv"]);
}

/// Issue 29: bad LoRA specs name the file, the line and the field, exit 2; LoRA on a
/// disaggregated cluster is refused before anything runs.
#[test]
fn bad_lora_specs_name_file_line_and_field() {
    let w = scratch("lora.yaml");
    let body = "cluster:\n  replicas: 2\n  generator: {suffix_tokens: 100, output_tokens: 10}\n  lora:\n    \
                adapters: 8\n    max_loras: 4\n    max_cpu_loras: 2\n  arrivals: {poisson: {rate: 1}}\n  \
                requests: 10\npolicies: [round_robin]\n";
    std::fs::write(&w, body).unwrap();
    bad(&["validate", w.to_str().unwrap()], &["lora.yaml:7", "cluster.lora.max_cpu_loras", "max_cpu_loras: 4"]);
    std::fs::write(&w, body.replace("adapters: 8", "adapters: 0")).unwrap();
    bad(&["compare", w.to_str().unwrap()], &["lora.yaml:5", "cluster.lora.adapters"]);
    std::fs::write(&w, body.replace("    max_loras: 4\n", "")).unwrap();
    bad(&["validate", w.to_str().unwrap()], &["cluster.lora.max_cpu_loras", "max_loras"]);
}
