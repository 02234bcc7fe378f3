//! What a cluster run measured: per-request records and their summary (the keys are documented
//! in the module above).

use std::collections::HashMap;

use super::End;
use super::kv_tier::KvTier;
use super::replica::{Replica, RequestState};
use crate::metrics::{Metrics, quantile};
use crate::workload::cluster::classes::{ClassSpec, TenantSpec};
use crate::workload::slo::Slo;

/// One request's measured life (times in seconds; NaN where it did not get that far).
#[derive(Clone, Debug, PartialEq)]
pub struct RequestRecord {
    pub replica: u32,
    pub arrived_at_s: f64,
    pub admitted_at_s: f64,
    pub first_token_at_s: f64,
    pub completed_at_s: f64,
    pub prompt_tokens: u32,
    pub cached_tokens: u32,
    pub output_tokens: u32,
    pub preemptions: u32,
    /// The request's class and tenant (indices into `cluster.classes` / `cluster.tenants`).
    pub class: u16,
    pub tenant: u32,
    /// Whether admission control (or a P/D router) turned it away.
    pub end: super::End,
    /// When it was handed to the router: its arrival, or its release from an admission queue.
    pub dispatched_at_s: f64,
}

/// Metrics plus per-request records (for exercises and plots).
#[derive(Clone, Debug, PartialEq)]
pub struct RunOutcome {
    pub metrics: Metrics,
    pub records: Vec<RequestRecord>,
}

/// Time-sampled replication factor: Σ cached tokens ÷ tokens of the union, averaged.
#[derive(Default)]
pub(super) struct Replication {
    union: HashMap<u64, u32>,
    sum: f64,
    samples: u32,
}

impl Replication {
    pub(super) fn sample(&mut self, replicas: &[Replica]) {
        self.union.clear();
        let mut cached = 0u64;
        for rep in replicas {
            for (path, tokens) in rep.cache.contents() {
                cached += tokens as u64;
                let u = self.union.entry(path).or_default();
                *u = (*u).max(tokens);
            }
        }
        let union: u64 = self.union.values().map(|&t| t as u64).sum();
        if union > 0 {
            self.sum += cached as f64 / union as f64;
            self.samples += 1;
        }
    }

    pub(super) fn factor(&self) -> f64 {
        if self.samples == 0 { 1.0 } else { self.sum / self.samples as f64 }
    }
}

/// Requests with less than this fraction of their prompt cached at admission are "low-hit".
const LOW_HIT: f64 = 0.5;

pub(super) fn summarize(
    records: &[RequestRecord],
    replicas: &[Replica],
    waiting_at_half: u64,
    waiting_at_end: u64,
    replication_factor: f64,
) -> Metrics {
    let total = records.len();
    let done: Vec<&RequestRecord> = records.iter().filter(|r| r.completed_at_s.is_finite()).collect();
    let mut latency: Vec<f64> = done.iter().map(|r| r.completed_at_s - r.arrived_at_s).collect();
    let mut ttft: Vec<f64> = done.iter().map(|r| r.first_token_at_s - r.arrived_at_s).collect();
    let mut tpot: Vec<f64> = done
        .iter()
        .filter(|r| r.output_tokens > 1)
        .map(|r| (r.completed_at_s - r.first_token_at_s) / (r.output_tokens - 1) as f64)
        .collect();
    let mean = |xs: &[f64]| if xs.is_empty() { f64::NAN } else { xs.iter().sum::<f64>() / xs.len() as f64 };
    let admitted = records.iter().filter(|r| r.admitted_at_s.is_finite());
    let (cached, prompt) =
        admitted.fold((0u64, 0u64), |(c, p), r| (c + r.cached_tokens as u64, p + r.prompt_tokens as u64));
    let first = records.first().map_or(0.0, |r| r.arrived_at_s);
    let last_done = done.iter().map(|r| r.completed_at_s).fold(f64::NAN, f64::max);
    let unfinished = total - done.len();
    let second_half = (total - total / 2).max(1) as f64;
    let growing = waiting_at_end as f64 - waiting_at_half as f64 > 0.05 * second_half;
    let busiest = replicas.iter().map(|r| r.dispatched).max().unwrap_or(0);
    let mut m = Metrics::new();
    m.push("requests", total as f64);
    m.push("completed", done.len() as f64);
    m.push("unfinished", unfinished as f64);
    m.push("overloaded", (unfinished > 0 || growing) as u8 as f64);
    m.push("latency_mean_s", mean(&latency));
    m.push("latency_p50_s", quantile(&mut latency, 0.50));
    m.push("latency_p90_s", quantile(&mut latency, 0.90));
    m.push("latency_p99_s", quantile(&mut latency, 0.99));
    // The cold requests' tail: what a cache-favouring local scheduler could starve.
    let mut low_hit: Vec<f64> = done
        .iter()
        .filter(|r| (r.cached_tokens as f64) < LOW_HIT * r.prompt_tokens as f64)
        .map(|r| r.completed_at_s - r.arrived_at_s)
        .collect();
    m.push("latency_p99_low_hit_s", quantile(&mut low_hit, 0.99));
    m.push("ttft_mean_s", mean(&ttft));
    m.push("ttft_p50_s", quantile(&mut ttft, 0.50));
    m.push("ttft_p90_s", quantile(&mut ttft, 0.90));
    m.push("ttft_p99_s", quantile(&mut ttft, 0.99));
    m.push("tpot_mean_s", mean(&tpot));
    m.push("tpot_p50_s", quantile(&mut tpot, 0.50));
    m.push("tpot_p90_s", quantile(&mut tpot, 0.90));
    m.push("tpot_p99_s", quantile(&mut tpot, 0.99));
    m.push("throughput_rps", if last_done > first { done.len() as f64 / (last_done - first) } else { f64::NAN });
    m.push("hit_rate", if prompt > 0 { cached as f64 / prompt as f64 } else { 0.0 });
    m.push("replication_factor", replication_factor);
    m.push("busiest_replica_share", if total > 0 { busiest as f64 / total as f64 } else { f64::NAN });
    m.push("preemptions", replicas.iter().map(|r| r.preemptions).sum::<u64>() as f64);
    m
}

/// `slo_attainment` (fraction of all requests, unfinished ones included, that met `slo`) and
/// `goodput_rps` (requests that met it per second between the first and the last arrival; NaN
/// for a single request). Works from the records alone, so every world that writes them can call it.
pub fn push_slo_metrics(m: &mut Metrics, records: &[RequestRecord], slo: &Slo) {
    let met = records
        .iter()
        .filter(|r| {
            let tpot = if r.output_tokens > 1 {
                (r.completed_at_s - r.first_token_at_s) / (r.output_tokens - 1) as f64
            } else {
                f64::NAN
            };
            slo.met(r.first_token_at_s - r.arrived_at_s, tpot, r.completed_at_s - r.arrived_at_s)
        })
        .count();
    let (first, last) = records
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), r| (a.min(r.arrived_at_s), b.max(r.arrived_at_s)));
    let span = last - first;
    m.push("slo_attainment", if records.is_empty() { f64::NAN } else { met as f64 / records.len() as f64 });
    m.push("goodput_rps", if span > 0.0 { met as f64 / span } else { f64::NAN });
}

/// Whether `r` met `slo` (an unfinished, rejected or shed request does not).
fn met(r: &RequestRecord, slo: &Slo) -> bool {
    let tpot = if r.output_tokens > 1 {
        (r.completed_at_s - r.first_token_at_s) / (r.output_tokens - 1) as f64
    } else {
        f64::NAN
    };
    slo.met(r.first_token_at_s - r.arrived_at_s, tpot, r.completed_at_s - r.arrived_at_s)
}

/// The per-class and per-tenant figures of a workload with `classes:` or `tenants:` (each
/// request held to its class's SLO, else the cluster's `slo`, else only to finishing):
/// `slo_attainment` and `goodput_rps` over every request; per class `class.<name>.requests`,
/// `.slo_attainment`, `.goodput_rps`, `.rejected`, `.shed`, `.ttft_p99_s` (finished requests);
/// per tenant `tenant.<name>.requests`, `.slo_attainment`, `.goodput_rps`; and over tenants
/// `tenant_attainment_min` (the worst tenant's attainment) and `tenant_fairness_jain`: Jain's
/// index (Σx)² / (n Σx²) of the tenants' normalised service x = tokens (prompt + output) of
/// their finished requests ÷ their weight (1: perfectly fair; 1/n: one tenant got everything).
/// Goodput divides by the whole run's arrival span, so the classes' goodputs add up.
pub fn push_class_metrics(
    m: &mut Metrics,
    records: &[RequestRecord],
    classes: &[ClassSpec],
    tenants: &[TenantSpec],
    slo: Option<&Slo>,
) {
    let none = Slo::default();
    let slo_of =
        |r: &RequestRecord| classes.get(r.class as usize).and_then(|c| c.slo.as_ref()).or(slo).unwrap_or(&none);
    let (first, last) = records
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), r| (a.min(r.arrived_at_s), b.max(r.arrived_at_s)));
    let span = last - first;
    let rate = |n: usize| if span > 0.0 { n as f64 / span } else { f64::NAN };
    let share = |a: usize, n: usize| if n == 0 { f64::NAN } else { a as f64 / n as f64 };
    let total_met = records.iter().filter(|r| met(r, slo_of(r))).count();
    m.push("slo_attainment", share(total_met, records.len()));
    m.push("goodput_rps", rate(total_met));
    let names: Vec<&str> =
        if classes.is_empty() { vec!["default"] } else { classes.iter().map(|c| c.name.as_str()).collect() };
    for (k, name) in names.iter().enumerate() {
        let mine: Vec<&RequestRecord> = records.iter().filter(|r| r.class as usize == k).collect();
        let ok = mine.iter().filter(|r| met(r, slo_of(r))).count();
        let mut ttft: Vec<f64> =
            mine.iter().filter(|r| r.completed_at_s.is_finite()).map(|r| r.first_token_at_s - r.arrived_at_s).collect();
        m.push(format!("class.{name}.requests"), mine.len() as f64);
        m.push(format!("class.{name}.slo_attainment"), share(ok, mine.len()));
        m.push(format!("class.{name}.goodput_rps"), rate(ok));
        m.push(format!("class.{name}.rejected"), mine.iter().filter(|r| r.end == End::Rejected).count() as f64);
        m.push(format!("class.{name}.shed"), mine.iter().filter(|r| r.end == End::Shed).count() as f64);
        m.push(format!("class.{name}.ttft_p99_s"), if ttft.is_empty() { f64::NAN } else { quantile(&mut ttft, 0.99) });
    }
    let tenant_list: Vec<(&str, f64)> = if tenants.is_empty() {
        vec![("default", 1.0)]
    } else {
        tenants.iter().map(|t| (t.name.as_str(), t.weight)).collect()
    };
    let (mut worst, mut sum, mut sum_sq) = (f64::INFINITY, 0.0, 0.0);
    for (k, (name, weight)) in tenant_list.iter().enumerate() {
        let mine: Vec<&RequestRecord> = records.iter().filter(|r| r.tenant as usize == k).collect();
        let ok = mine.iter().filter(|r| met(r, slo_of(r))).count();
        let attainment = share(ok, mine.len());
        if attainment.is_finite() {
            worst = worst.min(attainment);
        }
        let served: f64 = mine
            .iter()
            .filter(|r| r.completed_at_s.is_finite())
            .map(|r| r.prompt_tokens as f64 + r.output_tokens as f64)
            .sum();
        let x = served / weight;
        sum += x;
        sum_sq += x * x;
        m.push(format!("tenant.{name}.requests"), mine.len() as f64);
        m.push(format!("tenant.{name}.slo_attainment"), attainment);
        m.push(format!("tenant.{name}.goodput_rps"), rate(ok));
    }
    let n = tenant_list.len() as f64;
    m.push("tenant_attainment_min", if worst.is_finite() { worst } else { f64::NAN });
    m.push("tenant_fairness_jain", if sum_sq > 0.0 { sum * sum / (n * sum_sq) } else { f64::NAN });
}

/// What admission control did: `rejected_requests`, `shed_requests`, `held_requests` (held on
/// arrival, later released or shed) and `admission_wait_mean_s` (arrival → handed to the router,
/// over the requests routed).
pub fn push_admission_metrics(m: &mut Metrics, records: &[RequestRecord], held: u64) {
    let count = |e: End| records.iter().filter(|r| r.end == e).count() as f64;
    m.push("rejected_requests", count(End::Rejected));
    m.push("shed_requests", count(End::Shed));
    m.push("held_requests", held as f64);
    let routed: Vec<f64> = records
        .iter()
        .filter(|r| r.end == End::Served && r.dispatched_at_s.is_finite())
        .map(|r| r.dispatched_at_s - r.arrived_at_s)
        .collect();
    m.push(
        "admission_wait_mean_s",
        if routed.is_empty() { f64::NAN } else { routed.iter().sum::<f64>() / routed.len() as f64 },
    );
}

/// The KV tier metrics (`tiers.rs`) of a run over `records` (by request id, as `states`).
pub(super) fn push_tier_metrics(
    m: &mut Metrics,
    records: &[RequestRecord],
    states: &[RequestState],
    replicas: &[Replica],
    remote: Option<&KvTier>,
) {
    let (mut prompt, mut gpu, mut loaded) = (0u64, 0u64, [0u64; 2]);
    for (r, st) in records.iter().zip(states).filter(|(r, _)| r.admitted_at_s.is_finite()) {
        prompt += r.prompt_tokens as u64;
        gpu += r.cached_tokens as u64;
        loaded[0] += st.tier_loaded[0] as u64;
        loaded[1] += st.tier_loaded[1] as u64;
    }
    let share = |x: u64| if prompt > 0 { x as f64 / prompt as f64 } else { 0.0 };
    let tiers = || replicas.iter().filter_map(|r| r.tiers.as_deref());
    let names: &[&str] = if remote.is_some() { &["cpu", "remote"] } else { &["cpu"] };
    for (k, name) in names.iter().enumerate() {
        m.push(format!("tier.{name}.hit_rate"), share(loaded[k]));
        m.push(format!("tier.{name}.tokens_loaded"), tiers().map(|t| t.loaded_tokens[k]).sum::<u64>() as f64);
        m.push(format!("tier.{name}.load_time_s"), tiers().map(|t| t.load_s[k]).sum::<f64>());
        let offloaded = match k {
            0 => tiers().map(|t| t.cpu.offloaded_tokens).sum::<u64>(),
            _ => remote.map_or(0, |r| r.offloaded_tokens),
        };
        m.push(format!("tier.{name}.offloaded_tokens"), offloaded as f64);
    }
    m.push("tier.hit_rate_all", share(gpu + loaded[0] + loaded[1]));
    m.push("tier.load_stall_s", tiers().map(|t| t.stall_s).sum::<f64>());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(arrived: f64, first_token: f64, completed: f64, output_tokens: u32) -> RequestRecord {
        RequestRecord {
            replica: 0,
            arrived_at_s: arrived,
            admitted_at_s: arrived,
            first_token_at_s: first_token,
            completed_at_s: completed,
            prompt_tokens: 100,
            cached_tokens: 0,
            output_tokens,
            preemptions: 0,
            class: 0,
            tenant: 0,
            end: End::Served,
            dispatched_at_s: arrived,
        }
    }

    /// Five requests arriving over 8 s, checked by hand against TTFT ≤ 1 s and TPOT ≤ 0.125 s
    /// (times exact in binary, so the inclusive bounds are tested exactly).
    #[test]
    fn attainment_and_goodput_by_hand() {
        let records = [
            record(0.0, 0.5, 1.625, 10),   // TTFT 0.5, TPOT 1.125/9 = 0.125: meets (bounds inclusive)
            record(2.0, 3.5, 3.6, 2),      // TTFT 1.5: misses
            record(4.0, 4.25, 6.75, 11),   // TPOT 2.5/10 = 0.25: misses
            record(6.0, 6.9, 6.9, 1),      // one token, no TPOT: meets
            record(8.0, 8.1, f64::NAN, 5), // unfinished: misses
        ];
        let slo = Slo { ttft_s: Some(1.0), tpot_s: Some(0.125), latency_s: None };
        let mut m = Metrics::new();
        push_slo_metrics(&mut m, &records, &slo);
        assert_eq!(m.get("slo_attainment"), Some(2.0 / 5.0));
        assert_eq!(m.get("goodput_rps"), Some(2.0 / 8.0), "2 met over an arrival span of 8 s");
        // A latency bound alone: latencies 1.625, 1.6, 2.75, 0.9 and unfinished; ≤ 1.5 s → 1 of 5.
        let mut m = Metrics::new();
        push_slo_metrics(&mut m, &records, &Slo { latency_s: Some(1.5), ..Slo::default() });
        assert_eq!(m.get("slo_attainment"), Some(0.2));
        assert_eq!(m.get("goodput_rps"), Some(1.0 / 8.0));
        // Every bound generous: all but the unfinished request.
        let mut m = Metrics::new();
        push_slo_metrics(&mut m, &records, &Slo { ttft_s: Some(10.0), tpot_s: Some(1.0), latency_s: Some(10.0) });
        assert_eq!(m.get("slo_attainment"), Some(0.8));
        assert_eq!(m.get("goodput_rps"), Some(0.5));
    }
}
