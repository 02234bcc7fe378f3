//! The scales charts share: linear or log10 axes fitted to the values ([`super::LOG_SPAN`]), mapped
//! by hand so both kinds use one coordinate type, with ticks where we put them, and tick labels.

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};

use super::LOG_SPAN;

/// How values map to an axis.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(in crate::report) struct Scale {
    pub(in crate::report) log: bool,
    pub(in crate::report) lo: f64,
    pub(in crate::report) hi: f64,
}

impl Scale {
    /// The axis for `values` (the finite ones; positive ones only on a log axis), padded a little.
    /// `from_zero` starts a linear axis at zero (bars).
    pub(super) fn fit(values: impl IntoIterator<Item = f64>, from_zero: bool) -> Self {
        Self::fit_as(values, from_zero, true)
    }

    /// [`Scale::fit`], never logarithmic unless `log_allowed`.
    pub(in crate::report) fn fit_as(values: impl IntoIterator<Item = f64>, from_zero: bool, log_allowed: bool) -> Self {
        Self::fit_with(values, [], from_zero, log_allowed)
    }

    /// The axis for `values`, widened to show `extents` (interval ends) too. Only `values`
    /// decide whether it is logarithmic: a wide interval around a small mean must not turn the
    /// axis log; on a log axis an interval's end may reach a tenth of the smallest value.
    pub(super) fn fit_with(
        values: impl IntoIterator<Item = f64>,
        extents: impl IntoIterator<Item = f64>,
        from_zero: bool,
        log_allowed: bool,
    ) -> Self {
        let vs: Vec<f64> = values.into_iter().filter(|v| v.is_finite()).collect();
        if vs.is_empty() {
            return Self { log: false, lo: 0.0, hi: 1.0 };
        }
        let es: Vec<f64> = extents.into_iter().filter(|v| v.is_finite()).collect();
        let max_v = vs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let min_pos = vs.iter().copied().filter(|v| *v > 0.0).fold(f64::INFINITY, f64::min);
        let min_v = vs.iter().copied().fold(f64::INFINITY, f64::min);
        // Intervals widen the axis by at most half the values' range each way (and not below
        // zero when every value is positive): two seeds' t-interval must not squash the means.
        // A longer whisker runs to the edge.
        let reach = 0.5 * (max_v - min_v.min(0.0)).max(max_v.abs() * 0.1);
        let floor = if min_v >= 0.0 { 0.0 } else { min_v - reach };
        let max = es.iter().copied().fold(max_v, f64::max).min(max_v + reach);
        let min = es.iter().copied().fold(min_v, f64::min).max(floor.max(min_v - reach));
        if log_allowed && min_pos.is_finite() && max_v / min_pos > LOG_SPAN {
            let lo = es.iter().copied().filter(|e| *e > 0.0).fold(min_pos, f64::min).max(min_pos / 10.0);
            return Self { log: true, lo: lo.log10() - 0.08, hi: max.log10() + 0.08 };
        }
        let lo = if from_zero { min.min(0.0) } else { min };
        let pad = ((max - lo) * 0.08).max(max.abs() * 1e-3).max(1e-12);
        let lo = if from_zero || (lo >= 0.0 && lo - pad < 0.0) { lo.min(0.0) } else { lo - pad };
        Self { log: false, lo, hi: max + pad }
    }

    pub(in crate::report) fn fixed(lo: f64, hi: f64) -> Self {
        Self { log: false, lo, hi }
    }

    /// A value's position on the axis (log10 on a log axis; −∞ for non-positive values there).
    pub(super) fn at(&self, v: f64) -> f64 {
        if self.log { v.log10() } else { v }
    }

    /// `v` on the axis, kept inside it.
    pub(super) fn clamped(&self, v: f64) -> f64 {
        let a = self.at(v);
        if a.is_nan() { self.lo } else { a.clamp(self.lo, self.hi) }
    }

    /// Tick positions (on the axis): 1, 2, 5 × 10^k that fall inside it (decades only when a
    /// log axis spans many).
    pub(super) fn ticks(&self) -> Vec<f64> {
        if self.log {
            let decades = self.hi - self.lo;
            let mults: &[f64] = if decades > 4.0 { &[1.0] } else { &[1.0, 2.0, 5.0] };
            let mut out = Vec::new();
            for k in (self.lo.floor() as i32)..=(self.hi.ceil() as i32) {
                for m in mults {
                    let t = (m * 10f64.powi(k)).log10();
                    if (self.lo..=self.hi).contains(&t) {
                        out.push(t);
                    }
                }
            }
            return out;
        }
        let span = (self.hi - self.lo).max(1e-12);
        let raw = span / 6.0;
        let mag = 10f64.powf(raw.log10().floor());
        let step = [1.0, 2.0, 5.0, 10.0].into_iter().map(|m| m * mag).find(|s| span / s <= 7.0).unwrap_or(10.0 * mag);
        let first = (self.lo / step).ceil() as i64;
        let last = (self.hi / step).floor() as i64;
        (first..=last).map(|i| i as f64 * step).collect()
    }

    /// A tick's label: the value it stands for, briefly.
    pub(in crate::report) fn label(&self, t: f64) -> String {
        let v = if self.log { 10f64.powf(t) } else { t };
        short(v)
    }

    pub(in crate::report) fn coord(&self) -> Ticked {
        Ticked { lo: self.lo, hi: self.hi.max(self.lo + 1e-12), ticks: self.ticks() }
    }
}

/// A linear coordinate with ticks where we put them (plotters' own pick 1-2-5 steps in the
/// axis's units, which on a log10 axis would be 10^0.5).
pub(in crate::report) struct Ticked {
    pub(in crate::report) lo: f64,
    pub(in crate::report) hi: f64,
    pub(in crate::report) ticks: Vec<f64>,
}

impl Ranged for Ticked {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let f = (v - self.lo) / (self.hi - self.lo);
        limit.0 + (f * (limit.1 - limit.0) as f64).round() as i32
    }

    fn key_points<H: KeyPointHint>(&self, hint: H) -> Vec<f64> {
        if hint.max_num_points() == 0 { Vec::new() } else { self.ticks.clone() }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.lo..self.hi
    }
}

/// A number as a tick label: at most 4 significant figures, no trailing zeros.
pub fn short(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return if v == 0.0 { "0".into() } else { "–".into() };
    }
    let a = v.abs();
    if !(1e-4..1e6).contains(&a) {
        return format!("{v:.1e}");
    }
    let digits = (4 - 1 - a.log10().floor() as i32).max(0) as usize;
    let s = format!("{v:.digits$}");
    if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_string() } else { s }
}
