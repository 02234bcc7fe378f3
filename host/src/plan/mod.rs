//! `routelab plan`: the cheapest fleet shape that meets an SLO at the workload's own load.
//!
//! A shape is a GPU type × tensor-parallel degree × replica count × router (× scaler); in the
//! dispatch world a replica is a server (`dispatch.servers`) and the load stays the workload's
//! arrival rate λ = ρ·N, so c servers run at ρ = λ/c (none at ρ ≥ 1: such a fleet fails without
//! a run). A shape costs replicas × tp × its GPU's price per hour ([`prices`]); with a scaler,
//! its mean replica count over the run × tp × price.
//!
//! Fixed-part lines: a line may hold part of its fleet fixed ([`Fixed`]) and search the rest. On
//! a `disaggregation:` workload every line is a P/D line: a line per prefill instance count
//! (`--prefill A..B`), its decode count searched, both pools on the line's GPU and tp; the
//! cheapest P:D shape wins. With `--mix N`, beside the single-GPU lines, a line per two GPU types
//! A ≠ B (of one tp) and count k in 1..=N: k replicas of B fixed, A's searched, as two
//! `cluster.pools`. Either costs its fixed part plus the count searched, each at its GPU's price.
//! A P/D line with a scaler autoscales both pools: its prefill count and the decode count
//! searched are the pools' `max_replicas` (the fleet's budget their sum), and it costs the mean
//! instances of both pools over the run (their paid replica-seconds) × tp × price.
//!
//! The SLO is judged as `capacity` judges a load ([`crate::capacity::expr::Target`]): on the mean
//! over the workload's seeds (the same seeds for every shape: common random numbers), and a
//! shape with an unfinished request fails.
//!
//! Search: the shapes differing only in replica count form a *line*; attainment is taken to be
//! monotone in replicas along a line (more replicas of the same kind never hurt, to a good
//! approximation; a metric that is better at fewer replicas near the answer is flagged, as
//! `capacity` flags one better at a higher load). Each line is bracketed from the workload's own
//! replica count — doubling while it fails — and bisected down to the fewest replicas that
//! hold. All lines advance together in rounds, each round's shapes run on every core through
//! the runner's cells (`runner::parallel`), so the answer does not depend on the thread count.
//! Between rounds, a line never runs a shape that costs as much as or more than the cheapest
//! shape already seen to hold (it is dominated: it cannot be the winner), nor one over
//! `--budget`.

pub mod page;
pub mod prices;
pub mod report;
pub mod run;

use serde::Serialize;

use routelab_core::error::Error;
use routelab_core::metrics::Metrics;
pub use run::{Problem, evaluate_batch};

/// The shapes that differ only in their replica count.
#[derive(Clone, Debug, Serialize)]
pub struct Line {
    /// The GPU's catalog name (cluster world) or [`prices::SERVER`] (dispatch world).
    pub gpu: String,
    pub tp: u32,
    /// The router's label and argument.
    pub policy: String,
    pub spec: String,
    /// The scaler (`cluster.autoscaling.scaler`); with one, the replica count searched is the
    /// scaler's `max_replicas` (on a P/D line, the decode pool's; the prefill pool's is the
    /// fixed part's count).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scaler: Option<String>,
    /// One replica's price per hour: the GPU's × tp.
    pub replica_price: f64,
    /// The part of the fleet every shape of the line shares (a P/D split's prefill instances, a
    /// second GPU's replicas); the count searched is then decode's, or the line's GPU's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fixed: Option<Fixed>,
}

/// What a fixed part is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// A `disaggregation:` workload's prefill instances, on the line's GPU and tp; the count
    /// searched is the decode instances.
    Prefill,
    /// Replicas of a second GPU type (a pool of their own, `cluster.pools`) beside the line's.
    Pool,
}

/// The fixed part of a line's fleet.
#[derive(Clone, Debug, Serialize)]
pub struct Fixed {
    pub role: Role,
    pub count: u32,
    /// Its GPU and tensor-parallel degree (a prefill part's are the line's).
    pub gpu: String,
    pub tp: u32,
    /// What it costs per hour: every GPU in it (with a P/D workload's `mixed` instances, theirs
    /// too) at its GPU's price (on a scaled P/D line, all of its prefill budget: a shape costs
    /// what its pools paid for instead, [`Line::scaled_cost`]).
    pub cost_per_hour: f64,
    /// The GPU as the workload writes it (a pool's).
    #[serde(skip)]
    pub choice: Option<routelab_core::step_model::Choice<routelab_core::step_model::Gpu>>,
}

impl Line {
    /// `3 × h100 (tp 2) with dynamo_kv`, `up to 8 × a6000 with least_requests, scaled by hpa`,
    /// `2P + 3D × a6000 with pd_sglang`, `3 × a6000 + 1 × h100 with least_requests`.
    pub fn shape(&self, replicas: u32) -> String {
        let tp_of = |tp: u32| if tp > 1 { format!(" (tp {tp})") } else { String::new() };
        let tp = tp_of(self.tp);
        let fleet = match &self.fixed {
            None => format!("{replicas} × {}{tp}", self.gpu),
            Some(f) if f.role == Role::Prefill => format!("{}P + {replicas}D × {}{tp}", f.count, self.gpu),
            Some(f) => format!("{replicas} × {}{tp} + {} × {}{}", self.gpu, f.count, f.gpu, tp_of(f.tp)),
        };
        let fleet = format!("{fleet} with {}", self.policy);
        match &self.scaler {
            Some(s) => format!("up to {fleet}, scaled by {s}"),
            None => fleet,
        }
    }

    /// What the line's shape costs per hour with `replicas` (a mean, when scaled) of its GPU:
    /// those at [`Line::replica_price`] plus the fixed part's.
    pub fn cost(&self, replicas: f64) -> f64 {
        replicas * self.replica_price + self.fixed.as_ref().map_or(0.0, |f| f.cost_per_hour)
    }

    /// What a scaled line's shape costs per hour when its replicas averaged `mean` over the run
    /// (`replicas_mean`): `mean` at [`Line::replica_price`]. On a P/D line the prefill pool
    /// scales too and `mean` counts both pools (their paid replica-seconds, each pool's
    /// `replica_seconds_prefill`/`_decode`, over the run), so the fixed part adds nothing; any
    /// other fixed part is added as in [`Line::cost`].
    pub fn scaled_cost(&self, mean: f64) -> f64 {
        match &self.fixed {
            Some(f) if f.role == Role::Prefill => mean * self.replica_price,
            _ => self.cost(mean),
        }
    }

    /// Where the line's search starts: the workload's own count, less a second GPU's fixed
    /// replicas (so a mixed line's first shape is as large a fleet as the workload's).
    fn start(&self, s: &Settings) -> u32 {
        match &self.fixed {
            Some(f) if f.role == Role::Pool => s.start.saturating_sub(f.count).max(s.min_replicas),
            _ => s.start,
        }
    }

    /// The fixed part in a few words (`2 prefill`, `+ 1 × h100`), or empty.
    pub fn fixed_text(&self) -> String {
        match &self.fixed {
            None => String::new(),
            Some(f) if f.role == Role::Prefill => format!("{} prefill", f.count),
            Some(f) => {
                let tp = if f.tp > 1 { format!(" (tp {})", f.tp) } else { String::new() };
                format!("+ {} × {}{tp}", f.count, f.gpu)
            }
        }
    }
}

/// One shape run on every seed.
#[derive(Clone, Debug, Serialize)]
pub struct Evaluation {
    pub replicas: u32,
    /// What the shape costs per hour (with a scaler: at its mean replica count).
    pub cost_per_hour: f64,
    pub holds: bool,
    /// Seeds on which the SLO holds by itself (and nothing was left unfinished).
    pub seeds_holding: u32,
    /// The smallest relative slack of the SLO's conditions on the mean over seeds: 0.2 = every
    /// bound is met with 20% to spare; negative = the condition is missed by that share.
    pub margin: f64,
    /// The mean over seeds (empty when the shape was not run).
    pub metrics: Metrics,
    /// Why it failed without a run (an unstable dispatch fleet, a workload the shape breaks).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// How a line's search ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// `replicas` holds and one fewer fails (or is the bottom of the range).
    Found,
    /// Fails at the top of the range.
    FailsEverywhere,
    /// Every count not yet known to fail costs at least as much as a cheaper shape that holds:
    /// the line cannot win, so it stopped (`replicas` is the fewest seen to hold, if any).
    Dominated,
    /// Every count not yet known to fail is over `--budget`.
    OverBudget,
    /// A run failed (the line's `error`).
    Error,
}

/// A line's answer.
#[derive(Clone, Debug, Serialize)]
pub struct LineResult {
    #[serde(flatten)]
    pub line: Line,
    pub status: Status,
    /// The fewest replicas seen to hold.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replicas: Option<u32>,
    /// The most replicas seen to fail.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fails_at: Option<u32>,
    /// In the order they were run.
    pub points: Vec<Evaluation>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl LineResult {
    /// The evaluation at the answer, if any.
    pub fn answer(&self) -> Option<&Evaluation> {
        let r = self.replicas?;
        self.points.iter().find(|e| e.replicas == r)
    }
}

/// The replica counts searched, and the spending cap.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Settings {
    pub min_replicas: u32,
    pub max_replicas: u32,
    /// Where each line starts (clamped into the range): the workload's own count (a mixed line:
    /// less its fixed replicas of the second GPU).
    pub start: u32,
    /// Most per hour a shape may cost (`--budget`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget: Option<f64>,
    /// `--prefill`: the prefill instance counts with a line each (the replicas searched are
    /// then decode instances).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefill: Option<(u32, u32)>,
    /// `--mix N`: each mixed-GPU line's second GPU counts run 1..=N.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mix: Option<u32>,
}

/// A line's search so far.
#[derive(Clone, Debug)]
struct State {
    /// The most replicas known to fail (`min_replicas − 1` when none has).
    fails_at: u32,
    /// The fewest known to hold.
    holds_at: Option<u32>,
    points: Vec<Evaluation>,
    done: Option<Status>,
    error: Option<String>,
}

/// Why a line stops short of its range: the budget or a cheaper shape that holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cap {
    None,
    Budget,
    Winner,
}

impl State {
    /// The next count to run, or `None` with the status the line ends with. `cap` is the most
    /// replicas worth running (and what set it); `scaled` lines are not pruned (their cost is
    /// known only after the run).
    fn next(&self, s: &Settings, start: u32, cap: (u32, Cap)) -> Result<u32, Status> {
        let f = self.fails_at;
        let top = s.max_replicas.min(cap.0);
        let stopped = |why: Cap| match why {
            Cap::Budget => Status::OverBudget,
            _ => Status::Dominated,
        };
        match self.holds_at {
            None if self.points.is_empty() => {
                if top < s.min_replicas {
                    return Err(stopped(cap.1));
                }
                Ok(start.clamp(s.min_replicas, top))
            }
            None => {
                if f >= s.max_replicas {
                    return Err(Status::FailsEverywhere);
                }
                if f >= top {
                    return Err(stopped(cap.1));
                }
                Ok(f.saturating_mul(2).max(f + 1).min(top))
            }
            Some(h) => {
                let upper = h.min(top.saturating_add(1));
                if upper <= f + 1 {
                    return Err(if h == f + 1 { Status::Found } else { stopped(cap.1) });
                }
                Ok(f + (upper - f) / 2)
            }
        }
    }

    fn record(&mut self, e: Evaluation) {
        if e.holds {
            self.holds_at = Some(self.holds_at.map_or(e.replicas, |h| h.min(e.replicas)));
        } else {
            self.fails_at = self.fails_at.max(e.replicas);
        }
        self.points.push(e);
    }
}

/// What a batch of shapes came to: per asked (line, replicas), its evaluation or the error
/// that failed the line's policy (exit 1).
pub type Batch = Vec<Result<Evaluation, routelab_core::runner::CellError>>;

/// The shapes of a round: (line index, replicas).
pub type Asks = [(usize, u32)];

/// Searches every line, a round at a time; `eval` runs a round's (line, replicas) shapes.
pub fn search(
    lines: &[Line],
    s: &Settings,
    eval: &mut dyn FnMut(&Asks) -> Result<Batch, Error>,
) -> Result<Vec<LineResult>, Error> {
    let mut states: Vec<State> = lines
        .iter()
        .map(|_| State { fails_at: s.min_replicas - 1, holds_at: None, points: Vec::new(), done: None, error: None })
        .collect();
    loop {
        // The cheapest shape seen to hold, over every line: nothing as dear runs again.
        let best = states
            .iter()
            .flat_map(|st| st.points.iter().filter(|e| e.holds).map(|e| e.cost_per_hour))
            .min_by(f64::total_cmp);
        let mut asks = Vec::new();
        for (i, st) in states.iter_mut().enumerate() {
            if st.done.is_some() {
                continue;
            }
            let cap = cap_of(&lines[i], s, best);
            match st.next(s, lines[i].start(s), cap) {
                Ok(r) => asks.push((i, r)),
                Err(status) => st.done = Some(status),
            }
        }
        if asks.is_empty() {
            break;
        }
        let results = eval(&asks)?;
        for (&(i, _), r) in asks.iter().zip(results) {
            match r {
                Ok(e) => states[i].record(e),
                Err(why) => {
                    states[i].error = Some(why.message);
                    states[i].done = Some(Status::Error);
                }
            }
        }
    }
    Ok(lines
        .iter()
        .zip(states)
        .map(|(line, st)| {
            let warning = non_monotone(&st.points, st.holds_at);
            LineResult {
                line: line.clone(),
                status: st.done.expect("every line ends"),
                replicas: st.holds_at,
                fails_at: (st.fails_at >= s.min_replicas).then_some(st.fails_at),
                points: st.points,
                warning,
                error: st.error,
            }
        })
        .collect())
}

/// The most replicas worth running on `line`: strictly cheaper than `best`, within the budget
/// (its fixed part's cost counted). A scaled line's cost is known only after its run, so only
/// its top is capped by nothing.
fn cap_of(line: &Line, s: &Settings, best: Option<f64>) -> (u32, Cap) {
    if line.scaler.is_some() || line.replica_price.is_nan() || line.replica_price <= 0.0 {
        return (u32::MAX, Cap::None);
    }
    let left = |b: f64| b - line.cost(0.0);
    let mut cap = (u32::MAX, Cap::None);
    if let Some(b) = s.budget {
        // Within the budget: replicas × price + fixed ≤ b (a hair of slack for rounding).
        let n = (left(b) / line.replica_price * (1.0 + 1e-12)).floor();
        cap = (n.clamp(0.0, f64::from(u32::MAX)) as u32, Cap::Budget);
    }
    if let Some(b) = best {
        // Strictly cheaper than the best: replicas × price + fixed < b.
        let n = (left(b) / line.replica_price * (1.0 - 1e-12)).ceil() - 1.0;
        let n = n.clamp(0.0, f64::from(u32::MAX)) as u32;
        if n < cap.0 {
            cap = (n, Cap::Winner);
        }
    }
    cap
}

/// A line's cheapest shape that holds, cost first, then the larger margin, then line order.
pub fn winner(results: &[LineResult]) -> Option<(usize, &Evaluation)> {
    let mut best: Option<(usize, &Evaluation)> = None;
    for (i, r) in results.iter().enumerate() {
        let Some(e) = r.answer() else { continue };
        let better = best.is_none_or(|(_, b)| {
            e.cost_per_hour < b.cost_per_hour || (e.cost_per_hour == b.cost_per_hour && e.margin > b.margin)
        });
        if better {
            best = Some((i, e));
        }
    }
    best
}

/// The shapes no other shape beats on both cost and margin (lower cost, larger margin), in
/// cost order: (line, index into its points). Failing shapes count: they show what the budget
/// below the winner buys.
pub fn frontier(results: &[LineResult]) -> Vec<(usize, usize)> {
    let mut all: Vec<(usize, usize, f64, f64)> = Vec::new();
    for (i, r) in results.iter().enumerate() {
        for (k, e) in r.points.iter().enumerate() {
            if e.margin.is_finite() && e.cost_per_hour.is_finite() {
                all.push((i, k, e.cost_per_hour, e.margin));
            }
        }
    }
    all.sort_by(|a, b| a.2.total_cmp(&b.2).then(b.3.total_cmp(&a.3)));
    let mut out = Vec::new();
    let mut best_margin = f64::NEG_INFINITY;
    for (i, k, _, m) in all {
        if m > best_margin {
            out.push((i, k));
            best_margin = m;
        }
    }
    out
}

/// The smallest relative slack of `target`'s conditions on `m` (see [`Evaluation::margin`]);
/// NaN when a metric is missing or NaN.
pub fn margin(target: &crate::capacity::expr::Target, m: &Metrics) -> f64 {
    use crate::capacity::expr::Op;
    let mut least = f64::INFINITY;
    for c in &target.conditions {
        let Some(v) = m.get(&c.metric) else { return f64::NAN };
        let slack = match c.op {
            Op::Lt | Op::Le => c.value - v,
            Op::Gt | Op::Ge => v - c.value,
        };
        let scale = if c.value == 0.0 { 1.0 } else { c.value.abs() };
        least = least.min(slack / scale);
    }
    least
}

/// Relative worsening with replicas beyond which a line counts as not monotone (as
/// `capacity`'s [`crate::capacity::expr::Target::non_monotone`]: a few per cent is sampling).
const NOISE: f64 = 0.05;

/// Whether the margin is better at fewer replicas than at more, by more than [`NOISE`], among
/// the shapes at or below twice the answer (the ones that decide it).
fn non_monotone(points: &[Evaluation], answer: Option<u32>) -> Option<String> {
    let top = answer?.saturating_mul(2);
    let mut near: Vec<&Evaluation> =
        points.iter().filter(|e| e.replicas <= top && e.margin.is_finite() && e.note.is_none()).collect();
    near.sort_by_key(|e| e.replicas);
    for (i, a) in near.iter().enumerate() {
        for b in &near[i + 1..] {
            if a.margin - b.margin > NOISE * a.margin.abs().max(b.margin.abs()).max(0.1) {
                return Some(format!(
                    "the SLO's margin is larger at {} replicas ({:.3}) than at {} ({:.3}): not monotone in replicas \
                     near the answer, which may hinge on noise; rerun with more --seeds",
                    a.replicas, a.margin, b.replicas, b.margin
                ));
            }
        }
    }
    None
}

/// The report of a finished search: shapes counted, the frontier and the winner.
pub fn assemble<'a>(
    w: &'a routelab_core::workload::Workload,
    target: &crate::capacity::expr::Target,
    settings: Settings,
    prices: Vec<report::Price>,
    results: &'a [LineResult],
) -> report::Report<'a> {
    let span = u64::from(settings.max_replicas - settings.min_replicas + 1);
    let shapes_run: u64 = results.iter().map(|r| r.points.len() as u64).sum();
    let runs: u64 =
        results.iter().flat_map(|r| &r.points).filter(|e| e.note.is_none()).count() as u64 * u64::from(w.seeds);
    let winner = winner(results).map(|(i, e)| {
        let l = &results[i];
        let fewer = l.points.iter().find(|p| p.replicas + 1 == e.replicas && !p.holds);
        report::Winner {
            line: i,
            shape: l.line.shape(e.replicas),
            replicas: e.replicas,
            cost_per_hour: e.cost_per_hour,
            margin: e.margin,
            seeds_holding: e.seeds_holding,
            one_fewer_margin: fewer.map(|p| p.margin),
        }
    });
    report::Report {
        routelab: env!("CARGO_PKG_VERSION"),
        command: "plan",
        workload: &w.name,
        world: w.world().as_str(),
        seed: w.seed,
        seeds: w.seeds,
        slo: target.conditions.iter().map(ToString::to_string).collect(),
        bounds: w.cluster.as_ref().and_then(|c| c.slo.as_ref()),
        settings,
        prices,
        shapes: results.len() as u64 * span,
        shapes_run,
        runs,
        lines: results,
        frontier: frontier(results),
        winner,
        resolved: w,
    }
}

#[cfg(test)]
mod tests;
