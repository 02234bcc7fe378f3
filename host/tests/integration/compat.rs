//! The ABI can grow: a plugin built against the pinned policy-api 0.2.0
//! (`testing/policy-api-pinned`, `testing/pinned-plugin`) keeps loading and working in the
//! current host after the compatible changes listed in `policy-api/CHANGELOG.md`.

use std::path::PathBuf;
use std::sync::OnceLock;

use abi_stable::std_types::{RNone, RSlice};
use routelab::plugin::{Loader, PolicySpec};
use routelab_policy_api::{ReplicaPair, ReplicaView, Replicas, Request, RouterContext, World, signals};

use crate::common::*;

/// Builds the pinned plugin (once per test process) in the shared target directory.
fn pinned_plugin() -> &'static PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let dir = workspace().join("testing/pinned-plugin");
        // The repository's lock file pins the same dependency versions (abi_stable, serde, ...).
        std::fs::copy(workspace().join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
        cargo_build(&dir, &[]);
        lib_path("pinned_plugin")
    })
}

#[test]
fn the_pinned_copy_is_an_older_patch_of_the_same_minor() {
    let manifest = std::fs::read_to_string(workspace().join("testing/policy-api-pinned/Cargo.toml")).unwrap();
    assert!(manifest.contains("version = \"0.2.0\""), "{manifest}");
    let current = routelab_policy_api::API_VERSION;
    assert!(current.starts_with("0.2.") && current != "0.2.0", "the current crate is a later 0.2 patch: {current}");
}

/// Loads, and routes bit for bit as the built-in it copies, through the negotiated signal table.
#[test]
fn plugin_built_against_0_2_0_loads_and_matches_the_builtin() {
    let lib = pinned_plugin();
    let yaml = "dispatch: {servers: 8, utilisation: 0.8, requests: 20000}\nseeds: 2\n";
    let w = compare_text(yaml, "pinned.yaml", &[lib.display().to_string(), "least_requests".into()]);
    for r in &w.results {
        assert!(r.error.is_none(), "{}: {:?}", r.policy, r.error);
    }
    assert_eq!(w.results[0].per_seed, w.results[1].per_seed);
}

/// `route_pair`, added in 0.2.1 after the vtable's prefix, is absent from the 0.2.0 plugin's
/// vtable: calling it runs the default, `route` over each candidate set.
#[test]
fn a_method_added_later_falls_back_to_its_default_on_an_old_plugin() {
    let lib = pinned_plugin();
    let ctx = RouterContext { world: World::Cluster, replicas: 3, seed: 1, kv_capacity_tokens: 0, cost: RNone };
    let mut router = Loader::new().router(&PolicySpec::parse(&lib.display().to_string()).unwrap(), &ctx).unwrap();
    let view = |n: u32| ReplicaView { outstanding_requests: n, ..Default::default() };
    let prefill = [view(3), view(1), view(2)];
    let decode = [view(0), view(5)];
    // The plugin reads the signal, so give it the table the host would (one column).
    let p_signals = [3.0, 1.0, 2.0];
    let d_signals = [0.0, 5.0];
    let req = Request { id: 0, arrived_at: 0.0, prompt_tokens: 0, size_hint: RNone, segments: RSlice::EMPTY };
    let pair = router
        .route_pair(
            &req,
            Replicas::with_signals(&prefill, &p_signals, 1),
            Replicas::with_signals(&decode, &d_signals, 1),
        )
        .into_result()
        .unwrap();
    assert_eq!(pair, ReplicaPair { prefill: 1, decode: 0 });
    assert_eq!(
        router.signals().into_result().unwrap().iter().map(|s| s.as_str()).collect::<Vec<_>>(),
        [signals::OUTSTANDING_REQUESTS]
    );
}
