//! A capacity search's outputs: the terminal table, the `--json` document and the `--plot`
//! charts (each SLO metric against the load, a line per policy, the bound as a dashed line).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use comfy_table::presets::{ASCII_MARKDOWN, UTF8_FULL_CONDENSED};
use comfy_table::{Cell, CellAlignment, Table};
use plotters::chart::SeriesLabelPosition;
use serde::Serialize;

use super::expr::{Op, Target};
use super::{Knob, PolicyCapacity, Settings, Status};
use crate::report::chart::{self, LineChart, Point, Reference, Series};
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
    /// A trace replay's arrival rate at speed 1, requests/s ([`super::trace_rate`]): speed m is
    /// m × this. Absent for other knobs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_rate_rps: Option<f64>,
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

impl Report<'_> {
    /// The load axis's label: a trace replay's speed says what speed 1 is in requests/s.
    pub fn load_label(&self) -> String {
        match self.trace_rate_rps {
            Some(q) => format!("trace speed [× the trace's {} requests/s]", fmt_num(q)),
            None => self.knob.label().to_string(),
        }
    }

    /// `seed N` or `seeds A..B`.
    pub fn seeds_text(&self) -> String {
        if self.seeds > 1 {
            format!("seeds {}..{}", self.seed, self.seed + self.seeds as u64 - 1)
        } else {
            format!("seed {}", self.seed)
        }
    }

    /// The sentence above the table.
    pub fn caption(&self) -> String {
        format!(
            "{} [{} world, {} at every load]: highest {} with {}",
            self.workload,
            self.world,
            self.seeds_text(),
            self.knob.label(),
            self.slo.join(" and "),
        )
    }
}

/// A capacity (or a load's bound of it) as shown, by its status: `x`, `x (unresolved)`, `≥ x`, `< x`;
/// `scale` converts the load (1, or a trace's requests/s per unit of speed).
fn capacity_text(a: &super::Answer, scale: f64) -> String {
    match a.status {
        Status::Found => fmt_num(a.lo * scale),
        Status::Unresolved => format!("{} (unresolved)", fmt_num(a.lo * scale)),
        Status::HoldsEverywhere => format!("≥ {} (held at every load tried)", fmt_num(a.lo * scale)),
        Status::FailsEverywhere => format!("< {} (failed at every load tried)", fmt_num(a.hi * scale)),
    }
}

/// The table as text cells, for the terminal and the HTML page alike: the header, and per policy
/// its cells, or `Err(the first line of its error)`.
pub struct Grid {
    pub header: Vec<String>,
    pub rows: Vec<(String, Result<Vec<String>, String>)>,
}

/// One row per policy: the capacity (and, replaying a trace, in requests/s), the interval it is
/// known to, the work it took, and the SLO metrics at the capacity.
pub fn grid(r: &Report, target: &Target) -> Grid {
    let mut header = vec!["policy".to_string(), format!("capacity: {}", r.knob.label())];
    if r.trace_rate_rps.is_some() {
        header.push("capacity [requests/s]".into());
    }
    header.extend(["known within".into(), "loads".into(), "runs".into()]);
    header.extend(target.conditions.iter().map(|c| format!("{} at capacity", c.metric)));
    let rows = r
        .results
        .iter()
        .map(|p| {
            let Some(a) = &p.answer else {
                let e = p.error.as_deref().unwrap_or("").lines().next().unwrap_or("");
                return (p.policy.clone(), Err(e.to_string()));
            };
            let mut cells = vec![capacity_text(a, 1.0)];
            if let Some(q) = r.trace_rate_rps {
                cells.push(capacity_text(a, q));
            }
            cells.extend([interval(a.lo, a.hi), a.points.len().to_string(), p.runs.to_string()]);
            let at = a.points.iter().find(|pt| pt.load == a.lo && pt.holds);
            for c in &target.conditions {
                cells.push(at.and_then(|pt| pt.metrics.get(&c.metric)).map_or("–".into(), fmt_num));
            }
            (p.policy.clone(), Ok(cells))
        })
        .collect();
    Grid { header, rows }
}

/// Each policy's notes and warnings (a warning: the answer may hinge on noise), as
/// `(policy, is_warning, text)`.
pub fn remarks<'a>(r: &'a Report) -> Vec<(&'a str, bool, &'a str)> {
    let mut out = Vec::new();
    for p in r.results {
        let Some(a) = &p.answer else { continue };
        if let Some(note) = &a.note {
            out.push((p.policy.as_str(), false, note.as_str()));
        }
        if let Some(w) = &a.warning {
            out.push((p.policy.as_str(), true, w.as_str()));
        }
    }
    out
}

/// The terminal table, its caption above and the notes and warnings below.
pub fn table(r: &Report, target: &Target, markdown: bool) -> String {
    let g = grid(r, target);
    let mut t = Table::new();
    t.load_style(if markdown { ASCII_MARKDOWN } else { UTF8_FULL_CONDENSED });
    t.set_header(g.header);
    for (policy, cells) in g.rows {
        let mut row = vec![Cell::new(policy)];
        match cells {
            Err(e) => row.push(Cell::new(format!("FAILED: {e}"))),
            Ok(cells) => {
                // The interval is text; every other cell a number, right-aligned.
                let interval_at = if r.trace_rate_rps.is_some() { 2 } else { 1 };
                row.extend(cells.into_iter().enumerate().map(|(i, c)| {
                    let cell = Cell::new(c);
                    if i == interval_at { cell } else { cell.set_alignment(CellAlignment::Right) }
                }));
            }
        }
        t.add_row(row);
    }
    let mut out = format!("{}\n{t}\n", r.caption());
    if let Some(q) = r.trace_rate_rps {
        out.push_str(&format!(
            "speed 1 replays the trace at {} requests/s (its requests over the span of their arrivals)\n",
            fmt_num(q)
        ));
    }
    for (policy, warning, text) in remarks(r) {
        out.push_str(&format!("{}: {policy}: {text}\n", if warning { "warning" } else { "note" }));
    }
    out
}

fn file_name(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect()
}

/// One SVG per condition: its metric (mean over seeds) against the load, a line per policy
/// through the loads it ran, the bound dashed; returns the files written. Drawn by the report's
/// [`chart::lines`], so it looks like every other chart.
pub fn charts(dir: &Path, r: &Report, target: &Target) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut files = Vec::new();
    for c in &target.conditions {
        let path = dir.join(format!("{}_capacity_{}.svg", file_name(r.workload), file_name(&c.metric)));
        let svg = chart_svg(r, c).with_context(|| format!("drawing {}", path.display()))?;
        std::fs::write(&path, svg).with_context(|| format!("writing {}", path.display()))?;
        files.push(path);
    }
    Ok(files)
}

/// The chart of one condition, as SVG text. The y axis is linear and spans the bound and the
/// data (not from 0: the region near the bound decides the answer); a value more than 3× a
/// positive bound (an overloaded load) is off the scale, an open triangle on the top edge, so
/// that region stays readable.
pub fn chart_svg(r: &Report, c: &super::expr::Condition) -> Result<String> {
    let clip = if c.value > 0.0 { 3.0 * c.value } else { f64::INFINITY };
    let values = || r.results.iter().filter_map(|p| p.answer.as_ref()).flat_map(|a| &a.points);
    let values = || values().filter_map(|pt| pt.metrics.get(&c.metric)).filter(|v| v.is_finite());
    let top = values().filter(|v| *v <= clip).fold(c.value, f64::max);
    let bottom = values().fold(c.value, f64::min);
    let pad = 0.08 * (top - bottom).max(1e-9);
    let y_range = (if bottom >= 0.0 { (bottom - pad).max(0.0) } else { bottom - pad }, top + pad);
    let series: Vec<Series> = r
        .results
        .iter()
        .filter_map(|p| {
            let a = p.answer.as_ref()?;
            let mut pts: Vec<Point> = a
                .points
                .iter()
                .filter_map(|pt| pt.metrics.get(&c.metric).filter(|v| v.is_finite()).map(|v| (pt.load, v)))
                .map(|(x, y)| Point { off_scale: y > clip, ..Point::at(x, y) })
                .collect();
            pts.sort_by(|a, b| a.x.total_cmp(&b.x));
            Some(Series { label: p.policy.clone(), points: pts, apart: false })
        })
        .collect();
    // Curves of an upper bound rise with the load, of a lower bound fall: keep the legend in the
    // corner they leave empty.
    let legend_at = match c.op {
        Op::Lt | Op::Le => SeriesLabelPosition::UpperLeft,
        Op::Gt | Op::Ge => SeriesLabelPosition::LowerLeft,
    };
    let title = format!("{}: {c}", r.workload);
    let x_desc = r.load_label();
    let bound = format!("bound: {c}");
    chart::lines(&LineChart {
        title: &title,
        x_desc: &x_desc,
        y_desc: &c.metric,
        series: &series,
        y_range: Some(y_range),
        marker_every: 1,
        legend: true,
        linear_x: false,
        size: (820, 500),
        off_scale_means: "more than 3× the bound (off scale)",
        reference: Some(Reference { y: c.value, label: &bound }),
        legend_at,
    })
}
