//! Simulated time of the cluster world (and the emulator and gateway that share its replicas):
//! integer nanoseconds, so event order never depends on floating-point rounding. The dispatch
//! world counts in mean service times, not seconds, and has its own tick type
//! (`sim::dispatch`'s `Ticks`).
//!
//! [`SimTime`] is a newtype over the nanosecond count (as nexosim's `MonotonicTime`), so a time
//! cannot be mixed up with a count of steps, tokens or ids. It serves both as an instant and as a
//! span between two instants: a separate duration type (nexosim pairs `MonotonicTime` with
//! `std::time::Duration`) would touch every step-time and pause field for no change in what the
//! code computes, since every span here is built from seconds and only ever added to an instant
//! or turned back into seconds.

use std::ops::{Add, AddAssign, Sub};

/// Simulated time in integer nanoseconds (one tick is `1 / TICKS_PER_S` s): an instant since the
/// start of the run, or a span between two.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
#[repr(transparent)]
pub struct SimTime(u64);

/// Ticks per simulated second.
pub const TICKS_PER_S: f64 = 1e9;

impl SimTime {
    /// The start of the run (and the empty span).
    pub const ZERO: Self = Self(0);
    /// The clock's last tick: what a saturated conversion or addition lands on.
    pub const MAX: Self = Self(u64::MAX);
    /// One nanosecond: the shortest step or transfer, so time always moves on.
    pub const TICK: Self = Self(1);

    #[inline]
    pub const fn from_nanos(ns: u64) -> Self {
        Self(ns)
    }

    #[inline]
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Seconds → ticks, rounded to the nearest tick (negative and NaN to zero, too large to
    /// [`SimTime::MAX`]).
    #[inline]
    pub fn from_seconds(seconds: f64) -> Self {
        Self(round_to_u64(seconds * TICKS_PER_S))
    }

    /// Ticks → seconds.
    #[inline]
    pub fn as_seconds(self) -> f64 {
        self.0 as f64 / TICKS_PER_S
    }

    #[inline]
    pub fn saturating_add(self, o: Self) -> Self {
        Self(self.0.saturating_add(o.0))
    }

    #[inline]
    pub fn saturating_sub(self, o: Self) -> Self {
        Self(self.0.saturating_sub(o.0))
    }
}

impl Add for SimTime {
    type Output = Self;
    #[inline]
    fn add(self, o: Self) -> Self {
        Self(self.0 + o.0)
    }
}

impl AddAssign for SimTime {
    #[inline]
    fn add_assign(&mut self, o: Self) {
        self.0 += o.0;
    }
}

impl Sub for SimTime {
    type Output = Self;
    #[inline]
    fn sub(self, o: Self) -> Self {
        Self(self.0 - o.0)
    }
}

impl std::fmt::Display for SimTime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// Seconds → ticks, rounded to the nearest tick ([`SimTime::from_seconds`]). This and
/// [`seconds`] stay as short names for the hundred-odd conversions at the edges (configs in
/// seconds, records out in seconds), where `SimTime::from_seconds(..)` would only add width.
#[inline]
pub fn ticks(seconds: f64) -> SimTime {
    SimTime::from_seconds(seconds)
}

/// Ticks → seconds ([`SimTime::as_seconds`]).
#[inline]
pub fn seconds(t: SimTime) -> f64 {
    t.as_seconds()
}

/// `x.round().max(0.0) as u64` (to the nearest integer, halves away from zero; negative and NaN
/// to 0, beyond `u64::MAX` to it), without the libm call `f64::round` is on x86-64's baseline,
/// which has no rounding instruction: every step of the cluster world converts its duration,
/// and the call was 4% of an agentic replay. The truncation `x as u64` is exact, and below 2^53
/// so is `x − trunc(x)` (the two are within a factor of two once x ≥ 1: Sterbenz); from 2^53 on
/// every float is an integer. `round_to_u64_is_round` compares it with the libm formula.
#[inline]
pub fn round_to_u64(x: f64) -> u64 {
    if !(x > 0.0) {
        return 0;
    }
    if x >= 9_007_199_254_740_992.0 {
        return x as u64;
    }
    // Below 2^53 the signed conversions are exact and one instruction each, where x86-64's
    // baseline has none for unsigned integers.
    let t = x as i64;
    (t + (x - t as f64 >= 0.5) as i64) as u64
}

#[cfg(test)]
mod tests {
    use rand::{RngExt, SeedableRng};

    use super::round_to_u64;

    #[test]
    fn round_to_u64_is_round() {
        let libm = |x: f64| x.round().max(0.0) as u64;
        let mut edges = vec![
            0.0,
            -0.0,
            -0.4,
            -0.5,
            -3.7,
            0.5,
            1.5,
            2.5,
            0.49999999999999994,
            4503599627370495.5,
            4503599627370496.5,
            9007199254740991.0,
            9007199254740992.0,
            9007199254740994.0,
            1.8446744073709552e19,
            1e30,
            f64::MAX,
            f64::MIN_POSITIVE,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
        ];
        for k in 0..64 {
            let p = 2f64.powi(k);
            edges.extend([p, p - 0.5, p + 0.5, p.next_down(), p.next_up(), (p + 0.5).next_down(), (p + 0.5).next_up()]);
        }
        for &x in &edges {
            assert_eq!(round_to_u64(x), libm(x), "x = {x:e}");
        }
        let mut rng = crate::seeds::SimRng::seed_from_u64(7);
        for _ in 0..200_000 {
            // Magnitudes from 1e-3 to 1e21 (seconds × 1e9 of steps, pauses and runs), and raw bits.
            let x = 10f64.powf(rng.random_range(-3.0..21.0)) * if rng.random_bool(0.05) { -1.0 } else { 1.0 };
            assert_eq!(round_to_u64(x), libm(x), "x = {x:e}");
            let y = f64::from_bits(rng.random::<u64>());
            assert_eq!(round_to_u64(y), libm(y), "bits {:x}", y.to_bits());
        }
    }
}
