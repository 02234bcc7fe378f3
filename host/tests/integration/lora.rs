//! LoRA adapters (`cluster.lora`, policy-api 0.5.5's `adapter` fact and `lora.*` signals, issue
//! 29) through the runner and the plugin library.

use crate::common::*;

/// llm_d with its LoRA affinity scorer reads the `lora.*` signals across the ABI: loaded from
/// the plugin library it decides exactly as linked in, on the hot-adapter preset.
#[test]
fn lora_routers_are_bit_identical_from_the_plugin_library() {
    let lib = &plugins().builtin;
    let yaml = std::fs::read_to_string(workspace().join("workloads/cluster/lora/hot_adapter.yaml"))
        .unwrap()
        .replace("requests: 12000", "requests: 1500")
        .replace("seeds: 3", "seeds: 2");
    let names = ["round_robin", "llm_d{lora_weight: 2}", "llm_d{lora_state_weight: 2}", "aibrix_lora"];
    let linked: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    let loaded: Vec<String> = names.iter().map(|s| format!("{}:{s}", lib.display())).collect();
    let a = compare_text(&yaml, "hot.yaml", &linked);
    let b = compare_text(&yaml, "hot.yaml", &loaded);
    for (x, y) in a.results.iter().zip(&b.results) {
        assert!(x.error.is_none() && y.error.is_none(), "{:?} {:?}", x.error, y.error);
        assert_eq!(x.per_seed, y.per_seed, "{} differs when loaded", x.policy);
        for k in routelab_core::metrics::LORA_KEYS {
            assert!(x.metrics.get(k).is_some_and(|v| v.is_finite()), "{} lacks {k}", x.policy);
        }
    }
    // The scorer is what moves the loads: the same router without it loads more.
    let loads = |r: &routelab_core::runner::PolicyResult| r.metrics.get("lora_loads").unwrap();
    // And so do the load-state scorer (the adapter fact and `lora.resident` across the ABI) and
    // AIBrix's placement (each adapter on one replica: only the cache's churn there reloads it).
    for (name, r) in names.iter().zip(&a.results).skip(1) {
        assert!(loads(r) < loads(&a.results[0]), "{name}: {} vs {}", loads(r), loads(&a.results[0]));
    }
}
