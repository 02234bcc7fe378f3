//! `routelab bench`: how fast the simulator runs and what a router call costs, static versus
//! through a loaded library. Wall-clock time is read here, in the host, never in `sim/` or in a
//! policy. Compare ratios within one run: the machine is shared and noisy.

use std::fmt::Write as _;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::Instant;

use abi_stable::std_types::{RNone, RSlice};
use anyhow::Result;
use routelab_policy_api::{Policy, ReplicaView, Request, RouterContext, RouterPolicy, World};

use crate::plugin::{Loader, PolicySpec};
use crate::workload::dispatch::DispatchSpec;

fn dispatch_spec(servers: u32, requests: u64) -> DispatchSpec {
    serde_norway::from_str(&format!("{{servers: {servers}, requests: {requests}, utilisation: 0.9}}"))
        .expect("valid bench spec")
}

fn ctx(replicas: u32) -> RouterContext {
    RouterContext { world: World::Dispatch, replicas, seed: 7, kv_capacity_tokens: 0, cost: RNone }
}

/// Simulated requests per wall second for `policy` (a built-in or library spec).
pub fn dispatch_rate(loader: &mut Loader, policy: &str, servers: u32, requests: u64) -> Result<f64> {
    let spec = dispatch_spec(servers, requests);
    let mut router = loader.router(&PolicySpec::parse(policy)?, &ctx(servers))?;
    let t = Instant::now();
    let m = crate::sim::dispatch::run(&spec, None, &mut router, policy, 1)?;
    let secs = t.elapsed().as_secs_f64();
    black_box(m);
    Ok(requests as f64 / secs)
}

fn views(n: usize) -> Vec<ReplicaView> {
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
    let p = exe.parent()?.join(format!("{}routelab_builtin_plugin{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX));
    p.exists().then_some(p)
}

pub fn run(requests: u64, plugin: Option<&Path>) -> Result<String> {
    let mut loader = Loader::new();
    let mut out = String::new();
    let plugin = plugin.map(Path::to_path_buf).or_else(default_plugin_path);
    writeln!(out, "dispatch world, 16 servers, ρ 0.9, exponential, {requests} requests (built-in router):")?;
    for p in ["round_robin", "random", "power_of_two", "least_requests", "least_work_left"] {
        let r = dispatch_rate(&mut loader, p, 16, requests)?;
        writeln!(out, "  {p:<16} {:>7.2} M simulated requests/s", r / 1e6)?;
    }
    if let Some(lib) = &plugin {
        let r = dispatch_rate(&mut loader, &format!("{}:round_robin", lib.display()), 16, requests)?;
        writeln!(out, "  {:<16} {:>7.2} M simulated requests/s (loaded from the plugin library)", "round_robin", r / 1e6)?;
    }

    writeln!(out, "\nscaling (M simulated requests/s; flat across a row = cost independent of that size):")?;
    writeln!(out, "  requests: {:>10} {:>10}", requests / 10, requests)?;
    for p in ["round_robin", "power_of_two"] {
        let a = dispatch_rate(&mut loader, p, 16, requests / 10)?;
        let b = dispatch_rate(&mut loader, p, 16, requests)?;
        writeln!(out, "  {p:<16} {:>10.2} {:>10.2}", a / 1e6, b / 1e6)?;
    }
    writeln!(out, "  servers:  {:>10} {:>10} {:>10} {:>10}", 16, 64, 256, 1024)?;
    for p in ["round_robin", "power_of_two", "least_requests"] {
        let mut row = format!("  {p:<16}");
        for n in [16, 64, 256, 1024] {
            let r = dispatch_rate(&mut loader, p, n, requests / 4)?;
            write!(row, " {:>10.2}", r / 1e6)?;
        }
        writeln!(out, "{row}")?;
    }

    let calls = 20_000_000u64;
    writeln!(out, "\nper-call cost of route() over 8 replicas ({calls} calls):")?;
    let v = views(8);
    let req = Request { id: 0, arrived_at: 0.0, prompt_tokens: 0, size_hint: RNone, segments: RSlice::EMPTY };
    for name in ["least_requests", "round_robin"] {
        let static_ns = match name {
            "least_requests" => {
                let mut p = routelab_policies::least_requests::LeastRequests::new(Default::default(), &ctx(8)).expect("builds");
                ns_per_call(calls, |_| p.route(black_box(&req), black_box(&v)) as u32)
            }
            _ => {
                let mut p = routelab_policies::round_robin::RoundRobin::new(Default::default(), &ctx(8)).expect("builds");
                ns_per_call(calls, |_| p.route(black_box(&req), black_box(&v)) as u32)
            }
        };
        let mut linked = loader.router(&PolicySpec::parse(name)?, &ctx(8))?;
        let linked_ns = ns_per_call(calls, |_| linked.route(black_box(&req), RSlice::from_slice(black_box(&v))).unwrap());
        let loaded = match &plugin {
            Some(lib) => {
                let mut r = loader.router(&PolicySpec::parse(&format!("{}:{name}", lib.display()))?, &ctx(8))?;
                format!(
                    "{:>6.2} ns",
                    ns_per_call(calls, |_| r.route(black_box(&req), RSlice::from_slice(black_box(&v))).unwrap())
                )
            }
            None => "(no plugin library: cargo build --release -p routelab-builtin-plugin)".into(),
        };
        writeln!(
            out,
            "  {name:<16} static {static_ns:>6.2} ns | linked-in ABI object {linked_ns:>6.2} ns | loaded library {loaded}"
        )?;
    }
    Ok(out)
}

/// Wall seconds to generate and to simulate `spec` with `requests` requests under `policy`
/// (generation, simulation): simulated requests per second is `requests / simulation`.
pub fn cluster_timing(
    loader: &mut Loader,
    spec: &crate::workload::cluster::ClusterSpec,
    policy: &str,
    requests: u64,
) -> Result<(f64, f64)> {
    use crate::sim::cluster;
    let mut spec = spec.clone();
    spec.requests = Some(requests);
    spec.duration_s = None;
    let sm = spec.step_model().map_err(|e| anyhow::anyhow!("{}: {}", e.path, e.message))?;
    let mut router = loader.router(&PolicySpec::parse(policy)?, &cluster::router_context(&sm, spec.replicas, 1))?;
    let mut schedulers = cluster::make_schedulers(&spec, loader, 1)?;
    let t = Instant::now();
    let stream = crate::workload::generate::generate(&spec, None, 1).map_err(anyhow::Error::msg)?;
    let generated = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let outcome = cluster::run_stream(&spec, &stream, &mut router, &mut schedulers, policy)?;
    let simulated = t.elapsed().as_secs_f64();
    black_box(outcome);
    Ok((generated, simulated))
}
