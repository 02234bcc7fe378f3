//! The `--csv` rows: one per (workload, policy), the union of metric keys as columns.

use crate::runner::WorkloadResult;

fn quote(s: &str) -> String {
    if s.contains([',', '"', '\n']) { format!("\"{}\"", s.replace('"', "\"\"")) } else { s.to_string() }
}

pub fn render(workloads: &[WorkloadResult]) -> String {
    let mut keys: Vec<String> = Vec::new();
    for w in workloads {
        for r in &w.results {
            for k in r.metrics.keys() {
                if !keys.iter().any(|x| x == k) {
                    keys.push(k.to_string());
                }
            }
        }
    }
    let mut out = String::from("workload,world,seed,seeds,policy,error");
    for k in &keys {
        out.push(',');
        out.push_str(k);
    }
    out.push('\n');
    for w in workloads {
        for r in &w.results {
            out.push_str(&format!(
                "{},{},{},{},{},{}",
                quote(&w.name),
                w.world,
                w.seed,
                w.seeds,
                quote(&r.policy),
                quote(r.error.as_deref().unwrap_or(""))
            ));
            for k in &keys {
                out.push(',');
                if let Some(v) = r.metrics.get(k).filter(|v| v.is_finite()) {
                    out.push_str(&v.to_string());
                }
            }
            out.push('\n');
        }
    }
    out
}
