//! `least_work_left` (LWL): the replica with the least outstanding work.
//!
//! Algorithm: the replica whose outstanding work is smallest, ties uniformly at random.
//! - Cluster world (and the gateway): scan every view's `outstanding_work` (remaining prefill +
//!   decode tokens); ties broken reservoir-style, one draw per tied replica
//!   ([`argmin_random_tie`]).
//! - Dispatch world: the same order from figures that do not move with the clock. An idle server
//!   (no request outstanding) has no work left; a busy one has `busy_until − now` (the
//!   `busy_until` signal: when its FCFS backlog drains), so among busy servers the order of
//!   `busy_until` is the order of remaining work, at every instant. Key: 0 when idle, else the
//!   bits of `busy_until` (a positive `f64` orders by its bits). Ties — idle servers, mostly —
//!   take one uniform draw `k` and the `k`-th tied server in index order ([`argmin_one_draw_by`]),
//!   which is what lets the index below answer without visiting them. From [`INDEX_FROM`]
//!   servers the decision comes from that index ([`MinIndex`]: idle servers as a bit set, the
//!   keys in a tournament tree), which re-reads only the servers a report (`on_dispatch`,
//!   `on_complete`) says changed; it needs live views, so it is used while the `scraped.age_s`
//!   signal is 0 (the dispatch world shows a stale snapshot as a scrape) and rebuilt after a
//!   decision on a snapshot, which scans.
//!
//! Parameters: none. Randomness for ties from the host's seed.
//! Source: "least work left" / "join the queue with the least work" (Harchol-Balter, *Performance
//! Modeling and Design of Computer Systems*, ch. 24): with FCFS servers it is equivalent to
//! central-queue M/G/k, which is why its tail beats JSQ's when sizes are heavy-tailed.
//!
//! Same decisions as a scan of `outstanding_work`: the host keeps time in integer nanounits and
//! shows both figures as `f64`, and two different ends stay two different `busy_until` values
//! below 2^51 ns ≈ 2.25 million mean service times (past that, ends a few ns apart could round
//! to one value and tie). Until issue 14 the dispatch world used the cluster's per-tie draws on
//! `outstanding_work`, which the host refreshed at every server before every arrival; per-seed
//! results changed then, the tie-break is as uniform (`min_index` tests).

use routelab_policy_api::*;

use crate::index::min_index::{INDEX_FROM, MinIndex, argmin_one_draw_by, decide, report};

pub struct LeastWorkLeft {
    rng: PolicyRng,
    world: World,
    /// The index, in the dispatch world from [`INDEX_FROM`] servers.
    index: Option<MinIndex>,
}

/// Columns of the signals it asks for in the dispatch world.
const BUSY_UNTIL: usize = 0;
const AGE: usize = 1;

impl Policy for LeastWorkLeft {
    const NAME: &'static str = "least_work_left";
    const DESCRIPTION: &'static str = "least outstanding work (service time or tokens), random ties";
    type Config = crate::NoConfig;
    type Context = RouterContext;
    fn new(_: Self::Config, ctx: &RouterContext) -> Result<Self, String> {
        let index = (ctx.world == World::Dispatch && ctx.replicas >= INDEX_FROM).then(MinIndex::default);
        Ok(Self { rng: policy_rng(ctx.seed), world: ctx.world, index })
    }
}

impl RouterPolicy for LeastWorkLeft {
    fn capabilities(&self) -> Capabilities {
        match self.world {
            World::Dispatch => Capabilities::NONE,
            World::Cluster => Capabilities::NEEDS_OUTSTANDING_WORK,
        }
    }
    fn signals(&self) -> Vec<String> {
        match self.world {
            World::Dispatch => vec![signals::BUSY_UNTIL.into(), signals::SCRAPED_AGE_S.into()],
            World::Cluster => Vec::new(),
        }
    }
    fn route(&mut self, _: &Request<'_>, replicas: &Replicas<'_>) -> usize {
        if self.world == World::Cluster {
            let work = replicas.iter().map(|r| r.outstanding_work);
            return argmin_random_tie(work, &mut self.rng).expect("at least one replica");
        }
        let (views, table, columns) = (replicas.views(), replicas.signals.as_slice(), replicas.signal_columns as usize);
        let count = |i: usize| views[i].outstanding_requests;
        let key = |i: usize| if count(i) == 0 { 0 } else { table[i * columns + BUSY_UNTIL].to_bits() };
        let live = replicas.signal(0, AGE) == 0.0;
        match &mut self.index {
            Some(index) if !live => {
                index.invalidate();
                argmin_one_draw_by(replicas.len(), key, &mut self.rng)
            }
            index => decide(index.as_mut(), replicas.len(), key, count, &mut self.rng),
        }
    }
    fn on_dispatch(&mut self, _: &Request<'_>, replica: usize) {
        report(&mut self.index, replica, 1);
    }
    fn on_complete(&mut self, c: &Completion) {
        report(&mut self.index, c.replica as usize, -1);
    }
}

#[cfg(test)]
mod tests {
    use abi_stable::std_types::RNone;
    use rand::RngExt;

    use super::*;

    fn lwl(world: World, replicas: u32) -> LeastWorkLeft {
        let ctx = RouterContext {
            world,
            replicas,
            seed: 5,
            kv_capacity_tokens: 0,
            cost: RNone,
            disaggregation: RNone,
            facts: Default::default(),
        };
        LeastWorkLeft::new(Default::default(), &ctx).unwrap()
    }

    const REQ: Request<'static> = Request::new(0, 1.0, 0);

    /// Hand-computed dispatch-world decisions. Outstanding requests [2, 0, 1, 0, 3] and
    /// `busy_until` [5.5, 0.75, 2.25, 0.5, 2.0] at time 1: servers 1 and 3 are idle (their ends
    /// are past), so they tie at no work and one draw from the policy's stream (seed 5) picks
    /// between them. With no idle server (counts [2, 1, 1, 4]) the least work is server 2's
    /// (2.0 − 1 = 1.0, against 4.5, 1.25, 8.0), chosen without a draw.
    #[test]
    fn dispatch_decisions_by_hand() {
        let mut p = lwl(World::Dispatch, 5);
        assert_eq!(p.capabilities(), Capabilities::NONE, "no per-arrival refresh of outstanding_work");
        let views = |counts: &[u32]| -> Vec<ReplicaView> {
            counts.iter().map(|&c| ReplicaView { outstanding_requests: c, ..Default::default() }).collect()
        };
        let with = |busy: &[f64]| busy.iter().flat_map(|&b| [b, 0.0]).collect::<Vec<f64>>();
        let (v, s) = (views(&[2, 0, 1, 0, 3]), with(&[5.5, 0.75, 2.25, 0.5, 2.0]));
        let mut draw = policy_rng(5);
        let expected = [1, 3][draw.random_range(0..2u32) as usize];
        assert_eq!(p.route(&REQ, &Replicas::with_signals(&v, &s, 2)), expected);
        assert!(p.rng == draw, "one draw for the tie");
        let (v, s) = (views(&[2, 1, 1, 4]), with(&[5.5, 2.25, 2.0, 9.0]));
        assert_eq!(p.route(&REQ, &Replicas::with_signals(&v, &s, 2)), 2);
        assert!(p.rng == draw, "no draw without a tie");
    }

    /// In the cluster world the views' `outstanding_work` (tokens) decides, and no signals are asked.
    #[test]
    fn cluster_reads_outstanding_work() {
        let mut p = lwl(World::Cluster, 3);
        assert!(p.capabilities().needs_outstanding_work() && p.signals().is_empty());
        let v: Vec<ReplicaView> =
            [300.0, 120.0, 200.0].iter().map(|&w| ReplicaView { outstanding_work: w, ..Default::default() }).collect();
        assert_eq!(p.route(&REQ, &Replicas::new(&v)), 1);
    }
}
