//! LoRA adapters (`cluster.lora`): cold loads timed by hand, the `max_loras` gate, and which
//! requests get which adapter.

use routelab_policy_api::StepShape;

use super::tests::run_named;
use super::*;
use crate::time::{SimTime, ticks};
use crate::workload::generate::{NO_ADAPTER, apply_lora, generate};

fn spec(yaml: &str) -> ClusterSpec {
    let s: ClusterSpec = serde_norway::from_str(yaml).unwrap();
    s.validate().unwrap();
    s
}

/// One replica, requests far apart (each ends before the next arrives) of a unique 100-token
/// prompt and `output` tokens, on 2 adapters of 200 MB loaded at 2 GB/s (0.1 s).
fn one_replica(lora: &str, output: u32, rate: f64, requests: u32) -> ClusterSpec {
    spec(&format!(
        "replicas: 1\nchunk_tokens: 4096\n\
         generator: {{system_prompt_tokens: 0, suffix_tokens: 100, output_tokens: {output}}}\n\
         lora: {{adapters: 2, size_mb: 200, load_gb_per_s: 2, {lora}}}\n\
         arrivals: {{poisson: {{rate: {rate}}}}}\nrequests: {requests}\n"
    ))
}

fn run_with(s: &ClusterSpec, st: &crate::workload::generate::RequestStream) -> RunOutcome {
    let resolved = StepModels::resolve(s).unwrap();
    let r = crate::plugin::Loader::new()
        .router(&crate::plugin::PolicySpec::parse("round_robin").unwrap(), &router_context_for(s, &resolved, 1))
        .unwrap();
    crate::runner::run_cluster(s, st, r, "round_robin", 1).unwrap()
}

/// Adapters 0, 0, 1, 0 with one adapter kept loaded: the first request loads adapter 0 (its
/// one step = the 100-token prefill + 0.1 s), the second finds it, the third loads adapter 1
/// (evicting 0), the fourth loads 0 again. Three loads, one hit.
#[test]
fn a_cold_load_lengthens_the_step_that_needs_it_by_size_over_bandwidth() {
    let s = one_replica("max_loras: 1, max_cpu_loras: 1", 1, 0.001, 4);
    let mut st = generate(&s, None, 1).unwrap();
    st.adapters = vec![0, 0, 1, 0];
    let c = s.step_model().unwrap().cost;
    let prefill = c.shape_time_s(&StepShape::prefill(100, 0));
    assert!((s.lora.as_ref().unwrap().load_s() - 0.1).abs() < 1e-12);
    let out = run_with(&s, &st);
    let took: Vec<SimTime> = out.records.iter().map(|r| ticks(r.completed_at_s) - ticks(r.arrived_at_s)).collect();
    let (cold, warm) = (ticks(prefill + 0.1).max(SimTime::TICK), ticks(prefill).max(SimTime::TICK));
    assert_eq!(took, [cold, warm, cold, cold]);
    assert_eq!(out.metrics.get("lora_loads"), Some(3.0));
    assert_eq!(out.metrics.get("lora_hit_rate"), Some(0.25));
    assert!((out.metrics.get("lora_load_s").unwrap() - 0.3).abs() < 1e-9);
    // Two adapters kept loaded: only the first use of each is cold.
    let s2 = one_replica("max_loras: 1, max_cpu_loras: 2", 1, 0.001, 4);
    let out = run_with(&s2, &st);
    assert_eq!(out.metrics.get("lora_loads"), Some(2.0));
    let took: Vec<SimTime> = out.records.iter().map(|r| ticks(r.completed_at_s) - ticks(r.arrived_at_s)).collect();
    assert_eq!(took, [cold, warm, cold, warm]);
    // No `max_loras`: every adapter is loaded from the start, as without `lora:`.
    let s3 = one_replica("popularity: uniform", 1, 0.001, 4);
    let out = run_with(&s3, &st);
    assert_eq!(out.metrics.get("lora_loads"), Some(0.0));
    assert_eq!(out.metrics.get("lora_hit_rate"), Some(1.0));
    let took: Vec<SimTime> = out.records.iter().map(|r| ticks(r.completed_at_s) - ticks(r.arrived_at_s)).collect();
    assert_eq!(took, [warm; 4]);
}

/// Two requests at once on two adapters, `max_loras: 1`: the second is admitted only when the
/// first has left the batch; with `max_loras: 2` both run together.
#[test]
fn a_batch_uses_at_most_max_loras_adapters() {
    let s = one_replica("max_loras: 1, max_cpu_loras: 2", 50, 1000.0, 2);
    let mut st = generate(&s, None, 1).unwrap();
    st.adapters = vec![0, 1];
    let out = run_with(&s, &st);
    let r = &out.records;
    assert!(r[1].admitted_at_s >= r[0].completed_at_s, "{} < {}", r[1].admitted_at_s, r[0].completed_at_s);
    let s2 = one_replica("max_loras: 2", 50, 1000.0, 2);
    let out = run_with(&s2, &st);
    let r = &out.records;
    assert!(r[1].admitted_at_s < r[0].completed_at_s);
    // The same adapter twice never waits for a slot.
    st.adapters = vec![1, 1];
    let out = run_with(&s, &st);
    assert!(out.records[1].admitted_at_s < out.records[0].completed_at_s);
}

/// A session's turns share one adapter; requests on different adapters share no segment (the
/// KV is the adapter's own); `base_share` leaves that share of sessions on the base model; the
/// draw moves no arrival or size.
#[test]
fn sessions_draw_one_adapter_and_adapters_share_no_kv() {
    let mut s = tests::preset("tool_use");
    s.requests = Some(3000);
    s.generator.turns = crate::workload::cluster::Tokens::Constant(3);
    s.lora = Some(serde_norway::from_str("{adapters: 16, popularity: {zipf: {s: 1.0}}, base_share: 0.25}").unwrap());
    let plain = generate(&s, None, 3).unwrap();
    let mut st = plain.clone();
    apply_lora(&s, &mut st, 3);
    assert_eq!(st.adapters.len(), st.requests.len());
    for (a, b) in plain.requests.iter().zip(&st.requests) {
        assert_eq!((a.arrived_at, a.prompt_tokens, a.output_tokens), (b.arrived_at, b.prompt_tokens, b.output_tokens));
    }
    let base = st.adapters.iter().filter(|&&a| a == NO_ADAPTER).count() as f64 / st.adapters.len() as f64;
    assert!((base - 0.25).abs() < 0.05, "{base}");
    let top = st.adapters.iter().filter(|&&a| a == 0).count();
    let last = st.adapters.iter().filter(|&&a| a == 15).count();
    assert!(top > 4 * last, "Zipf: adapter 0 is the most popular ({top} vs {last})");
    // Turns of one group share their first suffix; all of them carry the same adapter.
    let mut by_key = std::collections::HashMap::new();
    for i in 0..plain.requests.len() {
        let key = plain.prompt(i).iter().find(|g| g.id >= 1 << 32).unwrap().id;
        assert_eq!(*by_key.entry(key).or_insert(st.adapters[i]), st.adapters[i], "request {i}");
    }
    // The system prompt is one segment per adapter (and the base model's own).
    let mut system: std::collections::HashMap<u32, u64> = Default::default();
    for i in 0..st.requests.len() {
        let id = st.prompt(i)[0].id;
        assert_eq!(*system.entry(st.adapters[i]).or_insert(id), id);
    }
    let ids: std::collections::HashSet<u64> = system.values().copied().collect();
    assert_eq!(ids.len(), system.len(), "two adapters share a system prompt's KV");
    // The same seed gives the same adapters.
    let mut again = plain.clone();
    apply_lora(&s, &mut again, 3);
    assert_eq!(again.adapters, st.adapters);
}

/// llm-d's LoRA affinity scorer cuts cold loads on the many-adapters preset against the
/// scorer-less llm_d and round robin (the same seed and stream for each; the first 3,000
/// requests, where the margin over llm_d is smaller than over the whole preset).
#[test]
fn the_lora_affinity_scorer_loads_fewer_adapters() {
    let mut s = tests::preset("lora/many_adapters");
    s.requests = Some(3000);
    let loads = |p: &str| run_named(&s, None, p, 1).unwrap().metrics.get("lora_loads").unwrap();
    let (rr, plain, lora) = (loads("round_robin"), loads("llm_d"), loads("llm_d{lora_weight: 2}"));
    assert!(lora < plain && lora < 0.5 * rr, "{lora} vs llm_d {plain}, round_robin {rr}");
}
