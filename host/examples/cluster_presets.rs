//! Each cluster preset's generated statistics and a quick comparison of the classic routers:
//! `[ROUTERS=a,b,c] cargo run --release -p routelab --example cluster_presets [-- PRESET...]`.

use std::path::Path;

use routelab::plugin::{Loader, PolicySpec};
use routelab::sim::cluster;
use routelab::workload::{self, generate};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let presets: Vec<String> = if args.is_empty() {
        ["tool_use", "agent", "programming", "video_qa", "long_doc_qa"].map(String::from).to_vec()
    } else {
        args
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../workloads/cluster");
    let mut loader = Loader::new();
    for p in &presets {
        let w = workload::load(&root.join(format!("{p}.yaml")))?;
        let spec = w.cluster.expect("cluster preset");
        let stream = generate::generate(&spec, None, w.seed).map_err(anyhow::Error::msg)?;
        println!("== {p}\n{}", generate::stats(&stream));
        let sm = spec.step_model().map_err(|e| anyhow::anyhow!("{}", e.message))?;
        let routers = std::env::var("ROUTERS").unwrap_or_else(|_| "round_robin,least_requests,least_work_left".into());
        for router in routers.split(',') {
            let mut r = loader.router(&PolicySpec::parse(router)?, &cluster::router_context(&sm, spec.replicas, w.seed))?;
            let mut s = cluster::make_schedulers(&spec, &mut loader, w.seed)?;
            let o = cluster::run_stream(&spec, &stream, &mut r, &mut s, router)?;
            let g = |k: &str| o.metrics.get(k).unwrap_or(f64::NAN);
            println!(
                "  {router:20} lat {:7.2} s p99 {:7.2} ttft {:6.2} tpot {:.4} thr {:6.2} hit {:.3} repl {:.2} busiest {:.3} done {} unfinished {} overloaded {}",
                g("latency_mean_s"), g("latency_p99_s"), g("ttft_mean_s"), g("tpot_mean_s"), g("throughput_rps"),
                g("hit_rate"), g("replication_factor"), g("busiest_replica_share"), g("completed"), g("unfinished"), g("overloaded")
            );
        }
    }
    Ok(())
}
