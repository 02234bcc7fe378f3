//! A sum over a sliding time window.

use std::collections::VecDeque;

/// Sum of values added within the last `window` time units (simulated time). A value added at
/// `t` counts at every time before `t + window`; each call is amortised O(1).
///
/// # Example
///
/// Tokens a router sent to one replica over the last 10 seconds:
///
/// ```
/// use routelab_policy_api::WindowSum;
///
/// let mut sent = WindowSum::new(10.0);
/// sent.add(0.0, 100.0);
/// sent.add(4.0, 50.0);
/// assert_eq!(sent.sum_count(9.5), (150.0, 2));
/// assert_eq!(sent.sum(10.0), 50.0); // the value added at 0 has left
/// assert_eq!((sent.sum(14.0), sent.count(14.0)), (0.0, 0));
/// ```
#[derive(Clone, Debug)]
pub struct WindowSum {
    window: f64,
    events: VecDeque<(f64, f64)>,
    sum: f64,
}

impl WindowSum {
    /// An empty window `window` long (in the caller's time unit).
    pub fn new(window: f64) -> Self {
        Self { window, events: VecDeque::new(), sum: 0.0 }
    }

    /// Adds `value` at time `now` (times must not decrease).
    pub fn add(&mut self, now: f64, value: f64) {
        self.expire(now);
        self.events.push_back((now, value));
        self.sum += value;
    }

    /// Drops what fell out of the window ending at `now`.
    pub fn expire(&mut self, now: f64) {
        while let Some(&(t, v)) = self.events.front() {
            if t > now - self.window {
                break;
            }
            self.events.pop_front();
            self.sum -= v;
        }
        if self.events.is_empty() {
            self.sum = 0.0; // no drift from repeated float subtraction
        }
    }

    /// The sum over the window ending at `now`.
    pub fn sum(&mut self, now: f64) -> f64 {
        self.expire(now);
        self.sum
    }

    /// Number of values in the window ending at `now`.
    pub fn count(&mut self, now: f64) -> usize {
        self.expire(now);
        self.events.len()
    }

    /// [`Self::sum`] and [`Self::count`] at once (one expiry check instead of two).
    pub fn sum_count(&mut self, now: f64) -> (f64, usize) {
        self.expire(now);
        (self.sum, self.events.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_leave_after_the_window() {
        let mut w = WindowSum::new(10.0);
        w.add(0.0, 1.0);
        w.add(5.0, 2.0);
        assert_eq!(w.sum(9.0), 3.0);
        assert_eq!(w.sum(10.0), 2.0);
        assert_eq!(w.sum_count(14.0), (2.0, 1));
        assert_eq!(w.count(15.0), 0);
        assert_eq!(w.sum(15.0), 0.0);
    }
}
