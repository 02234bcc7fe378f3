//! Streaming distributions: a run's latencies as an HDR histogram instead of one number per
//! request, so that a long run's memory does not grow with its requests (docs/performance.md,
//! "Scale").
//!
//! Why an HDR histogram (the `hdrhistogram` crate, a port of Gil Tene's HdrHistogram) and not a
//! t-digest (the `tdigest` crate): a histogram's error is a bound on the *value* (every recorded
//! value lands in a bucket at most 1/1024 of its size wide, whatever the distribution), where a
//! t-digest bounds the *rank* and only approximately; two histograms merge by adding counts, so a
//! merge equals the histogram of the whole bit for bit and in any order, where merged t-digests
//! depend on the order and the compression; and reading a quantile walks the counts by nearest
//! rank, the rule [`crate::metrics::quantile`] uses on exact records.
//!
//! The bound ([`RELATIVE_ERROR`]): values are recorded in integer nanoseconds (the simulators'
//! clock) with 3 significant digits, that is 2048 sub-buckets per power of two: a quantile read
//! from a [`Sketch`] is the top of the bucket holding the exact nearest-rank value `v`, so it lies
//! in `[v − 1 ns, v · (1 + 1/1024) + 1 ns]` (the nanosecond is the rounding of seconds to ticks).

use hdrhistogram::Histogram;

/// Significant decimal digits the histograms keep (3: 2048 sub-buckets per power of two).
pub const SIGNIFICANT_DIGITS: u8 = 3;
/// The largest relative error of a quantile read from a [`Sketch`], beyond [`UNIT`] of rounding.
pub const RELATIVE_ERROR: f64 = 1.0 / 1024.0;
/// The unit values are recorded in: 1 ns, for values in seconds (or any unit of similar size).
pub const UNIT: f64 = 1e-9;
/// Values above this many units are recorded as it (about 146 years of nanoseconds).
const LARGEST: u64 = 1 << 62;

/// A mergeable histogram of non-negative values with their exact count and sum.
#[derive(Clone, Debug)]
pub struct Sketch {
    hist: Histogram<u64>,
    sum: f64,
}

impl Default for Sketch {
    fn default() -> Self {
        Self::new()
    }
}

impl PartialEq for Sketch {
    /// Equal counts in every bucket and equal sums: what merging must preserve.
    fn eq(&self, other: &Self) -> bool {
        self.hist == other.hist && self.sum.to_bits() == other.sum.to_bits()
    }
}

impl Sketch {
    pub fn new() -> Self {
        // Auto-resizing from the smallest range: 3 digits is within the crate's 0..=5.
        Self { hist: Histogram::new(SIGNIFICANT_DIGITS).expect("3 significant digits is valid"), sum: 0.0 }
    }

    /// Records `x` (rounded to [`UNIT`]; negatives count as 0, NaN is skipped).
    pub fn record(&mut self, x: f64) {
        if x.is_nan() {
            return;
        }
        let units = (x.max(0.0) / UNIT).round();
        let units = if units >= LARGEST as f64 { LARGEST } else { units as u64 };
        self.hist.record(units).expect("an auto-resizing histogram records any value up to 2^62");
        self.sum += x;
    }

    /// Adds every value of `other` (counts add: the result does not depend on the order).
    pub fn merge(&mut self, other: &Sketch) {
        self.hist.add(&other.hist).expect("auto-resizing histograms of one precision add");
        self.sum += other.sum;
    }

    pub fn len(&self) -> u64 {
        self.hist.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The mean of the recorded values (NaN for none); the sum is exact up to float rounding.
    pub fn mean(&self) -> f64 {
        if self.is_empty() { f64::NAN } else { self.sum / self.len() as f64 }
    }

    /// The `q`-quantile by nearest rank (the value of rank ⌈q·n⌉, at least 1) within the bound in
    /// the module docs; NaN for none.
    pub fn quantile(&self, q: f64) -> f64 {
        // The crate reads q = 0 as the *bottom* of the first bucket; any q ≤ 1/n is rank 1,
        // read at its bucket's top like every other rank, so the bound stays one-sided.
        let q = q.max(f64::MIN_POSITIVE);
        if self.is_empty() { f64::NAN } else { self.hist.value_at_quantile(q) as f64 * UNIT }
    }

    /// The quantiles 0, 1/`points`, …, 1 (empty for none), as [`crate::metrics::quantile_vector`].
    pub fn quantile_vector(&self, points: usize) -> Vec<f64> {
        if self.is_empty() {
            return Vec::new();
        }
        (0..=points).map(|i| self.quantile(i as f64 / points as f64)).collect()
    }

    /// Bytes the histogram's counts take (its memory beyond a few words).
    pub fn bytes(&self) -> usize {
        self.hist.distinct_values() * std::mem::size_of::<u64>()
    }
}

/// A set of values a summary reads a mean and nearest-rank quantiles from: every value (exact,
/// memory per value) or a [`Sketch`] (memory bounded, within [`RELATIVE_ERROR`]).
#[derive(Clone, Debug)]
pub enum Dist {
    Exact(Vec<f64>),
    Sketch(Sketch),
}

impl Dist {
    pub fn new(exact: bool) -> Self {
        if exact { Dist::Exact(Vec::new()) } else { Dist::Sketch(Sketch::new()) }
    }

    pub fn push(&mut self, x: f64) {
        match self {
            Dist::Exact(xs) => xs.push(x),
            Dist::Sketch(s) => s.record(x),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Dist::Exact(xs) => xs.len(),
            Dist::Sketch(s) => s.len() as usize,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The mean (NaN for none). Exact: read it before [`Dist::quantile`], which reorders.
    pub fn mean(&self) -> f64 {
        match self {
            Dist::Exact(xs) => crate::metrics::mean(xs),
            Dist::Sketch(s) => s.mean(),
        }
    }

    /// The `q`-quantile by nearest rank (NaN for none); exact values are reordered.
    pub fn quantile(&mut self, q: f64) -> f64 {
        match self {
            Dist::Exact(xs) => crate::metrics::quantile(xs, q),
            Dist::Sketch(s) => s.quantile(q),
        }
    }

    /// The quantiles 0, 1/`points`, …, 1 (empty for none); exact values are sorted.
    pub fn quantile_vector(&mut self, points: usize) -> Vec<f64> {
        match self {
            Dist::Exact(xs) => crate::metrics::quantile_vector(xs, points),
            Dist::Sketch(s) => s.quantile_vector(points),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seeds::SimRng;
    use rand::{RngExt, SeedableRng};

    /// Log-uniform values from 10 µs (buckets coarser than 1 ns already) to 1000 s.
    fn values(n: usize, seed: u64) -> Vec<f64> {
        let mut rng = SimRng::seed_from_u64(seed);
        (0..n).map(|_| 10f64.powf(rng.random_range(-5.0..3.0))).collect()
    }

    #[test]
    fn quantiles_within_the_stated_bound_of_nearest_rank() {
        let xs = values(100_000, 7);
        let mut s = Sketch::new();
        xs.iter().for_each(|&x| s.record(x));
        let mut exact = xs.clone();
        for q in [0.0, 0.001, 0.25, 0.5, 0.9, 0.99, 0.999, 1.0] {
            let (e, v) = (crate::metrics::quantile(&mut exact, q), s.quantile(q));
            assert!(v >= e - UNIT && v <= e * (1.0 + RELATIVE_ERROR) + UNIT, "q {q}: sketch {v}, exact {e}");
        }
        let mean = crate::metrics::mean(&xs);
        assert!((s.mean() - mean).abs() <= 1e-9 * mean, "{} vs {mean}", s.mean());
        assert!(Sketch::new().quantile(0.5).is_nan() && Sketch::new().quantile_vector(10).is_empty());
    }

    /// Shards' sketches merged, in any order, equal the sketch of the whole.
    #[test]
    fn merged_parts_equal_the_whole() {
        let xs = values(30_000, 11);
        let mut whole = Sketch::new();
        xs.iter().for_each(|&x| whole.record(x));
        let parts: Vec<Sketch> = xs
            .chunks(7_001)
            .map(|c| {
                let mut s = Sketch::new();
                c.iter().for_each(|&x| s.record(x));
                s
            })
            .collect();
        let mut forward = Sketch::new();
        parts.iter().for_each(|p| forward.merge(p));
        let mut backward = Sketch::new();
        parts.iter().rev().for_each(|p| backward.merge(p));
        assert_eq!(forward.hist, whole.hist);
        assert_eq!(backward.hist, whole.hist);
        for q in [0.5, 0.9, 0.99] {
            assert_eq!(forward.quantile(q).to_bits(), whole.quantile(q).to_bits());
        }
        assert_eq!(forward.len(), xs.len() as u64);
    }

    /// Memory does not grow with the values: a thousand times more values, the same buckets.
    #[test]
    fn memory_is_bounded_by_the_range_not_the_count() {
        let (mut small, mut large) = (Sketch::new(), Sketch::new());
        values(1_000, 3).iter().for_each(|&x| small.record(x));
        values(1_000_000, 3).iter().for_each(|&x| large.record(x));
        assert!(large.bytes() <= small.bytes() * 2, "{} vs {}", large.bytes(), small.bytes());
        assert!(large.bytes() < 1 << 20, "{} bytes", large.bytes());
    }
}
