//! A sum over a sliding time window.

use std::collections::VecDeque;

/// Sum of values added within the last `window` time units (simulated time).
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

/// `N` sums over one sliding time window, for values that always arrive together (one time
/// log and one expiry check instead of `N`). Each sum equals a [`WindowSum`] fed its values alone.
#[derive(Clone, Debug)]
pub struct WindowSums<const N: usize> {
    window: f64,
    events: VecDeque<(f64, [f64; N])>,
    sums: [f64; N],
}

impl<const N: usize> WindowSums<N> {
    /// Empty windows `window` long (in the caller's time unit).
    pub fn new(window: f64) -> Self {
        Self { window, events: VecDeque::new(), sums: [0.0; N] }
    }

    /// Adds `values` at time `now` (times must not decrease).
    pub fn add(&mut self, now: f64, values: [f64; N]) {
        self.expire(now);
        self.events.push_back((now, values));
        for (sum, v) in self.sums.iter_mut().zip(values) {
            *sum += v;
        }
    }

    /// Drops what fell out of the window ending at `now` (the same test as [`WindowSum`]).
    pub fn expire(&mut self, now: f64) {
        while let Some(&(t, values)) = self.events.front() {
            if t > now - self.window {
                break;
            }
            self.events.pop_front();
            for (sum, v) in self.sums.iter_mut().zip(values) {
                *sum -= v;
            }
        }
        if self.events.is_empty() {
            self.sums = [0.0; N]; // no drift from repeated float subtraction
        }
    }

    /// The sums over the window ending at `now`.
    pub fn sums(&mut self, now: f64) -> [f64; N] {
        self.expire(now);
        self.sums
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

    #[test]
    fn window_sums_equal_one_window_sum_each() {
        let (mut a, mut b, mut both) = (WindowSum::new(10.0), WindowSum::new(10.0), WindowSums::<2>::new(10.0));
        for (i, now) in [0.0, 0.5, 3.0, 9.0, 12.0, 12.0, 19.5, 40.0].into_iter().enumerate() {
            let (x, y) = (0.1 * (i + 1) as f64, 7.0 - i as f64);
            a.add(now, x);
            b.add(now, y);
            both.add(now, [x, y]);
            assert_eq!(both.sums(now + 4.0), [a.sum(now + 4.0), b.sum(now + 4.0)], "at {now}");
        }
        assert_eq!(both.sums(100.0), [0.0, 0.0]);
    }
}
