//! KV tiers in whole cluster runs: a prefix evicted from the GPU comes back from the CPU (or
//! remote) tier, its load on the admitting step's critical path, timed by hand.

use routelab_policy_api::{Chunk, Segment, Step};

use super::tests::run_named;
use super::*;
use crate::runner::run_cluster;
use crate::time::{seconds, ticks};
use crate::workload::generate::{GeneratedRequest, RequestStream};

fn spec(tiers: &str) -> ClusterSpec {
    // One A6000 with ~30k tokens of KV; unchunked prefill, one output token: a request is one step.
    serde_norway::from_str(&format!(
        "replicas: 1\nmemory_fraction: 0.3836\nchunk_tokens: 0\n{tiers}\n\
         generator: {{output_tokens: 1}}\narrivals: {{poisson: {{rate: 1}}}}\nrequests: 3\n"
    ))
    .unwrap()
}

/// A (20,000 tokens), then B (20,000; evicts most of A), then A + C (100), 100 s apart.
fn stream() -> RequestStream {
    let (a, b, c) =
        (Segment { id: 10, tokens: 20_000 }, Segment { id: 11, tokens: 20_000 }, Segment { id: 12, tokens: 100 });
    let prompts = [vec![a], vec![b], vec![a, c]];
    let mut s = RequestStream::default();
    for (k, p) in prompts.iter().enumerate() {
        let start = s.segments.len() as u32;
        s.segments.extend_from_slice(p);
        s.requests.push(GeneratedRequest {
            arrived_at: ticks(100.0 * k as f64),
            prompt_tokens: p.iter().map(|s| s.tokens).sum(),
            output_tokens: 1,
            segments: start..s.segments.len() as u32,
            output_segment: None,
        });
    }
    s
}

fn run(spec: &ClusterSpec) -> RunOutcome {
    let resolved = StepModels::resolve(spec).unwrap();
    let ctx = router_context_for(spec, &resolved, 1);
    let r =
        crate::plugin::Loader::new().router(&crate::plugin::PolicySpec::parse("round_robin").unwrap(), &ctx).unwrap();
    run_cluster(spec, &stream(), r, "round_robin", 1).unwrap()
}

/// Hand-computed: B's admission evicts `over = 40,001 − capacity` tokens of A (first cut: A
/// goes to the CPU tier whole), leaving `left = capacity − 20,001` on the GPU. The third request
/// finds `left` tokens on the GPU and the other `20,000 − left` in the CPU tier: its one step
/// loads those and prefills C's 100 tokens at context 20,000.
#[test]
fn an_evicted_prefix_loads_back_from_the_cpu_tier_on_the_steps_critical_path() {
    let cpu = "kv_tiers: {cpu: {capacity_gb: 10, bandwidth_gbps: 400, base_latency_s: 0.0001}, layerwise: LW}";
    let resolved = StepModels::resolve(&spec("")).unwrap();
    let sm = &resolved.main;
    let cap = sm.kv_capacity_tokens;
    assert!((20_102..40_000).contains(&cap), "capacity {cap}");
    let left = cap as u32 - 20_001;
    let loaded = 20_000 - left;
    let kv = sm.cost.kv_bytes_per_token;
    let load = 0.0001 + loaded as f64 * kv / 50e9;
    let compute = sm.pricer.step_time_s(&Step::mixed(0, 0, &[Chunk { new_tokens: 100, context_tokens: 20_000 }]));
    let layers = sm.model.layers as f64;
    for (layerwise, step) in [(false, compute + load), (true, (compute + load / layers).max(load + compute / layers))] {
        let out = run(&spec(&cpu.replace("LW", &layerwise.to_string())));
        let rec = &out.records[2];
        assert_eq!(rec.first_token_at_s, seconds(ticks(200.0) + ticks(step)), "layerwise {layerwise}: {rec:?}");
        assert_eq!(rec.cached_tokens, left, "the GPU's share of the hit");
        let m = |k: &str| out.metrics.get(k).unwrap_or_else(|| panic!("no {k}"));
        assert_eq!(m("tier.cpu.tokens_loaded"), loaded as f64);
        assert_eq!(m("tier.cpu.hit_rate"), loaded as f64 / 60_100.0);
        assert_eq!(m("tier.hit_rate_all"), 20_000.0 / 60_100.0);
        assert_eq!(m("tier.cpu.load_time_s"), load);
        assert!((m("tier.load_stall_s") - (step - compute)).abs() < 1e-12);
        // A went down at B's admission, B at the third request's.
        assert_eq!(m("tier.cpu.offloaded_tokens"), 40_000.0);
    }
    // Without tiers the third request recomputes what the GPU lost: a longer, costlier step.
    let out = run(&spec(""));
    let rec = &out.records[2];
    let recompute = sm.pricer.step_time_s(&Step::mixed(
        0,
        0,
        &[Chunk { new_tokens: (loaded + 100) as u64, context_tokens: left as u64 }],
    ));
    assert_eq!(rec.first_token_at_s, seconds(ticks(200.0) + ticks(recompute)));
    assert!(out.metrics.get("tier.cpu.hit_rate").is_none(), "no tier metrics without tiers");
}

/// A CPU tier too small for A passes it on to the shared remote tier, whose link is slower.
#[test]
fn a_block_too_large_for_the_cpu_tier_goes_on_to_the_remote_tier() {
    let resolved = StepModels::resolve(&spec("")).unwrap();
    let sm = &resolved.main;
    let kv = sm.cost.kv_bytes_per_token;
    let cpu_gb = 10_000.0 * kv / 1e9;
    let yaml = format!(
        "kv_tiers: {{cpu: {{capacity_gb: {cpu_gb}, bandwidth_gbps: 400}}, remote: {{capacity_gb: 100, bandwidth_gbps: 100, base_latency_s: 0.001}}, layerwise: false}}"
    );
    let out = run(&spec(&yaml));
    let left = sm.kv_capacity_tokens as u32 - 20_001;
    let loaded = 20_000 - left;
    let load = 0.001 + loaded as f64 * kv / 12.5e9;
    let compute = sm.pricer.step_time_s(&Step::mixed(0, 0, &[Chunk { new_tokens: 100, context_tokens: 20_000 }]));
    assert_eq!(out.records[2].first_token_at_s, seconds(ticks(200.0) + ticks(compute + load)));
    let m = |k: &str| out.metrics.get(k).unwrap();
    assert_eq!(m("tier.cpu.tokens_loaded"), 0.0);
    assert_eq!(m("tier.remote.tokens_loaded"), loaded as f64);
    assert_eq!(m("tier.remote.offloaded_tokens"), 40_000.0);
}

/// Tiers never lose a request and replay exactly; on a preset with reuse they raise the hit
/// rate over GPU memory alone.
#[test]
fn tiers_keep_every_request_and_replay_exactly() {
    let mut spec = super::tests::preset("long_doc_qa");
    spec.requests = Some(300);
    let base = run_named(&spec, None, "round_robin", 1).unwrap();
    spec.kv_tiers = serde_norway::from_str("cpu: {capacity_gb: 64, bandwidth_gbps: 400}").ok();
    assert!(spec.kv_tiers.is_some());
    let a = run_named(&spec, None, "round_robin", 1).unwrap();
    assert_eq!(a, run_named(&spec, None, "round_robin", 1).unwrap());
    let m = |o: &RunOutcome, k: &str| o.metrics.get(k).unwrap();
    assert_eq!(m(&a, "completed"), 300.0);
    assert!(m(&a, "tier.hit_rate_all") > m(&base, "hit_rate"), "{:?}", a.metrics);
    assert!(m(&a, "tier.cpu.hit_rate") > 0.0);
}

/// Records the `tier.*.matched_tokens` signals of replica 0 at every decision.
struct SeesTiers(std::sync::Arc<std::sync::Mutex<Vec<(f64, f64)>>>);

impl routelab_policy_api::Policy for SeesTiers {
    const NAME: &'static str = "sees_tiers";
    const DESCRIPTION: &'static str = "test router";
    type Config = routelab_policies::NoConfig;
    type Context = routelab_policy_api::RouterContext;
    fn new(_: Self::Config, _: &Self::Context) -> Result<Self, String> {
        Ok(Self(Default::default()))
    }
}

impl routelab_policy_api::RouterPolicy for SeesTiers {
    fn signals(&self) -> Vec<String> {
        use routelab_policy_api::signals::{TIER_CPU_MATCHED_TOKENS, TIER_REMOTE_MATCHED_TOKENS};
        vec![TIER_CPU_MATCHED_TOKENS.into(), TIER_REMOTE_MATCHED_TOKENS.into()]
    }
    fn route(&mut self, _: &routelab_policy_api::Request<'_>, r: &routelab_policy_api::Replicas<'_>) -> usize {
        self.0.lock().unwrap().push((r.signal(0, 0), r.signal(0, 1)));
        0
    }
}

/// The routers' view of the tiers (policy-api 0.5.6): when the third request (A + C) arrives,
/// the GPU holds `left` tokens of A and the CPU tier the other `20,000 − left` — exactly what
/// its admission then loads (the hand count above); C is nowhere. Earlier decisions see nothing
/// below the GPU. With the CPU tier too small for A, the same tokens show as remote.
#[test]
fn routers_see_the_gpu_match_continued_in_the_tiers() {
    use abi_stable::sabi_trait::TD_Opaque;
    use routelab_policy_api::{Guarded, Router_TO};
    let resolved = StepModels::resolve(&spec("")).unwrap();
    let sm = &resolved.main;
    let loaded = 20_000 - (sm.kv_capacity_tokens as u32 - 20_001);
    let kv = sm.cost.kv_bytes_per_token;
    let small = 10_000.0 * kv / 1e9;
    for (tiers, want) in [
        ("kv_tiers: {cpu: {capacity_gb: 10, bandwidth_gbps: 400}}".to_string(), (loaded as f64, 0.0)),
        (
            format!(
                "kv_tiers: {{cpu: {{capacity_gb: {small}, bandwidth_gbps: 400}}, remote: {{capacity_gb: 100, bandwidth_gbps: 100}}}}"
            ),
            (0.0, loaded as f64),
        ),
    ] {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let router = Router_TO::from_value(Guarded::new(SeesTiers(seen.clone())), TD_Opaque);
        let out = run_cluster(&spec(&tiers), &stream(), router, "sees_tiers", 1).unwrap();
        assert_eq!(*seen.lock().unwrap(), [(0.0, 0.0), (0.0, 0.0), want], "{tiers}");
        // What the signals promised is what the admission loaded.
        let m = |k: &str| out.metrics.get(k).unwrap_or(0.0);
        assert_eq!((m("tier.cpu.tokens_loaded"), m("tier.remote.tokens_loaded")), want, "{tiers}");
    }
}
