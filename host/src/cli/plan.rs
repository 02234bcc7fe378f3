//! `routelab plan`: reads and checks everything (exit 2, naming the flag, before any run), runs
//! the search, prints the tables, writes `--json`.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use anyhow::Result;

use super::output;
use super::slo_setup::{self, Setup, SloArgs, flag_error};
use crate::capacity;
use crate::plan::{self, Fixed, Line, Problem, Role, Settings, prices, report};
use routelab_core::plugin::Loader;
use routelab_core::runner;
use routelab_core::step_model::{Choice, Gpu, catalog::GPU_NAMES};
use routelab_core::workload::{self, InputError, Workload, dispatch};

/// The `plan` command's arguments.
pub struct Args {
    pub setup: SloArgs,
    pub gpus: Option<String>,
    pub tp: Option<String>,
    pub replicas: Option<String>,
    /// `--prefill A..B`: a P/D line per prefill count.
    pub prefill: Option<String>,
    /// `--mix N`: mixed-GPU lines, 1..=N of the second GPU.
    pub mix: Option<u32>,
    pub scalers: Option<String>,
    pub budget: Option<f64>,
    pub prices: Option<String>,
    pub json: Option<PathBuf>,
    /// `--report`: the HTML page.
    pub report: Option<PathBuf>,
}

fn list(text: &str) -> Vec<String> {
    text.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect()
}

/// `A..B` (inclusive) or `N`, within 1..=10⁴, given to `flag` (`--replicas`, `--prefill`).
pub fn parse_range(flag: &str, text: &str) -> Result<(u32, u32), InputError> {
    let bad = |why: String| flag_error(flag, "", why, "give a range like 1..16, or one count like 8");
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

/// Whether a scaler list names a scaler (`none` does not).
fn scaled(scalers: &[Option<String>]) -> bool {
    scalers.iter().any(Option::is_some)
}

/// The workload, checked to be one a plan can reshape with these flags: a bad combination is
/// refused naming the flag and the fix.
fn plannable(a: &Args, w: &Workload, file: &Path) -> Result<(), InputError> {
    let refuse = |field: &str, why: &str, fix: &str| Err(InputError::new(file, why, fix).in_field(field));
    if let Some(d) = &w.dispatch {
        if d.mode != dispatch::Mode::Queueing {
            return refuse("dispatch.mode", "balls-into-bins has no load to serve", "use a queueing workload");
        }
        if a.prefill.is_some() {
            return Err(flag_error(
                "--prefill",
                "",
                "the dispatch world has no prefill/decode split",
                "drop --prefill",
            ));
        }
        if a.mix.is_some() {
            return Err(flag_error("--mix", "", "the dispatch world has servers, not GPU types", "drop --mix"));
        }
        return Ok(());
    }
    let Some(c) = &w.cluster else {
        return refuse("", "is a compound workload, which has no fleet", "pass a cluster or dispatch workload");
    };
    let shown = file.display();
    match (&c.disaggregation, &a.prefill) {
        (None, Some(_)) => {
            return Err(flag_error(
                "--prefill",
                "",
                format!("{shown} has no `disaggregation:` section: there is no prefill pool to size"),
                "drop --prefill, or plan a workload with prefill and decode pools (workloads/cluster/pd/)",
            ));
        }
        (Some(_), _) if a.mix.is_some() => {
            return Err(flag_error(
                "--mix",
                "",
                format!(
                    "mixed-GPU lines are aggregated fleets (`cluster.pools`), and {shown} splits prefill from decode"
                ),
                "drop --mix (--prefill A..B searches the split), or plan a workload without `disaggregation:`",
            ));
        }
        _ => {}
    }
    if a.mix.is_some() && c.lockstep_group() > 1 {
        return Err(flag_error(
            "--mix",
            "",
            format!("GPU pools run single replicas, and {shown} groups them (`data_parallel`/`expert_parallel`)"),
            "drop --mix",
        ));
    }
    Ok(())
}

/// `--scalers`: a scaler per line kind (`none`: no scaler), or the workload's own.
fn scalers(a: &Args, w: &Workload) -> Result<Vec<Option<String>>, InputError> {
    let out: Vec<Option<String>> = match &a.scalers {
        Some(s) => {
            let l = list(s);
            if l.is_empty() {
                return Err(flag_error(
                    "--scalers",
                    "",
                    "names no scaler",
                    "use e.g. --scalers hpa,llm_d_wva, or --scalers none",
                ));
            }
            let mut out = Vec::new();
            for name in l {
                let s = (name != "none").then_some(name);
                if !out.contains(&s) {
                    out.push(s);
                }
            }
            out
        }
        None => vec![w.cluster.as_ref().and_then(|c| c.autoscaling.as_ref()).map(|x| x.scaler.clone())],
    };
    if scaled(&out) {
        match &w.cluster {
            None => {
                return Err(flag_error("--scalers", "", "the dispatch world has no autoscaling", "drop --scalers"));
            }
            Some(c) if c.disaggregation.as_ref().is_some_and(|d| d.mixed_instances() > 0) => {
                return Err(flag_error(
                    "--scalers",
                    "",
                    "autoscaling scales a disaggregated cluster's prefill and decode pools, and this one has \
                     mixed instances (`disaggregation.mixed`), in both pools at once",
                    "drop --scalers, or pass --scalers none",
                ));
            }
            _ => {}
        }
    }
    Ok(out)
}

pub fn run(a: Args) -> Result<i32> {
    let common = super::Common { json: a.json.clone(), report: a.report.clone(), ..Default::default() };
    output::check(&common)?;
    let (setup, ()) = slo_setup::load(&a.setup, |w, file| plannable(&a, w, file))?;
    let Setup { file, workload: w, target, specs, jobs } = setup;
    let gpus = gpus(&a, &w)?;
    if a.mix.is_some() && gpus.len() < 2 {
        let named = gpus.iter().map(|(g, _)| format!("`{g}`")).collect::<Vec<_>>().join(", ");
        return Err(flag_error(
            "--mix",
            "",
            format!("mixes two GPU types, and the plan has one ({named})"),
            format!("name two or more: --gpus {},{}", gpus[0].0, if gpus[0].0 == "h100" { "a6000" } else { "h100" }),
        )
        .into());
    }
    let tps = tps(&a, &w)?;
    let pd = w.cluster.as_ref().and_then(|c| c.disaggregation.as_ref());
    // A P/D line's count searched is decode's; the prefill counts each have a line.
    let own = match (&w.cluster, pd) {
        (_, Some(d)) => d.decode.instances,
        (Some(c), None) => c.replicas,
        (None, _) => w.dispatch.as_ref().map_or(1, |d| d.servers),
    };
    let (min_replicas, max_replicas) = match &a.replicas {
        Some(r) => parse_range("--replicas", r)?,
        None => (1, own.saturating_mul(2).clamp(1, workload::limits::MAX_REPLICAS)),
    };
    let prefill = match (&a.prefill, pd) {
        (Some(t), _) => Some(parse_range("--prefill", t)?),
        (None, Some(d)) => Some((d.prefill.instances, d.prefill.instances)),
        (None, None) => None,
    };
    let mixed_instances = pd.map_or(0, |d| d.mixed.as_ref().map_or(0, |m| m.instances));
    let scalers = scalers(&a, &w)?;
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
    // The lines: GPU × tp × router × (scaler, or prefill count), each GPU and degree checked to
    // run the model; then, with --mix, each two such (GPU, tp) of one degree × count × router.
    let mut lines = Vec::new();
    let mut line_gpus = Vec::new();
    let mut line_specs = Vec::new();
    let mut loader = Loader::new();
    let mut first_refusal = None;
    let mut notes = Vec::new();
    if let Some(d) = pd {
        let pools = [Some(&d.prefill), Some(&d.decode), d.mixed.as_ref()];
        if pools.into_iter().flatten().any(|p| p.gpu.is_some() || p.tp.is_some()) {
            notes.push("a P/D line runs every pool on its own GPU and tp: the pools' `gpu`/`tp` are not used".into());
        }
    }
    // (GPU index, tp) that run the model.
    let mut runnable: Vec<(usize, u32)> = Vec::new();
    let prefill_part = |count: u32, g: &str, tp: u32, per_hour: f64| Fixed {
        role: Role::Prefill,
        count,
        gpu: g.to_string(),
        tp,
        cost_per_hour: f64::from(count + mixed_instances) * f64::from(tp) * per_hour,
        choice: None,
    };
    for (gi, ((g, choice), price)) in gpus.iter().zip(&price_list).enumerate() {
        for &tp in &tps {
            let probe = Line {
                gpu: g.clone(),
                tp,
                policy: String::new(),
                spec: String::new(),
                scaler: scalers[0].clone(),
                replica_price: 0.0,
                fixed: prefill.map(|(_, hi)| prefill_part(hi, g, tp, 0.0)),
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
            runnable.push((gi, tp));
            let replica_price = price.per_hour * f64::from(tp);
            for spec in &specs {
                runner::resolve(&mut loader, &prepared, spec)?;
                let mut push = |scaler: Option<String>, fixed: Option<Fixed>| {
                    lines.push(Line {
                        gpu: g.clone(),
                        tp,
                        policy: spec.label.clone(),
                        spec: spec.arg.clone(),
                        scaler,
                        replica_price,
                        fixed,
                    });
                    line_gpus.push(choice.clone());
                    line_specs.push(spec.clone());
                };
                match prefill {
                    // A P/D line per prefill count × scaler: the counts are the pools' budgets.
                    Some((lo, hi)) => {
                        for count in lo..=hi {
                            for scaler in &scalers {
                                push(scaler.clone(), Some(prefill_part(count, g, tp, price.per_hour)));
                            }
                        }
                    }
                    None => {
                        for scaler in &scalers {
                            push(scaler.clone(), None);
                        }
                    }
                }
            }
        }
    }
    if let Some(n) = a.mix {
        for &(ga, tp) in &runnable {
            for &(gb, tp_b) in &runnable {
                if ga == gb || tp_b != tp {
                    continue;
                }
                let ((g, choice), (second, second_choice)) = (&gpus[ga], &gpus[gb]);
                for count in 1..=n {
                    let fixed = Fixed {
                        role: Role::Pool,
                        count,
                        gpu: second.clone(),
                        tp,
                        cost_per_hour: f64::from(count) * f64::from(tp) * price_list[gb].per_hour,
                        choice: Some(second_choice.clone()),
                    };
                    for spec in &specs {
                        lines.push(Line {
                            gpu: g.clone(),
                            tp,
                            policy: spec.label.clone(),
                            spec: spec.arg.clone(),
                            scaler: None,
                            replica_price: price_list[ga].per_hour * f64::from(tp),
                            fixed: Some(fixed.clone()),
                        });
                        line_gpus.push(choice.clone());
                        line_specs.push(spec.clone());
                    }
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
    let settings = Settings {
        min_replicas,
        max_replicas,
        start: own.clamp(min_replicas, max_replicas),
        budget: a.budget,
        prefill,
        mix: a.mix,
    };
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
    print!("{}", report::table(&doc, &target, a.setup.markdown));
    if let Some(path) = &a.json {
        std::fs::write(path, doc.json()).map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
    }
    if let Some(path) = &a.report {
        let argv: Vec<String> = std::env::args().collect();
        output::write_atomically(path, &plan::page::render(&doc, &target, &argv)?)?;
    }
    Ok(code)
}
