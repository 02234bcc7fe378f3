//! All cores and many machines: `-j` never changes a figure, `--shard K/N` + `routelab merge`
//! give exactly the unsharded file, merge refuses files that do not fit, `routelab diff` finds
//! real changes only, and docs/scale.md's GNU parallel recipe works.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::*;

fn routelab(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_routelab")).args(args).current_dir(workspace()).output().expect("routelab runs")
}

fn dir(name: &str) -> PathBuf {
    let d = target_dir().join("test-fixtures/scale").join(name);
    std::fs::remove_dir_all(&d).ok();
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn ok(out: &Output) {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A small cluster workload: two replicas, shared contexts, three seeds.
const CLUSTER: &str = "name: small_cluster\nseed: 5\nseeds: 3\ncluster:\n  replicas: 2\n  generator: {contexts: {count: 4, tokens: 2000}, suffix_tokens: 50, output_tokens: 8}\n  \
                       arrivals: {poisson: {rate: 4.0}}\n  requests: 120\n";
const CLUSTER_POLICIES: &str = "round_robin,least_work_left,threshold_affinity@lpm,preble";
const SWEEP: &str = "arrivals.poisson.rate=x0.5,x1,x1.5";

/// The `sweep` arguments of the cluster case, plus `extra`.
fn sweep_args<'a>(workload: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec!["sweep", workload, "--policies", CLUSTER_POLICIES, "--set", SWEEP];
    a.extend_from_slice(extra);
    a
}

fn cluster_file(d: &Path) -> PathBuf {
    let f = d.join("small_cluster.yaml");
    std::fs::write(&f, CLUSTER).unwrap();
    f
}

/// Redirected, the output is exactly the tables the report module renders, as before `-j`: no
/// progress bar, nothing interleaved.
#[test]
fn redirected_output_is_exactly_the_tables() {
    let policies = ["random", "least_requests", "power_of_two"];
    let out = routelab(&["compare", "workloads/dispatch/exp_rho09.yaml", "--policies", &policies.join(","), "-j", "3"]);
    ok(&out);
    let w = compare_file("workloads/dispatch/exp_rho09.yaml", &policies);
    assert_eq!(String::from_utf8_lossy(&out.stdout), routelab::report::table::render(&w, false, None));
    assert!(out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn any_number_of_jobs_gives_the_same_bytes_in_every_world() {
    let d = dir("jobs");
    let cluster = cluster_file(&d);
    let cases: Vec<(&str, Vec<&str>)> = vec![
        ("cluster", sweep_args(s(&cluster), &[])),
        (
            "dispatch",
            vec!["compare", "workloads/dispatch/exp_rho09.yaml", "--policies", "random,least_requests,power_of_two"],
        ),
        ("compound", vec!["compare", "workloads/compound/case_study.yaml", "--seeds", "3"]),
    ];
    for (name, args) in cases {
        let mut outputs = Vec::new();
        for jobs in ["1", "4"] {
            let json = d.join(format!("{name}-j{jobs}.json"));
            let mut a = args.clone();
            a.extend_from_slice(&["-j", jobs, "--json", s(&json)]);
            let out = routelab(&a);
            ok(&out);
            outputs.push((std::fs::read(&json).unwrap(), out.stdout, out.stderr));
        }
        let ((json1, stdout1, stderr1), (json4, stdout4, stderr4)) = (&outputs[0], &outputs[1]);
        assert!(json1 == json4, "{name}: -j 1 and -j 4 wrote different JSON");
        // Not a terminal: exactly the tables, in order, and no progress bar.
        assert!(stdout1 == stdout4, "{name}: -j 1 and -j 4 printed different tables");
        assert!(stderr1.is_empty() && stderr4.is_empty(), "{name}: {}", String::from_utf8_lossy(stderr4));
        let doc: serde_json::Value = serde_json::from_slice(json1).unwrap();
        let workloads = doc["workloads"].as_array().unwrap();
        let text = String::from_utf8_lossy(stdout1);
        let mut at = 0;
        for w in workloads {
            let n = w["name"].as_str().unwrap();
            let found = text[at..].find(n).unwrap_or_else(|| panic!("{name}: table of {n} missing or out of order"));
            at += found + n.len();
            for r in w["results"].as_array().unwrap() {
                assert!(r.get("error").is_none(), "{name}: {r}");
            }
        }
    }
}

/// Under `--isolate`, `-j` is the number of children at once: the figures are those of an
/// unisolated run either way.
#[test]
fn isolated_children_in_parallel_give_the_same_figures() {
    let d = dir("isolate");
    let run = |name: &str, extra: &[&str]| {
        let json = d.join(format!("{name}.json"));
        let mut a = vec!["compare", "exp_rho09", "--policies", "random,least_requests,power_of_two", "--seeds", "2"];
        a.extend_from_slice(extra);
        a.extend_from_slice(&["--json", s(&json)]);
        let out = routelab(&a);
        ok(&out);
        (std::fs::read(&json).unwrap(), out.stdout)
    };
    let plain = run("plain", &["-j", "1"]);
    assert!(run("isolate-j1", &["--isolate", "-j", "1"]) == plain, "--isolate -j 1 differs from an unisolated run");
    assert!(run("isolate-j3", &["--isolate", "-j", "3"]) == plain, "--isolate -j 3 differs from an unisolated run");
}

/// The JSON of the unsharded sweep, and the shards' files of the same command line (plus `extra`).
fn shards(d: &Path, cluster: &Path, count: u32, extra: &[&str]) -> (Vec<u8>, Vec<PathBuf>) {
    let full = d.join("full.json");
    ok(&routelab(&sweep_args(s(cluster), &[extra, &["--json", s(&full)]].concat())));
    let mut files = Vec::new();
    for k in 1..=count {
        let f = d.join(format!("shard-{k}.json"));
        let shard = format!("{k}/{count}");
        let out =
            routelab(&sweep_args(s(cluster), &[extra, &["--shard", &shard, "-j", "2", "--json", s(&f)]].concat()));
        ok(&out);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.starts_with(&format!("shard {shard}: ")) && !stdout.contains('│'), "{stdout}");
        files.push(f);
    }
    (std::fs::read(&full).unwrap(), files)
}

#[test]
fn merged_shards_are_byte_for_byte_the_unsharded_run() {
    let d = dir("merge");
    let cluster = cluster_file(&d);
    // 3 sweep points × 4 policies × 3 seeds = 36 cells over 5 shards: uneven, and every
    // policy's seeds spread over several shards.
    let (full, files) = shards(&d, &cluster, 5, &[]);
    let merged = d.join("merged.json");
    let mut args = vec!["merge"];
    // In any order.
    args.extend(files.iter().rev().map(|f| s(f)));
    args.extend(["--json", s(&merged)]);
    let out = routelab(&args);
    ok(&out);
    assert!(std::fs::read(&merged).unwrap() == full, "merge differs from the unsharded run");
    // The tables are the unsharded run's too.
    let tables = routelab(&sweep_args(s(&cluster), &[])).stdout;
    assert_eq!(String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&tables));
}

/// Sketched runs (`--sketch`: percentiles from HDR histograms) are as deterministic as exact
/// ones: `-j 1` and `-j 3` write the same bytes, and their shards merge to the unsharded file,
/// which is not the exact run's (the flag took effect).
#[test]
fn sketched_runs_are_deterministic_and_merge_like_exact_ones() {
    let d = dir("sketch");
    let cluster = cluster_file(&d);
    let (full, files) = shards(&d, &cluster, 3, &["--sketch"]);
    let merged = d.join("merged.json");
    let mut args = vec!["merge"];
    args.extend(files.iter().map(|f| s(f)));
    args.extend(["--json", s(&merged)]);
    ok(&routelab(&args));
    assert!(std::fs::read(&merged).unwrap() == full, "merged sketched shards differ from the unsharded run");
    let j3 = d.join("j3.json");
    ok(&routelab(&sweep_args(s(&cluster), &["--sketch", "-j", "3", "--json", s(&j3)])));
    assert!(std::fs::read(&j3).unwrap() == full, "--sketch: -j 3 differs from the default jobs");
    let exact = d.join("exact.json");
    ok(&routelab(&sweep_args(s(&cluster), &["-j", "1", "--json", s(&exact)])));
    assert!(std::fs::read(&exact).unwrap() != full, "--sketch changed nothing: was it applied?");
    // Only a cluster workload has requests to sketch; the flags exclude each other.
    for args in [&["compare", "exp_rho09", "--sketch"][..], &["compare", s(&cluster), "--exact", "--sketch"]] {
        let out = routelab(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("--sketch") && out.stdout.is_empty(), "{args:?}: {err}");
    }
}

#[test]
fn merge_refuses_files_that_do_not_fit_together() {
    let d = dir("refuse");
    let cluster = cluster_file(&d);
    let (_, files) = shards(&d, &cluster, 3, &[]);
    let f = |k: usize| s(&files[k]).to_string();
    let check = |args: &[String], expected: &str| {
        let mut a = vec!["merge".to_string()];
        a.extend_from_slice(args);
        let out = routelab(&a.iter().map(String::as_str).collect::<Vec<_>>());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(expected) && stderr.contains("fix:"), "{args:?}: expected {expected:?} in\n{stderr}");
    };
    check(&[f(0), f(1)], "shard 3/3 missing");
    check(&[f(0), f(1), f(2), f(1)], "is shard 2/3, and so is");

    // Another seed is another run: its shard does not belong.
    let other = d.join("other-seed.json");
    ok(&routelab(&sweep_args(s(&cluster), &["--shard", "3/3", "--seed", "9", "--json", s(&other)])));
    check(&[f(0), f(1), s(&other).into()], "differs from");

    // Another version wrote it.
    let text = std::fs::read_to_string(&files[2]).unwrap();
    let old = d.join("old.json");
    std::fs::write(&old, text.replacen(env!("CARGO_PKG_VERSION"), "0.0.1", 1)).unwrap();
    check(&[f(0), f(1), s(&old).into()], "was written by routelab 0.0.1");

    // A shard cut short (a cell lost) and a full run's file.
    let mut doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    doc["workloads"][1]["results"][2]["cells"].as_array_mut().unwrap().pop().expect("a cell to lose");
    let cut = d.join("cut.json");
    std::fs::write(&cut, serde_json::to_string(&doc).unwrap()).unwrap();
    check(&[f(0), f(1), s(&cut).into()], "no shard has workload");
    let full = d.join("full.json");
    check(&[f(0), s(&full).into()], "is not a shard's results");

    // Hand-edited shard ids: one no run writes, and two swapped (each file then holds the
    // other's cells).
    let edit = |k: usize, index: u32, name: &str| {
        let mut doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&files[k]).unwrap()).unwrap();
        doc["shard"]["index"] = index.into();
        let p = d.join(name);
        std::fs::write(&p, serde_json::to_string(&doc).unwrap()).unwrap();
        s(&p).to_string()
    };
    check(&[f(0), f(1), edit(2, 7, "seven.json")], "names itself shard 7/3");
    check(&[f(0), edit(1, 3, "swap-a.json"), edit(2, 2, "swap-b.json")], "holds a cell another shard runs");
}

#[test]
fn shard_needs_json_and_refuses_what_cannot_be_merged() {
    let out = routelab(&["compare", "exp_rho09", "--shard", "1/2"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("add --json"));
    let out = routelab(&["compare", "case_study", "--all-starts", "--shard", "1/2", "--json", "/tmp/x.json"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--all-starts"));
    for bad in ["0/2", "3/2", "1"] {
        let out = routelab(&["compare", "exp_rho09", "--shard", bad, "--json", "/tmp/x.json"]);
        assert_eq!(out.status.code(), Some(2), "{bad}");
    }
}

#[test]
fn diff_finds_a_real_change_and_nothing_in_none() {
    let d = dir("diff");
    let write = |name: &str, rho: f64| {
        let f = d.join(name);
        std::fs::write(
            &f,
            format!("name: d\nseed: 2\nseeds: 4\ndispatch: {{servers: 4, utilisation: {rho}, requests: 4000}}\n"),
        )
        .unwrap();
        let json = d.join(format!("{name}.json"));
        ok(&routelab(&["compare", s(&f), "--policies", "random,least_requests", "--json", s(&json)]));
        json
    };
    let before = write("before.yaml", 0.5);
    let again = write("again.yaml", 0.5);
    let after = write("after.yaml", 0.9);

    let same = routelab(&["diff", s(&before), s(&again)]);
    let text = String::from_utf8_lossy(&same.stdout);
    assert_eq!(same.status.code(), Some(0), "{text}");
    assert!(text.contains("no metric moved beyond its 95% interval"), "{text}");

    let moved = routelab(&["diff", s(&before), s(&after)]);
    let text = String::from_utf8_lossy(&moved.stdout);
    assert_eq!(moved.status.code(), Some(1), "{text}");
    // Random dispatch at ρ 0.9 waits far longer than at 0.5 (M/M/1: 1/(1−ρ) = 10 vs 2).
    let row = text.lines().find(|l| l.contains("random") && l.contains("response_mean ")).expect(&text);
    let ratio: f64 = row.trim_end_matches(['│', ' ']).rsplit(['│', ' ']).next().unwrap().parse().expect(row);
    assert!((3.0..8.0).contains(&ratio), "{row}");
    assert!(text.contains("least_requests"), "{text}");

    let bad = routelab(&["diff", s(&before), s(&d.join("before.yaml"))]);
    assert_eq!(bad.status.code(), Some(2));
}

/// docs/scale.md's GNU parallel recipe, on this machine: three shards at once, then merge.
/// Without GNU parallel it is ignored, and counted so in the summary (see host/build.rs).
#[test]
#[cfg_attr(
    routelab_no_gnu_parallel,
    ignore = "GNU parallel not found when the tests were built (Debian: apt-get install parallel; .ci/run installs it)"
)]
fn gnu_parallel_recipe_gives_the_unsharded_file() {
    let d = dir("gnu-parallel");
    let cluster = cluster_file(&d);
    let full = d.join("full.json");
    ok(&routelab(&sweep_args(s(&cluster), &["--json", s(&full)])));
    let exe = env!("CARGO_BIN_EXE_routelab");
    // As in docs/scale.md, with the same command line in every shard.
    let script = format!(
        "parallel --halt now,fail=1 '{exe} sweep {w} --policies {CLUSTER_POLICIES} --set {SWEEP} --shard {{}}/3 -j 1 --json {d}/shard-{{}}.json' ::: 1 2 3 \
         && {exe} merge {d}/shard-*.json --json {d}/all.json",
        w = s(&cluster),
        d = s(&d),
    );
    let out = Command::new("sh").arg("-c").arg(&script).current_dir(workspace()).output().unwrap();
    ok(&out);
    assert!(std::fs::read(d.join("all.json")).unwrap() == std::fs::read(&full).unwrap());
}

/// Issue 30: the prefix routers' default bounds (vllm_prefix_aware's 2^24 trie nodes,
/// ray_prefix_aware's 2^26 tokens a replica) are not reached on mooncake_conversation, the shipped
/// workload whose prompts fill the trees most (12,031 prompts of ≈ 12k tokens on 4 replicas), so
/// every figure is the unbounded structure's (the bound's counters say 0).
#[test]
fn prefix_router_bounds_leave_the_shipped_results_as_they_were() {
    let bounded = ["vllm_prefix_aware", "ray_prefix_aware"];
    let unbounded = ["vllm_prefix_aware{max_chunks: 18446744073709551615}", "ray_prefix_aware{do_eviction: false}"];
    // Named by its full path: the workload's trace is read relative to it.
    let path = workspace().join("workloads/cluster/mooncake_conversation.yaml");
    let policies = [bounded[0], unbounded[0], bounded[1], unbounded[1]].map(String::from);
    let w = compare_text(&std::fs::read_to_string(&path).unwrap(), path.to_str().unwrap(), &policies);
    for (k, counter) in [(0, "router.router_evicted_chunks"), (2, "router.router_evicted_tokens")] {
        let (b, u) = (&w.results[k], &w.results[k + 1]);
        assert!(b.error.is_none() && u.error.is_none(), "{:?} {:?}", b.error, u.error);
        assert_eq!(b.metrics.get(counter), Some(0.0), "{}: the bound was reached", b.policy);
        assert_eq!(format!("{:?}", b.metrics), format!("{:?}", u.metrics), "{} moved", b.policy);
    }
}
