//! `random`: send each request to a replica chosen uniformly at random.
//!
//! Algorithm: `i ~ Uniform{0..N}` per request, independent of load.
//! Parameters: none. The random stream is seeded by the host (`RouterContext::seed`).
//! Source: the classic baseline; with Poisson arrivals and exponential service it turns N servers
//! into N independent M/M/1 queues (mean response 1/(1−ρ)); in balls-into-bins its maximum load
//! grows like ln n / ln ln n (Gonnet 1981; Mitzenmacher, Richa, Sitaraman 2001).

use rand::RngExt;
use routelab_policy_api::*;

pub struct Random {
    rng: PolicyRng,
}

impl Policy for Random {
    const NAME: &'static str = "random";
    const DESCRIPTION: &'static str = "uniformly random replica";
    type Config = crate::NoConfig;
    type Context = RouterContext;
    fn new(_: Self::Config, ctx: &RouterContext) -> Result<Self, String> {
        Ok(Self { rng: policy_rng(ctx.seed) })
    }
}

impl RouterPolicy for Random {
    fn route(&mut self, _: &Request<'_>, replicas: &Replicas<'_>) -> usize {
        self.rng.random_range(0..replicas.len())
    }
}
