//! The terminal table: one row per policy, units in headers, mean ± 95% interval over seeds,
//! a ratio column against the first policy, "overloaded" instead of a ratio when the queue grew.

use comfy_table::{
    Cell, CellAlignment, ContentArrangement, Table,
    presets::{ASCII_MARKDOWN, UTF8_FULL_CONDENSED},
};

use super::{COLUMNS, RATIO_KEYS};
use routelab_core::runner::WorkloadResult;

/// Decimals that give `v` about four significant figures; `None` where an exponent reads better.
fn decimals(v: f64) -> Option<usize> {
    let a = v.abs();
    (a == 0.0 || (1e-3..1e7).contains(&a)).then_some(match a {
        a if a >= 1000.0 => 0,
        a if a >= 100.0 => 1,
        a if a >= 10.0 => 2,
        a if a >= 1.0 => 3,
        _ => 4,
    })
}

/// A number with about four significant figures, without exponent for everyday magnitudes.
pub fn fmt_num(v: f64) -> String {
    match (v.is_finite(), decimals(v)) {
        (false, _) => "–".into(),
        (true, _) if v.fract() == 0.0 && v.abs() < 1e15 => format!("{v:.0}"),
        (true, Some(d)) => format!("{v:.d$}"),
        (true, None) => format!("{v:.3e}"),
    }
}

/// `mean ± half-width`, the half-width with the mean's decimals.
pub fn fmt_pm(v: f64, ci: f64) -> String {
    match decimals(v) {
        Some(d) if v.is_finite() => format!("{v:.d$} ± {ci:.d$}"),
        _ => format!("{} ± {}", fmt_num(v), fmt_num(ci)),
    }
}

/// One workload's table as text cells, for the terminal and the HTML report alike.
pub struct Grid {
    pub header: Vec<String>,
    /// A row per policy: its cells, or `Err` with the first line of its failure.
    pub rows: Vec<(String, Result<Vec<String>, String>)>,
    /// The line above the table: workload, world, seeds.
    pub caption: String,
}

/// The cells of one workload's comparison: the columns `columns` names (metric keys, in order),
/// or by default those of [`COLUMNS`] the run produced — with TTFT and TPOT P99 when it has an SLO.
pub fn grid(w: &WorkloadResult, columns: Option<&[String]>) -> Grid {
    let ok: Vec<_> = w.results.iter().filter(|r| r.error.is_none()).collect();
    let has = |key: &str| ok.iter().any(|r| r.metrics.get(key).is_some());
    // (metric key, header): a key outside the default list is its own header.
    let cols: Vec<(String, String)> = match columns {
        Some(keys) => keys
            .iter()
            .map(|k| (k.clone(), COLUMNS.iter().find(|c| c.key == k.as_str()).map_or(k.as_str(), |c| c.header).into()))
            .collect(),
        None => {
            let slo = has("slo_attainment");
            let mut cols: Vec<(String, String)> = COLUMNS
                .iter()
                .filter(|c| has(c.key) && (slo || !c.with_slo))
                .map(|c| (c.key.to_string(), c.header.to_string()))
                .collect();
            cols.extend(class_columns(&ok));
            cols
        }
    };
    let ratio_key = RATIO_KEYS.iter().find(|k| ok.iter().any(|r| r.metrics.get(k).is_some()));
    let baseline = w.results.first().and_then(|r| ratio_key.and_then(|k| r.metrics.get(k)));

    let with_allocation = ok.iter().any(|r| !r.allocation.is_empty());
    let mut header = vec!["policy".to_string()];
    if with_allocation {
        header.push("allocation".into());
    }
    header.extend(cols.iter().map(|(_, h)| h.clone()));
    if let Some(k) = ratio_key {
        let name = super::COLUMNS.iter().find(|c| c.key == *k).map_or(*k, |c| c.header);
        let name = name.split(" [").next().unwrap_or(name);
        header.push(format!("{name} ÷ first"));
    }
    let mut rows = Vec::new();
    for r in &w.results {
        if let Some(e) = &r.error {
            rows.push((r.policy.clone(), Err(e.lines().next().unwrap_or("").to_string())));
            continue;
        }
        let mut row = Vec::new();
        if with_allocation {
            let first = r.allocation.first().map(|a| a.join("+")).unwrap_or_default();
            let same = r.allocation.iter().all(|a| a.join("+") == first);
            row.push(if same { first } else { format!("{first} (seed {}; others differ)", w.seed) });
        }
        for (key, _) in &cols {
            let v = r.metrics.get(key).unwrap_or(f64::NAN);
            row.push(match r.metrics.get(&format!("{key}_ci95")) {
                Some(ci) if ci.is_finite() => fmt_pm(v, ci),
                _ => fmt_num(v),
            });
        }
        if let Some(k) = ratio_key {
            let overloaded = r.metrics.get("overloaded").is_some_and(|o| o > 0.0);
            row.push(if overloaded {
                "overloaded".to_string()
            } else {
                match (r.metrics.get(k), baseline) {
                    (Some(v), Some(b)) if b != 0.0 => format!("{:.3}", v / b),
                    _ => "–".into(),
                }
            });
        }
        rows.push((r.policy.clone(), Ok(row)));
    }
    let seeds = if w.seeds > 1 {
        format!("seeds {}..{} ({} runs, mean ± 95% CI)", w.seed, w.seed + w.seeds as u64 - 1, w.seeds)
    } else {
        format!("seed {}", w.seed)
    };
    Grid { header, rows, caption: format!("{} [{} world, {}]", w.name, w.world, seeds) }
}

/// Per-class columns for a workload with `classes:` (grouped by class, in the workload's order):
/// each class's SLO attainment and TTFT P99. None for a workload without classes, whose only
/// class is `default`, so its table is what it was before classes existed.
fn class_columns(ok: &[&routelab_core::runner::PolicyResult]) -> Vec<(String, String)> {
    let mut names: Vec<&str> = Vec::new();
    for r in ok {
        for (k, _) in &r.metrics.0 {
            if let Some(name) = k.strip_prefix("class.").and_then(|k| k.strip_suffix(".slo_attainment"))
                && !names.contains(&name)
            {
                names.push(name);
            }
        }
    }
    if names == ["default"] {
        return Vec::new();
    }
    names
        .iter()
        .flat_map(|n| {
            [
                (format!("class.{n}.slo_attainment"), format!("{n} att")),
                (format!("class.{n}.ttft_p99_s"), format!("{n} TTFT p99 [s]")),
            ]
        })
        .collect()
}

/// Renders one workload's comparison: box-drawn for the terminal (wrapped to its width when
/// printing to one), or a Markdown table; `columns` as for [`grid`].
pub fn render(w: &WorkloadResult, markdown: bool, columns: Option<&[String]>) -> String {
    let g = grid(w, columns);
    let mut t = Table::new();
    t.load_style(if markdown { ASCII_MARKDOWN } else { UTF8_FULL_CONDENSED });
    if !markdown {
        t.set_content_arrangement(ContentArrangement::Dynamic);
    }
    t.set_header(g.header.iter().map(Cell::new));
    for (policy, cells) in &g.rows {
        let mut row = vec![Cell::new(policy)];
        match cells {
            Err(first) => row.push(Cell::new(format!("FAILED: {first}"))),
            // The allocation (text) stays left-aligned; figures are right-aligned.
            Ok(cells) => row.extend(cells.iter().enumerate().map(|(i, c)| {
                let text = g.header.get(i + 1).is_some_and(|h| h == "allocation");
                Cell::new(c).set_alignment(if text { CellAlignment::Left } else { CellAlignment::Right })
            })),
        }
        t.add_row(row);
    }
    let mut out = format!("{}\n{t}\n", g.caption);
    for n in &w.notes {
        out.push_str(&format!("note: {n}\n"));
    }
    out
}
