//! The `--json` document: `{"routelab", "command", "workloads": [...]}` (docs/output.md).

use serde::Serialize;

use routelab_core::runner::WorkloadResult;

#[derive(Serialize)]
pub struct Document<'a> {
    pub routelab: &'static str,
    pub command: &'a str,
    pub workloads: &'a [WorkloadResult],
}

/// The JSON text of a command's results.
pub fn render(command: &str, workloads: &[WorkloadResult]) -> String {
    let doc = Document { routelab: env!("CARGO_PKG_VERSION"), command, workloads };
    serde_json::to_string_pretty(&doc).expect("results serialise")
}
