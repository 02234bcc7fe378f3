//! A decision-level look at why `llm_d` loses to least-requests routing on the Mooncake
//! conversation replay (issue 24), with every `llm_d` decision logged: its scores, the scraped
//! load it scored and the live load it did not see.
//!
//! The mechanism: the trace's timestamps come in 3 s bins (12,031 rows on 1,180 instants, about
//! ten requests per instant), so each bin's requests reach the router at the same simulated
//! instant. `llm_d`'s load scorers read the engines' metrics as last scraped (every 50 ms, as
//! upstream's EPP refreshes them), so every request of a burst sees the same load; nearly every
//! prompt opens with a block every replica holds, so the prefix term rarely separates the
//! replicas, and the same replica wins the max score again and again. Least-requests reads the
//! live in-flight count and spreads the burst. Spread each bin's requests over its 3 s
//! (or scrape always fresh) and `llm_d` beats least-requests.

use std::sync::{Arc, Mutex};

use routelab_policies::llm_d::{Config as LlmDConfig, LlmD};
use routelab_policy_api::*;

use super::*;
use crate::plugin::{Loader, PolicySpec};
use crate::runner::run_cluster;
use crate::workload::generate::{RequestStream, apply_hints, mooncake_stream};
use crate::workload::{self, mooncake::MooncakeRow};

/// One `llm_d` decision.
#[derive(Clone, Debug)]
struct Decision {
    at: f64,
    chosen: usize,
    scores: Vec<f64>,
    /// `scraped.waiting` per replica: what the queue scorer read.
    scraped_waiting: Vec<f64>,
    /// The load scorers' part of each total (default weights: 2 · queue + 2 · free KV, both
    /// scraped); the rest of a total is the prefix scorer's.
    load: Vec<f64>,
    /// Live requests dispatched and not finished per replica: what least-requests reads.
    live_outstanding: Vec<u32>,
}

/// `llm_d` with every decision written to a shared log.
struct Logged {
    inner: LlmD,
    log: Arc<Mutex<Vec<Decision>>>,
}

impl Policy for Logged {
    const NAME: &'static str = "llm_d_logged";
    const DESCRIPTION: &'static str = "llm_d, logging its decisions (tests)";
    type Config = LlmDConfig;
    type Context = RouterContext;
    fn new(cfg: LlmDConfig, ctx: &RouterContext) -> Result<Self, String> {
        Ok(Self { inner: LlmD::new(cfg, ctx)?, log: Default::default() })
    }
}

impl RouterPolicy for Logged {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn signals(&self) -> Vec<String> {
        self.inner.signals()
    }
    fn request_facts(&self) -> Vec<String> {
        self.inner.request_facts()
    }
    fn route(&mut self, request: &Request<'_>, replicas: &Replicas<'_>) -> usize {
        let chosen = self.inner.route(request, replicas);
        let n = replicas.len();
        let q: Vec<f64> = (0..n).map(|i| replicas.signal(i, 0)).collect();
        let (lo, hi) = q.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| (a.min(x), b.max(x)));
        let queue = |i: usize| if hi == lo { 1.0 } else { (hi - q[i]) / (hi - lo) };
        let load = (0..n).map(|i| 2.0 * queue(i) + 2.0 * (1.0 - replicas.signal(i, 1)).clamp(0.0, 1.0)).collect();
        self.log.lock().unwrap().push(Decision {
            at: request.arrived_at,
            chosen,
            scores: self.inner.last_scores().to_vec(),
            scraped_waiting: q,
            load,
            live_outstanding: replicas.iter().map(|v| v.outstanding_requests).collect(),
        });
        chosen
    }
    fn on_dispatch(&mut self, request: &Request<'_>, r: usize) {
        self.inner.on_dispatch(request, r)
    }
    fn on_evict(&mut self, e: &Eviction<'_>) {
        self.inner.on_evict(e)
    }
    fn on_replica_change(&mut self, change: &ReplicaChange) {
        self.inner.on_replica_change(change)
    }
    fn report(&self) -> Vec<(String, f64)> {
        self.inner.report()
    }
}

fn mooncake() -> (ClusterSpec, Vec<MooncakeRow>) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf();
    let spec = workload::load(&root.join("workloads/cluster/mooncake_conversation.yaml")).unwrap().cluster.unwrap();
    let rows =
        workload::mooncake::load(&root.join("workloads/traces/mooncake-fast25/conversation_trace.jsonl")).unwrap();
    (spec, rows)
}

fn stream(spec: &ClusterSpec, rows: &[MooncakeRow]) -> RequestStream {
    let mut s = mooncake_stream(spec, rows);
    apply_hints(spec, &mut s, 1);
    s
}

/// The rows with each instant's requests spread over the `bin_s` that follow it, as a workload's
/// `arrivals.trace.spread_s` spreads them.
fn spread(rows: &[MooncakeRow], bin_s: f64) -> Vec<MooncakeRow> {
    let mut out = rows.to_vec();
    crate::workload::trace::spread_instants(out.iter_mut().map(|r| &mut r.at_s).collect(), bin_s);
    out
}

/// Runs logged `llm_d` (default profile) on `stream`: the outcome and its decisions.
fn run_llm_d(spec: &ClusterSpec, stream: &RequestStream) -> (RunOutcome, Vec<Decision>) {
    let resolved = StepModels::resolve(spec).unwrap();
    let ctx = router_context_for(spec, &resolved, 1);
    let log = Arc::new(Mutex::new(Vec::new()));
    let policy = Logged { inner: LlmD::new(LlmDConfig::default(), &ctx).unwrap(), log: log.clone() };
    let router = Router_TO::from_value(Guarded::new(policy), abi_stable::sabi_trait::TD_Opaque);
    let out = run_cluster(spec, stream, router, "llm_d", 1).unwrap();
    let decisions = std::mem::take(&mut *log.lock().unwrap());
    (out, decisions)
}

fn run_builtin(spec: &ClusterSpec, stream: &RequestStream, name: &str) -> RunOutcome {
    let resolved = StepModels::resolve(spec).unwrap();
    let r = Loader::new().router(&PolicySpec::parse(name).unwrap(), &router_context_for(spec, &resolved, 1)).unwrap();
    run_cluster(spec, stream, r, name, 1).unwrap()
}

/// Over the instants with at least 5 arrivals: the share of their requests sent to the replica
/// that took the most of that instant's requests (1/4 would be an even split on 4 replicas).
fn burst_share(records: &[RequestRecord]) -> f64 {
    let (mut top, mut all) = (0usize, 0usize);
    let mut i = 0;
    while i < records.len() {
        let j = i + records[i..].iter().take_while(|r| r.arrived_at_s == records[i].arrived_at_s).count();
        if j - i >= 5 {
            let mut per = [0usize; 64];
            records[i..j].iter().for_each(|r| per[r.replica as usize] += 1);
            top += per.iter().max().unwrap();
            all += j - i;
        }
        i = j;
    }
    top as f64 / all as f64
}

fn ttft(o: &RunOutcome) -> f64 {
    o.metrics.get("ttft_mean_s").unwrap()
}

/// The trace's bursts, `llm_d`'s stale load signals and its herding, and what spreading the
/// bursts does — each figure from the decision log or the records of one seed-1 run.
#[test]
fn llm_d_herds_each_same_instant_burst_onto_one_replica_under_a_stale_scrape() {
    let (spec, rows) = mooncake();
    let bursty = stream(&spec, &rows);
    let (llm_d, log) = run_llm_d(&spec, &bursty);
    let least = run_builtin(&spec, &bursty, "least_requests");
    assert_eq!(log.len(), rows.len(), "one decision per request");
    let mut records = llm_d.records.clone();
    records.sort_by(|a, b| a.arrived_at_s.total_cmp(&b.arrived_at_s));

    // Within an instant, every decision after the first scores the load the first one scored
    // (the scrape cannot have moved), while the live load has moved: the router's own
    // dispatches, which a scrape only shows 50 ms later.
    let (mut later, mut same_scrape, mut live_moved, mut same_choice) = (0, 0, 0, 0);
    for (prev, d) in log.iter().zip(&log[1..]) {
        if d.at != prev.at {
            continue;
        }
        later += 1;
        same_scrape += usize::from(d.scraped_waiting == prev.scraped_waiting);
        live_moved += usize::from(d.live_outstanding != prev.live_outstanding);
        same_choice += usize::from(d.chosen == prev.chosen);
    }
    assert!(later > 10_000, "{later} decisions follow another at the same instant");
    assert_eq!(same_scrape, later, "the scraped load never changes within an instant");
    assert_eq!(live_moved, later, "the live load changes with every dispatch");
    let repeat = same_choice as f64 / later as f64;
    // Where no replica holds a block of the prompt, the prefix term is 0 everywhere and the
    // scores are the stale load's alone: the same totals as the previous decision's.
    let cold_repeats = log
        .iter()
        .zip(&log[1..])
        .filter(|(p, d)| d.at == p.at && d.scores == p.scores)
        .filter(|(p, d)| d.chosen == p.chosen)
        .count();

    // Who decides: the winner is the replica with the best stale load in most decisions, and in
    // many the prefix term is the same on every replica (the trace's prompts nearly all open with
    // the same 512-token block, which every replica holds: no replica has an edge).
    let best = |v: &[f64]| (0..v.len()).fold(0, |b, i| if v[i] > v[b] { i } else { b });
    let load_wins = log.iter().filter(|d| d.load[d.chosen] == d.load[best(&d.load)]).count();
    let no_prefix = log
        .iter()
        .filter(|d| {
            let p: Vec<f64> = d.scores.iter().zip(&d.load).map(|(s, l)| s - l).collect();
            p.iter().all(|x| (x - p[0]).abs() < 1e-9)
        })
        .count();
    let (load_wins, no_prefix) = (load_wins as f64 / log.len() as f64, no_prefix as f64 / log.len() as f64);
    eprintln!(
        "llm_d: the best stale load wins {load_wins:.3} of decisions; the prefix term ties on every replica in {no_prefix:.3}"
    );
    assert!(load_wins > 0.7, "{load_wins}");
    assert!(no_prefix > 0.5, "{no_prefix}");
    let (herd, spread_least) = (burst_share(&records), {
        let mut r = least.records.clone();
        r.sort_by(|a, b| a.arrived_at_s.total_cmp(&b.arrived_at_s));
        burst_share(&r)
    });
    eprintln!(
        "bursty: llm_d TTFT {:.3} s, least_requests {:.3} s; burst share to one replica {herd:.3} vs {spread_least:.3}; \
         llm_d repeats the previous choice in {repeat:.3} of same-instant decisions ({cold_repeats} with identical scores)",
        ttft(&llm_d),
        ttft(&least)
    );
    assert!(herd > 0.6, "llm_d sends {herd} of a burst to one replica");
    assert!(spread_least < 0.5, "least_requests sends {spread_least} of a burst to one replica");
    assert!(repeat > 0.6, "llm_d repeats its choice in {repeat} of same-instant decisions");
    assert!(ttft(&llm_d) > 1.3 * ttft(&least), "llm_d {} vs least_requests {} s", ttft(&llm_d), ttft(&least));

    // Spread each 3 s bin's requests evenly over it: the scrape sees the dispatches in between,
    // the herding goes and llm_d's prefix affinity wins over plain load balancing.
    let calm = stream(&spec, &spread(&rows, 3.0));
    let (llm_d_calm, _) = run_llm_d(&spec, &calm);
    let least_calm = run_builtin(&spec, &calm, "least_requests");
    eprintln!("spread: llm_d TTFT {:.3} s, least_requests {:.3} s", ttft(&llm_d_calm), ttft(&least_calm));
    assert!(ttft(&llm_d_calm) < ttft(&least_calm), "{} vs {} s", ttft(&llm_d_calm), ttft(&least_calm));

    // And bursty but always fresh: the same.
    let mut fresh = spec.clone();
    fresh.metrics.scrape_interval_s = 0.0;
    let (llm_d_fresh, fresh_log) = run_llm_d(&fresh, &bursty);
    let fresh_repeat =
        fresh_log.iter().zip(&fresh_log[1..]).filter(|(p, d)| d.at == p.at && d.chosen == p.chosen).count() as f64
            / later as f64;
    eprintln!("fresh scrape: llm_d TTFT {:.3} s, repeats {fresh_repeat:.3}", ttft(&llm_d_fresh));
    assert!(fresh_repeat < repeat / 2.0, "fresh {fresh_repeat} vs stale {repeat}");
    assert!(ttft(&llm_d_fresh) < ttft(&least), "{} vs {} s", ttft(&llm_d_fresh), ttft(&least));
}
