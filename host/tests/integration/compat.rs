//! Versions across the ABI within one minor: a plugin built against an *earlier patch* of the
//! current policy-api minor keeps loading and behaving as before. The earlier patch is made, not
//! kept: a copy of policy-api relabelled as the minor's first patch, with the items later patches appended
//! (marked `// since 0.M.N {` … `// } since 0.M.N` in the source) cut out. `testing/compat-plugin`
//! is built against it; the host then loads it through the swapped-roles layout check
//! (`core/src/plugin.rs`, `init_checked`), which is the path these tests exercise.
//! Another minor is refused: `loader.rs`, `plugin_built_against_another_minor_is_refused_…`.

use std::path::PathBuf;
use std::sync::OnceLock;

use routelab_core::handle::RouterHandle;
use routelab_core::plugin::{ExtraKind, Loader, PolicySpec};
use routelab_policy_api::{Completion, ReplicaView, Request, RouterContext, World};

use crate::common::*;

/// The earlier patch: the minor's first, so every growth of the minor is exercised.
fn earlier() -> (String, u32) {
    let (major, minor, patch) = api_version();
    assert!(patch > 0, "the current policy-api is the first patch of its minor: nothing earlier to build against");
    (format!("{major}.{minor}.0"), 0)
}

/// `testing/compat-plugin` built against the earlier patch (once per test process).
fn compat_plugin() -> &'static PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let root = target_dir().join("test-fixtures/earlier-patch");
        let _ = std::fs::remove_dir_all(&root);
        let (version, patch) = earlier();
        relabelled_api(&root.join("policy-api"), &version, Some(patch));
        let dir = workspace().join("testing/compat-plugin");
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
        plugin_against(&dir, &root.join("compat-plugin"), &manifest);
        lib_path("compat_plugin")
    })
}

/// The earlier patch really is earlier: its version, and none of what later patches appended.
#[test]
fn the_earlier_patch_is_the_current_minor_without_what_later_patches_appended() {
    compat_plugin();
    let root = target_dir().join("test-fixtures/earlier-patch/policy-api");
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    assert!(manifest.contains(&format!("version = \"{}\"", earlier().0)), "{manifest}");
    let read = |dir: &std::path::Path, file: &str| std::fs::read_to_string(dir.join("src").join(file)).unwrap();
    let current = workspace().join("policy-api");
    // 0.5.1 appended `Router::on_abandon` after the vtable's prefix; 0.5.2 the admission kind to
    // the root module and request facts to the catalogue: the minor's first patch has none.
    let traits = read(&root, "traits.rs");
    assert!(read(&current, "traits.rs").contains("fn on_abandon") && !traits.contains("fn on_abandon"));
    assert!(read(&current, "root.rs").contains("new_admission") && !read(&root, "root.rs").contains("new_admission"));
    assert!(read(&current, "facts.rs").contains("\"tenant\"") && !read(&root, "facts.rs").contains("\"tenant\""));
    assert!(!read(&root, "lib.rs").contains("pub mod admission"), "the admission module was not cut");
    // 0.5.4: the scaler kind and `Router::on_replica_change`.
    assert!(read(&current, "root.rs").contains("new_scaler") && !read(&root, "root.rs").contains("new_scaler"));
    assert!(!read(&root, "lib.rs").contains("pub mod scaler"), "the scaler module was not cut");
    assert!(!traits.contains("fn on_replica_change"));
    assert!(traits.contains("#[sabi(last_prefix_field)]") && traits.contains("fn on_complete"));
    // 0.5.5: the request fact `adapter` and the `lora.*` engine signals.
    assert!(read(&current, "facts.rs").contains("\"adapter\"") && !read(&root, "facts.rs").contains("\"adapter\""));
    assert!(read(&current, "signals.rs").contains("\"lora.resident\"") && !read(&root, "signals.rs").contains("lora."));
    // 0.5.6: the `tier.*.matched_tokens` engine signals.
    assert!(
        read(&current, "signals.rs").contains("\"tier.cpu.matched_tokens\"")
            && !read(&root, "signals.rs").contains("tier.")
    );
    // 0.5.7: the request fact `model` and the context fact `models.count`.
    assert!(read(&current, "facts.rs").contains("\"model\"") && !read(&root, "facts.rs").contains("\"model\""));
    assert!(
        read(&current, "facts.rs").contains("\"models.count\"") && !read(&root, "facts.rs").contains("models.count")
    );
    // 0.5.8: `Router::on_pool_change` (P/D instances that crash and restart).
    assert!(read(&current, "traits.rs").contains("fn on_pool_change") && !traits.contains("fn on_pool_change"));
    // 0.5.9: the toolkit's `Carried` (a plain-Rust helper compiled into each plugin).
    let toolkit = |dir: &std::path::Path| read(dir, "toolkit/mod.rs");
    assert!(toolkit(&current).contains("pub use carry::") && !toolkit(&root).contains("mod carry"));
    // 0.5.10: `PdRouterPolicy::take_failure` (composites fail without a panic).
    assert!(
        read(&current, "policy.rs").contains("fn take_failure")
            && !read(&root, "policy.rs").contains("fn take_failure")
    );
    // 0.5.11: the toolkit's fair-ties helpers beside 0.5.0's `argmin_random_tie`.
    let ties = |dir: &std::path::Path| read(dir, "toolkit/ties.rs");
    assert!(ties(&current).contains("pub fn argmin_one_draw_by") && !ties(&root).contains("fn argmin_one_draw_by"));
    assert!(!ties(&root).contains("fn argmax_random_tie") && !ties(&root).contains("fn draw_tie"));
    assert!(ties(&root).contains("pub fn argmin_random_tie"), "0.5.0's helper was cut");
    assert!(!toolkit(&root).contains("pub use ties::{"), "the re-export was not cut");
    // 0.5.12: `PrefixTree::without_hash_index` and `node_count` beside 0.5.0's `new`.
    let tree = |dir: &std::path::Path| read(dir, "toolkit/prefix_tree.rs");
    assert!(tree(&current).contains("pub fn without_hash_index") && !tree(&root).contains("fn without_hash_index"));
    assert!(!tree(&root).contains("fn node_count") && tree(&root).contains("pub fn new(replicas: usize)"));
    // 0.5.13: `Router::on_mixed_change`, its plain-Rust twin, the flag and `PdContext`'s helpers.
    assert!(read(&current, "traits.rs").contains("fn on_mixed_change") && !traits.contains("fn on_mixed_change"));
    assert!(
        !read(&root, "policy.rs").contains("fn on_mixed_change")
            && !read(&root, "policy/guarded.rs").contains("fn on_mixed_change")
    );
    let caps = |dir: &std::path::Path| read(dir, "types/capabilities.rs");
    assert!(caps(&current).contains("HEARS_MIXED_CHANGES") && !caps(&root).contains("HEARS_MIXED_CHANGES"));
    assert!(caps(&root).contains("let bits = 0b1111;"), "0.5.0's flags were cut");
    assert!(
        read(&current, "policy.rs").contains("fn apply_mixed_change")
            && !read(&root, "policy.rs").contains("fn apply_mixed_change")
    );
    let (_, minor, _) = api_version();
    for file in [
        "lib.rs",
        "traits.rs",
        "types.rs",
        "types/capabilities.rs",
        "policy.rs",
        "policy/guarded.rs",
        "root.rs",
        "cost.rs",
        "facts.rs",
        "signals.rs",
        "toolkit/mod.rs",
        "toolkit/ties.rs",
        "toolkit/prefix_tree.rs",
    ] {
        assert!(
            !read(&root, file).contains(&format!("// since 0.{minor}.")),
            "{file}: a later patch's block was left in"
        );
    }
}

/// A library built before the admission kind (0.5.2) offers none: the root module's appended
/// fields read as missing, and asking it for one is a clear error, not a crash.
#[test]
fn an_earlier_patch_library_offers_no_admission_policy() {
    let lib = compat_plugin().clone();
    let mut loader = Loader::new();
    assert_eq!(loader.admission_list(Some(&lib)).unwrap(), Vec::new());
    let e = loader.admission_factory(&PolicySpec::parse(&format!("{}:mine", lib.display())).unwrap()).unwrap_err();
    assert!(e.message.contains("'mine'") && e.fix.contains("0.5.2"), "{e:?}");
}

/// Nor, built before the scaler kind (0.5.4), any scaler.
#[test]
fn an_earlier_patch_library_offers_no_scaler() {
    let lib = compat_plugin().clone();
    let mut loader = Loader::new();
    assert_eq!(loader.extra_list(ExtraKind::Scaler, Some(&lib)).unwrap(), Vec::new());
    let e = loader.scaler_factory(&PolicySpec::parse(&format!("{}:mine", lib.display())).unwrap()).unwrap_err();
    assert!(e.message.contains("'mine'") && e.message.contains("scaler") && e.fix.contains("0.5.4"), "{e:?}");
}

/// Loaded into the current host, the plugin gives the built-in `least_requests`'s figures bit for
/// bit, in the dispatch and the cluster world.
#[test]
fn plugin_built_against_an_earlier_patch_loads_and_matches() {
    let lib = compat_plugin().display().to_string();
    let dispatch = "dispatch: {servers: 8, utilisation: 0.85, requests: 20000}\nseeds: 2\n";
    let cluster = std::fs::read_to_string(workspace().join("workloads/cluster/tool_use.yaml")).unwrap();
    for (yaml, name) in [(dispatch.to_string(), "d.yaml"), (cluster, "tool_use.yaml")] {
        let w = compare_text(&yaml, name, &[lib.clone(), "least_requests".into()]);
        let (loaded, builtin) = (&w.results[0], &w.results[1]);
        assert!(loaded.error.is_none() && builtin.error.is_none(), "{:?} {:?}", loaded.error, builtin.error);
        assert_eq!(loaded.per_seed.len(), builtin.per_seed.len());
        for (a, b) in loaded.per_seed.iter().zip(&builtin.per_seed) {
            let host = |m: &routelab_core::metrics::Metrics| -> Vec<(String, u64)> {
                m.0.iter().filter(|(k, _)| !k.starts_with("router.")).map(|(k, v)| (k.clone(), v.to_bits())).collect()
            };
            assert_eq!(host(a), host(b), "{name}: the earlier-patch plugin decided differently");
            // Every request it placed came back.
            assert_eq!(a.get("router.in_flight"), Some(0.0), "{name}");
        }
    }
}

/// The host calls `on_abandon`, appended in the current patch, on the earlier-patch object: its
/// default body runs, which hears the abandonment as a completion (the count of requests in flight
/// drops), and the next decision sees that.
#[test]
fn an_appended_methods_default_runs_for_an_earlier_patch_plugin() {
    let lib = compat_plugin().display().to_string();
    let ctx = RouterContext::new(World::Cluster, 2, 1);
    let router = Loader::new().router(&PolicySpec::parse(&lib).unwrap(), &ctx).unwrap();
    let mut h = RouterHandle::new(router, 2, World::Cluster, "compat");
    let info = Default::default();
    let mut views = [ReplicaView::default(); 2];
    let placed: Vec<u32> = (0..3)
        .map(|id| {
            let r = h.dispatch(&Request::new(id, id as f64, 10), &info, &views).unwrap();
            views[r as usize].outstanding_requests += 1;
            r
        })
        .collect();
    let in_flight =
        |h: &RouterHandle| h.report().unwrap().into_iter().find(|(k, _)| k == "router.in_flight").unwrap().1;
    assert_eq!(in_flight(&h), 3.0);
    let c = |id: u64, replica: u32| Completion {
        request_id: id,
        replica,
        arrived_at: id as f64,
        completed_at: 10.0,
        ttft: 1.0,
        prompt_tokens: 10,
        cached_tokens: 0,
        output_tokens: 0,
    };
    h.abandon(&c(0, placed[0])).unwrap();
    assert_eq!(in_flight(&h), 2.0, "on_abandon's default did not run on_complete");
    h.complete(&c(1, placed[1])).unwrap();
    assert_eq!(in_flight(&h), 1.0);
}
