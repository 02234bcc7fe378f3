//! The prefix routers' bounds (issue 30): what each forgets once over its limit, and that below
//! it the decisions are those of the unbounded structure.

use routelab_policies::{ray_prefix_aware, ray_prefix_aware::RayPrefixAware, vllm_prefix_aware::VllmPrefixAware};
use routelab_policy_api::*;

use crate::common::{ctx, req, seg};

fn stat<P: RouterPolicy>(p: &P, name: &str) -> f64 {
    p.report().into_iter().find(|(k, _)| k == name).unwrap_or_else(|| panic!("no {name}")).1
}

fn vllm(max_chunks: u64) -> VllmPrefixAware {
    VllmPrefixAware::new(vllm_prefix_aware_config(max_chunks), &ctx(3)).unwrap()
}

fn vllm_prefix_aware_config(max_chunks: u64) -> routelab_policies::vllm_prefix_aware::Config {
    routelab_policies::vllm_prefix_aware::Config { max_chunks, ..Default::default() }
}

#[test]
fn vllm_prefix_aware_forgets_the_least_recently_used_chunks_deepest_first() {
    let views = [ReplicaView::default(); 3];
    let (s, a, b, c) = (seg(1, 64), seg(2, 64), seg(3, 64), seg(4, 64));
    // 32-token chunks: S is 2 nodes every prompt shares; A, B and C 2 nodes each.
    let mut v = vllm(7);
    v.on_dispatch(&req(0, 0.0, &[s, a]), 1);
    v.on_dispatch(&req(1, 0.1, &[s, b]), 2);
    assert_eq!((stat(&v, "router_trie_nodes"), stat(&v, "router_evicted_chunks")), (6.0, 0.0));
    // C makes 8 nodes: the least recently used is A's second chunk (S was used since, by B),
    // a leaf: A's first chunk stays, still on replica 1 alone.
    v.on_dispatch(&req(2, 0.2, &[s, c]), 0);
    assert_eq!((stat(&v, "router_trie_nodes"), stat(&v, "router_evicted_chunks")), (7.0, 1.0));
    let tail = seg(9, 10);
    assert_eq!(v.route(&req(3, 1.0, &[s, seg(2, 32), tail]), &Replicas::new(&views)), 1);
    // B is whole on replica 2.
    assert_eq!(v.route(&req(4, 1.0, &[s, b, tail]), &Replicas::new(&views)), 2);
    // Unbounded, A's whole prompt matches on replica 1 (its 4 chunks); bounded, only 3 of them:
    // a prompt of S, A and a tail still goes to 1 either way, but a limit of 6 drops A's first
    // chunk too (A's two chunks go before S, which C used last), and then S alone matches, on
    // every replica.
    let mut v = vllm(6);
    v.on_dispatch(&req(0, 0.0, &[s, a]), 1);
    v.on_dispatch(&req(1, 0.1, &[s, b]), 2);
    v.on_dispatch(&req(2, 0.2, &[s, c]), 0);
    assert_eq!(stat(&v, "router_evicted_chunks"), 2.0);
    let picks: std::collections::BTreeSet<usize> =
        (0..60).map(|i| v.route(&req(10 + i, 1.0, &[s, a, tail]), &Replicas::new(&views))).collect();
    assert_eq!(picks, [0, 1, 2].into(), "S alone matches: every replica in play");
}

/// A stream of prompts drawn from a few shared heads and many tails, each routed and dispatched;
/// the trie's node count after each dispatch.
fn replay(v: &mut VllmPrefixAware, requests: u64) -> (Vec<usize>, Vec<u64>) {
    let views = [ReplicaView::default(); 3];
    (0..requests)
        .map(|i| {
            let prompt = [seg(1 + i % 5, 40 + 8 * (i % 5) as u32), seg(100 + (i * 7919) % 97, 50), seg(1000 + i, 30)];
            let r = v.route(&req(i, i as f64 * 0.01, &prompt), &Replicas::new(&views));
            v.on_dispatch(&req(i, i as f64 * 0.01, &prompt), r);
            (r, stat(v, "router_trie_nodes") as u64)
        })
        .unzip()
}

#[test]
fn vllm_prefix_aware_decides_as_unbounded_below_its_limit_and_stays_within_it_above() {
    let mut unbounded = vllm(u64::MAX);
    let (picks, _) = replay(&mut unbounded, 3000);
    let nodes = stat(&unbounded, "router_trie_nodes") as u64;
    // A limit the trie reaches exactly is never exceeded: the same decisions.
    let mut at_limit = vllm(nodes);
    assert!(replay(&mut at_limit, 3000).0 == picks, "a bound never exceeded changed a decision");
    assert_eq!(stat(&at_limit, "router_evicted_chunks"), 0.0);
    // A third of that: trimmed after every dispatch that went over, never above it.
    let mut tight = vllm(nodes / 3);
    let (_, sizes) = replay(&mut tight, 3000);
    assert!(sizes.iter().all(|&n| n <= nodes / 3), "over the limit: {:?}", sizes.iter().max());
    assert!(stat(&tight, "router_evicted_chunks") > 0.0);
}

fn ray(cfg: ray_prefix_aware::Config) -> RayPrefixAware {
    RayPrefixAware::new(cfg, &ctx(2)).unwrap()
}

#[test]
fn ray_prefix_aware_trims_each_replica_to_its_target_at_the_interval() {
    let views = [ReplicaView::default(); 2];
    let trimmed = ray_prefix_aware::Config {
        eviction_interval_s: 1.0,
        eviction_threshold_tokens: 100,
        eviction_target_tokens: Some(60),
        ..Default::default()
    };
    let off = ray_prefix_aware::Config { do_eviction: false, ..trimmed.clone() };
    for (cfg, expect) in [(off, 0), (trimmed, 1)] {
        let mut r = ray(cfg.clone());
        r.on_dispatch(&req(0, 0.0, &[seg(1, 60)]), 0);
        r.on_dispatch(&req(1, 0.1, &[seg(2, 60)]), 0);
        // Before the interval ends nothing is trimmed: seg 1 matches whole on replica 0.
        assert_eq!(r.route(&req(2, 0.5, &[seg(1, 60)]), &Replicas::new(&views)), 0);
        // At 1 s replica 0 holds 120 > 100 tokens: with eviction its least recently used leaf
        // (seg 1, 60 tokens) goes, down to 60; seg 1 then matches nowhere (rate 0 < 0.1), and
        // the replica with the smallest share (1, empty) gets it. Without, replica 0 again.
        assert_eq!(r.route(&req(3, 1.0, &[seg(1, 60)]), &Replicas::new(&views)), expect, "{cfg:?}");
        assert_eq!(stat(&r, "router_evicted_tokens"), 60.0 * expect as f64);
    }
    let bad = ray_prefix_aware::Config {
        eviction_threshold_tokens: 10,
        eviction_target_tokens: Some(20),
        ..Default::default()
    };
    assert!(RayPrefixAware::new(bad, &ctx(2)).err().unwrap().contains("must not exceed"));
}
