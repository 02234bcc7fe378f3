use super::*;

fn bar(label: &str, value: f64, off_scale: bool) -> Bar {
    Bar { label: label.into(), value, ci95: f64::NAN, off_scale }
}

/// The tick labels of an SVG chart's axes (plotters writes each text on its own line).
fn texts(svg: &str) -> Vec<String> {
    svg.split("</text>").filter_map(|t| t.rsplit('>').next()).map(|t| t.trim().to_string()).collect()
}

#[test]
fn an_overloaded_bar_is_hatched_with_its_value_and_does_not_set_the_axis() {
    let svg = bars("t", "y", &[bar("a", 1.0, false), bar("b", 2.0, false), bar("c", 900.0, true)]).unwrap();
    let t = texts(&svg);
    assert!(t.contains(&"900 overloaded".to_string()), "{t:?}");
    // The axis ends near 2, not 900: its largest tick is 2.
    let ticks: Vec<f64> = t.iter().filter_map(|s| s.parse().ok()).collect();
    assert_eq!(ticks.iter().copied().fold(0.0, f64::max), 2.0, "{ticks:?}");
    assert!(!svg.contains("log scale"));
}

#[test]
fn axes_turn_logarithmic_past_30x_and_not_below() {
    let log = bars("t", "y", &[bar("a", 1.0, false), bar("b", 31.0, false)]).unwrap();
    assert!(log.contains("y (log scale)"));
    let linear = bars("t", "y", &[bar("a", 1.0, false), bar("b", 29.0, false)]).unwrap();
    assert!(!linear.contains("log scale"));
    // Log ticks are round values (1, 2, 5, 10, 20), not powers like 10^0.5.
    let ticks: Vec<f64> = texts(&log).iter().filter_map(|s| s.parse().ok()).collect();
    assert!(ticks.contains(&10.0) && ticks.contains(&2.0), "{ticks:?}");
}

#[test]
fn error_bars_are_drawn_only_where_there_is_an_interval() {
    let count = |ci: f64| {
        let b = Bar { label: "a".into(), value: 5.0, ci95: ci, off_scale: false };
        // Error bars are the only black lines 2 pixels wide.
        bars("t", "y", &[b]).unwrap().matches("stroke=\"#000000\" stroke-width=\"2\"").count()
    };
    // Stem and two caps.
    assert_eq!((count(1.0), count(f64::NAN)), (3, 0));
}

#[test]
fn series_differ_in_marker_and_dash_and_off_scale_points_break_the_line() {
    assert!((0..5).all(|i| (0..5).all(|j| i == j || (dash(i), marker(i)) != (dash(j), marker(j)))));
    let s = Series {
        label: "p".into(),
        points: vec![Point::at(1.0, 1.0), Point::at(2.0, 2.0), Point { off_scale: true, ..Point::at(3.0, 99.0) }],
        apart: false,
    };
    let svg = line_chart("t", "x", "y", &[s]).unwrap();
    assert!(svg.contains("overloaded (off scale)"));
    let ticks: Vec<f64> = texts(&svg).iter().filter_map(|s| s.parse().ok()).collect();
    assert!(ticks.iter().all(|&t| t < 10.0), "the off-scale point set the axis: {ticks:?}");
}

/// The x (or y) coordinates of every polyline point of an SVG, in pixels.
fn polyline_points(svg: &str) -> Vec<(f64, f64)> {
    svg.split("<polyline")
        .skip(1)
        .filter_map(|p| p.split("points=\"").nth(1)?.split('"').next())
        .flat_map(|pts| {
            pts.split_whitespace().filter_map(|xy| {
                let (x, y) = xy.split_once(',')?;
                Some((x.parse().ok()?, y.parse().ok()?))
            })
        })
        .collect()
}

#[test]
fn clipping_keeps_the_parts_inside_and_ends_them_at_the_edge() {
    let (lo, hi) = ((0.0, 0.0), (10.0, 10.0));
    assert_eq!(clip(&[(1.0, 1.0), (2.0, 2.0), (3.0, 1.0)], lo, hi), vec![vec![(1.0, 1.0), (2.0, 2.0), (3.0, 1.0)]]);
    // Leaves through the right edge at y = 5 and comes back: two parts.
    assert_eq!(
        clip(&[(8.0, 5.0), (12.0, 5.0), (9.0, 1.0)], lo, hi),
        vec![vec![(8.0, 5.0), (10.0, 5.0)], vec![(10.0, 5.0 - 4.0 * 2.0 / 3.0), (9.0, 1.0)]]
    );
    assert!(clip(&[(11.0, 1.0), (12.0, 2.0)], lo, hi).is_empty());
}

/// An overloaded series drawn apart does not set the axes: the contenders' 1..2 s fill the
/// plot and the overloaded line stops at its right edge.
#[test]
fn a_series_drawn_apart_is_clipped_and_does_not_set_the_axes() {
    let contender = Series::new("a", [(1.0, 0.1), (1.5, 0.5), (2.0, 1.0)]);
    let overloaded = Series { apart: true, ..Series::new("b", [(1.0, 0.1), (60.0, 0.5), (600.0, 1.0)]) };
    let cdf = |series: &[Series]| {
        lines(&LineChart {
            title: "t",
            x_desc: "x",
            y_desc: "y",
            series,
            y_range: Some((0.0, 1.0)),
            marker_every: 0,
            legend: true,
            linear_x: false,
            size: (820, 460),
            off_scale_means: OVERLOADED,
            reference: None,
            legend_at: SeriesLabelPosition::UpperLeft,
        })
        .unwrap()
    };
    let alone = cdf(std::slice::from_ref(&contender));
    let both = cdf(&[contender.clone(), overloaded]);
    let ticks = |svg: &str| texts(svg).iter().filter_map(|s| s.parse::<f64>().ok()).collect::<Vec<_>>();
    assert_eq!(ticks(&alone), ticks(&both), "the overloaded series moved the axes");
    assert!(!both.contains("log scale") && !texts(&both).iter().any(|t| t == "600"));
    assert!(both.contains("b (overloaded: off the axes)") && both.contains("overloaded runs are clipped"));
    // Nothing is drawn right of the plot (the contender's last point is its right edge, give
    // or take the axis padding).
    let right = polyline_points(&alone).iter().map(|p| p.0).fold(0.0, f64::max);
    assert!(polyline_points(&both).iter().all(|p| p.0 <= right + 0.5), "drawn past the plot");
}

#[test]
fn a_reference_line_is_drawn_named_and_inside_the_axis() {
    let s = [Series::new("a", [(1.0, 1.0), (2.0, 2.0)])];
    let svg = lines(&LineChart {
        reference: Some(Reference { y: 5.0, label: "bound: p99 < 5" }),
        ..LineChart {
            title: "t",
            x_desc: "x",
            y_desc: "y",
            series: &s,
            y_range: None,
            marker_every: 1,
            legend: true,
            linear_x: false,
            size: (820, 480),
            off_scale_means: OVERLOADED,
            reference: None,
            legend_at: SeriesLabelPosition::UpperLeft,
        }
    })
    .unwrap();
    assert!(svg.contains("bound: p99 &lt; 5") || svg.contains("bound: p99 < 5"), "{svg}");
    let ticks: Vec<f64> = texts(&svg).iter().filter_map(|s| s.parse().ok()).collect();
    assert!(ticks.iter().any(|&t| t >= 5.0), "the axis stops below the bound: {ticks:?}");
}

/// CIE L*a*b* of an sRGB colour (D65).
fn lab(c: RGBColor) -> [f64; 3] {
    let lin = |u: u8| {
        let u = u as f64 / 255.0;
        if u > 0.04045 { ((u + 0.055) / 1.055).powf(2.4) } else { u / 12.92 }
    };
    let (r, g, b) = (lin(c.0), lin(c.1), lin(c.2));
    let x = (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047;
    let y = 0.2126 * r + 0.7152 * g + 0.0722 * b;
    let z = (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883;
    let f = |t: f64| if t > 0.008856 { t.cbrt() } else { 7.787 * t + 16.0 / 116.0 };
    [116.0 * f(y) - 16.0, 500.0 * (f(x) - f(y)), 200.0 * (f(y) - f(z))]
}

/// The eight colours lines are told apart by: no two alike (ΔE*76 ≥ 35; Okabe–Ito's blue and
/// sky blue are 26 apart) and none too pale to see on white (L* ≤ 75; its yellow is 89).
#[test]
fn the_first_eight_colours_are_far_apart_and_visible_on_white() {
    let labs: Vec<[f64; 3]> = (0..8).map(|i| lab(colour(i))).collect();
    for (i, a) in labs.iter().enumerate() {
        assert!(a[0] <= 75.0, "colour {i} is too pale: L* {}", a[0]);
        for (j, b) in labs.iter().enumerate().skip(i + 1) {
            let d = ((a[0] - b[0]).powi(2) + (a[1] - b[1]).powi(2) + (a[2] - b[2]).powi(2)).sqrt();
            assert!(d >= 35.0, "colours {i} and {j} are alike: ΔE {d:.0}");
        }
    }
}

#[test]
fn short_numbers() {
    assert_eq!(short(0.5), "0.5");
    assert_eq!(short(1000.0), "1000");
    assert_eq!(short(12.345), "12.35");
    assert_eq!(short(2e-6), "2.0e-6");
}
