//! `least_requests` (join the shortest queue, JSQ): the replica with the fewest outstanding requests.
//!
//! Algorithm: scan every replica's `outstanding_requests` (waiting + running); among the minima
//! pick one uniformly at random (one pass, reservoir sampling), so ties do not all land on the
//! lowest index.
//! Parameters: none. Randomness for ties from the host's seed.
//! Source: JSQ (Winston 1977; Weber 1978); the SGLang router's and Envoy's `least_request`.
//! Under stale information (a snapshot refreshed every T) every arrival sees the same shortest
//! queue and herds onto it (Mitzenmacher 2000).

use routelab_policy_api::*;

pub struct LeastRequests {
    rng: PolicyRng,
}

impl Policy for LeastRequests {
    const NAME: &'static str = "least_requests";
    const DESCRIPTION: &'static str = "join the shortest queue (fewest outstanding requests), random ties";
    type Config = crate::NoConfig;
    type Context = RouterContext;
    fn new(_: Self::Config, ctx: &RouterContext) -> Result<Self, String> {
        Ok(Self { rng: policy_rng(ctx.seed) })
    }
}

impl RouterPolicy for LeastRequests {
    fn route(&mut self, _: &Request<'_>, replicas: &Replicas<'_>) -> usize {
        argmin_random_tie(replicas.iter().map(|r| r.outstanding_requests), &mut self.rng).expect("at least one replica")
    }
}
