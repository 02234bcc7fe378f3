//! Building and finding what the tests load.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard, OnceLock};

use routelab_core::plugin::{Loader, PolicySpec};
use routelab_core::runner::{self, WorkloadResult};
use routelab_core::workload;

pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("host/ has a parent").to_path_buf()
}

/// `name` in this test module's scratch folder `target/test-fixtures/<module>/` (created if absent).
pub fn fixture(module: &str, name: &str) -> PathBuf {
    let d = target_dir().join("test-fixtures").join(module);
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

/// The cargo target directory (honours CARGO_TARGET_DIR).
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) if Path::new(&d).is_absolute() => PathBuf::from(d),
        Some(d) => workspace().join(d),
        None => workspace().join("target"),
    }
}

/// The output folder of the profile these tests were built with (`debug`, `release`, `checked`),
/// read off this test binary's path (`target/<profile>/deps/…`); plugins are built with the same.
pub fn profile() -> String {
    let exe = std::env::current_exe().expect("test binary path");
    exe.parent()
        .and_then(|deps| deps.parent())
        .and_then(|p| p.file_name())
        .expect("target/<profile>/deps")
        .to_string_lossy()
        .into_owned()
}

fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.env("CARGO_TARGET_DIR", target_dir());
    // Crates outside the workspace (the scaffold's output, the other-minor fixture) do not know the
    // workspace's `checked` profile: define it for them the same way, through cargo's config.
    c.env("CARGO_PROFILE_CHECKED_INHERITS", "release")
        .env("CARGO_PROFILE_CHECKED_DEBUG_ASSERTIONS", "true")
        .env("CARGO_PROFILE_CHECKED_OVERFLOW_CHECKS", "true");
    c
}

/// Runs `cargo build` for `packages` in `dir` with this test's profile; panics with cargo's output.
pub fn cargo_build(dir: &Path, packages: &[&str]) {
    let args: Vec<&str> = packages.iter().flat_map(|p| ["-p", p]).collect();
    cargo_build_with(dir, &args);
}

/// Runs `cargo build ARGS` in `dir` with this test's profile; panics with cargo's output.
fn cargo_build_with(dir: &Path, args: &[&str]) {
    let mut c = cargo();
    c.current_dir(dir).arg("build").arg("--quiet");
    let profile = profile();
    c.args(["--profile", if profile == "debug" { "dev" } else { &profile }]);
    c.args(args);
    let out = c.output().expect("cargo runs");
    assert!(out.status.success(), "cargo build failed in {}:\n{}", dir.display(), String::from_utf8_lossy(&out.stderr));
}

/// Builds (once per test process) every library of the workspace, the plugin libraries among
/// them. All of them, not `-p` the plugins: cargo unifies features over the packages it is asked
/// for, so a build of the plugins alone resolves serde and the proc macros' syn with other
/// features than `cargo test --workspace` did, and rebuilds serde, abi_stable, the policy API and
/// the policies from scratch. Asked for the whole workspace it finds them built.
pub fn workspace_libraries() {
    static BUILT: OnceLock<()> = OnceLock::new();
    // The features this test was built with, too (`.ci/run` turns `tokenizer` on): else the
    // serving crate and everything above it would be built a second time without them.
    let features: &[&str] = if cfg!(feature = "tokenizer") { &["--features", "routelab/tokenizer"] } else { &[] };
    BUILT.get_or_init(|| cargo_build_with(&workspace(), &[&["--workspace", "--lib"], features].concat()));
}

pub fn lib_path(crate_snake: &str) -> PathBuf {
    target_dir().join(profile()).join(format!(
        "{}{crate_snake}{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    ))
}

pub struct Plugins {
    pub builtin: PathBuf,
    pub faulty: PathBuf,
    /// A library whose registry function panics.
    pub faulty_registry: PathBuf,
    pub example: PathBuf,
    pub lru_affinity: PathBuf,
    /// The example prefill/decode-disaggregation router.
    pub pd_threshold: PathBuf,
    /// The example admission policy (`routelab new-policy --kind admission`).
    pub my_admission: PathBuf,
}

/// Builds (once per test process) the workspace's plugin libraries: the built-ins, the faulty
/// fixtures and the example crate. `cargo build -p routelab` alone would leave them stale.
pub fn plugins() -> &'static Plugins {
    static P: OnceLock<Plugins> = OnceLock::new();
    P.get_or_init(|| {
        workspace_libraries();
        Plugins {
            builtin: lib_path("routelab_builtin_plugin"),
            faulty: lib_path("routelab_faulty_plugin"),
            faulty_registry: lib_path("routelab_faulty_registry"),
            example: lib_path("my_router"),
            lru_affinity: lib_path("lru_affinity"),
            pd_threshold: lib_path("pd_threshold"),
            my_admission: lib_path("my_admission"),
        }
    })
}

/// Runs `policies` on workload YAML text (named `name` in errors).
pub fn compare_text(yaml: &str, name: &str, policies: &[String]) -> WorkloadResult {
    let file = Path::new(name);
    let w = workload::parse(yaml, file).unwrap_or_else(|e| panic!("{e}"));
    let prepared = runner::prepare(w, file).unwrap_or_else(|e| panic!("{e}"));
    let specs: Vec<PolicySpec> = policies.iter().map(|p| PolicySpec::parse(p).unwrap()).collect();
    runner::run_workload(&mut Loader::new(), &prepared, &specs, &|_| {}, &|_| {})
}

/// Runs `policies` on a workload file of the repository.
pub fn compare_file(rel: &str, policies: &[&str]) -> WorkloadResult {
    let path = workspace().join(rel);
    let text = std::fs::read_to_string(&path).unwrap();
    compare_text(&text, rel, &policies.iter().map(|s| s.to_string()).collect::<Vec<_>>())
}

/// A metric of a policy's result (mean over seeds), panicking with context if absent.
pub fn metric(w: &WorkloadResult, policy: &str, key: &str) -> f64 {
    let r = w.results.iter().find(|r| r.policy == policy).unwrap_or_else(|| panic!("no result for {policy}"));
    assert!(r.error.is_none(), "{policy} failed: {:?}", r.error);
    r.metrics.get(key).unwrap_or_else(|| panic!("{policy} has no {key}"))
}

/// A metric per seed.
pub fn per_seed(w: &WorkloadResult, policy: &str, key: &str) -> Vec<f64> {
    let r = w.results.iter().find(|r| r.policy == policy).unwrap();
    r.per_seed.iter().map(|m| m.get(key).unwrap()).collect()
}

/// Held by tests that must not share the machine's cores with each other: the headless browser
/// takes every core for seconds, and the hostile-plugin test's 2 s `--policy-timeout` assumes the
/// child gets to run (its memory hog then times out instead of running out of memory).
pub fn cores_alone() -> MutexGuard<'static, ()> {
    static CORES: Mutex<()> = Mutex::new(());
    CORES.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// policy-api's version as (major, minor, patch).
pub fn api_version() -> (u32, u32, u32) {
    let v: Vec<u32> = routelab_policy_api::API_VERSION.split('.').map(|p| p.parse().unwrap()).collect();
    (v[0], v[1], v[2])
}

/// Writes a copy of policy-api to `to`, relabelled `version`. With `before: Some(patch)`, the
/// items appended in later patches — the lines from `// since 0.M.N {` to `// } since 0.M.N` for
/// N > patch — are cut out: the copy is then that earlier patch as released.
pub fn relabelled_api(to: &Path, version: &str, before: Option<u32>) {
    fn copy(from: &Path, to: &Path, before: Option<u32>) {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                copy(&e.path(), &to.join(e.file_name()), before);
                continue;
            }
            let text = std::fs::read_to_string(e.path()).unwrap();
            std::fs::write(to.join(e.file_name()), cut_later_patches(&text, before)).unwrap();
        }
    }
    copy(&workspace().join("policy-api/src"), &to.join("src"), before);
    // The workspace's own versions of the API's dependencies, spelled out for a crate outside it.
    let root = std::fs::read_to_string(workspace().join("Cargo.toml")).unwrap();
    let dep = |name: &str| root.lines().find(|l| l.starts_with(&format!("{name} = "))).unwrap().to_string();
    let deps = ["abi_stable", "rand", "serde", "serde_norway"].map(dep).join("\n");
    let manifest = format!(
        "[package]\nname = \"routelab-policy-api\"\nversion = \"{version}\"\nedition = \"2024\"\n\n[dependencies]\n{deps}\n"
    );
    std::fs::write(to.join("Cargo.toml"), manifest).unwrap();
}

/// `text` without the items appended after patch `before` (unchanged for `None`).
pub fn cut_later_patches(text: &str, before: Option<u32>) -> String {
    let Some(before) = before else { return text.to_string() };
    let (_, minor, _) = api_version();
    let mut out = String::new();
    let mut cutting: Option<String> = None;
    for line in text.lines() {
        let t = line.trim();
        if let Some(end) = &cutting {
            if t == end {
                cutting = None;
            }
            continue;
        }
        if let Some(v) = t.strip_prefix(&format!("// since 0.{minor}.")).and_then(|r| r.strip_suffix(" {")) {
            if v.parse::<u32>().unwrap() > before {
                cutting = Some(format!("// }} since 0.{minor}.{v}"));
                continue;
            }
        }
        out.push_str(line);
        out.push('\n');
    }
    assert!(cutting.is_none(), "an unterminated `// since` block");
    out
}

/// Copies the plugin crate at `src_crate` (its `src/`) to `to` with `manifest` as its Cargo.toml,
/// its policy-api dependency pointed at the sibling folder `policy-api`, and builds it in the
/// shared target dir with the workspace's lock file (the same dependency versions).
pub fn plugin_against(src_crate: &Path, to: &Path, manifest: &str) {
    copy_tree(&src_crate.join("src"), &to.join("src"));
    let manifest = manifest
        .replace("\"../../../policy-api\"", "\"../policy-api\"")
        .replace("\"../../policy-api\"", "\"../policy-api\"");
    let manifest = if manifest.contains("[workspace]") { manifest } else { manifest + "\n[workspace]\n" };
    std::fs::write(to.join("Cargo.toml"), manifest).unwrap();
    std::fs::copy(workspace().join("Cargo.lock"), to.join("Cargo.lock")).unwrap();
    cargo_build(to, &[]);
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// Runs the `routelab` binary with `args` from the workspace root.
pub fn routelab(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_routelab")).args(args).current_dir(workspace()).output().expect("routelab runs")
}

/// Runs `args`, expects exit 2, nothing on stdout, and every `wanted` fragment in stderr.
pub fn bad(args: &[&str], wanted: &[&str]) {
    let out = routelab(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(out.stdout.is_empty(), "{args:?} ran: {}", String::from_utf8_lossy(&out.stdout));
    for w in wanted {
        assert!(err.contains(w), "{args:?}: stderr lacks {w:?}: {err}");
    }
}
