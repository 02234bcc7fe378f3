//! `pinned_least_requests`: join-the-shortest-queue with uniformly random ties, the built-in
//! `least_requests` as it was then (one draw per tie; it now makes one per decision), written
//! against policy-api 0.2.0 (`testing/policy-api-pinned`). The loader's tests loaded it into the
//! 0.2.x hosts (it had to give the built-in's figures bit for bit and answer methods added after
//! 0.2.0 with their defaults); the 0.3 host refuses it with the rebuild message.

use routelab_policy_api::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Default, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct Config {}

pub struct PinnedLeastRequests {
    rng: PolicyRng,
}

impl Policy for PinnedLeastRequests {
    const NAME: &'static str = "pinned_least_requests";
    const DESCRIPTION: &'static str = "least_requests, built against policy-api 0.2.0";
    type Config = Config;
    type Context = RouterContext;
    fn new(_: Config, ctx: &RouterContext) -> Result<Self, String> {
        Ok(Self { rng: policy_rng(ctx.seed) })
    }
}

impl RouterPolicy for PinnedLeastRequests {
    fn signals(&self) -> Vec<String> {
        vec![signals::OUTSTANDING_REQUESTS.into()]
    }
    fn route(&mut self, _: &Request<'_>, replicas: &Replicas<'_>) -> usize {
        // The negotiated signal, not the view's field: the signal table crosses too.
        argmin_random_tie((0..replicas.len()).map(|i| replicas.signal(i, 0)), &mut self.rng).expect("at least one replica")
    }
}

fn registry() -> Vec<Entry> {
    vec![router::<PinnedLeastRequests>()]
}

export_policies!(registry);
