//! `pd_llm_d`: llm-d's disaggregated scheduling — decode first, then the prefix-based P/D
//! decider, then prefill.
//!
//! Algorithm (per request):
//! 1. Decode: the `decode` router (default `llm_d`, the default profile: queue 2, KV cache 2,
//!    prefix 3, max-score picker) over the decode pool.
//! 2. Decider (`prefix-based-pd-decider`): `non_cached = prompt − matched_blocks · block_tokens`
//!    on the chosen decode instance; disaggregate iff `threshold > 0 ∧ non_cached ≥ threshold`,
//!    otherwise the decode instance prefills the request itself.
//! 3. Prefill (only when disaggregating): the `prefill` router (default `llm_d{queue_weight: 1,
//!    kv_cache_weight: 0, prefix_weight: 2}`: the prefill profile's prefix 2 + queue 1) over the
//!    prefill pool.
//!
//! Parameters (defaults): `decode` `llm_d`, `prefill` `llm_d{queue_weight: 1, kv_cache_weight: 0,
//! prefix_weight: 2}`, `threshold` 16 tokens (`deploy/config/pd-epp-config.yaml`; the code's
//! default 0 never disaggregates), `block_tokens` 16.
//!
//! Source: llm-d/llm-d-inference-scheduler @ 520af478,
//! `pkg/epp/framework/plugins/scheduling/profilehandler/disagg/{disagg_profile_handler,
//! prefix_based_pd_decider}.go` (decode profile first; `nonCachedTokens = chars/4 −
//! matchBlocks·blockSize`; `threshold > 0 && nonCached >= threshold`), `deploy/config/
//! pd-epp-config.yaml` (threshold 16; prefill profile prefix 2 + queue 1).
//!
//! Deviations: the decode instance's matched blocks are the host's exact match (cached or being
//! computed there) in whole `block_tokens` blocks, where llm-d reads its prefix scorer's
//! (approximate, character-hashed) index; prompt length is in tokens, not characters / 4.

use routelab_policy_api::*;
use serde::{Deserialize, Serialize};

use super::Pools;

#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub decode: String,
    pub prefill: String,
    pub threshold: u32,
    pub block_tokens: u32,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            decode: "llm_d".into(),
            prefill: "llm_d{queue_weight: 1, kv_cache_weight: 0, prefix_weight: 2}".into(),
            threshold: 16,
            block_tokens: 16,
        }
    }
}

/// llm-d's `prefix-based-pd-decider`: whether to run a remote prefill.
pub fn disaggregate(prompt: u32, decode_matched: u32, block_tokens: u32, threshold: u32) -> bool {
    let non_cached = prompt.saturating_sub(decode_matched / block_tokens * block_tokens);
    threshold > 0 && non_cached >= threshold
}

pub struct PdLlmD {
    pools: Pools,
    cfg: Config,
    local_prefills: u64,
}

impl Policy for PdLlmD {
    const NAME: &'static str = "pd_llm_d";
    const DESCRIPTION: &'static str = "disaggregated (llm-d): decode first, prefix-based P/D decider, then prefill";
    type Config = Config;
    type Context = RouterContext;
    fn new(cfg: Config, ctx: &RouterContext) -> Result<Self, String> {
        if cfg.block_tokens == 0 {
            return Err("block_tokens must be at least 1".into());
        }
        Ok(Self { pools: Pools::new(&cfg.prefill, &cfg.decode, ctx)?, cfg, local_prefills: 0 })
    }
}

impl PdRouterPolicy for PdLlmD {
    fn capabilities(&self) -> Capabilities {
        self.pools.capabilities() | Capabilities::NEEDS_EXACT_MATCH
    }
    fn signals(&self) -> Vec<String> {
        self.pools.signals()
    }
    fn route_pair(&mut self, request: &Request<'_>, prefill: &Replicas<'_>, decode: &Replicas<'_>) -> PdRoute {
        let d = self.pools.decode.route(request, decode);
        if !disaggregate(request.prompt_tokens, decode[d].matched_tokens, self.cfg.block_tokens, self.cfg.threshold) {
            self.local_prefills += 1;
            return PdRoute::DecodeOnly { decode: d };
        }
        let p = self.pools.prefill.route(request, prefill);
        PdRoute::pair(p, d)
    }
    forward_pool_hooks!();
    fn report(&self) -> Vec<(String, f64)> {
        let mut r = self.pools.report();
        r.push(("local_prefills".into(), self.local_prefills as f64));
        r
    }
}
