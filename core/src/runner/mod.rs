//! Runs workloads × policies × seeds and collects results; the one place that knows how each
//! world is driven. Nothing here prints: progress goes to a callback, results to the caller.
//!
//! The stages, each with its own errors: [`prepare`] reads what a workload names and resolves
//! what every run shares (the trace, the cluster's step model; bad input is an [`InputError`]);
//! [`Prepared::seed_inputs`] generates each seed's request stream once, shared by every policy;
//! [`resolve`] settles each policy through the [`Loader`] once per workload; then [`run_one`] is a
//! pure function of (resolved policy, prepared workload, seed input) — no loader, no shared
//! mutable state — so runs may go in any order or in parallel.

mod cells;
mod fields;
pub mod isolate;
pub mod parallel;
mod prepared;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use routelab_policy_api::{PolicyKind, RouterBox, SelectorBox};
use serde::Serialize;

pub use self::cells::{Cell, CellError, Stage, assemble, run_cell};
pub use self::fields::{parse_with_sets, split_policies, with_field};
pub use self::prepared::{Prepared, SeedInput, cluster_stats, expand, prepare, relative_to};
use self::prepared::{SeedStream, World};
use crate::error::Error;
use crate::handle::Schedulers;
use crate::metrics::{Detail, Metrics, in_flight_timeline, quantile_vector};
use crate::plugin::{Factory, LoadError, Loader, PolicySpec};
use crate::seeds::seed_for;
use crate::sim::cluster::{ClusterSim, Feed, RunOutcome};
use crate::sim::{self, SetupError};
use crate::step_model::StepModel;
use crate::workload::cluster::{ClusterSpec, StepModels, TraceFormat};
use crate::workload::generate::{Extent, LazyStream, RequestStream, generate};
use crate::workload::{FieldError, InputError, Workload, mooncake, trace};

/// One policy's results on one workload.
#[derive(Clone, Debug, Serialize)]
pub struct PolicyResult {
    /// The policy's label (`label=` or the argument, a plugin shown by its name).
    pub policy: String,
    /// The policy argument as typed (library path included).
    pub spec: String,
    pub config: String,
    /// Mean over seeds, with `<key>_ci95` half-widths when there are several.
    pub metrics: Metrics,
    pub per_seed: Vec<Metrics>,
    /// Compound world: the allocation chosen on each seed, by model name (one per module).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allocation: Vec<Vec<String>>,
    /// Set when the policy could not be loaded or its run failed; the other policies still report.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The error is bad input (exit code 2) rather than a failing policy (exit code 1).
    #[serde(skip)]
    pub input_error: bool,
    /// The first seed's latency distribution and replica timeline, for charts (not in JSON).
    #[serde(skip)]
    pub detail: Option<Box<Detail>>,
}

/// One workload's results.
#[derive(Clone, Debug, Serialize)]
pub struct WorkloadResult {
    pub name: String,
    pub world: &'static str,
    pub seed: u64,
    pub seeds: u32,
    pub resolved: Workload,
    /// What the host derived from the workload (e.g. how service sizes were scaled).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    pub results: Vec<PolicyResult>,
}

impl WorkloadResult {
    /// `prepared`'s result with no policies yet.
    pub fn empty(prepared: &Prepared) -> Self {
        let w = &prepared.workload;
        Self {
            name: w.name.clone(),
            world: w.world().as_str(),
            seed: w.seed,
            seeds: w.seeds,
            resolved: w.clone(),
            notes: prepared.notes.clone(),
            results: Vec::new(),
        }
    }
}

/// Overrides from the command line.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    pub seed: Option<u64>,
    pub seeds: Option<u32>,
    /// Compound world: the allocation (model names) every selector starts from.
    pub start: Option<Vec<String>>,
    /// Cluster and dispatch worlds: replay this trace file instead of the one the workload names.
    pub trace: Option<PathBuf>,
    /// Cluster world: this per-request SLO instead of the workload's.
    pub slo: Option<crate::workload::slo::Slo>,
    /// Cluster world: this `summary:` (exact records or sketches) instead of the workload's.
    pub summary: Option<crate::workload::cluster::Summary>,
}

impl RunOptions {
    /// Applies the overrides to a loaded workload.
    pub fn apply(&self, w: &mut Workload) {
        if let Some(s) = self.seed {
            w.seed = s;
        }
        if let Some(n) = self.seeds {
            w.seeds = n.max(1);
        }
        if let (Some(start), Some(c)) = (&self.start, w.compound.as_mut()) {
            c.start = Some(start.clone());
        }
        if let (Some(slo), Some(c)) = (&self.slo, w.cluster.as_mut()) {
            c.slo = Some(slo.clone());
        }
        if let (Some(summary), Some(c)) = (self.summary, w.cluster.as_mut()) {
            c.summary = summary;
        }
        if let Some(t) = &self.trace {
            // An absolute path, so it is not re-read relative to the workload's folder.
            let abs = std::path::absolute(t).unwrap_or_else(|_| t.clone()).to_string_lossy().into_owned();
            if let Some(d) = w.dispatch.as_mut() {
                if let crate::workload::dispatch::Arrivals::Trace { path } = &mut d.arrivals {
                    *path = abs.clone();
                }
            }
            if let Some(c) = w.cluster.as_mut() {
                if let crate::workload::cluster::Arrivals::Trace { path, .. } = &mut c.arrivals {
                    *path = abs;
                }
            }
        }
    }
}

/// A policy settled for one workload's world: makes fresh instances for every run, without the
/// loader.
#[derive(Clone, Debug)]
pub struct ResolvedPolicy {
    pub spec: PolicySpec,
    /// The router (dispatch, cluster) or selector (compound).
    policy: Factory,
    /// Cluster world: every replica's scheduler (the spec's `@scheduler`, else the workload's).
    scheduler: Option<Factory>,
    /// Cluster world: the admission policy in front of the router (the workload's `admission`).
    admission: Option<crate::plugin::AdmissionFactory>,
    /// Cluster world: the scaler (the workload's `autoscaling.scaler`), if any.
    scaler: Option<crate::plugin::ScalerFactory>,
}

impl ResolvedPolicy {
    pub fn label(&self) -> &str {
        &self.spec.label
    }
}

/// Settles `spec` for `prepared`'s world: its name, kind and library, and its paired scheduler.
/// A selector is built once here with the first seed's context, which carries the problem's
/// shape: one that refuses the problem (`exhaustive` above its guard) is bad input before any run.
pub fn resolve(loader: &mut Loader, prepared: &Prepared, spec: &PolicySpec) -> Result<ResolvedPolicy, LoadError> {
    match prepared.world() {
        World::Dispatch(..) => Ok(ResolvedPolicy {
            spec: spec.clone(),
            policy: loader.resolve(spec, PolicyKind::Router)?,
            scheduler: None,
            admission: None,
            scaler: None,
        }),
        World::Cluster(c, _) => {
            let policy = loader.resolve(spec, PolicyKind::Router)?;
            let scheduler = PolicySpec::parse(spec.scheduler.as_deref().unwrap_or(&c.scheduler))?;
            let scheduler = Some(loader.resolve(&scheduler, PolicyKind::Scheduler)?);
            let admission = Some(loader.admission_factory(&PolicySpec::parse(&c.admission)?)?);
            let scaler = match &c.autoscaling {
                Some(a) => Some(loader.scaler_factory(&PolicySpec::parse(&a.scaler)?)?),
                None => None,
            };
            Ok(ResolvedPolicy { spec: spec.clone(), policy, scheduler, admission, scaler })
        }
        World::Compound(c) => {
            let policy = loader.resolve(spec, PolicyKind::Selector)?;
            policy.selector(&sim::compound::selector_context(c, prepared.workload.seed))?;
            Ok(ResolvedPolicy { spec: spec.clone(), policy, scheduler: None, admission: None, scaler: None })
        }
    }
}

/// One (policy, seed) run's figures, and the allocation in the compound world.
pub type Outcome = (Metrics, Vec<String>);

/// Runs one policy on one seed: a pure function of its arguments.
pub fn run_one(policy: &ResolvedPolicy, prepared: &Prepared, input: &SeedInput) -> Result<Outcome, Error> {
    Ok(run_seed(policy, prepared, input, false)?.0)
}

/// [`run_one`], with the run's latency distribution and replica timeline (dispatch and cluster
/// worlds) for charts.
pub fn run_one_detailed(
    policy: &ResolvedPolicy,
    prepared: &Prepared,
    input: &SeedInput,
) -> Result<(Outcome, Option<Detail>), Error> {
    run_seed(policy, prepared, input, true)
}

/// The policy objects one run makes: the router (and in the cluster world every replica's
/// scheduler), or the selector.
enum Instances {
    Dispatch(RouterBox),
    /// Model 0's router (the only one with one model), the schedulers, the routers of models 1...
    Cluster(RouterBox, Schedulers, Vec<RouterBox>),
    Compound(SelectorBox),
}

/// Which part of a policy refused to be built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// The router or selector itself.
    Policy,
    /// Its local scheduler (the spec's `@scheduler`, else the workload's `cluster.scheduler`).
    Scheduler,
}

/// Builds the objects of one run of `policy` with seed `run_seed`'s contexts. A run and
/// `validate` ([`check_builds`]) both build through here, so a config one refuses the other does.
fn instantiate(policy: &ResolvedPolicy, prepared: &Prepared, run_seed: u64) -> Result<Instances, (Part, LoadError)> {
    let of = |part: Part| move |e: LoadError| (part, e);
    match prepared.world() {
        World::Dispatch(d, _) => {
            let router =
                policy.policy.router(&sim::dispatch::router_context(d.servers, run_seed)).map_err(of(Part::Policy))?;
            Ok(Instances::Dispatch(router))
        }
        World::Cluster(c, p) => {
            let models = &p.step_models;
            let sm = &models.main;
            let router = policy
                .policy
                .router(&sim::cluster::router_context_for(c, models, run_seed))
                .map_err(of(Part::Policy))?;
            let scheduler = policy.scheduler.as_ref().expect("resolve gives a cluster policy its scheduler");
            let schedulers = make_schedulers(scheduler, sm, c.slots(), run_seed).map_err(of(Part::Scheduler))?;
            let others: Vec<RouterBox> = (1..c.models.len())
                .map(|m| policy.policy.router(&sim::cluster::router_context_for_model(c, models, run_seed, m)))
                .collect::<Result<_, _>>()
                .map_err(of(Part::Policy))?;
            Ok(Instances::Cluster(router, schedulers, others))
        }
        World::Compound(c) => {
            let selector =
                policy.policy.selector(&sim::compound::selector_context(c, run_seed)).map_err(of(Part::Policy))?;
            Ok(Instances::Compound(selector))
        }
    }
}

/// What `validate` checks of a policy: it resolves (name, kind, library, paired scheduler) and
/// builds — config and all, every replica's scheduler included — exactly as the first seed's run
/// of `compare` does, then is dropped unrun. The error says which part refused.
pub fn check_builds(loader: &mut Loader, prepared: &Prepared, spec: &PolicySpec) -> Result<(), (Part, LoadError)> {
    let resolved = match resolve(loader, prepared, spec) {
        Ok(r) => r,
        // Only the scheduler's resolution (its name or kind) can fail after the policy's.
        Err(e) if loader.check(spec, PolicyKind::Router).is_ok() && prepared.workload.cluster.is_some() => {
            return Err((Part::Scheduler, e));
        }
        Err(e) => return Err((Part::Policy, e)),
    };
    instantiate(&resolved, prepared, seed_for(prepared.workload.seed, 0)).map(drop)
}

/// One run; its [`Detail`] only when asked (it costs a sort of every request's latency).
fn run_seed(
    policy: &ResolvedPolicy,
    prepared: &Prepared,
    input: &SeedInput,
    with_detail: bool,
) -> Result<(Outcome, Option<Detail>), Error> {
    let (label, run_seed) = (policy.label(), input.seed);
    match (instantiate(policy, prepared, run_seed).map_err(|(_, e)| e)?, prepared.world()) {
        (Instances::Dispatch(router), World::Dispatch(d, trace)) => {
            if !with_detail {
                return Ok(((sim::dispatch::run(d, trace, router, label, run_seed)?, Vec::new()), None));
            }
            let (m, detail) = sim::dispatch::run_detailed(d, trace, router, label, run_seed)?;
            Ok(((m, Vec::new()), Some(detail)))
        }
        (Instances::Cluster(router, schedulers, others), World::Cluster(c, p)) => {
            let models = &p.step_models;
            let stream: Feed = match &input.stream {
                SeedStream::Whole(s) => Feed::fitted(s),
                &SeedStream::Lazy(extent) => {
                    let seed = p.stream_seed(prepared.workload.seed, run_seed);
                    LazyStream::new(c, p.trace.as_deref(), seed, extent)
                        .map_err(|e| prepared.setup_error(e.into()))?
                        .into()
                }
                SeedStream::None => unreachable!("a cluster seed input has a stream"),
            };
            let mut sim = ClusterSim::build(c, models, stream, router, schedulers, label)
                .map_err(|e| prepared.setup_error(e))?
                .with_model_routers(others)
                .map_err(|e| prepared.setup_error(e))?
                .with_failures(c.failures.as_ref(), run_seed);
            // Aggregated or disaggregated, the workload's admission policy stands before the router.
            if let Some(a) = &policy.admission {
                let admission = a.admission(&sim::cluster::admission_context(c, models, run_seed))?;
                sim = sim.with_admission(admission, &a.spec.label).map_err(|e| prepared.setup_error(e))?;
            }
            if let Some(s) = &policy.scaler {
                let scaler = s.scaler(&sim::cluster::scaler_context(c, models, run_seed))?;
                sim = sim.with_scaler(scaler, &s.spec.label).map_err(|e| prepared.setup_error(e))?;
            }
            let out = sim.run()?;
            let detail = with_detail.then(|| match out.detail {
                Some(d) => d,
                None => cluster_detail(c.slots() as usize, &out.records),
            });
            Ok(((out.metrics, Vec::new()), detail))
        }
        (Instances::Compound(mut selector), World::Compound(c)) => {
            let out = sim::compound::run(c, &mut selector, label, run_seed, None)?;
            Ok(((out.metrics, out.allocation), None))
        }
        _ => unreachable!("instantiate builds the objects of the prepared workload's world"),
    }
}

/// A cluster run's latency distribution and each replica's in-flight requests over time.
fn cluster_detail(replicas: usize, records: &[sim::cluster::RequestRecord]) -> Detail {
    let mut latency: Vec<f64> =
        records.iter().filter(|r| r.completed_at_s.is_finite()).map(|r| r.completed_at_s - r.arrived_at_s).collect();
    let finished_share = latency.len() as f64 / records.len().max(1) as f64;
    let spans: Vec<(u32, f64, f64)> = records.iter().map(|r| (r.replica, r.arrived_at_s, r.completed_at_s)).collect();
    let (times, in_flight) = in_flight_timeline(replicas, &spans);
    Detail {
        latency_quantiles: quantile_vector(&mut latency, crate::metrics::CDF_POINTS),
        finished_share,
        times,
        in_flight,
    }
}

/// One scheduler per replica for run `run_seed`, named in errors by `scheduler`'s label.
pub fn make_schedulers(
    scheduler: &Factory,
    sm: &StepModel,
    replicas: u32,
    run_seed: u64,
) -> Result<Schedulers, LoadError> {
    let boxes = (0..replicas)
        .map(|r| scheduler.scheduler(&sim::cluster::scheduler_context(sm, r, run_seed)))
        .collect::<Result<_, _>>()?;
    Ok(Schedulers::new(&scheduler.spec.label, boxes))
}

/// One cluster run of `router` (any router object, labelled `label`) on `stream`, every replica
/// running the scheduler `spec.scheduler` names: for exercises, tests and the bench.
pub fn run_cluster(
    spec: &ClusterSpec,
    stream: &RequestStream,
    router: RouterBox,
    label: &str,
    run_seed: u64,
) -> Result<RunOutcome, Error> {
    let file = Path::new("<cluster spec>");
    let models = StepModels::resolve(spec).map_err(|e| InputError::from_field(file, e.under("cluster")))?;
    let scheduler = Loader::new().resolve(&PolicySpec::parse(&spec.scheduler)?, PolicyKind::Scheduler)?;
    let schedulers = make_schedulers(&scheduler, &models.main, spec.slots(), run_seed)?;
    let setup =
        |e: SetupError| InputError::from_field(file, FieldError::new(&e.field, e.message, e.fix).under("cluster"));
    let sim = ClusterSim::build(spec, &models, stream, router, schedulers, label).map_err(setup)?;
    Ok(sim.with_failures(spec.failures.as_ref(), run_seed).run()?)
}

/// Compound world, `--all-starts`: `policy` from every starting allocation of the workload's
/// first seed.
pub fn all_starts(policy: &ResolvedPolicy, prepared: &Prepared) -> Result<sim::compound::AllStarts, Error> {
    let w = &prepared.workload;
    let Some(c) = &w.compound else {
        return Err(InputError::new(
            &prepared.file,
            "--all-starts needs a compound workload",
            "drop --all-starts, or pass a workload with a `compound:` section",
        )
        .into());
    };
    // Too large a space is the workload's fault (exit 2), found before any run.
    let (models, modules) = (c.model_count(), c.system.modules().len());
    let limit = sim::compound::studies::ALL_STARTS_LIMIT;
    if (models as u64).checked_pow(modules as u32).is_none_or(|n| n > limit) {
        return Err(InputError::new(
            &prepared.file,
            format!("{models} models ^ {modules} modules is above {limit} starting allocations for --all-starts"),
            "use a smaller pool or system, or drop --all-starts",
        )
        .in_field("compound")
        .into());
    }
    let ctx = sim::compound::selector_context(c, w.seed);
    let make = || policy.policy.selector(&ctx);
    Ok(sim::compound::all_starts(c, &make, w.seed)?)
}

/// Runs every policy on every seed of a prepared workload, in this process. `progress` is called
/// after each (policy, seed) run; `on_result` after each policy finishes, so a caller can write
/// results out as they come and a later failure loses nothing. Each seed's input is generated
/// once, before the first run; when that fails (bad input), every policy reports it.
pub fn run_workload(
    loader: &mut Loader,
    prepared: &Prepared,
    policies: &[PolicySpec],
    progress: &dyn Fn(&str),
    on_result: &dyn Fn(&WorkloadResult),
) -> WorkloadResult {
    let inputs = prepared.run_inputs().map_err(Error::from);
    run_workload_by(prepared, policies, on_result, &mut |spec| run_policy(loader, prepared, spec, &inputs, progress))
}

/// Collects one workload's results, each policy's from `run` (in this process, or in a child
/// process under `--isolate`); `on_result` is called after each policy.
pub fn run_workload_by(
    prepared: &Prepared,
    policies: &[PolicySpec],
    on_result: &dyn Fn(&WorkloadResult),
    run: &mut dyn FnMut(&PolicySpec) -> PolicyResult,
) -> WorkloadResult {
    let mut out = WorkloadResult::empty(prepared);
    for spec in policies {
        out.results.push(run(spec));
        on_result(&out);
    }
    out
}

/// A policy's result with no figures yet.
pub fn empty_result(spec: &PolicySpec) -> PolicyResult {
    PolicyResult {
        policy: spec.label.clone(),
        spec: spec.arg.clone(),
        config: spec.config.clone(),
        metrics: Metrics::new(),
        per_seed: Vec::new(),
        allocation: Vec::new(),
        error: None,
        input_error: false,
        detail: None,
    }
}

/// Runs one policy on every seed's input (`inputs`, or the error that made them); a failure
/// becomes the result's error. `progress` is called after each seed's run.
pub fn run_policy(
    loader: &mut Loader,
    prepared: &Prepared,
    spec: &PolicySpec,
    inputs: &Result<Vec<SeedInput>, Error>,
    progress: &dyn Fn(&str),
) -> PolicyResult {
    let seeds = 0..prepared.workload.seeds;
    let cells: Vec<Cell> = match inputs {
        Err(e) => seeds.map(|k| Cell::failed(k, Stage::Input, e)).collect(),
        Ok(inputs) => match resolve(loader, prepared, spec).map_err(Error::from) {
            Err(e) => {
                progress(&spec.label);
                seeds.map(|k| Cell::failed(k, Stage::Policy, &e)).collect()
            }
            Ok(resolved) => {
                let mut cells = Vec::new();
                for (k, input) in seeds.zip(inputs) {
                    let cell = run_cell(prepared, Ok(&resolved), Ok(input), k);
                    progress(&spec.label);
                    let failed = cell.error.is_some();
                    cells.push(cell);
                    if failed {
                        break;
                    }
                }
                cells
            }
        },
    };
    assemble(empty_result(spec), &cells)
}

#[cfg(test)]
mod tests;
