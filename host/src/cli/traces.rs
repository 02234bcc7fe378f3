//! `routelab export-trace` and `routelab import`: request streams out of and into the simulator.

use std::path::Path;

use anyhow::Result;

use super::{import, output};
use routelab_core::runner;
use routelab_core::workload::{self, InputError};

/// `routelab export-trace`: the stream of the workload's first seed (or `seed`) as Mooncake JSONL.
pub(super) fn export_trace(file: &Path, out: &Path, seed: Option<u64>) -> Result<i32> {
    let mut w = workload::load(file)?;
    if w.cluster.is_none() {
        return Err(InputError::new(
            file,
            format!(
                "only cluster workloads have request streams to export (this is a {} workload)",
                w.world().as_str()
            ),
            "pick a workload with a `cluster:` section (`routelab workloads` lists them)",
        )
        .in_field("cluster")
        .into());
    }
    if let Some(s) = seed {
        w.seed = s;
    }
    output::check_writable("--out", out)?;
    let prepared = runner::prepare(w, file)?;
    let input = prepared.seed_input(0)?;
    let stream = input.stream().expect("cluster world");
    // A device or a full disk can refuse what the probe above could not test without writing.
    let unwritable = |e: std::io::Error| {
        InputError::new(
            "--out",
            format!("{}: cannot be written: {e}", out.display()),
            "give --out a regular file in a writable folder with space",
        )
    };
    let mut f = std::io::BufWriter::new(std::fs::File::create(out).map_err(unwritable)?);
    let c = prepared.workload.cluster.as_ref().expect("cluster world");
    let models: Vec<&str> = c.models.iter().map(|m| m.name.as_str()).collect();
    let blocks = workload::export::write_mooncake_with_models(stream, &models, &mut f)
        .and_then(|n| std::io::Write::flush(&mut f).map(|_| n))
        .map_err(unwritable)?;
    eprintln!(
        "{}: {} requests (seed {}), {blocks} distinct 512-token blocks",
        out.display(),
        stream.requests.len(),
        input.seed
    );
    Ok(0)
}

/// The class, tenant and model names of `--workload` (a cluster workload).
fn import_labels(file: &Path) -> Result<import::Labels> {
    let w = workload::load(file)?;
    let Some(c) = w.cluster else {
        return Err(InputError::new(
            file,
            format!("is a {} workload; only cluster workloads have request classes", w.world().as_str()),
            "pass the cluster workload that replays the trace",
        )
        .in_field("cluster")
        .into());
    };
    Ok(import::Labels {
        workload: file.to_path_buf(),
        classes: c.classes.iter().map(|c| c.name.clone()).collect(),
        tenants: c.tenants.iter().map(|t| t.name.clone()).collect(),
        models: c.models.iter().map(|m| m.name.clone()).collect(),
    })
}

/// `routelab import`: a request log as a Mooncake trace, every line checked before `out` is written.
pub(super) fn import_log(log: &Path, out: &Path, workload: Option<&Path>) -> Result<i32> {
    output::check_writable("--out", out)?;
    output::not_an_input("--out", out, &[log.to_path_buf()])?;
    let labels = workload.map(import_labels).transpose()?;
    let mut trace = Vec::new();
    let got = import::import(log, &mut trace, labels.as_ref())?;
    output::write_atomically(out, &String::from_utf8(trace).expect("the trace is JSON text"))?;
    let reordered = if got.reordered > 0 {
        format!("; {} lines were out of time order and were sorted", got.reordered)
    } else {
        String::new()
    };
    eprintln!(
        "{}: {} requests, {} distinct 512-token blocks{reordered}\nreplay it: arrivals: {{trace: {{path: {}, format: mooncake}}}}",
        out.display(),
        got.requests,
        got.distinct_blocks,
        out.display()
    );
    Ok(0)
}
