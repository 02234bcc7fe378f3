//! Running a round of shapes: each shape's workload, prepared once and shared by the routers
//! asked of it, and every (shape, router, seed) cell on `-j` threads through
//! `runner::parallel` — the runner `compare` uses, so a plan's figures are the ones `compare`
//! would print for that shape, whatever the thread count.

use std::path::Path;

use super::{Batch, Evaluation, Line, Role};
use crate::capacity::expr::{self, Target};
use routelab_core::error::Error;
use routelab_core::metrics::{Metrics, over_seeds};
use routelab_core::plugin::{Loader, PolicySpec};
use routelab_core::runner::parallel::{self, Event, Planned, PolicyOutput};
use routelab_core::runner::{self, CellError, Prepared};
use routelab_core::step_model::{Choice, Gpu};
use routelab_core::workload::cluster::autoscaling::{Autoscaling, PdPools, PoolBounds};
use routelab_core::workload::cluster::pools::GpuPool;
use routelab_core::workload::{InputError, Workload};

/// What every shape shares.
pub struct Problem<'a> {
    /// The workload as given (its SLO bounds set from `--slo`).
    pub workload: &'a Workload,
    pub file: &'a Path,
    pub target: &'a Target,
    /// Each line's router, by line index.
    pub specs: &'a [PolicySpec],
    /// Each line's GPU as the workload writes it (a catalog name or the workload's own mapping).
    pub gpus: &'a [Choice<Gpu>],
    /// Worker threads.
    pub jobs: usize,
}

/// Why a shape cannot run: it fails unrun, with this as its note.
#[derive(Debug, Clone, PartialEq)]
pub struct Unrunnable(pub String);

impl std::fmt::Display for Unrunnable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The workload of `line` at `replicas`, or why the shape cannot run (it fails unrun).
pub fn shape(p: &Problem, i: usize, line: &Line, replicas: u32) -> Result<Workload, Unrunnable> {
    let mut w = p.workload.clone();
    if let Some(d) = w.dispatch.as_mut() {
        // The load stays the workload's: λ = ρ·N requests per unit time.
        let lambda = d.utilisation * f64::from(d.servers);
        let rho = lambda / f64::from(replicas);
        if rho >= 1.0 {
            return Err(Unrunnable(format!(
                "unstable: the arrival rate {lambda} needs more than {replicas} servers (ρ = {rho:.3} ≥ 1)"
            )));
        }
        d.servers = replicas;
        d.utilisation = rho;
    }
    if let Some(c) = w.cluster.as_mut() {
        c.gpu = p.gpus[i].clone();
        c.tp = line.tp;
        c.replicas = replicas;
        c.pools = Vec::new();
        match &line.fixed {
            // A P/D split: `count` prefill instances, `replicas` decode ones, every pool on the
            // line's GPU and tp (a `mixed` pool kept at its size).
            Some(f) if f.role == Role::Prefill => {
                let Some(d) = c.disaggregation.as_mut() else {
                    return Err(Unrunnable("a prefill/decode line needs a `disaggregation:` workload".into()));
                };
                d.prefill.instances = f.count;
                d.decode.instances = replicas;
                let mut all = f.count + replicas;
                for pool in [Some(&mut d.prefill), Some(&mut d.decode), d.mixed.as_mut()].into_iter().flatten() {
                    pool.gpu = None;
                    pool.tp = None;
                }
                all += d.mixed.as_ref().map_or(0, |m| m.instances);
                c.replicas = all;
            }
            // Two GPU types: the line's `replicas` first, then `count` of the second, each pool
            // priced per replica.
            Some(f) => {
                let second = f.choice.clone().unwrap_or_else(|| Choice::Name(f.gpu.clone()));
                c.pools = vec![
                    GpuPool {
                        gpu: p.gpus[i].clone(),
                        tp: Some(line.tp),
                        replicas,
                        cost_per_hour: Some(line.replica_price),
                    },
                    GpuPool {
                        gpu: second,
                        tp: Some(f.tp),
                        replicas: f.count,
                        cost_per_hour: Some(f.cost_per_hour / f64::from(f.count.max(1))),
                    },
                ];
                c.replicas = replicas + f.count;
            }
            None => {}
        }
        match &line.scaler {
            Some(scaler) => {
                let base = c.autoscaling.clone();
                let mut a = Autoscaling {
                    scaler: scaler.clone(),
                    max_replicas: replicas,
                    min_replicas: base.as_ref().map_or(1, |a| a.min_replicas).min(replicas),
                    ..base.unwrap_or_else(|| default_autoscaling(scaler))
                };
                // A P/D shape's counts are its pools' budgets: each pool starts full and scales
                // within [its own `min_replicas` (default 1), its count], both within their sum.
                if let (Some(d), Some(f)) = (&c.disaggregation, line.fixed.as_ref().filter(|f| f.role == Role::Prefill))
                {
                    let own = a.pools.take();
                    let bound = |min: Option<u32>, count: u32| PoolBounds {
                        min_replicas: min.unwrap_or(1).min(count),
                        max_replicas: count,
                    };
                    a.pools = Some(PdPools {
                        prefill: bound(own.as_ref().map(|p| p.prefill.min_replicas), d.prefill.instances),
                        decode: bound(own.as_ref().map(|p| p.decode.min_replicas), d.decode.instances),
                    });
                    a.min_replicas = 1;
                    a.max_replicas = f.count + replicas;
                }
                c.autoscaling = Some(a);
                c.cost_per_hour = Some(line.replica_price);
            }
            None => c.autoscaling = None,
        }
    }
    Ok(w)
}

/// `cluster.autoscaling`'s defaults around `scaler`.
fn default_autoscaling(scaler: &str) -> Autoscaling {
    let yaml = format!("{{scaler: '{}', max_replicas: 1}}", scaler.replace('\'', "''"));
    serde_norway::from_str(&yaml).expect("an autoscaling section with its defaults")
}

/// One (shape, router)'s figures: the mean over seeds and whether the SLO holds.
fn judge(p: &Problem, line: &Line, replicas: u32, per_seed: &[Metrics]) -> Result<Evaluation, Error> {
    let missing = |expr::MissingMetric(m): expr::MissingMetric| {
        Error::from(
            InputError::new(
                "--slo",
                format!("policy {} does not report `{m}`", line.policy),
                "bound a metric every policy reports (`routelab docs output`)",
            )
            .in_field(m),
        )
    };
    let unfinished = |m: &Metrics| m.get("unfinished").is_some_and(|u| u > 0.0);
    let mut seeds_holding = 0;
    for m in per_seed {
        if p.target.holds(m).map_err(missing)? && !unfinished(m) {
            seeds_holding += 1;
        }
    }
    let metrics = over_seeds(per_seed);
    let holds = p.target.holds(&metrics).map_err(missing)? && !per_seed.iter().any(unfinished);
    let cost_per_hour = match (&line.scaler, metrics.get("replicas_mean")) {
        (Some(_), Some(mean)) => line.scaled_cost(mean),
        _ => line.cost(f64::from(replicas)),
    };
    Ok(Evaluation {
        replicas,
        cost_per_hour,
        holds,
        seeds_holding,
        margin: super::margin(p.target, &metrics),
        metrics,
        note: None,
    })
}

/// Runs the asked (line, replicas) shapes, every seed of each, on `p.jobs` threads.
pub fn evaluate_batch(loader: &mut Loader, p: &Problem, lines: &[Line], asks: &[(usize, u32)]) -> Result<Batch, Error> {
    let mut out: Vec<Option<Result<Evaluation, CellError>>> = vec![None; asks.len()];
    // One prepared workload per distinct shape (the routers asked of it share its streams).
    let mut shapes: Vec<(Workload, Vec<usize>)> = Vec::new();
    for (a, &(i, r)) in asks.iter().enumerate() {
        match shape(p, i, &lines[i], r) {
            Err(why) => out[a] = Some(Ok(unrun(&lines[i], r, why.0))),
            Ok(w) => match shapes.iter_mut().find(|(s, _)| *s == w) {
                Some((_, asked)) => asked.push(a),
                None => shapes.push((w, vec![a])),
            },
        }
    }
    let mut prepared: Vec<(Prepared, Vec<usize>)> = Vec::new();
    for (w, asked) in shapes {
        match runner::prepare(w, p.file) {
            Ok(pr) => prepared.push((pr, asked)),
            // The workload refuses this shape (it does not fit the GPU, say): it fails unrun.
            Err(e) => {
                for a in asked {
                    let (i, r) = asks[a];
                    out[a] = Some(Ok(unrun(&lines[i], r, format!("refused: {}", e.message))));
                }
            }
        }
    }
    let plan: Vec<Planned> = prepared
        .iter()
        .map(|(pr, asked)| {
            let specs = asked.iter().map(|&a| p.specs[asks[a].0].clone()).collect();
            Planned::new(loader, pr, specs, false)
        })
        .collect();
    let opts = parallel::Options { jobs: p.jobs.max(1), shard: None, isolate: None };
    let mut failure: Option<Error> = None;
    parallel::run(&plan, &opts, &mut |event| {
        let Event::PolicyDone { w, p: k, output } = event else { return };
        let a = prepared[w].1[k];
        let (i, r) = asks[a];
        let PolicyOutput::Cells(cells) = output else { unreachable!("plan never isolates") };
        if let Some(e) = cells.iter().find_map(|c| c.error.as_ref()) {
            if e.input_error {
                failure.get_or_insert_with(|| {
                    Error::from(InputError::new(
                        p.file,
                        e.message.clone(),
                        "check the workload with `routelab validate`",
                    ))
                });
            } else {
                out[a] = Some(Err(e.clone()));
            }
            return;
        }
        let per_seed: Vec<Metrics> = cells.iter().map(|c| c.metrics.clone()).collect();
        match judge(p, &lines[i], r, &per_seed) {
            Ok(e) => out[a] = Some(Ok(e)),
            Err(e) => {
                failure.get_or_insert(e);
            }
        }
    });
    if let Some(e) = failure {
        return Err(e);
    }
    Ok(out.into_iter().map(|o| o.expect("every asked shape is judged")).collect())
}

/// A shape that fails without a run, and why.
fn unrun(line: &Line, replicas: u32, why: String) -> Evaluation {
    Evaluation {
        replicas,
        cost_per_hour: line.cost(f64::from(replicas)),
        holds: false,
        seeds_holding: 0,
        margin: f64::NAN,
        metrics: Metrics::new(),
        note: Some(why),
    }
}
