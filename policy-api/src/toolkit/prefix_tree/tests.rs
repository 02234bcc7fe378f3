use super::*;

fn seg(id: u64, tokens: u32) -> Segment {
    Segment { id, tokens }
}

#[test]
fn match_counts_whole_and_partial_segments_per_replica() {
    let mut t = PrefixTree::new(3);
    let sys = seg(1, 13);
    let doc = seg(2, 21_000);
    let q = seg(3, 2_000);
    assert_eq!(t.insert(&[sys, doc, q], 1), 23_013);
    assert_eq!(t.insert(&[sys], 0), 13);
    assert_eq!(t.insert(&[sys, doc], 1), 0, "already held");
    let mut out = [0; 3];
    t.match_each(&[sys, doc, seg(4, 5)], &mut out);
    assert_eq!(out, [13, 21_013, 0]);
    assert_eq!(t.match_tokens(&[sys, doc], 1), 21_013);
    assert_eq!(t.longest_match(&[sys, doc, seg(9, 1)]).0, 21_013);
    // Partial eviction of the document on replica 1 leaves its first 1,000 tokens.
    t.release_path(&[sys, doc], 1, 1_000);
    assert_eq!(t.match_tokens(&[sys, doc, q], 1), 1_013);
    t.check();
}

#[test]
fn lru_evicts_least_recent_leaves_first_and_promotes_parents() {
    let mut t = PrefixTree::new(1);
    let sys = seg(1, 10);
    t.insert(&[sys, seg(2, 100)], 0); // oldest
    t.insert(&[sys, seg(3, 100)], 0);
    t.insert(&[sys, seg(4, 100)], 0);
    t.insert(&[sys, seg(2, 100)], 0); // doc 2 is now the most recent
    let plan = t.plan_eviction(0, 150);
    let ids: Vec<u64> = plan.iter().map(|(n, _)| t.segment(*n).id).collect();
    assert_eq!(ids, vec![3, 4]);
    // Planning everything ends with the shared system prompt, once its children are gone.
    let all: Vec<u64> = t.plan_eviction(0, u64::MAX).iter().map(|(n, _)| t.segment(*n).id).collect();
    assert_eq!(all, vec![3, 4, 2, 1]);
    assert_eq!(t.evict_lru(0, 150), 200);
    assert_eq!(t.held_tokens(0), 110);
    assert_eq!(t.match_tokens(&[sys, seg(2, 100)], 0), 110);
    assert_eq!(t.match_tokens(&[sys, seg(3, 100)], 0), 10);
    t.check();
}

#[test]
fn releasing_a_node_releases_its_subtree_and_collects_unheld_nodes() {
    let mut t = PrefixTree::new(2);
    let p = [seg(1, 5), seg(2, 50), seg(3, 7)];
    t.insert(&p, 0);
    t.insert(&p[..2], 1);
    assert_eq!(t.release_path(&p[..2], 0, 0), 57);
    assert_eq!(t.match_tokens(&p, 0), 5);
    assert!(t.find(&p).is_none(), "the question node is held by nobody and is collected");
    assert_eq!(t.match_tokens(&p, 1), 55);
    t.check();
    t.release_path(&p[..1], 1, 0);
    t.release_path(&p[..1], 0, 0);
    assert!(t.find(&p[..1]).is_none());
    t.check();
}

#[test]
fn a_partial_release_releases_everything_below() {
    let mut t = PrefixTree::new(2);
    let (sys, doc, q) = (seg(1, 13), seg(2, 500), seg(3, 20));
    t.insert(&[sys, doc, q], 0);
    t.insert(&[sys, doc, q], 1);
    assert_eq!(t.release_path(&[sys, doc], 0, 100), 420, "400 of the document and the question below");
    assert_eq!(t.match_tokens(&[sys, doc, q], 0), 113);
    assert_eq!(t.held_tokens(0), 113);
    assert_eq!(t.match_tokens(&[sys, doc, q], 1), 533, "the other replica keeps its copy");
    let mut lru = t.clone();
    assert_eq!(lru.evict_lru(0, 1), 100, "the cut document is replica 0's leaf now");
    t.check();
    lru.check();
}

#[test]
fn nodes_are_found_and_released_by_path_hash() {
    let mut t = PrefixTree::new(2);
    let (sys, doc, q) = (seg(1, 13), seg(2, 500), seg(3, 20));
    t.insert(&[sys, doc, q], 0);
    t.insert(&[sys, doc], 1);
    let node = t.find(&[sys, doc]).unwrap();
    let hash = extend_path_hash(extend_path_hash(ROOT_PATH_HASH, 1), 2);
    assert_eq!(t.path_hash(node), hash);
    assert_eq!(t.find_hash(hash), Some(node));
    assert_eq!(t.context_tokens(node), 13);
    assert_eq!(t.release_hash(hash, 1, 0), 500, "replica 1 held the document whole");
    assert_eq!(t.release_hash(0xdead, 0, 0), 0, "unknown hashes are ignored");
    assert_eq!(t.match_tokens(&[sys, doc, q], 0), 533, "replica 0 keeps its copy");
    t.release_hash(hash, 0, 0);
    assert_eq!(t.find_hash(hash), None, "collected with its subtree once nobody holds it");
    t.check();
}

#[test]
fn bookkeeping_survives_a_random_workout() {
    use rand::{RngExt, SeedableRng};
    let mut rng = rand::rngs::Xoshiro256PlusPlus::seed_from_u64(5);
    let mut t = PrefixTree::new(4);
    // The same operations on a tree without the hash index give the same answers.
    let mut lean = PrefixTree::without_hash_index(4);
    for i in 0..3000u64 {
        let r = rng.random_range(0..4);
        let doc = rng.random_range(0..30u64);
        let path = [seg(1, 13), seg(100 + doc, 50 + doc as u32), seg(10_000 + i % 7, 9)];
        match rng.random_range(0..10) {
            0..=5 => {
                assert_eq!(t.insert(&path, r), lean.insert(&path, r));
            }
            6 | 7 => {
                let tokens = rng.random_range(1..200);
                assert_eq!(t.evict_lru(r, tokens), lean.evict_lru(r, tokens));
            }
            _ => {
                let remaining = rng.random_range(0..3);
                assert_eq!(t.release_path(&path[..2], r, remaining), lean.release_path(&path[..2], r, remaining));
            }
        }
        assert_eq!(t.node_count(), lean.node_count());
        let mut each = [0; 4];
        t.match_each(&path, &mut each);
        for (k, &m) in each.iter().enumerate() {
            assert_eq!(m, t.match_tokens(&path, k), "match_each agrees with match_tokens on replica {k}");
        }
        if i % 97 == 0 {
            t.check();
            let plan = t.plan_eviction(r, 300);
            let mut copy = t.clone();
            let planned: u64 = plan.iter().map(|(_, k)| *k as u64).sum();
            assert_eq!(copy.evict_lru(r, 300), planned, "plan and eviction agree");
            lean.check();
            assert_eq!(lean.plan_eviction(r, 300), plan);
        }
    }
    t.check();
}

#[test]
fn a_node_takes_64_bytes_with_its_one_holder_inline() {
    // The layout docs/performance.md's figures rest on ("sglang_cache_aware's day").
    assert_eq!(std::mem::size_of::<node::Hold>(), 20);
    assert_eq!(std::mem::size_of::<node::Holds>(), 24);
    assert_eq!(std::mem::size_of::<node::Node>(), 64);
}

#[test]
fn holders_move_inline_and_back_as_replicas_come_and_go() {
    let mut t = PrefixTree::without_hash_index(3);
    let (sys, q) = (seg(1, 10), seg(2, 5));
    t.insert(&[sys, q], 2);
    t.insert(&[sys, q], 0);
    t.insert(&[sys], 1);
    let node = t.find(&[sys, q]).unwrap();
    assert_eq!(t.holders(node).collect::<Vec<_>>(), [0, 2], "in replica order whatever the order of insertion");
    assert_eq!(t.evict_lru(2, 1), 5);
    assert_eq!(t.holders(node).collect::<Vec<_>>(), [0]);
    assert!(matches!(t.nodes[node as usize].holds, node::Holds::One(_)), "one holder left: inline again");
    assert_eq!(t.node_count(), 2);
    assert_eq!(t.evict_lru(0, 15), 15);
    assert_eq!(t.node_count(), 1, "the question is collected; replica 1 still holds the system prompt");
    t.check();
}

#[test]
#[should_panic(expected = "without_hash_index")]
fn a_tree_without_the_hash_index_refuses_lookups_by_hash() {
    let mut t = PrefixTree::without_hash_index(1);
    t.insert(&[seg(1, 10)], 0);
    t.find_hash(extend_path_hash(ROOT_PATH_HASH, 1));
}
