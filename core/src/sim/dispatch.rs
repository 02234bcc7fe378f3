//! The dispatch world: N first-come-first-served servers behind a router.
//!
//! Time is in units of the mean service time, held as integer ticks (10^9 per unit, the event
//! queue's conversions with the unit read as one mean service time). Arrivals and service times come from streams seeded by the run seed alone (common random
//! numbers: every router sees the same jobs). Each job's departure is known at dispatch (FCFS:
//! `max(arrival, server free) + size`) and is queued as an event; before every arrival all events
//! up to its time run in (time, insertion) order, so the router sees exact queue lengths and
//! `on_complete` arrives in time order.
//!
//! Information: `fresh` shows true state at each arrival; `stale` shows a snapshot taken at the last
//! multiple of the refresh interval (Mitzenmacher's bulletin board); the router's own state (via
//! `on_dispatch`) stays current. Balls-into-bins: no departures; loads only grow.
//!
//! The queueing mode's state is `Servers`, with one handler per happening (`on_dispatch`,
//! `on_departure`); arrivals and the stale snapshot stay in the loop of `run`.
//!
//! Engine signals: every change to a view is reported to the router's signal table (a dispatch,
//! a departure, a snapshot), so it is refilled only where something changed. `busy_until` is
//! when a server's backlog drains (`free_at`; the snapshot's, with stale information, which is
//! also shown as a scrape at the refresh boundary, so `scraped.age_s` is the snapshot's age).
//!
//! Cost per request: O(log jobs in system) for the event queue plus the router's own work; the
//! O(servers) refresh of remaining work runs only for routers that ask for it
//! (`Capabilities::needs_outstanding_work`), and stale snapshots cost O(servers) per refresh.

use abi_stable::std_types::RNone;
use rand_distr::{Distribution, Exp1};
use routelab_policy_api::{Completion, ReplicaView, Request, RouterBox, RouterContext, World};

use super::event_queue::EventQueue;
use crate::error::RunError;
use crate::facts::RequestInfo;
use crate::handle::RouterHandle;
use crate::metrics::{CDF_POINTS, Detail, Metrics, TIMELINE_SAMPLES, quantile, quantile_vector};
use crate::seeds::{SimRng, stream, stream_seed};
use crate::workload::dispatch::{Arrivals, DispatchSpec, Information, Mode, Sizes};
use crate::workload::trace::TraceRow;

/// Dispatch-world time: integer ticks of 10^-9 of the mean service time — this world's unit of
/// time is the mean service time (sizes are normalised to mean 1), not a second, so it has a
/// type of its own beside the cluster world's nanosecond [`crate::time::SimTime`]. Integer, so
/// event order never depends on floating-point rounding.
type Ticks = u64;

/// Ticks per unit of time (one mean service time).
const TICKS: f64 = 1e9;

/// Units (mean service times) → ticks, rounded to the nearest tick.
fn to_ticks(units: f64) -> Ticks {
    crate::time::round_to_u64(units * TICKS)
}

/// Ticks → units (mean service times).
fn to_units(t: Ticks) -> f64 {
    t as f64 / TICKS
}

/// What a router is told at creation in the dispatch world of `servers` servers.
pub fn router_context(servers: u32, run_seed: u64) -> RouterContext {
    RouterContext {
        world: World::Dispatch,
        replicas: servers,
        seed: stream_seed(run_seed, "policy"),
        kv_capacity_tokens: 0,
        cost: RNone,
        disaggregation: RNone,
        facts: Vec::new().into(),
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
    Departure { server: u32, request: u64, arrived_at: Ticks, started_at: Ticks },
}

/// One run of the dispatch world. `trace` holds the rows of `arrivals: trace` (their timestamps
/// are used; sizes come from `service`). `label` names the policy in errors. The router's own
/// figures follow the host's as `router.<name>`.
pub fn run(
    spec: &DispatchSpec,
    trace: Option<&[TraceRow]>,
    router: RouterBox,
    label: &str,
    run_seed: u64,
) -> Result<Metrics, RunError> {
    let mut router = RouterHandle::new(router, spec.servers, World::Dispatch, label);
    let (mut m, _) = run_with(spec, trace, &mut router, run_seed, false)?;
    for (k, v) in router.report()? {
        m.push(k, v);
    }
    Ok(m)
}

/// [`run`], with the run's response-time distribution and each server's queue over time
/// (sampled every `requests / TIMELINE_SAMPLES` arrivals; empty in balls-into-bins mode).
pub fn run_detailed(
    spec: &DispatchSpec,
    trace: Option<&[TraceRow]>,
    router: RouterBox,
    label: &str,
    run_seed: u64,
) -> Result<(Metrics, Detail), RunError> {
    let mut router = RouterHandle::new(router, spec.servers, World::Dispatch, label);
    let (mut m, detail) = run_with(spec, trace, &mut router, run_seed, true)?;
    for (k, v) in router.report()? {
        m.push(k, v);
    }
    Ok((m, detail))
}

fn run_with(
    spec: &DispatchSpec,
    trace: Option<&[TraceRow]>,
    router: &mut RouterHandle,
    run_seed: u64,
    with_detail: bool,
) -> Result<(Metrics, Detail), RunError> {
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
    let mut views = vec![ReplicaView::default(); n];
    // Every change to a view below is reported, so signals are refilled only where they changed.
    router.track_view_changes();

    if spec.mode == Mode::BallsIntoBins {
        for id in 0..spec.requests {
            let size = sizes.sample(&mut size_rng);
            let req = Request::new(id, id as f64, 0);
            let i = router.dispatch(&req, &RequestInfo { service_time: Some(size), ..RequestInfo::plain() }, &views)?
                as usize;
            let v = &mut views[i];
            v.outstanding_requests += 1;
            v.waiting += 1;
            v.outstanding_work += size;
            // Nothing departs: the server's work ends after all of it.
            router.set_busy_until(i, v.outstanding_work);
        }
        let mut m = Metrics::new();
        m.push("requests", spec.requests as f64);
        m.push("max_load", views.iter().map(|v| v.outstanding_requests).max().unwrap_or(0) as f64);
        return Ok((m, Detail::default()));
    }

    let needs_work = router.capabilities().needs_outstanding_work();
    let stale_every = match spec.information {
        Information::Fresh => None,
        Information::Stale { refresh_interval } => Some(to_ticks(refresh_interval)),
    };
    let mut servers = Servers::new(views, spec);
    let mut snapshot = servers.views.clone();
    let mut next_refresh: Ticks = 0;
    let mut now_units = 0.0;
    let sample_every = (spec.requests / TIMELINE_SAMPLES as u64).max(1);
    for id in 0..spec.requests {
        let Some(t_units) = arrivals.next_time(now_units) else { break };
        now_units = t_units;
        let now = to_ticks(t_units);
        if let Some(every) = stale_every {
            if now >= next_refresh {
                let boundary = now - now % every;
                servers.drain(boundary, router)?;
                for (i, (s, (v, f))) in snapshot.iter_mut().zip(servers.views.iter().zip(&servers.free_at)).enumerate()
                {
                    *s = *v;
                    s.outstanding_work = to_units(f.saturating_sub(boundary));
                    router.set_busy_until(i, to_units(*f));
                }
                // The snapshot is what a metrics scrape at the boundary would read.
                if router.reads_scrapes() {
                    router.scrape(&snapshot, to_units(boundary));
                }
                next_refresh = boundary + every;
            }
        }
        servers.drain(now, router)?;
        if with_detail && id % sample_every == 0 {
            servers.times.push(t_units);
            servers.in_flight.push(servers.views.iter().map(|v| v.outstanding_requests).collect());
        }
        if stale_every.is_none() && needs_work {
            for (v, f) in servers.views.iter_mut().zip(&servers.free_at) {
                v.outstanding_work = to_units(f.saturating_sub(now));
            }
        }
        let size = sizes.sample(&mut size_rng);
        let req = Request::new(id, t_units, 0);
        let shown = if stale_every.is_some() { &snapshot } else { &servers.views };
        let i = router.dispatch(&req, &RequestInfo { service_time: Some(size), ..RequestInfo::plain() }, shown)?;
        servers.on_dispatch(id, i, now, to_ticks(size));
        if stale_every.is_none() {
            router.set_busy_until(i as usize, to_units(servers.free_at[i as usize]));
        }
    }
    servers.drain(Ticks::MAX, router)?;
    Ok(servers.summary(with_detail))
}

/// The queueing mode's servers: FCFS queues known by when each server frees up, the departure
/// events, and what is measured after the warm-up.
struct Servers {
    views: Vec<ReplicaView>,
    free_at: Vec<Ticks>,
    queue: EventQueue<Event, Ticks>,
    warmup: u64,
    responses: Vec<f64>,
    waits: f64,
    busy_ticks: u128,
    dispatched_to: Vec<u64>,
    first_measured_at: Option<Ticks>,
    last_departure: Ticks,
    /// Sampled for charts: arrival times and each server's requests then (before the arrival).
    times: Vec<f64>,
    in_flight: Vec<Vec<u32>>,
}

impl Servers {
    fn new(views: Vec<ReplicaView>, spec: &DispatchSpec) -> Self {
        let n = views.len();
        let warmup = (spec.warmup * spec.requests as f64) as u64;
        Self {
            views,
            free_at: vec![0; n],
            queue: EventQueue::new(),
            warmup,
            responses: Vec::with_capacity((spec.requests - warmup) as usize),
            waits: 0.0,
            busy_ticks: 0,
            dispatched_to: vec![0; n],
            first_measured_at: None,
            last_departure: 0,
            times: Vec::new(),
            in_flight: Vec::new(),
        }
    }

    /// Request `id`, arrived at `now` with `size` ticks of work, joins server `server`'s queue;
    /// its departure is known now (FCFS).
    fn on_dispatch(&mut self, id: u64, server: u32, now: Ticks, size: Ticks) {
        let i = server as usize;
        let start = self.free_at[i].max(now);
        self.free_at[i] = start + size;
        let v = &mut self.views[i];
        v.outstanding_requests += 1;
        v.running = 1;
        v.waiting = v.outstanding_requests - 1;
        self.queue.push(self.free_at[i], Event::Departure { server, request: id, arrived_at: now, started_at: start });
        if id >= self.warmup {
            self.first_measured_at.get_or_insert(now);
            self.busy_ticks += size as u128;
            self.dispatched_to[i] += 1;
        }
    }

    /// Runs every departure up to `until` (inclusive), keeping `views` exact.
    fn drain(&mut self, until: Ticks, router: &mut RouterHandle) -> Result<(), RunError> {
        while self.queue.peek_time().is_some_and(|t| t <= until) {
            let (at, event) = self.queue.pop().expect("peeked");
            self.on_departure(at, event, router)?;
        }
        Ok(())
    }

    fn on_departure(&mut self, at: Ticks, event: Event, router: &mut RouterHandle) -> Result<(), RunError> {
        let Event::Departure { server, request, arrived_at, started_at } = event;
        let v = &mut self.views[server as usize];
        v.outstanding_requests -= 1;
        v.running = (v.outstanding_requests > 0) as u32;
        v.waiting = v.outstanding_requests - v.running;
        self.last_departure = at;
        router.view_changed(server as usize);
        if request >= self.warmup {
            self.responses.push(to_units(at - arrived_at));
            self.waits += to_units(started_at - arrived_at);
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
        router.complete(&c)
    }

    fn summary(mut self, with_detail: bool) -> (Metrics, Detail) {
        let n = self.views.len();
        let responses = &mut self.responses;
        let measured = responses.len();
        let span =
            to_units(self.last_departure.saturating_sub(self.first_measured_at.unwrap_or(0))).max(f64::MIN_POSITIVE);
        let total_response: f64 = responses.iter().sum();
        let mut m = Metrics::new();
        m.push("requests", measured as f64);
        m.push("response_mean", total_response / measured.max(1) as f64);
        m.push("response_p50", quantile(responses, 0.50));
        m.push("response_p90", quantile(responses, 0.90));
        m.push("response_p99", quantile(responses, 0.99));
        m.push("wait_mean", self.waits / measured.max(1) as f64);
        // Little's law over the measured span: time-average number of jobs in the system per server.
        m.push("queue_mean", total_response / span / n as f64);
        m.push("utilisation", self.busy_ticks as f64 / TICKS / span / n as f64);
        let busiest = self.dispatched_to.iter().copied().max().unwrap_or(0);
        m.push("busiest_server_share", busiest as f64 / measured.max(1) as f64);
        if !with_detail {
            return (m, Detail::default());
        }
        let detail = Detail {
            latency_quantiles: quantile_vector(responses, CDF_POINTS),
            finished_share: 1.0,
            times: self.times,
            in_flight: self.in_flight,
        };
        (m, detail)
    }
}

#[cfg(test)]
mod tests {
    use abi_stable::sabi_trait::TD_Opaque;
    use routelab_policies::least_requests::LeastRequests;
    use routelab_policies::least_work_left::LeastWorkLeft;
    use routelab_policy_api::*;

    use super::*;

    /// Join the shortest queue by reading every view: what `least_requests` does below its index.
    struct ScanJsq(PolicyRng);

    impl Policy for ScanJsq {
        const NAME: &'static str = "scan_jsq";
        const DESCRIPTION: &'static str = "least_requests by a full scan";
        type Config = routelab_policies::NoConfig;
        type Context = RouterContext;
        fn new(_: Self::Config, ctx: &RouterContext) -> Result<Self, String> {
            Ok(Self(policy_rng(ctx.seed)))
        }
    }

    impl RouterPolicy for ScanJsq {
        fn route(&mut self, _: &Request<'_>, replicas: &Replicas<'_>) -> usize {
            let count = |i: usize| replicas[i].outstanding_requests as u64;
            argmin_one_draw_by(replicas.len(), count, &mut self.0).expect("servers")
        }
    }

    /// Least work left by reading every view's `outstanding_work`, which the host refreshes before
    /// every arrival for it, with the one-draw tie-break: what `least_work_left` decided before
    /// it read `busy_until`.
    struct ScanLwl(PolicyRng);

    impl Policy for ScanLwl {
        const NAME: &'static str = "scan_lwl";
        const DESCRIPTION: &'static str = "least_work_left by a full scan of outstanding_work";
        type Config = routelab_policies::NoConfig;
        type Context = RouterContext;
        fn new(_: Self::Config, ctx: &RouterContext) -> Result<Self, String> {
            Ok(Self(policy_rng(ctx.seed)))
        }
    }

    impl RouterPolicy for ScanLwl {
        fn capabilities(&self) -> Capabilities {
            Capabilities::NEEDS_OUTSTANDING_WORK
        }
        fn route(&mut self, _: &Request<'_>, replicas: &Replicas<'_>) -> usize {
            let work = |i: usize| replicas[i].outstanding_work.to_bits();
            argmin_one_draw_by(replicas.len(), work, &mut self.0).expect("servers")
        }
    }

    fn run_policy<P: RouterPolicy<Context = RouterContext>>(spec: &DispatchSpec) -> Metrics {
        let ctx = router_context(spec.servers, 7);
        let router = Router_TO::from_value(Guarded::new(P::new(Default::default(), &ctx).unwrap()), TD_Opaque);
        run(spec, None, router, P::NAME, 3).unwrap()
    }

    /// `least_requests` at a size where it keeps its index (fresh, stale refreshed often and
    /// rarely, balls into bins) decides exactly as the scan: every metric equal.
    #[test]
    fn least_requests_index_decides_as_the_scan() {
        for information in ["fresh", "{stale: {refresh_interval: 0.05}}", "{stale: {refresh_interval: 4}}"] {
            for mode in ["queueing", "balls_into_bins"] {
                let yaml = format!(
                    "{{servers: 1024, requests: 20000, utilisation: 0.9, information: {information}, mode: {mode}}}"
                );
                let spec: DispatchSpec = serde_norway::from_str(&yaml).unwrap();
                let (indexed, scanned) = (run_policy::<LeastRequests>(&spec), run_policy::<ScanJsq>(&spec));
                assert_eq!(indexed, scanned, "{yaml}");
            }
        }
    }

    /// `least_work_left`, reading `busy_until` and counts (by scan at 16 servers, from its tree at
    /// 1,024), decides exactly as a scan of the remaining work the host refreshes per arrival:
    /// fresh, stale refreshed often and rarely, balls into bins; exponential, heavy-tailed
    /// and deterministic sizes (the last full of ties among busy servers). Every metric equal.
    #[test]
    fn least_work_left_decides_as_a_scan_of_outstanding_work() {
        for servers in [16, 1024] {
            for information in ["fresh", "{stale: {refresh_interval: 0.05}}", "{stale: {refresh_interval: 4}}"] {
                for (mode, service) in [
                    ("queueing", "exponential"),
                    ("queueing", "{bounded_pareto: {alpha: 1.1, min: 1, max: 10000}}"),
                    ("queueing", "deterministic"),
                    ("balls_into_bins", "exponential"),
                ] {
                    let yaml = format!(
                        "{{servers: {servers}, requests: 20000, utilisation: 0.9, information: {information}, mode: {mode}, service: {service}}}"
                    );
                    let spec: DispatchSpec = serde_norway::from_str(&yaml).unwrap();
                    let (lwl, scanned) = (run_policy::<LeastWorkLeft>(&spec), run_policy::<ScanLwl>(&spec));
                    assert_eq!(lwl, scanned, "{yaml}");
                }
            }
        }
    }

    /// Asks for view-derived signals, `busy_until` and the snapshot's age, and checks at every
    /// decision that the table — refilled only where the world reported a change — says what
    /// the views say: a busy server's `busy_until` is when its remaining work ends, seen from
    /// the time the views show (`now − age`).
    struct ChecksSignals {
        /// Decisions on a snapshot older than the decision.
        aged: u32,
    }

    impl Policy for ChecksSignals {
        const NAME: &'static str = "checks_signals";
        const DESCRIPTION: &'static str = "test router";
        type Config = routelab_policies::NoConfig;
        type Context = RouterContext;
        fn new(_: Self::Config, _: &RouterContext) -> Result<Self, String> {
            Ok(Self { aged: 0 })
        }
    }

    impl RouterPolicy for ChecksSignals {
        fn capabilities(&self) -> Capabilities {
            Capabilities::NEEDS_OUTSTANDING_WORK
        }
        fn signals(&self) -> Vec<String> {
            [signals::SCRAPED_WAITING, signals::KV_UTILISATION, signals::BUSY_UNTIL, signals::SCRAPED_AGE_S]
                .map(String::from)
                .to_vec()
        }
        fn route(&mut self, req: &Request<'_>, replicas: &Replicas<'_>) -> usize {
            let age = replicas.signal(0, 3);
            self.aged += (age > 0.0) as u32;
            for (i, v) in replicas.iter().enumerate() {
                let row = replicas.signals_of(i);
                // The shown views are the last scrape (stale) or live (fresh): scraped.* read the same.
                assert_eq!((row[0], row[1]), (v.waiting as f64, 0.0), "replica {i}");
                assert_eq!(row[3], age, "one scrape for every server");
                if v.outstanding_requests > 0 {
                    let seen_at = req.arrived_at - age;
                    assert!((row[2] - seen_at - v.outstanding_work).abs() < 1e-6, "replica {i}: {row:?} {v:?}");
                }
            }
            (req.id as usize * 7) % replicas.len()
        }
        fn report(&self) -> Vec<(String, f64)> {
            vec![("aged".into(), self.aged as f64)]
        }
    }

    /// The dispatch world's incremental signal table against the views, fresh and stale (where
    /// the snapshot is a scrape: its age is positive between refreshes).
    #[test]
    fn signals_follow_the_views() {
        for information in ["fresh", "{stale: {refresh_interval: 0.3}}"] {
            let yaml = format!("{{servers: 9, requests: 3000, utilisation: 0.9, information: {information}}}");
            let spec: DispatchSpec = serde_norway::from_str(&yaml).unwrap();
            let m = run_policy::<ChecksSignals>(&spec);
            assert!(m.get("requests").is_some_and(|r| r > 2000.0), "{yaml}");
            let aged = m.get("router.aged").unwrap();
            assert_eq!(aged > 2000.0, information != "fresh", "{aged} decisions on an aged snapshot ({yaml})");
        }
    }
}
