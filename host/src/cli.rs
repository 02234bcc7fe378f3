//! The command line (docs/output.md): arguments → typed options → run → report.
//!
//! Exit codes: 0 ok, 1 a run failed (a policy erred or panicked), 2 bad input (workload, trace,
//! library, policy name or config, output path). Errors are printed as `error: ` + lowercase
//! fragments.

mod accuracy;
mod args;
mod capacity;
mod checks;
mod diff;
mod docs;
mod help;
mod import;
mod merge;
mod output;
mod plan;
mod run;
mod slo_setup;
mod traces;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{CommandFactory, Parser};

pub use args::{Cli, Command, Common, Kind};

use crate::report;
use routelab_core::plugin::{ExtraKind, Loader, PolicySpec};
use routelab_core::runner::{self, Prepared, RunOptions, WorkloadResult};
use routelab_core::workload::{self, InputError};
use run::{exit_code_of_results, run_prepared};

impl Common {
    /// `--exact` or `--sketch`, as the workload's `cluster.summary`.
    fn summary(&self) -> Option<routelab_core::workload::cluster::Summary> {
        use routelab_core::workload::cluster::Summary;
        if self.exact {
            Some(Summary::Exact)
        } else if self.sketch {
            Some(Summary::Sketch)
        } else {
            None
        }
    }

    fn options(&self) -> RunOptions {
        RunOptions {
            seed: self.seed,
            seeds: self.seeds,
            start: self.start.clone(),
            trace: self.trace.clone(),
            slo: self.slo.clone(),
            summary: self.summary(),
        }
    }
}

/// Parses the process arguments, runs, prints; returns the exit code.
pub fn main() -> i32 {
    output::quiet_broken_pipes();
    let cli = Cli::parse();
    match execute(cli.command) {
        Ok(code) => code,
        Err(e) => {
            // A built-in workload by its name, wherever a message names its temporary copy.
            eprintln!("error: {}", routelab_core::builtin::shown(&format!("{e:#}")));
            exit_code_of(&e)
        }
    }
}

use routelab_core::error::exit_code_of;

fn execute(command: Command) -> Result<i32> {
    match command {
        Command::Demo => demo(),
        Command::Run { workload, policy, config, common } => {
            let mut spec = PolicySpec::parse(&policy)?;
            if let Some(f) = config {
                if !spec.config.is_empty() {
                    return Err(InputError::new(
                        f,
                        format!("'{policy}' already has inline config"),
                        "give the config either inline or with --config, not both",
                    )
                    .into());
                }
                spec.config = workload::limits::read_capped(
                    &f,
                    workload::limits::MAX_WORKLOAD_BYTES,
                    "policy config",
                    "check the path",
                )?;
            }
            spec.arg = policy.trim().to_string();
            compare_files(&[workload], Some(vec![spec]), &common, "run", true)
        }
        Command::Compare { workloads, policies, common } => {
            let specs = match policies {
                Some(s) => Some(checks::specs(&runner::split_policies(&s))?),
                None => None,
            };
            compare_files(&workloads, specs, &common, "compare", false)
        }
        Command::Sweep { workloads, policies, set, common } => {
            let specs = match policies {
                Some(s) => Some(checks::specs(&runner::split_policies(&s))?),
                None => None,
            };
            sweep(&workloads, specs, &set, &common)
        }
        Command::Capacity { setup, tolerance, max_loads, json, plot, report } => capacity::run(capacity::Args {
            setup,
            settings: crate::capacity::Settings { tolerance, max_points: max_loads },
            json,
            plot,
            report,
        }),
        Command::Plan { setup, gpus, tp, replicas, prefill, mix, scalers, budget, prices, json, report } => {
            plan::run(plan::Args { setup, gpus, tp, replicas, prefill, mix, scalers, budget, prices, json, report })
        }
        Command::Merge { files, json, markdown } => {
            if let Some(out) = &json {
                output::not_an_input("--json", out, &files)?;
            }
            let (command, results) = merge::merge(&files)?;
            let common = Common { json, markdown, ..Default::default() };
            output::check(&common)?;
            output::write(&common, &command, &results)?;
            for r in &results {
                print!("{}", report::table::render(r, markdown, None));
            }
            Ok(exit_code_of_results(&results, &mut Vec::new()))
        }
        Command::Diff { before, after, markdown } => diff::main(&before, &after, markdown),
        Command::Policies { plugin } => list_policies(plugin.as_deref()),
        Command::Workloads => {
            let list = routelab_core::builtin::list();
            let width = list.iter().map(|b| b.name.len()).max().unwrap_or(0);
            println!("built-in workloads (routelab compare NAME; the files: routelab validate NAME):");
            for b in list {
                println!("  {:<width$}  {}", b.name, b.summary);
            }
            Ok(0)
        }
        Command::Validate { workload, trace } => validate(&routelab_core::builtin::resolve(&workload)?, trace),
        Command::ExportTrace { workload, format: args::TraceFormat::Mooncake, out, seed } => {
            traces::export_trace(&routelab_core::builtin::resolve(&workload)?, &out, seed)
        }
        Command::Import { log, out, workload } => {
            let w = workload.map(|w| routelab_core::builtin::resolve(&w)).transpose()?;
            traces::import_log(&routelab_core::builtin::resolve_data(&log), &out, w.as_deref())
        }
        Command::Schema => {
            println!(
                "{}",
                serde_json::to_string_pretty(&routelab_core::schema::workload()).context("writing the schema")?
            );
            Ok(0)
        }
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "routelab", &mut std::io::stdout());
            Ok(0)
        }
        Command::StepModel { gpu, model, tp, calibration, tokens, cached } => {
            accuracy::step_model(&gpu, &model, tp, calibration, tokens.map(|t| (t, cached.unwrap_or(0))))
        }
        Command::Calibrate { profile, splitwise, gpu, hold_out_tp, runs, allreduce, name, out } => {
            use routelab_core::builtin::resolve_data;
            if let Some(csv) = splitwise {
                let gpu = gpu.expect("clap requires --gpu with --splitwise");
                return accuracy::calibrate_steps(&resolve_data(&csv), &gpu, hold_out_tp, name, out.as_deref());
            }
            let profile = profile.expect("clap requires PROFILE without --splitwise");
            let runs: Vec<PathBuf> = runs.iter().map(|r| resolve_data(r)).collect();
            let allreduce = allreduce.map(|a| resolve_data(&a));
            accuracy::calibrate(&resolve_data(&profile), &runs, allreduce.as_deref(), name, out.as_deref())
        }
        Command::Accuracy { runs, stream, gpu, model, tp, calibration, router, json } => {
            use routelab_core::builtin::resolve_data;
            let runs: Vec<PathBuf> = runs.iter().map(|r| resolve_data(r)).collect();
            let stream = stream.map(|s| resolve_data(&s));
            let how = routelab_core::accuracy::replay::Replay { gpu, model, tp, calibration: None, router };
            accuracy::accuracy(&runs, stream.as_deref(), how, calibration, json.as_deref())
        }
        Command::NewPolicy { dir, kind, name, api_path } => {
            if let Some(n) = &name {
                checks::new_policy_name(n)?;
            }
            let api = api_path.unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../policy-api"));
            let made = crate::scaffold::new_policy(&dir, kind, name.as_deref(), &api)?;
            println!("{made}");
            Ok(0)
        }
        Command::Exercise { number, list } => {
            if list || number.is_none() {
                print!("{}", crate::exercises::list());
                return Ok(0);
            }
            let n = number.expect("checked");
            let text = crate::exercises::run(n)?;
            print!("{text}");
            Ok(0)
        }
        Command::Docs { topic } => {
            let text = docs::show(topic.as_deref())?;
            print!("{text}");
            Ok(0)
        }
        Command::Bench { requests, plugin, routers, admission, agentic, runs, warmup, json } => {
            let opts = crate::bench::Options {
                requests,
                plugin,
                runs,
                warmup,
                routers,
                admission_only: admission,
                agentic_only: agentic,
            };
            let (_, report) = crate::bench::run(&opts, true)?;
            if let Some(path) = json {
                std::fs::write(&path, serde_json::to_string_pretty(&report)? + "\n")
                    .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
            }
            Ok(0)
        }
        Command::Serve(args) => routelab_serve::proxy::main(args),
        Command::Epp(args) => routelab_serve::epp::main(args),
        Command::Emulate(args) => routelab_serve::emulate::main(args),
        Command::Replay(args) => routelab_serve::replay::main(args),
        Command::GatewayBench(args) => routelab_serve::replay::bench(args),
        Command::IsolatedRun { request, result } => routelab_core::runner::isolate::child_main(&request, &result),
    }
}

/// The demo's workloads: (built-in name, its text, policies, what it shows).
pub const DEMO: &[(&str, &str, &str, &str)] = &[
    (
        "cluster/long_doc_qa",
        include_str!("../../workloads/cluster/long_doc_qa.yaml"),
        "round_robin,least_work_left,max_affinity,threshold_affinity,sglang_cache_aware,preble",
        "The cache-vs-balance dilemma: 4 Mistral-7B replicas on A6000s, long documents (~21K tokens).\n\
         Load-only routers make every replica recompute the documents; pure affinity herds all traffic\n\
         onto one replica; threshold affinity, SGLang's cache-aware router and Preble keep documents\n\
         where they are cached while bounding the imbalance.",
    ),
    (
        "exp_rho09",
        include_str!("../../workloads/dispatch/exp_rho09.yaml"),
        "random,round_robin,least_requests,power_of_two,least_work_left",
        "Classic dispatch: 16 FCFS servers at utilisation 0.9. Random is 16 M/M/1 queues (mean ≈ 10);\n\
         join-the-shortest-queue and least work left cut the mean several-fold.",
    ),
    (
        "case_study",
        include_str!("../../workloads/compound/case_study.yaml"),
        "greedy,llmselector",
        "Which model for each module: from C+C, end-to-end greedy search is stuck in a local optimum;\n\
         LLMSelector's per-module diagnoser finds A+B.",
    ),
];

fn demo() -> Result<i32> {
    println!("routelab demo: three routing problems, each a built-in workload (seeds as in the files)\n");
    let mut worst = 0;
    for (file, text, policies, what) in DEMO {
        let path = Path::new(file);
        let mut w = workload::parse(text, path)?;
        if let Some(c) = w.compound.as_mut() {
            c.print_training_table = false;
        }
        println!("{what}\n(rerun: routelab compare {file} --policies {policies})");
        let prepared = vec![runner::prepare(w, path)?];
        let specs = checks::specs(&runner::split_policies(policies))?;
        let mut show = |r: &WorkloadResult| -> Result<()> {
            println!("{}", report::table::render(r, false, None));
            Ok(())
        };
        let (_, code) = run_prepared(prepared, Some(&specs), &Common::default(), "demo", &mut show)?;
        worst = worst.max(code);
    }
    Ok(worst)
}

fn compare_files(
    files: &[PathBuf],
    policies: Option<Vec<PolicySpec>>,
    common: &Common,
    command: &str,
    vertical: bool,
) -> Result<i32> {
    output::check(common)?;
    let opts = common.options();
    let mut prepared = Vec::new();
    for f in &routelab_core::builtin::resolve_all(files)? {
        let mut w = workload::load(f)?;
        checks::overrides(&w, f, common)?;
        if let Some(specs) = &policies {
            checks::pairings(&w, specs)?;
        }
        opts.apply(&mut w);
        for w in runner::expand(w, f)? {
            if let (Some(c), Some(start)) = (&w.compound, &common.start) {
                c.resolve_allocation(start, "start").map_err(|e| InputError::from_field(Path::new("--start"), e))?;
            }
            prepared.push(runner::prepare(w, f)?);
        }
    }
    if common.all_starts {
        if common.isolate {
            return Err(InputError::new(
                "--isolate",
                "--all-starts runs in the host's process; --isolate does not cover it",
                "drop --isolate, or drop --all-starts",
            )
            .into());
        }
        return all_starts(&prepared, policies.as_deref());
    }
    for p in &prepared {
        if let Some(c) = p.workload.compound.as_ref().filter(|c| c.print_training_table) {
            println!("{}", routelab_core::sim::compound::training_table(c, p.workload.seed));
        }
    }
    let mut show = |r: &WorkloadResult| -> Result<()> {
        if vertical {
            print!("{}", render_vertical(r));
        } else {
            print!("{}", report::table::render(r, common.markdown, common.columns.as_deref()));
        }
        if let Some(dir) = &common.plot {
            for f in report::plot::comparison(dir, r)? {
                println!("plot: {}", f.display());
            }
        }
        Ok(())
    };
    let (results, code) = run_prepared(prepared, policies.as_deref(), common, command, &mut show)?;
    output::report(common, command, &results, None)?;
    Ok(code)
}

/// `compare --all-starts`: every selector from every starting allocation of a small system.
fn all_starts(prepared: &[Prepared], policies: Option<&[PolicySpec]>) -> Result<i32> {
    let mut loader = Loader::new();
    for p in prepared {
        let specs = match policies {
            Some(s) => s.to_vec(),
            None => checks::specs(&p.workload.policies)?,
        };
        let mut t = comfy_table::Table::new();
        t.load_style(comfy_table::presets::UTF8_FULL_CONDENSED);
        t.set_header(vec!["selector", "reached the optimum", "mean evaluations", "failed from"]);
        let mut optimum = String::new();
        for spec in &specs {
            let r = runner::all_starts(&runner::resolve(&mut loader, p, spec)?, p)?;
            optimum = format!("{} (train accuracy {:.3})", r.optimum.join("+"), r.optimum_train_accuracy);
            let failed: Vec<String> = r.failed_from.iter().map(|a| a.join("+")).collect();
            t.add_row(vec![
                spec.label.clone(),
                format!("{}/{}", r.successes, r.starts),
                format!("{:.1}", r.mean_evaluations),
                failed.join(" "),
            ]);
        }
        println!(
            "{} [compound world, seed {}]: every starting allocation; optimum {optimum}\n{t}",
            p.workload.name, p.workload.seed
        );
    }
    Ok(0)
}

/// `sweep`: every workload at every point of the `--set` fields, in one run (one JSON document).
fn sweep(files: &[PathBuf], policies: Option<Vec<PolicySpec>>, sets: &[String], common: &Common) -> Result<i32> {
    output::check(common)?;
    let bad = |m: String| {
        InputError::new("--set", m, "write --set field.path=v1,v2,v3 (e.g. arrivals.poisson.rate=1,2,4 or =x0.5,x1,x2)")
    };
    let mut fields: Vec<(&str, Vec<String>)> = Vec::new();
    for set in sets {
        let (field, values) = set.split_once('=').ok_or_else(|| bad(format!("`{set}` has no `=`")))?;
        fields.push((field, runner::split_policies(values)));
    }
    let points = fields[0].1.len();
    if points == 0 || fields.iter().any(|(_, v)| v.len() != points) {
        return Err(bad("every --set needs the same, non-zero number of values".into()).into());
    }
    let mut prepared = Vec::new();
    let mut names = Vec::new();
    for file in &routelab_core::builtin::resolve_all(files)? {
        let base = workload::load(file)?;
        checks::overrides(&base, file, common)?;
        if let Some(specs) = &policies {
            checks::pairings(&base, specs)?;
        }
        let doc: serde_norway::Value = serde_norway::from_str(&workload::load_text(file)?)
            .with_context(|| format!("parsing {}", file.display()))?;
        for k in 0..points {
            let sets: Vec<(&str, &str)> = fields.iter().map(|(f, v)| (*f, v[k].as_str())).collect();
            let mut w = runner::parse_with_sets(&doc, file, &sets)?;
            common.options().apply(&mut w);
            let label: Vec<String> = sets.iter().map(|(f, v)| format!("{f}={v}")).collect();
            w.name = format!("{}[{}]", base.name, label.join(", "));
            prepared.push(runner::prepare(w, file)?);
        }
        names.push(base.name);
    }
    let mut show = |r: &WorkloadResult| -> Result<()> {
        print!("{}", report::table::render(r, common.markdown, common.columns.as_deref()));
        Ok(())
    };
    let (results, code) = run_prepared(prepared, policies.as_deref(), common, "sweep", &mut show)?;
    if let Some(dir) = &common.plot {
        for (name, chunk) in names.iter().zip(results.chunks(points)) {
            for f in report::plot::sweep(dir, name, fields[0].0, chunk)? {
                println!("plot: {}", f.display());
            }
        }
    }
    let moved = report::html::Sweep { field: fields[0].0, names: &names, points };
    output::report(common, "sweep", &results, Some(moved))?;
    Ok(code)
}

fn render_vertical(w: &WorkloadResult) -> String {
    let mut out = format!("{} [{} world, seed {}, {} seed(s)]\n", w.name, w.world, w.seed, w.seeds);
    for r in &w.results {
        out.push_str(&format!("policy {}\n", r.policy));
        if let Some(e) = &r.error {
            out.push_str(&format!("  FAILED: {e}\n"));
            continue;
        }
        for (k, v) in &r.metrics.0 {
            out.push_str(&format!("  {k:<28} {}\n", report::table::fmt_num(*v)));
        }
    }
    for n in &w.notes {
        out.push_str(&format!("note: {n}\n"));
    }
    out
}

fn list_policies(plugin: Option<&Path>) -> Result<i32> {
    let mut loader = Loader::new();
    let list = loader.list(plugin)?;
    let mut t = comfy_table::Table::new();
    t.load_style(comfy_table::presets::UTF8_FULL_CONDENSED);
    t.set_header(vec!["name", "kind", "description", "default config"]);
    for l in list {
        t.add_row(vec![
            l.name,
            l.kind.as_str().to_string(),
            l.description,
            l.default_config.map_or_else(|e| format!("(unavailable: {e})"), |c| c.trim().to_string()),
        ]);
    }
    // Admission policies (policy-api 0.5.2) and scalers (0.5.4) have their own listings:
    // `PolicyKind` cannot grow.
    for (kind, label) in [(ExtraKind::Admission, "admission"), (ExtraKind::Scaler, "scaler")] {
        for (name, description, config) in loader.extra_list(kind, plugin)? {
            t.add_row(vec![name, label.to_string(), description, config.trim().to_string()]);
        }
    }
    println!("{t}");
    Ok(0)
}

fn validate(file: &Path, trace: Option<PathBuf>) -> Result<i32> {
    let mut w = workload::load(file)?;
    checks::overrides(&w, file, &Common { trace: trace.clone(), ..Default::default() })?;
    RunOptions { trace, ..Default::default() }.apply(&mut w);
    // Every run `compare` would make of it: compound variants each on their own.
    let mut loader = Loader::new();
    for v in runner::expand(w.clone(), file)? {
        checks::policy_builds(&mut loader, &runner::prepare(v, file)?, file)?;
    }
    let prepared = runner::prepare(w, file)?;
    // The file's policies' own state counts here (loading left it to the command that runs them).
    workload::estimate::check_memory(&prepared.workload).map_err(|e| InputError::from_field(file, e))?;
    // Everything but the resolved workload is a comment: `validate X > w.yaml` round-trips.
    let shown = routelab_core::builtin::shown(&file.display().to_string()).into_owned();
    println!("# {shown}: ok ({} world)", prepared.workload.world().as_str());
    print!(
        "{}",
        serde_norway::to_string(&resolved_paths(&prepared.workload, file)).context("printing the resolved workload")?
    );
    let stats = runner::cluster_stats(&prepared)?;
    let requests = stats.as_ref().map(|(_, n)| *n);
    println!("# estimate: {}", workload::estimate::estimate_with(&prepared.workload, requests));
    for n in &prepared.notes {
        println!("# note: {n}");
    }
    if let Some((stats, _)) = stats {
        println!("# generated stream (seed {}):", prepared.workload.seed);
        for line in stats.lines() {
            println!("# {line}");
        }
    }
    Ok(0)
}

/// The workload with its trace path absolute, so `validate`'s output runs from anywhere.
fn resolved_paths(w: &workload::Workload, file: &Path) -> workload::Workload {
    let mut w = w.clone();
    let absolute = |p: &mut String| {
        let full = runner::relative_to(file, p);
        *p = std::path::absolute(&full).unwrap_or(full).to_string_lossy().into_owned();
    };
    if let Some(routelab_core::workload::dispatch::Arrivals::Trace { path }) =
        w.dispatch.as_mut().map(|d| &mut d.arrivals)
    {
        absolute(path);
    }
    if let Some(routelab_core::workload::cluster::Arrivals::Trace { path, .. }) =
        w.cluster.as_mut().map(|c| &mut c.arrivals)
    {
        absolute(path);
    }
    w
}
