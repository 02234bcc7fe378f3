//! The estimate's count of a router's own state: bytes a prompt times the prompts, up to the
//! router's bound, the largest of the listed policies.

use super::*;

/// Prompts each test's run holds.
const N: f64 = 100_000.0;

/// A tool_use-shaped cluster of 8 replicas with `policies` (a YAML flow list).
fn cluster(policies: &str) -> Workload {
    let yaml = format!(
        "name: t\nseeds: 1\npolicies: {policies}\ncluster:\n  replicas: 8\n  gpu: a6000\n  model: mistral-7b\n  \
         generator:\n    system_prompt_tokens: 300\n    suffix_tokens: {{uniform: {{min: 100, max: 300}}}}\n    \
         output_tokens: {{uniform: {{min: 10, max: 76}}}}\n  arrivals: {{poisson: {{rate: 80.0}}}}\n  requests: 100000\n"
    );
    serde_norway::from_str(&yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"))
}

fn est(policies: &str, prompts: f64) -> Estimate {
    estimate_with(&cluster(policies), Some(prompts as usize))
}

fn close(got: f64, want: f64) {
    assert!((got - want).abs() <= 1e-9 * want.abs().max(1.0), "got {got}, want {want}");
}

#[test]
fn a_prefix_tree_router_adds_its_bytes_a_prompt_over_a_load_router() {
    let base = est("[least_work_left]", N);
    let tree = est("[sglang_cache_aware]", N);
    assert_eq!(base.router_state, None, "least_work_left keeps nothing per prompt");
    // 172 B × 100,000 prompts = 17.2 MB; the default bound (2^26 tokens × 8 replicas) is far off.
    close(tree.bytes - base.bytes, SGLANG_CACHE_AWARE * N);
    assert!(tree.bytes - base.bytes > 10e6, "{tree:?} {base:?}");
    assert_eq!(tree.router_state.as_ref().map(|r| r.0.as_str()), Some("sglang_cache_aware"));
    // The same time and runs: only memory moves.
    assert_eq!((tree.seconds, tree.runs), (base.seconds, base.runs));
}

#[test]
fn a_routers_bound_caps_its_state() {
    let base = est("[least_work_left]", N);
    // 1,000 tokens a replica × 8 replicas = 8,000 tokens = 40 of the bench's 200-token prompts.
    let capped = est("[\"sglang_cache_aware{max_tree_tokens: 1000}\"]", N);
    close(capped.bytes - base.bytes, SGLANG_CACHE_AWARE * 1000.0 * 8.0 / BENCH_OWN_TOKENS);
    // Below the bound the prompts count: 10 prompts < 40.
    let few = est("[\"sglang_cache_aware{max_tree_tokens: 1000}\"]", 10.0);
    close(few.bytes - est("[least_work_left]", 10.0).bytes, SGLANG_CACHE_AWARE * 10.0);
    // llm-d's LRU of 100 blocks of 16 tokens a replica.
    let lru = est("[\"llm_d{lru_capacity: 100}\"]", N);
    close(lru.bytes - base.bytes, LLM_D * 100.0 * 16.0 * 8.0 / BENCH_OWN_TOKENS);
    // vllm_prefix_aware's node cap, in bytes a node.
    let trie = est("[\"vllm_prefix_aware{max_chunks: 1000}\"]", N);
    close(trie.bytes - base.bytes, 1000.0 * VLLM_PREFIX_AWARE_NODE);
    // Ray's bound only while its eviction is on.
    let ray = est("[\"ray_prefix_aware{do_eviction: false, eviction_threshold_tokens: 1000}\"]", N);
    close(ray.bytes - base.bytes, RAY_PREFIX_AWARE * N);
}

#[test]
fn a_router_that_hears_evictions_is_bounded_by_the_replicas_caches() {
    let w = cluster("[preble]");
    let kv = w.cluster.as_ref().unwrap().step_model().unwrap().kv_capacity_tokens as f64;
    let base = est("[least_work_left]", N);
    let preble = est("[preble]", N);
    // 8 caches of ≈ 219k tokens hold ≈ 8,800 of the bench's prompts, fewer than 100,000.
    let cap = PREBLE * kv * 8.0 / BENCH_OWN_TOKENS;
    assert!(cap < PREBLE * N, "the test needs the bound to bind: {cap}");
    close(preble.bytes - base.bytes, cap);
}

#[test]
fn the_largest_listed_router_counts_and_plugins_and_pd_routers_are_read() {
    let base = est("[least_work_left]", N);
    let all = est("[least_work_left, sglang_cache_aware, vllm_prefix_aware]", N);
    const { assert!(VLLM_PREFIX_AWARE > SGLANG_CACHE_AWARE) };
    close(all.bytes - base.bytes, VLLM_PREFIX_AWARE * N);
    assert_eq!(all.router_state.as_ref().map(|r| r.0.as_str()), Some("vllm_prefix_aware"));
    assert_eq!(all.runs, 3);
    // A plugin's state is unknown to the host: not counted.
    assert_eq!(est("[\"./libmine.so:mine\"]", N).router_state, None);
    // A P/D router counts the two routers it composes.
    let pd = est("[\"pd_sglang{prefill: sglang_cache_aware, decode: ray_prefix_aware}\"]", N);
    close(pd.bytes - base.bytes, (SGLANG_CACHE_AWARE + RAY_PREFIX_AWARE) * N);
}

#[test]
fn the_line_says_what_router_state_it_counts() {
    let tree = est("[least_work_left, sglang_cache_aware]", N).to_string();
    assert!(tree.contains("includes sglang_cache_aware's own state, 17 MB"), "{tree}");
    assert!(!tree.contains("not counted"), "{tree}");
    let base = est("[least_work_left]", N).to_string();
    assert!(base.contains("none of the listed built-ins keeps any per prompt"), "{base}");
    let unlisted = est("[]", N).to_string();
    assert!(unlisted.contains("no policies listed"), "{unlisted}");
}

#[test]
fn a_router_state_over_the_budget_is_refused_on_its_policy_with_its_bound_as_the_fix() {
    // vllm_prefix_aware unbounded: 870 B × 10^5 prompts = 87 MB, over 80% of a 50 MB machine
    // while the rest of the run (≈ 4 MB + 8 × 40 KB + the stream) fits.
    let w = cluster("[least_work_left, \"vllm_prefix_aware{max_chunks: 1000000000}\"]");
    let e = check_memory_within(&w, 50e6).unwrap_err();
    assert_eq!(e.path, "policies", "{e:?}");
    assert!(e.message.contains("vllm_prefix_aware{max_chunks: 1000000000}'s own state"), "{e:?}");
    // Loading counts no router's state: `--policies least_work_left` may run the same file.
    assert!(check_base_memory_within(&w, 50e6).is_ok());
    assert!(e.fix.contains("max_chunks") && !e.fix.contains("-j 1"), "{e:?}");
    // Two runs at once (-j 2) of a router that fits alone (≈ 33 MB of run and 17.2 MB of tree
    // under 80 MB): its state twice breaks the budget, the rest twice does not.
    let w = cluster("[least_work_left, \"sglang_cache_aware\"]");
    assert!(check_memory_scaled(&w, 100e6, 1).is_ok());
    let e = check_memory_scaled(&w, 100e6, 2).unwrap_err();
    assert_eq!(e.path, "policies", "{e:?}");
    assert!(e.fix.contains("-j 1"), "{e:?}");
    // Bounded to 1,000 nodes (124 KB), the same workload fits.
    assert!(check_memory_within(&cluster("[least_work_left, \"vllm_prefix_aware{max_chunks: 1000}\"]"), 50e6).is_ok());
    // Without the router the requests are the fix, as before.
    let e = check_memory_within(&cluster("[least_work_left]"), 1e6).unwrap_err();
    assert_eq!(e.path, "cluster.requests", "{e:?}");
}
