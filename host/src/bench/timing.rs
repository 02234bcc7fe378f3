//! The cluster world timed for `routelab bench`: seconds to generate and to simulate a cluster
//! workload, and the router's share of the simulation, read by wrapping the router in a clock
//! (`Timed`) that times each of its calls.

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{RResult, RString, RVec};
use anyhow::Result;
use routelab_core::plugin::{Loader, PolicySpec};
use routelab_core::workload::cluster::ClusterSpec;
use routelab_policy_api::{
    Capabilities, Completion, Eviction, PdDecision, PolicyError, Replicas, Request, Router, Router_TO, RouterBox, Stat,
};

/// Seconds to generate and to simulate `requests` requests of a cluster workload with `policy`,
/// and the router's share of the simulation (its calls, timed one by one).
pub fn cluster_timing(loader: &mut Loader, spec: &ClusterSpec, policy: &str, requests: u64) -> Result<ClusterTiming> {
    cluster_timing_with(loader, spec, policy, requests, None)
}

/// [`cluster_timing`] with the admission policy `admission` (a policy argument) in front of the
/// router, or none at all (the run as it was before admission existed: no admission calls).
pub fn cluster_timing_with(
    loader: &mut Loader,
    spec: &ClusterSpec,
    policy: &str,
    requests: u64,
    admission: Option<&str>,
) -> Result<ClusterTiming> {
    use routelab_core::sim::cluster;
    let mut spec = spec.clone();
    spec.requests = Some(requests);
    spec.duration_s = None;
    let models = routelab_core::workload::cluster::StepModels::resolve(&spec)
        .map_err(|e| anyhow::anyhow!("{}: {}", e.path, e.message))?;
    let policy_spec = PolicySpec::parse(policy)?;
    if let Some(s) = &policy_spec.scheduler {
        spec.scheduler = s.clone();
    }
    let inner = loader.router(&policy_spec, &cluster::router_context_for(&spec, &models, 1))?;
    let clock = Arc::new(RouterClock::default());
    let router: RouterBox = Router_TO::from_value(Timed { inner, clock: clock.clone() }, TD_Opaque);
    let scheduler = loader.resolve(&PolicySpec::parse(&spec.scheduler)?, routelab_policy_api::PolicyKind::Scheduler)?;
    let schedulers = routelab_core::runner::make_schedulers(&scheduler, &models.main, spec.replicas, 1)?;
    let t = Instant::now();
    let stream = routelab_core::workload::generate::generate(&spec, None, 1).map_err(anyhow::Error::msg)?;
    let generate_s = t.elapsed().as_secs_f64();
    let admission = match admission {
        Some(a) => Some((loader.admission_factory(&PolicySpec::parse(a)?)?, a)),
        None => None,
    };
    let t = Instant::now();
    let mut sim =
        cluster::ClusterSim::build(&spec, &models, &stream, router, schedulers, policy).map_err(anyhow::Error::msg)?;
    if let Some((factory, label)) = admission {
        let a = factory.admission(&cluster::admission_context(&spec, &models, 1))?;
        sim = sim.with_admission(a, label).map_err(anyhow::Error::msg)?;
    }
    let outcome = sim.run()?;
    let simulate_s = t.elapsed().as_secs_f64();
    let overloaded = outcome.metrics.get("overloaded").unwrap_or(0.0) > 0.0;
    black_box(outcome);
    Ok(ClusterTiming {
        generate_s,
        simulate_s,
        router_s: clock.nanos.load(Ordering::Relaxed) as f64 / 1e9,
        decisions: clock.decisions.load(Ordering::Relaxed),
        overloaded,
    })
}

/// What [`cluster_timing`] measured.
pub struct ClusterTiming {
    pub generate_s: f64,
    pub simulate_s: f64,
    /// Time inside the router's calls (route, on_dispatch, on_complete, on_evict).
    pub router_s: f64,
    pub decisions: u64,
    pub overloaded: bool,
}

#[derive(Default)]
struct RouterClock {
    nanos: AtomicU64,
    decisions: AtomicU64,
}

/// A router wrapper that times every call of the router inside (≈ 2 × 20 ns of clock reads per
/// call on top, so tiny routers look slower than they are).
struct Timed {
    inner: RouterBox,
    clock: Arc<RouterClock>,
}

impl Timed {
    fn time<T>(&mut self, f: impl FnOnce(&mut RouterBox) -> T) -> T {
        let t = Instant::now();
        let out = f(&mut self.inner);
        self.clock.nanos.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        out
    }
}

impl Router for Timed {
    fn capabilities(&self) -> RResult<Capabilities, PolicyError> {
        self.inner.capabilities()
    }
    fn signals(&self) -> RResult<RVec<RString>, PolicyError> {
        self.inner.signals()
    }
    fn request_facts(&self) -> RResult<RVec<RString>, PolicyError> {
        self.inner.request_facts()
    }
    fn route(&mut self, request: &Request<'_>, replicas: Replicas<'_>) -> RResult<u32, PolicyError> {
        self.clock.decisions.fetch_add(1, Ordering::Relaxed);
        self.time(|r| r.route(request, replicas))
    }
    fn on_dispatch(&mut self, request: &Request<'_>, replica: u32) -> RResult<(), PolicyError> {
        self.time(|r| r.on_dispatch(request, replica))
    }
    fn on_complete(&mut self, completion: &Completion) -> RResult<(), PolicyError> {
        self.time(|r| r.on_complete(completion))
    }
    fn on_evict(&mut self, eviction: &Eviction<'_>) -> RResult<(), PolicyError> {
        self.time(|r| r.on_evict(eviction))
    }
    fn report(&self) -> RResult<RVec<Stat>, PolicyError> {
        self.inner.report()
    }
    fn route_pair(
        &mut self,
        request: &Request<'_>,
        prefill: Replicas<'_>,
        decode: Replicas<'_>,
    ) -> RResult<PdDecision, PolicyError> {
        self.clock.decisions.fetch_add(1, Ordering::Relaxed);
        self.time(|r| r.route_pair(request, prefill, decode))
    }
    fn on_dispatch_pair(&mut self, request: &Request<'_>, decision: PdDecision) -> RResult<(), PolicyError> {
        self.time(|r| r.on_dispatch_pair(request, decision))
    }
    fn on_prefill_complete(&mut self, completion: &Completion) -> RResult<(), PolicyError> {
        self.time(|r| r.on_prefill_complete(completion))
    }
    fn on_abandon(&mut self, abandoned: &Completion) -> RResult<(), PolicyError> {
        self.time(|r| r.on_abandon(abandoned))
    }
}
