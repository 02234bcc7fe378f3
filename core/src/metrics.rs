//! Per-request records → summaries: mean and percentiles of one run, mean and 95% interval over
//! seeds. Metric names are snake_case with a unit suffix (docs/output.md).

use serde::ser::{Serialize, SerializeMap, Serializer};

/// The metric keys every cluster run reports (docs/output.md lists them with their units).
pub const CLUSTER_KEYS: &[&str] = &[
    "requests",
    "completed",
    "unfinished",
    "overloaded",
    "latency_mean_s",
    "latency_p50_s",
    "latency_p90_s",
    "latency_p99_s",
    "ttft_mean_s",
    "ttft_p50_s",
    "ttft_p90_s",
    "ttft_p99_s",
    "tpot_mean_s",
    "tpot_p50_s",
    "tpot_p90_s",
    "tpot_p99_s",
    "throughput_rps",
    "output_tokens_per_s",
    "output_tokens_per_s_per_replica",
    "hit_rate",
    "replication_factor",
    "busiest_replica_share",
];

/// The keys a cluster run with `lora:` adds (docs/output.md).
pub const LORA_KEYS: &[&str] = &["lora_loads", "lora_hit_rate", "lora_load_s"];

/// The keys a disaggregated cluster run adds (docs/output.md).
pub const PD_KEYS: &[&str] = &[
    "transfer_time_mean_s",
    "transfer_share",
    "prefill_utilisation",
    "decode_utilisation",
    "prefill_hit_rate",
    "decode_hit_rate",
    "decode_only_share",
    "rejected",
    "prefix_migrations",
];

/// The keys a cluster run adds when its workload has an `slo:` (docs/output.md).
pub const SLO_KEYS: &[&str] = &["slo_attainment", "goodput_rps"];

/// The metric keys every queueing-mode dispatch run reports (docs/output.md).
pub const DISPATCH_KEYS: &[&str] = &[
    "requests",
    "response_mean",
    "response_p50",
    "response_p90",
    "response_p99",
    "wait_mean",
    "queue_mean",
    "utilisation",
    "busiest_server_share",
];

/// Named figures in a fixed order (serialised as a JSON object in that order).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metrics(pub Vec<(String, f64)>);

impl Metrics {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn push(&mut self, key: impl Into<String>, value: f64) {
        let key = key.into();
        // Times between two events of one request cannot be negative; one that is means the
        // simulated clock overflowed (validation refuses such horizons up front).
        debug_assert!(
            !(value < 0.0 && ["latency", "ttft", "tpot", "response", "wait"].iter().any(|k| key.contains(k))),
            "negative {key} = {value}: the simulated clock overflowed"
        );
        self.0.push((key, value));
    }

    pub fn get(&self, key: &str) -> Option<f64> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
    }

    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(k, _)| k.as_str())
    }

    /// The figures by key (the first of a repeated key, as [`Metrics::get`]): for looking many
    /// keys up, which `get` does in linear time each (a plugin may report 100,000 figures).
    pub fn index(&self) -> std::collections::HashMap<&str, f64> {
        let mut by_key = std::collections::HashMap::with_capacity(self.0.len());
        for (k, v) in &self.0 {
            by_key.entry(k.as_str()).or_insert(*v);
        }
        by_key
    }
}

impl Serialize for Metrics {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            // JSON has no NaN/inf: absent figures are null.
            if v.is_finite() {
                m.serialize_entry(k, v)?;
            } else {
                m.serialize_entry(k, &Option::<f64>::None)?;
            }
        }
        m.end()
    }
}

/// Reads what [`Serialize`] wrote, in order: `null` (a non-finite figure) comes back as NaN, so
/// a summary recomputed from read figures is non-finite exactly where the original was
/// (`routelab merge`).
impl<'de> serde::Deserialize<'de> for Metrics {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct InOrder;
        impl<'de> serde::de::Visitor<'de> for InOrder {
            type Value = Metrics;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object of metric name to number or null")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Metrics, A::Error> {
                let mut out = Metrics::new();
                while let Some((k, v)) = map.next_entry::<String, Option<f64>>()? {
                    out.0.push((k, v.unwrap_or(f64::NAN)));
                }
                Ok(out)
            }
        }
        d.deserialize_map(InOrder)
    }
}

/// Arithmetic mean (NaN for none).
pub fn mean(xs: &[f64]) -> f64 {
    if xs.is_empty() { f64::NAN } else { xs.iter().sum::<f64>() / xs.len() as f64 }
}

/// The `q`-quantile (0..=1) by the nearest-rank method; reorders `xs`. NaN for none.
pub fn quantile(xs: &mut [f64], q: f64) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * xs.len() as f64).ceil() as usize).clamp(1, xs.len()) - 1;
    let (_, v, _) = xs.select_nth_unstable_by(rank, f64::total_cmp);
    *v
}

/// Two-sided 95% Student-t critical value for `dof` degrees of freedom.
pub fn t95(dof: usize) -> f64 {
    const T: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
    ];
    match dof {
        0 => f64::NAN,
        d if d <= 30 => T[d - 1],
        _ => 1.96,
    }
}

/// Mean and half-width of the 95% confidence interval over independent runs (NaN half-width
/// for a single run).
pub fn mean_ci95(xs: &[f64]) -> (f64, f64) {
    let m = mean(xs);
    if xs.len() < 2 {
        return (m, f64::NAN);
    }
    let var = xs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (xs.len() - 1) as f64;
    (m, t95(xs.len() - 1) * (var / xs.len() as f64).sqrt())
}

/// Summary over seeds: each metric's mean, plus `<key>_ci95` half-widths when there are several.
pub fn over_seeds(per_seed: &[Metrics]) -> Metrics {
    let mut out = Metrics::new();
    let Some(first) = per_seed.first() else { return out };
    // Each seed's figures by key (the first of a repeated key, as `get`), so that a policy with
    // many figures costs linear time, not quadratic.
    let index: Vec<_> = per_seed.iter().map(Metrics::index).collect();
    for key in first.keys() {
        let xs: Vec<f64> = index.iter().filter_map(|m| m.get(key).copied()).collect();
        let (m, ci) = mean_ci95(&xs);
        out.push(key, m);
        if per_seed.len() > 1 {
            out.push(format!("{key}_ci95"), ci);
        }
    }
    out
}

/// Points of a latency CDF kept per run (the quantiles 0, 1/N, …, 1).
pub const CDF_POINTS: usize = 200;
/// Samples of each replica's in-flight requests kept per run.
pub const TIMELINE_SAMPLES: usize = 240;

/// One run's shape beyond its summary, for charts (not in JSON or CSV): the latency distribution
/// and each replica's in-flight requests over time. Kept for a policy's first seed only. Every
/// number is finite (serialised between an `--isolate` child and its parent).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Detail {
    /// Latency (cluster, s) or response time (dispatch, mean service times) of the finished
    /// requests at the quantiles 0, 1/N, …, 1 ([`CDF_POINTS`]); empty when none finished.
    pub latency_quantiles: Vec<f64>,
    /// Finished ÷ measured requests: where the CDF tops out (below 1 when requests were unfinished).
    pub finished_share: f64,
    /// Sample times (the run's time unit) and, at each, every replica's requests dispatched to it
    /// and not yet finished (waiting or running).
    pub times: Vec<f64>,
    pub in_flight: Vec<Vec<u32>>,
}

/// `xs` sorted, read at the quantiles 0, 1/`points`, …, 1 by nearest rank (reorders `xs`).
pub fn quantile_vector(xs: &mut [f64], points: usize) -> Vec<f64> {
    if xs.is_empty() {
        return Vec::new();
    }
    xs.sort_unstable_by(f64::total_cmp);
    let n = xs.len();
    (0..=points).map(|i| xs[((i as f64 / points as f64 * n as f64).ceil() as usize).clamp(1, n) - 1]).collect()
}

/// Each of `replicas` replicas' in-flight requests at [`TIMELINE_SAMPLES`] evenly spaced times
/// from 0 to the last event, from every request's (replica, dispatched at, finished at — NaN when
/// it did not finish) span.
pub fn in_flight_timeline(replicas: usize, spans: &[(u32, f64, f64)]) -> (Vec<f64>, Vec<Vec<u32>>) {
    let mut events: Vec<(f64, u32, i32)> = Vec::with_capacity(spans.len() * 2);
    for &(r, start, end) in spans {
        events.push((start, r, 1));
        if end.is_finite() {
            events.push((end, r, -1));
        }
    }
    // At a tie a departure counts before an arrival, as the simulators order them.
    events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.2.cmp(&b.2)));
    let Some(last) = events.last().map(|e| e.0) else { return (Vec::new(), Vec::new()) };
    let mut now = vec![0i64; replicas];
    let (mut times, mut counts) = (Vec::new(), Vec::new());
    let mut next = 0;
    for k in 0..=TIMELINE_SAMPLES {
        let t = last * k as f64 / TIMELINE_SAMPLES as f64;
        while next < events.len() && events[next].0 <= t {
            let (_, r, d) = events[next];
            if let Some(c) = now.get_mut(r as usize) {
                *c += d as i64;
            }
            next += 1;
        }
        times.push(t);
        counts.push(now.iter().map(|&c| c.max(0) as u32).collect());
    }
    (times, counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every listed key has a row in docs/output.md (the capacity command's error lists them).
    #[test]
    fn every_listed_key_is_documented() {
        let doc = include_str!("../../docs/output.md");
        for key in CLUSTER_KEYS.iter().chain(SLO_KEYS).chain(DISPATCH_KEYS) {
            assert!(doc.contains(&format!("`{key}`")), "docs/output.md does not document `{key}`");
        }
    }

    #[test]
    fn quantiles_by_nearest_rank() {
        let mut xs: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&mut xs, 0.5), 50.0);
        assert_eq!(quantile(&mut xs, 0.99), 99.0);
        assert_eq!(quantile(&mut xs, 1.0), 100.0);
        assert_eq!(quantile(&mut xs, 0.0), 1.0);
    }

    #[test]
    fn ci_of_identical_runs_is_zero_and_grows_with_spread() {
        assert_eq!(mean_ci95(&[2.0, 2.0, 2.0]), (2.0, 0.0));
        let (m, h) = mean_ci95(&[1.0, 3.0]);
        assert_eq!(m, 2.0);
        assert!((h - 12.706).abs() < 1e-9, "{h}");
    }

    #[test]
    fn over_seeds_adds_intervals_only_for_several() {
        let mut a = Metrics::new();
        a.push("x", 1.0);
        let mut b = Metrics::new();
        b.push("x", 3.0);
        let s = over_seeds(&[a.clone(), b]);
        assert_eq!(s.get("x"), Some(2.0));
        assert!(s.get("x_ci95").unwrap() > 0.0);
        assert_eq!(over_seeds(&[a]).get("x_ci95"), None);
    }
    #[test]
    fn quantile_vector_spans_min_to_max() {
        let mut xs: Vec<f64> = (1..=1000).rev().map(f64::from).collect();
        let q = quantile_vector(&mut xs, 10);
        assert_eq!(q.len(), 11);
        assert_eq!((q[0], q[5], q[10]), (1.0, 500.0, 1000.0));
        assert!(quantile_vector(&mut [], 10).is_empty());
    }

    #[test]
    fn timeline_counts_requests_between_dispatch_and_finish() {
        // Replica 0 holds one request from 0 to 10; replica 1 one from 5 that never finishes.
        let (t, c) = in_flight_timeline(2, &[(0, 0.0, 10.0), (1, 5.0, f64::NAN)]);
        assert_eq!(t.len(), TIMELINE_SAMPLES + 1);
        let at = |x: f64| &c[t.iter().position(|&s| s >= x).unwrap()];
        assert_eq!(at(1.0), &vec![1, 0]);
        assert_eq!(at(6.0), &vec![1, 1]);
        assert_eq!(c.last().unwrap(), &vec![0, 1]);
    }
}
