//! The field's routers: one hand-computed decision per router from its upstream rule (the
//! arithmetic is in the comments), and their config validation.

use abi_stable::std_types::RSlice;
use routelab_policies::{
    aibrix_prefix_cache::AibrixPrefixCache, chwbl::Chwbl, dynamo_kv, dynamo_kv::DynamoKv, llm_d, llm_d::LlmD,
    ray_prefix_aware::RayPrefixAware, sglang_cache_aware, sglang_cache_aware::SglangCacheAware, vllm_prefix_aware,
    vllm_prefix_aware::VllmPrefixAware,
};
use routelab_policy_api::*;

use crate::common::{ctx, done, make, req, seg};

fn ctx_seed(replicas: u32, seed: u64) -> RouterContext {
    RouterContext { seed, ..ctx(replicas) }
}

/// Routes `request` and dispatches it where the router said.
fn place<P: RouterPolicy>(p: &mut P, request: &Request<'_>, views: &[ReplicaView]) -> usize {
    let r = p.route(request, &Replicas::new(views));
    p.on_dispatch(request, r);
    r
}

#[test]
fn dynamo_cost_is_uncached_prefill_blocks_plus_decode_blocks() {
    let mut d = DynamoKv::new(Default::default(), &ctx(2)).unwrap();
    let views = [ReplicaView::default(); 2];
    let a = [seg(1, 64)];
    d.on_dispatch(&req(0, 0.0, &a), 0); // 4 blocks cached and active on replica 0
    let b = [seg(1, 64), seg(2, 32)]; // 96 tokens = 6 blocks, the first 4 shared with A
    // r0: prefill (0 + 96)/16 = 6, credit 1·4 → 2; decode 4 active + 6 − 4 shared = 6; cost 8.
    // r1: prefill 6 − 0 = 6; decode 0 + 6 = 6; cost 12.
    assert_eq!(d.costs(&req(1, 0.1, &b), &Replicas::new(&views)), &[8.0, 12.0]);
    assert_eq!(d.route(&req(1, 0.1, &b), &Replicas::new(&views)), 0);
    // A still waits on r0 (waiting = 1): its 64 uncached tokens join r0's prefill:
    // (64 + 96)/16 − 4 = 6, + 6 decode = 12 = r1's cost: a tie, broken at random.
    let busy = [ReplicaView { waiting: 1, ..Default::default() }, ReplicaView::default()];
    assert_eq!(d.costs(&req(1, 0.1, &b), &Replicas::new(&busy)), &[12.0, 12.0]);
    let picks: std::collections::BTreeSet<usize> = (0..40)
        .map(|s| {
            let mut d = DynamoKv::new(Default::default(), &ctx_seed(2, s)).unwrap();
            d.on_dispatch(&req(0, 0.0, &a), 0);
            d.route(&req(1, 0.1, &b), &Replicas::new(&busy))
        })
        .collect();
    assert_eq!(picks.len(), 2, "ties go either way");
    // A completes: its active blocks go, the cached ones stay (r0: 6 − 4 + 0 + 6 − 0 = 8).
    d.on_complete(&done(0, 0));
    assert_eq!(d.costs(&req(1, 0.1, &b), &Replicas::new(&views)), &[8.0, 12.0]);
}

#[test]
fn dynamo_counts_full_blocks_only_and_requests_still_prefilling() {
    // Upstream's decode load counts the prompt's block hashes: full blocks only. 100 tokens =
    // 6 full blocks (+ 4 tokens): prefill 100/16 = 6.25, decode 6 (not 7) → 12.25.
    let mut d = DynamoKv::new(Default::default(), &ctx(2)).unwrap();
    let views = [ReplicaView::default(); 2];
    let c = [seg(3, 100)];
    assert_eq!(d.costs(&req(0, 0.0, &c), &Replicas::new(&views)), &[12.25, 12.25]);
    // A admitted on r0 and still in (chunked) prefill: not waiting, but the `prefilling` signal
    // counts it, so its 64 uncached tokens stay in r0's prefill load, as upstream keeps them
    // until the first token: r0 (64 + 100)/16 = 10.25 + 4 active + 6 = 20.25.
    d.on_dispatch(&req(1, 0.0, &[seg(1, 64)]), 0);
    assert_eq!(d.signals()[0], signals::PREFILLING);
    let admitted = [ReplicaView { running: 1, ..Default::default() }, ReplicaView::default()];
    let prefilling = [1.0, 0.0];
    let r = Replicas::with_signals(&admitted, &prefilling, 1);
    assert_eq!(d.costs(&req(2, 0.1, &c), &r), &[20.25, 12.25]);
    // Its first token is out (prefilling 0): only its decode blocks remain: 6.25 + 4 + 6.
    let r = Replicas::with_signals(&admitted, &[0.0, 0.0], 1);
    assert_eq!(d.costs(&req(2, 0.1, &c), &r), &[16.25, 12.25]);
}

#[test]
fn dynamo_softmax_matches_upstreams_arithmetic_at_a_draw() {
    // Costs [8, 12] at temperature 1: p = [1, e^−1] / (1 + e^−1) = [0.7311, 0.2689].
    let mut scratch = Vec::new();
    let pick = |u, s: &mut Vec<f64>| dynamo_kv::softmax_sample_index(&[8.0, 12.0], 1.0, u, s);
    assert_eq!((pick(0.7310, &mut scratch), pick(0.7312, &mut scratch)), (0, 1));
    // Equal costs: uniform, the first row whose cumulative 1/n reaches the draw.
    let equal = [5.0; 4];
    let picks: Vec<usize> = [0.0, 0.25, 0.26, 0.99]
        .iter()
        .map(|&u| dynamo_kv::softmax_sample_index(&equal, 2.0, u, &mut scratch))
        .collect();
    assert_eq!(picks, [0, 0, 1, 3]);
}

#[test]
fn dynamo_softmax_samples_by_normalised_cost() {
    // Costs [8, 12] at temperature 1: p(r1) = e^(−(12−8)/((12−8)·1)) / (1 + e^−1) = 0.2689.
    let cfg = dynamo_kv::Config { temperature: 1.0, ..Default::default() };
    let mut d = DynamoKv::new(cfg, &ctx(2)).unwrap();
    let views = [ReplicaView::default(); 2];
    d.on_dispatch(&req(0, 0.0, &[seg(1, 64)]), 0);
    let b = [seg(1, 64), seg(2, 32)];
    let n = 20_000;
    let ones = (0..n).filter(|_| d.route(&req(1, 0.1, &b), &Replicas::new(&views)) == 1).count();
    let p = ones as f64 / n as f64;
    assert!((p - 0.2689).abs() < 0.015, "p(r1) = {p}");
}

#[test]
fn dynamo_forgets_blocks_on_eviction_or_after_the_ttl() {
    let views = [ReplicaView::default(); 2];
    let a = [seg(1, 64)];
    let b = [seg(1, 64), seg(2, 32)];
    // Events: replica 0 cut the segment to 20 tokens: block 0 (tokens 0..16) survives, 1..3 go.
    // r0: prefill 6 − 1 = 5, decode 4 + 6 − 4 = 6 → 11.
    let mut d = DynamoKv::new(Default::default(), &ctx(2)).unwrap();
    d.on_dispatch(&req(0, 0.0, &a), 0);
    d.on_evict(&Eviction { replica: 0, evicted_at: 1.0, path: RSlice::from_slice(&a), remaining_tokens: 20 });
    assert_eq!(d.costs(&req(1, 2.0, &b), &Replicas::new(&views)), &[11.0, 12.0]);
    // Approximate: the blocks expire 120 s after they were routed (the eviction is ignored).
    let cfg = dynamo_kv::Config { prefix_state: dynamo_kv::PrefixState::Approximate, ..Default::default() };
    let mut d = DynamoKv::new(cfg, &ctx(2)).unwrap();
    d.on_dispatch(&req(0, 0.0, &a), 0);
    d.on_complete(&done(0, 0));
    assert_eq!(d.costs(&req(1, 119.0, &b), &Replicas::new(&views)), &[8.0, 12.0]);
    // At 120.1 s: r0 prefill 6, decode 0 + 6 → 12.
    assert_eq!(d.costs(&req(2, 120.1, &b), &Replicas::new(&views)), &[12.0, 12.0]);
}

#[test]
fn llm_d_weighs_queue_kv_and_prefix_scores() {
    let views = [
        ReplicaView { waiting: 4, kv_used_tokens: 50, kv_capacity_tokens: 100, ..Default::default() },
        ReplicaView { waiting: 0, kv_used_tokens: 20, kv_capacity_tokens: 100, ..Default::default() },
    ];
    let a = [seg(1, 64)]; // 4 blocks, no tail
    let b = [seg(1, 64), seg(2, 40)]; // 6 full blocks + an 8-token tail = 7 hashed blocks
    let mut l = LlmD::new(Default::default(), &ctx(2)).unwrap();
    l.on_dispatch(&req(0, 0.0, &a), 0);
    // r0: queue 2·(4−4)/4 = 0, kv 2·(1−0.5) = 1, prefix 3·4/7 = 1.714 → 2.714.
    // r1: queue 2·(4−0)/4 = 2, kv 2·(1−0.2) = 1.6, prefix 0 → 3.6.
    let s = l.scores(&req(1, 0.1, &b), &views).to_vec();
    assert!((s[0] - (1.0 + 12.0 / 7.0)).abs() < 1e-12 && (s[1] - 3.6).abs() < 1e-12, "{s:?}");
    assert_eq!(l.route(&req(1, 0.1, &b), &Replicas::new(&views)), 1);
    // Prefix weight 6: r0 = 0 + 1 + 6·4/7 = 4.43 > 3.6.
    let mut l = LlmD::new(llm_d::Config { prefix_weight: 6.0, ..Default::default() }, &ctx(2)).unwrap();
    l.on_dispatch(&req(0, 0.0, &a), 0);
    assert_eq!(l.route(&req(1, 0.1, &b), &Replicas::new(&views)), 0);
    // Weight 0 switches a scorer off: without the queue scorer r0 = 1 + 1.714 = 2.714 beats
    // r1 = 1.6.
    let mut l = LlmD::new(llm_d::Config { queue_weight: 0.0, ..Default::default() }, &ctx(2)).unwrap();
    l.on_dispatch(&req(0, 0.0, &a), 0);
    assert_eq!(l.route(&req(1, 0.1, &b), &Replicas::new(&views)), 0);
}

#[test]
fn llm_d_approximate_lru_drops_the_oldest_block_and_the_walk_stops_there() {
    // Capacity 3 blocks: dispatching A's 4 blocks evicts block 0 (added first), so B's walk finds
    // nobody holding block 0 and stops at once (upstream's `matchLongestPrefix`): no prefix score.
    let cfg = llm_d::Config {
        lru_capacity: llm_d::LruCapacity::Blocks(3),
        queue_weight: 0.0,
        kv_cache_weight: 0.0,
        ..Default::default()
    };
    let mut l = LlmD::new(cfg.clone(), &ctx(2)).unwrap();
    l.on_dispatch(&req(0, 0.0, &[seg(1, 64)]), 0);
    assert_eq!(l.scores(&req(1, 0.1, &[seg(1, 64), seg(2, 40)]), &[ReplicaView::default(); 2]), &[0.0, 0.0]);
    // Precise mode: full blocks, removed when the replica reports the eviction.
    let cfg = llm_d::Config { prefix_state: llm_d::PrefixState::Precise, ..cfg };
    let mut l = LlmD::new(cfg, &ctx(2)).unwrap();
    let a = [seg(1, 64)];
    l.on_dispatch(&req(0, 0.0, &a), 0);
    let b = [seg(1, 64), seg(2, 40)]; // 6 full blocks, 4 held: 3·4/6 = 2
    assert_eq!(l.scores(&req(1, 0.1, &b), &[ReplicaView::default(); 2]), &[2.0, 0.0]);
    l.on_evict(&Eviction { replica: 0, evicted_at: 0.2, path: RSlice::from_slice(&a), remaining_tokens: 32 });
    assert_eq!(l.scores(&req(2, 0.3, &b), &[ReplicaView::default(); 2]), &[1.0, 0.0]); // 3·2/6
}

#[test]
fn chwbl_walks_past_a_replica_over_the_bound() {
    let views = [ReplicaView::default(); 2];
    let p = [seg(1, 300), seg(2, 50)];
    let mut c = Chwbl::new(Default::default(), &ctx(2)).unwrap();
    let first = place(&mut c, &req(0, 0.0, &p), &views);
    // One in flight on `first`: avg (1 + 1)/2 = 1, bound 1.25, 1 ≤ 1.25 → stays.
    assert_eq!(place(&mut c, &req(1, 0.0, &p), &views), first);
    // Two in flight: avg (2 + 1)/2 = 1.5, bound 1.875, 2 > 1.875 → the next replica clockwise.
    assert_eq!(c.route(&req(2, 0.0, &p), &Replicas::new(&views)), 1 - first);
    // The same head, another tail: the same ring point (the key is the first 256 tokens).
    c.on_complete(&done(0, first as u32));
    assert_eq!(c.route(&req(3, 0.0, &[seg(1, 300), seg(9, 7)]), &Replicas::new(&views)), first);
}

#[test]
fn vllm_prefix_aware_narrows_to_the_longest_matching_replicas() {
    let views = [ReplicaView::default(); 3];
    let mut v = VllmPrefixAware::new(Default::default(), &ctx(3)).unwrap();
    v.on_dispatch(&req(0, 0.0, &[seg(1, 64), seg(2, 64)]), 1);
    v.on_dispatch(&req(1, 0.0, &[seg(1, 64), seg(3, 64)]), 2);
    // Chunks of 32: S's two chunks are held by {1, 2}, X's two by {1}, the 10-token tail by
    // nobody: 4 chunks = 128 tokens matched, only replica 1 in play.
    assert_eq!(v.route(&req(2, 1.0, &[seg(1, 64), seg(2, 64), seg(4, 10)]), &Replicas::new(&views)), 1);
    // Only S matches: {1, 2} in play, picked at random, never 0.
    let picks: std::collections::BTreeSet<usize> =
        (0..40).map(|i| v.route(&req(3 + i, 1.0, &[seg(1, 64), seg(5, 64)]), &Replicas::new(&views))).collect();
    assert_eq!(picks, [1, 2].into());
    // min_match_tokens 100 > 64 matched: the lowest-QPS replica, and 0 was never routed to.
    let mut v =
        VllmPrefixAware::new(vllm_prefix_aware::Config { min_match_tokens: 100, ..Default::default() }, &ctx(3))
            .unwrap();
    v.on_dispatch(&req(0, 0.0, &[seg(1, 64), seg(2, 64)]), 1);
    v.on_dispatch(&req(1, 0.0, &[seg(1, 64), seg(3, 64)]), 2);
    assert_eq!(v.route(&req(2, 1.0, &[seg(1, 64), seg(5, 64)]), &Replicas::new(&views)), 0);
}

#[test]
fn aibrix_takes_the_best_match_only_under_mean_plus_one_sigma() {
    let views = [ReplicaView::default(); 3];
    let a = [seg(1, 160)]; // 10 blocks
    let b = [seg(1, 160), seg(2, 160)]; // 20 blocks; r0 matches 10 → 10·100/20 = 50 %
    let mut x = AibrixPrefixCache::new(Default::default(), &ctx(3)).unwrap();
    x.on_dispatch(&req(0, 0.0, &a), 0);
    // Running [1, 0, 0]: mean 1/3, σ = √((4/9 + 1/9 + 1/9)/2) = 0.577; 1 > 0.911 → least request.
    let r = x.route(&req(1, 0.1, &b), &Replicas::new(&views));
    assert!(r == 1 || r == 2, "{r}");
    x.on_dispatch(&req(2, 0.1, &[seg(7, 16)]), 1);
    x.on_dispatch(&req(3, 0.1, &[seg(8, 16)]), 2);
    // Running [1, 1, 1]: mean 1, σ 0; 1 ≤ 1 → the 50 % match on r0.
    assert_eq!(x.route(&req(4, 0.2, &b), &Replicas::new(&views)), 0);
    // Imbalance: r0 at 10, r1 and r2 at 1: 10 − 1 > 8 → only the least-loaded stay candidates,
    // neither matches → least request among all: r1 or r2.
    for i in 0..9 {
        x.on_dispatch(&req(10 + i, 0.3, &[seg(100 + i, 16)]), 0);
    }
    let r = x.route(&req(30, 0.4, &b), &Replicas::new(&views));
    assert!(r == 1 || r == 2, "{r}");
}

#[test]
fn ray_prefers_best_matches_then_smallest_trees_then_power_of_two() {
    let views = [ReplicaView::default(); 3];
    let mut y = RayPrefixAware::new(Default::default(), &ctx(3)).unwrap();
    y.on_dispatch(&req(0, 0.0, &[seg(1, 100), seg(2, 900)]), 2);
    // 1000 of 1100 tokens match on r2: 0.91 ≥ 0.1 → candidates {r2}.
    assert_eq!(y.route(&req(1, 0.1, &[seg(1, 100), seg(2, 900), seg(3, 100)]), &Replicas::new(&views)), 2);
    // 100 of 2000 match: 0.05 < 0.1 → the smallest trees, r0 and r1 (0 tokens each).
    let r = y.route(&req(2, 0.1, &[seg(1, 100), seg(4, 1900)]), &Replicas::new(&views));
    assert!(r < 2, "{r}");
    // Queue spread 11 > 10: power of two, which can pick any replica — including r2.
    for i in 0..10 {
        y.on_dispatch(&req(10 + i, 0.2, &[seg(1, 100), seg(2, 900)]), 2);
    }
    let picks: std::collections::BTreeSet<usize> =
        (0..60).map(|i| y.route(&req(30 + i, 0.3, &[seg(1, 100), seg(2, 900)]), &Replicas::new(&views))).collect();
    assert_eq!(picks, [0, 1].into(), "two distinct draws: r2 (11 queued) loses to whichever other is drawn");
}

#[test]
fn sglang_below_threshold_smallest_tree_differs_from_least_load() {
    // Trees: r0 1000 tokens, r1 10, r2 5000; in flight: r0 1, r1 1, r2 0 (its request finished).
    let setup = |below| {
        let cfg = sglang_cache_aware::Config { below_threshold: below, ..Default::default() };
        let mut s = SglangCacheAware::new(cfg, &ctx(3)).unwrap();
        s.on_dispatch(&req(0, 0.0, &[seg(1, 1000)]), 0);
        s.on_dispatch(&req(1, 0.0, &[seg(2, 10)]), 1);
        s.on_dispatch(&req(2, 0.0, &[seg(3, 5000)]), 2);
        s.on_complete(&done(2, 2));
        s
    };
    let views = [ReplicaView::default(); 3];
    let fresh = [seg(9, 500)]; // matches nothing: below the threshold
    assert_eq!(
        setup(sglang_cache_aware::BelowThreshold::LeastLoad).route(&req(3, 1.0, &fresh), &Replicas::new(&views)),
        2
    );
    assert_eq!(
        setup(sglang_cache_aware::BelowThreshold::SmallestTree).route(&req(3, 1.0, &fresh), &Replicas::new(&views)),
        1
    );
}

#[test]
fn field_router_configs_are_validated_with_clear_errors() {
    let names = ["dynamo_kv", "llm_d", "aibrix_prefix_cache", "vllm_prefix_aware", "chwbl", "ray_prefix_aware"];
    for name in names {
        make(name, "").unwrap_or_else(|e| panic!("{name} defaults: {e}"));
        let e = make(name, "{no_such_field: 1}").unwrap_err();
        assert!(e.contains(name) && e.contains("unknown field `no_such_field`"), "{e}");
    }
    let cases = [
        ("dynamo_kv", "{temperature: -0.5}", "temperature must be ≥ 0"),
        ("dynamo_kv", "{block_tokens: 0}", "block_tokens must be at least 1"),
        ("dynamo_kv", "{overlap_score_credit: -1}", "overlap_score_credit must be"),
        ("llm_d", "{prefix_weight: -3}", "prefix_weight must be"),
        ("llm_d", "{block_tokens: 0}", "block_tokens must be at least 1"),
        ("llm_d", "{lru_capacity: 0}", "lru_capacity must be at least 1"),
        ("aibrix_prefix_cache", "{block_tokens: 0}", "block_tokens must be at least 1"),
        ("vllm_prefix_aware", "{chunk_tokens: 0}", "chunk_tokens must be at least 1"),
        ("chwbl", "{load_factor: 0.9}", "load_factor must be ≥ 1"),
        ("ray_prefix_aware", "{match_rate_threshold: 1.5}", "match_rate_threshold must be in [0, 1]"),
    ];
    for (name, yaml, want) in cases {
        let e = make(name, yaml).unwrap_err();
        assert!(e.contains(name) && e.contains(want), "{name}{yaml}: {e}");
    }
    // Every knob named in a doc block parses.
    make("llm_d", "{lru_capacity: 5000, prefix_state: precise}").unwrap();
    make("dynamo_kv", "{prefix_state: approximate, ttl_s: 30}").unwrap();
    make("chwbl", "{overflow: least_load, balance_abs_threshold: 10, prefix_tokens: 25}").unwrap();
}
