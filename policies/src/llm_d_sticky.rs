//! `llm_d_sticky`: llm-d's "sticky until saturated" endpoint picker — a prefix-cache affinity
//! filter with a TTFT load gate, a token-load scorer, and the max-score picker.
//!
//! Algorithm (per request; block = `block_tokens` tokens):
//! 1. Prefix match (upstream's `approx-prefix-cache-producer`, as in [`crate::llm_d`]): per
//!    replica `matched_r` of the prompt's `total` hashed blocks; prefix score `matched_r / total`.
//! 2. In-flight load (upstream's `inflight-load-producer`, default `addEstimatedOutputTokens:
//!    false`): `inflight_r` = Σ over the requests dispatched to r whose first token is not out
//!    of their uncached prompt tokens at dispatch. A request's uncached tokens on r are
//!    `(total − matched_r) · block_tokens + max(0, prompt_tokens − total · block_tokens)`
//!    (upstream's `uncachedInputTokens`: the indexed blocks not matched, plus any tail beyond the
//!    `max_prefix_blocks` cap).
//! 3. Filter (`prefix-cache-affinity-filter`): with probability `exploration_probability` keep
//!    every replica; otherwise the sticky replicas are those with prefix score ≥
//!    `affinity_threshold` (none: keep all). TTFT load gate: each replica's TTFT estimate is
//!    `inflight_r / peak_prefill_tokens_per_s`; if the best sticky estimate exceeds the best
//!    non-sticky one by more than `max_ttft_penalty_s`, keep all. Equivalently, stickiness holds
//!    while the least-loaded sticky replica carries at most τ = peak prefill throughput × max
//!    TTFT penalty more in-flight tokens than the least-loaded other replica.
//! 4. Score (`token-load-scorer`, the profile's only scorer): `1 − min(1, (inflight_r +
//!    uncached_r) / queue_threshold_tokens)` (1 when the load is 0) over the kept replicas;
//!    the max-score picker takes the highest, ties uniformly at random.
//! 5. At dispatch the chosen replica records the prompt's blocks and `uncached_r` joins its
//!    in-flight load until the request's first token is out.
//!
//! Parameters (defaults): `affinity_threshold` 0.8 (≤ 0 switches the filter off, as upstream),
//! `exploration_probability` 0, `max_ttft_penalty_s` 18 (upstream `maxTTFTPenaltyMs` 18000;
//! 0 always sticks), `peak_prefill_tokens_per_s` auto, `queue_threshold_tokens` 4,194,304,
//! `block_tokens` 16, `max_prefix_blocks` 256, `prefix_state` approximate, `lru_capacity` auto.
//!
//! `peak_prefill_tokens_per_s: auto` measures the peak as upstream's README says it calibrated
//! its default ("the prefill throughput of a single unloaded chunk of `max_num_batched_tokens`"):
//! `engine.max_step_tokens / ctx.cost.prefill_time_s(engine.max_step_tokens, 0)`, priced by the
//! host's own step model. Without a cost model or that fact (dispatch world, unit tests) it is
//! upstream's default, 15,928 tokens/s (Qwen 32B on 2 × H100, TP 2, vLLM 0.19). The τ in use is
//! reported as `router_sticky_tau_tokens`.
//!
//! Source: llm-d/llm-d-router @ ebab6879 (2026-08-22):
//! `pkg/epp/framework/plugins/scheduling/filter/prefixcacheaffinity/{plugin.go,README.md}`
//! (threshold 0.80, exploration 0, penalty 18,000 ms, peak 15,928 tokens/s, the relative gate
//! `bestStickyTTFT − bestNonStickyTTFT > maxTTFTPenaltyMs`, "no sticky: keep all"),
//! `.../scheduling/scorer/tokenload/token_load.go` (`1 − min(1, tokens / 4194304)`, in-flight
//! plus this request's uncached tokens), `.../requestcontrol/dataproducer/inflightload/producer.go`
//! (`uncachedInputTokens`; without estimated output tokens a request's tokens are released at
//! its first streamed chunk), and the prefix producer and max-score picker of [`crate::llm_d`].
//!
//! Replicas coming and going (`on_replica_change`: crashes, autoscaling): as `llm_d` — the
//! prefix index and the in-flight token ledger are kept by id (`index::members`), a replica that
//! leaves is forgotten (the EPP's `RemovePod`, see `llm_d`), one that joins starts empty, and
//! scores cover the routable replicas only.
//!
//! Deviations, and why:
//! - The summary ("keep the sticky endpoints while their token load stays under τ")
//!   reads as an absolute bound; upstream's gate is relative to the best non-sticky replica,
//!   and this router follows upstream (with a single replica left, or no non-sticky one, the
//!   gate never opens, as upstream).
//! - Upstream learns a request's first token from its response stream. Here the requests that
//!   still owe theirs on r are the last `waiting_r + prefilling_r` dispatched to r (the engine
//!   signal `prefilling`; FIFO admission and first tokens), as in [`crate::dynamo_kv`].
//! - Upstream hashes characters of the chat template; blocks here are token blocks of the
//!   prompt's segments (see [`crate::llm_d`]).

use rand::RngExt;
use routelab_policy_api::facts::context::ENGINE_MAX_STEP_TOKENS;
use routelab_policy_api::*;
use serde::{Deserialize, Serialize};

use crate::index::block_runs::{HeldRuns, PromptRuns};
use crate::index::lru_runs::LruRuns;
use crate::index::members::{Member, Members};
use crate::llm_d::{LruCapacity, PrefixState};

/// Upstream's `peakPrefillThroughput` default, tokens/s.
pub const UPSTREAM_PEAK_PREFILL_TOKENS_PER_S: f64 = 15_928.0;

/// Peak prefill throughput for the TTFT load gate.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum PeakPrefill {
    /// One unloaded chunk of `engine.max_step_tokens`, priced by the host's step model.
    Auto,
    #[serde(untagged)]
    TokensPerS(f64),
}

#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub affinity_threshold: f64,
    pub exploration_probability: f64,
    pub max_ttft_penalty_s: f64,
    pub peak_prefill_tokens_per_s: PeakPrefill,
    pub queue_threshold_tokens: u64,
    pub block_tokens: u32,
    pub max_prefix_blocks: u32,
    pub prefix_state: PrefixState,
    pub lru_capacity: LruCapacity,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            affinity_threshold: 0.8,
            exploration_probability: 0.0,
            max_ttft_penalty_s: 18.0,
            peak_prefill_tokens_per_s: PeakPrefill::Auto,
            queue_threshold_tokens: 4_194_304,
            block_tokens: 16,
            max_prefix_blocks: 256,
            prefix_state: PrefixState::Approximate,
            lru_capacity: LruCapacity::Auto,
        }
    }
}

enum Index {
    Approximate(LruRuns),
    Precise(HeldRuns),
}

pub struct LlmDSticky {
    cfg: Config,
    rng: PolicyRng,
    /// Peak prefill throughput the gate divides by, tokens/s.
    peak: f64,
    prompt: PromptRuns,
    prompt_for: Option<u64>,
    /// By id (`index::members`), as `matched`, `uncached` and `uncached_cum`; `inflight`,
    /// `kept` and `scores` by routable index.
    index: Index,
    members: Members,
    matched: Vec<u32>,
    /// Per replica, this request's uncached prompt tokens there (valid for `prompt_for`).
    uncached: Vec<u64>,
    /// Per replica, the running sum of the uncached tokens of every request dispatched there
    /// (a leading 0); the last `pending` differences are the in-flight load.
    uncached_cum: Vec<Vec<u64>>,
    inflight: Vec<u64>,
    kept: Vec<bool>,
    scores: Vec<f64>,
    decisions: u64,
    sticky_decisions: u64,
}

impl Policy for LlmDSticky {
    const NAME: &'static str = "llm_d_sticky";
    const DESCRIPTION: &'static str =
        "llm-d sticky until saturated: prefix-affinity filter with a TTFT load gate, token-load scorer, max score";
    type Config = Config;
    type Context = RouterContext;
    fn new(cfg: Config, ctx: &RouterContext) -> Result<Self, String> {
        if !(cfg.affinity_threshold <= 1.0) {
            return Err(format!(
                "affinity_threshold must be ≤ 1 (got {}); ≤ 0 switches the filter off",
                cfg.affinity_threshold
            ));
        }
        if !(0.0..=1.0).contains(&cfg.exploration_probability) {
            return Err(format!("exploration_probability must be in [0, 1] (got {})", cfg.exploration_probability));
        }
        if !(cfg.max_ttft_penalty_s >= 0.0 && cfg.max_ttft_penalty_s.is_finite()) {
            return Err(format!(
                "max_ttft_penalty_s must be a finite number ≥ 0 (got {}); 0 always sticks",
                cfg.max_ttft_penalty_s
            ));
        }
        if cfg.queue_threshold_tokens == 0 {
            return Err("queue_threshold_tokens must be at least 1 (upstream default 4194304)".into());
        }
        if cfg.block_tokens == 0 {
            return Err("block_tokens must be at least 1 (vLLM's default KV block is 16)".into());
        }
        if cfg.max_prefix_blocks == 0 {
            return Err("max_prefix_blocks must be at least 1 (upstream default 256)".into());
        }
        let peak = match cfg.peak_prefill_tokens_per_s {
            PeakPrefill::TokensPerS(p) if !(p > 0.0 && p.is_finite()) => {
                return Err(format!("peak_prefill_tokens_per_s must be positive, or auto (got {p})"));
            }
            PeakPrefill::TokensPerS(p) => p,
            PeakPrefill::Auto => peak_prefill_tokens_per_s(ctx).unwrap_or(UPSTREAM_PEAK_PREFILL_TOKENS_PER_S),
        };
        let capacity = cfg.lru_capacity.blocks(ctx, cfg.block_tokens)?;
        let n = ctx.replica_count();
        let index = match cfg.prefix_state {
            PrefixState::Approximate => Index::Approximate(LruRuns::new(n, capacity)),
            PrefixState::Precise => Index::Precise(HeldRuns::new(n)),
        };
        Ok(Self {
            prompt: PromptRuns::new(cfg.block_tokens),
            cfg,
            rng: policy_rng(ctx.seed),
            peak,
            prompt_for: None,
            index,
            members: Members::new(n),
            matched: vec![0; n],
            uncached: vec![0; n],
            uncached_cum: vec![vec![0]; n],
            inflight: vec![0; n],
            kept: vec![true; n],
            scores: vec![0.0; n],
            decisions: 0,
            sticky_decisions: 0,
        })
    }
}

/// Upstream's calibration of the peak prefill throughput, done with the host's pricer: tokens of
/// one unloaded chunk of the engine's step budget over the seconds it takes. `None` without a
/// cost model or the step-budget fact.
pub fn peak_prefill_tokens_per_s(ctx: &RouterContext) -> Option<f64> {
    let cost = ctx.cost.as_ref().into_option()?;
    let tokens = ctx.fact(ENGINE_MAX_STEP_TOKENS)?;
    if !(tokens >= 1.0) {
        return None;
    }
    let s = cost.prefill_time_s(tokens as u64, 0);
    (s > 0.0 && s.is_finite()).then(|| tokens.floor() / s)
}

impl LlmDSticky {
    /// τ in tokens: the peak prefill throughput times the max TTFT penalty.
    pub fn tau_tokens(&self) -> f64 {
        self.peak * self.cfg.max_ttft_penalty_s
    }

    /// Requests on replica `r` whose first token is not out: queued plus admitted and still in
    /// prefill (the `prefilling` signal; 0 without a signal table).
    fn pending(replicas: &Replicas<'_>, r: usize) -> usize {
        let prefilling = if replicas.signal_columns > 0 { replicas.signal(r, 0) as usize } else { 0 };
        replicas[r].waiting as usize + prefilling
    }

    fn hash_prompt(&mut self, request: &Request<'_>) {
        if self.prompt_for == Some(request.id) {
            return;
        }
        self.prompt_for = Some(request.id);
        let segments = request.segments();
        match self.index {
            Index::Approximate(_) => self.prompt.cut_limited(segments, self.cfg.max_prefix_blocks as usize, true),
            Index::Precise(_) => self.prompt.cut(segments),
        }
        let runs = &self.prompt.runs;
        match &mut self.index {
            Index::Precise(held) => held.consecutive(runs, self.prompt.blocks, &mut self.matched),
            Index::Approximate(lru) => lru.matched(runs, &mut self.matched),
        }
        let b = self.cfg.block_tokens as u64;
        let total = self.prompt.blocks;
        let tail = (request.prompt_tokens as u64).saturating_sub(total * b);
        for (u, &m) in self.uncached.iter_mut().zip(&self.matched) {
            *u = total.saturating_sub(m as u64) * b + tail;
        }
    }

    /// Per replica: prefix score, in-flight tokens, whether the filter keeps it, and its
    /// token-load score (`-inf` for replicas the filter drops). Fills the scratch vectors.
    pub fn scores(&mut self, request: &Request<'_>, replicas: &Replicas<'_>) -> &[f64] {
        self.hash_prompt(request);
        let n = replicas.len();
        for r in 0..n {
            let cum = &self.uncached_cum[self.members.id(r)];
            let last = cum.len() - 1;
            let k = Self::pending(replicas, r).min(last);
            self.inflight[r] = cum[last] - cum[last - k];
        }
        self.filter(n);
        let q = self.cfg.queue_threshold_tokens as f64;
        for r in 0..n {
            self.scores[r] = if !self.kept[r] {
                f64::NEG_INFINITY
            } else {
                let load = (self.inflight[r] + self.uncached[self.members.id(r)]) as f64;
                if load <= 0.0 { 1.0 } else { 1.0 - load.min(q) / q }
            };
        }
        &self.scores[..n]
    }

    /// The prefix-cache affinity filter: sets `kept`.
    fn filter(&mut self, n: usize) {
        self.kept.fill(true);
        let total = self.prompt.blocks;
        if n <= 1 || self.cfg.affinity_threshold <= 0.0 || total == 0 {
            return;
        }
        if self.cfg.exploration_probability > 0.0 && self.rng.random::<f64>() < self.cfg.exploration_probability {
            return;
        }
        let (mut best_sticky, mut best_other) = (f64::INFINITY, f64::INFINITY);
        let mut any_sticky = false;
        for r in 0..n {
            let ttft = self.inflight[r] as f64 / self.peak;
            if self.matched[self.members.id(r)] as f64 / total as f64 >= self.cfg.affinity_threshold {
                any_sticky = true;
                best_sticky = best_sticky.min(ttft);
            } else {
                self.kept[r] = false;
                best_other = best_other.min(ttft);
            }
        }
        let gate_open = self.cfg.max_ttft_penalty_s > 0.0
            && best_other.is_finite()
            && best_sticky - best_other > self.cfg.max_ttft_penalty_s;
        if !any_sticky || gate_open {
            self.kept.fill(true);
        } else {
            self.sticky_decisions += 1;
        }
    }
}

impl RouterPolicy for LlmDSticky {
    fn capabilities(&self) -> Capabilities {
        if self.cfg.prefix_state == PrefixState::Precise { Capabilities::WANTS_EVICTIONS } else { Capabilities::NONE }
    }

    /// Which requests still owe their first token (with `waiting` in the views).
    fn signals(&self) -> Vec<String> {
        vec![signals::PREFILLING.into()]
    }

    fn route(&mut self, request: &Request<'_>, replicas: &Replicas<'_>) -> usize {
        self.scores(request, replicas);
        self.decisions += 1;
        // Max score, ties uniformly at random (reservoir sampling over the maxima).
        argmax_random_tie(self.scores[..replicas.len()].iter().copied(), &mut self.rng).expect("at least one replica")
    }

    fn on_dispatch(&mut self, request: &Request<'_>, r: usize) {
        let r = self.members.id(r);
        self.hash_prompt(request);
        let uncached = self.uncached[r];
        let cum = &mut self.uncached_cum[r];
        cum.push(cum.last().copied().unwrap_or(0) + uncached);
        let runs = &self.prompt.runs;
        match &mut self.index {
            Index::Approximate(lru) => lru.record(runs, r),
            Index::Precise(held) => {
                for run in runs {
                    held.insert(run.key, run.blocks, r, None);
                }
            }
        }
        // The next request's match must see this dispatch.
        self.prompt_for = None;
    }

    fn on_evict(&mut self, e: &Eviction<'_>) {
        let Index::Precise(held) = &mut self.index else { return };
        let Some(r) = self.members.get(e.replica_index()) else { return };
        if let Some((run, from)) = self.prompt.evicted(e) {
            held.remove(run.key, from, run.blocks, r);
        }
        self.prompt_for = None;
    }

    /// A replica that leaves is forgotten: its blocks and its in-flight tokens.
    fn on_replica_change(&mut self, change: &ReplicaChange) {
        if let Some(Member::Left(id)) = self.members.change(change) {
            match &mut self.index {
                Index::Approximate(lru) => lru.forget(id),
                Index::Precise(held) => held.forget(id),
            }
            self.uncached_cum[id] = vec![0];
            self.prompt_for = None;
        }
    }

    fn report(&self) -> Vec<(String, f64)> {
        vec![
            ("router_sticky_tau_tokens".into(), self.tau_tokens()),
            ("router_sticky_share".into(), self.sticky_decisions as f64 / self.decisions.max(1) as f64),
        ]
    }
}
