//! `routelab capacity`: per policy, the highest load at which an SLO still holds.
//!
//! The load is the workload's arrival rate (cluster world, Poisson or gamma arrivals), a
//! multiplier of a replayed trace's speed (cluster world, trace arrivals: `time_scale` ÷ m), or
//! the utilisation ρ (dispatch world). Each load is run on the workload's seeds — the same seeds
//! at every load (common random numbers: arrival gaps and request sizes come from separate
//! streams, so a higher rate replays the same requests closer together), and the SLO
//! ([`expr::Target`]) is judged on the mean over seeds. A load also fails when any seed left
//! requests unfinished: percentiles over the finished ones would hide them.
//!
//! [`search`] brackets the answer from the workload's own load — doubling while the SLO holds,
//! halving while it fails (in the dispatch world ρ < 1, so the bracket starts at [ρ, 1)) — then
//! bisects until the bracket is narrower than `tolerance` × its top. It assumes the SLO holds
//! below some load and fails above it; the answer is the highest load seen to hold (`lo`), known
//! to lie below the lowest load seen to fail (`hi`).

pub mod expr;
pub mod page;
pub mod report;

use std::path::Path;

use serde::Serialize;

use expr::Target;
use routelab_core::error::Error;
use routelab_core::metrics::{Metrics, over_seeds};
use routelab_core::plugin::{Loader, PolicySpec};
use routelab_core::runner;
use routelab_core::workload::{FieldError, InputError, Workload, cluster, dispatch};

/// Doublings or halvings tried before giving up on a bracket (2^20 ≈ a million-fold).
const MAX_STEPS: u32 = 20;

/// What the search varies.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Knob {
    /// `cluster.arrivals.{poisson,gamma}.rate`, requests/s.
    Rate,
    /// A replayed trace's speed, × its rate at `time_scale` as written.
    TraceSpeed,
    /// `dispatch.utilisation`, in (0, 1).
    Utilisation,
}

impl Knob {
    /// The knob a workload's load is set by, and its value in the workload.
    pub fn of(w: &Workload) -> Result<(Knob, f64), FieldError> {
        if let Some(d) = &w.dispatch {
            if d.mode != dispatch::Mode::Queueing {
                return Err(FieldError::new(
                    "dispatch.mode",
                    "balls-into-bins has no load to raise",
                    "use a queueing dispatch workload or a cluster workload",
                ));
            }
            return Ok((Knob::Utilisation, d.utilisation));
        }
        if let Some(i) = w.cluster.as_ref().and_then(|c| c.classes.iter().position(|c| c.arrivals.is_some())) {
            return Err(FieldError::new(
                &format!("cluster.classes[{i}].arrivals"),
                "is the class's own arrival process, which a search of `cluster.arrivals`'s rate would leave as it is",
                "for a capacity search, give every class a `share` of the cluster's arrivals instead",
            ));
        }
        match w.cluster.as_ref().map(|c| &c.arrivals) {
            Some(
                cluster::Arrivals::Poisson { rate }
                | cluster::Arrivals::Gamma { rate, .. }
                | cluster::Arrivals::Diurnal { rate, .. },
            ) => Ok((Knob::Rate, *rate)),
            Some(cluster::Arrivals::Trace { .. }) => Ok((Knob::TraceSpeed, 1.0)),
            Some(cluster::Arrivals::Stages(_)) => Err(FieldError::new(
                "cluster.arrivals.stages",
                "steps its rate itself, so there is no one rate to search",
                "use `arrivals: {poisson: {rate: …}}` for a capacity search",
            )),
            None => Err(FieldError::new(
                "",
                "is a compound workload, which has no arrival rate",
                "pass a cluster or dispatch workload",
            )),
        }
    }

    /// `base` at load `x`.
    pub fn set(self, base: &Workload, x: f64) -> Workload {
        let mut w = base.clone();
        match (self, w.dispatch.as_mut(), w.cluster.as_mut().map(|c| &mut c.arrivals)) {
            (Knob::Utilisation, Some(d), _) => d.utilisation = x,
            (
                Knob::Rate,
                _,
                Some(
                    cluster::Arrivals::Poisson { rate }
                    | cluster::Arrivals::Gamma { rate, .. }
                    | cluster::Arrivals::Diurnal { rate, .. },
                ),
            ) => *rate = x,
            (Knob::TraceSpeed, _, Some(cluster::Arrivals::Trace { time_scale, .. })) => *time_scale /= x,
            _ => unreachable!("the knob was read from this workload"),
        }
        w
    }

    /// The top of the load's range, excluded (the dispatch world's queues are stable below ρ = 1).
    fn limit(self) -> Option<f64> {
        (self == Knob::Utilisation).then_some(1.0)
    }

    /// The axis label, with unit.
    pub fn label(self) -> &'static str {
        match self {
            Knob::Rate => "arrival rate [requests/s]",
            Knob::TraceSpeed => "trace speed [× the trace's rate]",
            Knob::Utilisation => "utilisation ρ",
        }
    }
}

/// Search settings.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Settings {
    /// Stop when `hi − lo ≤ tolerance × hi`.
    pub tolerance: f64,
    /// Most loads evaluated per policy.
    pub max_points: u32,
}

/// One evaluated load: the mean over seeds and whether the SLO held.
#[derive(Clone, Debug, Serialize)]
pub struct Point {
    pub load: f64,
    pub holds: bool,
    pub metrics: Metrics,
}

/// How a search ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// `lo` holds and `hi` fails, within the tolerance.
    Found,
    /// Stopped at `max_points` with the bracket still wider than the tolerance.
    Unresolved,
    /// Held at every load tried (`hi` is null: infinite, or the limit of the range).
    HoldsEverywhere,
    /// Failed at every load tried (`lo` is 0).
    FailsEverywhere,
}

/// A search's answer: the highest load seen to hold (`lo`) and the lowest seen to fail (`hi`).
#[derive(Clone, Debug, Serialize)]
pub struct Answer {
    pub status: Status,
    pub lo: f64,
    /// `f64::INFINITY` (null in JSON) when no load failed.
    pub hi: f64,
    /// In the order they were run.
    pub points: Vec<Point>,
    /// Why the search stopped short of a bracket: the workload refused a load, or the SLO
    /// failed even at the bottom of the range.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// A metric of the SLO that got better as the load grew near the answer: the answer may
    /// hinge on noise ([`Target::non_monotone`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

/// What running one load gave.
pub enum Evaluated {
    Ran(Point),
    /// The workload refuses this load (too many requests, a clock overflow, …): the end of the
    /// range in that direction; the message says why.
    OutOfRange(String),
}

/// Brackets then bisects, starting at `start`; `eval` runs one load.
pub fn search(
    start: f64,
    limit: Option<f64>,
    settings: Settings,
    eval: &mut dyn FnMut(f64) -> Result<Evaluated, Error>,
) -> Result<Answer, Error> {
    let mut points = Vec::new();
    let mut note = None;
    // Some(holds), or None when the load is out of range (the reason kept in `note`).
    let mut run = |x: f64, points: &mut Vec<Point>, note: &mut Option<String>| -> Result<Option<bool>, Error> {
        Ok(match eval(x)? {
            Evaluated::Ran(p) => {
                let holds = p.holds;
                points.push(p);
                Some(holds)
            }
            Evaluated::OutOfRange(why) => {
                *note = Some(why);
                None
            }
        })
    };
    let budget = settings.max_points.max(2) as usize;
    let (mut lo, mut hi) = (0.0, limit.unwrap_or(f64::INFINITY));
    let Some(first) = run(start, &mut points, &mut note)? else {
        return Err(Error::Input(InputError::new(
            "<capacity>",
            note.unwrap_or_default(),
            "check the workload with `routelab validate`",
        )));
    };
    if first {
        lo = start
    } else {
        hi = start;
        // Before halving 20 times: the bottom of the range, where requests barely overlap. An
        // SLO that fails there fails at every load (a TTFT bound below the bare prefill time,
        // say): said after two loads, not 21. One that holds there brackets the answer.
        let bottom = start / f64::from(1u32 << MAX_STEPS);
        if points.len() < budget {
            let mut refused = None;
            match run(bottom, &mut points, &mut refused)? {
                Some(true) => lo = bottom,
                Some(false) => {
                    let note = format!(
                        "the SLO fails even at load {bottom:.3e}, 2^-{MAX_STEPS} × the workload's, where requests \
                         barely wait for each other: no load meets it (loosen the SLO, or give the replicas more \
                         capacity)"
                    );
                    return Ok(Answer {
                        status: Status::FailsEverywhere,
                        lo: 0.0,
                        hi: bottom,
                        points,
                        note: Some(note),
                        warning: None,
                    });
                }
                // Too low a load for the workload (its clock, say): halve from the start instead.
                None => {}
            }
        }
    }
    // Double while it holds, or halve while it fails, until one load of each is known (a
    // limited range already has its top).
    let mut steps = 0;
    while (lo == 0.0 || hi.is_infinite()) && steps < MAX_STEPS && points.len() < budget {
        let x = if lo > 0.0 { lo * 2.0 } else { hi / 2.0 };
        match run(x, &mut points, &mut note)? {
            Some(true) => lo = x,
            Some(false) => hi = x,
            None => break,
        }
        steps += 1;
    }
    let bracketed = lo > 0.0 && hi.is_finite();
    while bracketed && hi - lo > settings.tolerance * hi && points.len() < budget {
        let x = (lo + hi) / 2.0;
        match run(x, &mut points, &mut note)? {
            Some(true) => lo = x,
            Some(false) => hi = x,
            None => break,
        }
    }
    let status = if lo == 0.0 {
        Status::FailsEverywhere
    } else if hi.is_infinite() || limit.is_some_and(|l| hi >= l && !points.iter().any(|p| !p.holds)) {
        Status::HoldsEverywhere
    } else if hi - lo > settings.tolerance * hi {
        Status::Unresolved
    } else {
        Status::Found
    };
    let note = note.map(|why| format!("the search stopped at a load the workload refuses: {why}"));
    Ok(Answer { status, lo, hi, points, note, warning: None })
}

/// One policy's capacity.
#[derive(Clone, Debug, Serialize)]
pub struct PolicyCapacity {
    pub policy: String,
    pub spec: String,
    #[serde(flatten)]
    pub answer: Option<Answer>,
    /// Simulation runs made: loads × seeds.
    pub runs: u64,
    /// Replaying a trace: the capacity `lo` in requests/s (× the report's `trace_rate_rps`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity_rps: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Everything a capacity search needs besides the policy.
pub struct Problem<'a> {
    pub workload: &'a Workload,
    pub file: &'a Path,
    pub knob: Knob,
    pub target: &'a Target,
    /// Threads running one load's seeds.
    pub jobs: usize,
}

/// The workload at load `x`, checked and prepared.
fn prepare_at(p: &Problem, x: f64) -> Result<runner::Prepared, InputError> {
    let w = p.knob.set(p.workload, x);
    runner::prepare(w, p.file).map_err(|mut e| {
        e.message = format!("at {} = {x}: {}", p.knob.label(), e.message);
        e
    })
}

/// Runs `spec` on every seed at load `x` and judges the SLO on the mean over seeds.
pub fn evaluate(loader: &mut Loader, p: &Problem, spec: &PolicySpec, x: f64) -> Result<Evaluated, Error> {
    let prepared = match prepare_at(p, x) {
        Ok(prepared) => prepared,
        Err(e) => return Ok(Evaluated::OutOfRange(e.to_string())),
    };
    let resolved = runner::resolve(loader, &prepared, spec)?;
    let per_seed = run_seeds(&resolved, &prepared, p.jobs)?;
    let metrics = over_seeds(&per_seed);
    let unfinished = per_seed.iter().any(|m| m.get("unfinished").is_some_and(|u| u > 0.0));
    let holds = p.target.holds(&metrics).map_err(|expr::MissingMetric(missing)| {
        InputError::new(
            "--slo",
            format!("policy {} does not report `{missing}`", spec.label),
            "bound a metric every policy reports (`routelab docs output`)",
        )
        .in_field(missing)
    })? && !unfinished;
    Ok(Evaluated::Ran(Point { load: x, holds, metrics }))
}

/// Every seed's run at one load, on up to `jobs` threads; in seed order whatever the thread
/// count (each run is a pure function of policy, workload and seed).
fn run_seeds(
    resolved: &runner::ResolvedPolicy,
    prepared: &runner::Prepared,
    jobs: usize,
) -> Result<Vec<Metrics>, Error> {
    let seeds = prepared.workload.seeds as usize;
    let next = std::sync::atomic::AtomicUsize::new(0);
    let slots: Vec<std::sync::Mutex<Option<Result<Metrics, Error>>>> =
        (0..seeds).map(|_| std::sync::Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..jobs.clamp(1, seeds.max(1)) {
            scope.spawn(|| {
                loop {
                    let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if k >= seeds {
                        break;
                    }
                    let run = prepared
                        .run_input(k as u32)
                        .map_err(Error::from)
                        .and_then(|input| runner::run_one(resolved, prepared, &input).map(|o| o.0));
                    *slots[k].lock().unwrap_or_else(|e| e.into_inner()) = Some(run);
                }
            });
        }
    });
    slots.into_iter().map(|s| s.into_inner().unwrap_or_else(|e| e.into_inner()).expect("every seed ran")).collect()
}

/// The capacity of one policy. A failing run (exit 1) becomes the policy's error; bad input
/// (exit 2) is returned.
pub fn of_policy(
    loader: &mut Loader,
    p: &Problem,
    spec: &PolicySpec,
    start: f64,
    s: Settings,
    progress: &dyn Fn(&Point),
) -> Result<PolicyCapacity, Error> {
    let mut runs = 0u64;
    let seeds = p.workload.seeds as u64;
    let answer = search(start, p.knob.limit(), s, &mut |x| {
        let e = evaluate(loader, p, spec, x)?;
        if let Evaluated::Ran(point) = &e {
            runs += seeds;
            progress(point);
        }
        Ok(e)
    });
    let (answer, error) = match answer {
        Ok(mut a) => {
            a.warning = p.target.non_monotone(&a.points, a.lo);
            (Some(a), None)
        }
        Err(e) if e.exit_code() == 2 => return Err(e),
        Err(e) => (None, Some(routelab_core::builtin::shown(&e.to_string()).into_owned())),
    };
    Ok(PolicyCapacity { policy: spec.label.clone(), spec: spec.arg.clone(), answer, runs, capacity_rps: None, error })
}

/// A condition of `target` no load can meet, found before any run: as (the condition, why, the
/// fix). A bound outside its metric's range (a time or count below 0, a share above 1); and in
/// the cluster world priced by the roofline, a TTFT or latency — or a per-request `ttft_s` or
/// `latency_s` that `slo_attainment`/`goodput_rps` then need — at or below the quickest step a
/// replica takes (a request's first token waits for at least one step, which reads the weights).
pub fn impossible(target: &Target, w: &Workload) -> Option<(String, String, String)> {
    let never_negative = |m: &str| !m.starts_with("router.") && !m.starts_with("scheduler.");
    let share = |m: &str| {
        m.ends_with("slo_attainment") || m.ends_with("hit_rate") || m.ends_with("_share") || m.ends_with("utilisation")
    };
    use expr::Op;
    for c in &target.conditions {
        let (m, b) = (c.metric.as_str(), c.value);
        let below_zero = never_negative(m) && ((c.op == Op::Lt && b <= 0.0) || (c.op == Op::Le && b < 0.0));
        let above_one = share(m) && ((c.op == Op::Gt && b >= 1.0) || (c.op == Op::Ge && b > 1.0));
        if below_zero || above_one {
            let range = if below_zero { "never below 0" } else { "a share, never above 1" };
            return Some((c.to_string(), format!("can never hold: `{m}` is {range}"), "fix the bound".into()));
        }
    }
    let c = w.cluster.as_ref()?;
    let (floor, on) = quickest_step(c)?;
    // Ticks round each step to the nanosecond: a hair of slack.
    let below = |op: Op, b: f64| match op {
        Op::Lt => b <= floor - 1e-9,
        Op::Le => b < floor - 1e-9,
        Op::Gt | Op::Ge => false,
    };
    let why = |what: &str| {
        format!(
            "can never hold: {what}, and the quickest step {on} takes {floor:.4} s (reading the weights once) \
             however low the load"
        )
    };
    let fix = format!("bound it above {floor:.4} s, or use a faster GPU or a larger tp");
    for cond in &target.conditions {
        // A class's figure (`class.critical.ttft_p99_s`) is bounded by the same step.
        let m = cond.metric.rsplit('.').next().unwrap_or_default();
        if (m.starts_with("ttft_") || m.starts_with("latency_")) && below(cond.op, cond.value) {
            return Some((cond.to_string(), why("every request's first token waits for at least one step"), fix));
        }
    }
    // A per-request bound no request meets leaves slo_attainment and goodput_rps at 0.
    let slo = target.bounds.as_ref().or(c.slo.as_ref())?;
    let unmet = [("ttft_s", slo.ttft_s), ("latency_s", slo.latency_s)]
        .into_iter()
        .find_map(|(name, b)| b.filter(|&b| below(Op::Le, b)).map(|b| format!("{name}={b}")))?;
    let needs_some = target.conditions.iter().find(|cond| {
        let b = cond.value;
        ["slo_attainment", "goodput_rps"].contains(&cond.metric.as_str())
            && ((cond.op == Op::Gt && b >= 0.0) || (cond.op == Op::Ge && b > 0.0))
    })?;
    Some((
        needs_some.to_string(),
        why(&format!(
            "no request can meet the per-request bound {unmet} (its first token waits for at least one step)"
        )),
        fix,
    ))
}

/// The shortest step any replica of `c` (every P/D pool included) can take, in seconds, and on
/// what; `None` when a replica is priced by a calibration (no such floor is proven for it).
fn quickest_step(c: &cluster::ClusterSpec) -> Option<(f64, String)> {
    let models = cluster::StepModels::resolve(c).ok()?;
    let mut quickest: Option<(f64, String)> = None;
    for sm in models.served() {
        let routelab_core::step_model::Pricer::Roofline(cost) = &sm.pricer else { return None };
        // A step's time is max(compute, bytes) + overhead, and its bytes include the weights.
        let floor = cost.weight_bytes / cost.bytes_per_s + cost.step_overhead_s;
        if floor.is_finite() && quickest.as_ref().is_none_or(|q| floor < q.0) {
            quickest = Some((floor, format!("on {} × {} (tp {})", sm.gpu.name, sm.model.name, sm.tp)));
        }
    }
    quickest
}

/// A trace replay's arrival rate at speed 1 (`prepared` at its own load), in requests/s: its
/// requests' gaps over the span of their arrivals, (n − 1) / (last − first). A search's trace
/// speed m replays them at m × this. `None` unless the workload replays a trace of at least two
/// requests that do not all arrive at once.
pub fn trace_rate(prepared: &runner::Prepared) -> Result<Option<f64>, InputError> {
    let replays =
        matches!(prepared.workload.cluster.as_ref().map(|c| &c.arrivals), Some(cluster::Arrivals::Trace { .. }));
    if !replays {
        return Ok(None);
    }
    let input = prepared.seed_input(0)?;
    let Some(stream) = input.stream() else { return Ok(None) };
    let (Some(first), Some(last)) = (stream.requests.first(), stream.requests.last()) else { return Ok(None) };
    let span = routelab_core::time::seconds(last.arrived_at.saturating_sub(first.arrived_at));
    Ok((span > 0.0).then(|| (stream.requests.len() - 1) as f64 / span))
}

/// The workload prepared at its starting load: bad input found before any run.
pub fn check(p: &Problem, start: f64) -> Result<runner::Prepared, InputError> {
    prepare_at(p, start)
}

#[cfg(test)]
mod tests;
