//! `pd_random`: a prefill instance and a decode instance, each uniformly at random.
//!
//! Algorithm: `p ~ Uniform{0..P}`, `d ~ Uniform{0..D}`, independent of load and cache; never
//! skips the prefill pool. Parameters: none; the stream is seeded by the host.
//! Source: the random baseline of Mooncake's prefill-scheduling comparison (FAST'25 §7, "random").

use routelab_policy_api::*;

pub struct PdRandom {
    rng: PolicyRng,
}

impl Policy for PdRandom {
    const NAME: &'static str = "pd_random";
    const DESCRIPTION: &'static str = "disaggregated: uniformly random prefill and decode instances";
    type Config = crate::NoConfig;
    type Context = RouterContext;
    fn new(_: Self::Config, ctx: &RouterContext) -> Result<Self, String> {
        Ok(Self { rng: policy_rng(ctx.seed) })
    }
}

impl PdRouterPolicy for PdRandom {
    fn capabilities(&self) -> Capabilities {
        super::PD
    }
    fn route_pair(&mut self, _: &Request<'_>, prefill: &Replicas<'_>, decode: &Replicas<'_>) -> PdRoute {
        let p = self.rng.random_range(0..prefill.len());
        PdRoute::pair(p, self.rng.random_range(0..decode.len()))
    }
}
