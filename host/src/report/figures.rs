//! Which charts a result gets, as SVG text: the one list `--plot` writes to files and `--report`
//! puts in the page.
//!
//! A comparison gets a bar chart per headline metric (95% error bars; an overloaded run's
//! latencies off the scale), the latency CDF of each policy's first seed, and each policy's
//! per-replica in-flight requests over that seed (herding shows as one replica's line far above
//! the others). A sweep gets a curve per policy of each headline metric against the swept
//! field's value as run (a `x1.5` multiplier resolved to the rate itself).
//!
//! Every chart shows the contenders: an overloaded run (its queue grew until the run stopped)
//! never sets an axis. Its latency bars are hatched to the top, its CDF is clipped at the right
//! edge, and its in-flight chart has a y axis of its own, as does any policy whose in-flight peak
//! is more than [`OWN_AXIS_FACTOR`]× the contenders' median (a shared axis would flatten them).
//! Metrics an overload does not distort (hit rate, replication) are drawn as they are.

use anyhow::Result;

use super::COLUMNS;
use plotters::chart::SeriesLabelPosition;

use super::chart::{self, Bar, LineChart, Point, Series};
use routelab_core::runner::{PolicyResult, WorkloadResult};

/// One chart: a file-name stem (`<workload>_<what>`), a title, and the SVG text.
#[derive(Clone, Debug)]
pub struct Figure {
    pub stem: String,
    pub title: String,
    pub svg: String,
}

/// Metrics drawn as bars for a comparison, when present.
const BAR_KEYS: &[&str] = &[
    "response_mean",
    "response_p99",
    "max_load",
    "latency_mean_s",
    "latency_p99_s",
    "ttft_p99_s",
    "hit_rate",
    "replication_factor",
    "test_accuracy",
];

/// Metrics drawn against the swept value, when present.
const SWEEP_KEYS: &[&str] =
    &["response_mean", "response_p99", "max_load", "latency_mean_s", "latency_p99_s", "ttft_p99_s", "test_accuracy"];

/// A bar further than this factor above the median of the others is drawn off the scale (a
/// run that did not settle, in a world without an `overloaded` figure).
const OFF_SCALE_FACTOR: f64 = 1000.0;

/// A metric's header with its unit, as in the tables (charts also draw a few the tables leave out).
pub fn header(key: &str) -> &str {
    const MORE: &[(&str, &str)] = &[("ttft_p99_s", "TTFT p99 [s]"), ("response_p99", "response p99 [E[S]]")];
    let more = MORE.iter().find(|(k, _)| *k == key).map(|(_, h)| *h);
    more.or_else(|| COLUMNS.iter().find(|c| c.key == key).map(|c| c.header)).unwrap_or(key)
}

/// `s` usable in a file name.
pub fn file_name(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect()
}

fn overloaded(r: &PolicyResult) -> bool {
    r.metrics.get("overloaded").is_some_and(|o| o > 0.0)
}

/// Whether metric `key` depends on when an overloaded run stopped (a latency or a wait: its
/// queue kept growing), so that an overloaded run's value is off the scale. A hit rate or a
/// replication factor is what it is.
fn stop_dependent(key: &str) -> bool {
    ["latency", "response", "ttft", "tpot", "wait"].iter().any(|p| key.starts_with(p))
}

fn median(mut xs: Vec<f64>) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// The bars of metric `key`: one per policy that has it.
pub fn bars_of(w: &WorkloadResult, key: &str) -> Vec<Bar> {
    let ok = w.results.iter().filter(|r| r.error.is_none());
    let mut bars: Vec<Bar> = ok
        .filter_map(|r| {
            let value = r.metrics.get(key)?;
            let ci95 = r.metrics.get(&format!("{key}_ci95")).unwrap_or(f64::NAN);
            let off_scale = (stop_dependent(key) && overloaded(r)) || !value.is_finite();
            Some(Bar { label: r.policy.clone(), value, ci95, off_scale })
        })
        .collect();
    for i in 0..bars.len() {
        let others = bars.iter().enumerate().filter(|(j, b)| *j != i && !b.off_scale).map(|(_, b)| b.value.abs());
        let m = median(others.collect());
        if m > 0.0 && bars[i].value.abs() > OFF_SCALE_FACTOR * m {
            bars[i].off_scale = true;
        }
    }
    bars
}

/// The charts of one workload's comparison.
pub fn comparison(w: &WorkloadResult) -> Result<Vec<Figure>> {
    let mut out = Vec::new();
    let name = file_name(&w.name);
    for key in BAR_KEYS {
        let bars = bars_of(w, key);
        if bars.is_empty() {
            continue;
        }
        let title = format!("{} — {}", w.name, header(key));
        let svg = chart::bars(&title, header(key), &bars)?;
        out.push(Figure { stem: format!("{name}_{key}"), title, svg });
    }
    out.extend(cdf(w)?);
    out.extend(timelines(w)?);
    Ok(out)
}

/// Above this many replicas a timeline is a heat map (a line each would be a tangle).
const MAX_TIMELINE_LINES: usize = 8;

/// The unit of latencies and times in `w`'s world.
fn time_unit(w: &WorkloadResult) -> &'static str {
    if w.world == "dispatch" { "mean service times" } else { "s" }
}

/// The latency CDF of every policy's first seed, one line each.
fn cdf(w: &WorkloadResult) -> Result<Option<Figure>> {
    let series: Vec<Series> = w
        .results
        .iter()
        .filter_map(|r| {
            let d = r.detail.as_ref().filter(|d| !d.latency_quantiles.is_empty())?;
            let n = (d.latency_quantiles.len() - 1).max(1) as f64;
            // From the 1st percentile: the fastest request alone would stretch a log axis.
            let from = d.latency_quantiles.len() / 100;
            let points =
                d.latency_quantiles.iter().enumerate().skip(from).map(|(i, &x)| (x, d.finished_share * i as f64 / n));
            Some(Series { apart: overloaded(r), ..Series::new(r.policy.clone(), points) })
        })
        .collect();
    if series.is_empty() {
        return Ok(None);
    }
    let what = if w.world == "dispatch" { "response time" } else { "latency" };
    let title = format!("{} — {what} CDF (seed {})", w.name, w.seed);
    let x_desc = format!("{what} [{}]", time_unit(w));
    let svg = chart::lines(&LineChart {
        title: &title,
        x_desc: &x_desc,
        y_desc: "fraction of requests finished within",
        series: &series,
        y_range: Some((0.0, 1.0)),
        marker_every: 25,
        legend: true,
        linear_x: false,
        size: (820, 460),
        off_scale_means: chart::OVERLOADED,
        reference: None,
        legend_at: SeriesLabelPosition::LowerRight,
    })?;
    Ok(Some(Figure { stem: format!("{}_latency_cdf", file_name(&w.name)), title, svg }))
}

/// A policy whose in-flight peak is more than this factor above the median peak of the
/// contenders gets its own y axis, as an overloaded one does.
pub const OWN_AXIS_FACTOR: f64 = 4.0;

/// Which policies' in-flight charts get a y axis of their own (`peaks`: each policy's largest
/// in-flight count; `overloaded`: whether its run was): the overloaded ones, and those more
/// than [`OWN_AXIS_FACTOR`]× the median peak of the others. The rest share an axis.
pub fn own_axis(peaks: &[f64], overloaded: &[bool]) -> Vec<bool> {
    let contenders: Vec<f64> = peaks.iter().zip(overloaded).filter(|(_, o)| !**o).map(|(p, _)| *p).collect();
    let m = median(contenders);
    peaks.iter().zip(overloaded).map(|(p, o)| *o || (m > 0.0 && *p > OWN_AXIS_FACTOR * m)).collect()
}

/// Each policy's per-replica in-flight requests over its first seed: the contenders on a shared
/// y axis, an overloaded or far higher one on its own ([`own_axis`]), its title saying so.
fn timelines(w: &WorkloadResult) -> Result<Vec<Figure>> {
    let with: Vec<_> =
        w.results.iter().filter_map(|r| Some((r, r.detail.as_ref().filter(|d| !d.times.is_empty())?))).collect();
    let peaks: Vec<f64> =
        with.iter().map(|(_, d)| d.in_flight.iter().flatten().copied().max().unwrap_or(0) as f64).collect();
    let apart = own_axis(&peaks, &with.iter().map(|(r, _)| overloaded(r)).collect::<Vec<_>>());
    let shared = peaks.iter().zip(&apart).filter(|(_, a)| !**a).map(|(p, _)| *p).fold(1.0, f64::max);
    let x_desc = format!("time [{}]", time_unit(w));
    let mut out = Vec::new();
    for ((r, d), (own, peak)) in with.into_iter().zip(apart.into_iter().zip(peaks)) {
        let replicas = d.in_flight.first().map_or(0, Vec::len);
        let top = if own { peak.max(1.0) } else { shared };
        let axis = match (own, overloaded(r)) {
            (false, _) => "",
            (true, true) => ", own y axis: overloaded",
            (true, false) => ", own y axis",
        };
        let title = format!("{} — {}: requests in flight per replica (seed {}{axis})", w.name, r.policy, w.seed);
        let svg = if replicas > MAX_TIMELINE_LINES {
            let rows: Vec<Vec<f64>> =
                (0..replicas).map(|k| d.in_flight.iter().map(|c| c[k] as f64).collect()).collect();
            super::heatmap::heatmap(&title, &x_desc, "replica", &d.times, &rows, top)?
        } else {
            let series: Vec<Series> = (0..replicas)
                .map(|k| {
                    let pts = d.times.iter().zip(&d.in_flight).map(|(&t, c)| (t, c[k] as f64));
                    Series::new(format!("replica {k}"), pts)
                })
                .collect();
            chart::lines(&LineChart {
                title: &title,
                x_desc: &x_desc,
                y_desc: "requests in flight",
                series: &series,
                y_range: Some((0.0, top * 1.05)),
                marker_every: 0,
                legend: true,
                linear_x: true,
                size: (820, 340),
                off_scale_means: chart::OVERLOADED,
                reference: None,
                legend_at: SeriesLabelPosition::UpperLeft,
            })?
        };
        out.push(Figure { stem: format!("{}_inflight_{}", file_name(&w.name), file_name(&r.policy)), title, svg });
    }
    Ok(out)
}

/// The value of dotted `field` in `w`'s resolved workload (a path may start inside the world
/// section, as `--set` allows), when it is a number.
pub fn swept_value(w: &WorkloadResult, field: &str) -> Option<f64> {
    let doc = serde_norway::to_value(&w.resolved).ok()?;
    let keys: Vec<&str> = field.split('.').collect();
    let find = |mut at: &serde_norway::Value, keys: &[&str]| {
        for k in keys {
            at = at.get(*k)?;
        }
        at.as_f64()
    };
    find(&doc, &keys).or_else(|| {
        let world = doc.get(w.world)?;
        find(world, &keys)
    })
}

/// The charts of one sweep: `points` are the workload's results at each point, in order.
pub fn sweep(name: &str, field: &str, points: &[WorkloadResult]) -> Result<Vec<Figure>> {
    let Some(first) = points.first() else { return Ok(Vec::new()) };
    let resolved: Option<Vec<f64>> = points.iter().map(|w| swept_value(w, field)).collect();
    // A non-numeric field (a policy name, a distribution) is drawn against the point's index.
    let (xs, x_desc) = match resolved {
        Some(xs) => (xs, field.to_string()),
        None => ((0..points.len()).map(|k| k as f64).collect(), format!("{field} (point number)")),
    };
    let policies: Vec<&str> = first.results.iter().map(|r| r.policy.as_str()).collect();
    let mut out = Vec::new();
    let keys =
        SWEEP_KEYS.iter().filter(|k| points.iter().any(|w| w.results.iter().any(|r| r.metrics.get(k).is_some())));
    for key in keys {
        let series: Vec<Series> = policies
            .iter()
            .map(|p| Series {
                label: p.to_string(),
                points: points
                    .iter()
                    .zip(&xs)
                    .filter_map(|(w, &x)| {
                        let r = w.results.iter().find(|r| r.policy == *p && r.error.is_none())?;
                        let y = r.metrics.get(key)?;
                        let ci95 = r.metrics.get(&format!("{key}_ci95")).unwrap_or(f64::NAN);
                        Some(Point { x, y, ci95, off_scale: overloaded(r) || !y.is_finite() })
                    })
                    .collect(),
                apart: false,
            })
            .collect();
        let title = format!("{name}: {} vs {field}", header(key));
        let svg = chart::lines(&LineChart {
            title: &title,
            x_desc: &x_desc,
            y_desc: header(key),
            series: &series,
            y_range: None,
            marker_every: 1,
            legend: true,
            linear_x: false,
            size: (820, 480),
            off_scale_means: chart::OVERLOADED,
            reference: None,
            legend_at: SeriesLabelPosition::UpperLeft,
        })?;
        out.push(Figure { stem: format!("{}_sweep_{}_{key}", file_name(name), file_name(field)), title, svg });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use routelab_core::metrics::{Detail, Metrics};
    use routelab_core::runner::empty_result;

    fn result(w: &str, policies: &[(&str, f64, f64)]) -> WorkloadResult {
        let w = routelab_core::workload::parse(w, std::path::Path::new("w.yaml")).unwrap();
        let results = policies
            .iter()
            .map(|&(p, v, overloaded)| {
                let mut m = Metrics::new();
                m.push("latency_mean_s", v);
                m.push("overloaded", overloaded);
                let spec = routelab_core::plugin::PolicySpec::parse(p).unwrap();
                routelab_core::runner::PolicyResult { metrics: m, ..empty_result(&spec) }
            })
            .collect();
        WorkloadResult {
            name: w.name.clone(),
            world: w.world().as_str(),
            seed: 1,
            seeds: 1,
            resolved: w,
            notes: Vec::new(),
            results,
        }
    }

    const CLUSTER: &str = "cluster:\n  replicas: 2\n  generator: {output_tokens: 16}\n  arrivals: {poisson: {rate: 1.5}}\n  requests: 50\n";

    /// A sweep's x is the value as run: `x1.5` of rate 1 is drawn at 1.5, found with or without
    /// the world prefix.
    #[test]
    fn the_swept_value_is_read_from_the_workload_as_run() {
        let w = result(CLUSTER, &[]);
        assert_eq!(swept_value(&w, "arrivals.poisson.rate"), Some(1.5));
        assert_eq!(swept_value(&w, "cluster.arrivals.poisson.rate"), Some(1.5));
        assert_eq!(swept_value(&w, "replicas"), Some(2.0));
        assert_eq!(swept_value(&w, "no.such.field"), None);
    }

    /// Series polylines' vertical extent in an SVG, in pixels (the mesh is drawn as lines of
    /// one pixel, series as polylines of two; the legend, drawn last on its translucent white
    /// box, is left out).
    pub fn drawn_height(svg: &str) -> f64 {
        let plot = svg.split("opacity=\"0.85\" fill=\"#FFFFFF\"").next().unwrap();
        let ys: Vec<f64> = plot
            .split("<polyline")
            .skip(1)
            .filter(|p| p.contains("stroke-width=\"2\""))
            .filter_map(|p| p.split("points=\"").nth(1)?.split('"').next())
            .flat_map(|pts| pts.split_whitespace().filter_map(|xy| xy.split_once(',')?.1.parse::<f64>().ok()))
            .collect();
        ys.iter().copied().fold(f64::NEG_INFINITY, f64::max) - ys.iter().copied().fold(f64::INFINITY, f64::min)
    }

    /// Three contenders peaking at 3–5 requests in flight and one overloaded run at 15,000 (as
    /// vllm_prefix_aware on tool_use): every chart shows its own data, none is flattened.
    #[test]
    fn an_overloaded_policy_does_not_flatten_the_contenders_in_flight_charts() {
        let mut w = result(
            CLUSTER,
            &[("random", 2.0, 0.0), ("round_robin", 3.0, 0.0), ("lpm", 1.0, 0.0), ("max_affinity", 600.0, 1.0)],
        );
        for (r, peak) in w.results.iter_mut().zip([3u32, 4, 5, 15_000]) {
            let times: Vec<f64> = (0..50).map(|t| t as f64).collect();
            let in_flight = (0..50u32).map(|t| vec![peak * t / 49, peak * (49 - t) / 49 / 2]).collect();
            r.detail = Some(Box::new(Detail { times, in_flight, ..Detail::default() }));
        }
        let charts = timelines(&w).unwrap();
        assert_eq!(charts.len(), 4);
        for f in &charts {
            // The plot is 340 pixels high with ~80 of labels and caption: a line rising to its
            // peak spans well over 100 of them.
            let h = drawn_height(&f.svg);
            assert!(h > 100.0, "{}: drawn {h:.0} pixels high", f.title);
        }
        assert!(charts[3].title.contains("own y axis: overloaded"), "{}", charts[3].title);
        assert!(charts[..3].iter().all(|f| !f.title.contains("own y axis")));
        // The contenders share one axis: the lowest peak is drawn lower than the highest.
        assert!(drawn_height(&charts[0].svg) < 0.7 * drawn_height(&charts[2].svg));
    }

    #[test]
    fn own_axes_go_to_the_overloaded_and_the_far_higher() {
        assert_eq!(own_axis(&[3.0, 4.0, 5.0, 15_000.0], &[false, false, false, true]), [false, false, false, true]);
        // Not overloaded, but 25× the median of the contenders.
        assert_eq!(own_axis(&[3.0, 4.0, 100.0], &[false; 3]), [false, false, true]);
        assert_eq!(own_axis(&[3.0, 4.0, 12.0], &[false; 3]), [false; 3]);
    }

    /// Hatching says "this value depends on when the run stopped": true of an overloaded run's
    /// latency, not of its hit rate or replication.
    #[test]
    fn only_latencies_of_overloaded_runs_are_hatched() {
        let mut w = result(CLUSTER, &[("random", 2.0, 0.0), ("round_robin", 3.0, 1.0)]);
        for r in &mut w.results {
            r.metrics.push("hit_rate", 0.5);
            r.metrics.push("ttft_p99_s", 1.0);
        }
        let off = |key| bars_of(&w, key).iter().map(|b| b.off_scale).collect::<Vec<_>>();
        assert_eq!(off("hit_rate"), [false, false]);
        assert_eq!(off("ttft_p99_s"), [false, true]);
        assert_eq!(off("latency_mean_s"), [false, true]);
        let svg = comparison(&w).unwrap().into_iter().find(|f| f.stem.ends_with("_hit_rate")).unwrap().svg;
        assert!(!svg.contains("overloaded"), "a hit-rate bar is hatched");
    }

    /// The CDF's axis comes from the contenders: an overloaded run's 600 s tail is clipped.
    #[test]
    fn the_cdf_axis_fits_the_contenders() {
        let mut w = result(CLUSTER, &[("random", 2.0, 0.0), ("round_robin", 3.0, 0.0), ("lpm", 600.0, 1.0)]);
        for (r, top) in w.results.iter_mut().zip([2.0, 3.0, 600.0]) {
            let q = (0..=100).map(|i| 0.5 + (top - 0.5) * i as f64 / 100.0).collect();
            r.detail = Some(Box::new(Detail { latency_quantiles: q, finished_share: 1.0, ..Detail::default() }));
        }
        let svg = cdf(&w).unwrap().unwrap().svg;
        let labels: Vec<f64> = svg.split("</text>").filter_map(|t| t.rsplit('>').next()?.trim().parse().ok()).collect();
        assert!(labels.iter().all(|&v| v <= 3.5), "{labels:?}");
        assert!(svg.contains("lpm (overloaded: off the axes)"));
    }

    #[test]
    fn overloaded_runs_and_values_far_beyond_the_others_are_off_the_scale() {
        let w = result(CLUSTER, &[("random", 2.0, 0.0), ("round_robin", 3.0, 1.0), ("least_work_left", 1e4, 0.0)]);
        let off: Vec<bool> = bars_of(&w, "latency_mean_s").iter().map(|b| b.off_scale).collect();
        assert_eq!(off, [false, true, true]);
    }
}
