//! What `capacity` and `plan` share: the workload, the SLO, the routers and the seeds they search
//! over, given by the same flags and read and checked one way (exit 2 naming the flag, before
//! any run).

use std::path::{Path, PathBuf};

use anyhow::Result;

pub use super::args::SloArgs;
use super::checks;
use crate::capacity::expr::{self, Target};
use routelab_core::plugin::PolicySpec;
use routelab_core::runner::{self, RunOptions};
use routelab_core::workload::{self, InputError, Workload};

/// The workload (seeds applied, SLO bounds set from `--slo`), the SLO and the routers.
pub struct Setup {
    pub file: PathBuf,
    pub workload: Workload,
    pub target: Target,
    pub specs: Vec<PolicySpec>,
    /// Worker threads.
    pub jobs: usize,
}

/// A bad flag: `path` narrows it (an item of its list), `fix` says what would do.
pub fn flag_error(
    flag: &str,
    path: impl Into<String>,
    message: impl Into<String>,
    fix: impl Into<String>,
) -> InputError {
    InputError::new(flag, message, fix).in_field(path)
}

/// Reads and checks the workload, the SLO and the policies. `world` checks the workload is one
/// the command can search (before the SLO is read, so a workload of the wrong kind is named as
/// such) and returns what the command needs of it.
pub fn load<T>(a: &SloArgs, world: impl FnOnce(&Workload, &Path) -> Result<T, InputError>) -> Result<(Setup, T)> {
    let file = routelab_core::builtin::resolve(&a.workload)?;
    let mut w = workload::load(&file)?;
    RunOptions { seed: a.seed, seeds: a.seeds, ..Default::default() }.apply(&mut w);
    let of_world = world(&w, &file)?;
    let target = expr::parse(&a.slo, &w).map_err(|e| flag_error("--slo", e.path, e.message, e.fix))?;
    if let (Some(bounds), Some(c)) = (&target.bounds, w.cluster.as_mut()) {
        c.slo = Some(bounds.clone());
    }
    let specs = match &a.policies {
        Some(p) => checks::specs(&runner::split_policies(p))?,
        None => checks::specs(&w.policies)?,
    };
    if specs.is_empty() {
        return Err(flag_error(
            "--policies",
            "",
            format!("{} names no policies", file.display()),
            "pass --policies a,b,c or list `policies:` in the workload",
        )
        .into());
    }
    checks::pairings(&w, &specs)?;
    let jobs = a.jobs.map_or_else(runner::parallel::all_cores, |j| j as usize);
    Ok((Setup { file, workload: w, target, specs, jobs }, of_world))
}
