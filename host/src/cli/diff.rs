//! `routelab diff BEFORE AFTER`: for every workload and policy in both `--json` files, the metrics
//! that moved beyond their 95% intervals, with the ratio after ÷ before.
//!
//! A metric moved when |after − before| exceeds √(h_before² + h_after²), the half-width of the
//! 95% interval of the difference of two independent means (h: the files' `<key>_ci95`). With
//! one seed there is no interval and any difference counts, which is what checking a change to
//! the simulator needs (the same seeds give the same figures). With the same seeds in both files
//! the runs are paired, so the test is conservative. A policy that failed on one side only, and a
//! workload or policy present on one side only, also count as differences.
//!
//! Exit code: 0 nothing moved, 1 something moved, 2 bad input.

use std::path::Path;

use anyhow::Result;
use comfy_table::{Cell, CellAlignment, Table, presets};
use serde::Deserialize;

use crate::report::table::{fmt_num, fmt_pm};
use routelab_core::metrics::Metrics;
use routelab_core::workload::InputError;

#[derive(Deserialize)]
struct Doc {
    routelab: String,
    /// Present in a shard's file, which must be merged first.
    #[serde(default)]
    shard: Option<serde_json::Value>,
    workloads: Vec<DocWorkload>,
}

#[derive(Deserialize)]
struct DocWorkload {
    name: String,
    results: Vec<DocPolicy>,
}

#[derive(Deserialize)]
struct DocPolicy {
    policy: String,
    #[serde(default)]
    metrics: Metrics,
    #[serde(default)]
    error: Option<String>,
}

fn read(file: &Path) -> Result<Doc, InputError> {
    let bad = |line: Option<usize>, message: String, fix: &str| InputError::new(file, message, fix).at_line(line);
    let fix = "give files written by --json (compare, sweep, run or merge)";
    let text = std::fs::read_to_string(file).map_err(|e| bad(None, format!("cannot be read: {e}"), fix))?;
    let doc: Doc =
        serde_json::from_str(&text).map_err(|e| bad(Some(e.line()), format!("is not routelab results: {e}"), fix))?;
    if doc.shard.is_some() {
        return Err(bad(None, "is one shard's results".into(), "join the shards with routelab merge, then diff"));
    }
    Ok(doc)
}

/// One metric's change.
pub struct Moved {
    pub key: String,
    pub before: (f64, f64),
    pub after: (f64, f64),
}

impl Moved {
    fn ratio(&self) -> String {
        let (a, b) = (self.after.0, self.before.0);
        if a.is_finite() && b.is_finite() && b != 0.0 { format!("{:.3}", a / b) } else { "–".into() }
    }
}

/// The metrics of one policy that moved beyond their intervals, and how many were compared.
pub fn moved(before: &Metrics, after: &Metrics) -> (Vec<Moved>, usize) {
    // By key: a policy may report many figures.
    let (before_at, after_at) = (before.index(), after.index());
    let half = |m: &std::collections::HashMap<&str, f64>, k: &str| {
        m.get(format!("{k}_ci95").as_str()).copied().filter(|h| h.is_finite()).unwrap_or(0.0)
    };
    let mut out = Vec::new();
    let mut compared = 0;
    for key in before.keys().filter(|k| !k.ends_with("_ci95")) {
        let (Some(&b), Some(&a)) = (before_at.get(key), after_at.get(key)) else { continue };
        compared += 1;
        let (hb, ha) = (half(&before_at, key), half(&after_at, key));
        let differs = match (b.is_finite(), a.is_finite()) {
            (true, true) => (a - b).abs() > (hb * hb + ha * ha).sqrt(),
            (false, false) => false,
            _ => true,
        };
        if differs {
            out.push(Moved { key: key.to_string(), before: (b, hb), after: (a, ha) });
        }
    }
    (out, compared)
}

fn shown((v, h): (f64, f64)) -> String {
    if h > 0.0 { fmt_pm(v, h) } else { fmt_num(v) }
}

pub fn main(before_file: &Path, after_file: &Path, markdown: bool) -> Result<i32> {
    let (before, after) = (read(before_file)?, read(after_file)?);
    let mut differences = 0;
    let mut compared = 0;
    if before.routelab != after.routelab {
        println!("note: written by routelab {} and {}", before.routelab, after.routelab);
    }
    for w in &after.workloads {
        let Some(wb) = before.workloads.iter().find(|b| b.name == w.name) else {
            println!("{}: only in {}", w.name, after_file.display());
            differences += 1;
            continue;
        };
        let mut t = Table::new();
        t.load_style(if markdown { presets::ASCII_MARKDOWN } else { presets::UTF8_FULL_CONDENSED });
        t.set_header(vec!["policy", "metric", "before", "after", "after ÷ before"]);
        let mut notes = Vec::new();
        let mut rows = 0;
        for p in &w.results {
            let Some(pb) = wb.results.iter().find(|b| b.policy == p.policy) else {
                notes.push(format!("{}: only in {}", p.policy, after_file.display()));
                continue;
            };
            match (&pb.error, &p.error) {
                (None, None) => {}
                (Some(_), Some(_)) => continue,
                (Some(e), None) => {
                    notes.push(format!("{}: failed before ({}), runs after", p.policy, e.lines().next().unwrap_or("")));
                    continue;
                }
                (None, Some(e)) => {
                    notes.push(format!("{}: ran before, fails after ({})", p.policy, e.lines().next().unwrap_or("")));
                    continue;
                }
            }
            let (moved, n) = moved(&pb.metrics, &p.metrics);
            compared += n;
            differences += moved.len();
            rows += moved.len();
            for m in moved {
                let right = |s: String| Cell::new(s).set_alignment(CellAlignment::Right);
                t.add_row(vec![
                    Cell::new(&p.policy),
                    Cell::new(&m.key),
                    right(shown(m.before)),
                    right(shown(m.after)),
                    right(m.ratio()),
                ]);
            }
        }
        for p in wb.results.iter().filter(|b| !w.results.iter().any(|a| a.policy == b.policy)) {
            notes.push(format!("{}: only in {}", p.policy, before_file.display()));
        }
        differences += notes.len();
        if rows > 0 || !notes.is_empty() {
            println!("{}", w.name);
            if rows > 0 {
                println!("{t}");
            }
            for n in notes {
                println!("{n}");
            }
        }
    }
    for w in before.workloads.iter().filter(|b| !after.workloads.iter().any(|a| a.name == b.name)) {
        println!("{}: only in {}", w.name, before_file.display());
        differences += 1;
    }
    if differences == 0 {
        println!("no metric moved beyond its 95% interval ({compared} compared)");
        Ok(0)
    } else {
        println!("{differences} difference(s); {compared} metrics compared");
        Ok(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics(pairs: &[(&str, f64)]) -> Metrics {
        let mut m = Metrics::new();
        for (k, v) in pairs {
            m.push(*k, *v);
        }
        m
    }

    #[test]
    fn a_change_inside_the_intervals_is_not_a_move() {
        let before = metrics(&[("x", 10.0), ("x_ci95", 1.0)]);
        // √(1² + 1²) ≈ 1.414: 11.4 is inside, 11.5 beyond.
        assert!(moved(&before, &metrics(&[("x", 11.4), ("x_ci95", 1.0)])).0.is_empty());
        let (m, n) = moved(&before, &metrics(&[("x", 11.5), ("x_ci95", 1.0)]));
        assert_eq!((m.len(), n, m[0].ratio()), (1, 1, "1.150".to_string()));
    }

    #[test]
    fn without_intervals_any_difference_moves_and_null_to_a_value_too() {
        assert_eq!(moved(&metrics(&[("x", 1.0)]), &metrics(&[("x", 1.0)])).0.len(), 0);
        assert_eq!(moved(&metrics(&[("x", 1.0)]), &metrics(&[("x", 1.0 + 1e-12)])).0.len(), 1);
        assert_eq!(moved(&metrics(&[("x", f64::NAN)]), &metrics(&[("x", 1.0)])).0.len(), 1);
        assert_eq!(moved(&metrics(&[("x", f64::NAN)]), &metrics(&[("x", f64::NAN)])).0.len(), 0);
    }
}
