//! Heat maps (SVG text): a band per replica over time, darker for more requests in flight — the
//! in-flight chart when there are too many replicas for a line each.

use anyhow::Result;
use plotters::prelude::*;

use super::chart::{Scale, Ticked, err, short};

/// A heat map: row `r` of `cells` is drawn as a band at height `r`, its `k`-th cell spanning
/// `times[k]..times[k + 1]`, darker for larger values (0 white, `top` darkest). For many replicas
/// over time, where one line each would be a tangle: a herded replica is one dark band.
pub fn heatmap(title: &str, x_desc: &str, y_desc: &str, times: &[f64], cells: &[Vec<f64>], top: f64) -> Result<String> {
    let rows = cells.len().max(1);
    let (t0, t1) = (times.first().copied().unwrap_or(0.0), times.last().copied().unwrap_or(1.0));
    let xs = if t0 < t1 { Scale::fixed(t0, t1) } else { Scale::fit_as([t0, t1], false, false) };
    let ys = Ticked { lo: 0.0, hi: rows as f64, ticks: (0..rows).map(|r| r as f64 + 0.5).collect() };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (820, (140 + 16 * rows as u32).min(640))).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let (main, legend) = root.split_horizontally(740);
        let mut chart = ChartBuilder::on(&main)
            .caption(title, ("sans-serif", 15))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(72)
            .build_cartesian_2d(xs.coord(), ys)
            .map_err(err)?;
        let every = rows.div_ceil(16);
        chart
            .configure_mesh()
            .disable_mesh()
            .x_label_formatter(&|x| xs.label(*x))
            .y_label_formatter(&|y| {
                let r = y.floor() as usize;
                if r % every == 0 { r.to_string() } else { String::new() }
            })
            .x_desc(x_desc)
            .y_desc(y_desc)
            .label_style(("sans-serif", 12))
            .draw()
            .map_err(err)?;
        let shade = |v: f64| {
            let f = if top > 0.0 { (v / top).clamp(0.0, 1.0) } else { 0.0 };
            // White → dark blue.
            RGBColor((255.0 * (1.0 - f * 0.95)) as u8, (255.0 * (1.0 - f * 0.8)) as u8, (255.0 * (1.0 - f * 0.4)) as u8)
        };
        for (r, row) in cells.iter().enumerate() {
            // Runs of equal cells are one rectangle (the SVG stays small).
            let mut rects = Vec::new();
            let mut k = 0;
            while k < row.len() {
                let mut end = k + 1;
                while end < row.len() && row[end] == row[k] {
                    end += 1;
                }
                let (a, b) = (times.get(k).copied().unwrap_or(t1), times.get(end).copied().unwrap_or(t1));
                if row[k] > 0.0 {
                    rects.push(Rectangle::new([(a, r as f64), (b.max(a), r as f64 + 1.0)], shade(row[k]).filled()));
                }
                k = end;
            }
            chart.draw_series(rects).map_err(err)?;
        }
        // The colour key: white (0) to darkest (top).
        let steps: i32 = 20;
        for k in 0..steps {
            let v = top * (steps - 1 - k) as f64 / (steps - 1) as f64;
            let y = 40 + k * 10;
            legend.draw(&Rectangle::new([(10, y), (30, y + 10)], shade(v).filled())).map_err(err)?;
        }
        legend.draw(&Rectangle::new([(10, 40), (30, 40 + 10 * steps)], BLACK.mix(0.4))).map_err(err)?;
        let font = ("sans-serif", 12).into_font().color(&BLACK);
        legend.draw(&Text::new(short(top), (34, 38), font.clone())).map_err(err)?;
        legend.draw(&Text::new("0", (34, 30 + 10 * steps), font)).map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}
