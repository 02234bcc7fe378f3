//! `pd_aibrix`: AIBrix's prefill/decode router — a joint choice over rolesets by normalised
//! prefill and decode scores.
//!
//! Algorithm (per request; instances are grouped into `rolesets`: prefill instance i and decode
//! instance j belong to roleset `i mod R` and `j mod R`):
//! 1. Prefill score of instance i (lower is better): `(100 − match%_i) · 0.1 + req_i / max_req`,
//!    `match%` = the prompt's prefix cached (or being computed) there × 100 / prompt, `req` =
//!    outstanding requests, `max_req` over the prefill pool (the term is 0 when all are idle).
//! 2. Decode score of instance j: `(run_j / max_run + 1 − tput_j / max_tput) / (free_j / max_free)`,
//!    `run` = running requests, `tput` = its decode throughput (tokens/s: `running / step time`
//!    of its current batch from the cost model), `free` = share of KV memory free; maxima over the
//!    decode pool (a term whose maximum is 0 counts 0; no free memory scores +∞).
//! 3. Each roleset r takes its best (lowest) prefill score `P_r` and decode score `D_r`; the pair
//!    is the roleset minimising `P_r / max P + D_r / max D` (maxima over rolesets), lowest index
//!    on ties, with its best prefill and decode instance.
//!
//! Parameters (defaults): `rolesets` 0 = one per pair of instances (`min(P, D)`).
//! Source: vllm-project/aibrix @ e3e10f9e, `pkg/plugins/gateway/algorithms/pd_disaggregation.go`
//! and `pd_readme.md` (prefill score, decode score, roleset argmin of `P/max_P + D/max_D`).
//!
//! Deviations: the imbalance fast paths (prefill spread > 16, decode spread ≥ 16) are not
//! modelled; the prefix match is the host's exact match rather than AIBrix's 4-byte-block hash
//! index; the throughput metric is estimated from the cost model, where AIBrix scrapes it. The
//! gateway's own prefill call (`max_tokens=1`) is the host's prefill instance.

use routelab_policy_api::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Debug, Clone, Default)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub rolesets: u32,
}

pub struct PdAibrix {
    rolesets: usize,
    cost: Option<CostModel>,
}

impl Policy for PdAibrix {
    const NAME: &'static str = "pd_aibrix";
    const DESCRIPTION: &'static str =
        "disaggregated (AIBrix): joint roleset choice by normalised prefill and decode scores";
    type Config = Config;
    type Context = RouterContext;
    fn new(cfg: Config, ctx: &RouterContext) -> Result<Self, String> {
        let pd = ctx.disaggregation.clone().into_option().ok_or("pd_aibrix runs on a disaggregated cluster")?;
        let most = pd.prefill_replicas.min(ctx.replicas);
        let rolesets = if cfg.rolesets == 0 { most } else { cfg.rolesets };
        if rolesets > most {
            return Err(format!("rolesets ({rolesets}) must be at most min(prefill, decode instances) = {most}"));
        }
        Ok(Self { rolesets: rolesets as usize, cost: ctx.cost.clone().into_option() })
    }
}

/// AIBrix's prefill score of every instance (lower is better).
pub fn prefill_scores(prompt: u32, views: &[ReplicaView]) -> Vec<f64> {
    let max_req = views.iter().map(|v| v.outstanding_requests).max().unwrap_or(0) as f64;
    views
        .iter()
        .map(|v| {
            let pct =
                if prompt == 0 { 0.0 } else { (v.matched_tokens.min(prompt) as f64 * 100.0 / prompt as f64).floor() };
            let load = if max_req > 0.0 { v.outstanding_requests as f64 / max_req } else { 0.0 };
            (100.0 - pct) * 0.1 + load
        })
        .collect()
}

/// AIBrix's decode score of every instance, `throughput` giving tokens/s per instance.
pub fn decode_scores(views: &[ReplicaView], throughput: &[f64]) -> Vec<f64> {
    let free = |v: &ReplicaView| {
        if v.kv_capacity_tokens == 0 { 1.0 } else { 1.0 - v.kv_used_tokens as f64 / v.kv_capacity_tokens as f64 }
    };
    let max_run = views.iter().map(|v| v.running).max().unwrap_or(0) as f64;
    let max_tput = throughput.iter().copied().fold(0.0, f64::max);
    let max_free = views.iter().map(free).fold(0.0, f64::max);
    views
        .iter()
        .zip(throughput)
        .map(|(v, &t)| {
            let run = if max_run > 0.0 { v.running as f64 / max_run } else { 0.0 };
            let tput = if max_tput > 0.0 { t / max_tput } else { 0.0 };
            let f = if max_free > 0.0 { free(v) / max_free } else { 0.0 };
            if f > 0.0 { (run + 1.0 - tput) / f } else { f64::INFINITY }
        })
        .collect()
}

/// The roleset pick: `(prefill, decode)` minimising `P_r / max P + D_r / max D`.
pub fn joint(prefill: &[f64], decode: &[f64], rolesets: usize) -> (usize, usize) {
    let best = |scores: &[f64], r: usize| {
        (r..scores.len()).step_by(rolesets).min_by(|&a, &b| scores[a].total_cmp(&scores[b])).expect("non-empty roleset")
    };
    let sets: Vec<(usize, usize)> = (0..rolesets).map(|r| (best(prefill, r), best(decode, r))).collect();
    let max_p = sets.iter().map(|&(p, _)| prefill[p]).fold(0.0, f64::max);
    let max_d = sets.iter().map(|&(_, d)| decode[d]).filter(|x| x.is_finite()).fold(0.0, f64::max);
    let norm = |x: f64, m: f64| if m > 0.0 { x / m } else { 0.0 };
    let total = |&(p, d): &(usize, usize)| norm(prefill[p], max_p) + norm(decode[d], max_d);
    let mut pick = sets[0];
    for s in &sets[1..] {
        if total(s) < total(&pick) {
            pick = *s;
        }
    }
    pick
}

impl PdRouterPolicy for PdAibrix {
    fn capabilities(&self) -> Capabilities {
        super::PD | Capabilities::NEEDS_EXACT_MATCH
    }
    fn route_pair(&mut self, request: &Request<'_>, prefill: &Replicas<'_>, decode: &Replicas<'_>) -> PdRoute {
        let tput: Vec<f64> = decode
            .iter()
            .map(|v| match (&self.cost, v.running) {
                (Some(c), n) if n > 0 => n as f64 / c.decode_step_time_s(n as u64, v.kv_used_tokens),
                _ => 0.0,
            })
            .collect();
        // Fewer rolesets while a crash leaves a pool short of instances (none are empty then).
        let rolesets = self.rolesets.min(prefill.len()).min(decode.len());
        let (p, d) = joint(&prefill_scores(request.prompt_tokens, prefill), &decode_scores(decode, &tput), rolesets);
        PdRoute::pair(p, d)
    }
}
