//! The field's 2026 router changes that are options or new built-ins beside the 2025 rules
//! (issue 24): Dynamo's unfloored credit (PR #11714) and `lmetric` cost (PR #11028),
//! production-stack's `loadaware` (PR #1035) and SGLang's keep-affinity rebalancing (PR #32195).
//! Each decision is computed by hand from the upstream rule (the arithmetic is in the comments).
//! Dynamo's active-request weight is checked against the upstream crate in `testing/dynamo-diff`.

use routelab_policies::dynamo_kv::{self, Cost, DynamoKv};
use routelab_policies::sglang_cache_aware::{self, Imbalanced, SglangCacheAware};
use routelab_policies::vllm_loadaware::{self, VllmLoadAware};
use routelab_policy_api::*;

use crate::common::{ctx, done, make, req, seg};

/// Dynamo on 2 replicas (blocks of 16), nothing awaiting prefill, after three requests to r0:
/// A = 160 tokens (10 blocks), C = 160 fresh tokens (10), D = 64 fresh tokens (4) — r0 holds
/// 24 blocks, all in flight. Returns the router and the costs of B = A + 32 tokens (12 blocks,
/// 10 of them cached on r0).
fn dynamo_after_three(cfg: dynamo_kv::Config) -> (DynamoKv, Vec<f64>) {
    let mut d = DynamoKv::new(cfg, &ctx(2)).unwrap();
    d.on_dispatch(&req(0, 0.0, &[seg(1, 160)]), 0);
    d.on_dispatch(&req(1, 0.0, &[seg(9, 160)]), 0);
    d.on_dispatch(&req(2, 0.0, &[seg(8, 64)]), 0);
    let views = [ReplicaView::default(); 2];
    let costs = d.costs(&req(3, 0.1, &[seg(1, 160), seg(2, 32)]), &Replicas::new(&views)).to_vec();
    (d, costs)
}

#[test]
fn dynamo_without_the_floor_lets_a_credit_above_one_offset_decode_load() {
    // B: prefill 192/16 = 12 blocks everywhere; r0's credit 2 · 10 = 20; r0's decode blocks
    // 24 held + 12 − 10 shared = 26, r1's 0 + 12 = 12.
    // Floored (the crate): r0 max(12 − 20, 0) + 26 = 26, r1 12 + 12 = 24 → r1.
    let floored = dynamo_kv::Config { overlap_score_credit: 2.0, ..Default::default() };
    let (mut d, costs) = dynamo_after_three(floored.clone());
    assert_eq!(costs, [26.0, 24.0]);
    let b = [seg(1, 160), seg(2, 32)];
    let views = [ReplicaView::default(); 2];
    assert_eq!(d.route(&req(3, 0.1, &b), &Replicas::new(&views)), 1);
    // PR #11714: (12 − 20) + 26 = 18 < 24 → r0, the cache wins back the decode load.
    let (mut d, costs) = dynamo_after_three(dynamo_kv::Config { prefill_floor: false, ..floored });
    assert_eq!(costs, [18.0, 24.0]);
    assert_eq!(d.route(&req(3, 0.1, &b), &Replicas::new(&views)), 0);
}

#[test]
fn dynamo_with_a_credit_at_most_one_the_floor_changes_no_cost() {
    // overlap ≤ prompt blocks ≤ prefill blocks, so prefill − credit · overlap ≥ 0 when credit ≤ 1:
    // random prompts sharing prefixes, routed where the floored router says, costs equal.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = |m: u64| {
        x = mix64(x);
        x % m
    };
    for credit in [0.0, 0.5, 1.0] {
        let base = dynamo_kv::Config { overlap_score_credit: credit, ..Default::default() };
        let mut a = DynamoKv::new(base.clone(), &ctx(4)).unwrap();
        let mut b = DynamoKv::new(dynamo_kv::Config { prefill_floor: false, ..base }, &ctx(4)).unwrap();
        let mut nonzero = 0;
        for id in 0..400 {
            // A segment id names its content, so its length is a function of the id.
            let (s0, s1) = (next(3), next(5));
            let prompt = [seg(s0, 37 + 50 * s0 as u32), seg(100 + s1, 40), seg(1000 + id, next(90) as u32)];
            let r = req(id, id as f64, &prompt);
            let views = [ReplicaView { waiting: next(3) as u32, ..Default::default() }; 4];
            let replicas = Replicas::new(&views);
            let ca = a.costs(&r, &replicas).to_vec();
            assert_eq!(ca, b.costs(&r, &replicas), "credit {credit}, request {id}");
            nonzero += usize::from(ca.iter().any(|&c| c > 0.0));
            let pick = a.route(&r, &replicas);
            a.on_dispatch(&r, pick);
            b.on_dispatch(&r, pick);
            if next(3) == 0 {
                let gone = next(id + 1);
                a.on_complete(&done(gone, 0));
                b.on_complete(&done(gone, 0));
            }
        }
        assert!(nonzero > 300, "the costs were not trivially 0");
    }
}

#[test]
fn dynamo_lmetric_multiplies_prefill_by_decode_load() {
    // Credit 1: r0's adjusted prefill 12 − 10 = 2, decode 26; r1's 12 and 12.
    // Linear: r0 2 + 26 = 28, r1 12 + 12 = 24 → r1. LMetric: r0 2 · 27 = 54, r1 12 · 13 = 156 → r0.
    let (_, linear) = dynamo_after_three(Default::default());
    assert_eq!(linear, [28.0, 24.0]);
    let (mut d, lmetric) = dynamo_after_three(dynamo_kv::Config { cost: Cost::Lmetric, ..Default::default() });
    assert_eq!(lmetric, [54.0, 156.0]);
    let views = [ReplicaView::default(); 2];
    assert_eq!(d.route(&req(3, 0.1, &[seg(1, 160), seg(2, 32)]), &Replicas::new(&views)), 0);
}

#[test]
fn dynamo_active_request_weight_counts_requests_until_they_complete() {
    // Weight 2: r0 has 3 requests in flight, +6 → 28 + 6 = 34; r1 24. Completing C and D
    // drops r0 to one request (+2) and to A's 10 held blocks: decode 10 + 12 − 10 = 12,
    // cost 2 + 12 + 2 = 16.
    let (mut d, costs) =
        dynamo_after_three(dynamo_kv::Config { decode_active_request_weight: 2.0, ..Default::default() });
    assert_eq!(costs, [34.0, 24.0]);
    d.on_complete(&done(1, 0));
    d.on_complete(&done(2, 0));
    let views = [ReplicaView::default(); 2];
    assert_eq!(d.costs(&req(3, 0.1, &[seg(1, 160), seg(2, 32)]), &Replicas::new(&views)), [16.0, 24.0]);
}

/// A loadaware router on `n` replicas with `loads[r]` requests dispatched to r (none finished).
fn loadaware(beta: f64, loads: &[u32]) -> VllmLoadAware {
    let cfg = vllm_loadaware::Config { beta, ..Default::default() };
    let mut v = VllmLoadAware::new(cfg, &ctx(loads.len() as u32)).unwrap();
    let mut id = 100;
    for (r, &l) in loads.iter().enumerate() {
        for _ in 0..l {
            v.on_dispatch(&req(id, 0.0, &[seg(id, 10)]), r);
            id += 1;
        }
    }
    v
}

fn matched(m: &[u32]) -> Vec<ReplicaView> {
    m.iter().map(|&matched_tokens| ReplicaView { matched_tokens, ..Default::default() }).collect()
}

#[test]
fn vllm_loadaware_trades_the_cached_fraction_against_load_relative_to_the_mean() {
    // Loads 4, 0, 2: mean 2, relative +1, −1, 0. Prompt 1,000 tokens; matched 1,000 / 0 / 500:
    // benefit 1, 0, 0.5. β 1: scores 0, 1, 0.5 → r1, the cold idle replica beats the warm busy one.
    let prompt = [seg(1, 1000)];
    let views = matched(&[1000, 0, 500]);
    let mut v = loadaware(1.0, &[4, 0, 2]);
    assert_eq!(v.scores(&req(1, 1.0, &prompt), &Replicas::new(&views)), [0.0, 1.0, 0.5]);
    assert_eq!(v.route(&req(1, 1.0, &prompt), &Replicas::new(&views)), 1);
    // β 0.25: 0.75, 0.25, 0.5 → r0 keeps the request.
    let mut v = loadaware(0.25, &[4, 0, 2]);
    assert_eq!(v.route(&req(1, 1.0, &prompt), &Replicas::new(&views)), 0);
    // A completion on r0 brings it to 3: mean 5/3, relative (3 − 5/3)/(5/3) = 0.8; β 1 scores
    // 0.2, 0 − (−1) = 1, 0.5 − 0.2 = 0.3 → still r1.
    let mut v = loadaware(1.0, &[4, 0, 2]);
    v.on_complete(&done(100, 0));
    assert_eq!(v.route(&req(1, 1.0, &prompt), &Replicas::new(&views)), 1);
}

#[test]
fn vllm_loadaware_clamps_the_mean_so_an_idle_fleet_keeps_its_cache() {
    // Loads 1, 0, 0, 0: mean 0.25 clamped to 1, relative 0.75, −0.25 ×3; r0 holds the whole
    // prompt: scores 1 − 0.75 = 0.25 and 0.25 — a tie, the first (r0) wins. Unclamped, r0
    // would read 3× the mean (1 − 3 = −2) and lose to every cold replica (+1).
    let prompt = [seg(1, 64)];
    let views = matched(&[64, 0, 0, 0]);
    let mut v = loadaware(1.0, &[1, 0, 0, 0]);
    assert_eq!(v.scores(&req(1, 1.0, &prompt), &Replicas::new(&views)), [0.25, 0.25, 0.25, 0.25]);
    assert_eq!(v.route(&req(1, 1.0, &prompt), &Replicas::new(&views)), 0);
    // A match longer than the prompt counts as a full hit, no more.
    let views = matched(&[0, 0, 0, 90]);
    let s = v.scores(&req(1, 1.0, &prompt), &Replicas::new(&views)).to_vec();
    assert_eq!(s[3], 1.25);
}

#[test]
fn vllm_loadaware_without_any_holder_falls_back_to_the_lowest_request_rate() {
    // No replica holds any token: production-stack's QPS route — a replica never routed to
    // first, then the fewest requests over the last 60 s, the first on ties.
    let mut v = VllmLoadAware::new(Default::default(), &ctx(3)).unwrap();
    let views = matched(&[0, 0, 0]);
    let route_at = |v: &mut VllmLoadAware, id: u64, at: f64| {
        let r = v.route(&req(id, at, &[seg(id, 10)]), &Replicas::new(&views));
        v.on_dispatch(&req(id, at, &[seg(id, 10)]), r);
        r
    };
    assert_eq!([route_at(&mut v, 1, 0.0), route_at(&mut v, 2, 0.0), route_at(&mut v, 3, 0.0)], [0, 1, 2]);
    // All three at one request: r0 (first). Then r1 and r2 (r0 has 2).
    assert_eq!(route_at(&mut v, 4, 1.0), 0);
    assert_eq!(route_at(&mut v, 5, 2.0), 1);
    // At 60.5 s the requests of time 0 left the window: r0 1 (t = 1), r1 1, r2 0 → r2.
    assert_eq!(route_at(&mut v, 6, 60.5), 2);
    let report = v.report();
    assert!(report.contains(&("fallback_decisions".into(), 6.0)), "{report:?}");
}

#[test]
fn vllm_loadaware_makes_the_decisions_of_upstreams_unit_tests() {
    // production-stack `src/tests/test_loadaware_router.py` @ 9f2a0598, URL_A = r0, URL_B = r1,
    // PROMPT_TOKENS 2,048.
    let prompt = [seg(1, 2048)];
    let r = req(1, 1.0, &prompt);
    // test_warm_but_loaded_loses_to_cold_but_idle: A holds all 2,048 with 4 + 8 in flight, B
    // idle: mean 6, relative ±1; A 1 − 1 = 0, B 0 + 1 = 1 → B. And
    // test_warm_but_loaded_wins_when_beta_is_small (β 0.01) → A.
    let views = matched(&[2048, 0]);
    assert_eq!(loadaware(1.0, &[12, 0]).route(&r, &Replicas::new(&views)), 1);
    assert_eq!(loadaware(0.01, &[12, 0]).route(&r, &Replicas::new(&views)), 0);
    // test_beta_zero_is_cache_only_placement: A at 100 in flight still wins at β 0.
    assert_eq!(loadaware(0.0, &[100, 0]).route(&r, &Replicas::new(&views)), 0);
    // test_the_same_beta_is_the_same_policy_at_ten_times_the_load: β 0.5, loads 4/1 and
    // 400/100 read the same relative loads ±0.6: A 1 − 0.3 = 0.7 beats B 0.3 in both.
    let small = loadaware(0.5, &[4, 1]).scores(&r, &Replicas::new(&views)).to_vec();
    let large = loadaware(0.5, &[400, 100]).scores(&r, &Replicas::new(&views)).to_vec();
    assert!(small.iter().zip(&large).all(|(a, b)| (a - b).abs() < 1e-12), "{small:?} {large:?}");
    assert!((small[0] - 0.7).abs() < 1e-12 && (small[1] - 0.3).abs() < 1e-12, "{small:?}");
    // test_equally_idle_picks_the_warmest_instance: no load, 512 vs 2,048 cached → B.
    let views = matched(&[512, 2048]);
    assert_eq!(loadaware(0.1, &[0, 0]).route(&r, &Replicas::new(&views)), 1);
    // test_ties_are_broken_by_url_for_reproducibility: 1,024 each → A.
    let views = matched(&[1024, 1024]);
    assert_eq!(loadaware(1.0, &[0, 0]).route(&r, &Replicas::new(&views)), 0);
    // test_a_near_idle_fleet_reports_no_imbalance_to_act_on: loads 1/0, mean 0.5 clamped to 1:
    // relative +0.5 / −0.5, so with equal matches the scores are 0.5 apart, not 2.
    let views = matched(&[1024, 1024]);
    let s = loadaware(1.0, &[1, 0]).scores(&r, &Replicas::new(&views)).to_vec();
    assert_eq!(s, [0.0, 1.0]);
}

/// SGLang with abs 2, rel 1.5 on 3 replicas after a prompt P = 100 tokens went to r1 and r0
/// (whose load is the highest): loads r0 10, r1 `r1_load`, r2 0 — imbalanced (10 − 0 > 2 and
/// 10 > 0). Returns the pick for P + 20 tokens.
fn sglang_pick(imbalanced: Imbalanced, r1_load: u32) -> usize {
    let cfg = sglang_cache_aware::Config { balance_abs_threshold: 2, imbalanced, ..Default::default() };
    let mut s = SglangCacheAware::new(cfg, &ctx(3)).unwrap();
    let p = [seg(1, 100)];
    s.on_dispatch(&req(0, 0.0, &p), 1);
    s.on_dispatch(&req(1, 0.0, &p), 0);
    for i in 0..9 {
        s.on_dispatch(&req(10 + i, 0.0, &[seg(10 + i, 50)]), 0);
    }
    for i in 1..r1_load {
        s.on_dispatch(&req(30 + i as u64, 0.0, &[seg(30 + i as u64, 50)]), 1);
    }
    let views = [ReplicaView::default(); 3];
    s.route(&req(99, 1.0, &[seg(1, 100), seg(5, 20)]), &Replicas::new(&views))
}

#[test]
fn sglang_keep_affinity_keeps_the_longest_match_within_the_near_least_loaded_window() {
    // The window is load ≤ 0 + 2: r1 (load 2, holds P's 100 tokens) and r2 (load 0, nothing).
    // SGLang's rule drops locality: r2. PR #32195 keeps it: r1. r0 holds P too but is outside.
    assert_eq!(sglang_pick(Imbalanced::LeastLoad, 2), 2);
    assert_eq!(sglang_pick(Imbalanced::KeepAffinity, 2), 1);
    // r1 at load 3 leaves the window; r2 holds nothing: the shortest queue, r2, as before.
    assert_eq!(sglang_pick(Imbalanced::KeepAffinity, 3), 2);
}

#[test]
fn sglang_keep_affinity_breaks_equal_matches_toward_the_lighter_replica() {
    // P went to r1 (then one more request: load 2) and to r2 (load 1); r0 carries 10, r3 0.
    let cfg = sglang_cache_aware::Config {
        balance_abs_threshold: 2,
        imbalanced: Imbalanced::KeepAffinity,
        ..Default::default()
    };
    let mut s = SglangCacheAware::new(cfg, &ctx(4)).unwrap();
    let p = [seg(1, 100)];
    s.on_dispatch(&req(0, 0.0, &p), 1);
    s.on_dispatch(&req(1, 0.0, &[seg(2, 50)]), 1);
    s.on_dispatch(&req(2, 0.0, &p), 2);
    for i in 0..10 {
        s.on_dispatch(&req(10 + i, 0.0, &[seg(10 + i, 50)]), 0);
    }
    let views = [ReplicaView::default(); 4];
    // Loads 10, 2, 1, 0: imbalanced; window ≤ 2 = r1, r2, r3; matches 100, 100, 0 → r2.
    assert_eq!(s.route(&req(99, 1.0, &[seg(1, 100), seg(5, 20)]), &Replicas::new(&views)), 2);
    assert!(s.report().contains(&("kept_affinity_decisions".into(), 1.0)));
}

#[test]
fn the_2026_options_are_validated_with_clear_errors() {
    make("vllm_loadaware", "").unwrap();
    make("vllm_loadaware", "{beta: 0, qps_window_s: 30}").unwrap();
    make("dynamo_kv", "{cost: lmetric}").unwrap();
    make("dynamo_kv", "{prefill_floor: false, overlap_score_credit: 2, decode_active_request_weight: 64}").unwrap();
    make("sglang_cache_aware", "{imbalanced: keep_affinity}").unwrap();
    let cases = [
        ("vllm_loadaware", "{beta: -1}", "beta must be a finite number ≥ 0"),
        ("vllm_loadaware", "{qps_window_s: 0}", "qps_window_s must be positive"),
        ("vllm_loadaware", "{alpha: 1}", "unknown field `alpha`"),
        ("dynamo_kv", "{cost: lmetric, role: decode}", "cost: lmetric does not combine with role: decode"),
        ("dynamo_kv", "{cost: lmetric, prefill_floor: false}", "does not combine with prefill_floor: false"),
        ("dynamo_kv", "{cost: lmetric, prefill_load_scale: 2}", "does not combine with prefill_load_scale"),
        ("dynamo_kv", "{cost: lmetric, decode_active_request_weight: 1}", "decode_active_request_weight ≠ 0"),
        ("dynamo_kv", "{decode_active_request_weight: -1}", "decode_active_request_weight must be a finite number"),
        ("dynamo_kv", "{cost: quadratic}", "unknown variant `quadratic`"),
        ("sglang_cache_aware", "{imbalanced: sometimes}", "unknown variant `sometimes`"),
    ];
    for (name, yaml, want) in cases {
        let e = make(name, yaml).unwrap_err();
        assert!(e.contains(name) && e.contains(want), "{name}{yaml}: {e}");
    }
}
