//! `least_requests` (join the shortest queue, JSQ): the replica with the fewest outstanding requests.
//!
//! Algorithm: find the minimum of every replica's `outstanding_requests` (waiting + running) and
//! how many replicas hold it; when several do, draw one `k` uniform in `[0, ties)` from the
//! policy's stream and take the `k`-th of them in index order (the toolkit's
//! [`argmin_one_draw_by`]). One draw per decision (none without a tie), so ties do not all land on the lowest index and the cost does not grow with
//! their number. (Until issue 14 it drew once per tie, reservoir-style: as uniform, but at 1,024
//! servers ≈ 100 idle servers meant ≈ 100 draws per decision; per-seed results changed then.)
//! Parameters: none. Randomness for ties from the host's seed.
//! Source: JSQ (Winston 1977; Weber 1978); the SGLang router's and Envoy's `least_request`.
//! Under stale information (a snapshot refreshed every T) every arrival sees the same shortest
//! queue and herds onto it (Mitzenmacher 2000).
//!
//! In the dispatch world from [`INDEX_FROM`] replicas the same decision is made without reading
//! every view, from a tournament tree over the counts ([`MinIndex`], shared with
//! `least_work_left`): same replica, same generator state, re-reading only the views a report
//! says can have changed. The cluster world and the gateway change views in other ways (queued
//! admissions, unhealthy backends), so there the router scans.

use routelab_policy_api::*;

use crate::index::min_index::{INDEX_FROM, MinIndex, decide, report};

pub struct LeastRequests {
    rng: PolicyRng,
    /// The index, in the dispatch world only (see the module notes).
    index: Option<MinIndex>,
}

impl Policy for LeastRequests {
    const NAME: &'static str = "least_requests";
    const DESCRIPTION: &'static str = "join the shortest queue (fewest outstanding requests), random ties";
    type Config = crate::NoConfig;
    type Context = RouterContext;
    fn new(_: Self::Config, ctx: &RouterContext) -> Result<Self, String> {
        let index = (ctx.world == World::Dispatch && ctx.replicas >= INDEX_FROM).then(MinIndex::default);
        Ok(Self { rng: policy_rng(ctx.seed), index })
    }
}

impl RouterPolicy for LeastRequests {
    fn route(&mut self, _: &Request<'_>, replicas: &Replicas<'_>) -> usize {
        let count = |i: usize| replicas[i].outstanding_requests;
        decide(self.index.as_mut(), replicas.len(), |i| count(i) as u64, count, &mut self.rng)
    }
    fn on_dispatch(&mut self, _: &Request<'_>, replica: usize) {
        report(&mut self.index, replica, 1);
    }
    fn on_complete(&mut self, c: &Completion) {
        report(&mut self.index, c.replica_index(), -1);
    }
}
