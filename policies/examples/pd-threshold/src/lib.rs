//! `pd_threshold`: an example prefill/decode-disaggregation router, written only against
//! routelab-policy-api (build it with `cargo build --release`, load it with
//! `routelab compare WORKLOAD --policies ./target/release/libpd_threshold.so:pd_threshold`).
//!
//! Algorithm (decode first, then a decider, as llm-d orders it):
//! 1. decode instance = the one with the most KV free (lowest index on ties);
//! 2. if the prompt tokens it does *not* hold (`prompt − matched_tokens`) are fewer than
//!    `threshold`, skip the prefill pool: the decode instance prefills the request itself;
//! 3. otherwise prefill on the instance with the longest prefix match, fewest outstanding
//!    requests on ties.
//!
//! Parameters: `threshold` (tokens, default 256; 0 = always disaggregate).

use routelab_policy_api::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Uncached prompt tokens below which the prefill pool is skipped.
    pub threshold: u32,
}

impl Default for Config {
    fn default() -> Self {
        Self { threshold: 256 }
    }
}

pub struct PdThreshold {
    threshold: u32,
    skipped: u64,
}

impl Policy for PdThreshold {
    const NAME: &'static str = "pd_threshold";
    const DESCRIPTION: &'static str = "example PD router: decode by free KV, skip prefill when little is uncached";
    type Config = Config;
    type Context = RouterContext;
    fn new(config: Config, ctx: &RouterContext) -> Result<Self, String> {
        if ctx.disaggregation.is_none() {
            return Err("pd_threshold needs a disaggregated cluster (a `disaggregation:` section)".into());
        }
        Ok(Self { threshold: config.threshold, skipped: 0 })
    }
}

impl PdRouterPolicy for PdThreshold {
    fn capabilities(&self) -> Capabilities {
        Capabilities::NEEDS_EXACT_MATCH
    }

    fn route_pair(&mut self, request: &Request<'_>, prefill: &Replicas<'_>, decode: &Replicas<'_>) -> PdRoute {
        let free = |v: &ReplicaView| v.kv_capacity_tokens.saturating_sub(v.kv_used_tokens);
        let d = (0..decode.len()).max_by_key(|&i| (free(&decode[i]), std::cmp::Reverse(i))).unwrap_or(0);
        let uncached = request.prompt_tokens.saturating_sub(decode[d].matched_tokens);
        if uncached < self.threshold {
            self.skipped += 1;
            return PdRoute::DecodeOnly { decode: d };
        }
        let p = (0..prefill.len())
            .min_by_key(|&i| (std::cmp::Reverse(prefill[i].matched_tokens), prefill[i].outstanding_requests, i))
            .unwrap_or(0);
        PdRoute::pair(p, d)
    }

    fn report(&self) -> Vec<(String, f64)> {
        vec![("skipped_prefill".into(), self.skipped as f64)]
    }
}

/// The policies this library exports.
pub fn registry() -> Vec<Entry> {
    vec![pd_router::<PdThreshold>()]
}

export_policies!(registry);
