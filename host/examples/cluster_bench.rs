//! Simulated requests per wall second of the cluster world on the presets, and how time grows
//! with the number of requests: `cargo run --release -p routelab --example cluster_bench
//! [-- PRESET ROUTER N...]` (defaults: tool_use and long_doc_qa, least_work_left, 10^4 and 10^5).

use std::path::Path;

use routelab::plugin::Loader;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let presets: Vec<String> = if args.is_empty() { vec!["tool_use".into(), "long_doc_qa".into()] } else { vec![args[0].clone()] };
    let router = args.get(1).cloned().unwrap_or_else(|| "least_work_left".into());
    let sizes: Vec<u64> = if args.len() > 2 { args[2..].iter().map(|s| s.parse().unwrap()).collect() } else { vec![10_000, 100_000] };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../workloads/cluster");
    let mut loader = Loader::new();
    for p in &presets {
        let w = routelab::workload::load(&root.join(format!("{p}.yaml")))?;
        let spec = w.cluster.expect("a cluster preset");
        for &n in &sizes {
            let (generated, simulated) = routelab::bench::cluster_timing(&mut loader, &spec, &router, n)?;
            println!(
                "{p:12} {router:16} {n:>9} requests: generate {generated:7.3} s, simulate {simulated:8.3} s = {:>9.0} simulated requests/s",
                n as f64 / simulated
            );
        }
    }
    Ok(())
}
