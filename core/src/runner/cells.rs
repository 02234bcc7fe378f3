//! Cells: one policy on one seed of one workload, the unit that runs in parallel and that
//! `--shard` splits. A [`Cell`] holds everything the summary of a policy needs, so a policy's
//! [`PolicyResult`] is [`assemble`]d from its cells the same way whether they ran in this process,
//! on other threads or on other machines (`routelab merge` reads them back from partial JSON).

use serde::{Deserialize, Serialize};

use super::{PolicyResult, Prepared, ResolvedPolicy, SeedInput, run_one_detailed};
use crate::error::Error;
use crate::metrics::{Detail, Metrics, over_seeds};

/// Where a cell's error came from; it decides which error a policy reports (see [`assemble`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    /// Generating the seed's input (bad input, shared by every policy on that seed).
    Input,
    /// Resolving the policy (unknown name, bad config, missing library).
    Policy,
    /// The run itself.
    Run,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CellError {
    pub stage: Stage,
    pub message: String,
    /// Bad input (exit code 2) rather than a failing policy (exit code 1).
    pub input_error: bool,
}

impl CellError {
    pub fn new(stage: Stage, e: &Error) -> Self {
        Self { stage, message: e.to_string(), input_error: e.exit_code() == 2 }
    }
}

/// One policy's outcome on one seed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Cell {
    /// The seed's index, 0-based (the seed itself is `seed_for(workload.seed, seed_index)`).
    pub seed_index: u32,
    #[serde(default, skip_serializing_if = "is_empty")]
    pub metrics: Metrics,
    /// Compound world: the allocation chosen.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allocation: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<CellError>,
    /// Seed index 0 only: the run's latency distribution and replica timeline, for charts. Not
    /// in partial JSON (a merged result has its figures, not its charts' detail).
    #[serde(skip)]
    pub detail: Option<Box<Detail>>,
}

fn is_empty(m: &Metrics) -> bool {
    m.0.is_empty()
}

impl Cell {
    pub fn failed(seed_index: u32, stage: Stage, e: &Error) -> Self {
        let error = Some(CellError::new(stage, e));
        Self { seed_index, metrics: Metrics::new(), allocation: Vec::new(), error, detail: None }
    }
}

/// Runs `policy` on seed `seed_index`, given what the seed's input and the policy's resolution
/// came to (their errors become the cell's).
pub fn run_cell(
    prepared: &Prepared,
    policy: Result<&ResolvedPolicy, &Error>,
    input: Result<&SeedInput, &Error>,
    seed_index: u32,
) -> Cell {
    let input = match input {
        Ok(i) => i,
        Err(e) => return Cell::failed(seed_index, Stage::Input, e),
    };
    let policy = match policy {
        Ok(p) => p,
        Err(e) => return Cell::failed(seed_index, Stage::Policy, e),
    };
    // The first seed keeps its chart detail; the others skip the work.
    let run = if seed_index == 0 {
        run_one_detailed(policy, prepared, input)
    } else {
        super::run_one(policy, prepared, input).map(|o| (o, None))
    };
    match run {
        Ok(((metrics, allocation), detail)) => {
            Cell { seed_index, metrics, allocation, error: None, detail: detail.map(Box::new) }
        }
        Err(e) => Cell::failed(seed_index, Stage::Run, &e),
    }
}

/// A policy's result from its cells in seed order (`result` carries its label, spec and config).
/// The error reported is the first seed's input error if any seed's input failed (no figures:
/// the workload is at fault), else the policy's resolution error, else the first failed run
/// (with the figures of the seeds before it, as a sequential run stops there). Cells after a
/// failed run may be missing.
pub fn assemble(mut result: PolicyResult, cells: &[Cell]) -> PolicyResult {
    let first = |stage: Stage| cells.iter().filter_map(|c| c.error.as_ref()).find(|e| e.stage == stage);
    let error = match first(Stage::Input).or_else(|| first(Stage::Policy)) {
        Some(e) => Some(e.clone()),
        None => {
            let mut failed = None;
            for c in cells {
                if let Some(e) = &c.error {
                    failed = Some(e.clone());
                    break;
                }
                result.per_seed.push(c.metrics.clone());
                if c.seed_index == 0 {
                    result.detail = c.detail.clone();
                }
                if !c.allocation.is_empty() {
                    result.allocation.push(c.allocation.clone());
                }
            }
            failed
        }
    };
    match error {
        None => result.metrics = over_seeds(&result.per_seed),
        Some(e) => {
            result.input_error = e.input_error;
            result.error = Some(crate::builtin::shown(&e.message).into_owned());
        }
    }
    result
}
