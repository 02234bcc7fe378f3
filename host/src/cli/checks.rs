//! Checks of the command line against the workloads, made before any run: an option that the
//! workload cannot use is an error (exit 2), never silently ignored.

use std::path::Path;

use routelab_policy_api::PolicyKind;

use super::args::Common;
use routelab_core::plugin::{LoadError, Loader, PolicySpec};
use routelab_core::runner::{self, Part, Prepared};
use routelab_core::workload::{InputError, Workload, WorldKind};

/// Parses policy arguments; two policies may not share a label.
pub fn specs(args: &[String]) -> Result<Vec<PolicySpec>, LoadError> {
    let specs: Vec<PolicySpec> = args.iter().map(|a| PolicySpec::parse(a)).collect::<Result<_, _>>()?;
    for (i, s) in specs.iter().enumerate() {
        if let Some(other) = specs[..i].iter().find(|o| o.label == s.label) {
            return Err(LoadError::new(
                routelab_core::plugin::LoadErrorKind::UnknownPolicy,
                format!("policies '{}' and '{}' would both be labelled '{}'", other.arg, s.arg, s.label),
                "give one a label: mine=path/to/lib.so:name",
            ));
        }
    }
    Ok(specs)
}

/// `--columns`: metric keys the workload's world reports (or a policy's `router.`/`scheduler.`
/// figure), each spelt as the table will look it up.
fn table_columns(w: &Workload, columns: &[String]) -> Result<(), InputError> {
    let mut keys = crate::capacity::expr::known_keys(w.world());
    match w.world() {
        WorldKind::Cluster => {
            keys.extend(routelab_core::metrics::PD_KEYS.iter().chain(routelab_core::metrics::LORA_KEYS))
        }
        WorldKind::Compound => keys.extend(crate::report::COLUMNS.iter().map(|c| c.key)),
        WorldKind::Dispatch => {}
    }
    for c in columns {
        if crate::capacity::expr::resolve(c, &keys).as_deref() != Some(c.as_str()) {
            let hint = routelab_core::suggest::did_you_mean(c, keys.iter().copied());
            return Err(InputError::new(
                "--columns",
                format!("`{c}` is not a metric key of the {} world{hint}", w.world().as_str()),
                "give metric keys as `--json` writes them (`routelab docs output` lists them), comma-separated",
            ));
        }
    }
    Ok(())
}

/// `--start`, `--all-starts` and `--trace` only where the workload has a use for them.
pub fn overrides(w: &Workload, file: &Path, common: &Common) -> Result<(), InputError> {
    let shown = file.display();
    if common.start.is_some() && w.compound.is_none() {
        return Err(InputError::new(
            "--start",
            format!(
                "{shown} is a {} workload; --start sets a compound workload's starting allocation",
                w.world().as_str()
            ),
            "drop --start, or pass a workload with a `compound:` section",
        ));
    }
    if common.slo.is_some() && w.cluster.is_none() {
        return Err(InputError::new(
            "--slo",
            format!(
                "{shown} is a {} workload; --slo bounds the TTFT, TPOT and latency of a cluster workload's requests",
                w.world().as_str()
            ),
            "drop --slo, or pass a workload with a `cluster:` section",
        ));
    }
    if (common.exact || common.sketch) && w.cluster.is_none() {
        let flag = if common.exact { "--exact" } else { "--sketch" };
        return Err(InputError::new(
            flag,
            format!(
                "{shown} is a {} workload; {flag} chooses how a cluster workload's requests are summarised",
                w.world().as_str()
            ),
            format!("drop {flag}, or pass a workload with a `cluster:` section"),
        ));
    }
    if let Some(columns) = &common.columns {
        table_columns(w, columns)?;
    }
    if let Some(t) = &common.trace {
        let replays = match (&w.dispatch, &w.cluster) {
            (Some(d), _) => matches!(d.arrivals, routelab_core::workload::dispatch::Arrivals::Trace { .. }),
            (_, Some(c)) => matches!(c.arrivals, routelab_core::workload::cluster::Arrivals::Trace { .. }),
            _ => false,
        };
        if !replays {
            return Err(InputError::new(
                "--trace",
                format!("{shown} does not replay a trace, so --trace {} would be ignored", t.display()),
                "use a workload with `arrivals: {trace: {path: ...}}` (e.g. azure_conv), or drop --trace",
            ));
        }
    }
    Ok(())
}

/// The kind of policy a world's `--policies` name.
pub fn kind_of_world(world: WorldKind) -> PolicyKind {
    match world {
        WorldKind::Dispatch | WorldKind::Cluster => PolicyKind::Router,
        WorldKind::Compound => PolicyKind::Selector,
    }
}

/// `router@scheduler` only in the cluster world, the one with local schedulers.
pub fn pairings(w: &Workload, specs: &[PolicySpec]) -> Result<(), InputError> {
    if w.world() == WorldKind::Cluster {
        return Ok(());
    }
    match specs.iter().find(|s| s.scheduler.is_some()) {
        Some(s) => Err(InputError::new(
            "--policies",
            format!(
                "'{}' names a local scheduler, but {} is a {} workload, which has none",
                s.arg,
                w.name,
                w.world().as_str()
            ),
            "drop `@…`: only cluster workloads run schedulers",
        )),
        None => Ok(()),
    }
}

/// Every policy a workload names — `policies:`, `cluster.scheduler`, `cluster.admission`,
/// `cluster.autoscaling.scaler` — exists and is of the
/// right kind (`validate`).
pub fn policy_names(loader: &mut Loader, w: &Workload, file: &Path) -> Result<(), InputError> {
    let at = |field: String, e: LoadError| InputError::new(file, e.message, e.fix).in_field(field);
    let specs = specs(&w.policies).map_err(|e| at("policies".into(), e))?;
    pairings(w, &specs).map_err(|e| InputError::new(file, e.message, e.fix).in_field("policies").at_line(e.line))?;
    for (i, s) in specs.iter().enumerate() {
        loader.check(s, kind_of_world(w.world())).map_err(|e| at(format!("policies[{i}]"), e))?;
    }
    if let Some(c) = &w.cluster {
        let s = PolicySpec::parse(&c.scheduler).map_err(|e| at("cluster.scheduler".into(), e))?;
        loader.check(&s, PolicyKind::Scheduler).map_err(|e| at("cluster.scheduler".into(), e))?;
        let a = PolicySpec::parse(&c.admission).map_err(|e| at("cluster.admission".into(), e))?;
        loader.admission_factory(&a).map_err(|e| at("cluster.admission".into(), e))?;
        if let Some(auto) = &c.autoscaling {
            let field = || "cluster.autoscaling.scaler".to_string();
            let s = PolicySpec::parse(&auto.scaler).map_err(|e| at(field(), e))?;
            loader.scaler_factory(&s).map_err(|e| at(field(), e))?;
        }
    }
    Ok(())
}

/// Every policy a workload names is built as `compare` builds it for its first seed (config,
/// context and every replica's scheduler), so `validate` refuses what a run would
/// ([`runner::check_builds`]); a cluster workload without `policies:` still has its
/// `cluster.scheduler` built (beside a stand-in `round_robin`).
pub fn policy_builds(loader: &mut Loader, prepared: &Prepared, file: &Path) -> Result<(), InputError> {
    let w = &prepared.workload;
    policy_names(loader, w, file)?;
    let mut specs = specs(&w.policies).expect("checked by policy_names");
    let stand_in = specs.is_empty() && w.cluster.is_some();
    if stand_in {
        specs.push(PolicySpec::parse("round_robin").expect("a built-in router"));
    }
    for (i, s) in specs.iter().enumerate() {
        let Err((part, e)) = runner::check_builds(loader, prepared, s) else { continue };
        let field = if part == Part::Scheduler && s.scheduler.is_none() {
            "cluster.scheduler".to_string()
        } else {
            format!("policies[{i}]")
        };
        return Err(InputError::new(file, e.message, e.fix).in_field(field));
    }
    Ok(())
}

/// A policy name the scaffold can use as a Rust-friendly identifier and a CLI argument.
pub fn new_policy_name(name: &str) -> Result<(), InputError> {
    let ok = name.chars().next().is_some_and(|c| c.is_ascii_lowercase())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if ok {
        return Ok(());
    }
    Err(InputError::new(
        "--name",
        format!("'{name}' cannot be a policy name"),
        "use lowercase letters, digits and `_`, starting with a letter (e.g. my_router)",
    ))
}
