//! Exercises 4 (the cluster's total cache) and 5 (priority groups), computed from the step model,
//! the generator, the `priority_groups` scheduler and short cluster runs.

use std::fmt::Write as _;

use routelab_policies::priority_groups::{Config as GroupsConfig, PriorityGroups, group_of};
use routelab_policy_api::{Policy, SchedulerContext, SchedulerPolicy, Waiting, WaitingRequest};

use routelab_core::plugin::{Loader, PolicySpec};
use routelab_core::sim::cluster::{self, RunOutcome};
use routelab_core::step_model::StepModel;
use routelab_core::workload::cluster::{ClusterSpec, Popularity};
use routelab_core::workload::generate::{Popular, generate};

/// The long-document preset (the same numbers as workloads/cluster/long_doc_qa.yaml).
fn long_doc_qa(requests: u64, rate: f64, scheduler: &str) -> ClusterSpec {
    let yaml = format!(
        "replicas: 4\ngpu: a6000\nmodel: mistral-7b\nscheduler: \"{scheduler}\"\n\
         generator: {{system_prompt_tokens: 13, contexts: {{count: 300, tokens: {{lognormal: {{mean: 21000, cv: 0.15, max: 30000}}}}, \
         popularity: {{zipf: {{s: 1.1}}}}}}, suffix_tokens: {{uniform: {{min: 1500, max: 2500}}}}, output_tokens: {{uniform: {{min: 8, max: 24}}}}}}\n\
         arrivals: {{poisson: {{rate: {rate}}}}}\nrequests: {requests}\n"
    );
    let spec: ClusterSpec = serde_norway::from_str(&yaml).expect("built-in spec parses");
    spec.validate().expect("built-in spec is valid");
    spec
}

/// One run of a built-in `router` on `spec` (aggregated or disaggregated) with `seed`.
pub(super) fn run(spec: &ClusterSpec, router: &str, seed: u64) -> RunOutcome {
    let sm = spec.step_model().expect("valid");
    let r = Loader::new()
        .router(&PolicySpec::parse(router).expect("name"), &cluster::router_context_for(spec, &sm, seed))
        .expect("built-in router");
    let stream = generate(spec, None, seed).expect("synthetic stream");
    routelab_core::runner::run_cluster(spec, &stream, r, router, seed).expect("built-in policies do not fail")
}

/// Exercise 4: KV capacity, documents per replica, distinct documents under round robin versus
/// partitioning, and the Zipf share of the hottest documents.
pub fn exercise4() -> String {
    let mut s = String::new();
    let sm = StepModel::from_catalog("a6000", "mistral-7b", 1, 0.9).expect("mistral-7b fits on an a6000");
    let doc = 21_000u64;
    let (docs, replicas, zipf) = (300u32, 4u64, 1.1);
    let per_replica = sm.kv_capacity_tokens / doc;
    let _ = writeln!(
        s,
        "Exercise 4 — the cluster's total cache (step model: routelab step-model --gpu a6000 --model mistral-7b)"
    );
    let _ = writeln!(
        s,
        "KV per token: 2 × {} layers × {} KV heads × {} head dim × {} bytes = {} bytes",
        sm.model.layers, sm.model.kv_heads, sm.model.head_dim, sm.model.bytes_per_element, sm.cost.kv_bytes_per_token
    );
    let _ = writeln!(
        s,
        "KV capacity at memory_fraction {}: floor(({} GB × {} − {:.3} GB weights) / {} B) = {} tokens",
        sm.memory_fraction,
        sm.gpu.memory_gb,
        sm.memory_fraction,
        sm.cost.weight_bytes / 1e9,
        sm.cost.kv_bytes_per_token,
        sm.kv_capacity_tokens
    );
    let _ = writeln!(
        s,
        "Documents of {doc} tokens per replica: {} / {doc} = {:.2} → {per_replica} whole documents",
        sm.kv_capacity_tokens,
        sm.kv_capacity_tokens as f64 / doc as f64
    );
    let popular = Popular::new(docs, &Popularity::Zipf { s: zipf });
    let top = |k: usize| (0..k).map(|i| popular.share(i)).sum::<f64>();
    let _ = writeln!(s, "\n{docs} documents, {replicas} replicas, Zipf s = {zipf}:");
    let _ = writeln!(
        s,
        "  round robin: every replica sees the same popularity, so each caches (about) the same {per_replica} hottest documents: \
         ~{per_replica} distinct documents in the cluster, serving {:.1}% of the traffic from cache at best",
        top(per_replica as usize) * 100.0
    );
    let _ = writeln!(
        s,
        "  ideal partitioning: {replicas} × {per_replica} = {} distinct documents (each cached once), serving {:.1}% of the traffic",
        replicas * per_replica,
        top((replicas * per_replica) as usize) * 100.0
    );
    let _ = writeln!(
        s,
        "  traffic share of the three hottest documents: {:.1}% + {:.1}% + {:.1}% = {:.1}%",
        popular.share(0) * 100.0,
        popular.share(1) * 100.0,
        popular.share(2) * 100.0,
        top(3) * 100.0
    );
    let spec = long_doc_qa(1000, 1.0, "fcfs");
    let o = run(&spec, "round_robin", 1);
    let g = |k: &str| o.metrics.get(k).unwrap_or(f64::NAN);
    let _ = writeln!(
        s,
        "\nMeasured (routelab compare long_doc_qa --policies round_robin, 1,000 requests at 1/s, seed 1):\n  \
         hit rate {:.3} (the question, ~2K of ~23K tokens, can never hit), replication factor {:.2} (cached tokens ÷ distinct cached tokens, \
         including the never-shared questions that stay cached)",
        g("hit_rate"),
        g("replication_factor")
    );
    s
}

/// Exercise 5: the group of 63/100 cached, the quota of 55 requests, and a run where low-hit
/// requests wait long.
pub fn exercise5() -> String {
    let mut s = String::new();
    let p = 10;
    let _ = writeln!(s, "Exercise 5 — priority groups (policies/src/priority_groups.rs, P = {p})");
    let g = group_of(63, 100, p);
    let _ = writeln!(
        s,
        "63 of 100 prompt tokens cached: group ceil(0.63 × {p}) − 1 = {g} (priority {}; 0% → group 0, 100% → group {})",
        g + 1,
        p - 1
    );
    // 60 waiting requests in every group; each step admits the whole order the scheduler returns.
    let mut waiting: Vec<WaitingRequest> = (0..p * 60)
        .map(|i| {
            let cached = (i / 60) * 10 + 5;
            WaitingRequest {
                id: i as u64,
                arrived_at: i as f64,
                prompt_tokens: 100,
                cached_tokens: cached,
                remaining_prefill_tokens: 100 - cached,
            }
        })
        .collect();
    let ctx = SchedulerContext::new(0, 0, 0);
    let mut sched = PriorityGroups::new(GroupsConfig { groups: p, k: 10 }, &ctx).expect("valid config");
    let _ = writeln!(
        s,
        "One round of admission steps (60 waiting in each group, k = 10; every step admits all it is offered):"
    );
    for step in 1..=p {
        let mut order = Vec::new();
        sched.order(0.0, &Waiting::new(&waiting), &mut order);
        let w = &waiting[order[0] as usize];
        let grp = group_of(w.cached_tokens, w.prompt_tokens, p);
        let _ = writeln!(
            s,
            "  step {step:>2}: group {grp} (priority {:>2}, {:>2}–{:>3}% cached) admits {:>2} (quota {:>3})",
            grp + 1,
            grp * 10,
            grp * 10 + 10,
            order.len(),
            (grp + 1) * 10
        );
        let taken: std::collections::HashSet<u32> = order.into_iter().collect();
        waiting =
            waiting.into_iter().enumerate().filter(|(i, _)| !taken.contains(&(*i as u32))).map(|(_, w)| w).collect();
    }

    // A loaded long-document cluster: hot documents hit, cold ones miss.
    let (rate, requests) = (1.5, 600u64);
    let _ = writeln!(
        s,
        "\nWhen do low-hit requests still wait long? Run: long_doc_qa (4 × mistral-7b on a6000, 300 documents, Zipf 1.1) at {rate} requests/s, \
         {requests} requests, round_robin, seed 1, scheduler fcfs versus priority_groups. Wait = arrival → admission, by cached fraction at admission:"
    );
    let _ = writeln!(
        s,
        "  {:<16} {:>22} {:>22} {:>12} {:>11}",
        "scheduler", "cached < 10%: mean/max", "cached ≥ 50%: mean/max", "latency p99", "overloaded"
    );
    for sched in ["fcfs", "priority_groups"] {
        let o = run(&long_doc_qa(requests, rate, sched), "round_robin", 1);
        let stats = |keep: &dyn Fn(f64) -> bool| {
            let waits: Vec<f64> = o
                .records
                .iter()
                .filter(|r| r.admitted_at_s.is_finite() && keep(r.cached_tokens as f64 / r.prompt_tokens as f64))
                .map(|r| r.admitted_at_s - r.arrived_at_s)
                .collect();
            let mean = waits.iter().sum::<f64>() / waits.len().max(1) as f64;
            (mean, waits.iter().copied().fold(0.0, f64::max), waits.len())
        };
        let (lm, lx, ln) = stats(&|f| f < 0.1);
        let (hm, hx, hn) = stats(&|f| f >= 0.5);
        let _ = writeln!(
            s,
            "  {sched:<16} {:>8.2} / {:>6.2} s (n={ln:>3}) {:>7.2} / {:>6.2} s (n={hn:>3}) {:>10.2} s {:>11}",
            lm,
            lx,
            hm,
            hx,
            o.metrics.get("latency_p99_s").unwrap_or(f64::NAN),
            if o.metrics.get("overloaded") == Some(1.0) { "yes" } else { "no" }
        );
    }
    let _ = writeln!(
        s,
        "Why: a group-0 request owns one slot in 55, and each step admits only what its 512-token prefill budget and KV memory allow, \
         so while high-hit requests keep arriving a cold request waits for its slot to come round; and when its turn comes a 21K-token \
         miss needs KV room that a full replica frees only as requests finish (admission stops at the first request that does not fit). \
         FCFS waits are ordered by arrival instead: nobody overtakes, so misses delay hits rather than the reverse."
    );
    s
}

#[cfg(test)]
mod tests {
    #[test]
    fn exercise4_prints_the_anchors() {
        let t = super::exercise4();
        assert!(t.contains("219089 tokens"), "{t}");
        assert!(t.contains("→ 10 whole documents"), "{t}");
        assert!(t.contains("4 × 10 = 40 distinct"), "{t}");
    }

    #[test]
    fn exercise5_prints_the_papers_numbers() {
        let t = super::exercise5();
        assert!(t.contains("group ceil(0.63 × 10) − 1 = 6"), "{t}");
        assert!(t.contains("step 10: group 0 (priority  1,  0– 10% cached) admits 10 (quota  10)"), "{t}");
        assert!(t.contains("step  1: group 9 (priority 10, 90–100% cached) admits 60 (quota 100)"), "{t}");
    }
}
