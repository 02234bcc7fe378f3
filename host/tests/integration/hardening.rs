//! Hostile input (issue 9): every case ends in a clear error — file, line where it applies, field,
//! fix — with exit code 2, before any long work; and a seeded mutation pass over every workload
//! file asserts that nothing a user could type panics or hangs.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use routelab_core::workload::{self, estimate};

use crate::common::*;

mod mutations;

fn routelab(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_routelab")).args(args).current_dir(workspace()).output().expect("routelab runs")
}

fn scratch(name: &str) -> PathBuf {
    fixture("hardening", name)
}

fn write(name: &str, text: &str) -> String {
    let p = scratch(name);
    std::fs::write(&p, text).unwrap();
    p.to_string_lossy().into_owned()
}

/// Runs routelab; asserts exit 2 and that stderr holds every one of `wants`; returns stderr.
fn refused(args: &[&str], wants: &[&str]) -> String {
    let out = routelab(args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{args:?}: expected exit 2\nstderr: {err}\nstdout: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(err.contains("fix:"), "{args:?}: no fix offered: {err}");
    for w in wants {
        assert!(err.contains(w), "{args:?}: stderr lacks `{w}`: {err}");
    }
    err
}

const CLUSTER: &str =
    "cluster:\n  replicas: 2\n  generator: {output_tokens: 16}\n  arrivals: {poisson: {rate: 1.0}}\n  requests: 50\n";

#[test]
fn base_cycles_of_two_and_three_files_are_refused() {
    let a = write("cycle_a.yaml", "base: cycle_b.yaml\n");
    write("cycle_b.yaml", "base: cycle_a.yaml\ncluster: {replicas: 2}\n");
    let err = refused(&["validate", &a], &["cycle_b.yaml:1", "field `base`", "cycle of bases", "cycle_a.yaml"]);
    assert!(err.contains("cycle_a.yaml → ") || err.contains("cycle_b.yaml → "), "{err}");
    let x = write("ring_x.yaml", "# a ring of three\nbase: ring_y.yaml\n");
    write("ring_y.yaml", "base: ring_z.yaml\n");
    write("ring_z.yaml", "base: ring_x.yaml\n");
    refused(&["validate", &x], &["ring_z.yaml:1", "cycle of bases", "ring_x.yaml", "ring_y.yaml"]);
    let own = write("own.yaml", "base: own.yaml\n");
    refused(&["validate", &own], &["names the file itself"]);
    // A chain without a cycle still works.
    write("chain_root.yaml", CLUSTER);
    let leaf = write("chain_leaf.yaml", "base: chain_root.yaml\ncluster: {replicas: 3}\n");
    let out = routelab(&["validate", &leaf]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Issue 32: `base:` may name a built-in workload when no file beside the workload has the name,
/// so a user's own file starts from `tool_use` without a checkout; a name that is neither is
/// refused at the `base` line, with the nearest built-in name.
#[test]
fn a_base_may_name_a_built_in_workload() {
    let own = write("from_builtin.yaml", "# mine\nbase: tool_use\ncluster: {replicas: 3}\n");
    let merged = workload::load(Path::new(&own)).unwrap();
    let tool_use = workload::load(&workspace().join("workloads/cluster/tool_use.yaml")).unwrap();
    let (mine, theirs) = (merged.cluster.as_ref().unwrap(), tool_use.cluster.as_ref().unwrap());
    assert_eq!((mine.replicas, theirs.replicas), (3, 8));
    assert_eq!(mine.generator, theirs.generator, "everything but the override comes from the built-in");
    assert_eq!(merged.name, "from_builtin");
    // A file beside the workload wins over a built-in of the same name; without it, the built-in.
    let own_yaml = write("from_file.yaml", "base: tool_use.yaml\n");
    let beside = write("tool_use.yaml", CLUSTER);
    assert_eq!(workload::load(Path::new(&own_yaml)).unwrap().cluster.unwrap().requests, Some(50));
    std::fs::remove_file(beside).unwrap();
    assert_eq!(workload::load(Path::new(&own_yaml)).unwrap().cluster.unwrap().requests, theirs.requests);
    let bad = write("from_nonesuch.yaml", "base: tool_us\n");
    refused(&["validate", &bad], &["from_nonesuch.yaml:1", "field `base`", "`tool_us` is no file", "tool_use"]);
}

#[test]
fn huge_or_endless_files_are_refused_by_size() {
    let w = write("base_zero.yaml", "base: /dev/zero\n");
    refused(&["validate", &w], &["/dev/zero", "larger than the 1 MiB allowed for a workload"]);
    refused(&["validate", "/dev/zero"], &["larger than the 1 MiB"]);
    let big = write("big.yaml", &format!("# {}\n{CLUSTER}", "x".repeat(2 << 20)));
    refused(&["validate", &big], &["big.yaml", "larger than"]);
    // A trace: the size check comes before parsing, so /dev/zero ends at the cap.
    let t = write(
        "trace_zero.yaml",
        "cluster:\n  replicas: 2\n  generator: {output_tokens: 16}\n  arrivals: {trace: {path: /dev/zero}}\n",
    );
    refused(&["validate", &t], &["/dev/zero"]);
}

#[test]
fn deep_nesting_is_refused_before_parsing() {
    let w = write("deep.yaml", &format!("seed: 1\npolicies: {}\n", "[".repeat(100_000)));
    refused(&["validate", &w], &["deep.yaml:2", "nests deeper than 64"]);
    let w = write("deep_map.yaml", &format!("dispatch: {}\n", "{a: ".repeat(100)));
    refused(&["validate", &w], &["deep_map.yaml:1", "nests deeper"]);
}

#[test]
fn alias_bombs_are_refused_fast() {
    // "Billion laughs": 9 levels of 10 aliases each would expand to 10⁹ strings.
    let mut yaml = String::from("dispatch: {servers: 2, requests: 10}\npolicies:\n  - &a0 lol\n");
    for i in 1..10 {
        let refs: Vec<String> = (0..10).map(|_| format!("*a{}", i - 1)).collect();
        yaml.push_str(&format!("  - &a{i} [{}]\n", refs.join(", ")));
    }
    let p = write("laughs.yaml", &yaml);
    let out = routelab(&["validate", &p]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn counts_above_what_a_user_could_mean_are_refused() {
    let d = |extra: &str| format!("dispatch: {{servers: 4, requests: 1000{extra}}}\n");
    let c = |old: &str, new: &str| CLUSTER.replace(old, new);
    let cases: Vec<(&str, String, &[&str])> = vec![
        (
            "requests.yaml",
            "dispatch: {servers: 4, requests: 1000000000000}\n".into(),
            &["field `dispatch.requests`", "above the limit"],
        ),
        (
            "servers.yaml",
            "dispatch: {servers: 4294967295, requests: 10}\n".into(),
            &["field `dispatch.servers`", "4294967295"],
        ),
        ("replicas.yaml", c("replicas: 2", "replicas: 4294967295"), &["field `cluster.replicas`"]),
        ("duration.yaml", c("requests: 50", "duration_s: 1e15"), &["field `cluster.duration_s`"]),
        (
            "fanout.yaml",
            c("{output_tokens: 16}", "{output_tokens: 16, fanout: 4000000000}"),
            &["field `cluster.generator.fanout`"],
        ),
        (
            "contexts.yaml",
            c("{output_tokens: 16}", "{output_tokens: 16, contexts: {count: 4000000000, tokens: 10}}"),
            &["field `cluster.generator.contexts.count`"],
        ),
        (
            "questions.yaml",
            "compound: {system: locate_solve, pool: {models: 3}, questions: {train: 4000000000}}\n".into(),
            &["field `compound.questions.train`"],
        ),
        ("seeds.yaml", format!("seeds: 4294967295\n{}", d("")), &["field `seeds`"]),
    ];
    for (name, yaml, wants) in cases {
        let p = write(name, &yaml);
        refused(&["validate", &p], wants);
    }
    // What fits in this machine's memory is refused with the estimate (here: a machine of 8 GB).
    let w: workload::Workload = serde_norway::from_str("dispatch: {servers: 1000, requests: 2000000000}\n").unwrap();
    let e = estimate::check_memory_within(&w, 8e9).unwrap_err();
    assert_eq!(e.path, "dispatch.requests");
    assert!(e.message.contains("16.0 GB of memory") && e.message.contains("per run"), "{}", e.message);
    // The command line's --seeds is checked like the file's.
    let p = write("ok.yaml", &d(""));
    refused(&["compare", &p, "--policies", "random", "--seeds", "4294967295"], &["field `seeds`"]);
    // A scheduler config: refused at construction, before the run.
    let p = write("groups.yaml", CLUSTER);
    let out = routelab(&["run", &p, "--policy", "round_robin@priority_groups{groups: 1000000000}"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("1..=1000"), "{err}");
}

#[test]
fn validate_prints_an_estimate_of_memory_and_time() {
    let p = write(
        "estimate.yaml",
        "dispatch: {servers: 16, requests: 1000000}\nseeds: 3\npolicies: [random, round_robin]\n",
    );
    let out = routelab(&["validate", &p]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.starts_with("# estimate:")).unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("MB") && line.contains("6 run(s)"), "{line}");
    // The estimate grows with the requests.
    let w =
        |n: u64| workload::parse(&format!("dispatch: {{servers: 16, requests: {n}}}\n"), Path::new("w.yaml")).unwrap();
    let (small, large) = (estimate::estimate(&w(1_000)), estimate::estimate(&w(100_000_000)));
    assert!(large.bytes > 100.0 * small.bytes && large.seconds > 1000.0 * small.seconds, "{small:?} {large:?}");
}

#[test]
fn floats_that_overflow_derived_quantities_are_refused() {
    let d = |service: &str| format!("dispatch: {{servers: 4, requests: 100, {service}}}\n");
    let cases: Vec<(&str, String, &str)> = vec![
        ("cv.yaml", d("service: {lognormal: {cv: 1e200}}"), "dispatch.service.lognormal.cv"),
        (
            "refresh.yaml",
            d("information: {stale: {refresh_interval: 1e-12}}"),
            "dispatch.information.stale.refresh_interval",
        ),
        (
            "pareto.yaml",
            d("service: {bounded_pareto: {alpha: 1e-300, min: 1, max: 10000}}"),
            "dispatch.service.bounded_pareto.alpha",
        ),
        (
            "pareto_range.yaml",
            d("service: {bounded_pareto: {alpha: 1.1, min: 1e-300, max: 1e300}}"),
            "dispatch.service",
        ),
        ("empirical.yaml", d("service: {empirical: {values: [1e308, 1e308]}}"), "dispatch.service"),
        ("bimodal.yaml", d("service: {bimodal: {p_large: 0.5, small: 1e-300, large: 1e300}}"), "dispatch.service"),
        ("rho.yaml", d("utilisation: 1e-300"), "dispatch.utilisation"),
        ("rate.yaml", CLUSTER.replace("rate: 1.0", "rate: 1e-300"), "cluster.arrivals.poisson.rate"),
        (
            "gamma.yaml",
            CLUSTER.replace("poisson: {rate: 1.0}", "gamma: {rate: 1.0, cv: 1e200}"),
            "cluster.arrivals.gamma",
        ),
        (
            "think.yaml",
            CLUSTER.replace("{output_tokens: 16}", "{output_tokens: 16, turns: 2, think_time_s: 1e300}"),
            "cluster.generator.think_time_s",
        ),
        ("drain.yaml", CLUSTER.replace("replicas: 2", "replicas: 2\n  drain_s: .inf"), "cluster.drain_s"),
        (
            "overhead.yaml",
            CLUSTER.replace("replicas: 2", "replicas: 2\n  efficiency: {step_overhead_s: .inf}"),
            "cluster.efficiency",
        ),
        (
            "gpu.yaml",
            CLUSTER.replace(
                "replicas: 2",
                "replicas: 2\n  gpu: {name: slow, memory_gb: 48, bandwidth_gb_s: 1e-300, tflops: 1e-300}",
            ),
            "cluster.gpu",
        ),
        (
            "price.yaml",
            "compound: {system: locate_solve, pool: {models: 3, price_per_level: 1000, general_sd: 1000}}\n".into(),
            "compound.pool.price_base",
        ),
    ];
    for (name, yaml, field) in cases {
        let p = write(name, &yaml);
        let err = refused(&["validate", &p], &[name, &format!("field `{field}`")]);
        // The line of the field (or of its deepest parent the file spells out).
        let line = workload::field_line(&yaml, field).unwrap_or_else(|| panic!("{name}: no line for {field}"));
        assert!(err.contains(&format!("{name}:{line}: field")), "{name}: no line {line}: {err}");
    }
}

#[test]
fn field_errors_give_the_line_of_the_field() {
    let yaml = "# a comment naming cv: here
cluster:
  replicas: 2
  generator:
    output_tokens: 16
    fanout: 0
";
    assert_eq!(workload::field_line(yaml, "cluster.generator.fanout"), Some(6));
    assert_eq!(workload::field_line(yaml, "cluster.generator.contexts.count"), Some(4));
    assert_eq!(workload::field_line("models:\n  - {name: A}\n  - {name: B, price: -1}\n", "models[1].price"), Some(3));
    let e = workload::parse(&CLUSTER.replace("rate: 1.0", "rate: -1"), Path::new("w.yaml")).unwrap_err();
    assert_eq!((e.path.as_str(), e.line), ("cluster.arrivals.poisson.rate", Some(4)));
}

#[test]
fn trace_rows_that_break_the_clock_or_a_replica_exit_2_with_their_line() {
    let spec = |trace: &str| {
        format!(
            "cluster:\n  replicas: 2\n  generator: {{output_tokens: 16}}\n  arrivals: {{trace: {{path: {trace}}}}}\n"
        )
    };
    let t = write("huge_row.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n0,10,5\n1,4000000000,5\n");
    let w = write("huge_row.yaml", &spec(&t));
    refused(&["validate", &w], &["huge_row.csv:3", "KV"]);
    refused(&["compare", &w, "--policies", "round_robin"], &["huge_row.csv:3"]);
    let t = write("far.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n0,10,5\n1e308,10,5\n");
    let w = write("far.yaml", &spec(&t));
    refused(&["validate", &w], &["far.csv:3", "beyond the clock"]);
    let t = write("scaled.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n0,10,5\n1e6,10,5\n");
    let w = write("scaled.yaml", &spec(&t).replace("}}\n", ", time_scale: 1e200}}\n"));
    refused(&["validate", &w], &["scaled.csv:3", "time_scale"]);
    let w = write(
        "dispatch_far.yaml",
        &format!(
            "dispatch: {{servers: 2, requests: 10, arrivals: {{trace: {{path: {}}}}}}}\n",
            scratch("far.csv").display()
        ),
    );
    refused(&["validate", &w], &["far.csv:3"]);
}

#[test]
fn all_starts_over_too_large_a_space_is_bad_input() {
    let p = write("all_starts.yaml", "compound: {system: debate, pool: {models: 26}}\npolicies: [greedy]\n");
    refused(&["compare", &p, "--all-starts"], &["26 models ^ 6 modules", "above 10000"]);
}

/// Issue 26: outputs were written by rename, which replaced whatever was at the path — a
/// symlink, a FIFO, a device node — and `merge --json` onto one of its inputs overwrote it.
#[cfg(unix)]
#[test]
fn outputs_replace_only_regular_files_and_never_an_input() {
    use std::os::unix::fs::FileTypeExt;
    let w = write("outputs.yaml", CLUSTER);
    let compare = |json: &Path| {
        let out = routelab(&["compare", &w, "--policies", "round_robin", "--json", &json.to_string_lossy()]);
        assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
        out
    };
    // A symlink stays a symlink; its target gets the results.
    let (target, link) = (scratch("target.json"), scratch("link.json"));
    let _ = std::fs::remove_file(&link);
    std::fs::write(&target, "old").unwrap();
    std::os::unix::fs::symlink(&target, &link).unwrap();
    compare(&link);
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "the symlink was replaced");
    assert!(std::fs::read_to_string(&target).unwrap().contains("round_robin"));
    // A FIFO stays a FIFO, and its reader gets the results.
    let fifo = scratch("results.fifo");
    let _ = std::fs::remove_file(&fifo);
    let c = std::ffi::CString::new(fifo.to_string_lossy().as_bytes()).unwrap();
    // SAFETY: creating a FIFO at a path this test owns.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let f = fifo.clone();
    let reader = std::thread::spawn(move || std::fs::read_to_string(f).unwrap());
    compare(&fifo);
    assert!(reader.join().unwrap().contains("round_robin"));
    assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo(), "the FIFO was replaced");
    // /dev/stdout (a pipe here) is written, not replaced.
    let out = compare(Path::new("/dev/stdout"));
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"round_robin\""));
    let partials = std::fs::read_dir("/dev").unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned());
    assert!(
        !partials.into_iter().any(|n| n.starts_with("stdout.") && n.ends_with(".partial")),
        "a partial file in /dev"
    );
    // merge --json onto one of its inputs: refused, the input untouched.
    let shard = scratch("shard-1.json");
    let out =
        routelab(&["compare", &w, "--policies", "round_robin", "--shard", "1/1", "--json", &shard.to_string_lossy()]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let before = std::fs::read(&shard).unwrap();
    let s = shard.to_string_lossy();
    refused(&["merge", &s, "--json", &s], &["--json", "is one of this command's inputs"]);
    assert_eq!(std::fs::read(&shard).unwrap(), before, "merge overwrote its input");
}

/// Runs writing one `--json` file at once each succeed, and the file holds one whole document:
/// each writes through its own `<file>.<pid>.partial` (a shared `.partial` let one run's probe
/// delete another's half-written copy, and its rename then failed: CI, stop 37).
#[test]
fn runs_writing_one_file_at_once_all_succeed() {
    let w = write("together.yaml", CLUSTER);
    let json = scratch("together.json");
    // Before the fix, 79 of 120 such runs (20 rounds of 6) failed on this machine.
    for _ in 0..4 {
        let runs: Vec<_> = (0..6)
            .map(|_| {
                Command::new(env!("CARGO_BIN_EXE_routelab"))
                    .args(["compare", &w, "--policies", "round_robin,least_requests,random,power_of_two", "--json"])
                    .arg(&json)
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for r in runs {
            let out = r.wait_with_output().unwrap();
            assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
        }
    }
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(doc["workloads"][0]["results"].as_array().map(Vec::len), Some(4), "{doc}");
}

/// Issue 26: `--shard --report` wrote an empty page with exit 0; export-trace to an unwritable
/// file exited 1 with no fix line.
#[test]
fn a_shard_report_and_an_unwritable_trace_are_bad_input() {
    let w = write("shard_report.yaml", CLUSTER);
    let (json, page) = (scratch("shard-r.json"), scratch("shard-r.html"));
    let (json, page) = (json.to_string_lossy(), page.to_string_lossy());
    let args = ["compare", &w, "--policies", "round_robin", "--shard", "1/2", "--json", &json, "--report", &page];
    refused(&args, &["--shard", "--report"]);
    refused(&["export-trace", &w, "--out", "/nonexistent-dir/trace.jsonl"], &["--out", "/nonexistent-dir/trace.jsonl"]);
    // A device that refuses the write itself (the probe cannot tell without writing).
    refused(&["export-trace", &w, "--out", "/dev/full"], &["--out", "/dev/full: cannot be written"]);
}

/// Issue 26: the memory refusal counted one run whatever `-j` said.
#[test]
fn the_memory_refusal_counts_the_runs_held_at_once() {
    // 4 seeds of about 4 GB each (8 B per request): one at a time fits 8 GB, four at once do not.
    let w: workload::Workload =
        serde_norway::from_str("seeds: 4\ndispatch: {servers: 100, requests: 500000000}\n").unwrap();
    assert!(estimate::check_memory_scaled(&w, 8e9, 1).is_ok());
    let e = estimate::check_memory_scaled(&w, 8e9, 4).unwrap_err();
    assert!(e.message.contains("4 runs at once (-j)") && e.fix.contains("-j 1"), "{e:?}");
    // Never more at once than the workload has runs.
    let one: workload::Workload = serde_norway::from_str("dispatch: {servers: 100, requests: 500000000}\n").unwrap();
    assert!(estimate::check_memory_scaled(&one, 8e9, 64).is_ok());
}
