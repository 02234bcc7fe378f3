//! `routelab bench`: how fast the simulator runs and what a router call costs, static versus
//! through a loaded library. Wall-clock time is read here, in the host, never in `sim/` or in a
//! policy. Compare ratios within one run: the machine is shared and noisy.

use std::fmt::Write as _;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Result;
use routelab_policy_api::{Policy, ReplicaView, Replicas, Request, RouterContext, RouterPolicy};

mod figures;
mod memory;
mod timing;

pub use figures::{Figure, Recorder, Report};
pub use timing::{ClusterTiming, cluster_timing, cluster_timing_with};

use routelab_core::plugin::{Loader, PolicySpec};
use routelab_core::step_model::Choice;
use routelab_core::workload::cluster::ClusterSpec;
use routelab_core::workload::dispatch::DispatchSpec;

fn dispatch_spec(servers: u32, requests: u64) -> DispatchSpec {
    serde_norway::from_str(&format!("{{servers: {servers}, requests: {requests}, utilisation: 0.9}}"))
        .expect("valid bench spec")
}

/// The dispatch-world context every router benchmark creates its router with (also `cargo bench`).
pub fn ctx(replicas: u32) -> RouterContext {
    routelab_core::sim::dispatch::router_context(replicas, 7)
}

/// Simulated requests per wall second for `policy` (a built-in or library spec).
pub fn dispatch_rate(loader: &mut Loader, policy: &str, servers: u32, requests: u64) -> Result<f64> {
    let spec = dispatch_spec(servers, requests);
    let router = loader.router(&PolicySpec::parse(policy)?, &ctx(servers))?;
    let t = Instant::now();
    let m = routelab_core::sim::dispatch::run(&spec, None, router, policy, 1)?;
    let secs = t.elapsed().as_secs_f64();
    black_box(m);
    Ok(requests as f64 / secs)
}

/// Replicas with mixed loads: a few idle (ties to break), the rest busy (also `cargo bench`).
pub fn views(n: usize) -> Vec<ReplicaView> {
    (0..n)
        .map(|i| ReplicaView {
            outstanding_requests: ((i * 7) % 5) as u32,
            outstanding_work: ((i * 13) % 11) as f64,
            ..Default::default()
        })
        .collect()
}

/// Nanoseconds per call of `f` over `calls` calls.
fn ns_per_call(calls: u64, mut f: impl FnMut(u64) -> u32) -> f64 {
    let t = Instant::now();
    let mut acc = 0u64;
    for i in 0..calls {
        acc = acc.wrapping_add(f(i) as u64);
    }
    black_box(acc);
    t.elapsed().as_secs_f64() * 1e9 / calls as f64
}

/// The built-in plugin library next to this executable (`target/release/`), if built.
pub fn default_plugin_path() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let p = exe.parent()?.join(format!(
        "{}routelab_builtin_plugin{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    ));
    p.exists().then_some(p)
}

/// What `routelab bench` measures and how often.
pub struct Options {
    /// Requests per dispatch-world measurement.
    pub requests: u64,
    pub plugin: Option<PathBuf>,
    /// Kept samples per figure.
    pub runs: u32,
    /// Samples per figure measured first and dropped.
    pub warmup: u32,
    /// Only the routing-decisions table, for these routers.
    pub routers: Option<Vec<String>>,
    /// Only the admission-and-classes figures.
    pub admission_only: bool,
    /// Only the agentic presets' replay speed.
    pub agentic_only: bool,
}

/// Requests per run of the admission figures: tool_use's own count.
const ADMISSION_REQUESTS: u64 = 20_000;

/// Runs the bench, printing its lines as they come when `echo`: the whole text and the figures
/// for `--json`.
pub fn run(opts: &Options, echo: bool) -> Result<(String, Report)> {
    let mut loader = Loader::new();
    let mut rec = Recorder::new(opts.runs, opts.warmup, echo);
    rec.line(format!(
        "routelab bench: each figure the median of {} runs after {} warm-up (±: half the min–max range); compared \
         variants alternate run by run.",
        rec.runs, rec.warmup
    ));
    if let Some(routers) = &opts.routers {
        decisions_table(&mut loader, &mut rec, routers)?;
        memory::memory_section(&mut loader, &mut rec, routers)?;
        return Ok(rec.report(opts.requests));
    }
    if opts.admission_only {
        admission_section(&mut loader, &mut rec, ADMISSION_REQUESTS)?;
        return Ok(rec.report(ADMISSION_REQUESTS));
    }
    if opts.agentic_only {
        agentic_section(&mut loader, &mut rec)?;
        return Ok(rec.report(0));
    }
    let requests = opts.requests;
    let plugin = opts.plugin.clone().or_else(default_plugin_path);
    dispatch_section(&mut loader, &mut rec, requests, plugin.as_deref())?;
    per_call_section(&mut loader, &mut rec, plugin.as_deref())?;
    bench_cluster(&mut loader, &mut rec)?;
    admission_section(&mut loader, &mut rec, ADMISSION_REQUESTS)?;
    rec.section("compound", "compound world, debate (6 modules, 5 models), 1,000 training questions:");
    for accuracy in [1.0, 0.8] {
        let mut checksum = 0;
        let f = rec.measure(&format!("diagnoser accuracy {accuracy}"), "allocations/s", || {
            let (rate, sum) = compound_rate(accuracy, 20_000)?;
            checksum = sum;
            Ok(rate)
        })?;
        rec.line(format!("  {}: {} allocations evaluated/s (checksum {checksum})", f.name, f.show(1.0, 0)));
    }
    Ok(rec.report(requests))
}

fn dispatch_section(loader: &mut Loader, rec: &mut Recorder, requests: u64, plugin: Option<&Path>) -> Result<()> {
    rec.section(
        "dispatch",
        &format!("dispatch world, 16 servers, ρ 0.9, exponential, {requests} requests (M simulated requests/s):"),
    );
    let mut policies: Vec<String> =
        ["round_robin", "random", "power_of_two", "least_requests", "least_work_left"].map(String::from).to_vec();
    let mut names = policies.clone();
    if let Some(lib) = plugin {
        policies.push(format!("{}:round_robin", lib.display()));
        names.push("round_robin (loaded)".into());
    }
    let figs = rec.compare(&names, "requests/s", |i| dispatch_rate(loader, &policies[i], 16, requests))?;
    for f in figs {
        rec.line(format!("  {:<22} {:>14}", f.name, f.show(1e6, 2)));
    }

    rec.section(
        "dispatch_scaling",
        "scaling (M simulated requests/s; flat across a row = cost independent of that size):",
    );
    rec.line(format!("  requests:          {:>14} {:>14}", requests / 10, requests));
    for p in ["round_robin", "power_of_two"] {
        let sizes = [requests / 10, requests];
        let names = sizes.map(|n| format!("{p} {n} requests"));
        let figs = rec.compare(&names, "requests/s", |i| dispatch_rate(loader, p, 16, sizes[i]))?;
        rec.line(format!("  {p:<18} {:>14} {:>14}", figs[0].show(1e6, 2), figs[1].show(1e6, 2)));
    }
    let servers = [16u32, 64, 256, 1024];
    rec.line(format!("  servers:           {:>14} {:>14} {:>14} {:>14}", 16, 64, 256, 1024));
    for p in ["round_robin", "power_of_two", "least_requests", "least_work_left"] {
        let names = servers.map(|n| format!("{p} {n} servers"));
        let figs = rec.compare(&names, "requests/s", |i| dispatch_rate(loader, p, servers[i], requests / 4))?;
        let cells: Vec<String> = figs.iter().map(|f| format!("{:>14}", f.show(1e6, 2))).collect();
        rec.line(format!("  {p:<18} {}", cells.join(" ")));
    }
    Ok(())
}

fn per_call_section(loader: &mut Loader, rec: &mut Recorder, plugin: Option<&Path>) -> Result<()> {
    let calls = 2_000_000u64;
    rec.section("per_call", &format!("per-call cost of route() over 8 replicas ({calls} calls per run, ns/call):"));
    let v = views(8);
    let req = Request::new(0, 0.0, 0);
    for name in ["least_requests", "round_robin"] {
        let mut static_router: Box<dyn FnMut() -> u32> = match name {
            "least_requests" => {
                let mut p =
                    routelab_policies::least_requests::LeastRequests::new(Default::default(), &ctx(8)).expect("builds");
                let v = v.clone();
                Box::new(move || p.route(black_box(&req), black_box(&Replicas::new(&v))) as u32)
            }
            _ => {
                let mut p =
                    routelab_policies::round_robin::RoundRobin::new(Default::default(), &ctx(8)).expect("builds");
                let v = v.clone();
                Box::new(move || p.route(black_box(&req), black_box(&Replicas::new(&v))) as u32)
            }
        };
        let mut linked = loader.router(&PolicySpec::parse(name)?, &ctx(8))?;
        let mut loaded = match plugin {
            Some(lib) => Some(loader.router(&PolicySpec::parse(&format!("{}:{name}", lib.display()))?, &ctx(8))?),
            None => None,
        };
        let mut variants = vec![format!("{name} static"), format!("{name} linked-in ABI object")];
        if loaded.is_some() {
            variants.push(format!("{name} loaded library"));
        }
        let figs = rec.compare(&variants, "ns/call", |i| {
            Ok(match i {
                0 => ns_per_call(calls, |_| static_router()),
                1 => ns_per_call(calls, |_| linked.route(black_box(&req), black_box(Replicas::new(&v))).unwrap()),
                _ => {
                    let r = loaded.as_mut().expect("a third variant only with a library");
                    ns_per_call(calls, |_| r.route(black_box(&req), black_box(Replicas::new(&v))).unwrap())
                }
            })
        })?;
        let loaded_text = match figs.get(2) {
            Some(f) => format!("{} ns", f.show(1.0, 2)),
            None => "(no plugin library: cargo build --release -p routelab-builtin-plugin)".into(),
        };
        rec.line(format!(
            "  {name:<16} static {} ns | linked-in ABI object {} ns | loaded library {loaded_text}",
            figs[0].show(1.0, 2),
            figs[1].show(1.0, 2)
        ));
    }
    Ok(())
}

/// A cluster preset shipped in `workloads/cluster/`, parsed from the text compiled into the binary.
fn preset(name: &str) -> Result<ClusterSpec> {
    let text = match name {
        "tool_use" => include_str!("../../workloads/cluster/tool_use.yaml"),
        "long_doc_qa" => include_str!("../../workloads/cluster/long_doc_qa.yaml"),
        "agent" => include_str!("../../workloads/cluster/agent.yaml"),
        "programming" => include_str!("../../workloads/cluster/programming.yaml"),
        "video_qa" => include_str!("../../workloads/cluster/video_qa.yaml"),
        _ => anyhow::bail!("no preset {name}"),
    };
    let w = routelab_core::workload::parse(text, Path::new(name))?;
    Ok(w.cluster.expect("a cluster preset"))
}

/// The cluster section of `routelab bench`.
fn bench_cluster(loader: &mut Loader, rec: &mut Recorder) -> Result<()> {
    rec.section(
        "cluster_scaling",
        "cluster world, least_work_left (simulated requests per wall second; linear = flat across a row):",
    );
    rec.line(format!("  requests:               {:>16} {:>16} {:>16}", "10^4", "10^5", "10^6"));
    for name in ["tool_use", "long_doc_qa"] {
        let spec = preset(name)?;
        let sizes = [10_000u64, 100_000, 1_000_000];
        let names = sizes.map(|n| format!("{name} {n} requests"));
        let figs = rec.compare(&names, "requests/s", |i| {
            Ok(sizes[i] as f64 / cluster_timing(loader, &spec, "least_work_left", sizes[i])?.simulate_s)
        })?;
        let cells: Vec<String> = figs.iter().map(|f| format!("{:>14}/s", f.show(1.0, 0))).collect();
        rec.line(format!("  {name:<10} ({} replicas) {}", spec.replicas, cells.join(" ")));
    }
    // The same tool_use traffic on 4 prefill + 4 decode instances (the 8 replicas split).
    let mut pd = preset("tool_use")?;
    pd.disaggregation =
        Some(serde_norway::from_str("{prefill: {instances: 4}, decode: {instances: 4}, link: {bandwidth_gbps: 100}}")?);
    let pd_router = "pd_sglang{prefill: sglang_cache_aware, decode: power_of_two}";
    let sizes = [10_000u64, 100_000, 1_000_000];
    let names = sizes.map(|n| format!("tool_use 4P4D {n} requests"));
    let figs = rec.compare(&names, "requests/s", |i| {
        Ok(sizes[i] as f64 / cluster_timing(loader, &pd, pd_router, sizes[i])?.simulate_s)
    })?;
    let cells: Vec<String> = figs.iter().map(|f| format!("{:>14}/s", f.show(1.0, 0))).collect();
    rec.line(format!("  tool_use 4P4D (pd_sglang) {}   ({pd_router})", cells.join(" ")));
    // The calibrated step model against the roofline: the same traffic on the same GPU and model,
    // and the same engine rules (the preset's: the calibration is set after parsing, so the
    // vLLM rules a calibrated workload file defaults to do not apply): what the pricing costs.
    let mut roofline = preset("tool_use")?;
    roofline.gpu = Choice::Name("rtx-pro-6000".into());
    roofline.model = Choice::Name("llama-3.1-8b".into());
    let mut calibrated = roofline.clone();
    calibrated.calibration = Some(Choice::Name("rtx-pro-6000".into()));
    let specs = [roofline, calibrated];
    let names = ["roofline", "calibrated"].map(|m| format!("tool_use rtx-pro-6000 {m} 100000 requests"));
    let figs = rec.compare(&names, "requests/s", |i| {
        Ok(100_000.0 / cluster_timing(loader, &specs[i], "least_work_left", 100_000)?.simulate_s)
    })?;
    rec.line(format!(
        "  tool_use on rtx-pro-6000 / llama-3.1-8b, 10^5 requests: roofline {}/s, calibrated {}/s",
        figs[0].show(1.0, 0),
        figs[1].show(1.0, 0)
    ));
    // The same long_doc_qa traffic with a CPU KV tier under every replica: what the tiers cost.
    let plain = preset("long_doc_qa")?;
    let mut tiered = plain.clone();
    tiered.kv_tiers = Some(serde_norway::from_str("{cpu: {capacity_gb: 128, bandwidth_gbps: 400}}")?);
    let specs = [plain, tiered];
    let names = ["without tiers", "with a cpu tier"].map(|m| format!("long_doc_qa {m} 100000 requests"));
    let figs = rec.compare(&names, "requests/s", |i| {
        Ok(100_000.0 / cluster_timing(loader, &specs[i], "least_work_left", 100_000)?.simulate_s)
    })?;
    rec.line(format!(
        "  long_doc_qa, 10^5 requests: without tiers {}/s, with a cpu tier {}/s (tiered run takes {:.2}× the time)",
        figs[0].show(1.0, 0),
        figs[1].show(1.0, 0),
        figs[0].median / figs[1].median
    ));
    let routers = [
        "round_robin",
        "max_affinity",
        "threshold_affinity",
        "sglang_cache_aware",
        "preble",
        "dynamo_kv",
        "llm_d",
        "llm_d_sticky",
        "llm_d_predicted_latency",
        "aibrix_prefix_cache",
        "vllm_prefix_aware",
        "vllm_loadaware",
        "chwbl",
        "ray_prefix_aware",
    ];
    decisions_table(loader, rec, &routers)?;
    memory::memory_section(loader, rec, &["sglang_cache_aware", "preble", "vllm_prefix_aware", "ray_prefix_aware"])?;
    mooncake_section(loader, rec, &routers)?;
    agentic_section(loader, rec)?;
    // The Preble grid's policies on the five presets at their base rate, one seed each.
    let grid = [
        "round_robin@lpm",
        "sglang_cache_aware@lpm",
        "preble{rebalance: false, autoscale: false, pd_pairing: false}@lpm",
        "preble{autoscale: false, pd_pairing: false}@lpm",
        "preble@priority_groups",
    ];
    let presets = ["tool_use", "agent", "programming", "video_qa", "long_doc_qa"];
    let specs = presets.iter().map(|p| preset(p)).collect::<Result<Vec<_>>>()?;
    let requests: u64 = specs.iter().map(|s| s.requests.unwrap_or(1000)).sum::<u64>() * grid.len() as u64;
    rec.section("preble_grid", "");
    let f = rec.measure("preble_grid end to end", "requests/s", || {
        let mut seconds = 0.0;
        for spec in &specs {
            for policy in grid {
                let t = cluster_timing(loader, spec, policy, spec.requests.unwrap_or(1000))?;
                seconds += t.generate_s + t.simulate_s;
            }
        }
        Ok(requests as f64 / seconds)
    })?;
    rec.line(format!(
        "preble_grid end to end (5 presets × 5 policies at the base rate, one seed): {requests} requests, {} simulated requests/s",
        f.show(1.0, 0)
    ));
    Ok(())
}

/// What admission and classes cost (issue 27's goal: at most 10% on a tool_use run): the same
/// tool_use traffic (`requests` requests, least_work_left) run with no admission policy at all
/// (no admission calls, as before admission existed), behind `admit_all`, and behind `admit_all`
/// with two classes and two tenants (class labels come from their own random stream, so the
/// arrivals and sizes stay request for request the same: only the labels, the facts and the
/// per-class and per-tenant figures are added). Each sample is one whole run, generation and
/// simulation; the three alternate run by run, and the ratios are of their medians.
fn admission_section(loader: &mut Loader, rec: &mut Recorder, requests: u64) -> Result<()> {
    rec.section(
        "admission",
        &format!("admission and classes, tool_use, least_work_left, {requests} requests (simulated requests/s):"),
    );
    let plain = preset("tool_use")?;
    let mut classes = plain.clone();
    classes.classes = serde_norway::from_str(
        "[{name: interactive, share: 0.5, priority: 1, slo: {ttft_s: 1}}, \
          {name: batch, share: 0.5, priority: -1, slo: {ttft_s: 60}}]",
    )?;
    classes.tenants = serde_norway::from_str("[{name: a, weight: 2}, {name: b, weight: 1}]")?;
    let variants: [(&str, &ClusterSpec, Option<&str>); 3] = [
        ("no admission", &plain, None),
        ("admit_all", &plain, Some("admit_all")),
        ("admit_all + 2 classes, 2 tenants", &classes, Some("admit_all")),
    ];
    let names = variants.map(|v| v.0);
    let figs = rec.compare(&names, "requests/s", |i| {
        let (_, spec, admission) = variants[i];
        let t = cluster_timing_with(loader, spec, "least_work_left", requests, admission)?;
        Ok(requests as f64 / (t.generate_s + t.simulate_s))
    })?;
    for f in &figs {
        // Time per run relative to no admission, round by round (the variants of one round ran
        // back to back, so a slow patch of the machine falls on all of them): the median of
        // the rounds' time ratios, and their range.
        let mut ratios: Vec<f64> = figs[0].samples.iter().zip(&f.samples).map(|(base, x)| base / x).collect();
        ratios.sort_by(f64::total_cmp);
        let median = ratios[ratios.len() / 2];
        let pct = |r: f64| (r - 1.0) * 100.0;
        let (lo, hi) = (ratios[0], ratios[ratios.len() - 1]);
        rec.line(format!(
            "  {:<34} {:>14}/s   time {:+.1}% (rounds {:+.1}%..{:+.1}%)",
            f.name,
            f.show(1.0, 0),
            pct(median),
            pct(lo),
            pct(hi)
        ));
    }
    Ok(())
}

/// Wall seconds per policy to replay the Mooncake conversation trace (12,031 requests): the
/// built-in `mooncake_conversation`, so the row runs from any directory.
fn mooncake_section(loader: &mut Loader, rec: &mut Recorder, routers: &[&str]) -> Result<()> {
    let file = &routelab_core::builtin::resolve(Path::new("mooncake_conversation"))?;
    let prepared = routelab_core::runner::prepare(routelab_core::workload::load(file)?, file)?;
    let input = prepared.seed_inputs()?.remove(0);
    rec.section("mooncake", "Mooncake conversation trace, whole replay (wall seconds per policy):");
    for policy in routers {
        let resolved = routelab_core::runner::resolve(loader, &prepared, &PolicySpec::parse(policy)?)?;
        let f = rec.measure(policy, "s", || {
            let t = Instant::now();
            black_box(routelab_core::runner::run_one(&resolved, &prepared, &input)?);
            Ok(t.elapsed().as_secs_f64())
        })?;
        rec.line(format!("  {policy:<20} {:>14} s", f.show(1.0, 3)));
    }
    Ok(())
}

/// The agentic presets as shipped, seed 1's stream generated beforehand, replayed whole with
/// `least_work_left`: LLM calls simulated per wall second (issue goal: ≥ 200k calls/s).
fn agentic_section(loader: &mut Loader, rec: &mut Recorder) -> Result<()> {
    rec.section(
        "agentic",
        "agentic presets, least_work_left, whole replay (LLM calls simulated per wall second, generation not counted):",
    );
    for name in ["coding_agent", "research_agent", "chat_tools"] {
        let file = &routelab_core::builtin::resolve(Path::new(&format!("cluster/agentic/{name}")))?;
        let prepared = routelab_core::runner::prepare(routelab_core::workload::load(file)?, file)?;
        let input = prepared.seed_inputs()?.remove(0);
        let resolved = routelab_core::runner::resolve(loader, &prepared, &PolicySpec::parse("least_work_left")?)?;
        let mut calls = 0.0;
        let f = rec.measure(name, "calls/s", || {
            let t = Instant::now();
            let (metrics, _) = routelab_core::runner::run_one(&resolved, &prepared, &input)?;
            let secs = t.elapsed().as_secs_f64();
            calls = metrics.get("requests").unwrap_or(0.0);
            Ok(calls / secs)
        })?;
        rec.line(format!("  {name:<16} {:>14} calls/s ({calls} calls)", f.show(1.0, 0)));
    }
    Ok(())
}

/// Routing decisions per second of router time inside a tool_use run at 8 and 64 replicas
/// (the arrival rate scaled with the replicas).
fn decisions_table(loader: &mut Loader, rec: &mut Recorder, routers: &[impl AsRef<str>]) -> Result<()> {
    rec.section(
        "decisions",
        "routing decisions per second inside a tool_use run (router time only; Preble's paper: 245–2,931/s in Python):",
    );
    rec.line(format!("  {:<20} {:>18} {:>18}", "router", "8 replicas", "64 replicas"));
    for policy in routers {
        let policy = policy.as_ref();
        let mut row = format!("  {policy:<20}");
        let mut specs = Vec::new();
        for replicas in [8u32, 64] {
            let mut spec = preset("tool_use")?;
            let scale = replicas as f64 / spec.replicas as f64;
            spec.replicas = replicas;
            if let routelab_core::workload::cluster::Arrivals::Poisson { rate } = &mut spec.arrivals {
                *rate *= scale;
            }
            specs.push(spec);
        }
        let mut overloaded = [false; 2];
        let names = [format!("{policy} 8 replicas"), format!("{policy} 64 replicas")];
        let figs = rec.compare(&names, "decisions/s", |i| {
            let t = cluster_timing(loader, &specs[i], policy, 20_000 * specs[i].replicas as u64 / 8)?;
            overloaded[i] = t.overloaded;
            Ok(t.decisions as f64 / t.router_s.max(1e-12))
        })?;
        for (f, o) in figs.iter().zip(overloaded) {
            let mark = if o { " (overloaded)" } else { "" };
            write!(row, " {:>16}/s{mark}", f.show(1.0, 0))?;
        }
        rec.line(row);
    }
    Ok(())
}

/// Allocations evaluated per second (with diagnoser verdicts) on `debate` with 1,000 training
/// questions, and the checksum of correct answers (the same every run).
pub fn compound_rate(diagnoser_accuracy: f64, allocations: u64) -> Result<(f64, u64)> {
    use rand::RngExt;
    use routelab_core::sim::compound::World;
    let yaml = format!(
        "system: debate\npool: {{models: 5}}\nquestions: {{train: 1000, test: 1000}}\ndiagnoser_accuracy: {diagnoser_accuracy}\n"
    );
    let spec: routelab_core::workload::compound::CompoundSpec = serde_norway::from_str(&yaml)?;
    let world = World::new(&spec, 1);
    let mut rng = routelab_core::seeds::stream(1, "bench.compound");
    let picks: Vec<Vec<u32>> = (0..allocations)
        .map(|_| (0..world.modules()).map(|_| rng.random_range(0..world.models.len() as u32)).collect())
        .collect();
    let t = Instant::now();
    let mut checksum = 0u64;
    for (call, a) in picks.iter().enumerate() {
        let e = black_box(world.evaluate_training(a, call as u64));
        checksum += e.correct.iter().filter(|c| **c).count() as u64;
    }
    Ok((allocations as f64 / t.elapsed().as_secs_f64(), checksum))
}
