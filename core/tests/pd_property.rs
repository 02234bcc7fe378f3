//! Property test of the P/D world (issue 26): random small valid disaggregated workloads — pools
//! of every shape, GPUs, links from slow to fast, prompts and outputs from one token up, loads
//! from idle to flooded — run with every P/D router. Every request ends exactly once (served,
//! rejected by the router, or counted unfinished when the run stops `drain_s` after the last
//! arrival, which marks it overloaded), nothing happens before a request arrives or past the
//! clock, and the figures agree with the records. A seeded loop (no proptest in the workspace): each case's
//! YAML is printed when it fails, so it can be replayed with `routelab compare`.
//!
//! Run it in the checked profile (`cargo test --profile checked`): the simulator's own
//! invariants (no event scheduled past the clock, every request completes once) are debug
//! assertions there.

use std::path::Path;

use rand::{RngExt, SeedableRng};
use routelab_core::plugin::{Loader, PolicySpec};
use routelab_core::runner;
use routelab_core::seeds::SimRng;
use routelab_core::sim::cluster::router_context_for;
use routelab_core::workload;
use routelab_core::workload::cluster::StepModels;

/// The largest time the clock holds (u64 nanoseconds), in seconds.
const CLOCK_S: f64 = u64::MAX as f64 / 1e9;

const ROUTERS: &[&str] = &["pd_least_loaded", "pd_round_robin", "pd_random", "pd_sglang", "pd_dynamo", "pd_mooncake"];

fn pick<'a, T>(rng: &mut SimRng, xs: &'a [T]) -> &'a T {
    &xs[rng.random_range(0..xs.len())]
}

/// A random small P/D workload (most of them valid; validation decides).
fn case(rng: &mut SimRng) -> String {
    let (p, d) = (rng.random_range(1..=3u32), rng.random_range(1..=3u32));
    let m = *pick(rng, &[0u32, 0, 1, 2]);
    let gpus = ["a6000", "a100-80", "h100", "l40s"];
    // Pools with their own GPU or tp: pools of different memory (the mixed-pool transfer bug).
    let pool = |rng: &mut SimRng, n: u32| {
        let gpu = if rng.random_bool(0.3) { format!(", gpu: {}", pick(rng, &gpus)) } else { String::new() };
        let tp = if rng.random_bool(0.3) { format!(", tp: {}", pick(rng, &[1u32, 2, 4])) } else { String::new() };
        format!("{{instances: {n}{gpu}{tp}}}")
    };
    let (prefill, decode, mixed) = (pool(rng, p), pool(rng, d), pool(rng, m));
    let mixed = if m > 0 { format!("    mixed: {mixed}\n") } else { String::new() };
    let bandwidth = pick(rng, &[0.01, 0.5, 10.0, 100.0, 1e4]);
    let latency = pick(rng, &[0.0, 0.001, 0.2]);
    let transfer = pick(rng, &["missing", "full_prompt"]);
    let layerwise = rng.random_bool(0.3);
    let system = pick(rng, &[0u32, 64, 2000]);
    let (lo, hi) = *pick(rng, &[(1u32, 1u32), (1, 50), (100, 3000), (2000, 12000)]);
    let out = *pick(rng, &[(1u32, 1u32), (1, 20), (50, 400)]);
    let rate = pick(rng, &[0.01, 1.0, 20.0, 5000.0]);
    let requests = rng.random_range(1..=60u32);
    let model = pick(rng, &["mistral-7b", "llama-3-8b"]);
    format!(
        "name: pd_case\nseed: {seed}\ncluster:\n  replicas: {replicas}\n  gpu: {gpu}\n  model: {model}\n  \
         disaggregation:\n    prefill: {prefill}\n    decode: {decode}\n{mixed}    \
         link: {{bandwidth_gbps: {bandwidth}, base_latency_s: {latency}, layerwise: {layerwise}}}\n    \
         transfer: {transfer}\n  generator:\n    system_prompt_tokens: {system}\n    \
         suffix_tokens: {{uniform: {{min: {lo}, max: {hi}}}}}\n    \
         output_tokens: {{uniform: {{min: {}, max: {}}}}}\n  arrivals:\n    poisson: {{rate: {rate}}}\n  \
         requests: {requests}\n",
        out.0,
        out.1,
        seed = rng.random_range(0..1000u64),
        replicas = p + d + m,
        gpu = pick(rng, &gpus),
    )
}

#[test]
fn random_small_pd_workloads_end_every_request_exactly_once_within_the_clock() {
    let mut rng = SimRng::seed_from_u64(26);
    let mut loader = Loader::new();
    let (mut valid, mut runs, mut rejected_somewhere) = (0, 0, 0);
    let file = Path::new("pd_case.yaml");
    for _ in 0..400 {
        let yaml = case(&mut rng);
        let Ok(w) = workload::parse(&yaml, file) else { continue };
        let Ok(prepared) = runner::prepare(w, file) else { continue };
        let Ok(input) = prepared.seed_input(0) else { continue };
        valid += 1;
        let c = prepared.workload.cluster.as_ref().expect("a cluster workload");
        let resolved = StepModels::resolve(c).expect("prepared");
        let stream = input.stream().expect("cluster world");
        let n = stream.requests.len();
        for name in ROUTERS {
            let router = loader
                .router(&PolicySpec::parse(name).unwrap(), &router_context_for(c, &resolved, input.seed))
                .unwrap();
            let out = runner::run_cluster(c, stream, router, name, input.seed)
                .unwrap_or_else(|e| panic!("{name} failed: {e}\n{yaml}"));
            runs += 1;
            assert_eq!(out.records.len(), n, "{name}: a record per request\n{yaml}");
            let mut served = 0;
            for (r, q) in out.records.iter().zip(&stream.requests) {
                let arrived = q.arrived_at.as_seconds();
                assert!(arrived.is_finite() && arrived < CLOCK_S, "{name}: arrival {arrived}\n{yaml}");
                if r.completed_at_s.is_nan() {
                    continue; // rejected: counted below
                }
                served += 1;
                let (first, done) = (r.first_token_at_s, r.completed_at_s);
                assert!(
                    arrived <= r.admitted_at_s && r.admitted_at_s <= first && first <= done && done < CLOCK_S,
                    "{name}: arrived {arrived}, admitted {}, first token {first}, done {done}\n{yaml}",
                    r.admitted_at_s
                );
            }
            let m = |k: &str| out.metrics.get(k).unwrap_or_else(|| panic!("{name}: no `{k}`\n{yaml}"));
            let rejected = m("rejected") as usize;
            rejected_somewhere += usize::from(rejected > 0);
            // Unfinished: still running `drain_s` after the last arrival, where the run stops
            // (then it is marked overloaded).
            let unfinished = m("unfinished") as usize;
            assert_eq!(
                served + rejected + unfinished,
                n,
                "{name}: {served} served + {rejected} rejected + {unfinished} unfinished of {n}\n{yaml}"
            );
            assert!(unfinished == 0 || m("overloaded") == 1.0, "{name}: unfinished but not overloaded\n{yaml}");
            assert_eq!(m("completed") as usize, served, "{name}\n{yaml}");
            for k in ["ttft_mean_s", "latency_p99_s", "transfer_time_mean_s"] {
                let v = m(k);
                assert!(v.is_nan() || (0.0..CLOCK_S).contains(&v), "{name}: {k} = {v}\n{yaml}");
            }
        }
    }
    // Not vacuous: most cases are valid and run with every router.
    assert!(valid >= 200, "only {valid} of 400 random cases were valid");
    assert_eq!(runs, valid * ROUTERS.len());
    eprintln!("{valid} workloads, {runs} runs, {rejected_somewhere} with rejections");
}

/// Found by fuzz/pd_world: a KV transfer to a *mixed* instance was admitted against the decode
/// pool's memory. With a tp-2 decode pool (twice the KV) beside a tp-1 mixed pool, the mixed
/// instance took more than it holds and, under `reservation: full`, the batcher's "full
/// reservation never runs out" invariant broke (a panic in the checked profile; KV beyond
/// capacity otherwise). The case as the fuzzer found it, with every P/D router.
#[test]
fn a_transfer_to_a_mixed_instance_is_admitted_against_its_own_memory() {
    let yaml = "name: pd_fuzz\nseed: 35\ncluster:\n  replicas: 8\n  gpu: a6000\n  model: mistral-7b\n  \
                disaggregation:\n    prefill: {instances: 3, gpu: a6000}\n    decode: {instances: 3, gpu: a6000, tp: 2}\n    \
                mixed: {instances: 2, gpu: a100-80}\n    link: {bandwidth_gbps: 1.0, base_latency_s: 0.001, layerwise: true}\n    \
                transfer: full_prompt\n  generator:\n    system_prompt_tokens: 2000\n    \
                suffix_tokens: {uniform: {min: 4000, max: 30000}}\n    output_tokens: {uniform: {min: 50, max: 300}}\n  \
                arrivals:\n    poisson: {rate: 100000.0}\n  requests: 36\n";
    let file = Path::new("pd_fuzz.yaml");
    let prepared = runner::prepare(workload::parse(yaml, file).unwrap(), file).unwrap();
    let input = prepared.seed_input(0).unwrap();
    let c = prepared.workload.cluster.as_ref().unwrap();
    let resolved = StepModels::resolve(c).unwrap();
    let stream = input.stream().unwrap();
    let mut loader = Loader::new();
    for name in ROUTERS.iter().chain(&["pd_llm_d", "pd_aibrix"]) {
        let router =
            loader.router(&PolicySpec::parse(name).unwrap(), &router_context_for(c, &resolved, input.seed)).unwrap();
        let out = runner::run_cluster(c, stream, router, name, input.seed).unwrap();
        let m = |k: &str| out.metrics.get(k).unwrap();
        let served = out.records.iter().filter(|r| !r.completed_at_s.is_nan()).count();
        assert_eq!(served + m("rejected") as usize + m("unfinished") as usize, stream.requests.len(), "{name}");
    }
}
