//! `vllm_dp_lb`: vLLM's internal data-parallel load balancer — the engine with the lowest
//! `waiting · 4 + running`, from counts the DP coordinator publishes every 100 ms, raised
//! locally for each request sent since the last publication.
//!
//! Algorithm (per request):
//! 1. `counts_r = (waiting_r, running_r)`: the last published counts of engine r (routelab's
//!    `scraped.waiting` and `scraped.running`, refreshed at the workload's
//!    `metrics.scrape_interval_s`; `routelab accuracy` sets vLLM's 100 ms) plus this router's
//!    own additions since that publication (step 3). A new publication replaces them all, the
//!    additions included (upstream assigns the coordinator's list to `lb_engines`).
//! 2. Score `waiting_weight · waiting_r + running_r`; route to the first strict minimum,
//!    scanning from engine 0 (upstream scans from `eng_start_index = engines · client_index /
//!    client_count`, 0 for the single API server the runs use; ties go to the lowest index).
//! 3. Add one to the chosen engine's waiting count (upstream adds `client_count`, 1 here), so a
//!    burst between two publications spreads instead of herding onto the engine that looked
//!    emptiest.
//!
//! When the counts are fresh (age 0: no scraping, or the dispatch world) the router reads the
//! live counts and adds nothing (the live count already holds the request just sent).
//!
//! Parameters (defaults): `waiting_weight` 4 (upstream's constant: a queued request weighs four
//! running ones, since it delays a first token). The publication interval is the workload's
//! `metrics.scrape_interval_s`, not a parameter of the router (the coordinator, not the client,
//! owns it upstream).
//!
//! Source: vLLM `vllm/v1/engine/core_client.py` @ 364631ab07d283c4f08db0544a2653c5b415a427
//! (`DPLBAsyncMPClient.get_core_engine_for_request`; `DPAsyncMPClient`'s stats task replacing
//! `lb_engines` with each publication) and `vllm/v1/engine/coordinator.py` @
//! 0090ad1226adbe545f59dfabedc67ccd174def01 (`CoordinatorProc.process_input_socket`: publish
//! the engines' `[waiting, running]` 100 ms after the last publication when they changed, every
//! 4 s otherwise; `min_stats_update_interval_ms = 100` unless the load balancer is external).
//!
//! Deviations, and why:
//! - The coordinator holds each engine's counts as of that engine's last report (engines report
//!   when their counts change, around their steps); a scrape reads the counts at the scrape's
//!   instant. The two differ by at most one step's changes.
//! - Publications run on a fixed grid whether or not the counts changed (upstream waits 4 s
//!   when nothing changed; with nothing changed the counts are the same either way, except for
//!   this router's own additions, which upstream keeps up to 4 s on an idle group and this
//!   router drops at the next scrape).
//! - A later revision (`core_client.py` @ 00080ee13c7a451fce071ccb8d0e94d395acf5a7) scores
//!   `max(in-flight, waiting + running)` plus a KV-pressure penalty on waiting and rotates the
//!   scan start; this router implements the earlier `waiting · 4 + running` form.

use routelab_policy_api::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub waiting_weight: f64,
}

impl Default for Config {
    fn default() -> Self {
        Self { waiting_weight: 4.0 }
    }
}

pub struct VllmDpLb {
    cfg: Config,
    /// `(waiting, running)` per engine: the last publication plus this router's additions.
    counts: Vec<(f64, f64)>,
    /// Simulated time of the publication `counts` starts from (`None` before the first).
    published_at: Option<f64>,
    /// Decisions made on counts older than the request (a publication not yet refreshed).
    stale_decisions: u64,
    /// Decisions where the router's own additions changed the choice from the published counts'.
    additions_moved: u64,
}

impl Policy for VllmDpLb {
    const NAME: &'static str = "vllm_dp_lb";
    const DESCRIPTION: &'static str =
        "vLLM's data-parallel load balancer: lowest 4 × waiting + running, from counts published every scrape";
    type Config = Config;
    type Context = RouterContext;
    fn new(cfg: Config, ctx: &RouterContext) -> Result<Self, String> {
        if !(cfg.waiting_weight >= 0.0 && cfg.waiting_weight.is_finite()) {
            return Err(format!(
                "waiting_weight must be a finite number ≥ 0 (got {}); upstream uses 4",
                cfg.waiting_weight
            ));
        }
        let n = ctx.replicas as usize;
        Ok(Self { cfg, counts: vec![(0.0, 0.0); n], published_at: None, stale_decisions: 0, additions_moved: 0 })
    }
}

impl VllmDpLb {
    /// The first engine with the lowest score over `counts`.
    fn lowest(&self, counts: impl Iterator<Item = (f64, f64)>) -> usize {
        let mut best = (0, f64::INFINITY);
        for (i, (w, r)) in counts.enumerate() {
            let score = self.cfg.waiting_weight * w + r;
            if score < best.1 {
                best = (i, score);
            }
        }
        best.0
    }
}

impl RouterPolicy for VllmDpLb {
    fn signals(&self) -> Vec<String> {
        vec![signals::SCRAPED_WAITING.into(), signals::SCRAPED_RUNNING.into(), signals::SCRAPED_AGE_S.into()]
    }

    fn route(&mut self, request: &Request<'_>, replicas: &Replicas<'_>) -> usize {
        let n = replicas.len();
        let scraped = replicas.signal_columns >= 3;
        let published = |i: usize| {
            if scraped {
                (replicas.signal(i, 0), replicas.signal(i, 1))
            } else {
                (replicas[i].waiting as f64, replicas[i].running as f64)
            }
        };
        let age = if scraped && n > 0 { replicas.signal(0, 2) } else { 0.0 };
        if age <= 0.0 {
            // Fresh counts: the live view already holds every request sent.
            self.published_at = None;
            self.counts.clear();
            self.counts.extend((0..n).map(published));
            return self.lowest(self.counts.iter().copied());
        }
        self.stale_decisions += 1;
        let at = request.arrived_at - age;
        let new_publication = self.published_at.is_none_or(|p| at > p + 1e-9) || self.counts.len() != n;
        if new_publication {
            self.published_at = Some(at);
            self.counts.clear();
            self.counts.extend((0..n).map(published));
        }
        let best = self.lowest(self.counts.iter().copied());
        if best != self.lowest((0..n).map(published)) {
            self.additions_moved += 1;
        }
        self.counts[best].0 += 1.0;
        best
    }

    /// The engine set changed (crashes, autoscaling): the next decision starts from a fresh
    /// publication, as the coordinator publishes the new engine list; additions made against the
    /// old indices are dropped.
    fn on_replica_change(&mut self, _change: &ReplicaChange) {
        self.published_at = None;
        self.counts.clear();
    }

    fn report(&self) -> Vec<(String, f64)> {
        vec![
            ("stale_decisions".into(), self.stale_decisions as f64),
            ("additions_moved".into(), self.additions_moved as f64),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn router() -> VllmDpLb {
        let ctx = RouterContext::new(World::Cluster, 2, 1);
        VllmDpLb::new(Config::default(), &ctx).unwrap()
    }

    /// Routes one request at `now` against published `(waiting, running)` counts taken `age`
    /// seconds ago; the live views hold `live`.
    fn route(r: &mut VllmDpLb, now: f64, age: f64, published: &[(u32, u32)], live: &[(u32, u32)]) -> usize {
        let views: Vec<ReplicaView> = live
            .iter()
            .map(|&(waiting, running)| ReplicaView {
                waiting,
                running,
                outstanding_requests: waiting + running,
                ..ReplicaView::default()
            })
            .collect();
        let signals: Vec<f64> = published.iter().flat_map(|&(w, run)| [w as f64, run as f64, age]).collect();
        r.route(&Request::new(0, now, 10), &Replicas::with_signals(&views, &signals, 3))
    }

    #[test]
    fn a_waiting_request_weighs_four_running_ones() {
        let mut r = router();
        // Engine 0: one waiting (score 4); engine 1: three running (score 3).
        assert_eq!(route(&mut r, 1.0, 0.0, &[(1, 0), (0, 3)], &[(1, 0), (0, 3)]), 1);
        // Five running (score 5) loses to one waiting.
        assert_eq!(route(&mut r, 1.0, 0.0, &[(1, 0), (0, 5)], &[(1, 0), (0, 5)]), 0);
        // Equal scores: the lowest index. Least-requests would see 1 against 4 and pick 0 too,
        // but here 1 waiting against 4 running is a tie.
        assert_eq!(route(&mut r, 1.0, 0.0, &[(1, 0), (0, 4)], &[(1, 0), (0, 4)]), 0);
    }

    #[test]
    fn between_publications_its_own_additions_spread_a_burst() {
        let mut r = router();
        let idle = [(0, 0), (0, 0)];
        // Four requests within one publication, both engines published idle: 0, 1, 0, 1.
        let picks: Vec<usize> =
            (0..4).map(|k| route(&mut r, 0.11 + 0.01 * k as f64, 0.01 + 0.01 * k as f64, &idle, &idle)).collect();
        assert_eq!(picks, [0, 1, 0, 1]);
        // The next publication replaces the additions: engine 1 published busier, engine 0 wins
        // even though the router had just added to it.
        assert_eq!(route(&mut r, 0.21, 0.01, &[(0, 2), (0, 3)], &[(0, 2), (0, 3)]), 0);
        assert_eq!(
            route(&mut r, 0.22, 0.02, &[(0, 2), (0, 3)], &[(0, 2), (0, 3)]),
            1,
            "6 against 3 after the addition"
        );
        assert_eq!(r.stale_decisions, 6);
    }

    #[test]
    fn stale_counts_are_used_even_when_the_live_ones_disagree() {
        let mut r = router();
        // Published: engine 0 idle, engine 1 busy; live: the reverse. It routes on what it was told.
        assert_eq!(route(&mut r, 0.15, 0.05, &[(0, 0), (3, 3)], &[(3, 3), (0, 0)]), 0);
        // With fresh counts (age 0) the live view is what it was told.
        assert_eq!(route(&mut r, 0.15, 0.0, &[(3, 3), (0, 0)], &[(3, 3), (0, 0)]), 1);
    }

    #[test]
    fn a_negative_weight_is_refused() {
        let ctx = RouterContext::new(World::Cluster, 2, 1);
        let e = VllmDpLb::new(Config { waiting_weight: -1.0 }, &ctx).err().unwrap();
        assert!(e.contains("waiting_weight"), "{e}");
    }
}
