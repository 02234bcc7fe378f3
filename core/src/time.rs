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
        Self((seconds * TICKS_PER_S).round().max(0.0) as u64)
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
