//! `--plot DIR`: SVG charts (plotters' SVG backend; no fonts needed). A comparison draws one bar
//! chart per headline metric; a sweep draws the headline metric against the swept value, a line
//! per policy.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use plotters::prelude::*;

use super::{COLUMNS, RATIO_KEYS};
use crate::runner::WorkloadResult;

/// Metrics drawn as bars for a comparison, when present.
const BAR_KEYS: &[&str] = &[
    "response_mean",
    "response_p99",
    "max_load",
    "latency_mean_s",
    "latency_p99_s",
    "hit_rate",
    "replication_factor",
    "test_accuracy",
];

fn header(key: &str) -> &str {
    COLUMNS.iter().find(|c| c.key == key).map_or(key, |c| c.header)
}

fn file_name(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect()
}

/// Bar charts of one comparison; returns the files written.
pub fn comparison(dir: &Path, w: &WorkloadResult) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let ok: Vec<_> = w.results.iter().filter(|r| r.error.is_none()).collect();
    let mut files = Vec::new();
    for key in BAR_KEYS {
        let values: Vec<(String, f64)> =
            ok.iter().filter_map(|r| r.metrics.get(key).map(|v| (r.policy.clone(), v))).collect();
        if values.is_empty() {
            continue;
        }
        let path = dir.join(format!("{}_{}.svg", file_name(&w.name), key));
        bars(&path, &format!("{} — {}", w.name, header(key)), &values)
            .with_context(|| format!("drawing {}", path.display()))?;
        files.push(path);
    }
    Ok(files)
}

fn bars(path: &Path, title: &str, values: &[(String, f64)]) -> Result<()> {
    let root = SVGBackend::new(path, (160 + 110 * values.len() as u32, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let max = values.iter().map(|v| v.1).filter(|v| v.is_finite()).fold(0.0, f64::max).max(1e-12) * 1.15;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..values.len() as f64, 0f64..max)?;
    let names: Vec<String> = values.iter().map(|v| v.0.clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(values.len() * 2 + 1)
        .x_label_formatter(&|x| {
            let i = x.floor() as usize;
            if (x - i as f64 - 0.5).abs() < 0.26 { names.get(i).cloned().unwrap_or_default() } else { String::new() }
        })
        .draw()?;
    chart.draw_series(values.iter().enumerate().map(|(i, (_, v))| {
        Rectangle::new([(i as f64 + 0.15, 0.0), (i as f64 + 0.85, *v)], Palette99::pick(i).filled())
    }))?;
    root.present()?;
    Ok(())
}

/// One line per policy of the headline metric against the swept value; returns the file.
pub fn sweep(dir: &Path, name: &str, field: &str, points: &[(f64, WorkloadResult)]) -> Result<Option<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let Some(first) = points.first() else { return Ok(None) };
    let Some(key) = RATIO_KEYS.iter().find(|k| first.1.results.iter().any(|r| r.metrics.get(k).is_some())) else {
        return Ok(None);
    };
    let path = dir.join(format!("{}_sweep_{}_{}.svg", file_name(name), file_name(field), key));
    let policies: Vec<String> = first.1.results.iter().map(|r| r.policy.clone()).collect();
    let series: Vec<Vec<(f64, f64)>> = policies
        .iter()
        .map(|p| {
            points
                .iter()
                .filter_map(|(x, w)| {
                    let r = w.results.iter().find(|r| &r.policy == p)?;
                    let overloaded = r.metrics.get("overloaded").is_some_and(|o| o > 0.0);
                    r.metrics.get(key).filter(|v| v.is_finite() && !overloaded).map(|v| (*x, v))
                })
                .collect()
        })
        .collect();
    let xs = points.iter().map(|p| p.0);
    let (xmin, xmax) = xs.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
    let ymax = series.iter().flatten().map(|p| p.1).fold(0.0, f64::max).max(1e-12) * 1.1;
    let root = SVGBackend::new(&path, (800, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("{name}: {} vs {field}", header(key)), ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(xmin..xmax.max(xmin + 1e-9), 0f64..ymax)?;
    chart.configure_mesh().x_desc(field).y_desc(header(key)).draw()?;
    for (i, (p, pts)) in policies.iter().zip(&series).enumerate() {
        let color = Palette99::pick(i);
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
            .label(p.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], Palette99::pick(i).stroke_width(2)));
        chart.draw_series(pts.iter().map(|&(x, y)| Circle::new((x, y), 3, Palette99::pick(i).filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    drop(chart);
    drop(root);
    Ok(Some(path))
}
