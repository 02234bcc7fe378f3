//! Whole-space computations on one world: the exhaustive optimum, the training-accuracy table,
//! a selector run from every starting allocation, and the evaluation benchmark.

use std::fmt::Write;

use routelab_policy_api::SelectorBox;

use super::world::{Split, World};
use super::{CompoundOutcome, select_and_score};
use crate::error::RunError;
use crate::plugin::LoadError;
use crate::workload::compound::CompoundSpec;

/// Largest space [`best_allocation`] enumerates.
pub const STUDY_SPACE_LIMIT: u64 = 1_000_000;
/// Largest space [`all_starts`] starts from every allocation of.
pub const ALL_STARTS_LIMIT: u64 = 10_000;

/// Every allocation in lexicographic order (module 0 most significant), `f` on each.
fn for_each_allocation(models: usize, modules: usize, mut f: impl FnMut(&[u32])) {
    let mut a = vec![0u32; modules];
    loop {
        f(&a);
        let mut j = modules;
        loop {
            if j == 0 {
                return;
            }
            j -= 1;
            a[j] += 1;
            if (a[j] as usize) < models {
                break;
            }
            a[j] = 0;
        }
    }
}

/// The allocation that answers the most training questions (the first in lexicographic order on
/// ties) and that count; `None` above [`STUDY_SPACE_LIMIT`] allocations.
pub fn best_allocation(world: &World) -> Option<(Vec<u32>, usize)> {
    if world.space()? > STUDY_SPACE_LIMIT {
        return None;
    }
    let mut best: Option<(Vec<u32>, usize)> = None;
    for_each_allocation(world.models.len(), world.modules(), |a| {
        let c = world.correct_count(a, Split::Train);
        if best.as_ref().is_none_or(|(_, b)| c > *b) {
            best = Some((a.to_vec(), c));
        }
    });
    best
}

/// The training-accuracy table of one seed: for a 2-module system the full K×K table (rows: the
/// first module's model, columns: the second's); otherwise the ten best allocations.
pub fn training_table(spec: &CompoundSpec, run_seed: u64) -> String {
    let world = World::new(spec, run_seed);
    let modules = world.system.modules();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "training accuracy of every allocation ({}, seed {run_seed}, {} training questions)",
        world.system.as_str(),
        world.train
    );
    if modules.len() == 2 {
        let corner = format!("{} \\ {}", modules[0].0, modules[1].0);
        let _ = write!(out, "{corner:<16}");
        for m in &world.models {
            let _ = write!(out, "{:>8}", m.name);
        }
        out.push('\n');
        for (r, row_model) in world.models.iter().enumerate() {
            let _ = write!(out, "{:<16}", row_model.name);
            for c in 0..world.models.len() {
                let _ = write!(out, "{:>8.3}", world.accuracy(&[r as u32, c as u32], Split::Train));
            }
            out.push('\n');
        }
        return out;
    }
    if world.space().is_none_or(|n| n > STUDY_SPACE_LIMIT) {
        let _ = writeln!(out, "(the space is above {STUDY_SPACE_LIMIT} allocations: not enumerated)");
        return out;
    }
    let mut all: Vec<(usize, Vec<u32>)> = Vec::new();
    for_each_allocation(world.models.len(), modules.len(), |a| {
        all.push((world.correct_count(a, Split::Train), a.to_vec()))
    });
    // Stable sort: equal accuracies stay in lexicographic order.
    all.sort_by_key(|x| std::cmp::Reverse(x.0));
    let _ = writeln!(
        out,
        "the ten best of {} allocations ({}):",
        all.len(),
        modules.iter().map(|m| m.0).collect::<Vec<_>>().join(", ")
    );
    for (correct, a) in all.iter().take(10) {
        let _ = writeln!(out, "  {:<24} {:.3}", world.names(a).join(","), *correct as f64 / world.train as f64);
    }
    out
}

/// A selector run from every starting allocation of a small system.
#[derive(Clone, Debug, PartialEq)]
pub struct AllStarts {
    pub starts: usize,
    /// Runs whose choice answers as many training questions as the best allocation.
    pub successes: usize,
    /// Starting allocations (model names) from which the selector did not reach the optimum.
    pub failed_from: Vec<Vec<String>>,
    /// The best allocation by training accuracy (the first in lexicographic order on ties).
    pub optimum: Vec<String>,
    pub optimum_train_accuracy: f64,
    /// Mean evaluated allocations per run.
    pub mean_evaluations: f64,
}

/// Runs a fresh selector from `make_selector` from every one of the K^L starting allocations of
/// `spec` (at most [`ALL_STARTS_LIMIT`]) on seed `run_seed`, and counts how often it reaches the
/// global optimum of the training set.
pub fn all_starts(
    spec: &CompoundSpec,
    make_selector: &dyn Fn() -> Result<SelectorBox, LoadError>,
    run_seed: u64,
) -> Result<AllStarts, RunError> {
    let world = World::new(spec, run_seed);
    let space = world.space().filter(|&n| n <= ALL_STARTS_LIMIT).ok_or_else(|| {
        RunError::Run(format!(
            "{} models ^ {} modules is above {ALL_STARTS_LIMIT} starting allocations; use a smaller pool or system",
            world.models.len(),
            world.modules()
        ))
    })?;
    let (optimum, optimum_correct) = best_allocation(&world).expect("space checked");
    let mut result = AllStarts {
        starts: space as usize,
        successes: 0,
        failed_from: Vec::new(),
        optimum: world.names(&optimum),
        optimum_train_accuracy: optimum_correct as f64 / world.train as f64,
        mean_evaluations: 0.0,
    };
    let mut starts = Vec::with_capacity(space as usize);
    for_each_allocation(world.models.len(), world.modules(), |a| starts.push(a.to_vec()));
    let mut evaluations = 0.0;
    for start in starts {
        let mut selector = make_selector().map_err(|e| RunError::Run(e.to_string()))?;
        let CompoundOutcome { metrics, .. } = select_and_score(
            &world,
            spec.budget,
            &mut selector,
            "selector",
            Some(start.clone()),
            Some(optimum_correct),
        )?;
        evaluations += metrics.get("evaluations").unwrap_or(0.0);
        if metrics.get("gap_to_exhaustive") == Some(0.0) {
            result.successes += 1;
        } else {
            result.failed_from.push(world.names(&start));
        }
    }
    result.mean_evaluations = evaluations / space as f64;
    Ok(result)
}
