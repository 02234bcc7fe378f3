//! Looks for the optional tools some integration tests drive — headless Chromium (the report
//! test), GNU parallel (docs/scale.md's recipe) and the real engine `testing/llama/ensure.sh`
//! builds (the llama.cpp tests) — so that where one is missing its test is compiled as
//! `#[ignore]`d with the reason, and `cargo test`'s summary counts it as ignored rather than
//! passed. Nothing else depends on what is found.
//!
//! The engine is looked for where ensure.sh puts it (its cache folder, keyed by the versions
//! written in the script). ensure.sh leaves a stamp in `testing/llama/` once the engine is in
//! place, and this script watches that folder, so the tests built after it are not ignored.
//! With `ROUTELAB_REQUIRE_LLAMA=1` (as in `.ci/run`) they are never ignored: a missing engine
//! fails them.

use std::path::PathBuf;
use std::process::Command;

/// `name` in a folder of PATH, if there is one.
fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file())
}

/// Where `testing/llama/ensure.sh` builds llama-server and the model (its `--dir`), from the
/// versions it names, or `None` if the script cannot be read.
fn llama_dir() -> Option<PathBuf> {
    let script = std::fs::read_to_string("../testing/llama/ensure.sh").ok()?;
    let version =
        |name: &str| script.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix('=')).map(|v| v.trim().to_string());
    let key = format!("llama-{}-{}-{}", version("LLAMA_CPP_PYTHON")?, version("SMOLLM2")?, std::env::consts::ARCH);
    if let Some(dir) = std::env::var_os("ROUTELAB_LLAMA_DIR") {
        return Some(PathBuf::from(dir));
    }
    let cache = match std::env::var_os("XDG_CACHE_HOME") {
        Some(c) if !c.is_empty() => PathBuf::from(c),
        _ => PathBuf::from(std::env::var_os("HOME")?).join(".cache"),
    };
    Some(cache.join("routelab").join(key))
}

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    // The script (its versions) and the stamp it leaves once the engine is built.
    println!("cargo::rerun-if-changed=../testing/llama");
    for var in ["ROUTELAB_LLAMA_DIR", "XDG_CACHE_HOME", "HOME", "ROUTELAB_REQUIRE_LLAMA"] {
        println!("cargo::rerun-if-env-changed={var}");
    }
    println!("cargo::rustc-check-cfg=cfg(routelab_no_llama)");
    let required = std::env::var("ROUTELAB_REQUIRE_LLAMA").is_ok_and(|v| v == "1");
    let engine = llama_dir().is_some_and(|d| {
        d.join("bin/llama-server").is_file()
            && d.join("SmolLM2-135M-Instruct.Q4_1.gguf").is_file()
            && d.join("complete").is_file()
    });
    if !engine && !required {
        println!("cargo::rustc-cfg=routelab_no_llama");
    }
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
