//! `pd_least_loaded`: the least-loaded prefill instance and the least-loaded decode instance.
//!
//! Algorithm: prefill = argmin `outstanding_work` (remaining prefill tokens queued there: what
//! delays this prompt), decode = argmin `kv_used_tokens` (decode steps are bound by the KV they
//! read and admission by the KV left), lowest index on ties; never skips the prefill pool. When
//! the chosen prefill instance is a mixed one, it decodes the request too (no transfer: the
//! least outstanding work already counts its decode load).
//! Parameters: none. Source: the "load-balancing" prefill scheduling of Mooncake's comparison
//! (FAST'25 §7) and SGLang's old PD default of least load for decode (`sgl-router` before
//! PR #8395); the exact load figure is ours.

use routelab_policy_api::*;

use super::argmin_by;

pub struct PdLeastLoaded {
    pd: Option<PdContext>,
}

impl Policy for PdLeastLoaded {
    const NAME: &'static str = "pd_least_loaded";
    const DESCRIPTION: &'static str = "disaggregated: least outstanding work for prefill, least KV in use for decode";
    type Config = crate::NoConfig;
    type Context = RouterContext;
    fn new(_: Self::Config, ctx: &RouterContext) -> Result<Self, String> {
        Ok(Self { pd: ctx.disaggregation.clone().into_option() })
    }
}

impl PdRouterPolicy for PdLeastLoaded {
    fn capabilities(&self) -> Capabilities {
        super::PD
    }
    fn route_pair(&mut self, _: &Request<'_>, prefill: &Replicas<'_>, decode: &Replicas<'_>) -> PdRoute {
        let p = argmin_by(prefill, |v| v.outstanding_work);
        let local = self.pd.as_ref().and_then(|pd| pd.as_decode(p as u32));
        PdRoute::pair(p, local.map_or_else(|| argmin_by(decode, |v| v.kv_used_tokens), |d| d as usize))
    }
    /// Crashes and restarts: the pools' counts follow, so a mixed instance stays paired.
    fn on_pool_change(&mut self, pool: PdPool, change: &ReplicaChange) {
        if let Some(pd) = self.pd.as_mut() {
            pd.apply_pool_change(pool, change);
        }
    }
    fn on_mixed_change(&mut self, prefill: &ReplicaChange, _: &ReplicaChange) {
        if let Some(pd) = self.pd.as_mut() {
            pd.apply_mixed_change(prefill);
        }
    }
}
