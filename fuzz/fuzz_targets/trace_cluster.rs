//! Any text as a cluster trace (Azure LLM inference trace CSV, timestamps as dates or seconds):
//! parsing, the pre-run row checks and the generated request stream must never panic, and every
//! row that passes the checks must become a request whose arrival is within the clock.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use routelab_core::workload::{generate, trace};

const SPEC: &str = "replicas: 2\nchunk_tokens: 0\nmax_step_tokens: 4096\n\
generator: {output_tokens: 16}\narrivals: {trace: {path: t.csv, time_scale: 0.5}}\n";

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let file = Path::new("fuzz.csv");
    let Ok(rows) = trace::parse(text, file) else { return };
    let spec: routelab_core::workload::cluster::ClusterSpec = routelab_yaml(SPEC);
    if trace::check_cluster_rows(&rows, &spec, file).is_err() {
        return;
    }
    let stream = generate::generate(&spec, Some(&rows), 1).expect("rows were checked");
    assert_eq!(stream.requests.len(), rows.len());
    for r in &stream.requests {
        assert!(r.arrived_at < u64::MAX / 8, "arrival {} outside the clock", r.arrived_at);
    }
});

fn routelab_yaml<T: serde::de::DeserializeOwned>(text: &str) -> T {
    serde_norway::from_str(text).expect("the fixed spec parses")
}
