//! `mooncake_early_reject`: Mooncake's early rejection on predicted load.
//!
//! Algorithm (Qin et al., "Mooncake: Trading More Storage for Less Computation — A
//! KVCache-centric Architecture for Serving LLM Chatbot", FAST'25, "Overload-oriented
//! scheduling": "Early Rejection" and "Early Rejection Based on Prediction" (§7 of arXiv
//! 2407.00079);
//! `FAST25-release/Mooncake-FAST25.pdf` in kvcache-ai/Mooncake — the Conductor's scheduler is
//! not open source, so the paper is the source): under overload, a request that would be
//! dropped after its prefill wastes that prefill, so the Conductor decides on arrival. It
//! predicts the decoding load *at the time the request would start decoding* and rejects
//! (HTTP 429) when that load exceeds the threshold. The paper's system-level prediction assumes
//! every request decodes for one uniform time `t_d`: requests that finish prefill before then
//! join the decoding load, requests that finish decoding before then leave it.
//!
//! routelab: on an aggregated cluster, prefill and decode share a replica; the prediction takes
//! the case where the request's wait is shorter than `t_d` (the overload the rule is for): every
//! request already on the replicas — running, or queued ahead of this one and so prefilled
//! before it — is still decoding when this one starts, so
//! `load = (Σ outstanding requests + 1) / (replicas × engine.max_batch_requests)` (the decode
//! slots; the context fact `engine.max_batch_requests`), and the request is rejected when
//! `load > threshold`. Mooncake rejects whatever the request; `protect_priority` (ours, off by
//! default) exempts requests whose class priority is at least it.
//!
//! Parameters (defaults): `threshold` 1.0 (a full decode batch on every replica; the paper does
//! not publish its threshold), `protect_priority` none.

use routelab_policy_api::{AdmissionContext, AdmissionDecision, AdmissionPolicy, Policy, Replicas, Request, facts};
use serde::{Deserialize, Serialize};

/// Threshold and exemption of [`EarlyReject`].
#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct EarlyRejectConfig {
    /// Reject when the predicted decode load (a fraction of the fleet's decode slots) is above this.
    pub threshold: f64,
    /// Requests whose class priority is at least this are never rejected (none: every class may be).
    pub protect_priority: Option<i64>,
}

impl Default for EarlyRejectConfig {
    fn default() -> Self {
        Self { threshold: 1.0, protect_priority: None }
    }
}

/// Mooncake's prediction-based early rejection (see the module documentation).
pub struct EarlyReject {
    config: EarlyRejectConfig,
    /// Decode slots of the fleet: replicas × most running requests per replica.
    slots: f64,
    rejected: u64,
}

impl Policy for EarlyReject {
    const NAME: &'static str = "mooncake_early_reject";
    const DESCRIPTION: &'static str =
        "Mooncake's early rejection: reject (429) on arrival when the predicted decode load exceeds a threshold";
    type Config = EarlyRejectConfig;
    type Context = AdmissionContext;
    fn new(config: EarlyRejectConfig, ctx: &AdmissionContext) -> Result<Self, String> {
        if !(config.threshold > 0.0 && config.threshold.is_finite()) {
            return Err(format!("threshold must be finite and > 0 (got {:?})", config.threshold));
        }
        let batch = ctx.fact(facts::context::ENGINE_MAX_BATCH_REQUESTS).ok_or_else(|| {
            format!("needs the context fact `{}` (a cluster world)", facts::context::ENGINE_MAX_BATCH_REQUESTS)
        })?;
        Ok(Self { config, slots: ctx.replicas.max(1) as f64 * batch.max(1.0), rejected: 0 })
    }
}

impl EarlyReject {
    /// The decode load predicted for a request arriving now.
    pub fn predicted_load(&self, replicas: &Replicas<'_>) -> f64 {
        (replicas.iter().map(|v| v.outstanding_requests as f64).sum::<f64>() + 1.0) / self.slots
    }
}

impl AdmissionPolicy for EarlyReject {
    fn request_facts(&self) -> Vec<String> {
        vec![facts::request::PRIORITY.into()]
    }

    fn on_arrival(&mut self, req: &Request<'_>, replicas: &Replicas<'_>) -> AdmissionDecision {
        let protected = self.config.protect_priority.is_some_and(|p| req.fact(0) >= p as f64);
        if !protected && self.predicted_load(replicas) > self.config.threshold {
            self.rejected += 1;
            return AdmissionDecision::reject();
        }
        AdmissionDecision::admit()
    }

    fn report(&self) -> Vec<(String, f64)> {
        vec![("rejected".into(), self.rejected as f64)]
    }
}

#[cfg(test)]
mod tests {
    use routelab_policy_api::{Fact, ReplicaView, World};

    use super::*;

    /// By hand: 2 replicas × 4 decode slots = 8. Outstanding 3 + 4: (7 + 1) / 8 = 1.0, not above
    /// the threshold 1 → admitted; 4 + 4: 9 / 8 = 1.125 → rejected, unless the request's
    /// priority (2) is at least `protect_priority` (1); priority 0 is not protected.
    #[test]
    fn early_reject_predicts_the_decode_load_by_hand() {
        let mut ctx = AdmissionContext::new(World::Cluster, 2, 1);
        ctx.facts.push(Fact::new(facts::context::ENGINE_MAX_BATCH_REQUESTS, 4.0));
        let config = EarlyRejectConfig { protect_priority: Some(1), ..EarlyRejectConfig::default() };
        let mut p = EarlyReject::new(config, &ctx).unwrap();
        let view = |n| ReplicaView { outstanding_requests: n, ..ReplicaView::default() };
        let (edge, over) = ([view(3), view(4)], [view(4), view(4)]);
        let mut at = |prio: f64, views: &[ReplicaView]| {
            let f = [prio];
            p.on_arrival(&Request::new(0, 0.0, 10).with_facts(&f), &Replicas::new(views))
        };
        assert_eq!(at(0.0, &edge), AdmissionDecision::admit());
        assert_eq!(at(0.0, &over), AdmissionDecision::reject());
        assert_eq!(at(2.0, &over), AdmissionDecision::admit());
        assert_eq!(at(1.0, &over), AdmissionDecision::admit());
        assert_eq!(p.report(), vec![("rejected".to_string(), 1.0)]);
        // Without the context fact the policy refuses to start.
        assert!(EarlyReject::new(EarlyRejectConfig::default(), &AdmissionContext::new(World::Cluster, 2, 1)).is_err());
    }
}
