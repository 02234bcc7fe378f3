//! What a cluster run measured: per-request records and their summary (the keys are documented
//! in the module above).

use std::borrow::Cow;

use super::End;
use super::kv_tier::KvTier;
use super::replica::{Replica, RequestState};
use crate::metrics::Metrics;
use crate::sketch::Dist;
use crate::workload::cluster::classes::{ClassSpec, TenantSpec};
use crate::workload::slo::Slo;

/// One request's measured life (times in seconds; NaN where it did not get that far).
#[derive(Clone, Debug, PartialEq)]
pub struct RequestRecord {
    pub replica: u32,
    pub arrived_at_s: f64,
    /// When its replica's engine took it in (vLLM's `queued_ts`, `async_sched.rs`): its
    /// arrival, or the end of the step in flight then; NaN if never routed.
    pub queued_at_s: f64,
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
    /// The request's model (its index in `cluster.models`; 0 with one model).
    pub model: u16,
    /// Whether admission control (or a P/D router) turned it away.
    pub end: super::End,
    /// When it was handed to the router: its arrival, or its release from an admission queue.
    pub dispatched_at_s: f64,
}

/// Metrics plus per-request records (for exercises and plots).
#[derive(Clone, Debug, PartialEq)]
pub struct RunOutcome {
    pub metrics: Metrics,
    /// Every request's record when the run kept them (`cluster.summary`: exact); else empty.
    pub records: Vec<RequestRecord>,
    /// A sketched run's latency CDF (no in-flight timeline: that needs the records); `None` when
    /// the records were kept.
    pub detail: Option<crate::metrics::Detail>,
}

/// Time-sampled replication factor: Σ cached tokens ÷ tokens of the union, averaged.
#[derive(Default)]
pub(super) struct Replication {
    union: crate::seeds::MixMap<u64, u32>,
    sum: f64,
    samples: u32,
}

impl Replication {
    pub(super) fn sample(&mut self, replicas: &[Replica]) {
        self.union.clear();
        let mut cached = 0u64;
        for rep in replicas {
            for (path, tokens) in rep.cache().contents() {
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

/// Whether `r` met `slo` (an unfinished, rejected or shed request does not).
pub(super) fn met(r: &RequestRecord, slo: &Slo) -> bool {
    let tpot = if r.output_tokens > 1 {
        (r.completed_at_s - r.first_token_at_s) / (r.output_tokens - 1) as f64
    } else {
        f64::NAN
    };
    slo.met(r.first_token_at_s - r.arrived_at_s, tpot, r.completed_at_s - r.arrived_at_s)
}

/// One class's figures (see [`Tally::push_groups`]).
struct ClassTally {
    requests: usize,
    met: usize,
    rejected: usize,
    shed: usize,
    ttft: Dist,
    /// Served requests handed to the router, and their waits from arrival (admission queues).
    routed: usize,
    routed_wait_s: f64,
}

/// One tenant's figures (see [`Tally::push_groups`]).
struct TenantTally {
    requests: usize,
    met: usize,
    /// Prompt + output tokens of its finished requests.
    served: f64,
}

/// Everything a cluster run's summary reads from its requests, added one record at a time in
/// request order: so that a long run need not keep its records. Its distributions are exact
/// (every value kept: nearest-rank percentiles as ever) or sketched ([`crate::sketch`]: memory
/// bounded, within its stated error); every other figure is a count or a sum, the same either way.
pub(super) struct Tally<'a> {
    classes: Cow<'a, [ClassSpec]>,
    tenants: Cow<'a, [TenantSpec]>,
    slo: Option<Cow<'a, Slo>>,
    /// Served requests (neither rejected nor shed): the cluster's own figures.
    total: usize,
    done: usize,
    first: Option<f64>,
    last_done: f64,
    cached: u64,
    prompt: u64,
    /// Output tokens of the finished served requests.
    output: u64,
    latency: Dist,
    ttft: Dist,
    tpot: Dist,
    low_hit: Dist,
    /// Every request, turned away or not: SLO, class, tenant and admission figures.
    all: usize,
    first_arrival: f64,
    last_arrival: f64,
    met: usize,
    per_class: Vec<ClassTally>,
    per_tenant: Vec<TenantTally>,
    rejected: usize,
    shed: usize,
    routed: usize,
    routed_wait_s: f64,
}

impl<'a> Tally<'a> {
    /// Each request held to its class's SLO, else `slo`, else only to finishing; `exact` keeps
    /// every value of the distributions.
    pub(super) fn new(
        exact: bool,
        classes: impl Into<Cow<'a, [ClassSpec]>>,
        tenants: impl Into<Cow<'a, [TenantSpec]>>,
        slo: Option<Cow<'a, Slo>>,
    ) -> Self {
        let (classes, tenants): (Cow<_>, Cow<_>) = (classes.into(), tenants.into());
        let (n_classes, n_tenants) = (classes.len(), tenants.len());
        let class = || ClassTally {
            requests: 0,
            met: 0,
            rejected: 0,
            shed: 0,
            ttft: Dist::new(exact),
            routed: 0,
            routed_wait_s: 0.0,
        };
        let tenant = || TenantTally { requests: 0, met: 0, served: 0.0 };
        Self {
            classes,
            tenants,
            slo,
            total: 0,
            done: 0,
            first: None,
            last_done: f64::NAN,
            cached: 0,
            prompt: 0,
            output: 0,
            latency: Dist::new(exact),
            ttft: Dist::new(exact),
            tpot: Dist::new(exact),
            low_hit: Dist::new(exact),
            all: 0,
            first_arrival: f64::INFINITY,
            last_arrival: f64::NEG_INFINITY,
            met: 0,
            per_class: (0..n_classes.max(1)).map(|_| class()).collect(),
            per_tenant: (0..n_tenants.max(1)).map(|_| tenant()).collect(),
            rejected: 0,
            shed: 0,
            routed: 0,
            routed_wait_s: 0.0,
        }
    }

    /// Adds the next request's record (in request order).
    pub(super) fn add(&mut self, r: &RequestRecord) {
        let finished = r.completed_at_s.is_finite();
        if r.end == End::Served {
            self.total += 1;
            self.first.get_or_insert(r.arrived_at_s);
            if r.admitted_at_s.is_finite() {
                self.cached += r.cached_tokens as u64;
                self.prompt += r.prompt_tokens as u64;
            }
            if finished {
                self.done += 1;
                self.output += r.output_tokens as u64;
                self.last_done = self.last_done.max(r.completed_at_s);
                let latency = r.completed_at_s - r.arrived_at_s;
                self.latency.push(latency);
                self.ttft.push(r.first_token_at_s - r.arrived_at_s);
                if r.output_tokens > 1 {
                    self.tpot.push((r.completed_at_s - r.first_token_at_s) / (r.output_tokens - 1) as f64);
                }
                if (r.cached_tokens as f64) < LOW_HIT * r.prompt_tokens as f64 {
                    self.low_hit.push(latency);
                }
            }
            if r.dispatched_at_s.is_finite() {
                self.routed += 1;
                self.routed_wait_s += r.dispatched_at_s - r.arrived_at_s;
                if let Some(c) = self.per_class.get_mut(r.class as usize) {
                    c.routed += 1;
                    c.routed_wait_s += r.dispatched_at_s - r.arrived_at_s;
                }
            }
        }
        self.all += 1;
        self.first_arrival = self.first_arrival.min(r.arrived_at_s);
        self.last_arrival = self.last_arrival.max(r.arrived_at_s);
        let none = Slo::default();
        let slo =
            self.classes.get(r.class as usize).and_then(|c| c.slo.as_ref()).or(self.slo.as_deref()).unwrap_or(&none);
        let ok = met(r, slo);
        self.met += ok as usize;
        if let Some(c) = self.per_class.get_mut(r.class as usize) {
            c.requests += 1;
            c.met += ok as usize;
            c.rejected += (r.end == End::Rejected) as usize;
            c.shed += (r.end == End::Shed) as usize;
            if finished {
                c.ttft.push(r.first_token_at_s - r.arrived_at_s);
            }
        }
        if let Some(t) = self.per_tenant.get_mut(r.tenant as usize) {
            t.requests += 1;
            t.met += ok as usize;
            if finished {
                t.served += r.prompt_tokens as f64 + r.output_tokens as f64;
            }
        }
        self.rejected += (r.end == End::Rejected) as usize;
        self.shed += (r.end == End::Shed) as usize;
    }

    /// The cluster's figures over the served requests (keys in the module docs).
    pub(super) fn summary(
        &mut self,
        replicas: &[Replica],
        waiting_at_half: u64,
        waiting_at_end: u64,
        replication_factor: f64,
    ) -> Metrics {
        let (total, done) = (self.total, self.done);
        let first = self.first.unwrap_or(0.0);
        let unfinished = total - done;
        let second_half = (total - total / 2).max(1) as f64;
        let growing = waiting_at_end as f64 - waiting_at_half as f64 > 0.05 * second_half;
        let busiest = replicas.iter().map(|r| r.dispatched()).max().unwrap_or(0);
        let mut m = Metrics::new();
        m.push("requests", total as f64);
        m.push("completed", done as f64);
        m.push("unfinished", unfinished as f64);
        m.push("overloaded", (unfinished > 0 || growing) as u8 as f64);
        // Each mean before its percentiles: exact percentiles reorder the values.
        m.push("latency_mean_s", self.latency.mean());
        m.push("latency_p50_s", self.latency.quantile(0.50));
        m.push("latency_p90_s", self.latency.quantile(0.90));
        m.push("latency_p99_s", self.latency.quantile(0.99));
        // The cold requests' tail: what a cache-favouring local scheduler could starve.
        m.push("latency_p99_low_hit_s", self.low_hit.quantile(0.99));
        m.push("ttft_mean_s", self.ttft.mean());
        m.push("ttft_p50_s", self.ttft.quantile(0.50));
        m.push("ttft_p90_s", self.ttft.quantile(0.90));
        m.push("ttft_p99_s", self.ttft.quantile(0.99));
        m.push("tpot_mean_s", self.tpot.mean());
        m.push("tpot_p50_s", self.tpot.quantile(0.50));
        m.push("tpot_p90_s", self.tpot.quantile(0.90));
        m.push("tpot_p99_s", self.tpot.quantile(0.99));
        let last_done = self.last_done;
        let makespan = if last_done > first { last_done - first } else { f64::NAN };
        m.push("throughput_rps", done as f64 / makespan);
        // Output tokens over the same makespan: inference-perf's `output_tokens_per_sec`.
        let tokens_per_s = self.output as f64 / makespan;
        m.push("output_tokens_per_s", tokens_per_s);
        m.push("output_tokens_per_s_per_replica", tokens_per_s / replicas.len().max(1) as f64);
        m.push("hit_rate", if self.prompt > 0 { self.cached as f64 / self.prompt as f64 } else { 0.0 });
        m.push("replication_factor", replication_factor);
        m.push("busiest_replica_share", if total > 0 { busiest as f64 / total as f64 } else { f64::NAN });
        m.push("preemptions", replicas.iter().map(|r| r.preemptions()).sum::<u64>() as f64);
        m
    }

    /// Requests that met their SLO per second between the first and the last arrival.
    fn rate(&self, n: usize) -> f64 {
        let span = self.last_arrival - self.first_arrival;
        if span > 0.0 { n as f64 / span } else { f64::NAN }
    }

    /// `slo_attainment` (fraction of all requests, unfinished and turned-away ones included,
    /// that met their SLO) and `goodput_rps` (requests that met it per second between the first
    /// and the last arrival; NaN for a single request).
    pub(super) fn push_slo(&self, m: &mut Metrics) {
        m.push("slo_attainment", share(self.met, self.all));
        m.push("goodput_rps", self.rate(self.met));
    }

    /// The per-class and per-tenant figures of a workload with `classes:` or `tenants:`, after
    /// [`Tally::push_slo`]'s: per class `class.<name>.requests`, `.slo_attainment`,
    /// `.goodput_rps`, `.rejected`, `.shed`, `.ttft_p99_s` (finished requests); per tenant
    /// `tenant.<name>.requests`, `.slo_attainment`, `.goodput_rps`; and over tenants
    /// `tenant_attainment_min` (the worst tenant's attainment) and `tenant_fairness_jain`: Jain's
    /// index (Σx)² / (n Σx²) of the tenants' normalised service x = tokens (prompt + output) of
    /// their finished requests ÷ their weight (1: perfectly fair; 1/n: one tenant got everything).
    /// Goodput divides by the whole run's arrival span, so the classes' goodputs add up.
    pub(super) fn push_groups(&mut self, m: &mut Metrics) {
        self.push_slo(m);
        let names: Vec<&str> = if self.classes.is_empty() {
            vec!["default"]
        } else {
            self.classes.iter().map(|c| c.name.as_str()).collect()
        };
        let mut per_class = std::mem::take(&mut self.per_class);
        for (name, c) in names.iter().zip(&mut per_class) {
            m.push(format!("class.{name}.requests"), c.requests as f64);
            m.push(format!("class.{name}.slo_attainment"), share(c.met, c.requests));
            m.push(format!("class.{name}.goodput_rps"), self.rate(c.met));
            m.push(format!("class.{name}.rejected"), c.rejected as f64);
            m.push(format!("class.{name}.shed"), c.shed as f64);
            m.push(format!("class.{name}.ttft_p99_s"), c.ttft.quantile(0.99));
        }
        self.per_class = per_class;
        let tenant_list: Vec<(&str, f64)> = if self.tenants.is_empty() {
            vec![("default", 1.0)]
        } else {
            self.tenants.iter().map(|t| (t.name.as_str(), t.weight)).collect()
        };
        let (mut worst, mut sum, mut sum_sq) = (f64::INFINITY, 0.0, 0.0);
        for ((name, weight), t) in tenant_list.iter().zip(&self.per_tenant) {
            let attainment = share(t.met, t.requests);
            if attainment.is_finite() {
                worst = worst.min(attainment);
            }
            let x = t.served / weight;
            sum += x;
            sum_sq += x * x;
            m.push(format!("tenant.{name}.requests"), t.requests as f64);
            m.push(format!("tenant.{name}.slo_attainment"), attainment);
            m.push(format!("tenant.{name}.goodput_rps"), self.rate(t.met));
        }
        let n = tenant_list.len() as f64;
        m.push("tenant_attainment_min", if worst.is_finite() { worst } else { f64::NAN });
        m.push("tenant_fairness_jain", if sum_sq > 0.0 { sum * sum / (n * sum_sq) } else { f64::NAN });
    }

    /// What admission control did: `rejected_requests`, `shed_requests`, `held_requests` (held
    /// on arrival, later released or shed) and `admission_wait_mean_s` (arrival → handed to the
    /// router, over the requests routed); with `classes:` or `tenants:` ([`Tally::push_groups`]'s
    /// groups), then per class `class.<name>.admission_wait_mean_s` (the same over the class's
    /// requests routed).
    pub(super) fn push_admission(&self, m: &mut Metrics, held: u64) {
        let mean = |wait_s: f64, n: usize| if n == 0 { f64::NAN } else { wait_s / n as f64 };
        m.push("rejected_requests", self.rejected as f64);
        m.push("shed_requests", self.shed as f64);
        m.push("held_requests", held as f64);
        m.push("admission_wait_mean_s", mean(self.routed_wait_s, self.routed));
        if self.classes.is_empty() && self.tenants.is_empty() {
            return;
        }
        let names = self.classes.iter().map(|c| c.name.as_str());
        let names: Vec<&str> = if self.classes.is_empty() { vec!["default"] } else { names.collect() };
        for (name, c) in names.iter().zip(&self.per_class) {
            m.push(format!("class.{name}.admission_wait_mean_s"), mean(c.routed_wait_s, c.routed));
        }
    }

    /// The finished requests' latencies at the quantiles 0, 1/N, …, 1 and their share of all
    /// requests: a chart's CDF (exact values are sorted).
    pub(super) fn latency_cdf(&mut self, points: usize) -> (Vec<f64>, f64) {
        (self.latency.quantile_vector(points), self.done as f64 / self.all.max(1) as f64)
    }
}

/// `a` of `n` (NaN for none).
fn share(a: usize, n: usize) -> f64 {
    if n == 0 { f64::NAN } else { a as f64 / n as f64 }
}

/// `slo_attainment` and `goodput_rps` of `records` held to `slo` ([`Tally::push_slo`]).
pub fn push_slo_metrics(m: &mut Metrics, records: &[RequestRecord], slo: &Slo) {
    let mut t = Tally::new(true, &[][..], &[][..], Some(Cow::Borrowed(slo)));
    records.iter().for_each(|r| t.add(r));
    t.push_slo(m);
}

/// The KV tier metrics (`tiers.rs`) over the admitted requests: `prompt_tokens[i]` and
/// `states[i]` are request `i`'s (read from the run's state, so exact and sketched summaries agree).
pub(super) fn push_tier_metrics<'a>(
    m: &mut Metrics,
    prompt_tokens: impl Iterator<Item = u32>,
    states: impl Iterator<Item = &'a RequestState>,
    replicas: &[Replica],
    remote: Option<&KvTier>,
) {
    let (mut prompt, mut gpu, mut loaded) = (0u64, 0u64, [0u64; 2]);
    for (p, st) in prompt_tokens.zip(states).filter(|(_, st)| st.admitted_at.is_some()) {
        prompt += p as u64;
        gpu += st.cached_tokens as u64;
        loaded[0] += st.tier_loaded[0] as u64;
        loaded[1] += st.tier_loaded[1] as u64;
    }
    let share = |x: u64| if prompt > 0 { x as f64 / prompt as f64 } else { 0.0 };
    let tiers = || replicas.iter().filter_map(|r| r.tiers());
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
            queued_at_s: arrived,
            admitted_at_s: arrived,
            first_token_at_s: first_token,
            completed_at_s: completed,
            prompt_tokens: 100,
            cached_tokens: 0,
            output_tokens,
            preemptions: 0,
            class: 0,
            model: 0,
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
