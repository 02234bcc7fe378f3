//! How the cluster simulator's cost grows with the backlog of an overloaded cluster: tool_use at
//! 800 requests/s (10× what its 8 replicas serve), round robin, 10⁴ / 10⁵ / 3×10⁵ requests. With
//! a cost linear in the requests, the time ratios follow the request ratios (10×, 30×).
//! `cargo run --release -p routelab --example overload_scaling`
//! (a measurement printed by one run, never a timed test).
//!
//! Measured on a shared 2-core machine (user CPU seconds of `routelab compare` on tool_use with
//! `rate: 800`, round_robin, one seed): before the batcher filtered only the shown front of the
//! waiting queue, 10⁴ / 10⁵ / 3×10⁵ requests took 0.15 / 3.34 / 18.6 s (22× and 124×); after,
//! 0.14 / 1.68 / 2.97 s (12× and 21×). This example printed 1.0× / 10.3× / 18.9× wall time.

use std::path::Path;
use std::time::Instant;

use routelab_core::plugin::{Loader, PolicySpec};
use routelab_core::runner;
use routelab_core::workload::cluster::Arrivals;

fn main() {
    let file = Path::new("workloads/cluster/tool_use.yaml");
    let mut w = routelab_core::workload::load(file).expect("run from the repository root");
    w.seeds = 1;
    let policy = PolicySpec::parse("round_robin").expect("built-in");
    let mut loader = Loader::new();
    let mut base = None;
    println!("| requests | wall time s | µs per request | time ratio to 10⁴ |");
    println!("|---:|---:|---:|---:|");
    for n in [10_000u64, 100_000, 300_000] {
        let c = w.cluster.as_mut().expect("cluster workload");
        c.arrivals = Arrivals::Poisson { rate: 800.0 };
        c.requests = Some(n);
        let prepared = runner::prepare(w.clone(), file).expect("valid workload");
        let inputs = prepared.seed_inputs().expect("stream");
        let resolved = runner::resolve(&mut loader, &prepared, &policy).expect("router");
        // Only the simulation is timed; the stream is generated above.
        let start = Instant::now();
        let (m, _) = runner::run_one(&resolved, &prepared, &inputs[0]).expect("run");
        let s = start.elapsed().as_secs_f64();
        assert!(m.get("requests").is_some());
        let b = *base.get_or_insert(s);
        println!("| {n} | {s:.2} | {:.1} | {:.1}× |", s * 1e6 / n as f64, s / b);
    }
}
