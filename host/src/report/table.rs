//! The terminal table: one row per policy, units in headers, mean ± 95% interval over seeds,
//! a ratio column against the first policy, "overloaded" instead of a ratio when the queue grew.

use comfy_table::{
    Cell, CellAlignment, Table,
    presets::{ASCII_MARKDOWN, UTF8_FULL_CONDENSED},
};

use super::{COLUMNS, RATIO_KEYS};
use crate::runner::WorkloadResult;

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

/// Renders one workload's comparison: box-drawn for the terminal, or a Markdown table.
pub fn render(w: &WorkloadResult, markdown: bool) -> String {
    let ok: Vec<_> = w.results.iter().filter(|r| r.error.is_none()).collect();
    let cols: Vec<_> = COLUMNS.iter().filter(|c| ok.iter().any(|r| r.metrics.get(c.key).is_some())).collect();
    let ratio_key = RATIO_KEYS.iter().find(|k| ok.iter().any(|r| r.metrics.get(k).is_some()));
    let baseline = w.results.first().and_then(|r| ratio_key.and_then(|k| r.metrics.get(k)));

    let mut t = Table::new();
    t.load_style(if markdown { ASCII_MARKDOWN } else { UTF8_FULL_CONDENSED });
    let with_allocation = ok.iter().any(|r| !r.allocation.is_empty());
    let mut header = vec![Cell::new("policy")];
    if with_allocation {
        header.push(Cell::new("allocation"));
    }
    header.extend(cols.iter().map(|c| Cell::new(c.header)));
    if let Some(k) = ratio_key {
        let name = super::COLUMNS.iter().find(|c| c.key == *k).map_or(*k, |c| c.header);
        let name = name.split(" [").next().unwrap_or(name);
        header.push(Cell::new(format!("{name} ÷ first")));
    }
    t.set_header(header);
    for r in &w.results {
        let mut row = vec![Cell::new(&r.policy)];
        if let Some(e) = &r.error {
            let first = e.lines().next().unwrap_or("");
            row.push(Cell::new(format!("FAILED: {first}")));
            t.add_row(row);
            continue;
        }
        if with_allocation {
            let first = r.allocation.first().map(|a| a.join("+")).unwrap_or_default();
            let same = r.allocation.iter().all(|a| a.join("+") == first);
            row.push(Cell::new(if same { first } else { format!("{first} (seed {}; others differ)", w.seed) }));
        }
        for c in &cols {
            let v = r.metrics.get(c.key).unwrap_or(f64::NAN);
            let text = match r.metrics.get(&format!("{}_ci95", c.key)) {
                Some(ci) if ci.is_finite() => fmt_pm(v, ci),
                _ => fmt_num(v),
            };
            row.push(Cell::new(text).set_alignment(CellAlignment::Right));
        }
        if let Some(k) = ratio_key {
            let overloaded = r.metrics.get("overloaded").is_some_and(|o| o > 0.0);
            let text = if overloaded {
                "overloaded".to_string()
            } else {
                match (r.metrics.get(k), baseline) {
                    (Some(v), Some(b)) if b != 0.0 => format!("{:.3}", v / b),
                    _ => "–".into(),
                }
            };
            row.push(Cell::new(text).set_alignment(CellAlignment::Right));
        }
        t.add_row(row);
    }
    let seeds = if w.seeds > 1 {
        format!("seeds {}..{} ({} runs, mean ± 95% CI)", w.seed, w.seed + w.seeds as u64 - 1, w.seeds)
    } else {
        format!("seed {}", w.seed)
    };
    let mut out = format!("{} [{} world, {}]\n{t}\n", w.name, w.world, seeds);
    for n in &w.notes {
        out.push_str(&format!("note: {n}\n"));
    }
    out
}
