//! The `--csv` rows: one per (workload, policy), the union of metric keys as columns. Written
//! with the `csv` crate, so labels, errors and policy figures with commas, quotes or newlines
//! stay in their cell.

use routelab_core::runner::WorkloadResult;

pub fn render(workloads: &[WorkloadResult]) -> String {
    // The union in first-seen order; sets and indexes keep it linear in the figures' number.
    let mut keys: Vec<&str> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for w in workloads {
        for r in &w.results {
            for k in r.metrics.keys() {
                if seen.insert(k) {
                    keys.push(k);
                }
            }
        }
    }
    let mut out = csv::WriterBuilder::new().terminator(csv::Terminator::Any(b'\n')).from_writer(Vec::new());
    let header = ["workload", "world", "seed", "seeds", "policy", "error"].into_iter().chain(keys.iter().copied());
    out.write_record(header).expect("writing to memory");
    for w in workloads {
        for r in &w.results {
            let mut row = vec![
                w.name.clone(),
                w.world.to_string(),
                w.seed.to_string(),
                w.seeds.to_string(),
                r.policy.clone(),
                r.error.clone().unwrap_or_default(),
            ];
            let m = r.metrics.index();
            row.extend(
                keys.iter().map(|k| m.get(k).filter(|v| v.is_finite()).map_or(String::new(), |v| v.to_string())),
            );
            out.write_record(&row).expect("writing to memory");
        }
    }
    String::from_utf8(out.into_inner().expect("writing to memory")).expect("the fields are UTF-8")
}

#[cfg(test)]
mod tests {
    use super::*;
    use routelab_core::metrics::Metrics;
    use routelab_core::runner::PolicyResult;

    #[test]
    fn commas_quotes_and_newlines_stay_in_their_cell() {
        let w = routelab_core::workload::parse(
            "dispatch: {servers: 2, requests: 10, utilisation: 0.5}\n",
            std::path::Path::new("w,1.yaml"),
        )
        .unwrap();
        let mut m = Metrics::new();
        m.push("x", 1.5);
        let result = |policy: &str, error: Option<&str>| PolicyResult {
            policy: policy.into(),
            spec: policy.into(),
            config: String::new(),
            metrics: m.clone(),
            per_seed: Vec::new(),
            allocation: Vec::new(),
            error: error.map(str::to_string),
            input_error: false,
            detail: None,
        };
        let wr = WorkloadResult {
            name: w.name.clone(),
            world: "dispatch",
            seed: 1,
            seeds: 1,
            resolved: w,
            notes: Vec::new(),
            results: vec![result("p{a: 1, b: 2}", None), result("q", Some("said \"no\",\nthen stopped"))],
        };
        let text = render(&[wr]);
        let rows: Vec<csv::StringRecord> =
            csv::Reader::from_reader(text.as_bytes()).records().map(Result::unwrap).collect();
        assert_eq!(rows.len(), 2, "{text}");
        assert_eq!(&rows[0][0], "w,1");
        assert_eq!(&rows[0][4], "p{a: 1, b: 2}");
        assert_eq!(&rows[0][6], "1.5");
        assert_eq!(&rows[1][5], "said \"no\",\nthen stopped");
    }
}
