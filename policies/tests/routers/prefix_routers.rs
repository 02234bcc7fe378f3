//! The prefix-aware routers' decision rules on hand-made views (the cluster world tests them
//! end to end).

use abi_stable::std_types::{RNone, ROption, RSlice};
use routelab_policies::{
    max_affinity::MaxAffinity, preble::Preble, sglang_cache_aware::SglangCacheAware,
    threshold_affinity::ThresholdAffinity,
};
use routelab_policy_api::*;

use crate::common::a6000_mistral;

fn ctx(replicas: u32, cost: ROption<CostModel>) -> RouterContext {
    RouterContext {
        world: World::Cluster,
        replicas,
        seed: 1,
        kv_capacity_tokens: 219_089,
        cost,
        disaggregation: ROption::RNone,
        facts: Default::default(),
    }
}

fn req<'a>(id: u64, at: f64, segs: &'a [Segment]) -> Request<'a> {
    let tokens = segs.iter().map(|s| s.tokens).sum();
    Request::new(id, at, tokens).with_segments(segs)
}

fn view(matched: u32, work: f64) -> ReplicaView {
    ReplicaView { matched_tokens: matched, outstanding_work: work, ..Default::default() }
}

const SYS: Segment = Segment { id: 1, tokens: 13 };
const DOC: Segment = Segment { id: 2, tokens: 21_000 };
const Q: Segment = Segment { id: 3, tokens: 1_987 };

#[test]
fn max_affinity_follows_even_a_tiny_shared_prefix() {
    let mut r = MaxAffinity::new(Default::default(), &ctx(3, RNone)).unwrap();
    let segs = [SYS, DOC];
    // Replica 2 holds only the 13-token system prompt and is busy; max affinity still goes there.
    assert_eq!(r.route(&req(0, 0.0, &segs), &Replicas::new(&[view(0, 0.0), view(0, 0.0), view(13, 1e6)])), 2);
    // Equal matches: least work.
    assert_eq!(r.route(&req(1, 0.0, &segs), &Replicas::new(&[view(13, 5.0), view(13, 1.0), view(13, 3.0)])), 1);
}

#[test]
fn threshold_affinity_needs_a_match_worth_having() {
    let mut r = ThresholdAffinity::new(Default::default(), &ctx(3, RNone)).unwrap();
    let segs = [SYS, DOC, Q];
    // Only the system prompt matches: route by load.
    assert_eq!(r.route(&req(0, 0.0, &segs), &Replicas::new(&[view(13, 9.0), view(0, 1.0), view(13, 5.0)])), 1);
    // The document matches on replica 2: affinity, despite the load.
    assert_eq!(r.route(&req(1, 0.0, &segs), &Replicas::new(&[view(13, 9.0), view(0, 1.0), view(21_013, 50.0)])), 2);
    assert!(
        ThresholdAffinity::new(routelab_policies::threshold_affinity::Config { threshold: 1.5 }, &ctx(2, RNone))
            .is_err()
    );
}

#[test]
fn sglang_follows_its_own_tree_until_the_load_guard_trips() {
    let mut r = SglangCacheAware::new(Default::default(), &ctx(4, RNone)).unwrap();
    let views = [ReplicaView::default(); 4];
    let doc_a = [SYS, DOC, Q];
    let first = r.route(&req(0, 0.0, &doc_a), &Replicas::new(&views));
    r.on_dispatch(&req(0, 0.0, &doc_a), first);
    // Same document, new question: the tree says `first` has 21,013 of 23,000 tokens.
    let doc_a2 = [SYS, DOC, Segment { id: 4, tokens: 1_987 }];
    for i in 1..=8 {
        let c = r.route(&req(i, 0.1 * i as f64, &doc_a2), &Replicas::new(&views));
        assert_eq!(c, first, "request {i} should follow its cached document");
        r.on_dispatch(&req(i, 0.1 * i as f64, &doc_a2), c);
    }
    // 9 in flight on one replica, 0 elsewhere: 9 − 0 > 8 and 9 > 1.5 × 0 → least loaded.
    let c = r.route(&req(9, 1.0, &doc_a2), &Replicas::new(&views));
    assert_ne!(c, first);
    let stats = r.report();
    assert_eq!(stats.iter().find(|s| s.0 == "balance_decisions").unwrap().1, 1.0);
}

#[test]
fn sglang_trims_trees_at_its_eviction_interval() {
    let cfg = routelab_policies::sglang_cache_aware::Config {
        max_tree_tokens: 30_000,
        eviction_interval_s: 10.0,
        ..Default::default()
    };
    let mut r = SglangCacheAware::new(cfg, &ctx(1, RNone)).unwrap();
    let views = [ReplicaView::default()];
    let a = [SYS, DOC];
    let b = [SYS, Segment { id: 9, tokens: 21_000 }];
    r.on_dispatch(&req(0, 0.0, &a), 0);
    r.on_dispatch(&req(1, 1.0, &b), 0);
    assert_eq!(r.believed_match(&a, 0), 21_013, "no eviction before the interval ends");
    r.route(&req(2, 10.0, &b), &Replicas::new(&views));
    assert_eq!(r.believed_match(&a, 0), 13, "the least recently used document is trimmed");
    assert_eq!(r.believed_match(&b, 0), 21_013);
}

/// A crash takes index 1 out of four: the replica that held the document moves from index 2 to
/// 1, and its affinity follows it; when that replica leaves too, no stale affinity sends the
/// document anywhere, and the replica that joins (at the top index) starts with an empty tree.
#[test]
fn sglang_forgets_a_replica_that_leaves_and_its_affinity_follows_the_indices() {
    let mut r = SglangCacheAware::new(Default::default(), &ctx(4, RNone)).unwrap();
    let doc = [SYS, DOC, Q];
    r.on_dispatch(&req(0, 0.0, &doc), 2);
    assert_eq!(r.route(&req(1, 1.0, &doc), &Replicas::new(&[ReplicaView::default(); 4])), 2);
    // Index 1 crashes: three routable, the document's holder is index 1 now.
    r.on_replica_change(&ReplicaChange { at: 2.0, replica: 1, joined: false, routable: 3 });
    let three = [ReplicaView::default(); 3];
    assert_eq!(r.route(&req(2, 2.0, &doc), &Replicas::new(&three)), 1);
    assert_eq!(r.believed_match(&doc, 1), 23_000);
    // The holder leaves: nothing matches (below the threshold: least loaded, index 0), and no
    // index names its tree.
    r.on_replica_change(&ReplicaChange { at: 3.0, replica: 1, joined: false, routable: 2 });
    let two = [ReplicaView::default(); 2];
    assert_eq!(r.route(&req(3, 3.0, &doc), &Replicas::new(&two)), 0);
    assert_eq!((r.believed_match(&doc, 0), r.believed_match(&doc, 1)), (0, 0));
    // A replica joins at index 2, cold.
    r.on_replica_change(&ReplicaChange { at: 4.0, replica: 2, joined: true, routable: 3 });
    assert_eq!(r.believed_match(&doc, 2), 0);
}

/// Exercise 3's situation: replica 2 holds the system prompt and the document; E2 exploits it.
#[test]
fn preble_exploits_a_long_cached_document_and_explores_otherwise() {
    let mut r = Preble::new(Default::default(), &ctx(4, abi_stable::std_types::RSome(a6000_mistral()))).unwrap();
    let views = [ReplicaView::default(); 4];
    for rep in [0, 1, 3] {
        r.on_dispatch(&req(rep as u64, 0.0, &[SYS]), rep);
    }
    r.on_dispatch(&req(2, 0.0, &[SYS, DOC]), 2);
    let segs = [SYS, DOC, Q];
    assert_eq!(
        r.route(&req(10, 1.0, &segs), &Replicas::new(&views)),
        2,
        "cached 21,013 > missed 1,987: exploit replica 2"
    );
    // A new document: only 13 tokens cached anywhere → explore, to the cheapest replica — not 2,
    // which carries the most windowed load.
    let other = [SYS, Segment { id: 7, tokens: 20_000 }, Q];
    r.on_dispatch(&req(10, 1.0, &segs), 2);
    let c = r.route(&req(11, 2.0, &other), &Replicas::new(&views));
    assert_ne!(c, 2);
    let stats = r.report();
    let get = |k: &str| stats.iter().find(|s| s.0 == k).unwrap().1;
    assert_eq!(get("exploit_decisions"), 1.0);
    assert_eq!(get("explore_decisions"), 1.0);
    assert!(get("cost_p_mean_s") > 0.0);
}

#[test]
fn preble_forgets_what_replicas_evict() {
    let mut r = Preble::new(Default::default(), &ctx(2, abi_stable::std_types::RSome(a6000_mistral()))).unwrap();
    let views = [ReplicaView::default(); 2];
    r.on_dispatch(&req(0, 0.0, &[SYS, DOC]), 1);
    let segs = [SYS, DOC, Q];
    assert_eq!(r.route(&req(1, 1.0, &segs), &Replicas::new(&views)), 1);
    r.on_evict(&Eviction { replica: 1, evicted_at: 1.5, path: RSlice::from_slice(&[SYS, DOC]), remaining_tokens: 0 });
    r.route(&req(2, 2.0, &segs), &Replicas::new(&views));
    let stats = r.report();
    assert_eq!(
        stats.iter().find(|s| s.0 == "explore_decisions").unwrap().1,
        1.0,
        "after the eviction nothing is cached: explore"
    );
}

#[test]
fn preble_refuses_the_dispatch_world() {
    let e = Preble::new(Default::default(), &ctx(2, RNone)).err().unwrap();
    assert!(e.contains("cluster"), "{e}");
}

#[test]
fn preble_pairs_an_exploring_request_with_the_highest_hit_ratio_replica() {
    // Hand-computed from Preble's rule (argmax of the 30 s windowed hit ratios, kept if ≥ 0.7).
    // Replica 0: document A (1,000 tokens) once cold, then 9 questions (100 tokens) on it:
    // cached 9 × 1,000 of 1,000 + 9 × 1,100 prompt tokens = 9,000 / 10,900 = 0.826.
    // Replica 1: document B once cold, then 4 questions: 4,000 / 5,400 = 0.741, and less load.
    // Replicas 2 and 3: nothing (ratio 0, no load).
    let mut r = Preble::new(Default::default(), &ctx(4, abi_stable::std_types::RSome(a6000_mistral()))).unwrap();
    let views = [ReplicaView::default(); 4];
    let (a, b) = (Segment { id: 20, tokens: 1_000 }, Segment { id: 21, tokens: 1_000 });
    let q = |i: u64| Segment { id: 100 + i, tokens: 100 };
    r.on_dispatch(&req(0, 0.0, &[a]), 0);
    for i in 1..=9 {
        r.on_dispatch(&req(i, 0.0, &[a, q(i)]), 0);
    }
    r.on_dispatch(&req(10, 0.0, &[b]), 1);
    for i in 11..=14 {
        r.on_dispatch(&req(i, 0.0, &[b, q(i)]), 1);
    }
    // A new document C: nothing cached → explore → paired with replica 0 (0.826 > 0.741), not the
    // cheaper replica 1 (the earlier "cheapest of those ≥ 0.7") nor the idle 2 and 3.
    let c = Segment { id: 22, tokens: 1_000 };
    assert_eq!(r.route(&req(20, 1.0, &[c, q(20)]), &Replicas::new(&views)), 0);
    // 31 s later the hit-ratio window (30 s) is empty: no replica qualifies, the cheapest overall
    // (idle replica 2; the load window H = 180 s still holds 0 and 1's work) is chosen.
    assert_eq!(r.route(&req(21, 31.5, &[c, q(21)]), &Replicas::new(&views)), 2);
    let stats = r.report();
    assert_eq!(stats.iter().find(|s| s.0 == "pd_paired_decisions").unwrap().1, 1.0);
}
