//! `pd_dynamo`: NVIDIA Dynamo's disaggregated routing — prefill by Dynamo's KV cost, then decode
//! by decode-block load, with optional conditional disaggregation (`isl_bounding`).
//!
//! Algorithm (per request):
//! 1. Prefill: the `prefill` router (default `dynamo_kv`: `cost = max(prefill_blocks − overlap, 0)
//!    + decode_blocks`, lowest cost, ties at random) over the prefill pool.
//! 2. Decode: the `decode` router over the decode pool, `dynamo_kv{role: decode}` (no prefill
//!    tracking). Without conditional disaggregation its credit is 0 (cost = the worker's active
//!    KV blocks plus this request's: pure decode-block load, as Dynamo's decode router is forced
//!    to credit 0). With it the credit stays at its default 1.0, as upstream leaves it: cost =
//!    `max(0, decode_blocks − 1.0 · overlap)`, so cache-hot decode workers win — the ones the
//!    bypass below can serve without the prefill pool.
//! 3. Conditional disaggregation (`conditional_disagg`, off by default as upstream): with
//!    `eff_isl = prompt − cached on the chosen decode worker`, skip the prefill pool (the decode
//!    worker prefills) iff `eff_isl < eff_isl_threshold ∧ eff_isl / prompt < eff_isl_ratio_threshold`.
//!
//! Parameters (defaults): `prefill` `dynamo_kv`, `decode` (unset: [`DECODE`], or
//! [`DECODE_CONDITIONAL`] with `conditional_disagg`; any built-in router spec),
//! `conditional_disagg` false, `eff_isl_threshold` 2048, `eff_isl_ratio_threshold` 0.7.
//!
//! Source: crate `dynamo-kv-router` 1.6.1 (crates.io), paths inside it:
//! `src/conditional_disagg.rs` (`IslBoundingPolicy`: `DEFAULT_CONDITIONAL_DISAGG_EFF_ISL_THRESHOLD`
//! 2048, `..._RATIO_THRESHOLD` 0.7, l. 63–67 `net_new_tokens = prompt − min(decode_chosen_cached,
//! prompt)`, bypass iff `eff < 2048 ∧ eff/max(prompt,1) < 0.7`), `src/scheduling/config.rs`
//! (`conditional_disagg_enabled: false`), `src/scheduling/selector/reference.rs` l. 336–363 (the
//! decode router's formula: "Decode routers normally force `overlap_score_credit=0` … When
//! conditional disagg leaves a positive overlap credit in place, prefer cache-hot decode workers
//! while still charging decode backlog": `max(0, decode_blocks − overlap_credit_blocks)`);
//! ai-dynamo/dynamo `docs/components/router/router-disaggregated-serving.md` (prefill router with
//! the KV cost, then the decode router). `testing/dynamo-diff` checks the decode formula and the
//! bypass rule against the crate.
//!
//! Deviations: the decode worker's cached tokens for the bypass are the host's exact match on
//! that instance (cached or being computed), where Dynamo reads its KV-event index;
//! `assume_kv_reuse: false` on the decode router is not modelled (its blocks stay de-duplicated
//! by hash); the `prefill_load` and `isl_or_load` policies are not offered.

use routelab_policy_api::*;
use serde::{Deserialize, Serialize};

use super::Pools;

#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub prefill: String,
    /// Unset: [`DECODE`], or [`DECODE_CONDITIONAL`] with `conditional_disagg`.
    pub decode: Option<String>,
    pub conditional_disagg: bool,
    pub eff_isl_threshold: u32,
    pub eff_isl_ratio_threshold: f64,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            prefill: "dynamo_kv".into(),
            decode: None,
            conditional_disagg: false,
            eff_isl_threshold: 2048,
            eff_isl_ratio_threshold: 0.7,
        }
    }
}

/// The decode pool's router: load only (upstream's decode router runs with credit 0).
pub const DECODE: &str = "dynamo_kv{role: decode, overlap_score_credit: 0}";
/// With conditional disaggregation upstream leaves the overlap credit in place on the decode
/// pool, which then prefers cache-hot decode workers: `max(0, decode_blocks − 1 · overlap)`.
pub const DECODE_CONDITIONAL: &str = "dynamo_kv{role: decode}";

pub struct PdDynamo {
    pools: Pools,
    cfg: Config,
    bypassed: u64,
}

/// Dynamo's `IslBoundingPolicy::should_bypass_remote_prefill`.
pub fn isl_bounding(prompt: u32, decode_cached: u32, eff_isl_threshold: u32, ratio_threshold: f64) -> bool {
    let eff = prompt - decode_cached.min(prompt);
    eff < eff_isl_threshold && (eff as f64 / prompt.max(1) as f64) < ratio_threshold
}

impl Policy for PdDynamo {
    const NAME: &'static str = "pd_dynamo";
    const DESCRIPTION: &'static str =
        "disaggregated (Dynamo): prefill by KV cost, decode by block load, optional isl_bounding bypass";
    type Config = Config;
    type Context = RouterContext;
    fn new(cfg: Config, ctx: &RouterContext) -> Result<Self, String> {
        if !(cfg.eff_isl_ratio_threshold >= 0.0 && cfg.eff_isl_ratio_threshold <= 1.0) {
            return Err(format!("eff_isl_ratio_threshold must be in [0, 1] (got {})", cfg.eff_isl_ratio_threshold));
        }
        let default_decode = if cfg.conditional_disagg { DECODE_CONDITIONAL } else { DECODE };
        let decode = cfg.decode.as_deref().unwrap_or(default_decode);
        Ok(Self { pools: Pools::new(&cfg.prefill, decode, ctx)?, cfg, bypassed: 0 })
    }
}

impl PdRouterPolicy for PdDynamo {
    fn capabilities(&self) -> Capabilities {
        let exact = if self.cfg.conditional_disagg { Capabilities::NEEDS_EXACT_MATCH } else { Capabilities::NONE };
        self.pools.capabilities() | exact
    }
    fn signals(&self) -> Vec<String> {
        self.pools.signals()
    }
    fn route_pair(&mut self, request: &Request<'_>, prefill: &Replicas<'_>, decode: &Replicas<'_>) -> PdRoute {
        let p = self.pools.prefill.route(request, prefill);
        let d = self.pools.decode.route(request, decode);
        let c = &self.cfg;
        if c.conditional_disagg
            && isl_bounding(
                request.prompt_tokens,
                decode[d].matched_tokens,
                c.eff_isl_threshold,
                c.eff_isl_ratio_threshold,
            )
        {
            self.bypassed += 1;
            return PdRoute::DecodeOnly { decode: d };
        }
        PdRoute::pair(p, d)
    }
    forward_pool_hooks!();
    fn report(&self) -> Vec<(String, f64)> {
        let mut r = self.pools.report();
        r.push(("bypassed_prefill".into(), self.bypassed as f64));
        r
    }
}
