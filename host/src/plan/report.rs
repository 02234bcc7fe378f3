//! A plan's outputs: the terminal tables (each line's answer, then the frontier and the winner)
//! and the `--json` document.

use comfy_table::presets::{ASCII_MARKDOWN, UTF8_FULL_CONDENSED};
use comfy_table::{Cell, CellAlignment, Table};
use serde::Serialize;

use super::{Evaluation, LineResult, Settings, Status, prices};
use crate::capacity::expr::Target;
use crate::report::table::fmt_num;
use routelab_core::workload::Workload;
use routelab_core::workload::slo::Slo;

/// A GPU's price as the plan used it.
#[derive(Clone, Debug, Serialize)]
pub struct Price {
    pub gpu: String,
    /// Per GPU-hour.
    pub per_hour: f64,
    pub source: prices::Source,
}

/// The winner and how sure the plan is of it.
#[derive(Clone, Debug, Serialize)]
pub struct Winner {
    /// Index into `lines`.
    pub line: usize,
    pub shape: String,
    pub replicas: u32,
    pub cost_per_hour: f64,
    pub margin: f64,
    pub seeds_holding: u32,
    /// One replica fewer on the same line, if it was run (it failed): its margin.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub one_fewer_margin: Option<f64>,
}

/// The `--json` document of `routelab plan`.
#[derive(Serialize)]
pub struct Report<'a> {
    pub routelab: &'static str,
    pub command: &'static str,
    pub workload: &'a str,
    pub world: &'static str,
    pub seed: u64,
    pub seeds: u32,
    /// The conditions, as parsed (`metric op value`).
    pub slo: Vec<String>,
    pub bounds: Option<&'a Slo>,
    pub settings: Settings,
    pub prices: Vec<Price>,
    /// Shapes in the space searched (lines × replica counts) and shapes run.
    pub shapes: u64,
    pub shapes_run: u64,
    /// Simulation runs: shapes run × seeds.
    pub runs: u64,
    pub lines: &'a [LineResult],
    /// (line, index into its `points`), in cost order: no other shape run is both cheaper
    /// and holds the SLO with a larger margin.
    pub frontier: Vec<(usize, usize)>,
    pub winner: Option<Winner>,
    /// The workload as given, every default filled in.
    pub resolved: &'a Workload,
}

impl Report<'_> {
    pub fn json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a plan serialises")
    }

    fn seeds_text(&self) -> String {
        if self.seeds > 1 {
            format!("seeds {}..{}", self.seed, self.seed + self.seeds as u64 - 1)
        } else {
            format!("seed {}", self.seed)
        }
    }

    /// The sentence above the tables.
    pub fn caption(&self) -> String {
        let budget = self.settings.budget.map_or(String::new(), |b| format!(", budget {}/h", fmt_num(b)));
        let bounds = self.bounds.map_or(String::new(), |b| format!(" (per request {})", b.to_arg()));
        let s = &self.settings;
        let counts = match s.prefill {
            Some((lo, hi)) => format!("prefill {lo}..{hi}, decode {}..{}", s.min_replicas, s.max_replicas),
            None => format!("replicas {}..{}", s.min_replicas, s.max_replicas),
        };
        let mix = s.mix.map_or(String::new(), |n| {
            let counts = if n == 1 { "1".to_string() } else { format!("1..{n}") };
            format!(", mixed lines with {counts} of a second GPU")
        });
        format!(
            "{} [{} world, {} per shape]: cheapest fleet with {}{bounds} at the workload's own load; \
             {counts}{mix}{budget}; {} shapes, {} run ({} runs)",
            self.workload,
            self.world,
            self.seeds_text(),
            self.slo.join(" and "),
            self.shapes,
            self.shapes_run,
            self.runs,
        )
    }
}

fn status_text(r: &LineResult) -> String {
    let fails = r.fails_at.map_or(String::new(), |f| format!(", fails at {f}"));
    match r.status {
        Status::Found => format!("found{fails}"),
        Status::FailsEverywhere => format!("fails up to {}", r.fails_at.unwrap_or(0)),
        Status::Dominated => format!("stopped: dearer than a cheaper shape that holds{fails}"),
        Status::OverBudget => format!("stopped: over budget{fails}"),
        Status::Error => format!("FAILED: {}", r.error.as_deref().unwrap_or("").lines().next().unwrap_or("")),
    }
}

fn style(markdown: bool) -> Table {
    let mut t = Table::new();
    t.load_style(if markdown { ASCII_MARKDOWN } else { UTF8_FULL_CONDENSED });
    t
}

fn cost_text(e: &Evaluation) -> String {
    format!("{:.2}", e.cost_per_hour)
}

fn pct(m: f64) -> String {
    if m.is_finite() { format!("{:+.0}%", 100.0 * m) } else { "–".into() }
}

/// A table as text cells: the header, the rows, and which columns are text (left-aligned).
pub struct Grid {
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
    pub text_columns: Vec<usize>,
}

/// Every line's answer: its fewest replicas that hold, their cost, the status, each condition's
/// metric there, the margin, the seeds holding, the shapes run.
pub fn lines_grid(r: &Report, target: &Target) -> Grid {
    // With fixed-part lines, a column for the fixed part; the count searched of a P/D line is
    // its decode instances.
    let fixed = r.lines.iter().any(|l| l.line.fixed.is_some());
    let searched = if r.settings.prefill.is_some() { "decode" } else { "replicas" };
    let mut header: Vec<String> = ["gpu", "tp", "router"].iter().map(|s| s.to_string()).collect();
    if fixed {
        header.push("fixed part".into());
    }
    header.extend([searched, "cost/h", "status"].iter().map(|s| s.to_string()));
    header.extend(target.conditions.iter().map(|c| c.metric.clone()));
    header.extend(["margin".into(), "seeds holding".into(), "shapes run".into()]);
    let rows = r
        .lines
        .iter()
        .map(|l| {
            let a = l.answer();
            let mut row = vec![
                l.line.gpu.clone(),
                l.line.tp.to_string(),
                match &l.line.scaler {
                    Some(s) => format!("{} + {s}", l.line.policy),
                    None => l.line.policy.clone(),
                },
            ];
            if fixed {
                row.push(l.line.fixed_text());
            }
            row.extend([
                l.replicas.map_or("–".into(), |n| n.to_string()),
                a.map_or("–".into(), cost_text),
                status_text(l),
            ]);
            for c in &target.conditions {
                row.push(a.and_then(|e| e.metrics.get(&c.metric)).map_or("–".into(), fmt_num));
            }
            row.push(a.map_or("–".into(), |e| pct(e.margin)));
            row.push(a.map_or("–".into(), |e| format!("{}/{}", e.seeds_holding, r.seeds)));
            row.push(l.points.len().to_string());
            row
        })
        .collect();
    let text_columns = if fixed { vec![0, 2, 3, 6] } else { vec![0, 2, 5] };
    Grid { header, rows, text_columns }
}

/// The frontier, in cost order: cost, shape, verdict, margin, each condition's metric.
pub fn frontier_grid(r: &Report, target: &Target) -> Grid {
    let mut header = vec!["cost/h".to_string(), "shape".into(), "SLO".into(), "margin".into()];
    header.extend(target.conditions.iter().map(|c| c.metric.clone()));
    let rows = r
        .frontier
        .iter()
        .map(|&(i, k)| {
            let (l, e) = (&r.lines[i], &r.lines[i].points[k]);
            let mut row = vec![
                cost_text(e),
                l.line.shape(e.replicas),
                if e.holds { "holds" } else { "fails" }.to_string(),
                pct(e.margin),
            ];
            for c in &target.conditions {
                row.push(e.metrics.get(&c.metric).map_or("–".into(), fmt_num));
            }
            row
        })
        .collect();
    Grid { header, rows, text_columns: vec![1, 2] }
}

fn render_grid(g: Grid, markdown: bool) -> Table {
    let mut t = style(markdown);
    t.set_header(g.header);
    for row in g.rows {
        t.add_row(row.into_iter().enumerate().map(|(i, c)| {
            if g.text_columns.contains(&i) { Cell::new(c) } else { Cell::new(c).set_alignment(CellAlignment::Right) }
        }));
    }
    t
}

/// The frontier's heading.
pub const FRONTIER: &str = "frontier (cost against the SLO's margin; no shape run is both cheaper and safer)";

/// The tables: every line's answer, the frontier, the winner; notes and warnings below.
pub fn table(r: &Report, target: &Target, markdown: bool) -> String {
    let t = render_grid(lines_grid(r, target), markdown);
    let f = render_grid(frontier_grid(r, target), markdown);
    let mut out = format!("{}\n{t}\n{FRONTIER}:\n{f}\n", r.caption());
    out.push_str(&verdict(r));
    for (shape, warning, text) in remarks(r) {
        out.push_str(&format!("{}: {shape}: {text}\n", if warning { "warning" } else { "note" }));
    }
    out
}

/// The winner line (or that there is none).
pub fn verdict(r: &Report) -> String {
    match &r.winner {
        Some(w) => {
            let fewer = match w.one_fewer_margin {
                Some(m) => {
                    let pd = r.lines[w.line].line.fixed.as_ref().is_some_and(|f| f.role == super::Role::Prefill);
                    let one = if pd { "one decode instance" } else { "one replica" };
                    format!("; {one} fewer misses it (margin {})", pct(m))
                }
                None if w.replicas == r.settings.min_replicas => "; the bottom of the range".into(),
                None => String::new(),
            };
            format!(
                "winner: {} at {}/h: holds with margin {} on the mean, on {}/{} seeds alone{fewer}\n",
                w.shape,
                fmt_num((w.cost_per_hour * 100.0).round() / 100.0),
                pct(w.margin),
                w.seeds_holding,
                r.seeds
            )
        }
        None => "winner: none: no shape searched meets the SLO\n".into(),
    }
}

/// Each line's warning and first note, as (shape, is_warning, text).
pub fn remarks(r: &Report) -> Vec<(String, bool, String)> {
    let mut out = Vec::new();
    for l in r.lines {
        if let Some(w) = &l.warning {
            out.push((l.line.shape(l.replicas.unwrap_or(0)), true, w.clone()));
        }
        if let Some(e) = l.points.iter().find(|e| e.note.is_some()) {
            out.push((l.line.shape(e.replicas), false, e.note.clone().unwrap_or_default()));
        }
    }
    out
}
