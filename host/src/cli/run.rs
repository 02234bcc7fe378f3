//! Running prepared workloads for `run`, `compare`, `sweep` and `demo`: on `-j` threads
//! ([`runner::parallel`]), tables shown as workloads complete, JSON/CSV or a shard's cells
//! written as policies complete, a progress bar on terminals.

use std::io::IsTerminal;
use std::time::Duration;

use anyhow::{Context, Result};

use super::args::Common;
use super::{checks, merge, output};
use routelab_core::plugin::{Loader, PolicySpec};
use routelab_core::runner::isolate;
use routelab_core::runner::parallel::{self, Event, Planned, PolicyOutput};
use routelab_core::runner::{self, Prepared, WorkloadResult};
use routelab_core::workload::InputError;

/// Runs every prepared workload's cells on `-j` threads (docs/scale.md); writes JSON/CSV after
/// each policy, and shows each workload (`show`) as soon as it and those before it are done, in
/// order; prints failures to stderr. Under `--shard` writes the shard's cells instead and shows
/// nothing (a slice of the seeds is no result).
pub fn run_prepared(
    prepared: Vec<Prepared>,
    policies: Option<&[PolicySpec]>,
    common: &Common,
    command: &str,
    show: &mut dyn FnMut(&WorkloadResult) -> Result<()>,
) -> Result<(Vec<WorkloadResult>, i32)> {
    let mut loader = Loader::new();
    let mut plan = Vec::new();
    for p in &prepared {
        let specs = match policies {
            Some(s) => s.to_vec(),
            None => checks::specs(&p.workload.policies).with_context(|| format!("workload {}", p.workload.name))?,
        };
        checks::pairings(&p.workload, &specs)?;
        if specs.is_empty() {
            return Err(InputError::new(
                &p.workload.name,
                "no policies to run",
                "pass --policies a,b,c or list `policies:` in the workload",
            )
            .in_field("policies")
            .into());
        }
        plan.push(Planned::new(&mut loader, p, specs, common.isolate));
    }
    let opts = parallel::Options {
        jobs: common.jobs.map_or_else(parallel::all_cores, |j| j as usize),
        shard: common.shard,
        isolate: common.isolate.then(|| isolate::Limits {
            timeout: Duration::from_secs(common.policy_timeout),
            memory_mib: common.policy_memory,
        }),
    };
    // The workload's own check counts one run; -j holds that many at once. The policies are those
    // this command runs (`--policies` or the file's list): each router's own state counts.
    for planned in &plan {
        let mut w = planned.prepared.workload.clone();
        w.policies = planned.specs.iter().map(|s| s.arg.clone()).collect();
        routelab_core::workload::estimate::check_memory_jobs(&w, opts.jobs)
            .map_err(|e| InputError::from_field(&planned.prepared.file, e))?;
    }
    let bar = progress_bar(parallel::runs(&plan, &opts));
    let mut done: Vec<WorkloadResult> = Vec::new();
    let mut shard_done: Vec<merge::ShardWorkload> = Vec::new();
    let mut printed: Vec<String> = Vec::new();
    let mut failure: Option<anyhow::Error> = None;
    parallel::run(&plan, &opts, &mut |event| match event {
        Event::Started { w, p } => {
            bar.set_message(format!("{} · {}", plan[w].prepared.workload.name, plan[w].specs[p].label));
        }
        Event::Ran { runs } => bar.inc(runs),
        Event::PolicyDone { w, p, output } => {
            let spec = &plan[w].specs[p];
            if p == 0 {
                done.push(WorkloadResult::empty(plan[w].prepared));
            }
            let current = done.last_mut().expect("pushed at its first policy");
            let written = match (output, common.shard) {
                (PolicyOutput::Cells(cells), Some(shard)) => {
                    if p == 0 {
                        shard_done.push(merge::ShardWorkload::of(current));
                    }
                    // For the errors and exit code only: a slice of the seeds is no summary.
                    current.results.push(runner::assemble(runner::empty_result(spec), cells));
                    shard_done.last_mut().expect("pushed").results.push(merge::ShardPolicy {
                        policy: spec.label.clone(),
                        spec: spec.arg.clone(),
                        config: spec.config.clone(),
                        cells: std::mem::take(cells),
                    });
                    let path = common.json.as_deref().expect("checked: --shard needs --json");
                    output::write_progress(path, &merge::render(command, shard, &shard_done))
                }
                (output, _) => {
                    current.results.push(match output {
                        PolicyOutput::Cells(cells) => runner::assemble(runner::empty_result(spec), cells),
                        PolicyOutput::Whole(r) => std::mem::replace(r, runner::empty_result(spec)),
                    });
                    output::write_interim(common, command, &done)
                }
            };
            if let Err(e) = written {
                eprintln!("error: {e:#}");
            }
            if p + 1 == plan[w].specs.len() {
                let current = done.last().expect("pushed");
                exit_code_of_results(std::slice::from_ref(current), &mut printed);
                if common.shard.is_none() && failure.is_none() {
                    // After the last table the bar is gone for good, not drawn again below it.
                    let shown = if w + 1 == plan.len() {
                        bar.finish_and_clear();
                        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
                        show(current)
                    } else {
                        bar.suspend(|| show(current))
                    };
                    if let Err(e) = shown {
                        failure = Some(e);
                    }
                }
            }
        }
    });
    bar.finish_and_clear();
    if let Some(e) = failure {
        return Err(e);
    }
    let code = exit_code_of_results(&done, &mut printed);
    if let Some(shard) = common.shard {
        output::write_atomically(
            common.json.as_deref().expect("checked"),
            &merge::render(command, shard, &shard_done),
        )?;
        let cells: usize = shard_done.iter().flat_map(|w| &w.results).map(|r| r.cells.len()).sum();
        let path = common.json.as_deref().expect("checked").display();
        println!(
            "shard {}/{}: {cells} cells written to {path} (join the shards with routelab merge)",
            shard.index, shard.count
        );
        return Ok((Vec::new(), code));
    }
    output::write(common, command, &done)?;
    Ok((done, code))
}

/// The exit code of finished results: 2 when a policy failed on bad input, 1 when one failed
/// otherwise; each distinct error is printed once to stderr unless already in `printed` (a bad
/// policy fails on every workload of a sweep alike: say it once).
pub fn exit_code_of_results(results: &[WorkloadResult], printed: &mut Vec<String>) -> i32 {
    let mut code = 0;
    for w in results {
        for r in &w.results {
            if let Some(e) = &r.error {
                if !printed.contains(e) {
                    eprintln!("error: {}: {}", w.name, routelab_core::builtin::shown(e));
                    printed.push(e.clone());
                }
                code = code.max(if r.input_error { 2 } else { 1 });
            }
        }
    }
    code
}

/// A progress bar on stderr naming the workload (with its sweep point) and policy last started,
/// with an ETA; hidden unless both stdout and stderr are terminals, so piped or redirected
/// output is exactly the tables.
fn progress_bar(total: u64) -> indicatif::ProgressBar {
    if !std::io::stdout().is_terminal() || !std::io::stderr().is_terminal() || total < 2 {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} runs, eta {eta} {msg}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar
}
