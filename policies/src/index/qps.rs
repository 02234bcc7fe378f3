//! production-stack's `_qps_routing` (vllm-project/production-stack,
//! `src/vllm_router/routers/routing_logic.py`): a replica never routed to wins at once (the
//! first in index order); otherwise the one with the fewest requests over the last
//! `window_s` seconds (the router's `--request-stats-window`, 60 s), the first on ties. Shared
//! by `vllm_prefix_aware` (below its minimum match) and `vllm_loadaware` (when no replica holds
//! any of the prompt).

use routelab_policy_api::WindowSum;

/// Requests routed to each replica within the window, and whether it ever got one.
pub struct QpsWindow {
    recent: Vec<WindowSum>,
    ever: Vec<bool>,
    window_s: f64,
}

impl QpsWindow {
    pub fn new(replicas: usize, window_s: f64) -> Self {
        Self { recent: vec![WindowSum::new(window_s); replicas], ever: vec![false; replicas], window_s }
    }

    /// A request was routed to `r` at `now`.
    pub fn record(&mut self, r: usize, now: f64) {
        self.ever[r] = true;
        self.recent[r].add(now, 1.0);
    }

    /// The replica `_qps_routing` picks at `now`.
    pub fn lowest(&mut self, now: f64) -> usize {
        let n = self.ever.len();
        self.lowest_of(now, n, |r| r)
    }

    /// The position `_qps_routing` picks at `now` among `n` replicas, position `i` being
    /// replica `id(i)` (the routable ones, when replicas come and go).
    pub fn lowest_of(&mut self, now: f64, n: usize, id: impl Fn(usize) -> usize) -> usize {
        if let Some(i) = (0..n).position(|i| !self.ever[id(i)]) {
            return i;
        }
        let mut best = 0;
        let mut best_qps = f64::INFINITY;
        for i in 0..n {
            let qps = self.recent[id(i)].sum(now);
            if qps < best_qps {
                best_qps = qps;
                best = i;
            }
        }
        best
    }

    /// Replica `r` left: a replica that joins in its place is new (never routed to).
    pub fn forget(&mut self, r: usize) {
        self.recent[r] = WindowSum::new(self.window_s);
        self.ever[r] = false;
    }
}
