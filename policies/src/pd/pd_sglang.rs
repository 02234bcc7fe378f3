//! `pd_sglang`: prefill and decode instances chosen independently, each by its own router — any
//! built-in router, with its config (`pd_sglang{prefill: sglang_cache_aware, decode: power_of_two}`).
//!
//! Algorithm: the prefill router routes over the prefill pool, the decode router over the decode
//! pool; neither sees the other's choice (there is no joint pairing), and the prefill pool is
//! never skipped. Each child is told about its own pool only: at creation (a context with its
//! pool's size, KV capacity and cost model, and a seed of its own), and after each decision —
//! `on_dispatch` with its own pick, `on_complete` when the request leaves its pool (the prefill
//! child at the end of the prefill, the decode child at the end of the request), `on_evict` for
//! its own instances. The engine signals asked for are the union of the children's; each child
//! sees its own columns in its own order. Figures are reported as `prefill_<name>` and
//! `decode_<name>`.
//! Parameters: `prefill`, `decode`: a router spec, `name` or `"name{key: value}"` (quote it in
//! YAML when it has braces); both default to `sglang_cache_aware` (SGLang's `--policy` default).
//! Source: SGLang router PD mode, `select_pd_pair` with `prefill_policy` / `decode_policy` both
//! defaulting to `--policy` (`sgl-router/src/routers/http/pd_router.rs`, PR #8395; smg 1.13.0
//! `src/routers/http/pd_router.rs`).

use routelab_policy_api::*;
use serde::{Deserialize, Serialize};

use super::Pools;

#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// The prefill pool's router: `name` or `name{key: value}`.
    pub prefill: String,
    /// The decode pool's router.
    pub decode: String,
}

impl Default for Config {
    fn default() -> Self {
        Self { prefill: "sglang_cache_aware".into(), decode: "sglang_cache_aware".into() }
    }
}

pub struct PdSglang {
    pools: Pools,
}

impl Policy for PdSglang {
    const NAME: &'static str = "pd_sglang";
    const DESCRIPTION: &'static str =
        "disaggregated: prefill and decode chosen independently by any two routers (SGLang PD)";
    type Config = Config;
    type Context = RouterContext;
    fn new(cfg: Config, ctx: &RouterContext) -> Result<Self, String> {
        Ok(Self { pools: Pools::new(&cfg.prefill, &cfg.decode, ctx)? })
    }
}

impl PdRouterPolicy for PdSglang {
    fn capabilities(&self) -> Capabilities {
        self.pools.capabilities()
    }
    fn signals(&self) -> Vec<String> {
        self.pools.signals()
    }
    fn route_pair(&mut self, request: &Request<'_>, prefill: &Replicas<'_>, decode: &Replicas<'_>) -> PdRoute {
        let p = self.pools.prefill.route(request, prefill);
        PdRoute::pair(p, self.pools.decode.route(request, decode))
    }
    forward_pool_hooks!();
    fn report(&self) -> Vec<(String, f64)> {
        self.pools.report()
    }
}
