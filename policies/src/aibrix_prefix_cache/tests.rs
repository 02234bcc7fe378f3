use super::*;
use abi_stable::std_types::RNone;

fn ctx(replicas: u32) -> RouterContext {
    RouterContext {
        world: World::Cluster,
        replicas,
        seed: 1,
        kv_capacity_tokens: 100_000,
        cost: RNone,
        disaggregation: RNone,
        facts: Default::default(),
    }
}

fn req(id: u64, at: f64, segs: &[Segment]) -> Request<'_> {
    let tokens = segs.iter().map(|s| s.tokens).sum();
    Request::new(id, at, tokens).with_segments(segs)
}

fn metric(p: &AibrixPrefixCache, name: &str) -> f64 {
    p.report().into_iter().find(|(k, _)| k == name).expect("metric").1
}

fn done(replica: u32) -> Completion {
    Completion {
        request_id: 0,
        replica,
        arrived_at: 0.0,
        completed_at: 1.0,
        ttft: 0.5,
        prompt_tokens: 0,
        cached_tokens: 0,
        output_tokens: 1,
    }
}

/// Capacity drops the least recently recorded block; re-recording refreshes a block; idle
/// blocks go at the next 1 s tick.
#[test]
fn the_table_drops_least_recently_recorded_blocks_then_idle_ones() {
    let cfg = Config { capacity_tokens: 48, idle_eviction_s: 10.0, ..Default::default() }; // 3 blocks
    let mut p = AibrixPrefixCache::new(cfg, &ctx(2)).unwrap();
    let views = [ReplicaView::default(); 2];
    let a = [Segment { id: 1, tokens: 32 }]; // blocks a0 a1
    let b = [Segment { id: 2, tokens: 32 }]; // blocks b0 b1
    p.on_dispatch(&req(0, 0.0, &a), 0);
    p.on_dispatch(&req(1, 0.5, &b), 1); // b1 overflows: a0 goes
    assert_eq!(metric(&p, "router_table_blocks"), 3.0);
    // Loads [1, 1]: b matches 100 % on r1 (mean 1, σ 0: 1 ≤ 1).
    assert_eq!(p.route(&req(2, 0.6, &b), &Replicas::new(&views)), 1);
    assert_eq!(metric(&p, "prefix_decisions"), 1.0);
    // a0 is gone, so a matches nowhere: least request, not a prefix decision.
    p.route(&req(3, 0.7, &a), &Replicas::new(&views));
    assert_eq!(metric(&p, "prefix_decisions"), 1.0);
    // Recording a again at 5 s: a0 comes back (a1 goes), then a1 does (b0 goes).
    p.on_dispatch(&req(3, 5.0, &a), 0);
    assert_eq!(metric(&p, "router_table_blocks"), 3.0);
    p.on_complete(&done(0));
    p.on_complete(&done(0));
    // Loads [0, 1]: a matches 100 % on r0 (load 0 ≤ mean 0.5 + σ 0.71).
    assert_eq!(p.route(&req(4, 5.5, &a), &Replicas::new(&views)), 0);
    // At 12 s, b1 (recorded at 0.5 s) is idle beyond 10 s; a0 and a1 (5 s) are not.
    p.route(&req(5, 12.0, &a), &Replicas::new(&views));
    assert_eq!(metric(&p, "router_table_blocks"), 2.0);
    // At 16 s everything is idle.
    p.route(&req(6, 16.0, &b), &Replicas::new(&views));
    assert_eq!(metric(&p, "router_table_blocks"), 0.0);
}

/// Cached heads give the hashes of hashing the whole prompt, hit or miss.
#[test]
fn prefix_hashes_equal_hashing_the_whole_prompt() {
    let seg = |id, tokens| Segment { id, tokens };
    let full = BlockHashing::full_blocks(16);
    let mut cache = PrefixHashes::default();
    let prompts: [&[Segment]; 6] = [
        &[seg(1, 300), seg(2, 1300), seg(100, 150)],
        &[seg(1, 300), seg(2, 1300), seg(101, 250)],
        &[seg(1, 300), seg(2, 1300)],
        &[seg(1, 300), seg(3, 7), seg(102, 9)],
        &[seg(5, 15)],
        &[],
    ];
    let mut out = Vec::new();
    for _ in 0..2 {
        for p in prompts {
            cache.hashes_into(p, 16, &mut out);
            assert_eq!(out, full.hashes(p), "{p:?}");
        }
    }
    // Heads: [1, 2], [1], [1, 3] and the empty head of a one-segment prompt.
    assert_eq!(cache.heads.len(), 4);
}

/// Replicas past the first 64 hold blocks too (holders beyond the first word).
#[test]
fn replicas_beyond_64_match() {
    let mut p = AibrixPrefixCache::new(Config::default(), &ctx(70)).unwrap();
    let views = [ReplicaView::default(); 70];
    let a = [Segment { id: 1, tokens: 160 }];
    p.on_dispatch(&req(0, 0.0, &a), 69);
    p.on_complete(&done(69));
    // All loads 0: the 100 % match on r69 is under mean + σ = 0.
    assert_eq!(p.route(&req(1, 0.1, &a), &Replicas::new(&views)), 69);
    p.on_dispatch(&req(1, 0.1, &a), 65);
    p.on_complete(&done(65));
    let r = p.route(&req(2, 0.2, &a), &Replicas::new(&views));
    assert!(r == 65 || r == 69, "{r}");
}
