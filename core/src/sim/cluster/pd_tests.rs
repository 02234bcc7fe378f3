//! Disaggregated clusters: hand-computed transfer timing and decode-side memory accounting, and
//! whole runs of every PD baseline.

use routelab_policy_api::{Roofline, StepShape};

use super::replica::{Phase, Replica, ReplicaConfig, RequestState};
use super::tests::run_named;
use super::*;
use crate::ids::{ReplicaId, RequestId, RouterIndex};
use crate::time::{SimTime, seconds, ticks};
use crate::workload::generate::generate;

fn spec(yaml: &str) -> ClusterSpec {
    serde_norway::from_str(yaml).unwrap()
}

/// 1 prefill + 1 decode instance; prompts of 100 shared + 900 own tokens, 5 output tokens.
fn one_to_one(extra: &str) -> ClusterSpec {
    spec(&format!(
        "replicas: 2
chunk_tokens: 2048
disaggregation:
  prefill: {{instances: 1}}
  decode: {{instances: 1}}
  link: {{bandwidth_gbps: 100, base_latency_s: 0.0005}}
{extra}
generator: {{system_prompt_tokens: 100, suffix_tokens: 900, output_tokens: 5}}
arrivals: {{poisson: {{rate: 0.001}}}}
requests: 1
"
    ))
}

#[test]
fn ttft_is_the_prefill_step_plus_the_transfer_and_decode_follows_on_the_decode_instance() {
    let spec = one_to_one("");
    let sm = spec.step_model().unwrap();
    let out = run_named(&spec, None, "pd_round_robin", 1).unwrap();
    let rec = &out.records[0];
    let c: Roofline = sm.cost;
    // One 1000-token prefill step on the prefill instance.
    let t1 = ticks(rec.arrived_at_s) + ticks(c.shape_time_s(&StepShape::prefill(1000, 0)));
    // 1000 tokens × kv_bytes / 12.5e9 B/s + 0.5 ms, alone on the link; nothing cached on decode.
    let transfer = 0.0005 + 1000.0 * c.kv_bytes_per_token / 12.5e9;
    let t2 = t1 + ticks(transfer);
    assert_eq!(rec.first_token_at_s, seconds(t2), "{rec:?}");
    // Four more tokens, one decode step each over a context growing from 1001.
    let t3 = (0..4).fold(t2, |t, k| t + ticks(c.shape_time_s(&StepShape::decode(1, 1001 + k))));
    assert_eq!(rec.completed_at_s, seconds(t3));
    assert_eq!(rec.replica, 1, "the request ends on the decode instance");
    let m = |k: &str| out.metrics.get(k).unwrap();
    assert_eq!(m("transfer_time_mean_s"), transfer);
    assert_eq!(m("decode_hit_rate"), 0.0);
    assert_eq!(m("completed"), 1.0);
}

#[test]
fn full_prompt_transfers_ignore_the_decode_cache_and_missing_ones_use_it() {
    // Two requests sharing the 100-token system prompt, far apart: the second finds it on both sides.
    let run = |transfer: &str| {
        let mut s = one_to_one(&format!("  transfer: {transfer}"));
        s.requests = Some(2);
        let o = run_named(&s, None, "pd_round_robin", 1).unwrap();
        (o.metrics.get("transfer_time_mean_s").unwrap(), o.metrics.get("decode_hit_rate").unwrap(), s)
    };
    let (full, hit_full, s) = run("full_prompt");
    let (missing, hit_missing, _) = run("missing");
    let kv = s.step_model().unwrap().cost.kv_bytes_per_token;
    let per_token = kv / 12.5e9;
    assert_eq!(full, 0.0005 + 1000.0 * per_token);
    // Mean of 1000 and 900 moved tokens.
    assert!((missing - (0.0005 + 950.0 * per_token)).abs() < 1e-12, "{missing}");
    // The decode side held the system prompt either way (hit rates count what it had).
    assert_eq!(hit_full, hit_missing);
    assert_eq!(hit_missing, 100.0 / 2000.0);
}

fn config(capacity: u64) -> ReplicaConfig {
    ReplicaConfig::plain(capacity, 512, 256)
}

#[test]
fn a_transfer_occupies_decode_memory_from_its_start() {
    let mut s = one_to_one("");
    s.requests = Some(2);
    let stream = generate(&s, None, 1).unwrap();
    // Handed off: the first token was made on the prefill instance.
    let handed_off = || RequestState { phase: Phase::Transfer, produced: 1, ..Default::default() };
    // Room for exactly one request: 1000 prompt + 5 output reserved.
    let cfg = config(1005);
    let mut rep = Replica::new(ReplicaId::from_u32(1));
    assert_eq!(rep.admit_transfer(RequestId::from_u32(0), &stream, handed_off, &cfg), Some(0));
    // In use now: the 1000 prompt tokens being written + the first token; committed: the pinned
    // prompt + the whole output (full reservation).
    assert_eq!(rep.kv_used_tokens(), 1001);
    assert_eq!(rep.committed_tokens(&cfg), 1000 + 5);
    assert_eq!(rep.running().len(), 1);
    // The second does not fit until the first is gone (its 100 shared tokens would be, but its
    // 900 own and its output would not).
    let taken = std::cell::Cell::new(false);
    let take = || {
        taken.set(true);
        handed_off()
    };
    assert_eq!(rep.admit_transfer(RequestId::from_u32(1), &stream, take, &cfg), None);
    assert!(!taken.get(), "a refused transfer leaves its state with the caller");
    // With room, the second finds the system prompt the first brought (once computed).
    let cfg = config(10_000);
    assert!(!rep.begin_decode(RequestId::from_u32(0), SimTime::ZERO, &stream, &cfg));
    assert_eq!(rep.state(RequestId::from_u32(0)).phase, Phase::Decode);
    assert_eq!(rep.admit_transfer(RequestId::from_u32(1), &stream, handed_off, &cfg), Some(100));
    assert_eq!(rep.kv_used_tokens(), 1001 + 900 + 1);
    assert_eq!(rep.committed_tokens(&cfg), 1900 + 10);
}

#[test]
fn every_pd_baseline_serves_every_request_once_and_replays() {
    let mut s = crate::sim::cluster::tests::preset("tool_use");
    s.requests = Some(600);
    s.replicas = 8;
    s.disaggregation = one_to_one("").disaggregation;
    let d = s.disaggregation.as_mut().unwrap();
    d.prefill.instances = 3;
    d.decode.instances = 5;
    for router in [
        "pd_random",
        "pd_round_robin",
        "pd_least_loaded",
        "pd_sglang{prefill: sglang_cache_aware, decode: power_of_two}",
    ] {
        let a = run_named(&s, None, router, 3).unwrap();
        assert_eq!(a.metrics.get("completed"), Some(600.0), "{router}");
        for key in crate::metrics::CLUSTER_KEYS.iter().chain(crate::metrics::PD_KEYS) {
            assert!(a.metrics.get(key).is_some_and(f64::is_finite), "{router}: {key}");
        }
        assert!(a.records.iter().all(|r| r.replica >= 3), "{router}: requests end on decode instances");
        assert!(
            a.records.iter().all(|r| r.first_token_at_s > r.arrived_at_s && r.completed_at_s >= r.first_token_at_s)
        );
        let share = a.metrics.get("transfer_share").unwrap();
        assert!(share > 0.0 && share < 1.0, "{router}: {share}");
        assert_eq!(a, run_named(&s, None, router, 3).unwrap(), "{router}: same seed, same numbers");
    }
}

#[test]
fn pd_routers_and_aggregated_clusters_do_not_mix() {
    let agg = crate::sim::cluster::tests::preset("tool_use");
    let e = run_named(&agg, None, "pd_round_robin", 1).unwrap_err().to_string();
    assert!(e.contains("disaggregation router") && e.contains("aggregated"), "{e}");
    let pd = one_to_one("");
    let e = run_named(&pd, None, "round_robin", 1).unwrap_err().to_string();
    assert!(e.contains("not a disaggregation router") && e.contains("pd_sglang{prefill: round_robin"), "{e}");
}

#[test]
fn a_layerwise_transfer_overlaps_the_prefill_and_leaves_the_larger_of_its_lag_and_last_layer() {
    // A slow link (1 Gbit/s = 1.25e8 B/s): bandwidth-bound, the stream that started with the
    // prefill step ends `transfer` after that step's start. A fast one (400 Gbit/s): only the
    // last layer's bytes follow the prefill.
    for (gbps, bound) in [(1.0, "bandwidth"), (400.0, "compute")] {
        let spec = one_to_one("").with_link(gbps, true);
        let sm = spec.step_model().unwrap();
        let c: Roofline = sm.cost;
        let out = run_named(&spec, None, "pd_round_robin", 1).unwrap();
        let rec = &out.records[0];
        let t0 = ticks(rec.arrived_at_s);
        let t1 = t0 + ticks(c.shape_time_s(&StepShape::prefill(1000, 0)));
        let bytes_s = 1000.0 * c.kv_bytes_per_token / (gbps * 1e9 / 8.0);
        let transfer = 0.0005 + bytes_s;
        let last_layer = bytes_s / sm.model.layers as f64;
        let end = (seconds(t0) + transfer).max(seconds(t1) + last_layer);
        assert_eq!(rec.first_token_at_s, seconds(ticks(end)), "{bound}: {rec:?}");
        let shown = out.metrics.get("transfer_time_mean_s").unwrap();
        match bound {
            "bandwidth" => assert!(shown < transfer - 0.9 * (seconds(t1) - seconds(t0)), "{shown} vs {transfer}"),
            _ => assert!((shown - last_layer).abs() < 2e-9, "{shown} vs {last_layer}"),
        }
        // Without the overlap, the whole transfer follows the prefill.
        let plain = run_named(&one_to_one("").with_link(gbps, false), None, "pd_round_robin", 1).unwrap();
        assert_eq!(plain.records[0].first_token_at_s, seconds(t1 + ticks(transfer)));
    }
}

impl ClusterSpec {
    fn with_link(mut self, gbps: f64, layerwise: bool) -> Self {
        let l = &mut self.disaggregation.as_mut().unwrap().link;
        l.bandwidth_gbps = gbps;
        l.layerwise = layerwise;
        self
    }
}

#[test]
fn a_prefill_instance_loads_from_the_shared_tier_what_another_one_computed() {
    // 2 prefill instances, round robin: the second request goes to the instance that never saw
    // the 100-token system prompt; the tier holds it since the first request's hand-off.
    let two_prefill = |tier: &str| {
        let mut s = one_to_one(tier);
        s.replicas = 3;
        s.requests = Some(2);
        s.disaggregation.as_mut().unwrap().prefill.instances = 2;
        s
    };
    let s = two_prefill("  shared_kv: {capacity_gb: 1, bandwidth_gbps: 8, base_latency_s: 0.001}");
    let kv = s.step_model().unwrap().cost.kv_bytes_per_token;
    let out = run_named(&s, None, "pd_round_robin", 1).unwrap();
    let r = &out.records[1];
    // 100 tokens × kv bytes at 1e9 B/s (8 Gbit/s), alone, + 1 ms; then the prefill starts there.
    let load = 0.001 + 100.0 * kv / 1e9;
    assert_eq!(r.admitted_at_s, seconds(ticks(r.arrived_at_s) + ticks(load)), "{r:?}");
    assert_eq!(r.cached_tokens, 100);
    assert_eq!(out.metrics.get("tier_tokens_loaded"), Some(100.0));
    assert_eq!(out.metrics.get("tier_hit_rate"), Some(100.0 / 2000.0));
    // Without the tier it recomputes the whole prompt, at once.
    let plain = run_named(&two_prefill(""), None, "pd_round_robin", 1).unwrap();
    assert_eq!(plain.records[1].cached_tokens, 0);
    assert_eq!(plain.records[1].admitted_at_s, plain.records[1].arrived_at_s);
    assert_eq!(plain.metrics.get("tier_hit_rate"), None);
}

/// `p` prefill, `m` mixed and `d` decode instances, otherwise as [`one_to_one`].
fn mixed(p: u32, m: u32, d: u32, requests: u64) -> ClusterSpec {
    let mut s = one_to_one(&format!("  mixed: {{instances: {m}}}"));
    s.replicas = p + m + d;
    s.requests = Some(requests);
    let dis = s.disaggregation.as_mut().unwrap();
    dis.prefill.instances = p;
    dis.decode.instances = d;
    s
}

#[test]
fn a_pair_on_one_mixed_instance_prefills_and_decodes_there_without_a_transfer() {
    // All mixed: round robin names instance 0 on both sides.
    let spec = mixed(0, 2, 0, 1);
    spec.validate().unwrap();
    let c = spec.step_model().unwrap().cost;
    let out = run_named(&spec, None, "pd_round_robin", 1).unwrap();
    let rec = &out.records[0];
    let t1 = ticks(rec.arrived_at_s) + ticks(c.shape_time_s(&StepShape::prefill(1000, 0)));
    assert_eq!(rec.first_token_at_s, seconds(t1), "no transfer after the prefill step");
    let t2 = (0..4).fold(t1, |t, k| t + ticks(c.shape_time_s(&StepShape::decode(1, 1001 + k))));
    assert_eq!(rec.completed_at_s, seconds(t2));
    assert_eq!(rec.replica, 0);
    let m = |k: &str| out.metrics.get(k).unwrap();
    assert_eq!(m("local_share"), 1.0);
    assert!(m("transfer_time_mean_s").is_nan());
    assert_eq!(m("completed"), 1.0);
}

#[test]
fn a_mixed_instance_is_a_decode_target_for_the_prefill_pool_and_a_prefill_source_for_the_decode_pool() {
    // 1P 1M 1D, round robin: request 0 goes prefill 0 → decode candidate 0 (the mixed instance,
    // replica 1); request 1 goes prefill candidate 1 (the mixed instance) → decode candidate 1
    // (replica 2). Both move their whole 1000-token prompt (the 100 shared tokens were never on
    // either receiving side before).
    let spec = mixed(1, 1, 1, 2);
    spec.validate().unwrap();
    let kv = spec.step_model().unwrap().cost.kv_bytes_per_token;
    let out = run_named(&spec, None, "pd_round_robin", 1).unwrap();
    assert_eq!([out.records[0].replica, out.records[1].replica], [1, 2]);
    let m = |k: &str| out.metrics.get(k).unwrap();
    assert_eq!(m("transfer_time_mean_s"), 0.0005 + 1000.0 * kv / 12.5e9);
    assert_eq!(m("local_share"), 0.0);
    // The mixed instance prefilled request 1 with request 0's system prompt in its cache.
    assert_eq!(out.records[1].cached_tokens, 100);
    assert_eq!(m("completed"), 2.0);
    // pd_least_loaded keeps a mixed prefill local: with 4 mixed instances nothing moves.
    let mut all = mixed(0, 4, 0, 200);
    all.arrivals = mixed(0, 4, 0, 1).arrivals;
    let ll = run_named(&all, None, "pd_least_loaded", 1).unwrap();
    assert_eq!(ll.metrics.get("local_share"), Some(1.0));
    assert_eq!(ll.metrics.get("completed"), Some(200.0));
}

#[test]
fn mixed_pools_are_checked() {
    let e = mixed(1, 0, 1, 1).validate().unwrap_err();
    assert!(e.path.contains("disaggregation.mixed.instances"), "{e:?}");
    let mut s = mixed(1, 1, 1, 1);
    s.replicas = 2;
    let e = s.validate().unwrap_err();
    assert!(e.message.contains("1 prefill + 1 mixed + 1 decode = 3"), "{e:?}");
    // Without mixed instances an empty pool is still refused.
    assert!(one_to_one("").with_pools(0, 1).validate().is_err());
}

impl ClusterSpec {
    fn with_pools(mut self, p: u32, d: u32) -> Self {
        let dis = self.disaggregation.as_mut().unwrap();
        (dis.prefill.instances, dis.decode.instances) = (p, d);
        self.replicas = p + d;
        self
    }
}

/// Slowdowns run on P/D clusters: a slow prefill instance stretches the prefill (TTFT grows by
/// (factor − 1) × the prefill step, so factor 3 adds twice what factor 2 adds) and leaves the
/// decode alone; a slow decode instance leaves TTFT alone and stretches every decode step.
/// Crashes validate on a P/D cluster, with mixed instances too (`pd_failures_tests.rs`).
#[test]
fn slowdowns_stretch_the_phase_of_the_slow_instance() {
    let with = |failures: &str| {
        let mut s = one_to_one(&format!("failures: {{{failures}}}"));
        s.validate().unwrap();
        s.requests = Some(1);
        run_named(&s, None, "pd_round_robin", 1).unwrap().records[0].clone()
    };
    let calm = one_to_one("");
    let c = run_named(&calm, None, "pd_round_robin", 1).unwrap().records[0].clone();
    let ttft = |r: &RequestRecord| r.first_token_at_s - r.arrived_at_s;
    let decode = |r: &RequestRecord| r.completed_at_s - r.first_token_at_s;
    let (p2, p3) = (with("slowdowns: [{replica: 0, factor: 2}]"), with("slowdowns: [{replica: 0, factor: 3}]"));
    let tick = 2e-9;
    assert!(ttft(&p2) > ttft(&c) + 1e-4, "{} vs {}", ttft(&p2), ttft(&c));
    assert!(((ttft(&p3) - ttft(&c)) - 2.0 * (ttft(&p2) - ttft(&c))).abs() < 3.0 * tick);
    assert!((decode(&p3) - decode(&c)).abs() < tick, "the decode instance is not slow");
    let d3 = with("slowdowns: [{replica: 1, factor: 3}]");
    assert!((ttft(&d3) - ttft(&c)).abs() < tick, "the prefill instance is not slow");
    // 4 decode steps, each rounded up to a tick at most.
    assert!((decode(&d3) - 3.0 * decode(&c)).abs() < 4.0 * 3.0 * tick, "{} vs 3 × {}", decode(&d3), decode(&c));
    let crashing = one_to_one("failures: {crashes: [{replica: 0, at_s: 1}]}");
    crashing.validate().unwrap();
    let mut mixed = one_to_one("  mixed: {instances: 1}\nfailures: {crashes: [{replica: 0, at_s: 1}]}");
    mixed.replicas = 3;
    // Mixed instances crash too (policy-api 0.5.13's `on_mixed_change`; `pd_failures_tests.rs`).
    mixed.validate().unwrap();
}

#[test]
fn router_indices_convert_to_each_pools_own_and_back() {
    use routelab_policy_api::PdPool::{Decode, Prefill};
    // 2 prefill-only, 1 mixed, 2 decode-only: router indices 0 1 | 2 | 3 4; the prefill
    // candidates are 0..3, the decode candidates 2..5 (the mixed instance is in both).
    let spec = mixed(2, 1, 2, 1);
    let mut pd = Pd::new(spec.disaggregation.as_ref().unwrap(), None, 1.0, 1, 1);
    let k = RouterIndex::new;
    assert_eq!([0, 1, 2].map(|i| pd.pool_index(k(i), Prefill)), [0, 1, 2]);
    assert_eq!([2, 3, 4].map(|i| pd.pool_index(k(i), Decode)), [0, 1, 2]);
    assert_eq!([0, 1, 2].map(|i| pd.router_index(Decode, i)), [k(2), k(3), k(4)]);
    assert_eq!(pd.router_index(Prefill, 2), k(2));
    // A prefill-only instance left: the mixed and decode candidates moved down one router index,
    // their decode indices unchanged.
    pd.r_decode_start -= 1;
    assert_eq!([1, 2, 3].map(|i| pd.pool_index(k(i), Decode)), [0, 1, 2]);
    assert_eq!(pd.router_index(Decode, 2), k(3));
    assert_eq!(pd.pool_index(k(1), Prefill), 1);
}
