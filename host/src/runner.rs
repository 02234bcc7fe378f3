//! Runs workloads × policies × seeds and collects results; the one place that knows how each
//! world is driven. Nothing here prints: progress goes to a callback, results to the caller.

use std::path::{Path, PathBuf};

use routelab_policy_api::{RouterContext, SelectorContext, World};
use serde::Serialize;

use crate::metrics::{Metrics, over_seeds};
use crate::plugin::{LoadError, Loader, PolicySpec};
use crate::seeds::{seed_for, stream_seed};
use crate::sim::{self, RunError};
use crate::workload::{InputError, Workload, WorldKind, trace};

/// One policy's results on one workload.
#[derive(Clone, Debug, Serialize)]
pub struct PolicyResult {
    pub policy: String,
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

/// Overrides from the command line.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    pub seed: Option<u64>,
    pub seeds: Option<u32>,
    /// Compound world: the allocation (model names) every selector starts from.
    pub start: Option<Vec<String>>,
    /// Cluster and dispatch worlds: replay this trace file instead of the one the workload names.
    pub trace: Option<PathBuf>,
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

/// The runs a workload stands for: itself, or one per compound `variants` entry (named
/// `name[label]`), each validated.
pub fn expand(w: Workload, file: &Path) -> Result<Vec<Workload>, InputError> {
    let Some(c) = &w.compound else { return Ok(vec![w]) };
    if c.variants.is_empty() {
        return Ok(vec![w]);
    }
    c.variants()
        .into_iter()
        .enumerate()
        .map(|(i, (label, spec))| {
            let mut v = w.clone();
            v.name = format!("{}[{}]", w.name, if label.is_empty() { i.to_string() } else { label });
            v.compound = Some(spec);
            v.validate().map_err(|e| InputError::from_field(file, e.under(&format!("compound.variants[{i}]"))))?;
            Ok(v)
        })
        .collect()
}

/// Input the worlds need besides the workload itself, read once (e.g. a trace file).
pub struct Prepared {
    pub workload: Workload,
    pub notes: Vec<String>,
    /// The trace the workload replays (its file read once), if any.
    trace: Option<Vec<trace::TraceRow>>,
}

/// Resolves files a workload names (relative to the workload's folder) and derived facts.
pub fn prepare(workload: Workload, file: &Path) -> Result<Prepared, InputError> {
    // Again: command-line overrides (--seeds) may have changed it since it was loaded.
    workload.validate().map_err(|e| InputError::from_field(file, e))?;
    let mut notes = Vec::new();
    let mut trace = None;
    if let Some(d) = &workload.dispatch {
        let (_, raw_mean) = sim::dispatch::Sizes::new(&d.service);
        if raw_mean != 1.0 {
            notes.push(format!("service sizes divided by {raw_mean:.6} so their mean is 1"));
        }
        if let crate::workload::dispatch::Arrivals::Trace { path } = &d.arrivals {
            let p = relative_to(file, path);
            let rows = trace::load(&p)?;
            if rows.len() < 2 {
                return Err(InputError {
                    file: p,
                    path: String::new(),
                    line: None,
                    message: "a trace needs at least two rows to give a rate".into(),
                    fix: "use a longer trace".into(),
                });
            }
            notes.push(format!(
                "trace arrivals from {} ({} rows) rescaled to utilisation {}",
                path,
                rows.len(),
                d.utilisation
            ));
            trace = Some(rows);
        }
    }
    if let Some(c) = &workload.cluster {
        if let crate::workload::cluster::Arrivals::Trace { path, time_scale } = &c.arrivals {
            let p = relative_to(file, path);
            let rows = trace::load(&p)?;
            trace::check_cluster_rows(&rows, c, &p)?;
            notes.push(format!("trace replay of {} ({} rows, time scale {time_scale})", p.display(), rows.len()));
            trace = Some(rows);
        }
    }
    Ok(Prepared { workload, notes, trace })
}

/// A cluster workload's generated-stream statistics for seed `workload.seed` (`None` elsewhere).
pub fn cluster_stats(p: &Prepared) -> Result<Option<String>, String> {
    let Some(c) = &p.workload.cluster else { return Ok(None) };
    let stream = crate::workload::generate::generate(c, p.trace.as_deref(), p.workload.seed)?;
    Ok(Some(crate::workload::generate::stats(&stream).to_string()))
}

/// `path` as written in `workload_file`: relative paths are relative to the workload's folder.
pub fn relative_to(workload_file: &Path, path: &str) -> PathBuf {
    let p = Path::new(path);
    if p.is_absolute() {
        return p.into();
    }
    workload_file.parent().unwrap_or(Path::new(".")).join(p)
}

/// Why a single (policy, seed) run produced no metrics.
enum Failure {
    Load(LoadError),
    Run(RunError),
}

/// One (policy, seed) run's figures, and the allocation in the compound world.
type Outcome = (Metrics, Vec<String>);

/// Runs one policy on one seed.
fn run_one(loader: &mut Loader, prepared: &Prepared, spec: &PolicySpec, run_seed: u64) -> Result<Outcome, Failure> {
    let w = &prepared.workload;
    match w.world() {
        WorldKind::Dispatch => {
            let d = w.dispatch.as_ref().expect("dispatch world");
            let ctx = RouterContext {
                world: World::Dispatch,
                replicas: d.servers,
                seed: stream_seed(run_seed, "policy"),
                kv_capacity_tokens: 0,
                cost: abi_stable::std_types::RNone,
            };
            let mut router = loader.router(spec, &ctx).map_err(Failure::Load)?;
            let mut m = sim::dispatch::run(d, prepared.trace.as_deref(), &mut router, &spec.label, run_seed)
                .map_err(Failure::Run)?;
            append_reports(&mut m, router.report().into_result().map_err(|e| Failure::Run(RunError(e.into())))?);
            Ok((m, Vec::new()))
        }
        WorldKind::Cluster => {
            let c = w.cluster.as_ref().expect("cluster world");
            let sm = c.step_model().map_err(|e| {
                Failure::Load(LoadError::new(crate::plugin::LoadErrorKind::BadConfig, format!("cluster.{}: {}", e.path, e.message), e.fix))
            })?;
            let ctx = sim::cluster::router_context(&sm, c.replicas, run_seed);
            let mut router = loader.router(spec, &ctx).map_err(Failure::Load)?;
            let paired;
            let c = match &spec.scheduler {
                Some(s) => {
                    paired = crate::workload::cluster::ClusterSpec { scheduler: s.clone(), ..c.clone() };
                    &paired
                }
                None => c,
            };
            let mut schedulers = sim::cluster::make_schedulers(c, loader, run_seed).map_err(Failure::Load)?;
            let m = sim::cluster::run(c, prepared.trace.as_deref(), &mut router, &mut schedulers, &spec.label, run_seed)
                .map_err(Failure::Run)?;
            Ok((m, Vec::new()))
        }
        WorldKind::Compound => {
            let c = w.compound.as_ref().expect("compound world");
            check_exhaustive_guard(spec, c).map_err(Failure::Load)?;
            let ctx = SelectorContext { seed: sim::compound::selector_seed(run_seed) };
            let mut selector = loader.selector(spec, &ctx).map_err(Failure::Load)?;
            let out = sim::compound::run(c, &mut selector, &spec.label, run_seed, None).map_err(Failure::Run)?;
            Ok((out.metrics, out.allocation))
        }
    }
}

/// The built-in `exhaustive` refuses spaces above its guard; refusing before the run makes it
/// bad input (exit 2) rather than a failed run.
fn check_exhaustive_guard(spec: &PolicySpec, c: &crate::workload::compound::CompoundSpec) -> Result<(), LoadError> {
    use routelab_policies::exhaustive::{Exhaustive, check_space};
    if spec.library.is_some() || spec.name.as_deref() != Some("exhaustive") {
        return Ok(());
    }
    let bad = |m: String| LoadError::new(crate::plugin::LoadErrorKind::BadConfig, format!("policy '{}': {m}", spec.label), "");
    let cfg = routelab_policy_api::parse_config::<Exhaustive>(&spec.config).map_err(bad)?;
    let modules = c.system.modules().len();
    check_space(c.model_count(), modules, cfg.max_allocations).map(|_| ()).map_err(bad)
}

/// Adds a policy's own figures to the host's metrics.
pub fn append_reports(m: &mut Metrics, stats: abi_stable::std_types::RVec<routelab_policy_api::Stat>) {
    for s in stats {
        m.push(s.name.to_string(), s.value);
    }
}

/// Runs every policy on every seed of a prepared workload. `progress` is called after each
/// (policy, seed) run; `on_result` after each policy finishes, so a caller can write results out
/// as they come and a later failure loses nothing.
pub fn run_workload(
    loader: &mut Loader,
    prepared: &Prepared,
    policies: &[PolicySpec],
    progress: &mut dyn FnMut(&str),
    on_result: &mut dyn FnMut(&WorkloadResult),
) -> WorkloadResult {
    let w = &prepared.workload;
    let mut out = WorkloadResult {
        name: w.name.clone(),
        world: w.world().as_str(),
        seed: w.seed,
        seeds: w.seeds,
        resolved: w.clone(),
        notes: prepared.notes.clone(),
        results: Vec::new(),
    };
    for spec in policies {
        let mut per_seed = Vec::new();
        let mut allocation = Vec::new();
        let mut error = None;
        let mut input_error = false;
        for k in 0..w.seeds {
            match run_one(loader, prepared, spec, seed_for(w.seed, k)) {
                Ok((m, a)) => {
                    per_seed.push(m);
                    if !a.is_empty() {
                        allocation.push(a);
                    }
                }
                Err(Failure::Load(e)) => {
                    input_error = e.is_input_error();
                    error = Some(e.to_string());
                }
                Err(Failure::Run(e)) => error = Some(e.to_string()),
            }
            progress(&spec.label);
            if error.is_some() {
                break;
            }
        }
        let metrics = if error.is_none() { over_seeds(&per_seed) } else { Metrics::new() };
        out.results.push(PolicyResult {
            policy: spec.label.clone(),
            config: spec.config.clone(),
            metrics,
            per_seed,
            allocation,
            error,
            input_error,
        });
        on_result(&out);
    }
    out
}

/// Sets the field at dotted `path` of a workload document (the file's YAML, before parsing) to
/// `value` (YAML text, or `xF` for the current value times F). The path may start inside the world section: `arrivals.poisson.rate`
/// means `cluster.arrivals.poisson.rate` in a cluster workload.
pub fn with_field(doc: &mut serde_norway::Value, file: &Path, path: &str, value: &str) -> Result<(), InputError> {
    let err = |message: String, fix: &str| InputError {
        file: file.into(),
        path: path.into(),
        line: None,
        message,
        fix: fix.into(),
    };
    let factor = value.strip_prefix('x').and_then(|f| f.parse::<f64>().ok());
    let new: serde_norway::Value = match factor {
        Some(_) => serde_norway::Value::Null, // filled in below from the current value
        None => serde_norway::from_str(value).map_err(|e| err(format!("bad value `{value}`: {e}"), "give a YAML value"))?,
    };
    let keys: Vec<&str> = path.split('.').collect();
    let top_level = doc.get(keys[0]).is_some() || ["name", "seed", "seeds", "policies"].contains(&keys[0]);
    let world = ["dispatch", "cluster", "compound"].into_iter().find(|k| doc.get(k).is_some()).unwrap_or("dispatch");
    let mut full: Vec<&str> = if top_level { Vec::new() } else { vec![world] };
    full.extend(keys);
    let mut at = doc;
    for (i, k) in full.iter().enumerate() {
        let map = at.as_mapping_mut().ok_or_else(|| err(format!("`{}` is not a mapping", full[..i].join(".")), "set a field inside a mapping"))?;
        let key = serde_norway::Value::String(k.to_string());
        if i + 1 == full.len() {
            let new = match factor {
                Some(f) => {
                    let current = map.get(&key).and_then(serde_norway::Value::as_f64).ok_or_else(|| {
                        err(format!("`{value}` scales the current value, but the field has no number"), "give a plain value")
                    })?;
                    serde_norway::Value::from(current * f)
                }
                None => new.clone(),
            };
            map.insert(key, new);
            break;
        }
        at = map.entry(key).or_insert_with(|| serde_norway::Value::Mapping(Default::default()));
    }
    Ok(())
}

/// Splits `a,b{x: 1, y: 2},c` at top-level commas.
pub fn split_policies(arg: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut cur = String::new();
    for c in arg.chars() {
        match c {
            '{' | '[' => depth += 1,
            '}' | ']' => depth -= 1,
            ',' if depth == 0 => {
                if !cur.trim().is_empty() {
                    out.push(cur.trim().to_string());
                }
                cur.clear();
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_split_at_top_level_commas_only() {
        assert_eq!(
            split_policies("random, power_of_two{d: 3, x: [1, 2]},./lib.so:x"),
            vec!["random", "power_of_two{d: 3, x: [1, 2]}", "./lib.so:x"]
        );
    }
}
