//! `routelab capacity`: reads and checks everything (exit 2 before any run), runs each policy's
//! search, prints the table, writes `--json` and `--plot`.

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::Result;

use super::{checks, output};
use crate::capacity::{self, Knob, Problem, Settings, expr, report};
use crate::report::table::fmt_num;
use routelab_core::plugin::Loader;
use routelab_core::runner::{self, RunOptions};
use routelab_core::workload::{self, InputError};

/// The `capacity` command's arguments.
pub struct Args {
    pub workload: PathBuf,
    pub slo: String,
    pub policies: Option<String>,
    pub settings: Settings,
    pub seeds: Option<u32>,
    pub seed: Option<u64>,
    pub json: Option<PathBuf>,
    pub plot: Option<PathBuf>,
    /// `--report`: the HTML page.
    pub report: Option<PathBuf>,
    pub markdown: bool,
    /// Threads for one load's seeds (default: every core).
    pub jobs: Option<usize>,
}

fn flag_error(flag: &str, path: String, message: String, fix: &str) -> InputError {
    InputError::new(flag, message, fix).in_field(path)
}

pub fn run(a: Args) -> Result<i32> {
    let common =
        super::Common { json: a.json.clone(), plot: a.plot.clone(), report: a.report.clone(), ..Default::default() };
    output::check(&common)?;
    let t = a.settings.tolerance;
    if !(t > 0.0 && t < 1.0) {
        return Err(flag_error(
            "--tolerance",
            String::new(),
            format!("must be in (0, 1) (got {t})"),
            "use e.g. 0.02: stop when the interval is within 2% of its top",
        )
        .into());
    }
    let file = routelab_core::builtin::resolve(&a.workload)?;
    let mut w = workload::load(&file)?;
    RunOptions { seed: a.seed, seeds: a.seeds, ..Default::default() }.apply(&mut w);
    let (knob, start) = Knob::of(&w).map_err(|e| InputError::from_field(&file, e))?;
    let target = expr::parse(&a.slo, &w).map_err(|e| flag_error("--slo", e.path, e.message, &e.fix))?;
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
            String::new(),
            format!("{} names no policies", file.display()),
            "pass --policies a,b,c or list `policies:` in the workload",
        )
        .into());
    }
    checks::pairings(&w, &specs)?;
    let jobs = a.jobs.unwrap_or_else(runner::parallel::all_cores);
    let problem = Problem { workload: &w, file: &file, knob, target: &target, jobs };
    // Everything that can be refused is refused now: the workload at its own load, and every
    // policy name and config (resolving builds nothing that runs).
    let prepared = capacity::check(&problem, start)?;
    if let Some((condition, why, fix)) = capacity::impossible(&target, &prepared.workload) {
        return Err(flag_error("--slo", condition, why, &fix).into());
    }
    // Replaying a trace, the load is a speed: what speed 1 is in requests/s, for the table, the
    // JSON, the charts and the progress lines.
    let rate = capacity::trace_rate(&prepared)?;
    let mut loader = Loader::new();
    for spec in &specs {
        runner::resolve(&mut loader, &prepared, spec)?;
    }
    let mut results = Vec::new();
    let mut code = 0;
    for spec in &specs {
        // One line per load on a terminal: a search on a long trace takes minutes.
        let progress = |pt: &capacity::Point| {
            if std::io::stderr().is_terminal() {
                let shown: Vec<String> = target
                    .conditions
                    .iter()
                    .map(|c| format!("{} {}", c.metric, pt.metrics.get(&c.metric).map_or("–".into(), fmt_num)))
                    .collect();
                let verdict = if pt.holds { "holds" } else { "fails" };
                let rps = rate.map_or(String::new(), |q| format!(" = {} requests/s", fmt_num(pt.load * q)));
                eprintln!(
                    "{}: {} = {}{rps} {verdict} ({})",
                    spec.label,
                    knob.label(),
                    fmt_num(pt.load),
                    shown.join(", ")
                );
            }
        };
        let mut r = capacity::of_policy(&mut loader, &problem, spec, start, a.settings, &progress)?;
        r.capacity_rps = rate.and_then(|q| r.answer.as_ref().map(|a| a.lo * q));
        if let Some(e) = &r.error {
            eprintln!("error: {}: {e}", spec.label);
            code = 1;
        }
        results.push(r);
    }
    let doc = report::Report {
        routelab: env!("CARGO_PKG_VERSION"),
        command: "capacity",
        workload: &w.name,
        world: w.world().as_str(),
        seed: w.seed,
        seeds: w.seeds,
        knob,
        start,
        trace_rate_rps: rate,
        slo: target.conditions.iter().map(ToString::to_string).collect(),
        bounds: w.cluster.as_ref().and_then(|c| c.slo.as_ref()),
        settings: a.settings,
        resolved: &w,
        results: &results,
    };
    print!("{}", report::table(&doc, &target, a.markdown));
    if let Some(path) = &a.json {
        std::fs::write(path, doc.json()).map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
    }
    if let Some(path) = &a.report {
        let argv: Vec<String> = std::env::args().collect();
        output::write_atomically(path, &capacity::page::render(&doc, &target, &argv)?)?;
    }
    if let Some(dir) = &a.plot {
        for f in report::charts(dir, &doc, &target)? {
            println!("plot: {}", f.display());
        }
    }
    Ok(code)
}
