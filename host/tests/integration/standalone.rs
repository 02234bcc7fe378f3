//! The repository stands alone and the installed binary works anywhere: built-in workloads by
//! name from an empty folder outside the repository, the demo's rerun hints, `validate`'s output
//! fed back in, `schema`, completions, and nothing tracked pointing outside the repository.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::*;

/// An empty folder outside the repository (under the system's temporary directory).
fn empty_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("routelab-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    assert!(!d.starts_with(workspace()), "{} is inside the repository", d.display());
    d
}

fn routelab_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_routelab")).args(args).current_dir(dir).output().expect("routelab runs")
}

fn ok(out: &Output) -> String {
    assert!(out.status.success(), "exit {:?}: {}", out.status.code(), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The demo, its rerun hints, and built-in workloads by name (one replaying the shipped trace),
/// from an empty folder outside the repository.
#[test]
fn the_binary_runs_built_in_workloads_from_an_empty_folder() {
    let dir = empty_dir("anywhere");
    let demo = ok(&routelab_in(&dir, &["demo"]));
    let reruns: Vec<&str> =
        demo.lines().filter_map(|l| l.strip_prefix("(rerun: routelab ")?.strip_suffix(')')).collect();
    assert_eq!(reruns.len(), 3, "{demo}");
    for rerun in reruns {
        // `compare NAME --policies a,b,c`: no shell quoting needed in the demo's lists.
        let args: Vec<&str> = rerun.split(' ').collect();
        let out = ok(&routelab_in(&dir, &args));
        assert!(out.contains("world, seed"), "{rerun}: {out}");
    }
    let out = ok(&routelab_in(&dir, &["compare", "case_study", "--policies", "greedy,llmselector", "--start", "C,C"]));
    assert!(out.contains("A+B"), "{out}");
    let out = ok(&routelab_in(&dir, &["validate", "azure_conv"]));
    assert!(out.contains("19366 rows"), "the shipped trace is read: {out}");
    // The Mooncake traces travel in the binary too, and replay by name.
    let out = ok(&routelab_in(&dir, &["compare", "mooncake_conversation", "--policies", "round_robin"]));
    assert!(out.contains("mooncake_conversation [cluster world") && out.contains("round_robin"), "{out}");
    let out = ok(&routelab_in(&dir, &["validate", "mooncake_synthetic"]));
    assert!(out.contains("3993 rows"), "the shipped trace is read: {out}");
    let list = ok(&routelab_in(&dir, &["workloads"]));
    for name in [
        "cache_vs_balance",
        "exp_rho09",
        "case_study",
        "azure_conv",
        "mooncake_conversation",
        "cluster/experiments/preble_grid/agent",
    ] {
        assert!(list.lines().any(|l| l.trim_start().starts_with(&format!("{name} "))), "{name} not listed:\n{list}");
    }
    // A misspelt name is bad input with a suggestion.
    let out = routelab_in(&dir, &["compare", "cache_vs_balanse"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("did you mean `cache_vs_balance`"), "{out:?}");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "nothing written into the working folder");
}

/// `validate` prints a workload that validates again to the same resolved form, for every
/// built-in.
#[test]
fn validate_output_round_trips_for_every_built_in() {
    let dir = empty_dir("roundtrip");
    let list = ok(&routelab_in(&dir, &["workloads"]));
    let names: Vec<&str> = list.lines().skip(1).filter_map(|l| l.split_whitespace().next()).collect();
    assert!(names.len() > 20);
    let resolved = |text: &str| -> String {
        // The first line is "FILE: ok (world)"; comment lines (notes, statistics) follow the YAML.
        text.lines().skip(1).take_while(|l| !l.starts_with('#')).collect::<Vec<_>>().join("\n")
    };
    for name in names {
        let first = resolved(&ok(&routelab_in(&dir, &["validate", name])));
        let file = dir.join(format!("{}.yaml", name.replace('/', "_")));
        std::fs::write(&file, &first).unwrap();
        let second = resolved(&ok(&routelab_in(&dir, &["validate", file.to_str().unwrap()])));
        assert_eq!(first, second, "{name}: validate's output is not a fixed point");
    }
}

#[test]
fn schema_and_completions() {
    let schema: serde_json::Value = serde_json::from_str(&ok(&routelab_in(&workspace(), &["schema"]))).unwrap();
    assert_eq!(schema["title"], "routelab workload");
    assert!(schema["properties"]["cluster"].is_object() && schema["properties"]["base"].is_object());
    for shell in ["bash", "zsh", "fish"] {
        let script = ok(&routelab_in(&workspace(), &["completions", shell]));
        assert!(script.contains("routelab") && script.contains("compare") && script.contains("policies"), "{shell}");
    }
}

/// A public clone has nothing beside it: no tracked file may point at a `shared` folder next to
/// the repository.
#[test]
fn no_tracked_file_points_outside_the_repository() {
    let needle = concat!("..", "/shared");
    let out = Command::new("git").args(["ls-files", "-z"]).current_dir(workspace()).output();
    let files: Vec<PathBuf> = match out {
        Ok(o) if o.status.success() => o
            .stdout
            .split(|b| *b == 0)
            .filter(|f| !f.is_empty())
            .map(|f| workspace().join(String::from_utf8_lossy(f).as_ref()))
            .collect(),
        _ => panic!("git ls-files failed: the test needs the repository's git metadata"),
    };
    assert!(files.len() > 50);
    let offenders: Vec<String> = files
        .iter()
        .filter(|f| std::fs::read(f).is_ok_and(|b| String::from_utf8_lossy(&b).contains(needle)))
        .map(|f| f.strip_prefix(workspace()).unwrap_or(f).display().to_string())
        .collect();
    assert!(offenders.is_empty(), "these files mention {needle}: {offenders:?}");
}

/// Labels name policies in tables and JSON; a plugin is shown by its name, its path kept in `spec`.
#[test]
fn policy_labels_and_plugin_names() {
    let lib = plugins().builtin.display().to_string();
    let json = std::env::temp_dir().join(format!("routelab-labels-{}.json", std::process::id()));
    let p = format!("fast=power_of_two{{d: 3}},{lib}:least_requests,random");
    let out = ok(&routelab_in(
        &workspace(),
        &["compare", "exp_rho09", "--seeds", "1", "--policies", &p, "--json", json.to_str().unwrap()],
    ));
    assert!(out.contains("│ fast ") && out.contains("│ least_requests ") && !out.contains(".so"), "{out}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rs = &v["workloads"][0]["results"];
    assert_eq!(rs[0]["policy"], "fast");
    assert_eq!(rs[0]["spec"], "fast=power_of_two{d: 3}");
    assert_eq!(rs[0]["config"], "{d: 3}");
    assert_eq!(rs[1]["policy"], "least_requests");
    assert_eq!(rs[1]["spec"], format!("{lib}:least_requests"));
    // The same label twice is an error before anything runs.
    let out = routelab_in(
        &workspace(),
        &["compare", "exp_rho09", "--policies", &format!("least_requests,{lib}:least_requests")],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("give one a label"), "{out:?}");
    let _ = std::fs::remove_file(json);
}
