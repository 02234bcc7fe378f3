//! Admission policies (policy-api 0.5.2): before routing, admit, hold, reject or shed.
//!
//! - [`AdmitAll`] (`admit_all`, the default): admits every request on arrival — what routelab
//!   did before admission existed, decision for decision.
//! - [`GieSaturation`] (`gie_saturation`): the Gateway API Inference Extension's saturation
//!   detector and its admission check.
//! - [`TokenBucket`] (`token_bucket`): a per-tenant rate limit, Envoy's token bucket.
//! - [`vtc::Vtc`] (`vtc`): virtual token counter fairness between tenants (the VTC paper's
//!   queue, as AIBrix and the inference extension's flow control use it).
//! - [`flow_control::FlowControl`] (`llm_d_flow_control`): llm-d's Flow Control — a queue per
//!   flow (tenant × priority), strict priority bands, round-robin or strict fairness in a band.
//! - [`early_reject::EarlyReject`] (`mooncake_early_reject`): Mooncake's early rejection on
//!   predicted load.
//!
//! The two queueing policies (`vtc`, `llm_d_flow_control`) hold while the pool is saturated by
//! the inference extension's detector ([`saturated`], shared with `gie_saturation`) and no
//! replica is idle ([`dispatch_paused`]), and release when it is not; the host asks them
//! (`next`) whenever a replica's step ends.

use routelab_policy_api::{
    AdmissionContext, AdmissionDecision, AdmissionPolicy, Policy, Replicas, Request, facts::request,
};
use serde::{Deserialize, Serialize};

use crate::NoConfig;

pub mod early_reject;
pub mod flow_control;
pub mod vtc;

/// The inference extension's saturation detector: no replica has "good capacity", a replica
/// having it when its waiting queue is at most `queue_depth` and its KV utilisation at most
/// `kv_util` (both comparisons strict to fail; see [`GieSaturation`] for the source).
pub fn saturated(replicas: &Replicas<'_>, queue_depth: u32, kv_util: f64) -> bool {
    !replicas.iter().any(|v| {
        let kv = if v.kv_capacity_tokens == 0 { 0.0 } else { v.kv_used_tokens as f64 / v.kv_capacity_tokens as f64 };
        v.waiting <= queue_depth && kv <= kv_util
    })
}

/// Whether a queueing policy must hold back: the pool is [`saturated`] and no replica is idle.
/// The views' `kv_used_tokens` are what vLLM reports as `kv_cache_usage_perc` (blocks running
/// requests hold; prefix-cached blocks no request uses are free), as the detector reads it
/// upstream: the host fills admission views so (`core/src/sim/cluster/slots.rs`,
/// `admission_views`). An idle replica always has capacity (else a full idle cache would pause
/// dispatch for ever); while dispatch is paused some replica is busy, so a step will end and the
/// host will ask again.
pub fn dispatch_paused(replicas: &Replicas<'_>, queue_depth: u32, kv_util: f64) -> bool {
    saturated(replicas, queue_depth, kv_util) && replicas.iter().all(|v| v.outstanding_requests > 0)
}

/// Checks a KV utilisation threshold (the detector's second parameter).
pub(crate) fn check_kv_threshold(kv: f64) -> Result<(), String> {
    if kv > 0.0 && kv <= 1.0 {
        Ok(())
    } else {
        Err(format!("kv_cache_util_threshold must be in (0, 1] (got {kv:?}); upstream's default is 0.8"))
    }
}

/// Admits every request on arrival.
pub struct AdmitAll;

impl Policy for AdmitAll {
    const NAME: &'static str = "admit_all";
    const DESCRIPTION: &'static str = "admit every request on arrival (no admission control; the default)";
    type Config = NoConfig;
    type Context = AdmissionContext;
    fn new(_: NoConfig, _: &AdmissionContext) -> Result<Self, String> {
        Ok(AdmitAll)
    }
}

impl AdmissionPolicy for AdmitAll {
    fn on_arrival(&mut self, _: &Request<'_>, _: &Replicas<'_>) -> AdmissionDecision {
        AdmissionDecision::admit()
    }
}

/// The Gateway API Inference Extension's saturation detector and admission check.
///
/// Upstream (kubernetes-sigs/gateway-api-inference-extension, commit
/// 45e59d012825971008b10dd3492744f516e434f5, `pkg/epp/saturationdetector/saturationdetector.go`,
/// `IsSaturated`; defaults in `pkg/epp/saturationdetector/config.go`; the check in
/// `pkg/epp/requestcontrol/director.go`, `admitRequest`): the pool is *saturated* when no pod has
/// "good capacity", a pod having it when its metrics are fresh, its waiting queue is at most
/// `queue_depth_threshold` (default 5, `DefaultQueueThresholdCritical`) and its KV cache
/// utilisation at most `kv_cache_util_threshold` (default 0.8, `DefaultKVCacheThreshold`); both
/// comparisons are `>` to fail, so a value equal to the threshold still has capacity. A request
/// with priority ≥ 0 bypasses the check; a sheddable one (priority < 0) is dropped with 429
/// ("system saturated, sheddable request dropped") when the pool is saturated — here: shed.
///
/// routelab: the views are live (the host's metrics, not a scrape), so no pod is ever stale; the
/// priority is the request fact `priority` (the request's class's, `cluster.classes`).
pub struct GieSaturation {
    config: GieConfig,
    shed: u64,
    saturated_arrivals: u64,
}

/// Thresholds of [`GieSaturation`].
#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct GieConfig {
    /// A pod with more waiting requests than this has no capacity (upstream default 5).
    pub queue_depth_threshold: u32,
    /// A pod with a KV utilisation (0..1) above this has no capacity (upstream default 0.8).
    pub kv_cache_util_threshold: f64,
}

impl Default for GieConfig {
    fn default() -> Self {
        Self { queue_depth_threshold: 5, kv_cache_util_threshold: 0.8 }
    }
}

impl GieSaturation {
    /// Whether no replica has good capacity.
    pub fn saturated(&self, replicas: &Replicas<'_>) -> bool {
        saturated(replicas, self.config.queue_depth_threshold, self.config.kv_cache_util_threshold)
    }
}

impl Policy for GieSaturation {
    const NAME: &'static str = "gie_saturation";
    const DESCRIPTION: &'static str =
        "Gateway API Inference Extension: shed sheddable (priority < 0) requests while no replica has capacity";
    type Config = GieConfig;
    type Context = AdmissionContext;
    fn new(config: GieConfig, _: &AdmissionContext) -> Result<Self, String> {
        check_kv_threshold(config.kv_cache_util_threshold)?;
        Ok(Self { config, shed: 0, saturated_arrivals: 0 })
    }
}

impl AdmissionPolicy for GieSaturation {
    fn request_facts(&self) -> Vec<String> {
        vec![request::PRIORITY.into()]
    }
    fn on_arrival(&mut self, req: &Request<'_>, replicas: &Replicas<'_>) -> AdmissionDecision {
        if req.fact(0) >= 0.0 {
            return AdmissionDecision::admit();
        }
        if self.saturated(replicas) {
            self.saturated_arrivals += 1;
            self.shed += 1;
            return AdmissionDecision::shed();
        }
        AdmissionDecision::admit()
    }
    fn report(&self) -> Vec<(String, f64)> {
        vec![("shed".into(), self.shed as f64)]
    }
}

/// A per-tenant rate limit: one token bucket per tenant, one token per request, 429 when empty.
///
/// Upstream (envoyproxy/envoy, commit 489c52decd5ad3683aa3162e0ee548a19a536083,
/// `source/common/common/token_bucket_impl.cc`, `TokenBucketImpl::consume`): a bucket starts
/// full (`max_tokens`); on each request, *if it is not full*, it refills by the time since the
/// last refill × `fill_rate` (capped at `max_tokens`) and the refill time moves to now; then the
/// request takes one token, or is refused when less than one is left. Upstream's quirk is kept:
/// a full bucket does not move its refill time, so the first refill after it was last full counts
/// from the last refill before that.
///
/// routelab: a bucket per tenant (the request fact `tenant`), `rate_rps` tokens per second of
/// simulated time and `burst` tokens at most; each tenant's rate is `rate_rps` × its weight
/// share when `weighted` (weights from `cluster.tenants` are not told to policies, so this is
/// off by default and all tenants get `rate_rps`).
pub struct TokenBucket {
    config: BucketConfig,
    /// Per tenant: tokens, last refill time.
    buckets: Vec<(f64, f64)>,
    rejected: u64,
}

/// Rate and burst of [`TokenBucket`].
#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct BucketConfig {
    /// Tokens (requests) per second each tenant's bucket refills by.
    pub rate_rps: f64,
    /// Most tokens a bucket holds (it starts full).
    pub burst: f64,
}

impl Default for BucketConfig {
    fn default() -> Self {
        Self { rate_rps: 1.0, burst: 10.0 }
    }
}

impl Policy for TokenBucket {
    const NAME: &'static str = "token_bucket";
    const DESCRIPTION: &'static str =
        "per-tenant rate limit (Envoy's token bucket): reject (429) a tenant's request when its bucket is empty";
    type Config = BucketConfig;
    type Context = AdmissionContext;
    fn new(config: BucketConfig, ctx: &AdmissionContext) -> Result<Self, String> {
        if !(config.rate_rps > 0.0 && config.rate_rps.is_finite() && config.burst >= 1.0 && config.burst.is_finite()) {
            return Err(format!(
                "needs rate_rps > 0 and burst ≥ 1 (got rate_rps {:?}, burst {:?})",
                config.rate_rps, config.burst
            ));
        }
        let tenants = ctx.fact(routelab_policy_api::facts::context::TENANTS_COUNT).unwrap_or(1.0).max(1.0) as usize;
        Ok(Self { buckets: vec![(config.burst, 0.0); tenants], config, rejected: 0 })
    }
}

impl TokenBucket {
    /// Envoy's `consume(1)` on `tenant`'s bucket at `now`.
    fn consume(&mut self, tenant: usize, now: f64) -> bool {
        if tenant >= self.buckets.len() {
            self.buckets.resize(tenant + 1, (self.config.burst, 0.0));
        }
        let (max, rate) = (self.config.burst, self.config.rate_rps);
        let (tokens, last) = &mut self.buckets[tenant];
        if *tokens < max {
            *tokens = ((now - *last) * rate + *tokens).min(max);
            *last = now;
        }
        if *tokens < 1.0 {
            return false;
        }
        *tokens -= 1.0;
        true
    }
}

impl AdmissionPolicy for TokenBucket {
    fn request_facts(&self) -> Vec<String> {
        vec![request::TENANT.into()]
    }
    fn on_arrival(&mut self, req: &Request<'_>, _: &Replicas<'_>) -> AdmissionDecision {
        if self.consume(req.fact(0) as usize, req.arrived_at) {
            AdmissionDecision::admit()
        } else {
            self.rejected += 1;
            AdmissionDecision::reject()
        }
    }
    fn report(&self) -> Vec<(String, f64)> {
        vec![("rejected".into(), self.rejected as f64)]
    }
}

#[cfg(test)]
mod tests {
    use routelab_policy_api::{ReplicaView, World};

    use super::*;

    fn view(waiting: u32, kv_used: u64) -> ReplicaView {
        ReplicaView { waiting, kv_used_tokens: kv_used, kv_capacity_tokens: 1000, ..ReplicaView::default() }
    }

    /// By hand: replica 0 has 6 waiting (> 5: no capacity), replica 1 has 810/1000 KV (> 0.8: no
    /// capacity) → saturated, so a priority −1 request is shed and a priority 0 one admitted.
    /// Replica 1 at exactly 800/1000 and 5 waiting has capacity (the comparisons are strict).
    #[test]
    fn gie_sheds_only_sheddable_requests_and_only_when_every_replica_is_full() {
        let ctx = AdmissionContext::new(World::Cluster, 2, 1);
        let mut p = GieSaturation::new(GieConfig::default(), &ctx).unwrap();
        let full = [view(6, 0), view(0, 810)];
        let req = |prio: f64| (Request::new(0, 0.0, 10), [prio]);
        let (r, f) = req(-1.0);
        assert_eq!(p.on_arrival(&r.with_facts(&f), &Replicas::new(&full)), AdmissionDecision::shed());
        let (r, f) = req(0.0);
        assert_eq!(p.on_arrival(&r.with_facts(&f), &Replicas::new(&full)), AdmissionDecision::admit());
        let edge = [view(6, 0), view(5, 800)];
        let (r, f) = req(-1.0);
        assert_eq!(p.on_arrival(&r.with_facts(&f), &Replicas::new(&edge)), AdmissionDecision::admit());
        assert_eq!(p.report(), vec![("shed".to_string(), 1.0)]);
    }

    /// By hand, rate 1/s, burst 2, one tenant: t=0 takes 2 → 1 (full: no refill), t=0 takes
    /// 1 → 0, t=0.5 refills 0.5 (since the last refill at 0) → 0.5 < 1: rejected; t=1.0 refills
    /// 0.5 → 1.0, taken → 0; tenant 1's bucket is its own (full).
    #[test]
    fn token_bucket_follows_envoys_consume() {
        let mut ctx = AdmissionContext::new(World::Cluster, 1, 1);
        ctx.facts.push(routelab_policy_api::Fact::new(routelab_policy_api::facts::context::TENANTS_COUNT, 2.0));
        let mut p = TokenBucket::new(BucketConfig { rate_rps: 1.0, burst: 2.0 }, &ctx).unwrap();
        let none: [ReplicaView; 0] = [];
        let mut at = |t: f64, tenant: f64| {
            let f = [tenant];
            p.on_arrival(&Request::new(0, t, 1).with_facts(&f), &Replicas::new(&none)).action
        };
        assert_eq!(at(0.0, 0.0), AdmissionDecision::ADMIT);
        assert_eq!(at(0.0, 0.0), AdmissionDecision::ADMIT);
        assert_eq!(at(0.5, 0.0), AdmissionDecision::REJECT);
        assert_eq!(at(1.0, 0.0), AdmissionDecision::ADMIT);
        assert_eq!(at(1.0, 0.0), AdmissionDecision::REJECT);
        assert_eq!(at(1.0, 1.0), AdmissionDecision::ADMIT);
    }
}
