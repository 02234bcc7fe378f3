//! Sketched summaries (`cluster.summary: sketch`) against exact ones on shipped workloads: every
//! percentile within the sketch's stated bound, every other figure the same, no records kept.

use super::class_tests::{classes_preset, run, run_with};
use super::tests::preset;
use super::*;
use crate::sketch::{RELATIVE_ERROR, UNIT};
use crate::workload::cluster::Summary;

/// Whether a figure is read from a distribution (a percentile), not a count, sum or mean.
fn is_percentile(key: &str) -> bool {
    ["_p50", "_p90", "_p99"].iter().any(|p| key.contains(p))
}

/// `sketched` within the bound of `exact` (NaN for both when there was nothing to read).
fn within(exact: f64, sketched: f64) -> bool {
    (exact.is_nan() && sketched.is_nan())
        || (sketched >= exact - UNIT && sketched <= exact * (1.0 + RELATIVE_ERROR) + UNIT)
}

/// Runs `spec` both ways and checks every figure; returns how many percentiles moved at all.
fn agree(spec: &ClusterSpec, router: &str, admission: Option<&str>) -> usize {
    let (mut e, mut s) = (spec.clone(), spec.clone());
    e.summary = Summary::Exact;
    s.summary = Summary::Sketch;
    let (exact, sketched) = (run(&e, router, admission, 3), run(&s, router, admission, 3));
    assert!(sketched.records.is_empty() && exact.records.len() == spec.requests.unwrap() as usize);
    let keys: Vec<&str> = exact.metrics.keys().collect();
    assert_eq!(keys, sketched.metrics.keys().collect::<Vec<_>>(), "the same keys in the same order");
    let mut moved = 0;
    for key in keys {
        let (x, y) = (exact.metrics.get(key).unwrap(), sketched.metrics.get(key).unwrap());
        if is_percentile(key) {
            assert!(within(x, y), "{router} {key}: exact {x}, sketched {y}");
            moved += (x != y) as usize;
        } else {
            let same = x == y || (x.is_nan() && y.is_nan()) || (x - y).abs() <= 1e-12 * x.abs();
            assert!(same, "{router} {key}: exact {x}, sketched {y}");
        }
    }
    // The chart's CDF too, against the exact records' quantiles.
    let cdf = sketched.detail.expect("a sketched run carries its CDF").latency_quantiles;
    let mut latency: Vec<f64> = exact
        .records
        .iter()
        .filter(|r| r.completed_at_s.is_finite())
        .map(|r| r.completed_at_s - r.arrived_at_s)
        .collect();
    let want = crate::metrics::quantile_vector(&mut latency, crate::metrics::CDF_POINTS);
    assert_eq!(cdf.len(), want.len());
    assert!(want.iter().zip(&cdf).all(|(&x, &y)| within(x, y)), "CDF out of bound");
    moved
}

#[test]
fn sketched_figures_agree_with_exact_within_the_bound() {
    let mut spec = preset("long_doc_qa");
    spec.requests = Some(3000);
    let moved = agree(&spec, "least_work_left", None);
    // Latencies are far above 2048 ns: the sketch's buckets are coarser than one nanosecond, so
    // it really approximates (a sketch that kept every value would move none).
    assert!(moved > 0, "no percentile moved");
    agree(&spec, "preble", None);
}

/// Per-class and per-tenant figures and admission's, with requests shed and held.
#[test]
fn sketched_class_tenant_and_admission_figures_agree() {
    let mut spec = classes_preset();
    spec.admission = "gie_saturation".into();
    agree(&spec, "least_requests", Some("gie_saturation"));
}

#[test]
fn auto_keeps_records_up_to_the_threshold() {
    use crate::workload::cluster::EXACT_UP_TO;
    assert!(Summary::Auto.exact(EXACT_UP_TO) && !Summary::Auto.exact(EXACT_UP_TO + 1));
    assert!(Summary::Exact.exact(usize::MAX) && !Summary::Sketch.exact(1));
}

/// A sketched run drops each request's state once it and every earlier one have ended: by the
/// end it holds a few of the requests it ran, and every figure is what a sketched run that keeps
/// them all gives (the records reach the summary in the same order).
#[test]
fn retiring_ended_requests_changes_no_figure() {
    let mut spec = classes_preset();
    spec.summary = Summary::Sketch;
    let total = spec.requests.unwrap() as usize;
    let admission = Some("gie_saturation");
    let kept = run_with(&spec, "least_requests", admission, 3, |mut sim| {
        sim.retiring = false;
        sim.run().unwrap()
    });
    let retired = run_with(&spec, "least_requests", admission, 3, |mut sim| {
        sim.run_events().unwrap();
        let held = sim.states.len() - sim.states.base();
        assert_eq!(sim.states.len(), total, "every request arrived");
        assert!(held * 20 < total, "{held} of {total} requests still held at the end");
        sim.finish().unwrap()
    });
    assert_eq!(format!("{:?}", kept.metrics), format!("{:?}", retired.metrics));
    assert_eq!(format!("{:?}", kept.detail), format!("{:?}", retired.detail));
}
