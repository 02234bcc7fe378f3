//! The request circuit breaker of each backend.

use std::time::{Duration, Instant};

/// Consecutive failures open the circuit for a while; after that one request may try again
/// (a request's success closes it; scrapes never touch it).
#[derive(Debug, Default)]
pub struct Breaker {
    failures: u32,
    open_until: Option<Instant>,
}

impl Breaker {
    pub fn allows(&self, now: Instant) -> bool {
        self.open_until.is_none_or(|t| now >= t)
    }
    pub fn success(&mut self) {
        *self = Self::default();
    }
    pub fn failure(&mut self, now: Instant, threshold: u32, open_for: Duration) {
        self.failures += 1;
        if self.failures >= threshold {
            self.open_until = Some(now + open_for);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_breaker_opens_after_the_threshold_and_closes_on_success() {
        let (t0, open_for) = (Instant::now(), Duration::from_secs(5));
        let mut b = Breaker::default();
        b.failure(t0, 3, open_for);
        b.failure(t0, 3, open_for);
        assert!(b.allows(t0), "two failures of three");
        b.failure(t0, 3, open_for);
        assert!(!b.allows(t0 + Duration::from_secs(4)));
        assert!(b.allows(t0 + open_for), "half-open after the cool-down");
        b.failure(t0 + open_for, 3, open_for);
        assert!(!b.allows(t0 + open_for + Duration::from_secs(1)), "a failed probe reopens it");
        b.success();
        assert!(b.allows(t0));
    }
}
