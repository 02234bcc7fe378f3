//! What one run of a workload needs, roughly — peak memory and wall time — so that a run that
//! cannot fit in this machine's memory is refused before it starts, and a slow one is announced.
//! A cluster run's memory counts the router's own state too: each built-in router's bytes per
//! remembered prompt as `routelab bench` measures them, up to the router's bound.

use super::cluster::ClusterSpec;
use super::dispatch::Information;
use super::{FieldError, Workload, WorldKind};

#[cfg(test)]
mod tests;

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
    /// Whether routers route requests here (the cluster world).
    pub routed: bool,
    /// Whether the workload lists its policies, whose own state `router_state` then counts.
    pub listed: bool,
    /// The listed policy whose own state is the largest, and that state in bytes (included in
    /// `bytes`); `None` when no listed router keeps state per prompt.
    pub router_state: Option<(String, f64)>,
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
            // Per-prompt figures measured by `routelab bench`'s "router memory" (docs/performance.md).
            match (&self.router_state, self.routed) {
                (None, true) if !self.listed => "; no policies listed, so no router's own state is counted".into(),
                (Some((policy, bytes)), _) => format!(
                    "; memory includes {policy}'s own state, {} (its bytes a prompt as `routelab bench` measured, up to its bound)",
                    human_bytes(*bytes)
                ),
                (None, true) =>
                    "; memory includes routers' own state: none of the listed built-ins keeps any per prompt".into(),
                (None, false) => String::new(),
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
    // A run is one policy at a time: the largest router state of the listed ones counts.
    let mut router_state = None;
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
        router_state = w
            .policies
            .iter()
            .map(|p| (p, router_state_bytes(p, c, n, 0)))
            .filter(|(_, b)| *b > 0.0)
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(p, b)| (p.clone(), b));
        (
            n * per_request + contexts * 40.0 + replicas * 40e3 + router_state.as_ref().map_or(0.0, |r| r.1),
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
    Estimate {
        bytes: bytes + 4e6,
        seconds,
        runs,
        routed: w.cluster.is_some(),
        listed: !w.policies.is_empty(),
        router_state,
    }
}

// Heap bytes a built-in router keeps per prompt it remembers, from `routelab bench --routers
// 'sglang_cache_aware,preble,vllm_prefix_aware,ray_prefix_aware,dynamo_kv,dynamo_kv{prefix_state:
// approximate},llm_d,llm_d{lru_capacity: 1000000000},llm_d_sticky{lru_capacity: 1000000000},
// llm_d_predicted_latency{lru_capacity: 1000000000},aibrix_prefix_cache{capacity_tokens:
// 1000000000},max_affinity,threshold_affinity,vllm_loadaware,chwbl,least_work_left' --runs 1
// --warmup 0`, section "router memory" (10^5 prompts of a shared 300-token system prompt and 200
// tokens of their own on 8 replicas, routed and dispatched, none completed; heap in use before
// and after, `host/src/bench/memory.rs`), checked build of 4037589, 2026-12-07. The llm-d and
// AIBrix bounds are lifted there so that none is reached (llm_d at its default `lru_capacity:
// auto` measured 80 B: its LRUs were full). max_affinity, threshold_affinity and least_work_left
// measured 0; vllm_loadaware 33 B and chwbl 23 B, in-flight counts and a request-rate window
// that a run bounds by its requests in flight and its arrival rate, so they count as nothing
// (docs/performance.md, "Bounded router state"). The three toolkit-tree routers were measured
// again after its nodes shrank (`routelab bench --routers 'sglang_cache_aware,ray_prefix_aware,
// preble' --runs 1 --warmup 0`, checked build of cbee7c2: 258 → 172, 258 → 172, 374 → 289;
// docs/performance.md, "sglang_cache_aware's day").

/// `sglang_cache_aware`: a node of its approximate tree a prompt.
const SGLANG_CACHE_AWARE: f64 = 172.0;
/// `preble`: its global tree's node and holder set a prompt.
const PREBLE: f64 = 289.0;
/// `vllm_prefix_aware`: 7 trie nodes (32-token chunks) a prompt.
const VLLM_PREFIX_AWARE: f64 = 870.0;
/// `vllm_prefix_aware`'s bytes a trie node with its recency entry (700,009 nodes), for its
/// `max_chunks` bound.
const VLLM_PREFIX_AWARE_NODE: f64 = 124.0;
/// `ray_prefix_aware`: a node of its tree a prompt.
const RAY_PREFIX_AWARE: f64 = 172.0;
/// `dynamo_kv` with `prefix_state: events` (its default): the block index, 14 new 16-token
/// blocks a prompt.
const DYNAMO_KV_EVENTS: f64 = 449.0;
/// `dynamo_kv` with `prefix_state: approximate`: the same blocks with their time-to-live entries.
const DYNAMO_KV_APPROXIMATE: f64 = 512.0;
/// `llm_d`: its per-replica LRU of the prompt's 16-token blocks.
const LLM_D: f64 = 469.0;
/// `llm_d_sticky`: llm_d's LRU and its in-flight token ledger.
const LLM_D_STICKY: f64 = 480.0;
/// `llm_d_predicted_latency`: llm_d's LRU, the ledger and each request's features until it
/// completes.
const LLM_D_PREDICTED_LATENCY: f64 = 575.0;
/// `aibrix_prefix_cache`: its global table of 16-token blocks and their recency list.
const AIBRIX_PREFIX_CACHE: f64 = 1050.0;

/// Tokens of its own each of the bench's prompts adds (300 shared + 200 unique): a router that
/// keeps `B` bytes a prompt there keeps about `B / 200` a remembered token, which turns a bound
/// in tokens into bytes.
const BENCH_OWN_TOKENS: f64 = 200.0;

/// What bounds a router's state.
enum Bound {
    /// Nothing: it grows with every distinct prompt.
    None,
    /// At most this many remembered tokens, fleet-wide.
    Tokens(f64),
    /// At most this many remembered prompts (a time-to-live × the arrival rate).
    Prompts(f64),
    /// At most this many bytes (a node cap × the bytes a node).
    Bytes(f64),
}

/// The own state of router `arg` (a policy argument) after `prompts` prompts on cluster `c`:
/// its bytes a prompt times the prompts, capped by its bound (its config over its defaults).
/// Routers that keep nothing per prompt, and plugins (whose state the host cannot know), count 0.
/// A P/D router that composes two routers (`prefill`, `decode`) counts both.
fn router_state_bytes(arg: &str, c: &ClusterSpec, prompts: f64, depth: u32) -> f64 {
    let Ok(spec) = crate::plugin::PolicySpec::parse(arg) else { return 0.0 };
    let (None, Some(name)) = (&spec.library, &spec.name) else { return 0.0 };
    let Some(cfg) = builtin_config(name, &spec.config) else { return 0.0 };
    let num = |key: &str| cfg.get(key).and_then(serde_norway::Value::as_f64);
    let text = |key: &str| cfg.get(key).and_then(serde_norway::Value::as_str);
    let replicas = c.slots() as f64;
    // What the replicas can cache, fleet-wide: the bound of a router that hears their evictions.
    let caches = c.step_model().map_or(Bound::None, |sm| Bound::Tokens(sm.kv_capacity_tokens as f64 * replicas));
    let (per_prompt, bound) = match name.as_str() {
        "sglang_cache_aware" => {
            (SGLANG_CACHE_AWARE, num("max_tree_tokens").map_or(Bound::None, |t| Bound::Tokens(t * replicas)))
        }
        "ray_prefix_aware" => {
            let on = cfg.get("do_eviction").and_then(serde_norway::Value::as_bool).unwrap_or(true);
            let threshold = num("eviction_threshold_tokens").filter(|_| on);
            (RAY_PREFIX_AWARE, threshold.map_or(Bound::None, |t| Bound::Tokens(t * replicas)))
        }
        "vllm_prefix_aware" => {
            (VLLM_PREFIX_AWARE, num("max_chunks").map_or(Bound::None, |n| Bound::Bytes(n * VLLM_PREFIX_AWARE_NODE)))
        }
        "preble" => (PREBLE, caches),
        // Events: kept until the replica reports evicting them; approximate: `ttl_s` after routing.
        "dynamo_kv" => match (text("prefix_state"), num("ttl_s"), c.total_rate()) {
            (Some("approximate"), Some(ttl), Some(rate)) => (DYNAMO_KV_APPROXIMATE, Bound::Prompts(ttl * rate)),
            (Some("approximate"), ..) => (DYNAMO_KV_APPROXIMATE, Bound::None),
            _ => (DYNAMO_KV_EVENTS, caches),
        },
        // Approximate: `lru_capacity` blocks a replica (`auto`: its KV capacity); precise: events.
        "llm_d" | "llm_d_sticky" | "llm_d_predicted_latency" => {
            let per_prompt = match name.as_str() {
                "llm_d" => LLM_D,
                "llm_d_sticky" => LLM_D_STICKY,
                _ => LLM_D_PREDICTED_LATENCY,
            };
            let lru = num("lru_capacity").zip(num("block_tokens")).map(|(b, t)| Bound::Tokens(b * t * replicas));
            match text("prefix_state") {
                Some("precise") => (per_prompt, caches),
                _ => (per_prompt, lru.unwrap_or(caches)),
            }
        }
        "aibrix_prefix_cache" => (AIBRIX_PREFIX_CACHE, num("capacity_tokens").map_or(Bound::None, Bound::Tokens)),
        _ if depth == 0 => {
            // A P/D router over two inner routers (`pd_sglang`, `pd_dynamo`, `pd_llm_d`).
            let inner = ["prefill", "decode"].iter().filter_map(|k| text(k));
            return inner.map(|a| router_state_bytes(a, c, prompts, depth + 1)).sum();
        }
        _ => return 0.0,
    };
    let cap = match bound {
        Bound::None => f64::INFINITY,
        Bound::Tokens(t) => per_prompt * t / BENCH_OWN_TOKENS,
        Bound::Prompts(p) => per_prompt * p,
        Bound::Bytes(b) => b,
    };
    (per_prompt * prompts).min(cap)
}

/// Built-in policy `name`'s config: its defaults with `config` (a YAML flow mapping, or empty)
/// over them; `None` for a name that is not built in or a config that does not parse (the
/// policy's own construction reports that).
fn builtin_config(name: &str, config: &str) -> Option<serde_norway::Mapping> {
    let entry = routelab_policies::registry().into_iter().find(|e| e.name == name)?;
    let defaults = std::panic::catch_unwind(entry.default_config).ok()?;
    let mut cfg = match serde_norway::from_str::<serde_norway::Value>(&defaults).ok()? {
        serde_norway::Value::Mapping(m) => m,
        _ => serde_norway::Mapping::new(),
    };
    if !config.trim().is_empty() {
        let serde_norway::Value::Mapping(given) = serde_norway::from_str(config).ok()? else { return None };
        cfg.extend(given);
    }
    Some(cfg)
}

/// Refuses a workload whose estimated run cannot fit in this machine's memory, its listed
/// routers' own state counted (`routelab validate`; a run counts the policies it runs with
/// [`check_memory_jobs`]).
pub fn check_memory(w: &Workload) -> Result<(), FieldError> {
    check_memory_within(w, machine_memory_bytes())
}

/// [`check_memory`] with routers' state aside: what loading a workload checks, since the
/// policies a command runs may not be the file's list (`--policies`).
pub fn check_base_memory(w: &Workload) -> Result<(), FieldError> {
    check_base_memory_within(w, machine_memory_bytes())
}

/// [`check_base_memory`] on a machine with `have` bytes.
pub fn check_base_memory_within(w: &Workload, have: f64) -> Result<(), FieldError> {
    check_memory_within(&Workload { policies: Vec::new(), ..w.clone() }, have)
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
        // A router whose own state alone breaks the budget: its bound is the fix, not the requests.
        let state_at_once = |s: f64| s * at_once as f64;
        if let Some((policy, state)) =
            e.router_state.as_ref().filter(|(_, s)| e.bytes - state_at_once(*s) <= have * 0.8)
        {
            return Err(FieldError::new(
                "policies",
                format!(
                    "{} would need {} of memory, more than this machine's {}, {} of it {policy}'s own state ({e})",
                    if at_once > 1 { format!("{at_once} runs at once (-j)") } else { "a run".to_string() },
                    human_bytes(e.bytes),
                    human_bytes(have),
                    human_bytes(state_at_once(*state)),
                ),
                format!(
                    "lower {policy}'s bound in its config (e.g. sglang_cache_aware{{max_tree_tokens: N}}, \
                     vllm_prefix_aware{{max_chunks: N}}; docs/performance.md, \"Bounded router state\"){}, \
                     or leave it out",
                    if at_once > 1 { ", run fewer at once (-j 1)" } else { "" }
                ),
            ));
        }
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
