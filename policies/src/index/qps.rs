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
}

impl QpsWindow {
    pub fn new(replicas: usize, window_s: f64) -> Self {
        Self { recent: vec![WindowSum::new(window_s); replicas], ever: vec![false; replicas] }
    }

    /// A request was routed to `r` at `now`.
    pub fn record(&mut self, r: usize, now: f64) {
        self.ever[r] = true;
        self.recent[r].add(now, 1.0);
    }

    /// The replica `_qps_routing` picks at `now`.
    pub fn lowest(&mut self, now: f64) -> usize {
        if let Some(r) = self.ever.iter().position(|&e| !e) {
            return r;
        }
        let mut best = 0;
        let mut best_qps = f64::INFINITY;
        for (r, w) in self.recent.iter_mut().enumerate() {
            let qps = w.sum(now);
            if qps < best_qps {
                best_qps = qps;
                best = r;
            }
        }
        best
    }
}
