//! Preble's three load adjustments, each forced on a hand-made history and checked against the
//! same history with the adjustment switched off: rebalancing, autoscaling, P/D pairing.

use abi_stable::std_types::{RNone, RSome};
use routelab_policies::preble::{Config, Preble};
use routelab_policy_api::*;

use crate::common::a6000_mistral;

/// Preble over `replicas` replicas with only the named adjustment possibly on.
fn preble(replicas: u32, rebalance: bool, autoscale: bool, pd_pairing: bool) -> Preble {
    let ctx = RouterContext {
        world: World::Cluster,
        replicas,
        seed: 1,
        kv_capacity_tokens: 219_089,
        cost: RSome(a6000_mistral()),
        disaggregation: RNone,
        facts: Default::default(),
    };
    Preble::new(Config { rebalance, autoscale, pd_pairing, ..Config::default() }, &ctx).unwrap()
}

fn req<'a>(id: u64, at: f64, segs: &'a [Segment]) -> Request<'a> {
    let tokens = segs.iter().map(|s| s.tokens).sum();
    Request::new(id, at, tokens).with_segments(segs)
}

fn completion(id: u64, replica: u32, at: f64, ttft: f64) -> Completion {
    Completion {
        request_id: id,
        replica,
        arrived_at: at - ttft,
        completed_at: at,
        ttft,
        prompt_tokens: 0,
        cached_tokens: 0,
        output_tokens: 64,
    }
}

fn stat(p: &Preble, name: &str) -> f64 {
    p.report().into_iter().find(|(n, _)| n == name).unwrap().1
}

const DOC: Segment = Segment { id: 1, tokens: 2_000 };

fn question(i: u64) -> Segment {
    Segment { id: 1_000 + i, tokens: 10 }
}

/// Replica 0 has served 50 requests on one document; a new question on it exploits replica 0,
/// whose windowed load is far above 1.5 × idle replica 1's: rebalancing sends it to replica 1.
#[test]
fn rebalancing_moves_an_exploit_off_the_most_loaded_replica() {
    let views = [ReplicaView::default(); 2];
    let decide = |rebalance: bool| {
        let mut p = preble(2, rebalance, false, false);
        for i in 0..50 {
            let segs = [DOC, question(i)];
            p.on_dispatch(&req(i, 0.1 * i as f64, &segs), 0);
        }
        let segs = [DOC, question(99)];
        let chosen = p.route(&req(99, 6.0, &segs), &Replicas::new(&views));
        (chosen, stat(&p, "rebalanced_decisions"), stat(&p, "exploit_decisions"))
    };
    assert_eq!(decide(false), (0, 0.0, 1.0), "without rebalancing the holder wins");
    assert_eq!(decide(true), (1, 1.0, 1.0));
}

/// Ten exploits of one document saw a TTFT of 10 s against 0.1 s for a hundred other requests:
/// the prefix is overloaded, so the cheapest replica overall (idle replica 1) joins it.
#[test]
fn autoscaling_adds_a_replica_to_an_overloaded_prefix() {
    let views = [ReplicaView::default(); 2];
    let decide = |autoscale: bool| {
        let mut p = preble(2, false, autoscale, false);
        p.on_dispatch(&req(0, 0.0, &[DOC, question(0)]), 0);
        for i in 0..100 {
            p.on_complete(&completion(10_000 + i, 0, 1.0, 0.1));
        }
        for i in 1..=10 {
            let segs = [DOC, question(i)];
            let at = 1.0 + i as f64;
            let r = req(i, at, &segs);
            assert_eq!(p.route(&r, &Replicas::new(&views)), 0, "fewer than 10 samples: the holder");
            p.on_dispatch(&r, 0);
            p.on_complete(&completion(i, 0, at + 0.5, 10.0));
        }
        let segs = [DOC, question(11)];
        let chosen = p.route(&req(11, 20.0, &segs), &Replicas::new(&views));
        (chosen, stat(&p, "autoscaled_decisions"))
    };
    assert_eq!(decide(false), (0, 0.0));
    assert_eq!(decide(true), (1, 1.0));
}

/// Replica 1's recent requests were 90% cache hits (decode-heavy), replica 0's none, replica 2
/// is idle. A prompt nobody holds explores: the cheapest replica is idle replica 2, but pairing
/// sends the prefill-heavy request to the decode-heavy replica 1.
#[test]
fn pd_pairing_sends_an_explore_to_a_decode_heavy_replica() {
    let views = [ReplicaView::default(); 3];
    let other = Segment { id: 2, tokens: 2_000 };
    let fresh = Segment { id: 3, tokens: 3_000 };
    let decide = |pd_pairing: bool| {
        let mut p = preble(3, false, false, pd_pairing);
        p.on_dispatch(&req(0, 0.0, &[other]), 0);
        for i in 1..=10 {
            p.on_dispatch(&req(i, 0.1 * i as f64, &[DOC]), 1);
        }
        let chosen = p.route(&req(11, 2.0, &[fresh]), &Replicas::new(&views));
        (chosen, stat(&p, "pd_paired_decisions"), stat(&p, "explore_decisions"))
    };
    assert_eq!(decide(false), (2, 0.0, 1.0), "without pairing the idle replica wins");
    assert_eq!(decide(true), (1, 1.0, 1.0));
}

/// The same history with pairing off: the trace still records the explore as pairable (replica 1
/// would have been chosen, replica 2 was), a later question on the fresh prompt as its follower,
/// and each one's latency in its own group.
#[test]
fn the_pairing_trace_records_what_pairing_would_do_when_it_is_off() {
    let views = [ReplicaView::default(); 3];
    let other = Segment { id: 2, tokens: 2_000 };
    let fresh = Segment { id: 3, tokens: 3_000 };
    let mut p = preble(3, false, false, false);
    p.on_dispatch(&req(0, 0.0, &[other]), 0);
    for i in 1..=10 {
        p.on_dispatch(&req(i, 0.1 * i as f64, &[DOC]), 1);
    }
    let first = [fresh];
    let r = p.route(&req(11, 2.0, &first), &Replicas::new(&views));
    p.on_dispatch(&req(11, 2.0, &first), r);
    let again = [fresh, question(1)];
    let r2 = p.route(&req(12, 2.5, &again), &Replicas::new(&views));
    p.on_dispatch(&req(12, 2.5, &again), r2);
    assert_eq!((r, r2), (2, 2), "pairing off: the cheapest replica, then the fresh prompt's holder");
    p.on_complete(&completion(11, 2, 5.0, 3.0)); // arrived at 2.0
    p.on_complete(&completion(12, 2, 6.5, 4.0)); // arrived at 2.5
    p.on_complete(&completion(1, 1, 7.0, 0.1));
    assert_eq!(stat(&p, "pd_paired_decisions"), 0.0);
    assert_eq!(stat(&p, "pd_pairable_decisions"), 1.0);
    assert_eq!(stat(&p, "pd_pairable_differs_fraction"), 1.0);
    assert!(stat(&p, "pd_pairable_hit_ratio_mean") >= 0.7);
    assert_eq!(stat(&p, "pd_pairable_latency_mean_s"), 3.0);
    assert_eq!(stat(&p, "pd_follower_requests"), 1.0);
    assert_eq!(stat(&p, "pd_follower_latency_mean_s"), 4.0);
    assert_eq!(stat(&p, "pd_other_requests"), 1.0);
}

/// Replica 0 took twenty short prompts in the window but runs nothing now; replica 1 took two and
/// runs eight. A fresh prompt explores: charging decode for the window's requests (the paper)
/// makes replica 0 the dear one, charging it for the running requests (the code) replica 1.
#[test]
fn decode_load_charges_the_window_or_the_running_batch() {
    use routelab_policies::preble::DecodeLoad;
    let mut views = [ReplicaView::default(); 2];
    views[1].running = 8;
    let decide = |decode_load: DecodeLoad| {
        let ctx = RouterContext {
            world: World::Cluster,
            replicas: 2,
            seed: 1,
            kv_capacity_tokens: 219_089,
            cost: RSome(a6000_mistral()),
            disaggregation: RNone,
            facts: Default::default(),
        };
        let cfg = Config { rebalance: false, autoscale: false, pd_pairing: false, decode_load, ..Config::default() };
        let mut p = Preble::new(cfg, &ctx).unwrap();
        for i in 0..22 {
            let segs = [question(i)];
            p.on_dispatch(&req(i, 0.1 * i as f64, &segs), usize::from(i >= 20));
        }
        let fresh = [Segment { id: 7, tokens: 10 }];
        p.route(&req(99, 3.0, &fresh), &Replicas::new(&views))
    };
    assert_eq!(decide(DecodeLoad::Windowed), 1);
    assert_eq!(decide(DecodeLoad::Running), 0);
}
