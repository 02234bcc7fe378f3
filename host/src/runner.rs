//! Runs workloads × policies × seeds and collects results; the one place that knows how each
//! world is driven. Nothing here prints: progress goes to a callback, results to the caller.

use std::path::{Path, PathBuf};

use routelab_policy_api::{RouterContext, World};
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
    }
}

/// Input the worlds need besides the workload itself, read once (e.g. a trace file).
pub struct Prepared {
    pub workload: Workload,
    pub notes: Vec<String>,
    trace_times: Option<Vec<f64>>,
}

/// Resolves files a workload names (relative to the workload's folder) and derived facts.
pub fn prepare(workload: Workload, file: &Path) -> Result<Prepared, InputError> {
    let mut notes = Vec::new();
    let mut trace_times = None;
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
            trace_times = Some(rows.iter().map(|r| r.at_s).collect());
        }
    }
    Ok(Prepared { workload, notes, trace_times })
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

/// Runs one policy on one seed.
fn run_one(loader: &mut Loader, prepared: &Prepared, spec: &PolicySpec, run_seed: u64) -> Result<Metrics, Failure> {
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
            let mut m = sim::dispatch::run(d, prepared.trace_times.as_deref(), &mut router, &spec.label, run_seed)
                .map_err(Failure::Run)?;
            append_reports(&mut m, router.report().into_result().map_err(|e| Failure::Run(RunError(e.into())))?);
            Ok(m)
        }
        other => Err(Failure::Run(RunError(format!("the {} world is not built yet", other.as_str())))),
    }
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
        let mut error = None;
        let mut input_error = false;
        for k in 0..w.seeds {
            match run_one(loader, prepared, spec, seed_for(w.seed, k)) {
                Ok(m) => per_seed.push(m),
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
            error,
            input_error,
        });
        on_result(&out);
    }
    out
}

/// A copy of `w` with the field at dotted `path` set to `value` (YAML text). The path may start
/// inside the world section: `arrivals.rate` means `cluster.arrivals.rate` in a cluster workload.
pub fn with_field(w: &Workload, file: &Path, path: &str, value: &str) -> Result<Workload, InputError> {
    let err = |message: String, fix: &str| InputError {
        file: file.into(),
        path: path.into(),
        line: None,
        message,
        fix: fix.into(),
    };
    let mut doc = serde_norway::to_value(w).map_err(|e| err(e.to_string(), "report this"))?;
    let new: serde_norway::Value = serde_norway::from_str(value).map_err(|e| err(format!("bad value `{value}`: {e}"), "give a YAML value"))?;
    let keys: Vec<&str> = path.split('.').collect();
    let top_level = doc.get(keys[0]).is_some() || ["name", "seed", "seeds", "policies"].contains(&keys[0]);
    let mut full: Vec<&str> = if top_level { Vec::new() } else { vec![w.world().as_str()] };
    full.extend(keys);
    let mut at = &mut doc;
    for (i, k) in full.iter().enumerate() {
        let map = at.as_mapping_mut().ok_or_else(|| err(format!("`{}` is not a mapping", full[..i].join(".")), "set a field inside a mapping"))?;
        let key = serde_norway::Value::String(k.to_string());
        if i + 1 == full.len() {
            map.insert(key, new.clone());
            break;
        }
        at = map.entry(key).or_insert_with(|| serde_norway::Value::Mapping(Default::default()));
    }
    let text = serde_norway::to_string(&doc).map_err(|e| err(e.to_string(), "report this"))?;
    crate::workload::parse(&text, file).map(|mut out| {
        out.name = w.name.clone();
        out
    })
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
