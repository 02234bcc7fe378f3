//! What one run of a workload needs, roughly — peak memory and wall time — so that a run that
//! cannot fit in this machine's memory is refused before it starts, and a slow one is announced.

use super::dispatch::Information;
use super::{FieldError, Workload, WorldKind};

/// What one run of a workload needs, roughly: enough to refuse the impossible and warn about the
/// slow. Constants come from `routelab bench` and the overload_scaling example on a laptop core.
#[derive(Clone, Debug, PartialEq)]
pub struct Estimate {
    /// Peak memory of one (policy, seed) run.
    pub bytes: f64,
    /// Wall time of one (policy, seed) run.
    pub seconds: f64,
    /// (policy, seed) runs.
    pub runs: u64,
    /// Whether routers route requests here (the cluster world), whose own state — a prefix
    /// tree's nodes — the figure leaves out.
    pub routed: bool,
}

impl std::fmt::Display for Estimate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "about {} and {} per run, {} run(s) ({} in all; rough: a router can take 10× the median{})",
            human_bytes(self.bytes),
            human_seconds(self.seconds),
            self.runs,
            human_seconds(self.seconds * self.runs as f64),
            // Measured by `routelab bench`'s "router memory" (docs/performance.md, "Scale").
            if self.routed {
                ", and a prefix-tree router's own nodes, 100–900 B a prompt until its bound, are not counted"
            } else {
                ""
            }
        )
    }
}

fn human_bytes(b: f64) -> String {
    match b {
        b if b >= 1e9 => format!("{:.1} GB", b / 1e9),
        b if b >= 1e6 => format!("{:.0} MB", b / 1e6),
        b => format!("{:.0} KB", (b / 1e3).max(1.0)),
    }
}

fn human_seconds(s: f64) -> String {
    match s {
        s if s >= 86_400.0 => format!("{:.1} days", s / 86_400.0),
        s if s >= 3_600.0 => format!("{:.1} h", s / 3_600.0),
        s if s >= 60.0 => format!("{:.0} min", s / 60.0),
        s => format!("{s:.1} s"),
    }
}

/// The machine's memory in bytes (Linux: MemTotal), or 16 GB where it cannot be read.
pub fn machine_memory_bytes() -> f64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
            line.split_whitespace().nth(1)?.parse::<f64>().ok().map(|kb| kb * 1024.0)
        })
        .unwrap_or(16e9)
}

/// Rough memory and time of one run of `w` (cluster traces: per row, counted when they are read).
pub fn estimate(w: &Workload) -> Estimate {
    estimate_with(w, None)
}

/// Seconds of one cluster-world run per request: the median over eight shipped workloads, each
/// with its own policy list (tool_use, agent, programming, video_qa, long_doc_qa,
/// cache_vs_balance, azure_conv, mooncake_conversation: 2.0–68 µs, median 6.8 µs of user time per
/// request, `/usr/bin/time routelab compare W -j 1` in the checked profile). The router decides
/// most of the spread: Preble and Dynamo's indexer on long Mooncake prompts cost the most.
const CLUSTER_SECONDS_PER_REQUEST: f64 = 7e-6;

/// Seconds per request and replica: a router that reads every replica's view (least_work_left's
/// scan) and the replicas' steps. It was ≈ 15 ns while each arrival rebuilt every view; since
/// only the views that changed are (`sim/cluster/slots.rs`), `routelab compare` of
/// fleet_10000.yaml cut to 2 × 10^4 requests, least_work_left, takes 1.19–1.26 CPU s (was
/// 3.71–4.23): ≈ 6 ns a request and replica (docs/performance.md, "Scale").
const CLUSTER_SECONDS_PER_REPLICA_VIEW: f64 = 6e-9;

/// [`estimate`] with the cluster world's request count when it is known (the generated or
/// replayed stream's length), instead of the one the sizes imply.
pub fn estimate_with(w: &Workload, requests: Option<usize>) -> Estimate {
    let policies = w.policies.len().max(1) as u64;
    let mut runs = policies * w.seeds as u64;
    let (bytes, seconds) = if let Some(d) = &w.dispatch {
        let n = d.requests as f64;
        let refreshes = match d.information {
            Information::Stale { refresh_interval } => {
                n / (d.utilisation.max(1e-9) * d.servers as f64) / refresh_interval
            }
            Information::Fresh => 0.0,
        };
        // Responses kept for quantiles (8 B each), server state, the event heap.
        (n * 8.0 + d.servers as f64 * 64.0, n * 150e-9 + refreshes * d.servers as f64 * 2e-9)
    } else if let Some(c) = &w.cluster {
        let n = requests.map_or_else(|| c.expected_requests(), |n| n as f64);
        let turns = c.generator.turns.max().max(1) as f64;
        let contexts = c.generator.contexts.as_ref().map_or(0.0, |x| x.count as f64);
        // Per request: the generated request (≈ 48 B) and its segments (16 B each); an exact run
        // adds its state and its record, a sketched one with KV tiers its state, and any other
        // sketched run only the state of the requests in flight — and when its stream is
        // generated as the run goes, not even the request (docs/performance.md, "Scale").
        let exact = c.summary.exact(n as usize) || c.disaggregation.is_some() || c.generator.session.is_some();
        let retiring = !exact && !c.keeps_request_state();
        let kept = if exact {
            192.0
        } else if !retiring {
            92.0
        } else {
            0.0
        };
        // A trace streamed so still holds its rows (32 B each).
        let stream = match c.arrivals {
            _ if !(retiring && super::generate::LazyStream::fits(c)) => 48.0 + (turns + 2.0) * 16.0,
            super::cluster::Arrivals::Trace { .. } => 32.0,
            _ => 0.0,
        };
        let per_request = stream + kept;
        // Per replica: its state and prefix cache (≈ 36 KB on tool_use at 100 requests a replica,
        // less when lighter); per request and replica: the router reading its view (≈ 6 ns;
        // docs/performance.md, "Scale").
        let replicas = c.slots() as f64;
        (
            n * per_request + contexts * 40.0 + replicas * 40e3,
            n * (CLUSTER_SECONDS_PER_REQUEST + replicas * CLUSTER_SECONDS_PER_REPLICA_VIEW),
        )
    } else if let Some(c) = &w.compound {
        runs *= c.variants.len().max(1) as u64;
        let questions = c.questions.train as f64 + c.questions.test as f64;
        let cells = questions * c.system.modules().len() as f64 * c.model_count() as f64;
        // Outcome tables (2 B per question × module × model); a selector evaluates about
        // modules × models allocations over the training set.
        let evaluations = (c.system.modules().len() * c.model_count()) as f64 * 4.0;
        let eval_cost = c.questions.train as f64 * c.system.modules().len() as f64 * 20e-9;
        (cells * 2.0 + questions * 8.0, cells * 10e-9 + evaluations * eval_cost)
    } else {
        (0.0, 0.0)
    };
    Estimate { bytes: bytes + 4e6, seconds, runs, routed: w.cluster.is_some() }
}

/// Refuses a workload whose estimated run cannot fit in this machine's memory.
pub fn check_memory(w: &Workload) -> Result<(), FieldError> {
    check_memory_within(w, machine_memory_bytes())
}

/// [`check_memory`] for `jobs` runs at once (`-j`): each holds its own run's memory.
pub fn check_memory_jobs(w: &Workload, jobs: usize) -> Result<(), FieldError> {
    check_memory_scaled(w, machine_memory_bytes(), jobs)
}

/// [`check_memory`] on a machine with `have` bytes.
pub fn check_memory_within(w: &Workload, have: f64) -> Result<(), FieldError> {
    check_memory_scaled(w, have, 1)
}

/// Refuses `w` when `jobs` of its runs at once (at most as many as it has) cannot fit in `have`.
pub fn check_memory_scaled(w: &Workload, have: f64, jobs: usize) -> Result<(), FieldError> {
    let mut e = estimate(w);
    let at_once = (jobs.max(1) as u64).min(e.runs.max(1));
    e.bytes *= at_once as f64;
    if e.bytes > have * 0.8 {
        let field = match w.world() {
            WorldKind::Dispatch => "dispatch.requests",
            WorldKind::Cluster => "cluster.requests",
            WorldKind::Compound => "compound.questions",
        };
        return Err(FieldError::new(
            field,
            format!(
                "{} would need {} of memory, more than this machine's {} ({e})",
                if at_once > 1 { format!("{at_once} runs at once (-j)") } else { "a run".to_string() },
                human_bytes(e.bytes),
                human_bytes(have)
            ),
            if at_once > 1 {
                "run fewer at once (-j 1), or fewer requests (or questions) per seed and more seeds"
            } else {
                "run fewer requests (or questions) per seed and more seeds"
            },
        ));
    }
    Ok(())
}
