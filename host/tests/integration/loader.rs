//! Loading policies from libraries: bit-identical results, and a clear error for every way a
//! library or a policy can be wrong — with the other policies of the run still reporting.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use routelab_core::plugin::{LoadErrorKind, Loader, PolicySpec};
use routelab_policy_api::{RouterContext, World};

use crate::common::*;

fn ctx() -> RouterContext {
    RouterContext::new(World::Dispatch, 4, 1)
}

const CLASSIC: [&str; 5] = ["random", "round_robin", "least_requests", "power_of_two", "least_work_left"];

/// Every classic router, loaded from the built plugin library, gives bit-identical metrics (and
/// JSON) to the linked-in one.
#[test]
fn plugin_library_matches_builtins_bit_for_bit() {
    let lib = &plugins().builtin;
    let yaml = std::fs::read_to_string(workspace().join("workloads/dispatch/exp_rho09.yaml"))
        .unwrap()
        .replace("requests: 200000", "requests: 30000");
    let builtin: Vec<String> = CLASSIC.iter().map(|s| s.to_string()).collect();
    let loaded: Vec<String> = CLASSIC.iter().map(|s| format!("{}:{s}", lib.display())).collect();
    let a = compare_text(&yaml, "exp.yaml", &builtin);
    let b = compare_text(&yaml, "exp.yaml", &loaded);
    for (x, y) in a.results.iter().zip(&b.results) {
        assert!(x.error.is_none() && y.error.is_none(), "{:?} {:?}", x.error, y.error);
        assert_eq!(x.per_seed, y.per_seed, "{} differs when loaded", x.policy);
        assert_eq!(serde_json::to_string(&x.metrics).unwrap(), serde_json::to_string(&y.metrics).unwrap());
    }
}

#[test]
fn library_lists_every_builtin_with_defaults() {
    let mut loader = Loader::new();
    let from_lib = loader.list(Some(&plugins().builtin)).unwrap();
    let builtin = loader.list(None).unwrap();
    assert_eq!(from_lib, builtin);
    let p2 = from_lib.iter().find(|l| l.name == "power_of_two").unwrap();
    let config = p2.default_config.as_deref().unwrap();
    assert!(config.contains("d: 2"), "{config}");
}

/// A policy that panics in its hot path fails its own run with a message naming it and the
/// method; the other policies of the comparison still report.
#[test]
fn panicking_policy_fails_alone() {
    let lib = &plugins().faulty;
    let yaml = "dispatch: {servers: 4, utilisation: 0.5, requests: 1000}\n";
    let w = compare_text(yaml, "p.yaml", &[format!("{}:panics_in_route", lib.display()), "round_robin".into()]);
    let err = w.results[0].error.as_deref().expect("the panicking policy fails");
    assert!(err.contains("panics_in_route") && err.contains("panicked in route"), "{err}");
    assert!(err.contains("deliberate panic on request 101"), "{err}");
    assert!(!w.results[0].input_error, "a panic is a run failure, not bad input");
    assert!(w.results[1].error.is_none());
    assert_eq!(w.results[1].metrics.get("requests"), Some(1000.0));
}

#[test]
fn out_of_range_replica_is_an_error_naming_the_policy() {
    let lib = &plugins().faulty;
    let yaml = "dispatch: {servers: 4, utilisation: 0.5, requests: 1000}\n";
    let w = compare_text(yaml, "o.yaml", &[format!("{}:out_of_range", lib.display()), "random".into()]);
    let err = w.results[0].error.as_deref().unwrap();
    assert!(err.contains("out_of_range") && err.contains("returned replica 4") && err.contains("only 4"), "{err}");
    assert!(w.results[1].error.is_none());
}

/// A `usize` answer of 2^32 + 1 is refused as out of range; cast first, it would be replica 1.
#[test]
fn an_index_of_2_to_the_32_does_not_wrap_to_a_valid_replica() {
    let lib = &plugins().faulty;
    let yaml = "dispatch: {servers: 4, utilisation: 0.5, requests: 1000}\n";
    let w = compare_text(yaml, "h.yaml", &[format!("{}:huge_index", lib.display()), "random".into()]);
    let err = w.results[0].error.as_deref().expect("huge_index fails");
    assert!(err.contains("returned replica 4294967297"), "{err}");
    assert!(w.results[1].error.is_none());
}

/// A panic in a config's `Default` spoils only that entry's listing and its construction; the
/// library's other policies still list and load.
#[test]
fn panic_in_a_configs_default_is_an_error_for_that_policy_only() {
    let lib = &plugins().faulty;
    let listing = Loader::new().list(Some(lib)).unwrap();
    let bad = listing.iter().find(|l| l.name == "panics_in_default").unwrap();
    let e = bad.default_config.as_ref().unwrap_err();
    assert!(e.contains("panics_in_default") && e.contains("deliberate panic in Default"), "{e}");
    assert!(listing.iter().find(|l| l.name == "out_of_range").unwrap().default_config.is_ok());
    let e = Loader::new().router(&PolicySpec::parse(&format!("{}:panics_in_default", lib.display())).unwrap(), &ctx());
    let e = e.err().unwrap();
    assert_eq!(e.kind, LoadErrorKind::Panicked, "{e}");
    assert!(e.message.contains("deliberate panic in Default"), "{e}");
}

/// A policy whose destructor panics: the run reports, the host does not abort.
#[test]
fn panic_in_a_policys_drop_does_not_abort_the_host() {
    let lib = &plugins().faulty;
    let yaml = "dispatch: {servers: 4, utilisation: 0.5, requests: 1000}\n";
    let w = compare_text(yaml, "d.yaml", &[format!("{}:panics_in_drop", lib.display()), "round_robin".into()]);
    assert!(
        w.results.iter().all(|r| r.error.is_none()),
        "{:?}",
        w.results.iter().map(|r| &r.error).collect::<Vec<_>>()
    );
    assert_eq!(w.results[0].metrics.get("requests"), Some(1000.0));
}

/// What the docs promise of a panic in `Drop` (issue 26: they said exit 1, the binary exits 0):
/// the figures stand, the message is on stderr, exit 0.
#[test]
fn panic_in_a_policys_drop_exits_0_with_its_message_on_stderr() {
    let lib = &plugins().faulty;
    let f = fixture("loader", "drop.yaml");
    std::fs::write(&f, "dispatch: {servers: 4, utilisation: 0.5, requests: 1000}\n").unwrap();
    let policy = format!("{}:panics_in_drop", lib.display());
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_routelab"))
        .args(["compare", &f.to_string_lossy(), "--policies", &policy])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("deliberate panic in Drop"), "{err}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("panics_in_drop"));
}

/// A panic in `capabilities` is an error when the router is created, not a silent "no needs".
#[test]
fn panic_in_capabilities_is_an_error() {
    let lib = &plugins().faulty;
    let e =
        Loader::new().router(&PolicySpec::parse(&format!("{}:panics_in_capabilities", lib.display())).unwrap(), &ctx());
    let e = e.err().unwrap();
    assert_eq!(e.kind, LoadErrorKind::Panicked, "{e}");
    assert!(e.message.contains("panicked in capabilities"), "{e}");
}

/// Asking for an engine signal this host does not provide is bad input naming the signal.
#[test]
fn unknown_engine_signal_is_refused_at_creation() {
    let lib = &plugins().faulty;
    let e = Loader::new().router(&PolicySpec::parse(&format!("{}:unknown_signal", lib.display())).unwrap(), &ctx());
    let e = e.err().unwrap();
    assert_eq!(e.kind, LoadErrorKind::BadConfig, "{e}");
    assert!(e.message.contains("'prefill_tokens_per_s'") && e.message.contains("kv_utilisation"), "{e}");
}

/// A library whose registry function panics: a clear message, and the host carries on.
#[test]
fn panicking_registry_gives_a_clear_message() {
    let lib = &plugins().faulty_registry;
    let e = Loader::new().list(Some(lib)).err().unwrap();
    assert_eq!(e.kind, LoadErrorKind::Panicked, "{e}");
    assert!(e.message.contains("registry function panicked: deliberate panic in the registry"), "{e}");
    let yaml = "dispatch: {servers: 4, utilisation: 0.5, requests: 1000}\n";
    let w = compare_text(yaml, "r.yaml", &[format!("{}:x", lib.display()), "random".into()]);
    assert!(w.results[0].error.is_some() && w.results[1].error.is_none());
}

/// The first 100 KB of a real plugin (a library cargo is still writing) is refused before
/// dlopen, which would die with SIGBUS on it.
#[test]
fn truncated_library_is_refused_before_dlopen() {
    let whole = std::fs::read(&plugins().builtin).unwrap();
    assert!(whole.len() > 100_000);
    let dir = target_dir().join("test-fixtures");
    std::fs::create_dir_all(&dir).unwrap();
    let cut = dir.join(format!("{}truncated{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX));
    std::fs::write(&cut, &whole[..100_000]).unwrap();
    let e =
        Loader::new().router(&PolicySpec::parse(&format!("{}:random", cut.display())).unwrap(), &ctx()).err().unwrap();
    assert_eq!(e.kind, LoadErrorKind::NotAPlugin, "{e}");
    assert!(e.message.contains("not a complete shared library") && e.message.contains("past the end"), "{e}");
}

#[test]
fn panic_in_constructor_is_caught() {
    let lib = &plugins().faulty;
    let e = Loader::new().router(&PolicySpec::parse(&format!("{}:panics_in_new", lib.display())).unwrap(), &ctx());
    let e = e.err().unwrap();
    assert_eq!(e.kind, LoadErrorKind::Panicked, "{e}");
    assert!(e.message.contains("panics_in_new"), "{e}");
}

#[test]
fn missing_library_says_how_to_build_it() {
    let e = Loader::new().router(&PolicySpec::parse("./no/such/libx.so:x").unwrap(), &ctx()).err().unwrap();
    assert_eq!(e.kind, LoadErrorKind::MissingFile);
    assert!(e.message.contains("no/such/libx.so") && e.fix.contains("cargo build --release"), "{e}");
}

#[test]
fn unknown_policy_lists_the_alternatives() {
    let e = Loader::new().router(&PolicySpec::parse("least_request").unwrap(), &ctx()).err().unwrap();
    assert_eq!(e.kind, LoadErrorKind::UnknownPolicy);
    assert!(e.message.contains("least_request") && e.fix.contains("least_requests"), "{e}");
    let lib = &plugins().example;
    let e =
        Loader::new().router(&PolicySpec::parse(&format!("{}:nope", lib.display())).unwrap(), &ctx()).err().unwrap();
    assert!(e.message.contains("nope") && e.fix.contains("my_router"), "{e}");
}

/// Issue 32: a library with no policy of the kind asked for said "one of: " with an empty list;
/// it says what the library exports and which kind each place asks for.
#[test]
fn a_library_of_another_kind_says_what_it_exports_and_where_that_goes() {
    use routelab_policy_api::PolicyKind;
    let lib = plugins().example.display().to_string();
    for spec in [lib.clone(), format!("{lib}:my_router")] {
        let e = Loader::new().check(&PolicySpec::parse(&spec).unwrap(), PolicyKind::Scheduler).err().unwrap();
        assert_eq!(e.kind, LoadErrorKind::UnknownPolicy);
        assert!(e.message.contains("my_router (router)") || e.message.contains("is a router, not a scheduler"), "{e}");
        assert!(!e.fix.contains("one of: ") && e.fix.contains("`ROUTER@SCHEDULER`"), "{e}");
        assert!(e.fix.contains("a router is what dispatch and cluster workloads name"), "{e}");
    }
}

#[test]
fn bad_config_names_the_key() {
    let e = Loader::new().router(&PolicySpec::parse("power_of_two{dd: 3}").unwrap(), &ctx()).err().unwrap();
    assert_eq!(e.kind, LoadErrorKind::BadConfig);
    assert!(e.message.contains("unknown field `dd`"), "{e}");
    let e = Loader::new().router(&PolicySpec::parse("power_of_two{d: 0}").unwrap(), &ctx()).err().unwrap();
    assert!(e.message.contains("d must be at least 1"), "{e}");
}

/// Several libraries in one run, including a library's only router named by path alone.
#[test]
fn several_libraries_in_one_comparison() {
    let p = plugins();
    let yaml = "dispatch: {servers: 4, utilisation: 0.7, requests: 5000}\n";
    let w = compare_text(
        yaml,
        "m.yaml",
        &[
            p.example.display().to_string(),
            format!("{}:least_requests", p.builtin.display()),
            format!("{}{{work_weight: 1.0}}", p.example.display()),
        ],
    );
    for r in &w.results {
        assert!(r.error.is_none(), "{}: {:?}", r.policy, r.error);
    }
    // my_router with work_weight 0 is JSQ with uniformly random ties drawn from the seeded stream
    // exactly as least_requests draws them: the same decisions, so the same figures.
    assert_eq!(w.results[0].per_seed, w.results[1].per_seed);
    assert_ne!(w.results[2].per_seed, w.results[1].per_seed);
}

/// A shared library that is not a routelab plugin (built here with rustc: no abi_stable inside).
#[test]
fn non_plugin_library_is_refused_clearly() {
    let dir = target_dir().join("test-fixtures");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("not_a_plugin.rs");
    std::fs::write(&src, "#[unsafe(no_mangle)] pub extern \"C\" fn add(a: i32, b: i32) -> i32 { a + b }\n").unwrap();
    let lib = dir.join(format!("{}not_a_plugin{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX));
    let out = Command::new("rustc")
        .args(["--edition", "2024", "--crate-type", "cdylib", "-o"])
        .arg(&lib)
        .arg(&src)
        .output()
        .expect("rustc runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let e = Loader::new().router(&PolicySpec::parse(&lib.display().to_string()).unwrap(), &ctx()).err().unwrap();
    assert_eq!(e.kind, LoadErrorKind::NotAPlugin, "{e}");
    assert!(e.message.contains("not a routelab plugin") && e.fix.contains("export_policies!"), "{e}");
    // A file that is not a shared library at all.
    let e = Loader::new().router(&PolicySpec::parse(&src.display().to_string().replace(".rs", ".so")).unwrap(), &ctx());
    assert!(e.is_err());
}

/// A plugin built against another policy-api minor (a copy of policy-api relabelled as the next
/// minor and the example router built against it, in the shared target dir so dependencies are
/// reused).
fn old_api_plugin() -> &'static PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let (_, minor, _) = api_version();
        let root = target_dir().join("test-fixtures/other-minor");
        let _ = std::fs::remove_dir_all(&root);
        relabelled_api(&root.join("policy-api"), &format!("0.{}.0", minor + 1), None);
        let manifest = std::fs::read_to_string(workspace().join("policies/examples/my-router/Cargo.toml"))
            .unwrap()
            .replace("name = \"my-router\"", "name = \"other-minor-router\"")
            // The relabelled copy is another minor: depend on it by path alone.
            .replace(&format!("version = \"{}\", ", routelab_policy_api::API_VERSION), "");
        plugin_against(&workspace().join("policies/examples/my-router"), &root.join("other-minor-router"), &manifest);
        lib_path("other_minor_router")
    })
}

#[test]
fn plugin_built_against_another_minor_is_refused_with_a_short_message() {
    let lib = old_api_plugin();
    let e = Loader::new().router(&PolicySpec::parse(&lib.display().to_string()).unwrap(), &ctx()).err().unwrap();
    assert_eq!(e.kind, LoadErrorKind::VersionMismatch, "{e}");
    assert!(e.fix.contains(&format!("rebuild the plugin against routelab-policy-api 0.{}", api_version().1)), "{e}");
    let lines = e.to_string().lines().count();
    assert!(lines <= 12, "the message should be trimmed, got {lines} lines:\n{e}");
    // The rest of a comparison still runs.
    let yaml = "dispatch: {servers: 4, utilisation: 0.5, requests: 1000}\n";
    let w = compare_text(yaml, "v.yaml", &[lib.display().to_string(), "least_requests".into()]);
    assert!(w.results[0].error.is_some() && w.results[0].input_error);
    assert!(w.results[1].error.is_none());
}

/// The field's routers (Dynamo, llm-d, AIBrix, production-stack, CHWBL, Ray), loaded from the
/// built plugin library, give bit-identical cluster metrics to the linked-in ones on a small
/// tool-use run — their prefix-state variants included.
#[test]
fn field_routers_are_bit_identical_from_the_plugin_library() {
    let lib = &plugins().builtin;
    let yaml = std::fs::read_to_string(workspace().join("workloads/cluster/tool_use.yaml"))
        .unwrap()
        .replace("requests: 20000", "requests: 1500")
        .replace("seeds: 3", "seeds: 1");
    let names = [
        "dynamo_kv",
        "dynamo_kv{prefix_state: approximate, temperature: 0.5}",
        "llm_d",
        "llm_d{prefix_state: precise}",
        "llm_d{no_hit_lru_weight: 1, match_length_weight: 0.5}",
        "llm_d_sticky",
        "llm_d_sticky{prefix_state: precise, exploration_probability: 0.1}",
        "llm_d_predicted_latency",
        "aibrix_prefix_cache",
        "vllm_prefix_aware",
        "vllm_loadaware",
        "vllm_loadaware{beta: 0.25}",
        "vllm_dp_lb",
        "vllm_dp_lb{waiting_weight: 1}",
        "dynamo_kv{cost: lmetric}",
        "dynamo_kv{prefill_floor: false, overlap_score_credit: 2, decode_active_request_weight: 1}",
        "sglang_cache_aware{imbalanced: keep_affinity, balance_abs_threshold: 2}",
        "chwbl",
        "ray_prefix_aware",
    ];
    let linked: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    let loaded: Vec<String> = names.iter().map(|s| format!("{}:{s}", lib.display())).collect();
    let a = compare_text(&yaml, "tool_use.yaml", &linked);
    let b = compare_text(&yaml, "tool_use.yaml", &loaded);
    for (x, y) in a.results.iter().zip(&b.results) {
        assert!(x.error.is_none() && y.error.is_none(), "{:?} {:?}", x.error, y.error);
        assert_eq!(x.metrics.get("completed"), Some(1500.0), "{}", x.policy);
        assert_eq!(x.per_seed, y.per_seed, "{} differs when loaded", x.policy);
        assert_eq!(serde_json::to_string(&x.metrics).unwrap(), serde_json::to_string(&y.metrics).unwrap());
    }
}
