//! The dispatch world: N first-come-first-served servers behind a router.
//!
//! Time is in units of the mean service time, held as integer ticks (10^9 per unit) in the event
//! queue. Arrivals and service times come from streams seeded by the run seed alone (common random
//! numbers: every router sees the same jobs). Each job's departure is known at dispatch (FCFS:
//! `max(arrival, server free) + size`) and is queued as an event; before every arrival all events
//! up to its time run in (time, insertion) order, so the router sees exact queue lengths and
//! `on_complete` arrives in time order.
//!
//! Information: `fresh` shows true state at each arrival; `stale` shows a snapshot taken at the last
//! multiple of the refresh interval (Mitzenmacher's bulletin board); the router's own state (via
//! `on_dispatch`) stays current. Balls-into-bins: no departures; loads only grow.
//!
//! Cost per request: O(log jobs in system) for the event queue plus the router's own work; the
//! O(servers) refresh of remaining work runs only for routers that ask for it
//! (`Capabilities::needs_outstanding_work`), and stale snapshots cost O(servers) per refresh.

use abi_stable::std_types::{RSlice, RSome};
use rand::RngExt;
use rand_distr::{Distribution, Exp1, LogNormal};
use routelab_policy_api::{Completion, ReplicaView, Request, RouterBox};

use super::event_queue::{EventQueue, SimTime};
use super::RunError;
use crate::metrics::{Metrics, quantile};
use crate::seeds::{SimRng, stream};
use crate::signals::SignalTable;
use crate::workload::dispatch::{Arrivals, DispatchSpec, Information, Mode, Service};
use crate::workload::trace::TraceRow;

/// Ticks per unit of time (one mean service time).
const TICKS: f64 = 1e9;

fn to_ticks(units: f64) -> SimTime {
    (units * TICKS).round() as SimTime
}

fn to_units(t: SimTime) -> f64 {
    t as f64 / TICKS
}

/// Service-time sampler with mean 1.
#[derive(Clone, Debug)]
pub enum Sizes {
    Exponential,
    Deterministic,
    Lognormal(LogNormal<f64>),
    BoundedPareto { alpha: f64, min: f64, ratio: f64, scale: f64 },
    Bimodal { p_large: f64, small: f64, large: f64 },
    Empirical(Vec<f64>),
}

impl Sizes {
    /// The sampler for `service`, and the factor its raw mean was divided by to make it 1.
    pub fn new(service: &Service) -> (Self, f64) {
        match service {
            Service::Exponential => (Sizes::Exponential, 1.0),
            Service::Deterministic => (Sizes::Deterministic, 1.0),
            Service::Lognormal { cv } => {
                let s2 = (1.0 + cv * cv).ln();
                (Sizes::Lognormal(LogNormal::new(-s2 / 2.0, s2.sqrt()).expect("validated cv")), 1.0)
            }
            Service::BoundedPareto { alpha, min, max } => {
                let (a, l, h) = (*alpha, *min, *max);
                let ratio = (l / h).powf(a);
                let raw_mean = if (a - 1.0).abs() < 1e-12 {
                    l * (h / l).ln() / (1.0 - l / h)
                } else {
                    l.powf(a) / (1.0 - ratio) * a / (a - 1.0) * (l.powf(1.0 - a) - h.powf(1.0 - a))
                };
                (Sizes::BoundedPareto { alpha: a, min: l, ratio, scale: 1.0 / raw_mean }, raw_mean)
            }
            Service::Bimodal { p_large, small, large } => {
                let raw = p_large * large + (1.0 - p_large) * small;
                (Sizes::Bimodal { p_large: *p_large, small: small / raw, large: large / raw }, raw)
            }
            Service::Empirical { values } => {
                let raw = values.iter().sum::<f64>() / values.len() as f64;
                (Sizes::Empirical(values.iter().map(|v| v / raw).collect()), raw)
            }
        }
    }

    pub fn sample(&self, rng: &mut SimRng) -> f64 {
        match self {
            Sizes::Exponential => Exp1.sample(rng),
            Sizes::Deterministic => 1.0,
            Sizes::Lognormal(d) => d.sample(rng),
            Sizes::BoundedPareto { alpha, min, ratio, scale } => {
                let u: f64 = rng.random();
                min / (1.0 - u * (1.0 - ratio)).powf(1.0 / alpha) * scale
            }
            Sizes::Bimodal { p_large, small, large } => {
                if rng.random::<f64>() < *p_large { *large } else { *small }
            }
            Sizes::Empirical(v) => v[rng.random_range(0..v.len())],
        }
    }
}

/// Inter-arrival times in units, from Poisson or from a trace rescaled to the target rate.
enum ArrivalSource<'a> {
    Poisson { rate: f64, rng: SimRng },
    Trace { rows: &'a [TraceRow], scale: f64, next: usize },
}

impl ArrivalSource<'_> {
    fn next_time(&mut self, now: f64) -> Option<f64> {
        match self {
            ArrivalSource::Poisson { rate, rng } => {
                let gap: f64 = Exp1.sample(rng);
                Some(now + gap / *rate)
            }
            ArrivalSource::Trace { rows, scale, next } => {
                let t = rows.get(*next).map(|r| (r.at_s - rows[0].at_s) * *scale);
                *next += 1;
                t
            }
        }
    }
}

enum Event {
    Departure { server: u32, request: u64, arrived_at: SimTime, started_at: SimTime },
}

/// One run of the dispatch world. `trace` holds the rows of `arrivals: trace` (their timestamps
/// are used; sizes come from `service`). `label` names the policy in errors.
pub fn run(
    spec: &DispatchSpec,
    trace: Option<&[TraceRow]>,
    router: &mut RouterBox,
    label: &str,
    run_seed: u64,
) -> Result<Metrics, RunError> {
    let n = spec.servers as usize;
    let (sizes, _) = Sizes::new(&spec.service);
    let mut size_rng = stream(run_seed, "dispatch.sizes");
    let rate = spec.utilisation * n as f64;
    let mut arrivals = match (&spec.arrivals, trace) {
        (Arrivals::Trace { .. }, Some(rows)) if rows.len() >= 2 => {
            let span = rows[rows.len() - 1].at_s - rows[0].at_s;
            let observed_rate = (rows.len() - 1) as f64 / span.max(f64::MIN_POSITIVE);
            ArrivalSource::Trace { rows, scale: observed_rate / rate, next: 0 }
        }
        _ => ArrivalSource::Poisson { rate, rng: stream(run_seed, "dispatch.arrivals") },
    };
    let fail = |what: String| RunError(format!("policy '{label}' {what}"));
    let mut signals = SignalTable::negotiate(router).map_err(|e| fail(e))?;
    let mut route = |router: &mut RouterBox, req: &Request<'_>, views: &[ReplicaView]| -> Result<usize, RunError> {
        let i = router.route(req, signals.replicas(views)).into_result().map_err(|e| RunError(e.into()))? as usize;
        if i >= n {
            return Err(fail(format!("returned replica {i}, but there are only {n} servers (valid: 0..{})", n - 1)));
        }
        Ok(i)
    };
    let mut views = vec![ReplicaView::default(); n];

    if spec.mode == Mode::BallsIntoBins {
        for id in 0..spec.requests {
            let size = sizes.sample(&mut size_rng);
            let req = Request { id, arrived_at: id as f64, prompt_tokens: 0, size_hint: RSome(size), segments: RSlice::EMPTY };
            let i = route(router, &req, &views)?;
            router.on_dispatch(&req, i as u32).into_result().map_err(|e| RunError(e.into()))?;
            let v = &mut views[i];
            v.outstanding_requests += 1;
            v.waiting += 1;
            v.outstanding_work += size;
        }
        let mut m = Metrics::new();
        m.push("requests", spec.requests as f64);
        m.push("max_load", views.iter().map(|v| v.outstanding_requests).max().unwrap_or(0) as f64);
        return Ok(m);
    }

    let needs_work = router.capabilities().into_result().map_err(|e| RunError(e.into()))?.needs_outstanding_work();
    let stale_every = match spec.information {
        Information::Fresh => None,
        Information::Stale { refresh_interval } => Some(to_ticks(refresh_interval)),
    };
    let mut snapshot = views.clone();
    let mut next_refresh: SimTime = 0;
    let mut free_at: Vec<SimTime> = vec![0; n];
    let mut queue: EventQueue<Event> = EventQueue::new();
    let warmup = (spec.warmup * spec.requests as f64) as u64;
    let mut responses: Vec<f64> = Vec::with_capacity((spec.requests - warmup) as usize);
    let mut waits = 0.0;
    let mut busy_ticks: u128 = 0;
    let mut dispatched_to = vec![0u64; n];
    let mut now_units = 0.0;
    let mut first_measured_at: Option<SimTime> = None;
    let mut last_departure: SimTime = 0;

    // Runs every event up to `until` (inclusive), keeping `views` exact.
    let drain = |until: SimTime,
                     queue: &mut EventQueue<Event>,
                     views: &mut [ReplicaView],
                     router: &mut RouterBox,
                     responses: &mut Vec<f64>,
                     waits: &mut f64,
                     last_departure: &mut SimTime|
     -> Result<(), RunError> {
        while queue.peek_time().is_some_and(|t| t <= until) {
            let (at, Event::Departure { server, request, arrived_at, started_at }) = queue.pop().expect("peeked");
            let v = &mut views[server as usize];
            v.outstanding_requests -= 1;
            v.running = (v.outstanding_requests > 0) as u32;
            v.waiting = v.outstanding_requests - v.running;
            *last_departure = at;
            if request >= warmup {
                responses.push(to_units(at - arrived_at));
                *waits += to_units(started_at - arrived_at);
            }
            let c = Completion {
                request_id: request,
                replica: server,
                arrived_at: to_units(arrived_at),
                completed_at: to_units(at),
                ttft: to_units(started_at - arrived_at),
                prompt_tokens: 0,
                cached_tokens: 0,
                output_tokens: 0,
            };
            router.on_complete(&c).into_result().map_err(|e| RunError(e.into()))?;
        }
        Ok(())
    };

    for id in 0..spec.requests {
        let Some(t_units) = arrivals.next_time(now_units) else { break };
        now_units = t_units;
        let now = to_ticks(t_units);
        if let Some(every) = stale_every {
            if now >= next_refresh {
                let boundary = now - now % every;
                drain(boundary, &mut queue, &mut views, router, &mut responses, &mut waits, &mut last_departure)?;
                for (s, (v, f)) in snapshot.iter_mut().zip(views.iter().zip(&free_at)) {
                    *s = *v;
                    s.outstanding_work = to_units(f.saturating_sub(boundary));
                }
                next_refresh = boundary + every;
            }
        }
        drain(now, &mut queue, &mut views, router, &mut responses, &mut waits, &mut last_departure)?;
        if stale_every.is_none() && needs_work {
            for (v, f) in views.iter_mut().zip(&free_at) {
                v.outstanding_work = to_units(f.saturating_sub(now));
            }
        }
        let size = sizes.sample(&mut size_rng);
        let req = Request { id, arrived_at: t_units, prompt_tokens: 0, size_hint: RSome(size), segments: RSlice::EMPTY };
        let shown = if stale_every.is_some() { &snapshot } else { &views };
        let i = route(router, &req, shown)?;
        router.on_dispatch(&req, i as u32).into_result().map_err(|e| RunError(e.into()))?;
        let size_ticks = to_ticks(size);
        let start = free_at[i].max(now);
        free_at[i] = start + size_ticks;
        let v = &mut views[i];
        v.outstanding_requests += 1;
        v.running = 1;
        v.waiting = v.outstanding_requests - 1;
        queue.push(free_at[i], Event::Departure { server: i as u32, request: id, arrived_at: now, started_at: start });
        if id >= warmup {
            first_measured_at.get_or_insert(now);
            busy_ticks += size_ticks as u128;
            dispatched_to[i] += 1;
        }
    }
    drain(SimTime::MAX, &mut queue, &mut views, router, &mut responses, &mut waits, &mut last_departure)?;

    let measured = responses.len();
    let span = to_units(last_departure.saturating_sub(first_measured_at.unwrap_or(0))).max(f64::MIN_POSITIVE);
    let total_response: f64 = responses.iter().sum();
    let mut m = Metrics::new();
    m.push("requests", measured as f64);
    m.push("response_mean", total_response / measured.max(1) as f64);
    m.push("response_p50", quantile(&mut responses, 0.50));
    m.push("response_p90", quantile(&mut responses, 0.90));
    m.push("response_p99", quantile(&mut responses, 0.99));
    m.push("wait_mean", waits / measured.max(1) as f64);
    // Little's law over the measured span: time-average number of jobs in the system per server.
    m.push("queue_mean", total_response / span / n as f64);
    m.push("utilisation", busy_ticks as f64 / TICKS / span / n as f64);
    let busiest = dispatched_to.iter().copied().max().unwrap_or(0);
    m.push("busiest_server_share", busiest as f64 / measured.max(1) as f64);
    Ok(m)
}
