//! Single decisions of the three scalers, each computed by hand from its upstream's formula
//! (the policy doc blocks in `scalers.rs` name the files and commits; each test names the lines).
//! A test asks the built-in with hand-made views and facts and asserts the exact count.

use abi_stable::std_types::RSlice;
use routelab_policy_api::{Fact, Replicas, World};

use super::*;

/// A ready replica's view: `kv` thousandths of its KV in use, `waiting` queued, `running` in the
/// batch.
fn view(kv: u64, waiting: u32, running: u32) -> ReplicaView {
    ReplicaView {
        waiting,
        running,
        outstanding_requests: waiting + running,
        kv_used_tokens: kv,
        kv_capacity_tokens: 1000,
        ..Default::default()
    }
}

/// Ready replicas with `requests[i]` waiting each (nothing running, no KV in use).
fn queued(requests: &[u32]) -> Vec<ReplicaView> {
    requests.iter().map(|&w| view(0, w, 0)).collect()
}

/// The facts a decision reads: `replicas` (ready + loading) and `loading`, then `extra`.
fn facts(replicas: u32, loading: u32, extra: &[(&str, f64)]) -> Vec<Fact> {
    let mut f = vec![Fact::new(fleet::REPLICAS, replicas as f64), Fact::new(fleet::LOADING_REPLICAS, loading as f64)];
    f.extend(extra.iter().map(|&(n, v)| Fact::new(n, v)));
    f
}

/// One decision of `s` at `now` for one pool.
fn ask<S: ScalerPolicy>(s: &mut S, now: f64, views: &[ReplicaView], facts: &[Fact]) -> u32 {
    let pool = Pool { replicas: Replicas::new(views), facts: RSlice::from_slice(facts) };
    let answer = s.desired(now, &[pool]);
    assert_eq!(answer.len(), 1, "one count per pool");
    answer[0]
}

fn ctx() -> ScalerContext {
    ScalerContext::new(World::Cluster, 1, 7, 15.0)
}

fn hpa(yaml_free: HpaConfig) -> Hpa {
    Hpa::new(yaml_free, &ctx()).unwrap()
}

/// HPA on requests per replica, target 8 (the `diurnal.yaml` row's configuration).
fn hpa_requests() -> Hpa {
    hpa(HpaConfig { metric: "requests".into(), target: 8.0, ..Default::default() })
}

/// The tolerance band, `calcPlainMetricReplicas` (replica_calculator.go @ 00067268, the
/// `!rebalanceIgnored && len(missingPods) == 0` branch): `if math.Abs(1.0-usageRatio) <=
/// c.tolerance { return currentReplicas }`, else `ceil(usageRatio × readyPodCount)`.
///
/// - 4 ready at [9, 9, 8, 9] requests: mean 35/4 = 8.75, ratio 8.75/8 = 1.09375, |1 − r| =
///   0.09375 ≤ 0.1: keep 4.
/// - 4 ready at [10, 9, 9, 9]: mean 9.25, ratio 1.15625 > 1.1: ceil(1.15625 × 4) = ceil(4.625)
///   = 5.
/// - 4 ready at [7, 8, 7, 7]: mean 7.25, ratio 0.90625, |1 − r| = 0.09375: keep 4.
/// - 4 ready at [6, 7, 7, 7]: mean 6.75, ratio 0.84375: ceil(3.375) = 4 (the ceiling keeps it).
/// - 4 ready at [5, 6, 6, 6]: mean 5.75, ratio 0.71875: ceil(2.875) = 3.
///
/// A fresh HPA each time (no stabilisation history: a first recommendation stands alone, as
/// upstream's empty `a.recommendations[key]`).
#[test]
fn hpa_tolerance_band_and_ceiling() {
    for (loads, expected) in
        [([9, 9, 8, 9], 4), ([10, 9, 9, 9], 5), ([7, 8, 7, 7], 4), ([6, 7, 7, 7], 4), ([5, 6, 6, 6], 3)]
    {
        let got = ask(&mut hpa_requests(), 0.0, &queued(&loads), &facts(4, 0, &[]));
        assert_eq!(got, expected, "loads {loads:?}");
    }
    // The default metric, KV utilisation with target 0.7: [0.91, 0.91] → ratio 0.91/0.7 = 1.3,
    // ceil(1.3 × 2) = ceil(2.6) = 3; [0.75, 0.70] → ratio 0.725/0.7 = 1.0357: keep 2.
    let kv = |a, b| [view(a, 0, 3), view(b, 0, 3)];
    assert_eq!(ask(&mut hpa(HpaConfig::default()), 0.0, &kv(910, 910), &facts(2, 0, &[])), 3);
    assert_eq!(ask(&mut hpa(HpaConfig::default()), 0.0, &kv(750, 700), &facts(2, 0, &[])), 2);
}

/// Replicas still loading the model, modelled as upstream's Pending pods (`groupPods`:
/// `pod.Status.Phase == v1.PodPending` → `ignoredPods`): their metrics are removed, and only on
/// a scale-up (`rebalanceIgnored := len(ignoredPods) > 0 && usageRatio > 1.0`) do they come back
/// as 0 (`metrics[podName] = metricsclient.PodMetric{Value: 0}`), the ratio is recomputed over
/// ready + loading, and the count is `ceil(newUsageRatio × len(metrics))` unless within
/// tolerance or the direction flips (`usageRatio > 1.0 && newUsageRatio < 1.0` → current).
///
/// Current 4 = 2 ready + 2 loading, target 8:
/// - [12, 12]: ratio 24/2/8 = 1.5 > 1; new = 24/4/8 = 0.75 < 1, the direction flips: keep 4.
/// - [20, 20]: ratio 2.5; new = 40/32 = 1.25: ceil(1.25 × 4) = 5.
/// - [17, 17]: ratio 2.125; new = 34/32 = 1.0625, within 0.1: keep 4.
/// - [4, 4]: ratio 0.5 ≤ 1, no rebalancing: the plain branch over the ready pods,
///   ceil(0.5 × 2) = 1 (then brought within the stabilisation envelope; a fresh HPA has none).
#[test]
fn hpa_loading_replicas_count_as_zero_on_scale_up_only() {
    for (loads, expected) in [([12, 12], 4), ([20, 20], 5), ([17, 17], 4), ([4, 4], 1)] {
        let got = ask(&mut hpa_requests(), 0.0, &queued(&loads), &facts(4, 2, &[]));
        assert_eq!(got, expected, "loads {loads:?}");
    }
}

/// Scale-down stabilisation (horizontal.go `stabilizeRecommendationWithBehaviors` as of
/// kubernetes/kubernetes#97348): `downRecommendation` = the max of the recommendations whose
/// `rec.timestamp.After(downCutoff)`, `downCutoff = now − 300 s` (strictly after), this one
/// included; the answer is the current count brought within [up, down].
///
/// Target 8; decisions every 15 s:
/// - t = 0: 4 ready at 16 each: ratio 2, ceil(2 × 4) = 8; the rate limit allows max(2 × 4,
///   4 + 4) = 8: answer 8.
/// - t = 15: 8 ready at 2 each: ratio 0.25, recommendation ceil(0.25 × 8) = 2; the window holds
///   8 (t = 0 > 15 − 300): current 8 within [2, 8]: answer 8.
/// - t = 285: the same; t = 0 > 285 − 300 = −15 is still in the window: 8.
/// - t = 300: t = 0 is not after 300 − 300 = 0; the window holds 2, 2, 2: answer 2.
#[test]
fn hpa_scale_down_waits_out_the_window() {
    let mut h = hpa_requests();
    assert_eq!(ask(&mut h, 0.0, &queued(&[16; 4]), &facts(4, 0, &[])), 8);
    assert_eq!(ask(&mut h, 15.0, &queued(&[2; 8]), &facts(8, 0, &[])), 8);
    assert_eq!(ask(&mut h, 285.0, &queued(&[2; 8]), &facts(8, 0, &[])), 8);
    assert_eq!(ask(&mut h, 300.0, &queued(&[2; 8]), &facts(8, 0, &[])), 2);
}

/// Both windows at once: the envelope of kubernetes/kubernetes#97348 (`upRecommendation` = min
/// over the scale-up window, `downRecommendation` = max over the scale-down window; `if
/// recommendation < upRecommendation { recommendation = upRecommendation }; if recommendation >
/// downRecommendation { … = downRecommendation }`, starting from `args.CurrentReplicas`).
///
/// Scale-up window 60 s, scale-down window 0 s, target 8, current 4 = 4 ready:
/// - t = 0: loads [4; 4], ratio 0.5: recommendation 2; up = min{2} = 2, down = 2 (a 0 s window
///   holds only this one): 4 within [2, 2] → 2.
/// - t = 15 (current still 4, as if the host had not acted): loads [12; 4], ratio 1.5:
///   recommendation 6; up = min{2, 6} = 2 (t = 0 > 15 − 60), down = 6: current 4 within [2, 6]
///   stays 4: the scale-up waits.
/// - t = 60: the same loads; t = 0 is not after 60 − 60: up = min{6, 6} = 6: answer 6.
#[test]
fn hpa_scale_up_window_holds_inside_the_envelope() {
    let mut h = hpa(HpaConfig {
        metric: "requests".into(),
        target: 8.0,
        scale_up_window_s: 60.0,
        scale_down_window_s: 0.0,
        ..Default::default()
    });
    assert_eq!(ask(&mut h, 0.0, &queued(&[4; 4]), &facts(4, 0, &[])), 2);
    assert_eq!(ask(&mut h, 15.0, &queued(&[12; 4]), &facts(4, 0, &[])), 4);
    assert_eq!(ask(&mut h, 60.0, &queued(&[12; 4]), &facts(4, 0, &[])), 6);
}

/// The default scale-up rate and the bounds. Upstream's default `behavior.scaleUp` policies
/// (`GenerateHPAScaleUpRules`: 4 Pods and 100 Percent per 15 s, `selectPolicy: Max`) give
/// `calculateScaleUpLimitWithScalingRules` = max(current + 4, ceil(current × 2)) per period; the
/// bounds are the host's (`[min_replicas, max_replicas]`, upstream's `MinReplicas` /
/// `MaxReplicas` in `convertDesiredReplicasWithBehaviorRate`), so the policy's own answer may lie
/// outside them.
///
/// - Current 2 at [80, 80], target 8: ratio 10, ceil(10 × 2) = 20; limit max(2 + 4, 4) = 6: 6.
/// - Current 10 at [16; 10]: ratio 2, 20; limit max(14, 20) = 20: 20 (the host clamps it to its
///   `max_replicas`).
/// - Zero load, current 3 at [0, 0, 0]: ratio 0, |1 − 0| > 0.1, ceil(0 × 3) = 0 (the host clamps
///   to `min_replicas` ≥ 1, as upstream's `minimumAllowedReplicas`).
/// - No ready replica (all 3 loading): upstream's `calcPlainMetricReplicas` fails ("did not
///   receive metrics for any ready pods") and the HPA keeps the scale and records nothing: 3, and
///   a later scale-down is not held by it (t = 15: 1 ready at 0 requests → 0).
#[test]
fn hpa_rate_limit_bounds_and_zero_load() {
    assert_eq!(ask(&mut hpa_requests(), 0.0, &queued(&[80, 80]), &facts(2, 0, &[])), 6);
    assert_eq!(ask(&mut hpa_requests(), 0.0, &queued(&[16; 10]), &facts(10, 0, &[])), 20);
    assert_eq!(ask(&mut hpa_requests(), 0.0, &queued(&[0; 3]), &facts(3, 0, &[])), 0);
    let mut h = hpa_requests();
    assert_eq!(ask(&mut h, 0.0, &[], &facts(3, 3, &[])), 3);
    assert_eq!(ask(&mut h, 15.0, &queued(&[0]), &facts(1, 0, &[])), 0);
}

fn planner(config: DynamoConfig) -> DynamoPlanner {
    DynamoPlanner::new(config, &ctx()).unwrap()
}

/// The facts a planner decision reads: arrival rate, mean ISL and OSL, and the observed TTFT
/// and ITL (NaN: no completions in the interval).
fn load(replicas: u32, rate: f64, isl: f64, osl: f64, ttft: f64, itl: f64) -> Vec<Fact> {
    facts(
        replicas,
        0,
        &[
            (fleet::ARRIVAL_RATE, rate),
            (fleet::PROMPT_TOKENS_MEAN, isl),
            (fleet::OUTPUT_TOKENS_MEAN, osl),
            (fleet::TTFT_MEAN_S, ttft),
            (fleet::TPOT_MEAN_S, itl),
        ],
    )
}

/// The throughput formula without corrections (prefill_planner.py @ 002a7c31
/// `_compute_replica_requirements`: `pred_prefill_throughput = next_num_req × next_isl /
/// adjustment_interval × min(1, p_correction_factor)`, over `p_thpt_per_gpu`; decode_planner.py
/// @ 0ff50012: `pred_decode_throughput = next_num_req × next_osl / adjustment_interval` over the
/// throughput at the ITL target; `max(next_num, min_endpoint)`), with the two shares added for an
/// aggregated replica before the one ceiling.
///
/// Default profile 8,000 prefill and 1,500 decode tokens/s:
/// - 10 req/s, ISL 2,000, OSL 300: prefill 10 × 2000 / 8000 = 2.5, decode 10 × 300 / 1500 = 2.0:
///   ceil(4.5) = 5.
/// - 12 req/s, ISL 1,000, OSL 100: 1.5 + 0.8 = 2.3: 3.
/// - 0.1 req/s, ISL 100, OSL 10: 0.00125 + 0.000667: ceil = 1; with `min_endpoint: 2`, 2.
#[test]
fn dynamo_planner_throughput_formula() {
    let nan = f64::NAN;
    assert_eq!(ask(&mut planner(DynamoConfig::default()), 0.0, &[], &load(2, 10.0, 2000.0, 300.0, nan, nan)), 5);
    assert_eq!(ask(&mut planner(DynamoConfig::default()), 0.0, &[], &load(2, 12.0, 1000.0, 100.0, nan, nan)), 3);
    assert_eq!(ask(&mut planner(DynamoConfig::default()), 0.0, &[], &load(2, 0.1, 100.0, 10.0, nan, nan)), 1);
    let two = DynamoConfig { min_endpoint: 2, ..Default::default() };
    assert_eq!(ask(&mut planner(two), 0.0, &[], &load(2, 0.1, 100.0, 10.0, nan, nan)), 2);
}

/// The correction factors (`_update_correction_factor`: `p_correction_factor = last ttft /
/// expect_ttft`, `d_correction_factor = last itl / expect_itl`; prefill uses `min(1, p)`, decode
/// reads its capacity at `itl / d_correction_factor`, here linear: capacity / d).
///
/// Profile: expected TTFT 0.5 s, expected ITL 0.02 s; 10 req/s, ISL 2,000, OSL 300:
/// - observed TTFT 1.0 (p = 2, min(1, 2) = 1) and ITL 0.04 (d = 2, decode capacity 1500 / 2 =
///   750): 2.5 + 3000 / 750 = 2.5 + 4 = 6.5: 7.
/// - next interval, TTFT 0.25 (p = 0.5) and no completions for ITL (NaN: d stays 2): 2.5 × 0.5 +
///   4 = 5.25: 6.
/// - next, no arrivals (rate 0): the planner keeps its last answer, 6, whatever the current
///   count; corrections as they were (the report says p = 0.5, d = 2).
#[test]
fn dynamo_planner_correction_factors_and_no_load() {
    let profile = DynamoConfig { expected_ttft_s: 0.5, expected_itl_s: 0.02, ..Default::default() };
    let mut p = planner(profile);
    assert_eq!(ask(&mut p, 0.0, &[], &load(3, 10.0, 2000.0, 300.0, 1.0, 0.04)), 7);
    assert_eq!(ask(&mut p, 15.0, &[], &load(7, 10.0, 2000.0, 300.0, 0.25, f64::NAN)), 6);
    assert_eq!(ask(&mut p, 30.0, &[], &load(9, 0.0, f64::NAN, f64::NAN, f64::NAN, f64::NAN)), 6);
    assert_eq!(p.report(), vec![("p_correction".to_string(), 0.5), ("d_correction".to_string(), 2.0)]);
    // With no answer yet and no arrivals: the current count.
    assert_eq!(ask(&mut planner(DynamoConfig::default()), 0.0, &[], &load(4, 0.0, 0.0, 0.0, f64::NAN, f64::NAN)), 4);
}

fn wva() -> LlmDWva {
    LlmDWva::new(WvaConfig::default(), &ctx()).unwrap()
}

/// KV thousandths and queue lengths per ready replica.
fn kvq(replicas: &[(u64, u32)]) -> Vec<ReplicaView> {
    replicas.iter().map(|&(kv, w)| view(kv, w, 1)).collect()
}

/// Scale-up (internal/capacity/analyzer.go @ b3ca6d2c): `analyzeVariant` marks a replica
/// saturated if `KvCacheUsage >= KvCacheThreshold || QueueLength >= QueueLengthThreshold` (0.8,
/// 5), averages `threshold − usage` over the others; `shouldScaleUp` if `avgSpareKv <
/// KvSpareTrigger (0.1) || avgSpareQueue < QueueSpareTrigger (3)`; `CalculateCapacityTargets`
/// gives `ReplicaCount + 1` (ready replicas).
///
/// - KV [0.75, 0.70, 0.85], queues [1, 0, 6]: the third is saturated; spare KV 0.8 − 0.725 =
///   0.075 < 0.1: 3 + 1 = 4.
/// - KV [0.2, 0.3], queues [3, 2]: spare KV 0.55, spare queue 5 − 2.5 = 2.5 < 3: 3.
/// - KV [0.9, 0.95]: all saturated, so both averages stay 0 (`if nonSaturatedCount > 0`):
///   0 < 0.1: 3.
#[test]
fn wva_scale_up_on_spare_capacity() {
    assert_eq!(ask(&mut wva(), 0.0, &kvq(&[(750, 1), (700, 0), (850, 6)]), &facts(3, 0, &[])), 4);
    assert_eq!(ask(&mut wva(), 0.0, &kvq(&[(200, 3), (300, 2)]), &facts(2, 0, &[])), 3);
    assert_eq!(ask(&mut wva(), 0.0, &kvq(&[(900, 0), (950, 0)]), &facts(2, 0, &[])), 3);
}

/// Scale-down (`isScaleDownSafe`: at least `MinNonSaturatedReplicasForScaleDown` = 2
/// non-saturated; their summed KV and queue load over `nonSaturatedCount − 1` must leave
/// `threshold − avg ≥ trigger` for both; `CalculateCapacityTargets` skips a variant with
/// `ReplicaCount <= 1`) and holding.
///
/// - KV [0.2; 3], queues [0, 1, 0]: no scale-up (spare 0.6 and 4.67); after removal KV 0.6 / 2
///   = 0.3 (spare 0.5 ≥ 0.1), queue 1 / 2 = 0.5 (spare 4.5 ≥ 3): safe, 3 − 1 = 2.
/// - KV [0.5; 3], idle queues: spare 0.3, no scale-up; after removal 1.5 / 2 = 0.75, spare 0.05
///   < 0.1: unsafe, keep 3.
/// - One idle replica (zero load): spare 0.8 and 5, no scale-up; one non-saturated < 2: keep 1.
/// - KV [0.1, 0.85], idle: one non-saturated (spare 0.7, 5: no scale-up), unsafe: keep 2.
#[test]
fn wva_scale_down_only_when_safe() {
    assert_eq!(ask(&mut wva(), 0.0, &kvq(&[(200, 0), (200, 1), (200, 0)]), &facts(3, 0, &[])), 2);
    assert_eq!(ask(&mut wva(), 0.0, &kvq(&[(500, 0); 3]), &facts(3, 0, &[])), 3);
    assert_eq!(ask(&mut wva(), 0.0, &kvq(&[(0, 0)]), &facts(1, 0, &[])), 1);
    assert_eq!(ask(&mut wva(), 0.0, &kvq(&[(100, 0), (850, 0)]), &facts(2, 0, &[])), 2);
}

/// A target preserved while replicas load (`CalculateCapacityTargets`: `if
/// state.DesiredReplicas != 0 && state.DesiredReplicas != state.CurrentReplicas { targets =
/// DesiredReplicas }`), and no metrics at all (`AnalyzeModelCapacity` with no replica metrics
/// returns no variant analyses; `CalculateCapacityTargets` then answers `CurrentReplicas`).
///
/// - t = 0: 2 ready at KV 0.78: spare 0.02: 3.
/// - t = 15: 2 ready (idle now) + 1 loading: the target 3 stands.
/// - t = 30: 3 ready, idle: KV 0 each, safe to remove one (0 / 2 leaves spare 0.8): 2.
/// - A fresh WVA with no ready replica and 2 loading: no metrics, keep the current 2.
#[test]
fn wva_preserves_its_target_while_replicas_load() {
    let mut w = wva();
    assert_eq!(ask(&mut w, 0.0, &kvq(&[(780, 0); 2]), &facts(2, 0, &[])), 3);
    assert_eq!(ask(&mut w, 15.0, &kvq(&[(0, 0); 2]), &facts(3, 1, &[])), 3);
    assert_eq!(ask(&mut w, 30.0, &kvq(&[(0, 0); 3]), &facts(3, 0, &[])), 2);
    assert_eq!(ask(&mut wva(), 0.0, &[], &facts(2, 2, &[])), 2);
}

/// One decision of `s` at `now` for two pools (prefill, decode), each `(views, facts)`.
fn ask_two<S: ScalerPolicy>(s: &mut S, now: f64, pools: [(&[ReplicaView], &[Fact]); 2]) -> Vec<u32> {
    let pools = pools.map(|(v, f)| Pool { replicas: Replicas::new(v), facts: RSlice::from_slice(f) });
    s.desired(now, &pools)
}

/// Two pools (a disaggregated cluster: prefill, decode), each sized apart.
///
/// - `dynamo_planner`, default profile, 10 req/s, ISL 2,000, OSL 300: prefill ceil(10 × 2000 /
///   8000 = 2.5) = 3, decode ceil(10 × 300 / 1500 = 2.0) = 2 (one pool would add them: 5).
/// - `hpa` on requests, target 8: prefill 2 ready at [9, 9] (ratio 1.125: ceil(2.25) = 3), decode
///   4 ready at [8, 8, 8, 9] (ratio 33/32, inside the tolerance: keep 4). At t = 15 the prefill
///   pool drops to [0, 0, 0] (its own recommendation 0; its own window holds 3), while the
///   decode pool's history is its own: [16, 16, 16, 16] → ceil(2 × 4) = 8.
/// - `llm_d_wva`: prefill 2 ready, both saturated (queue 6 ≥ 5): +1 = 3; decode 3 ready, idle
///   (spare KV 0.8, queue 5; one fewer leaves both above their triggers): −1 = 2.
#[test]
fn each_scaler_sizes_two_pools_apart() {
    let nan = f64::NAN;
    let f = load(2, 10.0, 2000.0, 300.0, nan, nan);
    assert_eq!(ask_two(&mut planner(DynamoConfig::default()), 0.0, [(&[], &f), (&[], &f)]), [3, 2]);
    let mut h = hpa_requests();
    let (p, d) = (queued(&[9, 9]), queued(&[8, 8, 8, 9]));
    assert_eq!(ask_two(&mut h, 0.0, [(&p, &facts(2, 0, &[])), (&d, &facts(4, 0, &[]))]), [3, 4]);
    let (p, d) = (queued(&[0, 0, 0]), queued(&[16; 4]));
    assert_eq!(ask_two(&mut h, 15.0, [(&p, &facts(3, 0, &[])), (&d, &facts(4, 0, &[]))]), [3, 8]);
    let (p, d) = (kvq(&[(0, 6), (0, 6)]), kvq(&[(0, 0), (0, 0), (0, 0)]));
    assert_eq!(ask_two(&mut wva(), 0.0, [(&p, &facts(2, 0, &[])), (&d, &facts(3, 0, &[]))]), [3, 2]);
}
