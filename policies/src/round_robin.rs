//! `round_robin`: send requests to replicas in cyclic order 0, 1, …, N−1, 0, ….
//!
//! Algorithm: a counter advanced by one per dispatch, modulo N.
//! Parameters: none.
//! Source: the default of most load balancers (nginx, Envoy, the SGLang router's `round_robin`).
//! It evens out counts, not work: with variable sizes or prefix caches it is blind.

use routelab_policy_api::*;

pub struct RoundRobin {
    next: usize,
}

impl Policy for RoundRobin {
    const NAME: &'static str = "round_robin";
    const DESCRIPTION: &'static str = "cyclic order, blind to load";
    type Config = crate::NoConfig;
    type Context = RouterContext;
    fn new(_: Self::Config, _: &RouterContext) -> Result<Self, String> {
        Ok(Self { next: 0 })
    }
}

impl RouterPolicy for RoundRobin {
    fn route(&mut self, _: &Request<'_>, replicas: &Replicas<'_>) -> usize {
        let i = if self.next >= replicas.len() { 0 } else { self.next };
        self.next = i + 1;
        i
    }
}
