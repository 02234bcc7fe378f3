//! The field's routers as of 2026 (issue 24): hand-computed decisions from each upstream rule
//! (the arithmetic is in the comments), and their config validation.

use abi_stable::std_types::RSome;
use routelab_policies::{
    llm_d, llm_d::LlmD, llm_d_predicted_latency, llm_d_predicted_latency::LlmDPredictedLatency, llm_d_sticky,
    llm_d_sticky::LlmDSticky,
};
use routelab_policy_api::facts::context::ENGINE_MAX_STEP_TOKENS;
use routelab_policy_api::*;

use crate::common::{ctx, make, req, seg};

fn waiting(w: [u32; 3]) -> [ReplicaView; 3] {
    w.map(|waiting| ReplicaView { waiting, ..Default::default() })
}

/// A sticky router with peak prefill 1,000 tokens/s and the given penalty and threshold, after
/// A = 128 tokens (8 blocks) and then D = 400 fresh tokens to r0, C = 320 fresh tokens to r1.
fn sticky_setup(penalty_s: f64, threshold: f64) -> LlmDSticky {
    let cfg = llm_d_sticky::Config {
        peak_prefill_tokens_per_s: llm_d_sticky::PeakPrefill::TokensPerS(1000.0),
        max_ttft_penalty_s: penalty_s,
        affinity_threshold: threshold,
        ..Default::default()
    };
    let mut s = LlmDSticky::new(cfg, &ctx(3)).unwrap();
    s.on_dispatch(&req(0, 0.0, &[seg(1, 128)]), 0); // uncached 8·16 = 128
    s.on_dispatch(&req(1, 0.0, &[seg(7, 400)]), 0); // 25 blocks, uncached 400
    s.on_dispatch(&req(2, 0.0, &[seg(9, 320)]), 1); // 20 blocks, uncached 320
    s
}

#[test]
fn llm_d_sticky_keeps_the_cached_replica_until_its_ttft_penalty_passes_the_bound() {
    // B = A's 128 tokens + 32 new = 10 blocks; r0 holds 8: prefix score 0.8 ≥ 0.8, sticky.
    // B's uncached tokens: r0 (10 − 8)·16 = 32, r1 and r2 10·16 = 160.
    let b = [seg(1, 128), seg(2, 32)];
    let q = 4_194_304.0;
    // All three requests still owe their first token (waiting 2 on r0, 1 on r1):
    // in flight r0 128 + 400 = 528, r1 320, r2 0; loads with B: r0 560, r1 480, r2 160.
    let views = waiting([2, 1, 0]);
    // Filter off (threshold 0): token load alone, 1 − load / 4,194,304 → r2.
    let mut s = sticky_setup(1.0, 0.0);
    let got = s.scores(&req(3, 0.1, &b), &Replicas::new(&views)).to_vec();
    assert_eq!(got, vec![1.0 - 560.0 / q, 1.0 - 480.0 / q, 1.0 - 160.0 / q]);
    assert_eq!(s.route(&req(3, 0.1, &b), &Replicas::new(&views)), 2);
    // Default threshold 0.8, penalty 1 s: sticky TTFT 528 / 1000 = 0.528 s, best other 0 s;
    // 0.528 ≤ 1 keeps only r0, although it carries the most load.
    let mut s = sticky_setup(1.0, 0.8);
    let got = s.scores(&req(3, 0.1, &b), &Replicas::new(&views)).to_vec();
    assert_eq!(got, vec![1.0 - 560.0 / q, f64::NEG_INFINITY, f64::NEG_INFINITY]);
    assert_eq!(s.route(&req(3, 0.1, &b), &Replicas::new(&views)), 0);
    assert_eq!(s.tau_tokens(), 1000.0);
    // Penalty 0.5 s (τ = 500 tokens): 0.528 − 0 > 0.5 opens the gate → all kept → r2.
    let mut s = sticky_setup(0.5, 0.8);
    assert_eq!(s.route(&req(3, 0.1, &b), &Replicas::new(&views)), 2);
    // Penalty 0 always sticks.
    let mut s = sticky_setup(0.0, 0.8);
    assert_eq!(s.route(&req(3, 0.1, &b), &Replicas::new(&views)), 0);
    // Only D (the newest on r0) still owes its first token: r0 in flight 400, 0.4 ≤ 0.5 → r0.
    let mut s = sticky_setup(0.5, 0.8);
    assert_eq!(s.route(&req(3, 0.1, &b), &Replicas::new(&waiting([1, 1, 0]))), 0);
    // The same two pending on r0 counted as one waiting plus one admitted in prefill (the
    // `prefilling` signal): 528 again, the gate opens.
    let mut s = sticky_setup(0.5, 0.8);
    let table = [1.0, 0.0, 0.0];
    let views = waiting([1, 1, 0]);
    let replicas = Replicas::with_signals(&views, &table, 1);
    assert_eq!(s.route(&req(3, 0.1, &b), &replicas), 2);
}

#[test]
fn llm_d_sticky_without_a_sticky_replica_keeps_all_and_the_gate_compares_with_the_best_other() {
    // B2 = A's 128 tokens + 48 new = 11 blocks: r0 holds 8, 8/11 = 0.727 < 0.8 → nobody
    // sticky → all kept; loads r0 528 + 48 = 576, r1 320 + 176 = 496, r2 176 → r2.
    let b2 = [seg(1, 128), seg(2, 48)];
    let mut s = sticky_setup(100.0, 0.8);
    assert_eq!(s.route(&req(3, 0.1, &b2), &Replicas::new(&waiting([2, 1, 0]))), 2);
    // At threshold 0.7 r0 is sticky: penalty 0.2 s, r0 0.528 s vs the best other (r2, 0 s):
    // 0.528 > 0.2 opens the gate → r2. The gate compares with the *best* other replica: with
    // 400 pending tokens on r2 that is r1 at 0.32 s, and 0.528 − 0.32 = 0.208 holds at penalty
    // 0.21 (→ r0) and opens at 0.2.
    let mut s = sticky_setup(0.2, 0.7);
    assert_eq!(s.route(&req(3, 0.1, &b2), &Replicas::new(&waiting([2, 1, 0]))), 2);
    let mut s = sticky_setup(0.21, 0.7);
    s.on_dispatch(&req(4, 0.0, &[seg(11, 400)]), 2);
    assert_eq!(s.route(&req(3, 0.1, &b2), &Replicas::new(&waiting([2, 1, 1]))), 0);
    let mut s = sticky_setup(0.2, 0.7);
    s.on_dispatch(&req(4, 0.0, &[seg(11, 400)]), 2);
    // Gate open, all kept: loads r0 576, r1 496, r2 400 + 176 = 576 → r1.
    assert_eq!(s.route(&req(3, 0.1, &b2), &Replicas::new(&waiting([2, 1, 1]))), 1);
}

#[test]
fn llm_d_sticky_measures_the_peak_prefill_throughput_with_the_hosts_pricer() {
    // A compute-bound roofline: 2·10⁹ FLOPs per token at 10¹⁵ FLOP/s, nothing else. One unloaded
    // chunk of 8,192 tokens takes 8192 · 2·10⁹ / 10¹⁵ = 0.016384 s: 500,000 tokens/s, and with
    // upstream's 18 s penalty τ = 9,000,000 tokens.
    let roofline = Roofline {
        flops_per_s: 1e15,
        bytes_per_s: 1e30,
        linear_flops_per_token: 2e9,
        attention_flops_per_pair: 0.0,
        weight_bytes: 0.0,
        kv_bytes_per_token: 0.0,
        step_overhead_s: 0.0,
    };
    let mut c = ctx(3);
    c.cost = RSome(CostModel::roofline(roofline));
    c.facts = vec![Fact::new(ENGINE_MAX_STEP_TOKENS, 8192.0)].into();
    assert!((llm_d_sticky::peak_prefill_tokens_per_s(&c).unwrap() - 500_000.0).abs() < 1e-6);
    let s = LlmDSticky::new(Default::default(), &c).unwrap();
    assert!((s.tau_tokens() - 9_000_000.0).abs() < 1e-3, "{}", s.tau_tokens());
    // Without the step-budget fact (or a pricer): upstream's default peak, 15,928 tokens/s.
    c.facts = Default::default();
    assert_eq!(llm_d_sticky::peak_prefill_tokens_per_s(&c), None);
    assert_eq!(LlmDSticky::new(Default::default(), &c).unwrap().tau_tokens(), 15_928.0 * 18.0);
}

#[test]
fn llm_d_no_hit_lru_sends_cold_requests_to_the_least_recently_cold_replica() {
    // Prefix 2, no-hit-lru 1 (upstream's sample config), no load scorers.
    let cfg = llm_d::Config {
        queue_weight: 0.0,
        kv_cache_weight: 0.0,
        prefix_weight: 2.0,
        no_hit_lru_weight: 1.0,
        ..Default::default()
    };
    let mut l = LlmD::new(cfg, &ctx(3)).unwrap();
    let views = [ReplicaView::default(); 3];
    let go = |l: &mut LlmD, id: u64, segs: &[Segment]| {
        let s = l.scores(&req(id, 0.0, segs), &views).to_vec();
        let r = l.route(&req(id, 0.0, segs), &Replicas::new(&views));
        l.on_dispatch(&req(id, 0.0, segs), r);
        (s, r)
    };
    // Cold requests, nothing used yet: never-used replicas in index order score 1 − k/2.
    assert_eq!(go(&mut l, 0, &[seg(1, 64)]), (vec![1.0, 0.5, 0.0], 0));
    // r0 took a cold request: the never-used r1, r2 rank first, r0 last.
    assert_eq!(go(&mut l, 1, &[seg(2, 64)]), (vec![0.0, 1.0, 0.5], 1));
    assert_eq!(go(&mut l, 2, &[seg(3, 64)]), (vec![0.5, 0.0, 1.0], 2));
    // All used: LRU order r0, r1, r2.
    assert_eq!(go(&mut l, 3, &[seg(4, 64)]), (vec![1.0, 0.5, 0.0], 0));
    // Warm (r0 holds 4 of 6 blocks): prefix 2·4/6 on r0, 0.5 everywhere; the LRU does not move.
    let (s, r) = go(&mut l, 4, &[seg(1, 64), seg(5, 32)]);
    assert_eq!(r, 0);
    assert!((s[0] - (0.5 + 8.0 / 6.0)).abs() < 1e-12 && s[1] == 0.5 && s[2] == 0.5, "{s:?}");
    // The LRU is r1, r2, r0 (request 3 moved r0 last; request 4 was warm).
    assert_eq!(go(&mut l, 5, &[seg(6, 64)]), (vec![0.0, 1.0, 0.5], 1));
}

#[test]
fn llm_d_length_aware_prefix_score_weighs_the_matched_length() {
    // r0 holds a short prompt (32 tokens, 2 blocks), r1 a long one (256 tokens, 16 blocks).
    let mk = |w: f64| {
        let cfg = llm_d::Config {
            queue_weight: 0.0,
            kv_cache_weight: 0.0,
            prefix_weight: 1.0,
            match_length_weight: w,
            match_length_scale_tokens: 128,
            ..Default::default()
        };
        let mut l = LlmD::new(cfg, &ctx(2)).unwrap();
        l.on_dispatch(&req(0, 0.0, &[seg(1, 32)]), 0);
        l.on_dispatch(&req(1, 0.0, &[seg(2, 256)]), 1);
        l
    };
    let views = [ReplicaView::default(); 2];
    let short_hit = [seg(1, 32)]; // r0: 2 of 2 blocks
    let half_long = [seg(2, 256), seg(4, 256)]; // r1: 16 of 32 blocks
    // Ratio only (w = 0): the short prompt's full hit scores 1, the long half hit 0.5.
    let mut l = mk(0.0);
    assert_eq!(l.scores(&req(2, 0.1, &short_hit), &views), &[1.0, 0.0]);
    assert_eq!(l.scores(&req(3, 0.1, &half_long), &views), &[0.0, 0.5]);
    // w = 0.5, scale 128: short hit 0.5·(32/128)² + 0.5·1 = 0.53125; long half hit
    // 0.5·min(1, 256/128)² + 0.5·0.5 = 0.75 — the long match now outranks the short one.
    let mut l = mk(0.5);
    assert_eq!(l.scores(&req(2, 0.1, &short_hit), &views), &[0.53125, 0.0]);
    assert_eq!(l.scores(&req(3, 0.1, &half_long), &views), &[0.0, 0.75]);
}

#[test]
fn online_ridge_matches_the_closed_form() {
    // One sample x = (1, 1, 0, …), y = 3 at ridge 1: w = x·y / (1 + |x|²) = (1, 1, 0, …).
    let mut m = llm_d_predicted_latency::OnlineRidge::new(1.0);
    let mut x = [0.0; llm_d_predicted_latency::FEATURES];
    x[0] = 1.0;
    x[1] = 1.0;
    m.update(&x, 3.0);
    assert!((m.predict(&x) - 2.0).abs() < 1e-12);
    // Exactly linear data in every direction and a negligible ridge: the fit is the function.
    let f = |x: &[f64; 8]| 0.5 + x.iter().skip(1).enumerate().map(|(i, v)| (i as f64 - 3.0) * v).sum::<f64>();
    let mut m = llm_d_predicted_latency::OnlineRidge::new(1e-9);
    for k in 0..64u64 {
        let mut x = [1.0; 8];
        for (i, v) in x.iter_mut().enumerate().skip(1) {
            *v = ((k * 7 + i as u64 * 13) % 11) as f64 / 3.0 + (k % (i as u64 + 1)) as f64;
        }
        m.update(&x, f(&x));
    }
    let probe = [1.0, 0.3, 2.0, 5.0, 1.0, 0.7, 4.0, 1.5];
    assert!((m.predict(&probe) - f(&probe)).abs() < 1e-6, "{} vs {}", m.predict(&probe), f(&probe));
}

#[test]
fn llm_d_predicted_latency_sticks_and_falls_back_to_the_composite_before_the_model_is_ready() {
    let views = [
        ReplicaView { waiting: 4, kv_used_tokens: 50, kv_capacity_tokens: 100, ..Default::default() },
        ReplicaView { waiting: 0, kv_used_tokens: 20, kv_capacity_tokens: 100, ..Default::default() },
    ];
    let mut p = LlmDPredictedLatency::new(Default::default(), &ctx(2)).unwrap();
    // Composite (KV free + relative queue + prefix) / 3, in hundredths: r0 (0.5 + 0 + 0)/3 → 0.17,
    // r1 (0.8 + 1 + 0)/3 = 0.6.
    assert_eq!(p.scores(&req(0, 0.0, &[seg(1, 64)]), &Replicas::new(&views)), &[0.17, 0.6]);
    p.on_dispatch(&req(0, 0.0, &[seg(1, 64)]), 0);
    // r0 now holds the whole prompt (prefix 1 ≥ 0.99): without predictions both TTFTs count as
    // f64::MAX, the gate never opens, and only r0 is scored ((0.5 + 0 + 1)/3 = 0.5).
    assert_eq!(p.scores(&req(1, 0.1, &[seg(1, 64)]), &Replicas::new(&views)), &[0.5, 0.0]);
    assert_eq!(p.route(&req(1, 0.1, &[seg(1, 64)]), &Replicas::new(&views)), 0);
}

#[test]
fn llm_d_predicted_latency_prefers_the_lower_predicted_ttft_and_the_slo_tier() {
    let busy = |kv: u64| ReplicaView {
        kv_used_tokens: kv,
        kv_capacity_tokens: 100,
        outstanding_requests: 1,
        running: 0,
        ..Default::default()
    };
    let mk = |cfg: llm_d_predicted_latency::Config| {
        let mut p =
            LlmDPredictedLatency::new(llm_d_predicted_latency::Config { min_samples: 1, ..cfg }, &ctx(2)).unwrap();
        // Train on one completion: request 0 (1,000 tokens: 62 full blocks + an 8-token tail =
        // 63 hashed blocks, 1,008 uncached) on r0 at KV 0.5, TTFT 3 s, one output token (no
        // TPOT sample). x0 = (1, 0.5, 1.0, 0, 0, 0, 0, 1.008), |x0|² = 3.266064.
        let views = [busy(50), busy(0)];
        p.scores(&req(0, 0.0, &[seg(1, 1000)]), &Replicas::new(&views));
        p.on_dispatch(&req(0, 0.0, &[seg(1, 1000)]), 0);
        p.on_complete(&Completion {
            request_id: 0,
            replica: 0,
            arrived_at: 0.0,
            completed_at: 3.0,
            ttft: 3.0,
            prompt_tokens: 1000,
            cached_tokens: 0,
            output_tokens: 1,
        });
        p
    };
    // w = x0 · 3 / (1 + 3.266064). A fresh 1,000-token prompt: r0 (KV 0.5) has x = x0,
    // predicted 3 · 3.266064 / 4.266064 = 2.2968; r1 (KV 0) 3 · 3.016064 / 4.266064 = 2.1210.
    // TPOT predicted 0. No SLO: TTFT headroom < 0, TPOT headroom 0 → both in the "TTFT only"
    // bucket, nobody idle; TTFT |h| normalised r0 1, r1 0, flat TPOT gives α = 1:
    // scores (⌊0·100⌋ + 1)/100 = 0.01 and (⌊1·100⌋ + 1)/100 = 1.01.
    let views = [busy(50), busy(0)];
    let fresh = [seg(2, 1000)];
    let mut p = mk(Default::default());
    assert_eq!(p.scores(&req(1, 1.0, &fresh), &Replicas::new(&views)), &[0.01, 1.01]);
    // Weighted random: r0 wins with probability 0.01 / 1.02 ≈ 1%.
    let r1 = (0..200).filter(|_| p.route(&req(1, 1.0, &fresh), &Replicas::new(&views)) == 1).count();
    assert!(r1 >= 190, "{r1} of 200");
    // An idle replica is preferred over any prediction when all headroom is negative.
    let idle = [busy(50), ReplicaView { outstanding_requests: 0, ..busy(50) }];
    assert_eq!(p.scores(&req(1, 1.0, &fresh), &Replicas::new(&idle)), &[0.0, 0.51]);
    // TTFT SLO 2.2 s: r1 meets it (headroom +0.079), r0 does not. ε 0 keeps the positive tier
    // (flat range: 0.51); ε 1 the negative one.
    let slo = |eps: f64| llm_d_predicted_latency::Config {
        ttft_slo_s: Some(2.2),
        epsilon_explore_neg: eps,
        ..Default::default()
    };
    assert_eq!(mk(slo(0.0)).scores(&req(1, 1.0, &fresh), &Replicas::new(&views)), &[0.0, 0.51]);
    assert_eq!(mk(slo(1.0)).scores(&req(1, 1.0, &fresh), &Replicas::new(&views)), &[0.51, 0.0]);
}

/// Routes 100 requests that share a 48-token system prompt (3 blocks) and add 16 tokens of their
/// own (a 4th block) over 4 replicas, nothing completing: each decision adds one waiting request
/// where it went. Returns the requests per replica.
fn short_prompt_counts(cfg: llm_d::Config) -> Vec<u32> {
    let mut l = LlmD::new(cfg, &ctx(4)).unwrap();
    let mut views = [ReplicaView::default(); 4];
    let mut counts = vec![0; 4];
    for id in 0..100u64 {
        let segs = [seg(1, 48), seg(100 + id, 16)];
        let r = l.route(&req(id, id as f64, &segs), &Replicas::new(&views));
        l.on_dispatch(&req(id, id as f64, &segs), r);
        views[r].waiting += 1;
        counts[r] += 1;
    }
    counts
}

#[test]
fn llm_d_short_prompts_are_a_hot_spot_under_the_match_ratio_and_not_under_the_length_aware_score() {
    // GIE #2561. Default weights (queue 2, KV 2, prefix 3), KV idle everywhere. The replica that
    // took the first request holds 3 of the next prompt's 4 blocks: prefix 3 · 0.75 = 2.25. The
    // queue score is min-max normalised, so it separates two replicas by at most 2 < 2.25: the
    // holder wins every later request however long its queue — all 100 on one replica.
    let counts = short_prompt_counts(Default::default());
    assert_eq!(counts.iter().max(), Some(&100), "{counts:?}");
    // Length-aware (w 0.5, scale 8,192): the holder's prefix term is
    // 3 · (0.5 · (48/8192)² + 0.5 · 0.75) = 1.125 < 2, so the shortest queue wins; once every
    // replica holds the prefix the prefix terms are equal and the queue term alone rotates the
    // requests: 25 each, give or take the one in flight.
    let counts = short_prompt_counts(llm_d::Config { match_length_weight: 0.5, ..Default::default() });
    assert!(counts.iter().all(|&c| (24..=26).contains(&c)), "{counts:?}");
}

#[test]
fn field_2026_router_configs_are_validated_with_clear_errors() {
    for name in ["llm_d_sticky", "llm_d_predicted_latency"] {
        make(name, "").unwrap_or_else(|e| panic!("{name} defaults: {e}"));
        let e = make(name, "{no_such_field: 1}").unwrap_err();
        assert!(e.contains(name) && e.contains("unknown field `no_such_field`"), "{e}");
    }
    let cases = [
        ("llm_d_sticky", "{affinity_threshold: 1.5}", "affinity_threshold must be ≤ 1"),
        ("llm_d_sticky", "{exploration_probability: 2}", "exploration_probability must be in [0, 1]"),
        ("llm_d_sticky", "{max_ttft_penalty_s: -1}", "max_ttft_penalty_s must be"),
        ("llm_d_sticky", "{peak_prefill_tokens_per_s: 0}", "peak_prefill_tokens_per_s must be positive"),
        ("llm_d_sticky", "{queue_threshold_tokens: 0}", "queue_threshold_tokens must be at least 1"),
        ("llm_d_sticky", "{block_tokens: 0}", "block_tokens must be at least 1"),
        ("llm_d_sticky", "{lru_capacity: 0}", "lru_capacity must be at least 1"),
        ("llm_d_predicted_latency", "{ttft_slo_s: 0}", "ttft_slo_s must be positive"),
        ("llm_d_predicted_latency", "{epsilon_explore_neg: 2}", "epsilon_explore_neg must be in [0, 1]"),
        ("llm_d_predicted_latency", "{ridge: 0}", "ridge must be positive"),
        ("llm_d_predicted_latency", "{tpot_weight: -1}", "tpot_weight must be"),
        ("llm_d", "{match_length_weight: 1.5}", "match_length_weight must be in [0, 1]"),
        ("llm_d", "{match_length_scale_tokens: 0}", "match_length_scale_tokens must be at least 1"),
        ("llm_d", "{no_hit_lru_weight: -1}", "no_hit_lru_weight must be"),
        ("llm_d", "{no_hit_lru_size: 0}", "no_hit_lru_size must be at least 1"),
    ];
    for (name, yaml, want) in cases {
        let e = make(name, yaml).unwrap_err();
        assert!(e.contains(name) && e.contains(want), "{name}{yaml}: {e}");
    }
    // Every knob named in the doc block parses.
    make(
        "llm_d_sticky",
        "{affinity_threshold: 0.99, exploration_probability: 0.01, max_ttft_penalty_s: 5, \
         peak_prefill_tokens_per_s: 20480, queue_threshold_tokens: 100000, prefix_state: precise, \
         lru_capacity: 5000, max_prefix_blocks: 64}",
    )
    .unwrap();
    make("llm_d_sticky", "{peak_prefill_tokens_per_s: auto}").unwrap();
    make(
        "llm_d",
        "{no_hit_lru_weight: 1, no_hit_lru_size: 64, match_length_weight: 0.3, match_length_scale_tokens: 4096}",
    )
    .unwrap();
}
