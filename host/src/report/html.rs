//! `--report FILE`: one self-contained HTML page — no scripts, fonts, styles or images from
//! anywhere else — with every table, the charts of [`super::figures`] as inline SVG, each
//! workload as run (resolved YAML), the seeds, the routelab version and the command that
//! reproduces it. A page opened years later, offline, shows the same thing.

use std::fmt::Write as _;

use anyhow::{Context, Result};

use super::figures::{self, Figure};
use super::table::{self, fmt_num};
use routelab_core::runner::WorkloadResult;

/// What a sweep moved, to draw its curves: the `--set` field and how many points each workload has
/// (its results are `points` consecutive entries, one base workload after another).
#[derive(Clone, Debug)]
pub struct Sweep<'a> {
    pub field: &'a str,
    /// The base workloads' names, in order.
    pub names: &'a [String],
    pub points: usize,
}

/// Everything the page shows.
pub struct Page<'a> {
    /// `run`, `compare`, `sweep`.
    pub command: &'a str,
    /// The command line as typed (program name first).
    pub argv: &'a [String],
    pub results: &'a [WorkloadResult],
    pub sweep: Option<Sweep<'a>>,
}

/// `s` with HTML's special characters escaped (text and attribute values alike).
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `args` as one shell command line: `routelab` first, arguments quoted where the shell would
/// otherwise split or expand them.
pub fn command_line(args: &[String]) -> String {
    let quote = |a: &str| {
        let plain = !a.is_empty() && a.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,@+%".contains(c));
        if plain { a.to_string() } else { format!("'{}'", a.replace('\'', r"'\''")) }
    };
    std::iter::once("routelab".to_string()).chain(args.iter().skip(1).map(|a| quote(a))).collect::<Vec<_>>().join(" ")
}

const STYLE: &str = "body{font-family:sans-serif;margin:24px auto;max-width:1100px;color:#111;padding:0 12px}\
h1{font-size:1.5em}h2{font-size:1.25em;margin-top:2em;border-bottom:1px solid #ccc}h3{font-size:1.05em}\
table{border-collapse:collapse;margin:8px 0;font-size:.9em}th,td{border:1px solid #bbb;padding:3px 8px}\
th{background:#f0f0f0}td.num{text-align:right;font-variant-numeric:tabular-nums}td.failed{color:#a00}\
.warning{color:#8a4b00}td.holds{color:#1a6b1a}td.fails{color:#a00}\
pre{background:#f6f6f6;padding:8px;overflow-x:auto;font-size:.85em}code{background:#f6f6f6}\
figure{margin:12px 8px 12px 0;display:inline-block;vertical-align:top}figure svg{max-width:100%;height:auto}.meta{color:#444}";

/// The start of a report page — head, style, title, version line and the command that
/// reproduces it — shared by every command's page (`what` follows the version: "2 workload(s)").
pub fn open(h: &mut String, command: &str, argv: &[String], what: &str) {
    let version = env!("CARGO_PKG_VERSION");
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>routelab {} report</title>\n<style>{STYLE}</style>\n</head>\n<body>\n\
         <h1>routelab {} report</h1>\n<p class=\"meta\">routelab {version} · {}</p>\n\
         <p>Reproduce: <code>{}</code></p>\n",
        escape(command),
        escape(command),
        escape(what),
        escape(&command_line(argv)),
    );
}

/// The end of a report page.
pub fn close(h: &mut String) {
    h.push_str("</body>\n</html>\n");
}

/// The page's HTML text.
pub fn render(page: &Page) -> Result<String> {
    let mut h = String::new();
    open(&mut h, page.command, page.argv, &format!("{} workload(s)", page.results.len()));
    let _ = writeln!(
        h,
        "<p class=\"meta\">Same command, same routelab version: the same numbers. Bars show the mean over \
         seeds with its 95% interval; an overloaded run (its latencies depend on when it stopped) is \
         hatched and off the scale; axes turn logarithmic when values span more than {}×.</p>",
        super::chart::LOG_SPAN
    );
    if let Some(s) = &page.sweep {
        h.push_str("<h2>Sweep</h2>\n");
        for (name, chunk) in s.names.iter().zip(page.results.chunks(s.points.max(1))) {
            let _ = writeln!(h, "<h3>{} — {} swept</h3>", escape(name), escape(s.field));
            for f in figures::sweep(name, s.field, chunk).with_context(|| format!("charts of {name}"))? {
                figure(&mut h, &f);
            }
        }
    }
    for w in page.results {
        workload(&mut h, w)?;
    }
    close(&mut h);
    Ok(h)
}

/// A chart, inline, with an id to link to.
pub fn figure(h: &mut String, f: &Figure) {
    let _ = writeln!(h, "<figure id=\"{}\">\n{}\n</figure>", escape(&f.stem), f.svg);
}

/// One workload's section: caption, table, failures, notes, charts, every metric, the workload.
fn workload(h: &mut String, w: &WorkloadResult) -> Result<()> {
    let g = table::grid(w, None);
    let _ = writeln!(h, "<h2 id=\"{}\">{}</h2>", escape(&figures::file_name(&w.name)), escape(&w.name));
    let _ = writeln!(h, "<p class=\"meta\">{}</p>", escape(&g.caption));
    h.push_str("<table>\n<tr>");
    for c in &g.header {
        let _ = write!(h, "<th>{}</th>", escape(c));
    }
    h.push_str("</tr>\n");
    for (policy, cells) in &g.rows {
        let _ = write!(h, "<tr><td>{}</td>", escape(policy));
        match cells {
            Err(first) => {
                let _ =
                    write!(h, "<td class=\"failed\" colspan=\"{}\">FAILED: {}</td>", g.header.len() - 1, escape(first));
            }
            Ok(cells) => {
                for c in cells {
                    let _ = write!(h, "<td class=\"num\">{}</td>", escape(c));
                }
            }
        }
        h.push_str("</tr>\n");
    }
    h.push_str("</table>\n");
    for r in w.results.iter().filter(|r| r.error.is_some()) {
        let _ = writeln!(
            h,
            "<p class=\"failed\">{} failed:</p><pre>{}</pre>",
            escape(&r.policy),
            escape(r.error.as_deref().unwrap_or(""))
        );
    }
    for n in &w.notes {
        let _ = writeln!(h, "<p class=\"meta\">note: {}</p>", escape(n));
    }
    for f in figures::comparison(w).with_context(|| format!("charts of {}", w.name))? {
        figure(h, &f);
    }
    every_metric(h, w);
    let yaml = serde_norway::to_string(&w.resolved).context("writing the resolved workload")?;
    let _ = writeln!(
        h,
        "<details><summary>The workload as run (every default filled in; seeds {}..{})</summary>\n<pre>{}</pre>\n</details>",
        w.seed,
        w.seed + w.seeds.max(1) as u64 - 1,
        escape(&yaml)
    );
    Ok(())
}

/// Every metric of every policy (the JSON's `metrics`): a row per key, a column per policy.
fn every_metric(h: &mut String, w: &WorkloadResult) {
    let ok: Vec<_> = w.results.iter().filter(|r| r.error.is_none()).collect();
    let mut keys: Vec<&str> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for r in &ok {
        for k in r.metrics.keys().filter(|k| !k.ends_with("_ci95")) {
            if seen.insert(k) {
                keys.push(k);
            }
        }
    }
    // Looked up by key: a policy may report many figures.
    let index: Vec<_> = ok.iter().map(|r| r.metrics.index()).collect();
    if keys.is_empty() {
        return;
    }
    h.push_str(
        "<details><summary>Every metric (mean over seeds ± 95% interval)</summary>\n<table>\n<tr><th>metric</th>",
    );
    for r in &ok {
        let _ = write!(h, "<th>{}</th>", escape(&r.policy));
    }
    h.push_str("</tr>\n");
    for k in keys {
        let _ = write!(h, "<tr><td>{}</td>", escape(k));
        for m in &index {
            let text = match (m.get(k).copied(), m.get(format!("{k}_ci95").as_str()).copied()) {
                (Some(v), Some(ci)) if ci.is_finite() => table::fmt_pm(v, ci),
                (Some(v), _) => fmt_num(v),
                (None, _) => String::new(),
            };
            let _ = write!(h, "<td class=\"num\">{}</td>", escape(&text));
        }
        h.push_str("</tr>\n");
    }
    h.push_str("</table>\n</details>\n");
}
