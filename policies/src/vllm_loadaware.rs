//! `vllm_loadaware`: vLLM production-stack's `loadaware` routing logic — cache affinity
//! weighed against live load, so a warm but saturated replica can lose to a cold idle one.
//!
//! Algorithm (per request):
//! 1. `matched_r` = the tokens of the prompt replica r holds (upstream asks the LMCache
//!    controller, which knows what every engine stored); `benefit_r = min(matched_r, prompt) /
//!    max(prompt, 1)`, a fraction of this prompt in [0, 1].
//! 2. `load_r` = the router's own count of requests routed to r and not finished (upstream's
//!    `request_stats`: `in_prefill_requests + in_decoding_requests`); `mean` = their average;
//!    `relative_r = (load_r − mean) / max(1, mean)` (the clamp keeps a near-idle fleet from
//!    reading one request as a 100%+ imbalance).
//! 3. If no replica holds any of the prompt (upstream: the controller names no holder), fall
//!    back to the lowest request rate over the last `qps_window_s` seconds, a replica never
//!    routed to first (`_qps_routing`; requests carry no session key here, so the session-hash
//!    branch of the fallback never applies).
//! 4. Otherwise route to the argmax of `benefit_r − beta · relative_r` over every replica (a
//!    replica holding nothing scores benefit 0); ties to the lowest index (upstream sorts the
//!    endpoints by URL and keeps the first strict maximum).
//!
//! Parameters (defaults): `beta` 1.0 (upstream's `DEFAULT_LOADAWARE_BETA`: a replica 100% above
//! the fleet's mean load is docked one full cache hit), `qps_window_s` 60 (the router's
//! `--request-stats-window`).
//!
//! Source: vllm-project/production-stack PR #1035 (merged 2026-08-09), `LoadAwareRouter` in
//! `src/vllm_router/routers/routing_logic.py` (`load_penalty`, `relative_loads`,
//! `score_endpoint`, `select_url`, `route_request`, `fallback_url`) and `_qps_routing` in the
//! same file @ a6c01db0; the PR's unit tests, `src/tests/test_loadaware_router.py` @ 9f2a0598,
//! whose decisions `policies/tests/routers/field_options_2026.rs` pins. `kvaware` itself stays as it
//! was upstream; routelab has no LMCache controller and does not ship `kvaware`.
//!
//! Deviations, and why:
//! - `matched_r` is the host's exact prefix match (cached plus dispatched here and not yet
//!   computed), in tokens. LMCache's controller knows a chunk once the engine has stored it
//!   (after its prefill) and reports matches in 256-token chunks, rounding a stored partial
//!   last chunk up (upstream's `min()` guards that); neither the delay nor the chunking is
//!   modelled.
//! - `kv_aware_threshold` is not applied, as upstream's `loadaware` does not apply it.

use routelab_policy_api::*;
use serde::{Deserialize, Serialize};

use crate::index::members::{Member, Members};
use crate::index::qps::QpsWindow;

#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub beta: f64,
    pub qps_window_s: f64,
}

impl Default for Config {
    fn default() -> Self {
        Self { beta: 1.0, qps_window_s: 60.0 }
    }
}

pub struct VllmLoadAware {
    cfg: Config,
    /// Requests routed to each replica and not finished.
    /// By id (`index::members`), as `qps`; `scores` by routable index.
    in_flight: Vec<u32>,
    members: Members,
    qps: QpsWindow,
    scores: Vec<f64>,
    fallback_decisions: u64,
    /// Decisions that went elsewhere than a replica with the longest match.
    load_won_decisions: u64,
}

impl Policy for VllmLoadAware {
    const NAME: &'static str = "vllm_loadaware";
    const DESCRIPTION: &'static str =
        "vLLM production-stack loadaware: cached fraction minus beta × load relative to the fleet mean";
    type Config = Config;
    type Context = RouterContext;
    fn new(cfg: Config, ctx: &RouterContext) -> Result<Self, String> {
        if !(cfg.beta >= 0.0 && cfg.beta.is_finite()) {
            return Err(format!("beta must be a finite number ≥ 0 (got {}); 0 routes on the cache alone", cfg.beta));
        }
        if !(cfg.qps_window_s > 0.0 && cfg.qps_window_s.is_finite()) {
            return Err(format!("qps_window_s must be positive (got {})", cfg.qps_window_s));
        }
        let n = ctx.replica_count();
        Ok(Self {
            qps: QpsWindow::new(n, cfg.qps_window_s),
            cfg,
            in_flight: vec![0; n],
            members: Members::new(n),
            scores: vec![0.0; n],
            fallback_decisions: 0,
            load_won_decisions: 0,
        })
    }
}

impl VllmLoadAware {
    /// Every replica's score `benefit − beta · relative_load` for `request` (fills and returns
    /// the scores; meaningless when no replica matches, where the router falls back).
    pub fn scores(&mut self, request: &Request<'_>, replicas: &Replicas<'_>) -> &[f64] {
        let n = replicas.len();
        let load = |r: usize| self.in_flight[self.members.id(r)] as f64;
        let mean = (0..n).map(load).sum::<f64>() / n as f64;
        let denominator = mean.max(1.0);
        let prompt = request.prompt_tokens;
        self.scores.resize(n, 0.0);
        for r in 0..n {
            let benefit = replicas[r].matched_tokens.min(prompt) as f64 / prompt.max(1) as f64;
            let relative = (self.in_flight[self.members.id(r)] as f64 - mean) / denominator;
            self.scores[r] = benefit - self.cfg.beta * relative;
        }
        &self.scores[..n]
    }
}

impl RouterPolicy for VllmLoadAware {
    fn capabilities(&self) -> Capabilities {
        Capabilities::NEEDS_EXACT_MATCH
    }

    fn route(&mut self, request: &Request<'_>, replicas: &Replicas<'_>) -> usize {
        let longest = replicas.iter().map(|v| v.matched_tokens).max().unwrap_or(0);
        if longest == 0 {
            self.fallback_decisions += 1;
            let members = &self.members;
            return self.qps.lowest_of(request.arrived_at, replicas.len(), |i| members.id(i));
        }
        self.scores(request, replicas);
        let mut best = 0;
        for r in 1..replicas.len() {
            if self.scores[r] > self.scores[best] {
                best = r;
            }
        }
        if replicas[best].matched_tokens < longest {
            self.load_won_decisions += 1;
        }
        best
    }

    fn on_dispatch(&mut self, request: &Request<'_>, r: usize) {
        let r = self.members.place(request.id, r);
        self.in_flight[r] += 1;
        self.qps.record(r, request.arrived_at);
    }

    fn on_complete(&mut self, c: &Completion) {
        if let Some(id) = self.members.finish(c.request_id) {
            let l = &mut self.in_flight[id];
            *l = l.saturating_sub(1);
        }
    }

    /// A replica that leaves is forgotten: its load and its request rate (upstream routes over
    /// the endpoints discovered now; a new one has no stats).
    fn on_replica_change(&mut self, change: &ReplicaChange) {
        if let Some(Member::Left(id)) = self.members.change(change) {
            self.in_flight[id] = 0;
            self.qps.forget(id);
        }
    }

    fn report(&self) -> Vec<(String, f64)> {
        vec![
            ("fallback_decisions".into(), self.fallback_decisions as f64),
            ("load_won_decisions".into(), self.load_won_decisions as f64),
        ]
    }
}
