//! `--isolate`: hostile plugins (testing/hostile-plugin) fail only their own row, results are the
//! same as without it, and the exit codes follow the usual rules.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::OnceLock;

use crate::common::*;

fn routelab(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_routelab")).args(args).current_dir(workspace()).output().expect("routelab runs")
}

/// testing/hostile-plugin, built once per test process with this test's profile.
fn hostile() -> &'static PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        workspace_libraries();
        lib_path("routelab_hostile_plugin")
    })
}

fn scratch(name: &str) -> PathBuf {
    fixture("isolate", name)
}

fn json(path: &PathBuf) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The results of one workload in a JSON document, by policy label.
fn results(doc: &serde_json::Value) -> &Vec<serde_json::Value> {
    doc["workloads"][0]["results"].as_array().expect("results")
}

/// Runs `compare` with and without `--isolate`; returns both JSON documents.
fn both_ways(name: &str, args: &[&str]) -> (serde_json::Value, serde_json::Value) {
    let (plain, isolated) = (scratch(&format!("{name}-plain.json")), scratch(&format!("{name}-isolated.json")));
    let mut a: Vec<&str> = args.to_vec();
    a.extend(["--json", plain.to_str().unwrap()]);
    let out = routelab(&a);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let mut b: Vec<&str> = args.to_vec();
    b.extend(["--json", isolated.to_str().unwrap(), "--isolate"]);
    let out = routelab(&b);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    (json(&plain), json(&isolated))
}

#[test]
fn isolated_results_are_identical_to_unisolated_ones() {
    let builtin = plugins().builtin.display().to_string();
    let policies = format!("round_robin,loaded={builtin}:preble,preble,sglang_cache_aware@priority_groups");
    let (plain, isolated) = both_ways(
        "cluster",
        &["compare", "workloads/cluster/long_doc_qa.yaml", "--seeds", "2", "--policies", &policies],
    );
    assert_eq!(results(&plain).len(), 4);
    for r in results(&plain) {
        assert!(r.get("error").is_none(), "{r}");
        assert_eq!(r["per_seed"].as_array().unwrap().len(), 2);
    }
    // The whole document, nothing dropped: every figure of every seed is the same.
    assert_eq!(plain, isolated);
    // The plugin's copy of preble gives preble's figures, through the child as well.
    assert_eq!(results(&isolated)[1]["per_seed"], results(&isolated)[2]["per_seed"]);

    // A dispatch and a compound workload (selectors, allocations) in one run.
    let (plain, isolated) = both_ways("other", &["compare", "exp_rho09", "case_study", "--seeds", "1"]);
    assert_eq!(plain["workloads"].as_array().unwrap().len(), 2);
    assert_eq!(plain, isolated);

    // A sweep (each point's workload crosses to the child with its --set applied) and `run`.
    let (plain, isolated) = both_ways(
        "sweep",
        &[
            "sweep",
            "workloads/cluster/long_doc_qa.yaml",
            "--set",
            "arrivals.poisson.rate=x0.5,x2",
            "--seeds",
            "1",
            "--policies",
            "round_robin,preble",
        ],
    );
    assert_eq!(plain["workloads"].as_array().unwrap().len(), 2);
    assert_eq!(plain, isolated);
    let (plain, isolated) = both_ways("run", &["run", "exp_rho09", "--policy", "power_of_two{d: 3}", "--seeds", "1"]);
    assert_eq!(plain, isolated);
}

/// Each hostile router next to a built-in, under `--isolate`: the hostile row says what happened,
/// the built-in reports, and the exit code is 1.
#[test]
fn hostile_plugins_fail_only_their_own_row_under_isolate() {
    let _alone = cores_alone();
    let lib = hostile().display().to_string();
    // Only the endless loop needs the short timeout; the others get room to fail their own way on a
    // loaded machine (filling 1 GiB took over 2 s with both cores busy).
    let cases = [
        ("aborts", "killed by signal 6 (SIGABRT)", "60"),
        ("segfaults", "killed by signal 11 (SIGSEGV)", "60"),
        ("exits", "exited with status 0 without a result", "60"),
        ("overflows_stack", "has overflowed its stack", "60"),
        ("loops_forever", "exceeded --policy-timeout 2 s", "2"),
        ("allocates_forever", "memory allocation of 67108864 bytes failed", "60"),
    ];
    for (name, expected, timeout) in cases {
        let out_json = scratch(&format!("hostile-{name}.json"));
        let policies = format!("round_robin,{lib}:{name}");
        let args =
            ["compare", "workloads/cluster/long_doc_qa.yaml", "--seeds", "1", "--policies", &policies, "--isolate"];
        let out = routelab(
            &[
                &args[..],
                &["--policy-timeout", timeout, "--policy-memory", "1024", "--json", out_json.to_str().unwrap()],
            ]
            .concat(),
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{name}: {stderr}");
        let doc = json(&out_json);
        let rows = results(&doc);
        assert!(rows[0].get("error").is_none(), "{name}: the built-in failed too: {}", rows[0]);
        assert!(rows[0]["metrics"]["latency_mean_s"].as_f64().unwrap() > 0.0, "{name}: {}", rows[0]);
        let error = rows[1]["error"].as_str().unwrap_or_else(|| panic!("{name} did not fail: {}", rows[1]));
        assert!(error.contains(expected), "{name}: {error}");
        assert!(stderr.contains(expected), "{name}: {stderr}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("FAILED") && stdout.contains("round_robin"), "{name}: {stdout}");
    }
    // The abort is SIGABRT itself, not a message that happens to mention it.
    let err = |name: &str| {
        json(&scratch(&format!("hostile-{name}.json")))["workloads"][0]["results"][1]["error"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert!(err("aborts").starts_with("killed by signal 6 (SIGABRT)"));
    assert!(err("allocates_forever").starts_with("killed by signal 6 (SIGABRT)"));
}

#[test]
fn a_plugin_printing_to_stdout_does_not_reach_the_tables_under_isolate() {
    let policies = format!("round_robin,{}:prints", hostile().display());
    let out = routelab(&[
        "compare",
        "workloads/cluster/long_doc_qa.yaml",
        "--seeds",
        "1",
        "--policies",
        &policies,
        "--isolate",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("prints") && !stdout.contains("FAILED"), "{stdout}");
    assert!(!stdout.contains("HOSTILE PLUGIN OUTPUT"), "{stdout}");
    // Without --isolate the plugin shares the host's stdout: this is what --isolate is for.
    let out = routelab(&["compare", "workloads/cluster/long_doc_qa.yaml", "--seeds", "1", "--policies", &policies]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("HOSTILE PLUGIN OUTPUT"));
}

/// What the trust model says is not contained without `--isolate`: the host dies with the plugin.
#[cfg(unix)]
#[test]
fn without_isolate_an_aborting_plugin_takes_the_host_down() {
    use std::os::unix::process::ExitStatusExt;
    for (name, signal) in [("aborts", 6), ("segfaults", 11)] {
        let policies = format!("round_robin,{}:{name}", hostile().display());
        let out = routelab(&["compare", "workloads/cluster/long_doc_qa.yaml", "--seeds", "1", "--policies", &policies]);
        assert_eq!(out.status.signal(), Some(signal), "{name}");
        assert!(out.stdout.is_empty(), "{name}: no table is printed");
    }
    let policies = format!("round_robin,{}:exits", hostile().display());
    let out = routelab(&["compare", "workloads/cluster/long_doc_qa.yaml", "--seeds", "1", "--policies", &policies]);
    assert_eq!(out.status.code(), Some(0), "exit(0) in a plugin ends the host with success");
    assert!(out.stdout.is_empty(), "and no table");
}

/// Bad input stays exit 2 under --isolate, with the same message as without.
#[test]
fn isolate_keeps_the_exit_codes_of_bad_input() {
    let args = [
        "compare",
        "workloads/cluster/long_doc_qa.yaml",
        "--seeds",
        "1",
        "--policies",
        "round_robin,no/such/libfoo.so:foo",
    ];
    let plain = routelab(&args);
    let isolated = routelab(&[&args[..], &["--isolate"]].concat());
    assert_eq!(plain.status.code(), Some(2));
    assert_eq!(isolated.status.code(), Some(2));
    assert_eq!(String::from_utf8_lossy(&plain.stderr), String::from_utf8_lossy(&isolated.stderr));
    assert_eq!(plain.stdout, isolated.stdout);

    let out = routelab(&["compare", "exp_rho09", "--policy-timeout", "5"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--isolate"));
    let out = routelab(&["compare", "case_study", "--all-starts", "--isolate"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--all-starts runs in the host's process"));
}

/// A small dispatch workload: the hostile routers act from its second request.
fn small_dispatch() -> PathBuf {
    let p = scratch("small_dispatch.yaml");
    std::fs::write(&p, "name: small\nseed: 1\ndispatch: {servers: 2, requests: 200}\n").unwrap();
    p
}

/// Issue 26: the child's stderr went to a file without bound (1 GiB of it made a 1 GB file). The
/// parent now reads it through a pipe and keeps its first and last 64 KiB: the row still says
/// what the child said last, and how much of its 64 MiB was not kept.
#[test]
fn a_flood_on_a_childs_stderr_is_kept_bounded_and_the_drop_is_said() {
    let policies = format!("round_robin,{}:floods_stderr", hostile().display());
    let w = small_dispatch();
    let out_json = scratch("flood.json");
    let out = routelab(&[
        "compare",
        w.to_str().unwrap(),
        "--policies",
        &policies,
        "--isolate",
        "--json",
        out_json.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let doc = json(&out_json);
    let e = results(&doc)[1]["error"].as_str().expect("the flooding row failed").to_string();
    assert!(e.starts_with("killed by signal 6 (SIGABRT): the flood's last words (its stderr: "), "{e}");
    // 64 Ki lines of 1 KiB and the last words, less the 128 KiB kept.
    let total: u64 = (64 << 10) * 1024 + "the flood's last words\n".len() as u64;
    assert!(
        e.contains(&format!("{total} bytes; {} between the first and the last 64 KiB not kept", total - (128 << 10))),
        "{e}"
    );
    assert!(results(&doc)[0].get("error").is_none(), "round_robin's row stands");
}

/// Issue 26: a policy reporting many figures made the parent quadratic (80,000 figures took
/// 39 s). 200,000 figures over two seeds cross `--isolate` whole into JSON, CSV and the table.
#[test]
fn a_policy_with_many_figures_crosses_isolate_whole() {
    const N: usize = 200_000;
    let policies = format!("{}:many_figures", hostile().display());
    let w = small_dispatch();
    let (out_json, out_csv) = (scratch("figures.json"), scratch("figures.csv"));
    let out = Command::new(env!("CARGO_BIN_EXE_routelab"))
        .args([
            "compare",
            w.to_str().unwrap(),
            "--seeds",
            "2",
            "--policies",
            &policies,
            "--isolate",
            "--json",
            out_json.to_str().unwrap(),
            "--csv",
            out_csv.to_str().unwrap(),
        ])
        .env("ROUTELAB_TEST_FIGURES", N.to_string())
        .current_dir(workspace())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let doc = json(&out_json);
    let m = results(&doc)[0]["metrics"].as_object().expect("metrics").clone();
    let figures: Vec<_> = m.keys().filter(|k| k.starts_with("router.f") && !k.ends_with("_ci95")).collect();
    assert_eq!(figures.len(), N);
    for i in [0, 1, N / 2, N - 1] {
        assert_eq!(m[&format!("router.f{i}")], serde_json::json!(i as f64), "router.f{i}");
        assert_eq!(m[&format!("router.f{i}_ci95")], serde_json::json!(0.0), "the same on both seeds");
    }
    let csv = std::fs::read_to_string(&out_csv).unwrap();
    let header = csv.lines().next().unwrap();
    assert_eq!(header.split(',').filter(|c| c.starts_with("router.f") && !c.ends_with("_ci95")).count(), N);
}
