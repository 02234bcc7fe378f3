//! Exercise 9: which routing decisions change under prefill/decode disaggregation (xPyD), and
//! whether Preble's P/D pairing still makes sense — computed from cluster runs.

use std::fmt::Write as _;

use super::cluster::run;
use routelab_core::sim::cluster::RunOutcome;
use routelab_core::workload::cluster::ClusterSpec;

/// workloads/cluster/pd/aggregated_vs_disaggregated.yaml's cluster with `pools` = (P, D), or
/// aggregated when `None`, at `rate` requests/s.
fn chat(pools: Option<(u32, u32)>, rate: f64, requests: u64) -> ClusterSpec {
    let pd = pools.map_or(String::new(), |(p, d)| {
        format!(
            "disaggregation: {{prefill: {{instances: {p}}}, decode: {{instances: {d}}}, link: {{bandwidth_gbps: 100}}}}\n"
        )
    });
    let yaml = format!(
        "replicas: 8\ngpu: a6000\nmodel: mistral-7b\n{pd}\
         generator: {{system_prompt_tokens: 200, suffix_tokens: {{lognormal: {{mean: 1300, cv: 0.6, max: 6000}}}}, \
         output_tokens: {{uniform: {{min: 100, max: 400}}}}}}\n\
         arrivals: {{poisson: {{rate: {rate}}}}}\nrequests: {requests}\n"
    );
    let spec: ClusterSpec = serde_norway::from_str(&yaml).expect("built-in spec parses");
    spec.validate().expect("built-in spec is valid");
    spec
}

/// workloads/cluster/tool_use.yaml's cluster (8 A6000s), aggregated or as `pools`.
fn tool_use(pools: Option<(u32, u32)>, requests: u64) -> ClusterSpec {
    let pd = pools.map_or(String::new(), |(p, d)| {
        format!(
            "disaggregation: {{prefill: {{instances: {p}}}, decode: {{instances: {d}}}, link: {{bandwidth_gbps: 100}}}}\n"
        )
    });
    let yaml = format!(
        "replicas: 8\ngpu: a6000\nmodel: mistral-7b\n{pd}\
         generator: {{system_prompt_tokens: 300, contexts: {{count: 500, tokens: {{lognormal: {{mean: 1300, cv: 0.25, max: 4000}}}}, \
         popularity: {{zipf: {{s: 1.5}}}}}}, suffix_tokens: {{uniform: {{min: 100, max: 300}}}}, \
         output_tokens: {{uniform: {{min: 10, max: 76}}}}}}\n\
         arrivals: {{poisson: {{rate: 80}}}}\nrequests: {requests}\n"
    );
    let spec: ClusterSpec = serde_norway::from_str(&yaml).expect("built-in spec parses");
    spec.validate().expect("built-in spec is valid");
    spec
}

/// Prefill and decode instances of a disaggregated layout (`None`: aggregated).
type Pools = Option<(u32, u32)>;

/// (TTFT mean, TPOT mean, TPOT p99) in ms, from the run's metrics.
fn figures(o: &RunOutcome) -> (f64, f64, f64) {
    let ms = |key: &str| o.metrics.get(key).expect("every cluster run reports it") * 1e3;
    (ms("ttft_mean_s"), ms("tpot_mean_s"), ms("tpot_p99_s"))
}

/// Exercise 9.
pub fn exercise9() -> String {
    let mut s = String::new();
    let n = 1500;
    let _ = writeln!(s, "Exercise 9 — routing under prefill/decode disaggregation (xPyD)");
    let _ = writeln!(
        s,
        "Cluster: 8 A6000s, Mistral-7B, chat-like prompts (~1,500 tokens) and 100-400-token answers \
         (workloads/cluster/pd/aggregated_vs_disaggregated.yaml), {n} requests, seed 1.\n"
    );
    let _ = writeln!(
        s,
        "1. Aggregated (least_work_left, chunked prefill) vs disaggregated (pd_sglang, least_work_left per pool):"
    );
    let _ = writeln!(s, "   rate/s | layout | TTFT mean ms | TPOT mean ms | TPOT p99 ms");
    let layouts = [
        ("8 aggregated", None as Pools, "least_work_left"),
        ("4P4D", Some((4, 4)), "pd_sglang{prefill: least_work_left, decode: least_work_left}"),
        ("6P2D", Some((6, 2)), "pd_sglang{prefill: least_work_left, decode: least_work_left}"),
    ];
    for rate in [4.0, 12.0, 20.0] {
        for (name, pools, router) in &layouts {
            let (ttft, tpot, p99) = figures(&run(&chat(*pools, rate, n), router, 1));
            let _ = writeln!(s, "   {rate:>6} | {name:<12} | {ttft:>12.1} | {tpot:>12.1} | {p99:>11.1}");
        }
    }
    let _ = writeln!(
        s,
        "   Disaggregation removes prefill chunks from decode steps (TPOT tails); it adds a transfer and \
         takes GPUs from one phase, so with too few decode instances TPOT and TTFT (waiting for decode memory) grow."
    );

    let pd = chat(Some((4, 4)), 12.0, n);
    let _ = writeln!(s, "\n2. Which decisions change (4P4D at 12/s):");
    for (label, router) in [
        ("independent (pd_sglang)", "pd_sglang{prefill: least_work_left, decode: least_work_left}"),
        ("decode first + decider (pd_llm_d)", "pd_llm_d"),
        ("prefill first + bypass (pd_dynamo)", "pd_dynamo{conditional_disagg: true}"),
        ("joint over pairs (pd_aibrix)", "pd_aibrix"),
        ("joint + admission (pd_mooncake)", "pd_mooncake"),
    ] {
        let o = run(&pd, router, 1);
        let g = |k: &str| o.metrics.get(k).unwrap_or(f64::NAN);
        let (ttft, tpot, p99) = figures(&o);
        let _ = writeln!(
            s,
            "   {label:<36} TTFT {ttft:>6.1} ms, TPOT {tpot:>5.1} / p99 {p99:>5.1} ms, prefill-pool skipped {:>5.1}%, \
             prefill hit {:.3}, decode hit {:.3}, rejected {}",
            g("decode_only_share") * 100.0,
            g("prefill_hit_rate"),
            g("decode_hit_rate"),
            g("rejected")
        );
    }
    let _ = writeln!(
        s,
        "   The decision is now a pair (or a pair plus \"skip the prefill pool\", or \"reject\"): prefix affinity \
         matters on the prefill side, memory and batch load on the decode side, and the decode side's cache only \
         shortens transfers or lets a request skip the prefill pool."
    );

    let _ = writeln!(
        s,
        "\n3. Preble's P/D pairing sends a prefill-heavy (exploring) request to the replica whose recent prompts hit \
         most, i.e. one busy decoding, to mix phases on a replica. Tool use (workloads/cluster/tool_use.yaml's \
         traffic, 80/s, {n} requests), aggregated vs 4P4D with Preble routing the prefill pool:"
    );
    let mut got = Vec::new();
    let (mut busy_prefill, mut busy_decode) = (Vec::new(), Vec::new());
    for (name, pools, router, key) in [
        ("aggregated", None, "preble", "router.pd_paired_decisions"),
        ("aggregated", None, "preble{pd_pairing: false}", "router.pd_paired_decisions"),
        (
            "4P4D",
            Some((4, 4)),
            "pd_sglang{prefill: preble, decode: least_work_left}",
            "router.prefill_pd_paired_decisions",
        ),
        (
            "4P4D",
            Some((4, 4)),
            "pd_sglang{prefill: \"preble{pd_pairing: false}\", decode: least_work_left}",
            "router.prefill_pd_paired_decisions",
        ),
    ] {
        let o = run(&tool_use(pools, n), router, 1);
        let (ttft, tpot, p99) = figures(&o);
        let paired = o.metrics.get(key).unwrap_or(f64::NAN);
        let busy = match (o.metrics.get("prefill_utilisation"), o.metrics.get("decode_utilisation")) {
            (Some(p), Some(d)) => {
                busy_prefill.push(p);
                busy_decode.push(d);
                format!(", prefill pool busy {:.0}%, decode pool {:.0}%", p * 100.0, d * 100.0)
            }
            _ => String::new(),
        };
        let _ = writeln!(
            s,
            "   {name:<10} {router}\n{:<14}TTFT {ttft:>7.1} ms, TPOT {tpot:>5.1} / p99 {p99:>5.1} ms, paired {paired}{busy}",
            ""
        );
        got.push((ttft, p99));
    }
    let change = |on: (f64, f64), off: (f64, f64)| ((on.0 / off.0 - 1.0) * 100.0, (on.1 / off.1 - 1.0) * 100.0);
    let verdict = |(t, p): (f64, f64)| match (t < 0.0, p < 0.0) {
        (true, true) => "helps (both lower)",
        (false, false) => "hurts (both higher)",
        (true, false) => "trades TPOT tail for TTFT",
        (false, true) => "trades TTFT for TPOT tail",
    };
    let (agg, pd) = (change(got[0], got[1]), change(got[2], got[3]));
    let _ = writeln!(
        s,
        "   Pairing on vs off — aggregated: TTFT {:+.0}%, TPOT p99 {:+.0}%: it {}. 4P4D prefill pool: TTFT {:+.0}%, \
         TPOT p99 {:+.0}%: it {}.",
        agg.0,
        agg.1,
        verdict(agg),
        pd.0,
        pd.1,
        verdict(pd)
    );
    let range = |v: &[f64]| {
        let (lo, hi) = v.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
        (lo * 100.0, hi * 100.0)
    };
    let ((p_lo, p_hi), (d_lo, d_hi)) = (range(&busy_prefill), range(&busy_decode));
    if p_hi >= NEAR_SATURATION * 100.0 {
        let _ = writeln!(
            s,
            "   Caution: this 4P4D cluster at 80/s is near saturation: its prefill pool is busy {p_lo:.0}–{p_hi:.0}% of \
             the run and its decode pool {d_lo:.0}–{d_hi:.0}%, and its TTFT is {:.0}–{:.0} ms against {:.0}–{:.0} ms \
             aggregated. Its TTFT differences are queueing: small changes in where cold prompts land move them a lot, and another \
             seed or a slightly different rate can flip their sign. Rerun at a lower rate before reading them as \
             pairing's effect.",
            got[2].0.min(got[3].0),
            got[2].0.max(got[3].0),
            got[0].0.min(got[1].0),
            got[0].0.max(got[1].0),
        );
    }
    let _ = writeln!(
        s,
        "   Under xPyD its premise is gone: a prefill instance never decodes, so \"decode-heavy\" only means \"its \
         recent prompts hit\"; whatever it changes there is where cold prompts queue and get cached, not a mix of \
         phases. The P/D question becomes which pair to choose (part 2: independent vs joint)."
    );
    let _ = writeln!(
        s,
        "\n4. Multi-turn traffic: turn k + 1's prompt is turn k's prompt plus its output plus a new message, and under \
         xPyD the output's KV is made on the decode instance. Unless outputs are written back to the prefill side (or \
         to a shared KV pool the prefill instances read), the next turn's prefill recomputes the previous turn's output and \
         prefix-aware routing over the prefill pool can only match up to the previous prompt. routelab does not write \
         back: the output stays in the decode instance's cache, the prefill instance caches only the prompt it \
         computed, and the shared tier (`disaggregation.shared_kv`) is \
         filled by prefill instances at each hand-off, so a multi-turn workload here pays for that recomputation. The \
         traffic above is single-turn, so it is unaffected."
    );
    s
}

/// A prefill pool busy this share of the run or more queues: its TTFT is mostly waiting. (A decode
/// instance counts as busy whenever anything decodes, so its share says less.)
const NEAR_SATURATION: f64 = 0.6;
