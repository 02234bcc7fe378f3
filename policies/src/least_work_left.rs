//! `least_work_left` (LWL): the replica with the least outstanding work.
//!
//! Algorithm: scan every replica's `outstanding_work` — remaining service time in the dispatch
//! world, remaining prefill + decode tokens in the cluster world — and pick the minimum; ties
//! uniformly at random.
//! Parameters: none.
//! Source: "least work left" / "join the queue with the least work" (Harchol-Balter, *Performance
//! Modeling and Design of Computer Systems*, ch. 24): with FCFS servers it is equivalent to
//! central-queue M/G/k, which is why its tail beats JSQ's when sizes are heavy-tailed.

use routelab_policy_api::*;

pub struct LeastWorkLeft {
    rng: PolicyRng,
}

impl Policy for LeastWorkLeft {
    const NAME: &'static str = "least_work_left";
    const DESCRIPTION: &'static str = "least outstanding work (service time or tokens), random ties";
    type Config = crate::NoConfig;
    type Context = RouterContext;
    fn new(_: Self::Config, ctx: &RouterContext) -> Result<Self, String> {
        Ok(Self { rng: policy_rng(ctx.seed) })
    }
}

impl RouterPolicy for LeastWorkLeft {
    fn capabilities(&self) -> Capabilities {
        Capabilities::NEEDS_OUTSTANDING_WORK
    }
    fn route(&mut self, _: &Request<'_>, replicas: &Replicas<'_>) -> usize {
        argmin_random_tie(replicas.iter().map(|r| r.outstanding_work), &mut self.rng).expect("at least one replica")
    }
}
