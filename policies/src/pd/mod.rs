//! Routers for prefill/decode-disaggregated clusters: each answers `route_pair` with a
//! [`PdDecision`](routelab_policy_api::PdDecision) and sets `Capabilities::DISAGGREGATED`.
//!
//! Baselines: `pd_random`, `pd_round_robin`, `pd_least_loaded`. Composition: `pd_sglang`
//! (prefill and decode chosen independently by any two built-in routers).

pub mod pd_least_loaded;
pub mod pd_random;
pub mod pd_round_robin;
pub mod pd_sglang;

use routelab_policy_api::{Capabilities, ReplicaView};

/// What every PD router asks for.
pub const PD: Capabilities = Capabilities::DISAGGREGATED;

/// The index of the smallest `key`, lowest index on ties.
pub fn argmin_by<K: PartialOrd>(views: &[ReplicaView], key: impl Fn(&ReplicaView) -> K) -> usize {
    let mut best = 0;
    for i in 1..views.len() {
        if key(&views[i]) < key(&views[best]) {
            best = i;
        }
    }
    best
}
