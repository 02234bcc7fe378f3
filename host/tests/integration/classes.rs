//! Request classes end to end (issue 27): the table of a workload with `classes:` adds each
//! class's attainment and TTFT P99 (terminal and HTML alike) and no other table does; bad class
//! and tenant input stops with exit code 2 naming file, line and field.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::*;
use routelab::report::table::fmt_num;

fn routelab(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_routelab")).args(args).current_dir(workspace()).output().expect("routelab runs")
}

fn scratch(name: &str, yaml: &str) -> PathBuf {
    let p = fixture("classes", name);
    std::fs::write(&p, yaml).unwrap();
    p
}

/// `classes/interactive_batch_spike.yaml` cut to 300 requests and one seed.
fn spike() -> String {
    std::fs::read_to_string(workspace().join("workloads/cluster/classes/interactive_batch_spike.yaml"))
        .unwrap()
        .replace("requests: 3000", "requests: 300")
        .replace("seeds: 2", "seeds: 1")
}

/// The Markdown table `routelab compare FILE --markdown` prints: header cells, then per policy
/// its cells by header.
fn table(stdout: &str) -> (Vec<String>, Vec<Vec<String>>) {
    let cells = |l: &str| l.trim().trim_matches('|').split('|').map(|c| c.trim().to_string()).collect::<Vec<_>>();
    let mut lines = stdout.lines().filter(|l| l.trim_start().starts_with('|'));
    let header = cells(lines.next().expect("a table"));
    let rows = lines.filter(|l| !l.contains("---")).map(cells).collect();
    (header, rows)
}

/// Runs `compare FILE --markdown --json J [extra]` and returns the table and the JSON.
fn compare(file: &Path, extra: &[&str]) -> (Vec<String>, Vec<Vec<String>>, serde_json::Value) {
    let json = file.with_extension("json");
    let mut args = vec!["compare", file.to_str().unwrap(), "--markdown", "--json", json.to_str().unwrap()];
    args.extend(extra);
    let out = routelab(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (header, rows) = table(&String::from_utf8_lossy(&out.stdout));
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    (header, rows, doc)
}

/// A workload with classes: after the usual columns, each class (in the workload's order) adds
/// `NAME att` and `NAME TTFT p99 [s]`, whose cells are the JSON's `class.NAME.slo_attainment` and
/// `class.NAME.ttft_p99_s` for that policy; the HTML report's table has the same headers.
#[test]
fn a_workload_with_classes_shows_each_class_attainment_and_ttft_p99() {
    let file = scratch("spike.yaml", &spike());
    let page = fixture("classes", "spike.html");
    let (header, rows, doc) = compare(&file, &["--report", page.to_str().unwrap()]);
    let wanted = ["interactive att", "interactive TTFT p99 [s]", "batch att", "batch TTFT p99 [s]"];
    let at = header.iter().position(|h| h == wanted[0]).unwrap_or_else(|| panic!("no class columns: {header:?}"));
    assert_eq!(&header[at..at + 4], wanted, "grouped by class, in the workload's order");
    assert!(header[..at].contains(&"SLO attained".to_string()), "the usual columns come first: {header:?}");
    let results = doc["workloads"][0]["results"].as_array().unwrap();
    assert_eq!(rows.len(), results.len());
    for (row, r) in rows.iter().zip(results) {
        assert_eq!(row[0], r["policy"].as_str().unwrap());
        for (k, key) in
            ["interactive.slo_attainment", "interactive.ttft_p99_s", "batch.slo_attainment", "batch.ttft_p99_s"]
                .iter()
                .enumerate()
        {
            let v = r["metrics"][format!("class.{key}")].as_f64().unwrap_or_else(|| panic!("no class.{key}"));
            assert_eq!(row[at + k], fmt_num(v), "{} class.{key}", row[0]);
        }
    }
    let html = std::fs::read_to_string(&page).unwrap();
    for h in wanted {
        assert!(html.contains(&format!("<th>{h}</th>")), "the report lacks {h}");
    }
}

/// No class columns without `classes:`: not for a workload whose tenants and SLO give it
/// per-group figures (its one class is `default`), and not when `--columns` chooses the columns.
#[test]
fn other_tables_have_no_class_columns() {
    // The spike with its `classes:` block (up to the cluster's `arrivals:`) replaced by tenants.
    let base = spike();
    let (start, end) = (base.find("  classes:\n").unwrap(), base.find("  arrivals:\n").unwrap());
    let tenants = format!(
        "{}  slo: {{ttft_s: 1}}\n  tenants:\n    - {{name: a, weight: 2}}\n    - {{name: b, weight: 1}}\n{}",
        &base[..start],
        &base[end..]
    );
    let (header, _, doc) = compare(&scratch("tenants.yaml", &tenants), &[]);
    let m = &doc["workloads"][0]["results"][0]["metrics"];
    assert!(m["class.default.slo_attainment"].is_f64() && m["tenant.a.slo_attainment"].is_f64(), "{m}");
    assert!(header.contains(&"SLO attained".to_string()), "{header:?}");
    assert!(!header.iter().any(|h| h.starts_with("default ") || h.ends_with(" att")), "{header:?}");
    let (header, _, _) = compare(&scratch("columns.yaml", &spike()), &["--columns", "ttft_p99_s,slo_attainment"]);
    assert_eq!(header[1..3], ["TTFT p99 [s]", "SLO attained"], "{header:?}");
    assert!(!header.iter().any(|h| h.starts_with("interactive") || h.starts_with("batch")), "{header:?}");
}

/// `routelab compare FILE` fails with exit 2 and stderr naming each of `wanted`.
fn refused(file: &Path, wanted: &[&str]) {
    let out = routelab(&["compare", file.to_str().unwrap(), "--policies", "round_robin"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{}: {err}", file.display());
    for w in wanted {
        assert!(err.contains(w), "stderr lacks {w:?}: {err}");
    }
    assert!(!err.contains("panicked"), "{err}");
}

/// A bad class or tenant in a workload, or a trace row naming a class or tenant the workload
/// lacks: exit 2, the file, the line and the field (or column), and a fix.
#[test]
fn bad_classes_and_tenants_exit_2_naming_file_line_and_field() {
    let base = spike();
    let line_of = |yaml: &str, needle: &str| 1 + yaml.lines().position(|l| l.contains(needle)).unwrap();
    let share = base.replace("name: interactive, share: 1,", "name: interactive, share: -1,");
    let line = line_of(&share, "share: -1");
    refused(&scratch("share.yaml", &share), &[&format!("share.yaml:{line}:"), "cluster.classes[0].share", "fix:"]);
    let twice = base.replace("- name: batch", "- name: interactive");
    let line = line_of(&twice, "- name: interactive");
    refused(&scratch("twice.yaml", &twice), &[&format!("twice.yaml:{line}:"), "cluster.classes[1].name", "twice"]);
    // A class's own arrival process, checked under its path.
    let own = base.replace("gamma: {rate: 22.0, cv: 8.0}", "gamma: {rate: 0, cv: 8.0}");
    let line = line_of(&own, "rate: 0, cv");
    refused(&scratch("own.yaml", &own), &[&format!("own.yaml:{line}:"), "cluster.classes[1].arrivals.gamma", "fix:"]);
    let tenant = base.replace("  arrivals:\n", "  tenants:\n    - {name: a, weight: 0}\n  arrivals:\n");
    let line = line_of(&tenant, "weight: 0");
    refused(&scratch("tenant.yaml", &tenant), &[&format!("tenant.yaml:{line}:"), "cluster.tenants[0].weight", "fix:"]);
    // A trace whose third row names class 2 of a workload with two classes.
    let trace = scratch(
        "classes.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens,Class,Tenant\n0,500,20,0,0\n0.5,600,30,1,0\n1.0,700,40,2,0\n",
    );
    let traced = format!(
        "name: traced\ncluster:\n  replicas: 2\n  generator: {{output_tokens: 16}}\n  classes:\n    - {{name: a, share: 1}}\n    - {{name: b, share: 1}}\n  arrivals: {{trace: {{path: {}}}}}\n",
        trace.display()
    );
    refused(&scratch("traced.yaml", &traced), &["classes.csv:4", "Class 2", "valid: 0..1", "cluster.classes"]);
    // The Mooncake rows' `class` and `tenant`: an index the workload lacks, or not an index.
    let row = |extra: &str| {
        format!("{{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 20, \"hash_ids\": [0, 1]{extra}}}\n")
    };
    let cases = [
        ("class2.jsonl", ", \"class\": 2", "class2.jsonl:3: field `class`", "valid: 0..1"),
        ("tenant1.jsonl", ", \"tenant\": 1", "tenant1.jsonl:3: field `tenant`", "no `cluster.tenants`"),
        ("classname.jsonl", ", \"class\": \"b\"", "classname.jsonl:3: field `class`", "class index"),
        ("tenantneg.jsonl", ", \"tenant\": -1", "tenantneg.jsonl:3: field `tenant`", "tenant index"),
    ];
    for (name, bad, at, says) in cases {
        let trace = scratch(name, &format!("{}{}{}", row(", \"class\": 1"), row(""), row(bad)));
        let traced = format!(
            "name: traced\ncluster:\n  replicas: 2\n  generator: {{output_tokens: 16}}\n  classes:\n    - {{name: a, share: 1}}\n    - {{name: b, share: 1}}\n  arrivals: {{trace: {{path: {}, format: mooncake}}}}\n",
            trace.display()
        );
        refused(&scratch(&format!("{name}.yaml"), &traced), &[at, says, "fix:"]);
    }
}

/// `export-trace` of a workload with classes writes every row's `class` and `tenant`; replaying
/// the file under the same classes runs each class's requests as the file says (the run's
/// per-class counts are the file's), and `gie_saturation` in front sheds only the sheddable
/// class and reports each class's admission wait.
#[test]
fn classes_survive_export_and_replay() {
    let file = scratch("export.yaml", &spike());
    let trace = fixture("classes", "export.jsonl");
    let out = routelab(&["export-trace", file.to_str().unwrap(), "--out", trace.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut per_class = [0usize; 2];
    for line in std::fs::read_to_string(&trace).unwrap().lines() {
        let row: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(row["tenant"], 0, "{line}");
        per_class[row["class"].as_u64().unwrap_or_else(|| panic!("no class: {line}")) as usize] += 1;
    }
    assert_eq!(per_class.iter().sum::<usize>(), 300);
    assert!(per_class.iter().all(|&n| n > 50), "both classes: {per_class:?}");
    let replay = spike()
        .replace("admission: admit_all", "admission: gie_saturation")
        .replace("      arrivals: {gamma: {rate: 22.0, cv: 8.0}}\n", "      share: 1\n")
        .replace("poisson: {rate: 22.0}", &format!("trace: {{path: {}, format: mooncake}}", trace.display()));
    assert!(replay.contains("format: mooncake") && replay.contains("gie_saturation"));
    let (_, _, doc) = compare(&scratch("replay.yaml", &replay), &["--policies", "least_requests"]);
    let m = &doc["workloads"][0]["results"][0]["metrics"];
    assert_eq!(m["class.interactive.requests"], per_class[0] as f64, "{m}");
    assert_eq!(m["class.batch.requests"], per_class[1] as f64, "{m}");
    assert_eq!(m["class.interactive.shed"], 0.0, "interactive is not sheddable: {m}");
    assert!(m["class.interactive.admission_wait_mean_s"].is_f64() && m["class.batch.admission_wait_mean_s"].is_f64());
}

/// `routelab import --workload W` maps a log line's `class` and `tenant` names to W's indices:
/// replaying the trace under W counts each class's and tenant's requests as the log gives them;
/// a name W lacks, or a name without `--workload`, exits 2 naming the log's file, line and field.
#[test]
fn import_maps_class_and_tenant_names_to_the_workloads_indices() {
    let log_line = |t: f64, class: &str, tenant: &str| {
        format!(
            "{{\"timestamp\": {t}, \"prompt\": \"request at {t}\", \"output_tokens\": 5, \"class\": \"{class}\", \"tenant\": \"{tenant}\"}}\n"
        )
    };
    let log: String = [(0.0, "batch", "b"), (0.5, "interactive", "a"), (1.0, "batch", "a"), (1.5, "batch", "b")]
        .iter()
        .map(|&(t, c, n)| log_line(t, c, n))
        .collect();
    let log = scratch("import-log.jsonl", &log);
    let trace = fixture("classes", "import-trace.jsonl");
    let workload = scratch(
        "import.yaml",
        &format!(
            "name: imported\nseeds: 1\ncluster:\n  replicas: 2\n  generator: {{output_tokens: 16}}\n  classes:\n    - {{name: interactive, share: 1, slo: {{ttft_s: 1}}}}\n    - {{name: batch, share: 1, priority: -1}}\n  tenants:\n    - {{name: a, weight: 1}}\n    - {{name: b, weight: 1}}\n  arrivals: {{trace: {{path: {}, format: mooncake}}}}\n",
            trace.display()
        ),
    );
    let (log_s, trace_s, workload_s) = (log.to_str().unwrap(), trace.to_str().unwrap(), workload.to_str().unwrap());
    let out = routelab(&["import", log_s, "--out", trace_s, "--workload", workload_s]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows: Vec<(u64, u64)> = std::fs::read_to_string(&trace)
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (v["class"].as_u64().unwrap(), v["tenant"].as_u64().unwrap())
        })
        .collect();
    assert_eq!(rows, [(1, 1), (0, 0), (1, 0), (1, 1)]);
    let (_, _, doc) = compare(&workload, &["--policies", "round_robin"]);
    let m = &doc["workloads"][0]["results"][0]["metrics"];
    let count = |k: &str| m[k].as_f64();
    assert_eq!((count("class.interactive.requests"), count("class.batch.requests")), (Some(1.0), Some(3.0)), "{m}");
    assert_eq!((count("tenant.a.requests"), count("tenant.b.requests")), (Some(2.0), Some(2.0)), "{m}");

    let unknown =
        scratch("import-unknown.jsonl", &format!("{}{}", log_line(0.0, "batch", "a"), log_line(1.0, "chat", "a")));
    let out = routelab(&["import", unknown.to_str().unwrap(), "--out", trace_s, "--workload", workload_s]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    for w in ["import-unknown.jsonl:2: field `class`", "`chat`", "interactive, batch", "fix:"] {
        assert!(err.contains(w), "stderr lacks {w:?}: {err}");
    }
    let out = routelab(&["import", log_s, "--out", trace_s]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("import-log.jsonl:1: field `class`") && err.contains("--workload"), "{err}");
}
