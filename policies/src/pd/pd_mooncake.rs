//! `pd_mooncake`: Mooncake's Conductor (FAST'25, Algorithm 1) — prefill by estimated TTFT with
//! global cache awareness and hot-prefix migration, decode by load, SLO admission.
//!
//! Algorithm (per request of `len` prompt tokens; `prefix_len_i` = the prompt's prefix cached,
//! or being computed, on prefill instance i — in its GPU memory, continued in its CPU tier when
//! the cluster has `kv_tiers` (the engine signal `tier.cpu.matched_tokens`): Mooncake's prefix
//! cache is each node's DRAM, which the prefill streams back layer by layer):
//! 1. `best_len, best` = the longest `prefix_len` over the prefill pool.
//! 2. For each prefill instance i:
//!    - if `best_len / prefix_len_i > balancing_threshold` (global cache awareness): `prefix =
//!      best_len`, `T_xfer = base + (best_len − prefix_len_i) · kv_bytes / bandwidth`;
//!    - otherwise `prefix = prefix_len_i`, `T_xfer = 0`;
//!    - `TTFT_i = T_xfer + T_queue(i) + T_prefill(len, prefix)`, with `T_prefill` = the prefill
//!      pool's step-time model for `len − prefix` new tokens after `prefix` cached ones, and
//!      `T_queue(i)` = that model for i's outstanding work (its queued prefill tokens) in one go.
//! 3. `p = argmin TTFT_i` (lowest index on ties).
//! 4. Decode: the instance with the least KV in use; `TBT` = the decode step time of its batch
//!    with this request added (`running + 1` sequences over `kv_used + len` tokens of context).
//! 5. If `TTFT_p > ttft_slo_s` or `TBT > tbt_slo_s`: reject (counted as `rejected`).
//! 6. Otherwise, if p's prefix came from `best`, migrate: the prefix is copied from `best` to p
//!    before the prefill (`PdRoute::Disaggregate::prefix_from`), replicating the hot prefix.
//!
//! `scheduling` reproduces the paper's prefill-scheduling comparison (§7, Fig. "prefill
//! scheduling"): `global_cache_aware` (the algorithm above), `local_cache_aware` (step 2 without
//! migration: `prefix = prefix_len_i`), `load_balance` (argmin `T_queue`), `random`. Every mode
//! keeps steps 4–5.
//!
//! Parameters (defaults): `scheduling` global_cache_aware, `balancing_threshold` 2.0 (the paper
//! sets it by hand and does not publish it: ours), `ttft_slo_s` 30, `tbt_slo_s` 0.1 (ours; the
//! paper's SLOs are relative to a baseline).
//! Source: Ruan et al., "Mooncake: A KVCache-centric Architecture for LLM Serving", FAST'25,
//! Algorithm 1 (`FAST25-release/Mooncake-FAST25.pdf` in kvcache-ai/Mooncake); the open-source
//! Conductor (`docs/source/design/conductor/conductor-architecture-design.md`) only indexes
//! prefixes, the scheduler is not open.
//!
//! Deviations: `T_prefill` and `T_queue` come from the roofline cost model rather than a
//! regression on profiled data; KV is not streamed layer by layer; the prefix match is the host's
//! exact one, where Mooncake's Conductor reads KV events; a CPU-tier hit counts as cached in the
//! estimate (its load time, which the host charges, is not in `T_prefill`).

use routelab_policy_api::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Scheduling {
    GlobalCacheAware,
    LocalCacheAware,
    LoadBalance,
    Random,
}

#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub scheduling: Scheduling,
    pub balancing_threshold: f64,
    pub ttft_slo_s: f64,
    pub tbt_slo_s: f64,
}

impl Default for Config {
    fn default() -> Self {
        Self { scheduling: Scheduling::GlobalCacheAware, balancing_threshold: 2.0, ttft_slo_s: 30.0, tbt_slo_s: 0.1 }
    }
}

pub struct PdMooncake {
    cfg: Config,
    prefill_cost: CostModel,
    decode_cost: CostModel,
    /// Seconds per prompt token over the link, and the fixed cost of a copy.
    link_s_per_token: f64,
    link_base_s: f64,
    rng: PolicyRng,
    rejected: u64,
    migrations: u64,
    /// The prefill views with each instance's CPU-tier match added to `matched_tokens`.
    tiered: Vec<ReplicaView>,
}

impl Policy for PdMooncake {
    const NAME: &'static str = "pd_mooncake";
    const DESCRIPTION: &'static str = "disaggregated (Mooncake Conductor): prefill by estimated TTFT with prefix migration, decode by load, SLO admission";
    type Config = Config;
    type Context = RouterContext;
    fn new(cfg: Config, ctx: &RouterContext) -> Result<Self, String> {
        let pd = ctx.disaggregation.clone().into_option().ok_or("pd_mooncake runs on a disaggregated cluster")?;
        let (Some(prefill_cost), Some(decode_cost)) = (pd.prefill_cost.into_option(), ctx.cost.clone().into_option())
        else {
            return Err("pd_mooncake needs the pools' cost models".into());
        };
        if !(cfg.balancing_threshold >= 1.0 && cfg.ttft_slo_s > 0.0 && cfg.tbt_slo_s > 0.0) {
            return Err("balancing_threshold must be ≥ 1 and the SLOs positive".into());
        }
        Ok(Self {
            cfg,
            prefill_cost,
            decode_cost,
            link_s_per_token: pd.kv_bytes_per_token / pd.link_bandwidth_bytes_s,
            link_base_s: pd.link_base_latency_s,
            rng: policy_rng(ctx.seed),
            rejected: 0,
            migrations: 0,
            tiered: Vec::new(),
        })
    }
}

impl PdMooncake {
    /// `(TTFT estimate, migrates from best)` of prefill instance `v` for a `len`-token prompt.
    pub fn ttft(&self, len: u32, v: &ReplicaView, best_len: u32, global: bool) -> (f64, bool) {
        let local = v.matched_tokens.min(len);
        let migrate = global && best_len > local && best_len as f64 / local as f64 > self.cfg.balancing_threshold;
        let (prefix, xfer) = if migrate {
            (best_len, self.link_base_s + (best_len - local) as f64 * self.link_s_per_token)
        } else {
            (local, 0.0)
        };
        let queue = self.prefill_cost.prefill_time_s(v.outstanding_work as u64, 0);
        // At least one token is computed, as the host does.
        let cached = prefix.min(len.saturating_sub(1));
        (xfer + queue + self.prefill_cost.prefill_time_s((len - cached) as u64, cached as u64), migrate)
    }
}

impl PdRouterPolicy for PdMooncake {
    fn capabilities(&self) -> Capabilities {
        super::PD | Capabilities::NEEDS_EXACT_MATCH
    }
    /// The prompt's match continued in each prefill instance's CPU tier (0 without tiers).
    fn signals(&self) -> Vec<String> {
        vec![signals::TIER_CPU_MATCHED_TOKENS.into()]
    }

    fn route_pair(&mut self, request: &Request<'_>, prefill: &Replicas<'_>, decode: &Replicas<'_>) -> PdRoute {
        let len = request.prompt_tokens;
        let mut tiered = std::mem::take(&mut self.tiered);
        tiered.clear();
        tiered.extend((0..prefill.len()).map(|i| {
            let below = if prefill.signal_columns > 0 { prefill.signal(i, 0) as u32 } else { 0 };
            ReplicaView { matched_tokens: prefill[i].matched_tokens + below, ..prefill[i] }
        }));
        let route = self.route_on(&tiered, len, decode);
        self.tiered = tiered;
        route
    }
    fn report(&self) -> Vec<(String, f64)> {
        vec![("rejected".into(), self.rejected as f64), ("migrations".into(), self.migrations as f64)]
    }
}

impl PdMooncake {
    /// The decision on prefill views whose `matched_tokens` include the tiers.
    fn route_on(&mut self, prefill: &[ReplicaView], len: u32, decode: &Replicas<'_>) -> PdRoute {
        let (best, best_len) = (0..prefill.len())
            .map(|i| (i, prefill[i].matched_tokens.min(len)))
            .fold((0, 0), |acc, x| if x.1 > acc.1 { x } else { acc });
        let global = self.cfg.scheduling == Scheduling::GlobalCacheAware;
        let (p, ttft, migrate) = match self.cfg.scheduling {
            Scheduling::Random => {
                let i = self.rng.random_range(0..prefill.len());
                (i, self.ttft(len, &prefill[i], best_len, false).0, false)
            }
            Scheduling::LoadBalance => {
                let i = super::argmin_by(prefill, |v| v.outstanding_work);
                (i, self.ttft(len, &prefill[i], best_len, false).0, false)
            }
            Scheduling::GlobalCacheAware | Scheduling::LocalCacheAware => {
                let mut pick = (0, f64::INFINITY, false);
                for (i, v) in prefill.iter().enumerate() {
                    let (t, m) = self.ttft(len, v, best_len, global);
                    if t < pick.1 {
                        pick = (i, t, m);
                    }
                }
                pick
            }
        };
        let d = super::argmin_by(decode, |v| v.kv_used_tokens);
        let v = &decode[d];
        let tbt = self.decode_cost.decode_step_time_s(v.running as u64 + 1, v.kv_used_tokens + len as u64);
        if ttft > self.cfg.ttft_slo_s || tbt > self.cfg.tbt_slo_s {
            self.rejected += 1;
            return PdRoute::Reject;
        }
        let prefix_from = (migrate && best != p).then_some(best);
        self.migrations += u64::from(prefix_from.is_some());
        PdRoute::Disaggregate { prefill: p, decode: d, prefix_from }
    }
}
