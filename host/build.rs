//! Looks for the two optional tools some integration tests drive — headless Chromium (the report
//! test) and GNU parallel (docs/scale.md's recipe) — so that where one is missing its test is
//! compiled as `#[ignore]`d with the reason, and `cargo test`'s summary counts it as ignored
//! rather than passed. Nothing else depends on what is found.

use std::path::PathBuf;
use std::process::Command;

/// `name` in a folder of PATH, if there is one.
fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file())
}

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=PATH");
    println!("cargo::rerun-if-env-changed=ROUTELAB_CHROMIUM");
    println!("cargo::rustc-check-cfg=cfg(routelab_no_chromium)");
    println!("cargo::rustc-check-cfg=cfg(routelab_no_gnu_parallel)");
    let chromium = std::env::var_os("ROUTELAB_CHROMIUM").is_some()
        || on_path("chromium").is_some()
        || on_path("chromium-browser").is_some();
    if !chromium {
        println!("cargo::rustc-cfg=routelab_no_chromium");
    }
    // moreutils has a `parallel` of its own, with other arguments: only GNU's will do.
    let gnu_parallel = on_path("parallel")
        .and_then(|p| Command::new(p).arg("--version").output().ok())
        .is_some_and(|o| String::from_utf8_lossy(&o.stdout).contains("GNU parallel"));
    if !gnu_parallel {
        println!("cargo::rustc-cfg=routelab_no_gnu_parallel");
    }
}
