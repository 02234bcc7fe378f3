//! Exercises 4 (the cluster's total cache) and 5 (priority groups), computed from the step model,
//! the generator, the `priority_groups` scheduler and short cluster runs.

use std::fmt::Write as _;

use routelab_policies::priority_groups::{Config as GroupsConfig, PriorityGroups, group_of};
use routelab_policy_api::{Policy, SchedulerContext, SchedulerPolicy, Waiting, WaitingRequest};

use routelab_core::plugin::{Loader, PolicySpec};
use routelab_core::sim::cluster::{self, RunOutcome};
use routelab_core::step_model::StepModel;
use routelab_core::workload::cluster::{ClusterSpec, Popularity, StepModels};
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
    let models = StepModels::resolve(spec).expect("valid");
    let r = Loader::new()
        .router(&PolicySpec::parse(router).expect("name"), &cluster::router_context_for(spec, &models, seed))
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
    let _ = writeln!(s, "Exercise 5 — priority groups (P = {p}; the scheduler: policies/src/priority_groups.rs)");
    let g = group_of(63, 100, p);
    let lecture_group = 63 * p / 100;
    let _ = writeln!(
        s,
        "63 of 100 prompt tokens cached → group floor(0.63 × {p}) = {lecture_group}; of every 55 requests taken \
         (10 + 9 + … + 1, one quota per group, the highest-hit group first) it gets {lecture_group}."
    );
    let _ = writeln!(
        s,
        "  That is the lecture's numbering: group g takes g. Preble's code, which routelab's `priority_groups` \
         follows, numbers from 0:\n  \
         group ceil(0.63 × {p}) − 1 = {g} with quota g + 1 = {} (0% cached → group 0, 100% → group {}), so the \
         same request gets {} of 55.\n  \
         Read literally the lecture's floor(h × P) has P + 1 values (0 for under 10% cached … {p} for fully \
         cached) for P quotas; the code gives the under-10% group quota 1 and puts 100% with 90–100%.",
        g + 1,
        p - 1,
        g + 1
    );
    // 10 waiting in every group; each step admits the whole order the scheduler returns. With
    // k = 1 a round of P steps takes 10 + 9 + … + 1 = 55, the lecture's example.
    let per_group = p as usize;
    let mut waiting: Vec<WaitingRequest> = (0..p as usize * per_group)
        .map(|i| {
            let cached = (i / per_group) as u32 * 10 + 5;
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
    let mut sched = PriorityGroups::new(GroupsConfig { groups: p, k: 1 }, &ctx).expect("valid config");
    let _ = writeln!(
        s,
        "One round of the scheduler (k = 1; {per_group} waiting in each group; one group served per admission step, \
         every step admits all it is offered):"
    );
    let mut taken_in_round = 0;
    for step in 1..=p {
        let mut order = Vec::new();
        sched.order(0.0, &Waiting::new(&waiting), &mut order);
        let w = &waiting[order[0] as usize];
        let grp = group_of(w.cached_tokens, w.prompt_tokens, p);
        taken_in_round += order.len();
        let _ = writeln!(
            s,
            "  step {step:>2}: code group {grp} ({:>2}–{:>3}% cached) admits {:>2} (quota g + 1 = {:>2})",
            grp * 10,
            grp * 10 + 10,
            order.len(),
            grp + 1
        );
        let taken: std::collections::HashSet<u32> = order.into_iter().collect();
        waiting =
            waiting.into_iter().enumerate().filter(|(i, _)| !taken.contains(&(*i as u32))).map(|(_, w)| w).collect();
    }
    let _ = writeln!(
        s,
        "  {taken_in_round} requests in the round. The default k = 10 multiplies every quota by 10 (100 … 10 per step)."
    );

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
    let mut cold = Vec::new();
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
        cold.push((lm, lx, hm));
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
    let ((fcfs_cold, _, fcfs_hit), (groups_cold, groups_cold_max, groups_hit)) = (cold[0], cold[1]);
    let _ = writeln!(
        s,
        "What the run shows: low-hit requests still wait long under priority groups ({groups_cold:.1} s on average, up \
         to {groups_cold_max:.1} s), {} than under FCFS ({fcfs_cold:.1} s); high-hit ones wait {groups_hit:.1} s instead \
         of {fcfs_hit:.1} s.",
        if groups_cold <= fcfs_cold { "but less" } else { "and longer" }
    );
    if groups_cold <= fcfs_cold {
        let _ = writeln!(
            s,
            "Why: at this load round robin keeps long queues on every replica, so whoever is admitted waits for the \
             queue. Priority groups admit the cheap high-hit prefills first, which drains the queue faster and shortens \
             the cold requests' wait too, while the quota still gives the cold group a turn in every round: their long \
             waits are load, not starvation. Where the rule itself hurts: with 512-token chunked prefill on a saturated \
             video cluster priority groups overload (docs/experiments.md, \"Preble ablations: local scheduler\")."
        );
    } else {
        let _ = writeln!(
            s,
            "Why: the cold group owns one quota in 55 per round, so while high-hit requests keep arriving a cold request \
             waits for its group's turn, and then for KV room for its long miss."
        );
    }
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
    fn exercise5_answers_the_lectures_question() {
        let t = super::exercise5();
        assert!(t.contains("group floor(0.63 × 10) = 6; of every 55 requests taken"), "{t}");
        assert!(t.contains("it gets 6."), "{t}");
        assert!(t.contains("group ceil(0.63 × 10) − 1 = 6 with quota g + 1 = 7"), "{t}");
        assert!(t.contains("step  1: code group 9 (90–100% cached) admits 10 (quota g + 1 = 10)"), "{t}");
        assert!(t.contains("step 10: code group 0 ( 0– 10% cached) admits  1 (quota g + 1 =  1)"), "{t}");
        assert!(t.contains("55 requests in the round"), "{t}");
    }
}
