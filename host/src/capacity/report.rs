//! A capacity search's outputs: the terminal table, the `--json` document and the `--plot`
//! charts (each SLO metric against the load, a line per policy, the bound as a dashed line).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use comfy_table::presets::{ASCII_MARKDOWN, UTF8_FULL_CONDENSED};
use comfy_table::{Cell, CellAlignment, Table};
use plotters::prelude::*;
use serde::Serialize;

use super::expr::{Op, Target};
use super::{Knob, PolicyCapacity, Settings, Status};
use crate::report::table::fmt_num;
use routelab_core::workload::Workload;
use routelab_core::workload::slo::Slo;

/// The `--json` document of `routelab capacity`.
#[derive(Serialize)]
pub struct Report<'a> {
    pub routelab: &'static str,
    pub command: &'static str,
    pub workload: &'a str,
    pub world: &'static str,
    pub seed: u64,
    pub seeds: u32,
    pub knob: Knob,
    /// The load the search started from (the workload's own).
    pub start: f64,
    /// The conditions, as parsed (`metric op value`).
    pub slo: Vec<String>,
    /// Per-request bounds the search ran with (from `--slo` or the workload), if any.
    pub bounds: Option<&'a Slo>,
    pub settings: Settings,
    /// The workload at its own load, every default filled in.
    pub resolved: &'a Workload,
    pub results: &'a [PolicyCapacity],
}

impl Report<'_> {
    pub fn json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a capacity report serialises")
    }
}

/// `[lo, hi)`: the capacity is at least `lo` and below `hi`.
fn interval(lo: f64, hi: f64) -> String {
    format!("[{}, {})", fmt_num(lo), if hi.is_finite() { fmt_num(hi) } else { "∞".into() })
}

/// One row per policy: the capacity, the interval it is known to, the work it took, and the
/// SLO metrics at the capacity.
pub fn table(r: &Report, target: &Target, markdown: bool) -> String {
    let mut t = Table::new();
    t.load_style(if markdown { ASCII_MARKDOWN } else { UTF8_FULL_CONDENSED });
    let mut header = vec!["policy".to_string(), format!("capacity: {}", r.knob.label()), "known within".into()];
    header.extend(["loads".into(), "runs".into()]);
    header.extend(target.conditions.iter().map(|c| format!("{} at capacity", c.metric)));
    t.set_header(header);
    for p in r.results {
        let mut row = vec![Cell::new(&p.policy)];
        let Some(a) = &p.answer else {
            let e = p.error.as_deref().unwrap_or("").lines().next().unwrap_or("");
            row.push(Cell::new(format!("FAILED: {e}")));
            t.add_row(row);
            continue;
        };
        let capacity = match a.status {
            Status::Found => fmt_num(a.lo),
            Status::Unresolved => format!("{} (unresolved)", fmt_num(a.lo)),
            Status::HoldsEverywhere => format!("≥ {} (held at every load tried)", fmt_num(a.lo)),
            Status::FailsEverywhere => format!("< {} (failed at every load tried)", fmt_num(a.hi)),
        };
        row.push(Cell::new(capacity).set_alignment(CellAlignment::Right));
        row.push(Cell::new(interval(a.lo, a.hi)));
        row.push(Cell::new(a.points.len()).set_alignment(CellAlignment::Right));
        row.push(Cell::new(p.runs).set_alignment(CellAlignment::Right));
        let at = a.points.iter().find(|pt| pt.load == a.lo && pt.holds);
        for c in &target.conditions {
            let v = at.and_then(|pt| pt.metrics.get(&c.metric)).map_or("–".into(), fmt_num);
            row.push(Cell::new(v).set_alignment(CellAlignment::Right));
        }
        t.add_row(row);
    }
    let seeds = if r.seeds > 1 {
        format!("seeds {}..{}", r.seed, r.seed + r.seeds as u64 - 1)
    } else {
        format!("seed {}", r.seed)
    };
    let mut out = format!(
        "{} [{} world, {seeds} at every load]: highest {} with {}\n{t}\n",
        r.workload,
        r.world,
        r.knob.label(),
        r.slo.join(" and "),
    );
    for p in r.results {
        if let Some(note) = p.answer.as_ref().and_then(|a| a.note.as_ref()) {
            out.push_str(&format!("note: {}: {note}\n", p.policy));
        }
    }
    out
}

fn file_name(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect()
}

/// One SVG per condition: its metric (mean over seeds) against the load, a line per policy
/// through the loads it ran, the bound dashed; returns the files written.
pub fn charts(dir: &Path, r: &Report, target: &Target) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut files = Vec::new();
    for c in &target.conditions {
        let series: Vec<(&str, Vec<(f64, f64)>)> = r
            .results
            .iter()
            .filter_map(|p| {
                let a = p.answer.as_ref()?;
                let mut pts: Vec<(f64, f64)> = a
                    .points
                    .iter()
                    .filter_map(|pt| pt.metrics.get(&c.metric).filter(|v| v.is_finite()).map(|v| (pt.load, v)))
                    .collect();
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                Some((p.policy.as_str(), pts))
            })
            .collect();
        let path = dir.join(format!("{}_capacity_{}.svg", file_name(r.workload), file_name(&c.metric)));
        // Curves of an upper bound rise with the load, of a lower bound fall: keep the legend
        // in the corner they leave empty.
        let legend = match c.op {
            Op::Lt | Op::Le => SeriesLabelPosition::UpperLeft,
            Op::Gt | Op::Ge => SeriesLabelPosition::LowerLeft,
        };
        chart(&path, &format!("{}: {c}", r.workload), r.knob.label(), (&c.metric, c.value), legend, &series)
            .with_context(|| format!("drawing {}", path.display()))?;
        files.push(path);
    }
    Ok(files)
}

fn chart(
    path: &Path,
    title: &str,
    x_desc: &str,
    (y_desc, bound): (&str, f64),
    legend: SeriesLabelPosition,
    series: &[(&str, Vec<(f64, f64)>)],
) -> Result<()> {
    let all = || series.iter().flat_map(|s| s.1.iter());
    let (xmin, xmax) = all().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)));
    let (xmin, xmax) = if xmin > xmax { (0.0, 1.0) } else { (xmin * 0.95, xmax * 1.05) };
    // The axis spans the bound and the data, with a margin (not from 0: the region near the
    // bound decides the answer); a metric far above the bound (an overloaded load) is clipped
    // at 3× it, so that region stays readable.
    let top = all().map(|p| p.1).fold(bound, f64::max).min(3.0 * bound.abs().max(1e-12));
    let bottom = all().map(|p| p.1).fold(bound, f64::min);
    let pad = 0.08 * (top - bottom).max(1e-9);
    let ymax = top + pad;
    let ymin = if bottom >= 0.0 { (bottom - pad).max(0.0) } else { bottom - pad };
    let root = SVGBackend::new(path, (820, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(xmin..xmax.max(xmin + 1e-9), ymin..ymax.max(ymin + 1e-9))?;
    chart.configure_mesh().x_desc(x_desc).y_desc(y_desc).draw()?;
    chart.draw_series(DashedLineSeries::new([(xmin, bound), (xmax, bound)], 8, 6, BLACK.stroke_width(1)))?;
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = Palette99::pick(i);
        let clipped: Vec<(f64, f64)> = pts.iter().map(|&(x, y)| (x, y.min(ymax))).collect();
        chart
            .draw_series(LineSeries::new(clipped.clone(), color.stroke_width(2)))?
            .label(name.to_string())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], Palette99::pick(i).stroke_width(2)));
        // Distinct markers, so lines that coincide stay visible.
        chart.draw_series(clipped.iter().map(|&(x, y)| match i % 3 {
            0 => Circle::new((x, y), 4, Palette99::pick(i).filled()).into_dyn(),
            1 => TriangleMarker::new((x, y), 5, Palette99::pick(i).filled()).into_dyn(),
            _ => Cross::new((x, y), 4, Palette99::pick(i).stroke_width(2)).into_dyn(),
        }))?;
    }
    chart.configure_series_labels().position(legend).background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
    root.present()?;
    Ok(())
}
