//! Any text as a dispatch-world trace (arrival times rescaled to the target utilisation): parsing
//! and a short run with round robin must never panic, and latencies must be finite and ≥ 0.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use routelab_core::plugin::{Loader, PolicySpec};
use routelab_core::workload::{dispatch::DispatchSpec, trace};

const SPEC: &str = "servers: 4\nrequests: 200\nutilisation: 0.8\narrivals: {trace: {path: t.csv}}\n";

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(rows) = trace::parse(text, Path::new("fuzz.csv")) else { return };
    if rows.len() < 2 {
        return; // prepare() refuses it: a rate needs two rows
    }
    let spec: DispatchSpec = serde_norway::from_str(SPEC).expect("the fixed spec parses");
    let mut loader = Loader::new();
    let ctx = routelab_core::sim::dispatch::router_context(4, 1);
    let router = loader.router(&PolicySpec::parse("round_robin").unwrap(), &ctx).unwrap();
    if let Ok(m) = routelab_core::sim::dispatch::run(&spec, Some(&rows), router, "round_robin", 1) {
        for (k, v) in &m.0 {
            assert!(!(k.contains("response") && *v < 0.0), "{k} = {v}");
        }
    }
});
