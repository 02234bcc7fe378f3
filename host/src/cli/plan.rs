//! `routelab plan`: reads and checks everything (exit 2, naming the flag, before any run), runs
//! the search, prints the tables, writes `--json`.

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::Result;

use super::{checks, output};
use crate::capacity::{self, expr};
use crate::plan::{self, Line, Problem, Settings, prices, report};
use routelab_core::plugin::Loader;
use routelab_core::runner::{self, RunOptions};
use routelab_core::step_model::{Choice, Gpu, catalog::GPU_NAMES};
use routelab_core::workload::{self, InputError, Workload, dispatch};

/// The `plan` command's arguments.
pub struct Args {
    pub workload: PathBuf,
    pub slo: String,
    pub gpus: Option<String>,
    pub tp: Option<String>,
    pub replicas: Option<String>,
    pub policies: Option<String>,
    pub scalers: Option<String>,
    pub budget: Option<f64>,
    pub prices: Option<String>,
    pub seeds: Option<u32>,
    pub seed: Option<u64>,
    pub json: Option<PathBuf>,
    /// `--report`: the HTML page.
    pub report: Option<PathBuf>,
    pub markdown: bool,
    pub jobs: Option<usize>,
}

fn flag_error(flag: &str, path: impl Into<String>, message: impl Into<String>, fix: impl Into<String>) -> InputError {
    InputError::new(flag, message, fix).in_field(path)
}

fn list(text: &str) -> Vec<String> {
    text.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect()
}

/// `A..B` (inclusive) or `N`, within 1..=10⁴.
pub fn parse_replicas(text: &str) -> Result<(u32, u32), InputError> {
    let bad = |why: String| flag_error("--replicas", "", why, "give a range like 1..16, or one count like 8");
    let num =
        |s: &str| s.trim().parse::<u32>().map_err(|_| bad(format!("`{}` in `{text}` is not a whole number", s.trim())));
    let (lo, hi) = match text.split_once("..") {
        Some((a, b)) => (num(a)?, num(b.strip_prefix('=').unwrap_or(b))?),
        None => {
            let n = num(text)?;
            (n, n)
        }
    };
    if lo == 0 {
        return Err(bad(format!("`{text}` starts at 0; a fleet has at least 1 replica")));
    }
    if lo > hi {
        return Err(bad(format!("`{text}` is empty ({lo} > {hi})")));
    }
    let cap = workload::limits::MAX_REPLICAS;
    if hi > cap {
        return Err(bad(format!("`{text}` goes past {cap} replicas, the most a cluster may have")));
    }
    Ok((lo, hi))
}

/// The GPUs to try: `--gpus` (catalog names) or the workload's own.
fn gpus(a: &Args, w: &Workload) -> Result<Vec<(String, Choice<Gpu>)>, InputError> {
    let Some(c) = &w.cluster else {
        return match &a.gpus {
            Some(_) => Err(flag_error(
                "--gpus",
                "",
                "the dispatch world has servers, not GPUs",
                "drop --gpus; price a server with --prices server=PRICE",
            )),
            None => Ok(vec![(prices::SERVER.to_string(), Choice::Name(prices::SERVER.into()))]),
        };
    };
    let own = match &c.gpu {
        Choice::Name(n) => n.clone(),
        Choice::Custom(g) => g.name.clone(),
    };
    let Some(text) = &a.gpus else { return Ok(vec![(own, c.gpu.clone())]) };
    let names = list(text);
    if names.is_empty() {
        return Err(flag_error("--gpus", "", "names no GPU", format!("name catalog GPUs: {}", GPU_NAMES.join(", "))));
    }
    let mut out: Vec<(String, Choice<Gpu>)> = Vec::new();
    for n in names {
        let n = n.to_lowercase();
        if !GPU_NAMES.contains(&n.as_str()) {
            return Err(flag_error(
                "--gpus",
                n.clone(),
                format!("unknown GPU `{n}`{}", routelab_core::suggest::did_you_mean(&n, GPU_NAMES)),
                format!("name catalog GPUs: {}", GPU_NAMES.join(", ")),
            ));
        }
        if c.calibration.is_some() && n != own {
            return Err(flag_error(
                "--gpus",
                n,
                format!("the workload's steps are priced by a calibration measured on its `gpu` ({own})"),
                "drop --gpus, or drop `calibration:` from the workload to price every GPU by the roofline",
            ));
        }
        if !out.iter().any(|(o, _)| *o == n) {
            out.push((n.clone(), Choice::Name(n)));
        }
    }
    Ok(out)
}

fn tps(a: &Args, w: &Workload) -> Result<Vec<u32>, InputError> {
    let Some(c) = &w.cluster else {
        return match &a.tp {
            Some(_) => Err(flag_error("--tp", "", "the dispatch world has no tensor parallelism", "drop --tp")),
            None => Ok(vec![1]),
        };
    };
    let Some(text) = &a.tp else { return Ok(vec![c.tp]) };
    let mut out = Vec::new();
    for t in list(text) {
        match t.parse::<u32>() {
            Ok(n) if [1, 2, 4, 8].contains(&n) => {
                if !out.contains(&n) {
                    out.push(n)
                }
            }
            _ => {
                return Err(flag_error("--tp", t.clone(), format!("`{t}` is not 1, 2, 4 or 8"), "use e.g. --tp 1,2"));
            }
        }
    }
    if out.is_empty() {
        return Err(flag_error("--tp", "", "names no degree", "use e.g. --tp 1,2"));
    }
    Ok(out)
}

/// The workload, checked to be one a plan can reshape.
fn plannable(w: &Workload, file: &std::path::Path) -> Result<(), InputError> {
    let refuse = |field: &str, why: &str, fix: &str| Err(InputError::new(file, why, fix).in_field(field));
    if let Some(d) = &w.dispatch {
        if d.mode != dispatch::Mode::Queueing {
            return refuse("dispatch.mode", "balls-into-bins has no load to serve", "use a queueing workload");
        }
        return Ok(());
    }
    let Some(c) = &w.cluster else {
        return refuse("", "is a compound workload, which has no fleet", "pass a cluster or dispatch workload");
    };
    if c.disaggregation.is_some() {
        return refuse(
            "cluster.disaggregation",
            "plan searches aggregated fleets; a prefill/decode split is not searched yet",
            "plan the workload without `disaggregation:`, or size its pools with `routelab capacity`",
        );
    }
    Ok(())
}

pub fn run(a: Args) -> Result<i32> {
    let common = super::Common { json: a.json.clone(), report: a.report.clone(), ..Default::default() };
    output::check(&common)?;
    let file = routelab_core::builtin::resolve(&a.workload)?;
    let mut w = workload::load(&file)?;
    RunOptions { seed: a.seed, seeds: a.seeds, ..Default::default() }.apply(&mut w);
    plannable(&w, &file)?;
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
    let gpus = gpus(&a, &w)?;
    let tps = tps(&a, &w)?;
    let own = w.cluster.as_ref().map_or_else(|| w.dispatch.as_ref().map_or(1, |d| d.servers), |c| c.replicas);
    let (min_replicas, max_replicas) = match &a.replicas {
        Some(r) => parse_replicas(r)?,
        None => (1, own.saturating_mul(2).clamp(1, workload::limits::MAX_REPLICAS)),
    };
    let scalers: Vec<Option<String>> = match (&a.scalers, w.cluster.as_ref()) {
        (Some(_), None) => {
            return Err(flag_error("--scalers", "", "the dispatch world has no autoscaling", "drop --scalers").into());
        }
        (Some(s), Some(_)) => {
            let l = list(s);
            if l.is_empty() {
                return Err(flag_error("--scalers", "", "names no scaler", "use e.g. --scalers hpa,llm_d_wva").into());
            }
            l.into_iter().map(Some).collect()
        }
        (None, Some(c)) => vec![c.autoscaling.as_ref().map(|x| x.scaler.clone())],
        (None, None) => vec![None],
    };
    if let Some(b) = a.budget {
        if !(b.is_finite() && b > 0.0) {
            return Err(flag_error(
                "--budget",
                "",
                format!("must be a positive cost per hour (got {b})"),
                "use e.g. 20",
            )
            .into());
        }
    }
    let flag_prices = prices::parse(a.prices.as_deref().unwrap_or("")).map_err(|(item, why)| {
        flag_error("--prices", item.clone(), format!("`{item}` {why}"), "use e.g. h100=3.5,a6000=0.8")
    })?;
    let mut price_list = Vec::new();
    for (g, _) in &gpus {
        let Some((per_hour, source)) = prices::of(g, &flag_prices, &w) else {
            return Err(flag_error(
                "--prices",
                g.clone(),
                format!("no price for `{g}`: the built-in table has {}", prices::names().join(", ")),
                format!("give one: --prices {g}=PRICE (per GPU-hour)"),
            )
            .into());
        };
        price_list.push(report::Price { gpu: g.clone(), per_hour, source });
    }
    // The lines: GPU × tp × router × scaler, each GPU and degree checked to run the model.
    let mut lines = Vec::new();
    let mut line_gpus = Vec::new();
    let mut line_specs = Vec::new();
    let mut loader = Loader::new();
    let mut first_refusal = None;
    let mut notes = Vec::new();
    let jobs = a.jobs.unwrap_or_else(runner::parallel::all_cores);
    for ((g, choice), price) in gpus.iter().zip(&price_list) {
        for &tp in &tps {
            let probe = Line {
                gpu: g.clone(),
                tp,
                policy: String::new(),
                spec: String::new(),
                scaler: scalers[0].clone(),
                replica_price: 0.0,
            };
            let p = Problem {
                workload: &w,
                file: &file,
                target: &target,
                specs: &specs,
                gpus: std::slice::from_ref(choice),
                jobs,
            };
            let shaped = plan::run::shape(&p, 0, &probe, max_replicas)
                .map_err(|why| flag_error("--replicas", "", format!("at its top: {why}"), "widen the range"))?;
            let prepared = match runner::prepare(shaped, &file) {
                Ok(pr) => pr,
                Err(e) => {
                    notes.push(format!("{g} (tp {tp}) is left out: {}", e.message));
                    first_refusal.get_or_insert(e);
                    continue;
                }
            };
            if let Some((condition, why, fix)) = capacity::impossible(&target, &prepared.workload) {
                notes.push(format!("{g} (tp {tp}): {condition} {why} ({fix})"));
            }
            for spec in &specs {
                runner::resolve(&mut loader, &prepared, spec)?;
                for scaler in &scalers {
                    lines.push(Line {
                        gpu: g.clone(),
                        tp,
                        policy: spec.label.clone(),
                        spec: spec.arg.clone(),
                        scaler: scaler.clone(),
                        replica_price: price.per_hour * f64::from(tp),
                    });
                    line_gpus.push(choice.clone());
                    line_specs.push(spec.clone());
                }
            }
        }
    }
    if lines.is_empty() {
        let e = first_refusal.expect("a GPU was refused");
        return Err(e.into());
    }
    for n in &notes {
        eprintln!("note: {n}");
    }
    let settings =
        Settings { min_replicas, max_replicas, start: own.clamp(min_replicas, max_replicas), budget: a.budget };
    let problem = Problem { workload: &w, file: &file, target: &target, specs: &line_specs, gpus: &line_gpus, jobs };
    let results = plan::search(&lines, &settings, &mut |asks| {
        if std::io::stderr().is_terminal() {
            let shown: Vec<String> = asks.iter().map(|&(i, r)| lines[i].shape(r)).collect();
            eprintln!("running {} shapes: {}", asks.len(), shown.join("; "));
        }
        plan::evaluate_batch(&mut loader, &problem, &lines, asks)
    })?;
    let code = if results.iter().any(|r| r.error.is_some()) { 1 } else { 0 };
    let doc = plan::assemble(&w, &target, settings, price_list, &results);
    print!("{}", report::table(&doc, &target, a.markdown));
    if let Some(path) = &a.json {
        std::fs::write(path, doc.json()).map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
    }
    if let Some(path) = &a.report {
        let argv: Vec<String> = std::env::args().collect();
        output::write_atomically(path, &plan::page::render(&doc, &target, &argv)?)?;
    }
    Ok(code)
}
