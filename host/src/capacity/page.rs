//! `routelab capacity --report FILE`: the search as one self-contained HTML page, made with the
//! report machinery of `compare` and `sweep` (the same head, style and reproduce line, the same
//! charts): the answers table, notes and warnings, each SLO metric against the load, every load
//! each policy ran, and the workload as run.

use std::fmt::Write as _;

use anyhow::Result;

use super::expr::Target;
use super::report::{self, Report};
use crate::report::figures::{Figure, file_name};
use crate::report::html::{self, escape};
use crate::report::table::fmt_num;

/// The page's HTML text; `argv` is the command line as typed.
pub fn render(r: &Report, target: &Target, argv: &[String]) -> Result<String> {
    let mut h = String::new();
    html::open(&mut h, "capacity", argv, &format!("workload {} · {}", r.workload, r.seeds_text()));
    let _ = writeln!(
        h,
        "<p class=\"meta\">Per policy, the highest load at which every condition holds on the mean over the \
         seeds, with no request left unfinished; the same seeds at every load. The search doubles (or \
         halves) the load from the workload's own until one load holds and one fails, then bisects: the \
         answer is known to lie in [the highest load seen to hold, the lowest seen to fail). Same command, \
         same routelab version: the same numbers.</p>"
    );
    let _ = writeln!(h, "<h2 id=\"answers\">{}</h2>", escape(r.workload));
    let _ = writeln!(h, "<p class=\"meta\">{}</p>", escape(&r.caption()));
    let g = report::grid(r, target);
    h.push_str("<table>\n<tr>");
    for c in &g.header {
        let _ = write!(h, "<th>{}</th>", escape(c));
    }
    h.push_str("</tr>\n");
    for (policy, cells) in &g.rows {
        let _ = write!(h, "<tr><td>{}</td>", escape(policy));
        match cells {
            Err(e) => {
                let _ = write!(h, "<td class=\"failed\" colspan=\"{}\">FAILED: {}</td>", g.header.len() - 1, escape(e));
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
    if let Some(q) = r.trace_rate_rps {
        let _ = writeln!(
            h,
            "<p class=\"meta\">Speed 1 replays the trace at {} requests/s (its requests over the span of their \
             arrivals); speed m at m × that.</p>",
            fmt_num(q)
        );
    }
    for (policy, warning, text) in report::remarks(r) {
        let (class, word) = if warning { ("warning", "warning") } else { ("meta", "note") };
        let _ = writeln!(h, "<p class=\"{class}\">{word}: {}: {}</p>", escape(policy), escape(text));
    }
    for c in &target.conditions {
        let stem = format!("{}_capacity_{}", file_name(r.workload), file_name(&c.metric));
        let svg = report::chart_svg(r, c)?;
        html::figure(&mut h, &Figure { stem, title: c.to_string(), svg });
    }
    loads(&mut h, r, target);
    let yaml = serde_norway::to_string(r.resolved)?;
    let _ = writeln!(
        h,
        "<details><summary>The workload as run, at its own load (every default filled in; {})</summary>\n\
         <pre>{}</pre>\n</details>",
        escape(&r.seeds_text()),
        escape(&yaml)
    );
    html::close(&mut h);
    Ok(h)
}

/// Every load each policy ran, in the order run: the load (and, replaying a trace, its
/// requests/s), whether the SLO held, and each condition's metric (mean over seeds).
fn loads(h: &mut String, r: &Report, target: &Target) {
    for p in r.results {
        let Some(a) = &p.answer else { continue };
        let _ = write!(
            h,
            "<details><summary>{}: the {} loads run, in order</summary>\n<table>\n<tr><th>{}</th>",
            escape(&p.policy),
            a.points.len(),
            escape(r.knob.label())
        );
        if r.trace_rate_rps.is_some() {
            h.push_str("<th>requests/s</th>");
        }
        h.push_str("<th>SLO</th>");
        for c in &target.conditions {
            let _ = write!(h, "<th>{}</th>", escape(&c.metric));
        }
        h.push_str("</tr>\n");
        for pt in &a.points {
            let _ = write!(h, "<tr><td class=\"num\">{}</td>", fmt_num(pt.load));
            if let Some(q) = r.trace_rate_rps {
                let _ = write!(h, "<td class=\"num\">{}</td>", fmt_num(pt.load * q));
            }
            let (class, word) = if pt.holds { ("holds", "holds") } else { ("fails", "fails") };
            let _ = write!(h, "<td class=\"{class}\">{word}</td>");
            for c in &target.conditions {
                let v = pt.metrics.get(&c.metric).map_or("–".into(), fmt_num);
                let _ = write!(h, "<td class=\"num\">{}</td>", escape(&v));
            }
            h.push_str("</tr>\n");
        }
        h.push_str("</table>\n</details>\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capacity::{Answer, Knob, Point, PolicyCapacity, Settings, Status, expr};
    use routelab_core::metrics::Metrics;

    fn point(load: f64, ttft: f64) -> Point {
        let mut metrics = Metrics::new();
        metrics.push("ttft_p99_s", ttft);
        Point { load, holds: ttft < 2.0, metrics }
    }

    /// The page of a trace replay's search: the answers in speed and requests/s, the warning
    /// of a metric not monotone in load (styled apart from notes), every load run in order with
    /// its verdict, the chart, the workload as run; nothing loaded from elsewhere.
    #[test]
    fn the_page_shows_answers_in_requests_per_second_warnings_and_every_load() {
        let yaml = "name: replay\ncluster:\n  replicas: 1\n  generator: {output_tokens: 8}\n  \
                    arrivals: {trace: {path: t.csv}}\n  requests: 10\n";
        let w = routelab_core::workload::parse(yaml, std::path::Path::new("replay.yaml")).unwrap();
        let target = expr::parse("ttft_p99_s<2", &w).unwrap();
        let points = vec![point(1.0, 0.5), point(2.0, 1.5), point(4.0, 2.5), point(3.0, 1.4)];
        let warning = target.non_monotone(&points, 3.0).expect("1.4 at 3 is better than 1.5 at 2");
        let answer = Answer { status: Status::Found, lo: 3.0, hi: 4.0, points, note: None, warning: Some(warning) };
        let results = [
            PolicyCapacity {
                policy: "noisy".into(),
                spec: "noisy".into(),
                answer: Some(answer),
                runs: 4,
                capacity_rps: Some(7.5),
                error: None,
            },
            PolicyCapacity {
                policy: "broken".into(),
                spec: "broken".into(),
                answer: None,
                runs: 0,
                capacity_rps: None,
                error: Some("it <panicked>\nat line 2".into()),
            },
        ];
        let r = Report {
            routelab: "test",
            command: "capacity",
            workload: "replay",
            world: "cluster",
            seed: 1,
            seeds: 3,
            knob: Knob::TraceSpeed,
            start: 1.0,
            trace_rate_rps: Some(2.5),
            slo: vec!["ttft_p99_s < 2".into()],
            bounds: None,
            settings: Settings { tolerance: 0.02, max_points: 40 },
            resolved: &w,
            results: &results,
        };
        let argv: Vec<String> =
            ["routelab", "capacity", "replay.yaml", "--slo", "ttft_p99_s<2"].map(String::from).into();
        let h = render(&r, &target, &argv).unwrap();
        assert!(h.contains("<title>routelab capacity report</title>"));
        assert!(
            h.contains("<code>routelab capacity replay.yaml --slo &#39;ttft_p99_s&lt;2&#39;</code>"),
            "reproduce line"
        );
        assert!(h.contains("seeds 1..3"));
        // Capacity 3 × the trace's 2.5 requests/s.
        assert!(h.contains("<th>capacity [requests/s]</th>"));
        assert!(h.contains("<tr><td>noisy</td><td class=\"num\">3</td><td class=\"num\">7.500</td>"), "{h}");
        assert!(h.contains("<td class=\"failed\" colspan=\"6\">FAILED: it &lt;panicked&gt;</td>"));
        assert!(h.contains("<p class=\"warning\">warning: noisy: ttft_p99_s is better at load 3"));
        assert!(h.contains("more --seeds"));
        // Every load in the order run, each with its requests/s and verdict.
        let loads = h.split("noisy: the 4 loads run, in order").nth(1).expect("the loads table");
        let loads = loads.split("</table>").next().unwrap();
        assert_eq!(loads.matches("<td class=\"holds\">holds</td>").count(), 3);
        assert_eq!(loads.matches("<td class=\"fails\">fails</td>").count(), 1);
        assert!(loads.find(">10</td>").unwrap() < loads.find(">7.500</td>").unwrap(), "load 4 (10/s) ran before 3");
        assert!(
            h.contains("id=\"replay_capacity_ttft_p99_s\"")
                && h.contains("trace speed [× the trace&apos;s 2.500 requests/s]")
        );
        assert!(h.contains("path: t.csv"), "the workload as run");
        for outside in ["<script", "<link", "<img", "src=", "url(", "https:"] {
            assert!(!h.contains(outside), "the page loads something ({outside})");
        }
    }
}
