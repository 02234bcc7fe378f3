//! Chart drawing, to SVG text (plotters' SVG backend, no fonts needed): bars with 95% error bars,
//! lines with markers and dash patterns, and the scales both use. `--plot` writes the text to
//! files and `--report` puts it inline in the page, so the two always show the same pictures.
//!
//! Scales: an axis is logarithmic when its positive values span more than [`LOG_SPAN`]×. A bar or
//! point marked off-scale (an overloaded run: its latency depends on when the run stopped) does
//! not set the axis: it is drawn hatched up to the axis top with its value written on it, so one
//! overloaded policy no longer flattens the others. Values are mapped to the axis by hand
//! (log10 or identity) so linear and log charts share one coordinate type and tick code. Heat
//! maps are in [`super::heatmap`].

use anyhow::{Result, anyhow};
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// Above this ratio of largest to smallest positive value, an axis is logarithmic.
pub const LOG_SPAN: f64 = 30.0;

/// One bar: a policy's mean, the half-width of its 95% interval (NaN without one), and whether
/// it is off the scale (drawn hatched to the top of the axis, its value written on it).
#[derive(Clone, Debug)]
pub struct Bar {
    pub label: String,
    pub value: f64,
    pub ci95: f64,
    pub off_scale: bool,
}

/// A point of a line: `ci95` is the half-width of its 95% interval (NaN without one); an
/// off-scale point is drawn as an open triangle at the top edge and breaks its line.
#[derive(Clone, Copy, Debug)]
pub struct Point {
    pub x: f64,
    pub y: f64,
    pub ci95: f64,
    pub off_scale: bool,
}

impl Point {
    /// A plain point: no interval, on the scale.
    pub fn at(x: f64, y: f64) -> Self {
        Self { x, y, ci95: f64::NAN, off_scale: false }
    }
}

/// One line of a line chart, drawn with the series' colour, marker and dash pattern.
#[derive(Clone, Debug)]
pub struct Series {
    pub label: String,
    pub points: Vec<Point>,
    /// Drawn apart: an overloaded run's line is drawn, but the axes are fitted to the other
    /// series, so it runs off the plot where it leaves them (clipped at the edge) instead of
    /// squashing the contenders; its legend entry says so.
    pub apart: bool,
}

impl Series {
    /// A series of plain points.
    pub fn new(label: impl Into<String>, points: impl IntoIterator<Item = (f64, f64)>) -> Self {
        Self { label: label.into(), points: points.into_iter().map(|(x, y)| Point::at(x, y)).collect(), apart: false }
    }
}

/// A horizontal reference line (an SLO's bound), dashed black, named in the legend.
#[derive(Clone, Copy, Debug)]
pub struct Reference<'a> {
    pub y: f64,
    pub label: &'a str,
}

/// What a line chart shows. `y_range` fixes the y axis (e.g. 0..1 for a fraction); otherwise it
/// is fitted to the on-scale points. Every `marker_every`-th point gets a marker (0: none, for
/// dense curves); `legend: false` leaves the legend out (many series named by their colour).
#[derive(Clone, Debug)]
pub struct LineChart<'a> {
    pub title: &'a str,
    pub x_desc: &'a str,
    pub y_desc: &'a str,
    pub series: &'a [Series],
    pub y_range: Option<(f64, f64)>,
    pub marker_every: usize,
    pub legend: bool,
    /// A time axis: linear, exactly the span of the points, even when they span more than
    /// [`LOG_SPAN`]×.
    pub linear_x: bool,
    /// Chart size in pixels.
    pub size: (u32, u32),
    /// What an off-scale point (an open triangle on the top edge) means, for the note under the
    /// chart.
    pub off_scale_means: &'a str,
    /// A horizontal line across the chart; the fitted y axis includes it.
    pub reference: Option<Reference<'a>>,
    /// Where the legend goes.
    pub legend_at: SeriesLabelPosition,
}

/// What an off-scale point means unless a chart says otherwise.
pub const OVERLOADED: &str = "overloaded (off scale)";

/// A line chart of `series` against x, with markers and dash patterns so that coinciding lines
/// stay visible: the function the report's sweeps and `routelab capacity` draw with.
pub fn line_chart(title: &str, x_desc: &str, y_desc: &str, series: &[Series]) -> Result<String> {
    lines(&LineChart {
        title,
        x_desc,
        y_desc,
        series,
        y_range: None,
        marker_every: 1,
        legend: true,
        linear_x: false,
        size: (820, 480),
        off_scale_means: OVERLOADED,
        reference: None,
        legend_at: SeriesLabelPosition::UpperLeft,
    })
}

pub(super) fn err(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow!("drawing a chart: {e}")
}

/// The colour of series or bar `i`.
pub fn colour(i: usize) -> RGBColor {
    // Mostly Okabe–Ito colours (distinguishable with colour-blindness), chosen so that no two of
    // the eight are alike (Okabe–Ito's blue and sky blue were two near-identical lines among six
    // replicas; its yellow vanishes on white): navy and dark red take their places. Past eight,
    // plotters' palette.
    const PALETTE: [RGBColor; 8] = [
        RGBColor(230, 159, 0),
        RGBColor(86, 180, 233),
        RGBColor(0, 158, 115),
        RGBColor(153, 0, 0),
        RGBColor(31, 56, 128),
        RGBColor(204, 121, 167),
        RGBColor(0, 0, 0),
        RGBColor(128, 128, 128),
    ];
    PALETTE.get(i).copied().unwrap_or_else(|| {
        let c = Palette99::pick(i).to_rgba();
        RGBColor(c.0, c.1, c.2)
    })
}

/// Dash pattern of series `i` as (dash, gap) pixels; the first is solid (a dash longer than
/// any line).
fn dash(i: usize) -> (u32, u32) {
    [(100_000, 1), (9, 5), (2, 4), (14, 4), (5, 3)][i % 5]
}

/// Series `i`'s marker as a pixel path around (0, 0): an open shape, so coinciding markers of
/// different series stay visible through each other.
fn marker(i: usize) -> Vec<(i32, i32)> {
    let s = 5;
    match i % 6 {
        0 => (0..=12)
            .map(|k| {
                let a = k as f64 * std::f64::consts::PI / 6.0;
                ((a.cos() * 5.0).round() as i32, (a.sin() * 5.0).round() as i32)
            })
            .collect(),
        1 => vec![(0, -s - 1), (s + 1, s), (-s - 1, s), (0, -s - 1)],
        2 => vec![(-s, -s), (s, -s), (s, s), (-s, s), (-s, -s)],
        3 => vec![(0, -s - 2), (s + 1, 0), (0, s + 2), (-s - 1, 0), (0, -s - 2)],
        4 => vec![(-s, -s), (s, s), (0, 0), (s, -s), (-s, s)],
        _ => vec![(-s - 1, 0), (s + 1, 0), (0, 0), (0, -s - 1), (0, s + 1)],
    }
}

/// 45° hatching lines filling the pixel rectangle (x0, y0)–(x1, y1), 9 pixels apart.
fn hatching(x0: i32, y0: i32, x1: i32, y1: i32) -> Vec<Vec<(i32, i32)>> {
    let h = (y1 - y0).max(1);
    let mut out = Vec::new();
    let mut k = x0 - h;
    while k < x1 {
        // The line (k + t·h, y1 − t·h), t in 0..1, clipped to x0..x1.
        let t0 = (((x0 - k) as f64) / h as f64).max(0.0);
        let t1 = (((x1 - k) as f64) / h as f64).min(1.0);
        if t0 < t1 {
            let at = |t: f64| (k + (t * h as f64) as i32, y1 - (t * h as f64) as i32);
            out.push(vec![at(t0), at(t1)]);
        }
        k += 9;
    }
    out
}

/// Bars with 95% error bars; off-scale bars hatched to the axis top with their value written.
pub fn bars(title: &str, y_desc: &str, bars: &[Bar]) -> Result<String> {
    let on: Vec<&Bar> = bars.iter().filter(|b| !b.off_scale && b.value.is_finite()).collect();
    let fitted = if on.is_empty() { bars.iter().collect::<Vec<_>>() } else { on };
    let extents = fitted.iter().filter(|b| b.ci95.is_finite()).flat_map(|b| [b.value + b.ci95, b.value - b.ci95]);
    let scale = Scale::fit_with(fitted.iter().map(|b| b.value), extents, true, true);
    let width = (150 + 120 * bars.len() as u32).max(520);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (width, 440)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let n = bars.len().max(1) as f64;
        let names: Vec<String> = bars.iter().map(|b| b.label.clone()).collect();
        let x = Ticked { lo: 0.0, hi: n, ticks: (0..bars.len()).map(|i| i as f64 + 0.5).collect() };
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 17))
            .margin(14)
            .x_label_area_size(36)
            .y_label_area_size(72)
            .build_cartesian_2d(x, scale.coord())
            .map_err(err)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_label_formatter(&|x| names.get(x.floor() as usize).cloned().unwrap_or_default())
            .y_label_formatter(&|y| scale.label(*y))
            .y_desc(if scale.log { format!("{y_desc} (log scale)") } else { y_desc.to_string() })
            .label_style(("sans-serif", 13))
            .draw()
            .map_err(err)?;
        let base = if scale.log { scale.lo } else { scale.clamped(0.0) };
        for (i, b) in bars.iter().enumerate() {
            let (x0, x1) = (i as f64 + 0.18, i as f64 + 0.82);
            let top = scale.clamped(b.value);
            let c = colour(i);
            if b.off_scale || !b.value.is_finite() {
                chart.draw_series([Rectangle::new([(x0, base), (x1, top)], c.mix(0.25).filled())]).map_err(err)?;
                // Hatched, so it reads as "not to scale" even in black and white.
                let (px0, py0) = chart.backend_coord(&(x0, top));
                let (px1, py1) = chart.backend_coord(&(x1, base));
                let lines = hatching(px0, py0, px1, py1);
                root.draw(&Rectangle::new([(px0, py0), (px1, py1)], c.stroke_width(1))).map_err(err)?;
                for l in lines {
                    root.draw(&PathElement::new(l, c.stroke_width(1))).map_err(err)?;
                }
                let note =
                    if b.value.is_finite() { format!("{} overloaded", short(b.value)) } else { "no value".into() };
                let (tx, ty) = chart.backend_coord(&(i as f64 + 0.5, top));
                let font = ("sans-serif", 13).into_font().color(&BLACK).pos(Pos::new(HPos::Center, VPos::Top));
                root.draw(&Text::new(note, (tx, ty.max(py0) + 6), font)).map_err(err)?;
                continue;
            }
            chart.draw_series([Rectangle::new([(x0, base), (x1, top)], c.filled())]).map_err(err)?;
            if b.ci95.is_finite() && b.ci95 > 0.0 {
                let (lo, hi) = (scale.clamped(b.value - b.ci95), scale.clamped(b.value + b.ci95));
                let xm = i as f64 + 0.5;
                let style = BLACK.stroke_width(2);
                chart
                    .draw_series([
                        PathElement::new(vec![(xm, lo), (xm, hi)], style),
                        PathElement::new(vec![(xm - 0.1, lo), (xm + 0.1, lo)], style),
                        PathElement::new(vec![(xm - 0.1, hi), (xm + 0.1, hi)], style),
                    ])
                    .map_err(err)?;
            }
        }
        root.present().map_err(err)?;
    }
    Ok(svg)
}

/// The parts of the polyline `run` inside the box `lo..=hi` (axis coordinates), each a polyline
/// of its own: a segment that leaves the box ends at its edge (Liang–Barsky clipping).
fn clip(run: &[(f64, f64)], lo: (f64, f64), hi: (f64, f64)) -> Vec<Vec<(f64, f64)>> {
    let inside = |p: (f64, f64)| (lo.0..=hi.0).contains(&p.0) && (lo.1..=hi.1).contains(&p.1);
    let mut out: Vec<Vec<(f64, f64)>> = Vec::new();
    let mut open = false;
    if let [only] = run {
        if inside(*only) {
            out.push(vec![*only]);
        }
        return out;
    }
    for w in run.windows(2) {
        let (a, b) = (w[0], w[1]);
        let (dx, dy) = (b.0 - a.0, b.1 - a.1);
        let (mut t0, mut t1) = (0.0f64, 1.0f64);
        let mut keep = true;
        for (p, q) in [(-dx, a.0 - lo.0), (dx, hi.0 - a.0), (-dy, a.1 - lo.1), (dy, hi.1 - a.1)] {
            if p == 0.0 {
                keep &= q >= 0.0;
            } else if p < 0.0 {
                t0 = t0.max(q / p);
            } else {
                t1 = t1.min(q / p);
            }
        }
        if !keep || t0 > t1 {
            open = false;
            continue;
        }
        let at = |t: f64| (a.0 + t * dx, a.1 + t * dy);
        if !open || t0 > 0.0 {
            out.push(vec![at(t0)]);
        }
        out.last_mut().expect("a part").push(at(t1));
        open = t1 >= 1.0;
    }
    out
}

/// A line chart: a colour, marker and dash pattern per series, 95% intervals as whiskers,
/// off-scale points as open triangles on the top edge (the line breaks there), series drawn
/// apart clipped at the plot's edge, an optional reference line, a legend.
pub fn lines(c: &LineChart) -> Result<String> {
    // The axes fit the series not drawn apart (all of them if every one is).
    let fitted = |s: &&Series| !s.apart || c.series.iter().all(|s| s.apart || s.points.is_empty());
    let on =
        || c.series.iter().filter(fitted).flat_map(|s| s.points.iter().filter(|p| !p.off_scale && p.y.is_finite()));
    let all_x = || c.series.iter().filter(fitted).flat_map(|s| s.points.iter().map(|p| p.x)).filter(|x| x.is_finite());
    let xs = if c.linear_x {
        // A time axis: exactly the span of the samples.
        let (lo, hi) = all_x().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| (a.min(x), b.max(x)));
        if lo < hi { Scale::fixed(lo, hi) } else { Scale::fit_as(all_x(), false, false) }
    } else {
        Scale::fit(all_x(), false)
    };
    let reference = c.reference.map(|r| r.y).filter(|y| y.is_finite());
    let ys = match c.y_range {
        Some((lo, hi)) => Scale::fixed(lo, hi),
        None => Scale::fit_with(
            on().map(|p| p.y).chain(reference),
            on().filter(|p| p.ci95.is_finite()).flat_map(|p| [p.y + p.ci95, p.y - p.ci95]),
            false,
            true,
        ),
    };
    let any_off = c.series.iter().any(|s| s.points.iter().any(|p| p.off_scale));
    let any_apart = c.series.iter().any(|s| s.apart && !s.points.is_empty());
    let (lo, hi) = ((xs.lo, ys.lo), (xs.hi, ys.hi));
    let notes: Vec<String> = [
        any_off.then(|| format!("△ on the top edge: {}", c.off_scale_means)),
        any_apart.then(|| "overloaded runs are clipped at the edge: the axes fit the others".to_string()),
    ]
    .into_iter()
    .flatten()
    .collect();
    let mut svg = String::new();
    {
        // Notes get a strip of their own under the chart.
        let (w, h) = c.size;
        let root = SVGBackend::with_string(&mut svg, (w, h + 18 * notes.len() as u32)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let (plot, foot) = root.split_vertically(h);
        let mut chart = ChartBuilder::on(&plot)
            .caption(c.title, ("sans-serif", 17))
            .margin(14)
            .x_label_area_size(44)
            .y_label_area_size(72)
            .build_cartesian_2d(xs.coord(), ys.coord())
            .map_err(err)?;
        let log_note = |desc: &str, s: &Scale| if s.log { format!("{desc} (log scale)") } else { desc.to_string() };
        chart
            .configure_mesh()
            .x_label_formatter(&|x| xs.label(*x))
            .y_label_formatter(&|y| ys.label(*y))
            .x_desc(log_note(c.x_desc, &xs))
            .y_desc(log_note(c.y_desc, &ys))
            .label_style(("sans-serif", 13))
            .light_line_style(WHITE)
            .bold_line_style(BLACK.mix(0.12))
            .draw()
            .map_err(err)?;
        if let Some(r) = c.reference.filter(|r| r.y.is_finite()) {
            let y = ys.clamped(r.y);
            chart
                .draw_series(DashedLineSeries::new([(xs.lo, y), (xs.hi, y)], 8, 6, BLACK.stroke_width(1)))
                .map_err(err)?
                .label(r.label)
                .legend(|at| {
                    EmptyElement::at(at) + DashedPathElement::new(vec![(0, 0), (24, 0)], 8, 6, BLACK.stroke_width(1))
                });
        }
        for (i, s) in c.series.iter().enumerate() {
            let col = colour(i);
            let style = col.stroke_width(2);
            // Runs of consecutive on-scale points are one line each, clipped to the plot.
            let mut runs: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
            for p in &s.points {
                if p.off_scale || !p.y.is_finite() || !(xs.at(p.x).is_finite() && ys.at(p.y).is_finite()) {
                    runs.push(Vec::new());
                } else {
                    runs.last_mut().expect("one run").push((xs.at(p.x), ys.at(p.y)));
                }
            }
            let label = if s.apart { format!("{} (overloaded: off the axes)", s.label) } else { s.label.clone() };
            let (d, g) = dash(i);
            for part in runs.iter().flat_map(|r| clip(r, lo, hi)) {
                chart.draw_series(DashedLineSeries::new(part, d, g, style)).map_err(err)?;
            }
            // In the legend even when nothing of it is inside the plot.
            if !s.points.is_empty() {
                let shape: Vec<(i32, i32)> = if c.marker_every > 0 {
                    marker(i).into_iter().map(|(x, y)| (x + 12, y)).collect()
                } else {
                    Vec::new()
                };
                chart
                    .draw_series(std::iter::empty::<EmptyElement<(f64, f64), SVGBackend>>())
                    .map_err(err)?
                    .label(label)
                    .legend(move |at| {
                        let st = colour(i).stroke_width(2);
                        EmptyElement::at(at)
                            + DashedPathElement::new(vec![(0, 0), (24, 0)], d, g, st)
                            + PathElement::new(shape.clone(), st)
                    });
            }
            for (k, p) in s.points.iter().enumerate() {
                let (px, ok) = (xs.at(p.x), p.y.is_finite() && !p.off_scale);
                if !px.is_finite() || !(xs.lo..=xs.hi).contains(&px) {
                    continue;
                }
                if !ok {
                    let tri = vec![(0, -2), (6, 8), (-6, 8), (0, -2)];
                    chart
                        .draw_series([EmptyElement::at((px, ys.hi)) + PathElement::new(tri, col.stroke_width(2))])
                        .map_err(err)?;
                    continue;
                }
                let py = ys.at(p.y);
                if !(ys.lo..=ys.hi).contains(&py) {
                    continue;
                }
                if c.marker_every > 0 && k % c.marker_every == 0 {
                    chart
                        .draw_series([EmptyElement::at((px, py)) + PathElement::new(marker(i), style)])
                        .map_err(err)?;
                }
                if p.ci95.is_finite() && p.ci95 > 0.0 {
                    let (lo, hi) = (ys.clamped(p.y - p.ci95), ys.clamped(p.y + p.ci95));
                    chart
                        .draw_series([PathElement::new(vec![(px, lo), (px, hi)], col.mix(0.6).stroke_width(1))])
                        .map_err(err)?;
                }
            }
        }
        if c.legend && (reference.is_some() || c.series.iter().any(|s| !s.points.is_empty())) {
            chart
                .configure_series_labels()
                .position(c.legend_at.clone())
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK.mix(0.4))
                .label_font(("sans-serif", 13))
                .draw()
                .map_err(err)?;
        }
        for (k, note) in notes.iter().enumerate() {
            let font = ("sans-serif", 12).into_font().color(&BLACK).pos(Pos::new(HPos::Right, VPos::Top));
            foot.draw(&Text::new(note.as_str(), (w as i32 - 14, 18 * k as i32), font)).map_err(err)?;
        }
        root.present().map_err(err)?;
    }
    Ok(svg)
}

mod scale;
#[cfg(test)]
mod tests;

pub use scale::short;
pub(in crate::report) use scale::{Scale, Ticked};
