//! `routelab capacity`: reads and checks everything (exit 2 before any run), runs each policy's
//! search, prints the table, writes `--json` and `--plot`.

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::Result;

use super::output;
use super::slo_setup::{self, Setup, SloArgs, flag_error};
use crate::capacity::{self, Knob, Problem, Settings, report};
use crate::report::table::fmt_num;
use routelab_core::plugin::Loader;
use routelab_core::runner;
use routelab_core::workload::InputError;

/// The `capacity` command's arguments.
pub struct Args {
    pub setup: SloArgs,
    pub settings: Settings,
    pub json: Option<PathBuf>,
    pub plot: Option<PathBuf>,
    /// `--report`: the HTML page.
    pub report: Option<PathBuf>,
}

pub fn run(a: Args) -> Result<i32> {
    let common =
        super::Common { json: a.json.clone(), plot: a.plot.clone(), report: a.report.clone(), ..Default::default() };
    output::check(&common)?;
    let t = a.settings.tolerance;
    if !(t > 0.0 && t < 1.0) {
        return Err(flag_error(
            "--tolerance",
            "",
            format!("must be in (0, 1) (got {t})"),
            "use e.g. 0.02: stop when the interval is within 2% of its top",
        )
        .into());
    }
    let (setup, (knob, start)) =
        slo_setup::load(&a.setup, |w, file| Knob::of(w).map_err(|e| InputError::from_field(file, e)))?;
    let Setup { file, workload: w, target, specs, jobs } = setup;
    let problem = Problem { workload: &w, file: &file, knob, target: &target, jobs };
    // Everything that can be refused is refused now: the workload at its own load, and every
    // policy name and config (resolving builds nothing that runs).
    let prepared = capacity::check(&problem, start)?;
    if let Some((condition, why, fix)) = capacity::impossible(&target, &prepared.workload) {
        return Err(flag_error("--slo", condition, why, fix).into());
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
    print!("{}", report::table(&doc, &target, a.setup.markdown));
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
