//! `routelab plan --report FILE`: the plan as one self-contained HTML page, made with the report
//! machinery `capacity --report` uses (the same head, style, reproduce line and charts): the
//! lines' answers, the frontier and its chart (cost against the SLO's margin on a linear cost
//! axis, a line per (GPU, router, fixed part) through the shapes it ran, the frontier drawn
//! apart, margin 0 dashed), the winner, and the workload as given.

use std::fmt::Write as _;

use anyhow::Result;
use plotters::chart::SeriesLabelPosition;

use super::report::{self, Grid, Report};
use crate::capacity::expr::Target;
use crate::report::chart::{self, LineChart, Point, Reference, Series};
use crate::report::figures::{Figure, file_name};
use crate::report::html::{self, escape};

fn table(h: &mut String, g: &Grid) {
    h.push_str("<table>\n<tr>");
    for c in &g.header {
        let _ = write!(h, "<th>{}</th>", escape(c));
    }
    h.push_str("</tr>\n");
    for row in &g.rows {
        h.push_str("<tr>");
        for (i, c) in row.iter().enumerate() {
            let class = match c.as_str() {
                "holds" => " class=\"holds\"",
                "fails" => " class=\"fails\"",
                _ if g.text_columns.contains(&i) => "",
                _ => " class=\"num\"",
            };
            let _ = write!(h, "<td{class}>{}</td>", escape(c));
        }
        h.push_str("</tr>\n");
    }
    h.push_str("</table>\n");
}

/// The frontier chart as SVG text: the margin (%) against the cost per hour.
pub fn chart_svg(r: &Report) -> Result<String> {
    let mut series: Vec<Series> = r
        .lines
        .iter()
        .filter(|l| l.points.iter().any(|e| e.margin.is_finite()))
        .map(|l| {
            let mut pts: Vec<(f64, f64)> =
                l.points.iter().filter(|e| e.margin.is_finite()).map(|e| (e.cost_per_hour, 100.0 * e.margin)).collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            let fixed = l.line.fixed_text();
            let fixed = if fixed.is_empty() { String::new() } else { format!(" {fixed}") };
            let name = match &l.line.scaler {
                Some(s) => format!("{} · {} · {s}", l.line.gpu, l.line.policy),
                None => format!("{} (tp {}){fixed} · {}", l.line.gpu, l.line.tp, l.line.policy),
            };
            Series::new(name, pts)
        })
        .collect();
    let frontier: Vec<Point> = r
        .frontier
        .iter()
        .map(|&(i, k)| {
            let e = &r.lines[i].points[k];
            Point::at(e.cost_per_hour, 100.0 * e.margin)
        })
        .collect();
    series.push(Series { label: "frontier".into(), points: frontier, apart: false });
    let title = format!("{}: cost against the SLO's margin", r.workload);
    chart::lines(&LineChart {
        title: &title,
        x_desc: "cost per hour",
        y_desc: "margin [%] (smallest relative slack of the SLO's conditions)",
        series: &series,
        y_range: None,
        marker_every: 1,
        legend: true,
        linear_x: true,
        size: (820, 500),
        off_scale_means: chart::OVERLOADED,
        reference: Some(Reference { y: 0.0, label: "the SLO's bound (margin 0)" }),
        legend_at: SeriesLabelPosition::LowerRight,
    })
}

/// The page's HTML text; `argv` is the command line as typed.
pub fn render(r: &Report, target: &Target, argv: &[String]) -> Result<String> {
    let mut h = String::new();
    let seeds = if r.seeds > 1 {
        format!("seeds {}..{}", r.seed, r.seed + u64::from(r.seeds) - 1)
    } else {
        format!("seed {}", r.seed)
    };
    html::open(&mut h, "plan", argv, &format!("workload {} · {seeds}", r.workload));
    let _ = writeln!(
        h,
        "<p class=\"meta\">The cheapest fleet shape meeting the SLO at the workload's own load: every condition \
         holds on the mean over the seeds, with no request left unfinished; the same seeds for every shape. Each \
         (GPU, router) line is bisected in replicas (a P/D line in decode instances at its fixed prefill count, a \
         mixed line in its first GPU's replicas beside its fixed count of the second); a shape as dear as one already seen to hold is not run. \
         Same command, same routelab version: the same numbers.</p>"
    );
    let _ = writeln!(h, "<h2 id=\"lines\">{}</h2>", escape(r.workload));
    let _ = writeln!(h, "<p class=\"meta\">{}</p>", escape(&r.caption()));
    table(&mut h, &report::lines_grid(r, target));
    let _ = writeln!(h, "<p><strong>{}</strong></p>", escape(report::verdict(r).trim()));
    for (shape, warning, text) in report::remarks(r) {
        let (class, word) = if warning { ("warning", "warning") } else { ("meta", "note") };
        let _ = writeln!(h, "<p class=\"{class}\">{word}: {}: {}</p>", escape(&shape), escape(&text));
    }
    let _ = writeln!(h, "<h2 id=\"frontier\">{}</h2>", escape(&report::FRONTIER.replace(" (", ": (")));
    table(&mut h, &report::frontier_grid(r, target));
    let stem = format!("{}_plan_frontier", file_name(r.workload));
    html::figure(&mut h, &Figure { stem, title: "cost against margin".into(), svg: chart_svg(r)? });
    let yaml = serde_norway::to_string(r.resolved)?;
    let _ = writeln!(
        h,
        "<details><summary>The workload as given (every default filled in; {})</summary>\n<pre>{}</pre>\n</details>",
        escape(&seeds),
        escape(&yaml)
    );
    html::close(&mut h);
    Ok(h)
}
