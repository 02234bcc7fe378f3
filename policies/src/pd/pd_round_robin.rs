//! `pd_round_robin`: prefill and decode instances in turn, each pool with its own counter.
//!
//! Algorithm: request k goes to prefill `k mod P` and decode `k mod D`. Parameters: none.
//! Source: vLLM production-stack `disaggregated_prefill_orchestrated` (round robin over P and D
//! separately), `src/vllm_router/routers/routing_logic.py` @a6c01db0.

use routelab_policy_api::*;

pub struct PdRoundRobin {
    next_prefill: usize,
    next_decode: usize,
}

impl Policy for PdRoundRobin {
    const NAME: &'static str = "pd_round_robin";
    const DESCRIPTION: &'static str = "disaggregated: round robin over the prefill and the decode pool separately";
    type Config = crate::NoConfig;
    type Context = RouterContext;
    fn new(_: Self::Config, _: &RouterContext) -> Result<Self, String> {
        Ok(Self { next_prefill: 0, next_decode: 0 })
    }
}

impl PdRouterPolicy for PdRoundRobin {
    fn capabilities(&self) -> Capabilities {
        super::PD
    }
    fn route_pair(&mut self, _: &Request<'_>, prefill: &Replicas<'_>, decode: &Replicas<'_>) -> PdRoute {
        let d = PdRoute::pair(self.next_prefill % prefill.len(), self.next_decode % decode.len());
        self.next_prefill = self.next_prefill.wrapping_add(1);
        self.next_decode = self.next_decode.wrapping_add(1);
        d
    }
}
