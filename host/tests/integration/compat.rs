//! Versions across the ABI: a plugin built against the pinned policy-api 0.2.0
//! (`testing/policy-api-pinned`, `testing/pinned-plugin`) kept loading through the compatible
//! 0.2.x patches; 0.3.0 (prefill/decode disaggregation: `PdDecision`, `PdContext`) and 0.4.0
//! (mixed instances, layer-wise links and the shared KV tier in `PdContext`) are new minors, so
//! the host refuses it with the rebuild message instead of misreading its layout.

use std::path::PathBuf;
use std::sync::OnceLock;

use routelab_core::plugin::{LoadErrorKind, Loader, PolicySpec};
use routelab_policy_api::{RouterContext, World};

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
fn the_pinned_copy_is_an_earlier_minor() {
    let manifest = std::fs::read_to_string(workspace().join("testing/policy-api-pinned/Cargo.toml")).unwrap();
    assert!(manifest.contains("version = \"0.2.0\""), "{manifest}");
    let current = routelab_policy_api::API_VERSION;
    assert!(current.starts_with("0.4."), "the current crate is a 0.4 release: {current}");
}

/// Built against 0.2.0, before `route_pair` returned a `PdDecision` and `RouterContext` carried
/// `disaggregation`: refused at load with the rebuild message, and the rest of a comparison runs.
#[test]
fn plugin_built_against_0_2_0_is_refused_with_the_rebuild_message() {
    let lib = pinned_plugin();
    let ctx = RouterContext {
        world: World::Dispatch,
        replicas: 3,
        seed: 1,
        kv_capacity_tokens: 0,
        cost: abi_stable::std_types::RNone,
        disaggregation: abi_stable::std_types::RNone,
    };
    let e = Loader::new().router(&PolicySpec::parse(&lib.display().to_string()).unwrap(), &ctx).err().unwrap();
    assert_eq!(e.kind, LoadErrorKind::VersionMismatch, "{e}");
    assert!(e.fix.contains("rebuild the plugin against routelab-policy-api 0.4"), "{e}");
    let yaml = "dispatch: {servers: 8, utilisation: 0.8, requests: 2000}\nseeds: 1\n";
    let w = compare_text(yaml, "pinned.yaml", &[lib.display().to_string(), "least_requests".into()]);
    assert!(w.results[0].error.is_some() && w.results[0].input_error);
    assert!(w.results[1].error.is_none());
}
