//! Simulated time of the cluster world (and the emulator and gateway that share its replicas):
//! integer nanoseconds, so event order never depends on floating-point rounding. The dispatch
//! world counts in mean service times, not seconds, and has its own tick type
//! (`sim::dispatch`'s `Ticks`).

/// Simulated time in integer nanoseconds (one tick is `1 / TICKS_PER_S` s).
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
