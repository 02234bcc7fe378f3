//! The PD routers: one hand-computed decision per field policy from its upstream rule (the
//! arithmetic is in the comments), composition, and what they refuse.

use crate::common::a6000_mistral;
use abi_stable::std_types::{RNone, RSome};
use routelab_policies::pd::{
    pd_aibrix, pd_dynamo, pd_dynamo::PdDynamo, pd_least_loaded::PdLeastLoaded, pd_llm_d, pd_llm_d::PdLlmD, pd_mooncake,
    pd_mooncake::PdMooncake, pd_sglang::PdSglang,
};
use routelab_policy_api::*;

/// `prefill` prefill and `decode` decode A6000/Mistral-7B instances, a 100 Gbit/s link.
fn ctx(prefill: u32, decode: u32) -> RouterContext {
    let cost = a6000_mistral();
    RouterContext {
        world: World::Cluster,
        replicas: decode,
        seed: 1,
        kv_capacity_tokens: 100_000,
        cost: RSome(cost.clone()),
        disaggregation: RSome(PdContext {
            prefill_replicas: prefill,
            prefill_kv_capacity_tokens: 100_000,
            prefill_cost: RSome(cost.clone()),
            kv_bytes_per_token: 131_072.0,
            link_bandwidth_bytes_s: 12.5e9,
            link_base_latency_s: 0.0005,
            mixed_replicas: 0,
            link_layerwise: false,
            model_layers: 32,
            shared_kv_bandwidth_bytes_s: 0.0,
            shared_kv_capacity_tokens: 0,
        }),
        facts: Default::default(),
    }
}

fn req(segs: &[Segment]) -> Request<'_> {
    let tokens = segs.iter().map(|s| s.tokens).sum();
    Request::new(0, 0.0, tokens).with_segments(segs)
}

fn view(matched: u32, outstanding: u32, running: u32, kv_used: u64) -> ReplicaView {
    ReplicaView {
        waiting: outstanding - running,
        running,
        outstanding_requests: outstanding,
        outstanding_work: 0.0,
        kv_used_tokens: kv_used,
        kv_capacity_tokens: 1000,
        matched_tokens: matched,
    }
}

const PROMPT: [Segment; 1] = [Segment { id: 7, tokens: 1000 }];

#[test]
fn dynamo_isl_bounding_bypasses_only_small_mostly_cached_prompts() {
    // eff = 1000 − 900 = 100 < 2048 and 100/1000 = 0.1 < 0.7: bypass.
    assert!(pd_dynamo::isl_bounding(1000, 900, 2048, 0.7));
    // eff = 800: 0.8 ≥ 0.7, no bypass; eff = 3000 ≥ 2048, no bypass however cached.
    assert!(!pd_dynamo::isl_bounding(1000, 200, 2048, 0.7));
    assert!(!pd_dynamo::isl_bounding(5000, 2000, 2048, 0.7));
    // Both decode instances hold 900 of the 1000 tokens: whichever the decode router takes, the
    // decode instance prefills itself when conditional disaggregation is on, never when off.
    let cfg = pd_dynamo::Config { conditional_disagg: true, ..Default::default() };
    let mut on = PdDynamo::new(cfg, &ctx(2, 2)).unwrap();
    let mut off = PdDynamo::new(pd_dynamo::Config::default(), &ctx(2, 2)).unwrap();
    assert!(on.capabilities().needs_exact_match() && on.capabilities().disaggregated());
    let prefill = [view(0, 0, 0, 0); 2];
    let decode = [view(900, 0, 0, 0); 2];
    let r = req(&PROMPT);
    // Three signal columns (dynamo_kv's `prefilling` and its two tier matches), 0 on both.
    assert_eq!(on.signals().len(), 3);
    let (p, d) = (Replicas::with_signals(&prefill, &[0.0; 6], 3), Replicas::with_signals(&decode, &[0.0; 6], 3));
    assert!(matches!(on.route_pair(&r, &p, &d), PdRoute::DecodeOnly { .. }));
    assert!(matches!(off.route_pair(&r, &p, &d), PdRoute::Disaggregate { .. }));
}

#[test]
fn dynamo_decode_router_keeps_the_overlap_credit_under_conditional_disaggregation() {
    // Upstream's decode router: credit 0 (load only) unless conditional disaggregation leaves
    // it in place, then max(0, decode_blocks − overlap). Decode instance 0 holds the prompt
    // (62 blocks of 1000 tokens) and one other request's 10 blocks; instance 1 is empty.
    let held = [Segment { id: 7, tokens: 1000 }];
    let other = [Segment { id: 9, tokens: 160 }];
    let prefill = [view(0, 0, 0, 0); 2];
    let decode = [view(0, 0, 0, 0); 2];
    let (p, d) = (Replicas::with_signals(&prefill, &[0.0; 6], 3), Replicas::with_signals(&decode, &[0.0; 6], 3));
    let decisions = |conditional: bool| {
        let cfg = pd_dynamo::Config { conditional_disagg: conditional, ..Default::default() };
        let mut router = PdDynamo::new(cfg, &ctx(2, 2)).unwrap();
        for (id, prompt) in [(100, &held[..]), (101, &other[..])] {
            let r = Request { id, ..req(prompt) };
            router.on_dispatch_pair(&r, PdRoute::pair(0, 0));
        }
        // Off: r0 62 + 10 active + 62 − 62 shared = 72 > r1 62: the empty instance.
        // On: r0 max(0, 72 − 62) = 10 < r1 62: the cache-hot one.
        (0..20)
            .map(|_| router.route_pair(&req(&held), &p, &d).decode().unwrap())
            .collect::<std::collections::BTreeSet<usize>>()
    };
    assert_eq!(decisions(false), [1].into());
    assert_eq!(decisions(true), [0].into());
}

#[test]
fn llm_d_decider_counts_whole_blocks_on_the_chosen_decode_instance() {
    // 990 matched = 61 whole 16-token blocks = 976 tokens: 24 non-cached ≥ 16 → disaggregate.
    assert!(pd_llm_d::disaggregate(1000, 990, 16, 16));
    // 1000 matched = 62 blocks = 992: 8 < 16 → prefill on the decode instance.
    assert!(!pd_llm_d::disaggregate(1000, 1000, 16, 16));
    // Threshold 0 (the code default) never disaggregates.
    assert!(!pd_llm_d::disaggregate(1000, 0, 16, 0));
    let mut r = PdLlmD::new(pd_llm_d::Config::default(), &ctx(2, 2)).unwrap();
    let prefill = [view(0, 0, 0, 0); 2];
    let decode = [view(1000, 0, 0, 0); 2];
    // llm_d reads scraped signals: give it the table the host would (all zero here).
    let k = r.signals().len();
    let zeros = vec![0.0; 2 * k];
    let (p, d) =
        (Replicas::with_signals(&prefill, &zeros, k as u32), Replicas::with_signals(&decode, &zeros, k as u32));
    let d = r.route_pair(&req(&PROMPT), &p, &d);
    assert!(matches!(d, PdRoute::DecodeOnly { .. }));
}

#[test]
fn aibrix_picks_the_roleset_with_the_lowest_normalised_sum() {
    // Prefill (prompt 100): P0 matched 50, 2 outstanding → (100 − 50)·0.1 + 2/2 = 6;
    // P1 matched 0, idle → 10 + 0 = 10.
    let prefill = [view(50, 2, 0, 0), view(0, 0, 0, 0)];
    assert_eq!(pd_aibrix::prefill_scores(100, &prefill), vec![6.0, 10.0]);
    // Decode: D0 running 4, 100 tok/s, 50% free → (4/4 + 1 − 1) / (0.5/1) = 2;
    // D1 idle, 0 tok/s, all free → (0 + 1 − 0) / 1 = 1.
    let decode = [view(0, 4, 4, 500), view(0, 0, 0, 0)];
    assert_eq!(pd_aibrix::decode_scores(&decode, &[100.0, 0.0]), vec![2.0, 1.0]);
    // Rolesets {P0, D0}: 6/10 + 2/2 = 1.6; {P1, D1}: 10/10 + 1/2 = 1.5 → the second.
    assert_eq!(pd_aibrix::joint(&[6.0, 10.0], &[2.0, 1.0], 2), (1, 1));
    // One roleset: its best prefill (P0, 6) and best decode (D1, 1).
    assert_eq!(pd_aibrix::joint(&[6.0, 10.0], &[2.0, 1.0], 1), (0, 1));
}

#[test]
fn mooncake_migrates_a_hot_prefix_to_an_idle_instance_and_rejects_past_the_slo() {
    let c = a6000_mistral();
    // P0 holds the whole 1000-token prompt but has 20,000 tokens of prefill queued; P1 is idle
    // and holds nothing. Global: P1's ratio 1000/0 > 2, so its TTFT = copy 1000 tokens
    // (0.5 ms + 1000 × 131072 B / 12.5e9 B/s) + its one uncached token after 999 cached;
    // P0's = queue(20,000 tokens) + the same one token. The copy is far cheaper than the queue.
    let mut p0 = view(1000, 10, 0, 0);
    p0.outstanding_work = 20_000.0;
    let prefill = [p0, view(0, 0, 0, 0)];
    let decode = [view(0, 3, 3, 900), view(0, 1, 1, 100)];
    let mut m = PdMooncake::new(pd_mooncake::Config::default(), &ctx(2, 2)).unwrap();
    let (t1, migrate) = m.ttft(1000, &prefill[1], 1000, true);
    assert!(migrate);
    let expect = 0.0005 + 1000.0 * 131_072.0 / 12.5e9 + c.prefill_time_s(1, 999);
    assert!((t1 - expect).abs() < 1e-12, "{t1} vs {expect}");
    let (t0, _) = m.ttft(1000, &prefill[0], 1000, true);
    assert_eq!(t0, c.prefill_time_s(20_000, 0) + c.prefill_time_s(1, 999));
    let r = req(&PROMPT);
    let decision = m.route_pair(&r, &Replicas::new(&prefill), &Replicas::new(&decode));
    // Decode by load: D1 has the least KV in use.
    assert_eq!(decision, PdRoute::Disaggregate { prefill: 1, decode: 1, prefix_from: Some(0) });
    // Local cache awareness cannot copy: P1 must prefill all 1000 tokens, P0 must queue.
    let local = pd_mooncake::Config { scheduling: pd_mooncake::Scheduling::LocalCacheAware, ..Default::default() };
    let mut l = PdMooncake::new(local, &ctx(2, 2)).unwrap();
    let pick = if c.prefill_time_s(1000, 0) < t0 { 1 } else { 0 };
    assert_eq!(l.route_pair(&r, &Replicas::new(&prefill), &Replicas::new(&decode)), PdRoute::pair(pick, 1));
    // A TBT SLO below one decode step of D1 (2 sequences over 1100 tokens) rejects.
    let tbt = c.decode_step_time_s(2, 1100);
    let strict = pd_mooncake::Config { tbt_slo_s: tbt * 0.99, ..Default::default() };
    let mut s = PdMooncake::new(strict, &ctx(2, 2)).unwrap();
    assert_eq!(s.route_pair(&r, &Replicas::new(&prefill), &Replicas::new(&decode)), PdRoute::Reject);
    assert_eq!(s.report(), vec![("rejected".to_string(), 1.0), ("migrations".to_string(), 0.0)]);
}

#[test]
fn pd_routers_refuse_aggregated_clusters_and_sglang_refuses_unknown_or_pd_children() {
    let agg = RouterContext { disaggregation: RNone, ..ctx(1, 4) };
    assert!(PdMooncake::new(pd_mooncake::Config::default(), &agg).is_err());
    assert!(PdDynamo::new(pd_dynamo::Config::default(), &agg).is_err());
    let cfg = |p: &str, d: &str| routelab_policies::pd::pd_sglang::Config { prefill: p.into(), decode: d.into() };
    let e = PdSglang::new(cfg("nope", "round_robin"), &ctx(2, 2)).err().unwrap();
    assert!(e.contains("prefill: no built-in router named 'nope'"), "{e}");
    let e = PdSglang::new(cfg("round_robin", "pd_random"), &ctx(2, 2)).err().unwrap();
    assert!(e.contains("itself a PD router"), "{e}");
    let e = PdSglang::new(cfg("power_of_two{d: 0}", "round_robin"), &ctx(2, 2)).err().unwrap();
    assert!(e.starts_with("prefill:"), "{e}");
    // Children are told about their own pool: round robin over 3 prefill and 2 decode instances.
    let mut r = PdSglang::new(cfg("round_robin", "round_robin"), &ctx(3, 2)).unwrap();
    let (p, d) = ([ReplicaView::default(); 3], [ReplicaView::default(); 2]);
    let picks: Vec<(usize, usize)> = (0..4)
        .map(|_| {
            let x = r.route_pair(&req(&PROMPT), &Replicas::new(&p), &Replicas::new(&d));
            r.on_dispatch_pair(&req(&PROMPT), x);
            (x.prefill().unwrap(), x.decode().unwrap())
        })
        .collect();
    assert_eq!(picks, vec![(0, 0), (1, 1), (2, 0), (0, 1)]);
}

/// `Pools` (pd_sglang, pd_dynamo, pd_llm_d) on a crash: with `chwbl{load_factor: 1}` as the
/// prefill child over two prefill instances, two requests with one prompt go to its ring's
/// first instance f (in flight 0, then 1 ≤ (1 + 1) / 2) and a third overflows to the other
/// ((2 + 1) / 2 < 2). If the first is abandoned before its prefill completed, the prefill child
/// hears it (in flight back to 1) and the third stays on f. A prefill pool change reaches the
/// prefill child in the pool's own indices: after instance 1 of 2 leaves, chwbl has one
/// candidate left.
#[test]
fn pd_pools_route_abandons_and_pool_changes_to_the_child_that_placed_them() {
    let cfg = routelab_policies::pd::pd_sglang::Config {
        prefill: "chwbl{load_factor: 1.0}".into(),
        decode: "round_robin".into(),
    };
    let (p, d) = ([ReplicaView::default(); 2], [ReplicaView::default(); 2]);
    let place = |r: &mut PdSglang, id: u64| {
        let q = Request { id, ..req(&PROMPT) };
        let x = r.route_pair(&q, &Replicas::new(&p), &Replicas::new(&d));
        r.on_dispatch_pair(&q, x);
        x
    };
    let done = |id: u64, replica: u32| Completion {
        request_id: id,
        replica,
        arrived_at: 0.0,
        completed_at: 1.0,
        ttft: f64::NAN,
        prompt_tokens: 1000,
        cached_tokens: 0,
        output_tokens: 0,
    };
    let third = |abandon: bool| {
        let mut r = PdSglang::new(cfg.clone(), &ctx(2, 2)).unwrap();
        let (a, b) = (place(&mut r, 1), place(&mut r, 2));
        assert_eq!(a.prefill(), b.prefill(), "both under the bound on the ring's first instance");
        if abandon {
            r.on_abandon(&done(1, a.decode().unwrap() as u32));
        }
        (a.prefill().unwrap(), place(&mut r, 3).prefill().unwrap())
    };
    let (f, c) = third(false);
    assert_eq!(c, 1 - f, "two in flight on f: the third overflows");
    let (f, c) = third(true);
    assert_eq!(c, f, "the abandoned prefill's load was released");

    let mut r = PdSglang::new(cfg.clone(), &ctx(2, 2)).unwrap();
    let change = ReplicaChange { at: 1.0, replica: 1, joined: false, routable: 1 };
    r.on_pool_change(PdPool::Prefill, &change);
    let one = [ReplicaView::default(); 1];
    for id in 0..4 {
        let q = Request { id, ..req(&PROMPT) };
        let x = r.route_pair(&q, &Replicas::new(&one), &Replicas::new(&d));
        assert_eq!(x.prefill(), Some(0));
        r.on_dispatch_pair(&q, x);
    }
}

/// `pd_least_loaded` pairs a mixed instance with itself through crashes and restarts
/// (policy-api 0.5.13's `PdContext::apply_pool_change` / `apply_mixed_change`). Layout: one
/// prefill-only instance P, mixed M1 and M2, one decode-only D — prefill candidates [P, M1, M2],
/// decode candidates [M1, M2, D]. The decode views always make D (the last) the least loaded,
/// so a pick that is not paired locally shows as D.
#[test]
fn pd_least_loaded_keeps_mixed_instances_paired_as_instances_come_and_go() {
    let mut c = ctx(3, 3);
    if let RSome(pd) = &mut c.disaggregation {
        pd.mixed_replicas = 2;
    }
    let mut r = PdLeastLoaded::new(routelab_policies::NoConfig {}, &c).unwrap();
    // The least outstanding work on prefill candidate `least` of `n`; D least loaded.
    let route = |r: &mut PdLeastLoaded, least: usize, n: usize, d: usize| {
        let prefill: Vec<ReplicaView> = (0..n)
            .map(|i| ReplicaView { outstanding_work: if i == least { 1.0 } else { 50.0 }, ..view(0, 0, 0, 0) })
            .collect();
        let decode: Vec<ReplicaView> = (0..d).map(|i| view(0, 0, 0, if i + 1 == d { 10 } else { 500 })).collect();
        r.route_pair(&req(&PROMPT), &Replicas::new(&prefill), &Replicas::new(&decode))
    };
    let pair = |prefill: usize, decode: usize| PdRoute::Disaggregate { prefill, decode, prefix_from: None };
    let change = |replica, joined, routable| ReplicaChange { at: 1.0, replica, joined, routable };
    // All up: M1 (prefill 1) is decode 0; P (prefill 0) takes D.
    assert_eq!(route(&mut r, 1, 3, 3), pair(1, 0));
    assert_eq!(route(&mut r, 0, 3, 3), pair(0, 2));
    // P crashes: prefill [M1, M2]; M1 is now prefill 0 and still decode 0.
    r.on_pool_change(PdPool::Prefill, &change(0, false, 2));
    assert_eq!(route(&mut r, 0, 2, 3), pair(0, 0));
    // M1 crashes (prefill 0, decode 0): prefill [M2], decode [M2, D]; M2 pairs as 0 with 0.
    r.on_mixed_change(&change(0, false, 1), &change(0, false, 2));
    assert_eq!(route(&mut r, 0, 1, 2), pair(0, 0));
    // M1 restarts at the top of the mixed range (prefill 1, decode 1), P below them (prefill 0).
    r.on_mixed_change(&change(1, true, 2), &change(1, true, 3));
    assert_eq!(route(&mut r, 1, 2, 3), pair(1, 1));
    r.on_pool_change(PdPool::Prefill, &change(0, true, 3));
    assert_eq!(route(&mut r, 2, 3, 3), pair(2, 1));
    assert_eq!(route(&mut r, 0, 3, 3), pair(0, 2));
}
