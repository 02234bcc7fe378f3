//! `routelab step-model`, `calibrate` and `accuracy`: the step model, fitted to measurements and
//! held against measured runs.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use comfy_table::{Cell, CellAlignment, Table, presets::UTF8_FULL_CONDENSED};
use routelab_core::accuracy::replay::{self, Replay, RunAccuracy};
use routelab_core::accuracy::{self as acc, METRICS};
use routelab_core::step_model::catalog::{gpu_for_device, model_for_name};
use routelab_core::step_model::{self, Calibration, Choice, StepModel, fit};
use routelab_core::workload::InputError;

use super::output::write_atomically;

/// A shipped profile by name, or a profile file (what `routelab calibrate --out` writes).
fn shipped(name: &str) -> Result<Calibration, InputError> {
    let path = Path::new(name);
    if path.is_file() {
        let fix = "give a file written by `routelab calibrate --out`";
        let text =
            std::fs::read_to_string(path).map_err(|e| InputError::new(path, format!("cannot read it: {e}"), fix))?;
        let c: Calibration =
            serde_norway::from_str(&text).map_err(|e| InputError::new(path, format!("not a profile: {e}"), fix))?;
        c.check().map_err(|(field, m)| InputError::new(path, m, fix).in_field(field))?;
        return Ok(c);
    }
    Choice::<Calibration>::Name(name.into()).resolve().map_err(|e| {
        InputError::command_line(
            "--calibration",
            e.to_string(),
            format!(
                "name a shipped profile ({}), a profile file, or `roofline`",
                routelab_core::step_model::calibrated::shipped_names()
            ),
        )
    })
}

/// `routelab step-model`: the overview, or with `prefill` = (tokens, cached) one prefill priced
/// with and without attention over the cached part.
pub fn step_model(
    gpu: &str,
    model: &str,
    tp: u32,
    calibration: Option<String>,
    prefill: Option<(u64, u64)>,
) -> Result<i32> {
    let bad = |e: step_model::DoesNotFit| InputError::command_line("step-model", e.message, &e.fix);
    if let Some((tokens, cached)) = prefill {
        if tokens == 0 || cached > tokens {
            let message = format!("--cached {cached} with --tokens {tokens}: the cached tokens are part of the prompt");
            return Err(InputError::command_line(
                "--cached",
                message,
                "give --tokens ≥ 1 and --cached at most --tokens",
            )
            .into());
        }
    }
    if ![1, 2, 4, 8].contains(&tp) {
        let fix = "pass --tp 1, 2, 4 or 8";
        return Err(InputError::command_line("--tp", format!("tp must be 1, 2, 4 or 8 (got {tp})"), fix).into());
    }
    let mut sm = StepModel::from_catalog(gpu, model, tp, 0.9).map_err(bad)?;
    if let Some(name) = calibration {
        let c = shipped(&name)?;
        if c.gpu != gpu {
            let fix = format!("pass --gpu {}", c.gpu);
            return Err(
                InputError::command_line("--calibration", format!("'{name}' was measured on {}", c.gpu), &fix).into()
            );
        }
        sm = sm.calibrated(c);
    }
    let text = match prefill {
        None => step_model::describe_model(&sm),
        Some((tokens, cached)) => {
            let header = step_model::describe_model(&sm).lines().next().unwrap_or_default().to_string();
            format!("{header}\n{}", step_model::describe_prefill(&sm, tokens, cached))
        }
    };
    print!("{text}");
    Ok(0)
}

/// The catalog GPU and model a profile folder's `meta.yaml` names.
fn profile_meta(dir: &Path) -> Result<(String, String), InputError> {
    let file = dir.join("meta.yaml");
    let fix = "meta.yaml must name `gpu:` (the device) and `model:` (the engine's model name)";
    let text =
        std::fs::read_to_string(&file).map_err(|e| InputError::new(&file, format!("cannot read it: {e}"), fix))?;
    let v: serde_norway::Value =
        serde_norway::from_str(&text).map_err(|e| InputError::new(&file, format!("not YAML: {e}"), fix))?;
    let field = |k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_string);
    let device = field("gpu")
        .or_else(|| field("hardware"))
        .ok_or_else(|| InputError::new(&file, "missing", fix).in_field("gpu"))?;
    let model = field("model").ok_or_else(|| InputError::new(&file, "missing", fix).in_field("model"))?;
    let gpu = gpu_for_device(&device).ok_or_else(|| {
        InputError::new(&file, format!("unknown device '{device}'"), "add the GPU to the catalog").in_field("gpu")
    })?;
    let model = model_for_name(&model).ok_or_else(|| {
        InputError::new(&file, format!("unknown model '{model}'"), "add the model to the catalog").in_field("model")
    })?;
    Ok((gpu.into(), model.into()))
}

pub fn calibrate(
    profile: &Path,
    runs: &[PathBuf],
    allreduce: Option<&Path>,
    name: Option<String>,
    out: Option<&Path>,
) -> Result<i32> {
    let (gpu, model_name) = profile_meta(profile)?;
    let model = step_model::model(&model_name).expect("a catalog name");
    let name = name.unwrap_or_else(|| gpu.clone());
    let bundles = runs.iter().map(|r| acc::load(r, None)).collect::<Result<Vec<_>, _>>()?;
    let source = format!(
        "kernel terms: layer timings of {model_name} measured inside vLLM ({}); overhead per step and layer: {}",
        profile.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
        if bundles.is_empty() {
            "not fitted (0)".to_string()
        } else {
            format!("fitted to mean TPOT of {}", bundles.iter().map(|b| b.name.as_str()).collect::<Vec<_>>().join(", "))
        }
    );
    let mut base = Calibration::unfitted(&name, &gpu, &source);
    // Fitted on runs, the profile describes their engine: async scheduling unless a run turned
    // it off (vLLM's default since PR #27614; `sim/cluster/replica/async_sched.rs`).
    base.async_scheduling = !bundles.is_empty() && bundles.iter().all(|b| b.meta.async_scheduling.unwrap_or(true));
    let measurement = |e: fit::MeasurementError| {
        InputError::new(&e.file, e.message, "see `routelab docs accuracy` for the layout")
            .in_field(e.field)
            .at_line(e.line)
    };
    let mut c = fit::fit_kernels(profile, &model, &base).map_err(measurement)?;
    if let Some(f) = allreduce {
        c = fit::fit_allreduce(f, 2, model.bytes_per_element, &c).map_err(measurement)?;
        c.source.push_str(&format!("; all-reduce: fitted to {}", f.display()));
    }
    let mut overhead_error = None;
    if !bundles.is_empty() {
        let how = Replay { calibration: Some(c.clone()), ..Replay::default() };
        let (fitted, e) = replay::fit_step_overhead(&bundles, &how)?;
        c = fitted;
        overhead_error = Some(e);
    }
    eprintln!("fitted {} on {gpu} from {model_name}:", c.name);
    let mut t = Table::new();
    t.load_style(UTF8_FULL_CONDENSED).set_header(["term", "value", "points", "median error", "P90 error"]);
    let row = |t: &mut Table, term: &str, value: String, fit: Option<&step_model::calibrated::TermFit>| {
        let f = |x: f64| format!("{:.1}%", x * 100.0);
        t.add_row(vec![
            Cell::new(term),
            Cell::new(value).set_alignment(CellAlignment::Right),
            Cell::new(fit.map_or("-".into(), |f| f.points.to_string())),
            Cell::new(fit.map_or("-".into(), |x| f(x.median_error))),
            Cell::new(fit.map_or("-".into(), |x| f(x.p90_error))),
        ]);
    };
    let (d, a, h) = (c.fit.get("dense"), c.fit.get("attention"), c.fit.get("head"));
    row(
        &mut t,
        "dense (per layer)",
        format!(
            "{:.0} GB/s, {:.0} TFLOP/s, base {:.3} × weight read",
            c.dense_gb_s, c.dense_tflops, c.dense_base_share
        ),
        d,
    );
    row(
        &mut t,
        "attention (per layer)",
        format!(
            "{:.0} TFLOP/s, {:.0} GB/s ({:.0} per query head mixed), {:.1} µs + {:.2} µs/decode",
            c.attention_tflops,
            c.attention_gb_s,
            c.attention_mixed_head_gb_s,
            c.attention_base_s * 1e6,
            c.attention_per_decode_s * 1e6
        ),
        a,
    );
    row(
        &mut t,
        "LM head + sampler",
        format!("{:.0} GB/s + {:.2} µs/sequence", c.head_gb_s, c.head_per_sequence_s * 1e6),
        h,
    );
    let oh = format!(
        "{:.3} ms + {:.1} µs per layer ({:.3} ms a step of {model_name}){}",
        c.step_overhead_s * 1e3,
        c.layer_overhead_s * 1e6,
        (c.step_overhead_s + model.layers as f64 * c.layer_overhead_s) * 1e3,
        overhead_error.map_or(" (not fitted)".into(), |e| format!(" (mean TPOT error after fit {:+.1}%)", e * 100.0))
    );
    row(&mut t, "per-step overhead", oh, None);
    let ar = c.fit.get("allreduce");
    let how = if ar.is_some() { "two GPUs, measured" } else { "default, not fitted" };
    let value = format!("{:.1} µs, {:.1} GB/s ({how})", c.allreduce_s * 1e6, c.allreduce_gb_s);
    row(&mut t, "all-reduce (tp > 1)", value, ar);
    eprintln!("{t}");
    write_profile(&c, out)
}

/// `routelab calibrate --splitwise CSV --gpu G [--hold-out-tp N]`: a profile fitted to whole
/// steps measured end to end (`fit::fit_steps`), its terms, its error on the steps fitted and, with
/// a held-out TP degree, on the steps it never saw.
pub fn calibrate_steps(
    csv: &Path,
    gpu: &str,
    hold_out_tp: Option<u32>,
    name: Option<String>,
    out: Option<&Path>,
) -> Result<i32> {
    use routelab_core::accuracy::splitwise;
    let file = csv.display().to_string();
    let text = std::fs::read_to_string(csv)
        .map_err(|e| InputError::new(&file, format!("cannot read it: {e}"), "give Splitwise's perf_model.csv"))?;
    let points = splitwise::parse(&text).map_err(|(line, field, message)| {
        InputError::new(&file, message, "give the rows of Splitwise's perf_model.csv: its header, 11 columns, sizes and times (ms) as positive numbers")
            .in_field(field)
            .at_line(Some(line))
    })?;
    let Some(spec) = step_model::gpu(gpu) else {
        return Err(
            InputError::command_line("--gpu", format!("'{gpu}' is not a catalog GPU"), "use a100-80 or h100").into()
        );
    };
    let mine: Vec<_> = points.into_iter().filter(|p| p.gpu == gpu).collect();
    let (test, train): (Vec<_>, Vec<_>) = mine.into_iter().partition(|p| Some(p.tp) == hold_out_tp);
    if train.is_empty() {
        return Err(InputError::command_line(
            "--gpu",
            format!(
                "{file} has no Llama-2-70B steps on {gpu} to fit{}",
                if hold_out_tp.is_some() { " (beside the held-out TP)" } else { "" }
            ),
            "use a100-80 or h100 (the GPUs of Splitwise's characterisation), or hold out another TP",
        )
        .into());
    }
    if hold_out_tp.is_some() && test.is_empty() {
        return Err(InputError::command_line(
            "--hold-out-tp",
            format!("{file} has no steps at that TP on {gpu}"),
            "use 2, 4 or 8",
        )
        .into());
    }
    let model = step_model::model("llama-2-70b").expect("a catalog model");
    let name = name.unwrap_or_else(|| gpu.to_string());
    let tps: Vec<String> = {
        let mut v: Vec<u32> = train.iter().map(|p| p.tp).collect();
        v.sort();
        v.dedup();
        v.iter().map(u32::to_string).collect()
    };
    let source = format!(
        "whole steps: Llama-2-70B prefill and decode times on {gpu} at TP {} ({}), fitted end to end",
        tps.join(", "),
        csv.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned())
    );
    let base = Calibration::unfitted(&name, gpu, &source);
    let c = fit::fit_steps(&splitwise::steps(&train), &model, &spec, &base);
    eprintln!("fitted {} on {gpu} from {} whole steps of llama-2-70b:", c.name, 2 * train.len());
    let mut t = Table::new();
    t.load_style(UTF8_FULL_CONDENSED).set_header(["term", "value", "steps", "median error", "P90 error"]);
    let f = |x: f64| format!("{:.1}%", x * 100.0);
    let mut row = |term: &str, value: String, fit: Option<&step_model::calibrated::TermFit>| {
        t.add_row(vec![
            Cell::new(term),
            Cell::new(value).set_alignment(CellAlignment::Right),
            Cell::new(fit.map_or("-".into(), |x| x.points.to_string())),
            Cell::new(fit.map_or("-".into(), |x| f(x.median_error))),
            Cell::new(fit.map_or("-".into(), |x| f(x.p90_error))),
        ]);
    };
    row("dense (per layer)", format!("{:.0} GB/s, {:.0} TFLOP/s", c.dense_gb_s, c.dense_tflops), None);
    row("attention (per layer)", format!("{:.0} TFLOP/s, {:.0} GB/s", c.attention_tflops, c.attention_gb_s), None);
    row(
        "per-step overhead",
        format!("{:.3} ms + {:.1} µs per layer", c.step_overhead_s * 1e3, c.layer_overhead_s * 1e6),
        None,
    );
    row("all-reduce (tp > 1)", format!("{:.1} µs, {:.1} GB/s", c.allreduce_s * 1e6, c.allreduce_gb_s), None);
    row(&format!("whole steps, TP {} (fitted)", tps.join(", ")), String::new(), c.fit.get("steps"));
    if let Some(tp) = hold_out_tp {
        let held = splitwise::steps(&test);
        let errs = fit::step_errors(&held, &model, &c);
        let fitted = fit::term_fit(errs.iter().map(|e| (1.0 + e, 1.0)));
        row(&format!("whole steps, TP {tp} (held out)"), String::new(), Some(&fitted));
    }
    eprintln!("{t}");
    write_profile(&c, out)
}

/// Writes profile `c` as YAML to `out`, or prints it.
fn write_profile(c: &Calibration, out: Option<&Path>) -> Result<i32> {
    let yaml = serde_norway::to_string(c).context("writing the profile")?;
    match out {
        Some(p) => {
            write_atomically(p, &yaml)?;
            eprintln!("wrote {}", p.display());
        }
        None => print!("{yaml}"),
    }
    Ok(0)
}

/// The shipped run folders (written out with the built-in workloads).
fn shipped_runs() -> Result<Vec<PathBuf>> {
    let root = routelab_core::builtin::extracted().context("writing out the shipped runs")?.join("ground-truth");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .with_context(|| format!("reading {}", root.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    Ok(dirs)
}

fn pct(x: f64) -> String {
    if x.is_finite() { format!("{:+.1}%", x * 100.0) } else { "-".into() }
}

fn abs_pct(x: f64) -> String {
    if x.is_finite() { format!("{:.1}%", x * 100.0) } else { "-".into() }
}

pub fn accuracy(
    runs: &[PathBuf],
    stream: Option<&Path>,
    base: Replay,
    calibration: Option<String>,
    json: Option<&Path>,
) -> Result<i32> {
    if stream.is_some() && runs.len() != 1 {
        return Err(
            InputError::command_line("--stream", "goes with exactly one run folder", "name one run folder").into()
        );
    }
    let dirs = if runs.is_empty() { shipped_runs()? } else { runs.to_vec() };
    // Every bundle read and checked before any replay.
    let bundles = dirs.iter().map(|d| acc::load(d, stream)).collect::<Result<Vec<_>, _>>()?;
    let mut results: Vec<(RunAccuracy, String)> = Vec::new();
    for b in &bundles {
        let mut how = base.clone();
        let g = replay::engine_spec(b, &how)?.step_model().map_err(|e| InputError::from_field(&b.dir, e))?.gpu.name;
        let label = match calibration.as_deref() {
            Some("roofline") => "roofline".to_string(),
            Some(name) => {
                let c = shipped(name)?;
                let label = c.name.clone();
                how.calibration = Some(c);
                label
            }
            None => match shipped(&g) {
                Ok(c) => {
                    how.calibration = Some(c);
                    g.clone()
                }
                Err(_) => "roofline".to_string(),
            },
        };
        results.push((replay::replay(b, &how)?, label));
    }
    for (r, label) in &results {
        println!("{} — {} on {} (tp {}), step model: {label}", r.run, r.model, r.gpu, r.tp);
        let mut t = Table::new();
        t.load_style(UTF8_FULL_CONDENSED).set_header(["figure", "measured [s]", "simulated [s]", "error"]);
        for (k, c) in &r.figures {
            t.add_row(vec![
                Cell::new(k),
                Cell::new(format!("{:.4}", c.real)).set_alignment(CellAlignment::Right),
                Cell::new(format!("{:.4}", c.sim)).set_alignment(CellAlignment::Right),
                Cell::new(pct(c.error)).set_alignment(CellAlignment::Right),
            ]);
        }
        println!("{t}\n");
    }
    let runs_only: Vec<RunAccuracy> = results.iter().map(|(r, _)| r.clone()).collect();
    let mut t = Table::new();
    t.load_style(UTF8_FULL_CONDENSED).set_header(["figure", "median |error|", "mean |error|"]);
    for k in METRICS {
        let (median, mean) = replay::across(&runs_only, k);
        t.add_row(vec![Cell::new(k), Cell::new(abs_pct(median)), Cell::new(abs_pct(mean))]);
    }
    println!("across {} runs\n{t}", runs_only.len());
    if let Some(path) = json {
        let runs_json: Vec<serde_json::Value> = results
            .iter()
            .map(|(r, label)| {
                let figs: serde_json::Map<String, serde_json::Value> = r
                    .figures
                    .iter()
                    .map(|(k, c)| (k.to_string(), serde_json::json!({"real": c.real, "sim": c.sim, "error": c.error})))
                    .collect();
                serde_json::json!({"run": r.run, "gpu": r.gpu, "model": r.model, "tp": r.tp, "step_model": label, "figures": figs})
            })
            .collect();
        let across: serde_json::Map<String, serde_json::Value> = METRICS
            .iter()
            .map(|k| {
                let (median, mean) = replay::across(&runs_only, k);
                (k.to_string(), serde_json::json!({"median_abs_error": median, "mean_abs_error": mean}))
            })
            .collect();
        let doc = serde_json::json!({"routelab": env!("CARGO_PKG_VERSION"), "runs": runs_json, "across": across});
        write_atomically(path, &serde_json::to_string_pretty(&doc)?)?;
    }
    Ok(0)
}
