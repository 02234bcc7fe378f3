//! llm-d's "sticky until saturated" pieces against upstream's own unit tests: each case below is
//! a case of llm-d/llm-d-router @ ebab687927f5331c1b39defcb579a07951bce56c, rebuilt on
//! `llm_d_sticky`'s state (its prefix index and in-flight load come from dispatches here, where
//! upstream's tests set the endpoint attributes directly), with upstream's expected decision:
//! - `pkg/epp/framework/plugins/scheduling/filter/prefixcacheaffinity/plugin_test.go`:
//!   `TestFilter_NoStickyEndpoints`, `TestFilter_ThroughputTTFTBreaksStickiness`,
//!   `TestFilter_ThroughputTTFTWithinThreshold`, `TestFilter_TTFTPenaltyDisabled`,
//!   `TestFilter_AffinityThresholdDisabled` (prefix match `k` of 100 blocks of 16 tokens; TTFT =
//!   in-flight tokens / peak prefill throughput);
//! - `pkg/epp/framework/plugins/scheduling/scorer/tokenload/token_load_test.go`:
//!   `TestTokenLoadScorer` ("in-flight load only", "in-flight load plus current request impact",
//!   threshold 1,000 tokens);
//! - `pkg/epp/framework/plugins/scheduling/scorer/prefix/plugin_test.go`: `TestPrefixPluginScore`
//!   and `TestPrefixPluginScoreWithWeights` (the length-aware score of `llm_d{match_length_weight}`;
//!   upstream's blocks of 1 token are blocks of 16 here, its scale of 100 tokens 1,600).
//!
//! The no-hit-lru scorer's upstream cases (`scorer/nohitlru/no_hit_lru_test.go`: cold scores 1,
//! 0.5, 0 over never-used endpoints, 0.5 everywhere on a hit, the LRU rotation after cold
//! requests) are the ones `field_routers_2026.rs` pins for `llm_d{no_hit_lru_weight}`.

use routelab_policies::llm_d::{self, LlmD};
use routelab_policies::llm_d_sticky::{self, LlmDSticky};
use routelab_policy_api::*;

use crate::common::{ctx, req, seg};

/// A sticky router on `n` replicas with a peak prefill of 1,000 tokens/s (upstream's tests'
/// `PeakPrefillThroughput: 1000`), the given threshold, penalty and token-load threshold.
fn sticky(n: u32, threshold: f64, penalty_s: f64, queue_threshold_tokens: u64) -> LlmDSticky {
    let cfg = llm_d_sticky::Config {
        affinity_threshold: threshold,
        max_ttft_penalty_s: penalty_s,
        peak_prefill_tokens_per_s: llm_d_sticky::PeakPrefill::TokensPerS(1000.0),
        queue_threshold_tokens,
        ..Default::default()
    };
    LlmDSticky::new(cfg, &ctx(n)).unwrap()
}

/// The prompt of upstream's filter tests: 100 blocks of 16 tokens, whose first `k` blocks a
/// replica holds after it was sent `seg(1, 16·k)`.
const PROMPT: [Segment; 2] = [Segment { id: 1, tokens: 1440 }, Segment { id: 2, tokens: 160 }];

/// Replica `r` made to hold the prompt's first `matched` blocks and to carry `inflight` tokens
/// (one fresh request, still owing its first token: `waiting` 1).
fn endpoint(s: &mut LlmDSticky, r: usize, matched: u32, inflight: u32, next_id: &mut u64) {
    if matched > 0 {
        s.on_dispatch(&req(*next_id, 0.0, &[seg(1, 16 * matched)]), r);
        *next_id += 1;
    }
    if inflight > 0 {
        s.on_dispatch(&req(*next_id, 0.0, &[seg(1000 + *next_id, inflight)]), r);
        *next_id += 1;
    }
}

/// Which replicas the filter keeps for [`PROMPT`] (a kept replica has a finite score), with
/// replica `r` set up as `(matched blocks, in-flight tokens)[r]`.
fn kept(s: &mut LlmDSticky, eps: &[(u32, u32)]) -> Vec<usize> {
    let mut id = 0;
    for (r, &(matched, inflight)) in eps.iter().enumerate() {
        endpoint(s, r, matched, inflight, &mut id);
    }
    let views: Vec<ReplicaView> = eps
        .iter()
        .map(|&(_, inflight)| ReplicaView { waiting: u32::from(inflight > 0), ..Default::default() })
        .collect();
    let scores = s.scores(&req(99, 1.0, &PROMPT), &Replicas::new(&views)).to_vec();
    (0..eps.len()).filter(|&r| scores[r].is_finite()).collect()
}

#[test]
fn the_affinity_filter_keeps_what_upstreams_filter_tests_keep() {
    // TestFilter_NoStickyEndpoints: matches 10, 20, 50 of 100 < 0.80 → all three kept.
    assert_eq!(kept(&mut sticky(3, 0.8, 18.0, 4_194_304), &[(10, 0), (20, 0), (50, 0)]), [0, 1, 2]);
    // TestFilter_ThroughputTTFTBreaksStickiness: a (90, 500 tokens → 500 ms), b (10, 50 → 50 ms),
    // penalty 100 ms: 500 − 50 > 100 → both kept. Here a request's in-flight tokens are counted
    // in whole 16-token blocks (the approximate producer's partial last block counts whole, as
    // upstream's `uncachedInputTokens` does): a 512 (0.512 s), b 64 (0.064 s), a gap of 0.448 s
    // against upstream's 0.45 s, on the same side of both penalties.
    assert_eq!(kept(&mut sticky(2, 0.8, 0.1, 4_194_304), &[(90, 500), (10, 50)]), [0, 1]);
    // TestFilter_ThroughputTTFTWithinThreshold: the same, penalty 1,000 ms → only a.
    assert_eq!(kept(&mut sticky(2, 0.8, 1.0, 4_194_304), &[(90, 500), (10, 50)]), [0]);
    // TestFilter_TTFTPenaltyDisabled: a carries 5,000 tokens (5,008), penalty 0 → still only a.
    assert_eq!(kept(&mut sticky(2, 0.8, 0.0, 4_194_304), &[(90, 5000), (10, 50)]), [0]);
    // TestFilter_AffinityThresholdDisabled: threshold 0 → both kept, although b matches 90.
    assert_eq!(kept(&mut sticky(2, 0.0, 18.0, 4_194_304), &[(0, 0), (90, 0)]), [0, 1]);
}

#[test]
fn the_token_load_scorer_scores_as_upstreams_scorer_tests_do() {
    // Upstream's token counts × 1.6, so that every load is whole 16-token blocks (a partial last
    // block counts whole, see above): the scores are upstream's.
    let shared = [seg(1, 160)];
    // "in-flight load only": 0, 500, 1,000 tokens in flight (here 0, 800, 1,600), the request
    // fully cached everywhere (no current-request impact), threshold 1,000 (1,600) → 1.0, 0.5, 0.0.
    let mut s = sticky(3, 0.0, 18.0, 1600);
    for r in 0..3 {
        s.on_dispatch(&req(r as u64, 0.0, &shared), r);
    }
    s.on_dispatch(&req(10, 0.0, &[seg(10, 800)]), 1);
    s.on_dispatch(&req(11, 0.0, &[seg(11, 1600)]), 2);
    let views = [0, 1, 1].map(|waiting| ReplicaView { waiting, ..Default::default() });
    assert_eq!(s.scores(&req(20, 1.0, &shared), &Replicas::new(&views)), &[1.0, 0.5, 0.0]);
    // "in-flight load plus current request impact": 0, 250, 750 in flight plus the request's 250
    // uncached tokens on each (here 0, 400, 1,200 plus 400) → 0.75, 0.5, 0.0.
    let mut s = sticky(3, 0.0, 18.0, 1600);
    s.on_dispatch(&req(10, 0.0, &[seg(10, 400)]), 1);
    s.on_dispatch(&req(11, 0.0, &[seg(11, 1200)]), 2);
    let fresh = [seg(30, 400)];
    assert_eq!(s.scores(&req(20, 1.0, &fresh), &Replicas::new(&views)), &[0.75, 0.5, 0.0]);
    // The max-score picker takes the first.
    assert_eq!(s.route(&req(20, 1.0, &fresh), &Replicas::new(&views)), 0);
}

/// `llm_d` with the prefix scorer alone (weight 1) and the given length-aware weight and scale.
fn prefix_only(n: u32, match_length_weight: f64, match_length_scale_tokens: u32) -> LlmD {
    let cfg = llm_d::Config {
        queue_weight: 0.0,
        kv_cache_weight: 0.0,
        prefix_weight: 1.0,
        match_length_weight,
        match_length_scale_tokens,
        ..Default::default()
    };
    LlmD::new(cfg, &ctx(n)).unwrap()
}

#[test]
fn the_prefix_scorer_scores_as_upstreams_prefix_tests_do() {
    let views = [ReplicaView::default(); 2];
    let close = |got: &[f64], want: [f64; 2]| (got[0] - want[0]).abs() < 1e-12 && (got[1] - want[1]).abs() < 1e-12;
    // TestPrefixPluginScore: matches 5 and 2 of 10 blocks → 0.5 and 0.2.
    let mut l = prefix_only(2, 0.0, 1600);
    l.on_dispatch(&req(0, 0.0, &[seg(1, 80)]), 0);
    l.on_dispatch(&req(1, 0.0, &[seg(1, 32)]), 1);
    let got = l.scores(&req(2, 1.0, &[seg(1, 160)]), &views).to_vec();
    assert!(close(&got, [0.5, 0.2]), "{got:?}");
    // TestPrefixPluginScoreWithWeights (weight 0.5, scale 100 blocks): 5 of 10 blocks →
    // 0.5·(5/100)² + 0.5·0.5 = 0.25125; 50 of 100 → 0.5·(50/100)² + 0.5·0.5 = 0.375: the same
    // match ratio, the longer match scores higher.
    let mut l = prefix_only(2, 0.5, 1600);
    l.on_dispatch(&req(0, 0.0, &[seg(1, 80)]), 0);
    l.on_dispatch(&req(1, 0.0, &[seg(2, 800)]), 1);
    let short = l.scores(&req(2, 1.0, &[seg(1, 160)]), &views).to_vec();
    let long = l.scores(&req(3, 1.0, &[seg(2, 1600)]), &views).to_vec();
    assert!(close(&short, [0.25125, 0.0]), "{short:?}");
    assert!(close(&long, [0.0, 0.375]), "{long:?}");
}
