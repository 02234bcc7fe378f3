//! Simulated time: integer ticks, so event order never depends on floating-point rounding
//! (nanoseconds in the cluster world, where one tick is `1 / TICKS_PER_S` s).

/// Simulated time in integer ticks (nanoseconds in the cluster world).
pub type SimTime = u64;

/// Ticks per simulated second.
pub const TICKS_PER_S: f64 = 1e9;

/// Seconds → ticks, rounded to the nearest tick.
pub fn ticks(seconds: f64) -> SimTime {
    (seconds * TICKS_PER_S).round().max(0.0) as SimTime
}

/// Ticks → seconds.
pub fn seconds(t: SimTime) -> f64 {
    t as f64 / TICKS_PER_S
}
