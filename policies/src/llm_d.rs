//! `llm_d`: the llm-d inference scheduler's endpoint picker (EPP), default profile.
//!
//! Algorithm (per request):
//! 1. Every enabled scorer gives each replica a score in [0, 1]:
//!    - `queue`: `(max − waiting) / (max − min)` over the replicas' waiting requests (1 for all
//!      when they are equal);
//!    - `kv_cache`: `1 − kv_used / kv_capacity`;
//!    - `prefix`: matched blocks / the prompt's blocks (the match ratio `m / total`); with
//!      `match_length_weight` w > 0 (llm-d-router PR 1459, the fix for short prompts becoming
//!      hot spots under a pure ratio, GIE #2561): `w · min(1, m · block_tokens /
//!      match_length_scale_tokens)² + (1 − w) · m / total`;
//!    - `lora` (off unless `lora_weight` > 0; GIE's `lora-affinity-scorer`): 1 when a request on
//!      the request's adapter runs on the replica; else 0.8 when the replica's running plus
//!      waiting adapter counts are below its `max_loras` (room to load one more); else 0.6 when a
//!      request on the adapter waits there; else 0. A base-model request is never "active"
//!      (vLLM lists adapters only), so it scores 0.8 or 0 by room, as upstream.
//!    - `lora_state` (off unless `lora_state_weight` > 0; llm-d's `lora-load-state-scorer`):
//!      the adapter's residency rather than activity — loaded 1.0, a free batch slot 0.6, every
//!      slot busy 0; a rendezvous home and free slots add small bonuses within a tier
//!      ([`crate::lora_load_state`], which has the details and the source).
//!    - `no_hit_lru` (off unless `no_hit_lru_weight` > 0): a request is cold when no replica
//!      matches any of its blocks. Warm: 0.5 for every replica. Cold: replicas that never took a
//!      cold request first, in index order, then those that did, least recently first; the one at
//!      rank k scores `max(0, 1 − k / (replicas − 1))` (1 with a single replica). A cold request
//!      moves its replica to the most-recent end of an LRU of `no_hit_lru_size` replicas.
//! 2. Total = Σ weight · clamp(score, 0, 1); the max-score picker takes the highest total, ties
//!    uniformly at random (upstream shuffles, then sorts stably).
//! 3. Prefix state (`prefix_state`):
//!    - `approximate` (upstream's `approx-prefix-cache-producer`): the prompt is cut into blocks
//!      of `block_tokens` — the last, partial one included and hashed distinctly — at most
//!      `max_prefix_blocks`. Walking the blocks from the first while *some* replica holds the
//!      block, each holder's count goes up by one (a replica that lost an early block still
//!      counts its later ones, as upstream's `matchLongestPrefix` does). After routing, the
//!      chosen replica's LRU gets all the prompt's blocks (oldest evicted beyond `lru_capacity`
//!      blocks; `auto` = the replica's KV capacity in blocks, upstream's `autoTune` from vLLM's
//!      `num_gpu_blocks`).
//!    - `precise` (the KV-events scorer): full blocks only, recorded at dispatch and removed when
//!      the replica reports their eviction (after the workload's `eviction_delay_s`); score =
//!      leading blocks held without a gap / the prompt's full blocks. With KV tiers the chain
//!      continues below the GPU: `m` blocks on the GPU, then `c` blocks the replica's CPU tier
//!      holds and `r` the shared remote tier holds (the engine signals `tier.cpu.matched_tokens`
//!      and `tier.remote.matched_tokens` over `block_tokens`, rounded down), and `m` becomes the
//!      weighted count `m + cpu_weight · c + remote_weight · r` (each block scores its medium's
//!      weight; a block on the GPU and below scores the GPU's 1).
//!
//! Parameters (defaults): `queue_weight` 2, `kv_cache_weight` 2, `prefix_weight` 3,
//! `no_hit_lru_weight` 0 (a weight of 0 switches its scorer off; upstream's no-hit-lru sample
//! config weighs prefix 2, no-hit-lru 1), `no_hit_lru_size` 1024, `match_length_weight` 0 (in
//! [0, 1]), `match_length_scale_tokens` 8192, `block_tokens` 16, `max_prefix_blocks` 256,
//! `prefix_state` approximate, `lru_capacity` auto, `lora_weight` 0, `lora_state_weight` 0,
//! `lora_state` (the load-state scorer's tier scores and bonuses) upstream's, `cpu_weight` 0.8,
//! `remote_weight` 1 (the tier weights apply with `prefix_state: precise` only: upstream's
//! approximate producer knows no tiers).
//!
//! Source: llm-d/llm-d-inference-scheduler @ 520af478 (module `llm-d-router`):
//! `pkg/epp/config/loader/defaults.go` (weights 2/2/3), `pkg/epp/scheduling/scheduler_profile.go`
//! (weighted sum, score clamp), `.../picker/maxscore/picker.go`, `.../scorer/queuedepth/queue.go`,
//! `.../scorer/kvcacheutilization/kvcache_utilization.go`, `.../scorer/prefix/plugin.go`,
//! `.../requestcontrol/dataproducer/approximateprefix/{hashing,indexer,plugin,types}.go`
//! (16-token blocks, 256-block limit, per-pod LRU of 31,250 entries without autoTune).
//! The two 2026 options follow llm-d/llm-d-router @ ebab6879:
//! `pkg/epp/framework/plugins/scheduling/scorer/prefix/plugin.go` (`matchLengthWeight` default
//! 0, `matchLengthScaleTokens` 8192, the squared normalised length; added by f2e4fe5e, PR 1459)
//! and `.../scheduling/scorer/nohitlru/no_hit_lru.go` (cold = no endpoint with a matched block,
//! neutral 0.5 otherwise, never-used first, LRU of 1024 updated in `PreRequest` for cold
//! requests only), weights from `deploy/config/sim-epp-no-hit-lru.yaml`.
//! The tier weights follow llm-d/llm-d-kv-cache @ 7be76e11: `pkg/kvcache/backend.go`
//! (`DefaultKVCacheBackendConfig`: gpu 1.0, cpu 0.8) and `pkg/kvcache/kvblock_scorer.go`
//! (`LongestPrefixScorer.Score`: the chain of consecutive blocks held in any medium, each
//! adding the largest weight among the media holding it on the pod; `fillMaxWeights` gives a
//! medium the config does not name the weight 1.0 — hence `remote_weight` 1: a shared tier is
//! no medium llm-d's default config names).
//! The LoRA scorer follows kubernetes-sigs/gateway-api-inference-extension @ bc202fce:
//! `pkg/epp/scheduling/framework/plugins/scorer/lora_affinity.go` (`ActiveModels`,
//! `WaitingModels`, `MaxActiveModels`: vLLM's `lora_requests_info` metric).
//!
//! Replicas coming and going (`on_replica_change`: crashes, autoscaling): the prefix index and
//! the no-hit LRU are kept by id (`index::members`); a replica that leaves is forgotten — its
//! blocks and its LRU place — and one that joins starts with none, as the EPP drops a pod
//! that left the pool from its indexer (kubernetes-sigs/gateway-api-inference-extension @
//! 05aed77e, `pkg/epp/framework/plugins/scheduling/scorer/prefix/plugin.go`,
//! `CleanUpInactivePods` → `indexer.RemovePod`). Upstream does it lazily, every
//! `PodActiveCheckInterval` (2 min), so a pod that comes back under the same name sooner keeps
//! its stale blocks; here the replica is forgotten at once (a restart is cold).
//! Scores are computed for the routable replicas only.
//!
//! Deviations, and why:
//! - Upstream hashes 4 characters per token of the JSON-marshalled messages; here blocks are
//!   token blocks of the prompt's segments (the simulator has no text).
//! - Scraped metrics (`waiting`, KV usage) are the engine signals `scraped.waiting` and
//!   `scraped.kv_utilisation`, read through [`LlmD::waiting`] and [`LlmD::kv_usage`] only: as
//!   old as the workload's `cluster.metrics.scrape_interval_s` (default 0.05 s, upstream's
//!   50 ms refresh); the prefix index is the router's own, always exact.
//! - The LoRA figures are the live `lora.*` signals, not a scrape of the metric.
//! - `precise` records blocks at dispatch (the simulator emits no "stored" events); upstream's
//!   optional speculative entries (2 s TTL) are the closest thing to that.
//! - The blocks below the GPU are the host's exact walk (signals), not an index of the CPU
//!   medium's KV events: no eviction delay there, and the chain is counted past the host's GPU
//!   match rather than the router's own.
//!
//! Why the default profile loses to least-requests on the Mooncake conversation replay (not a
//! deviation: upstream's scorer does the same on the same arrivals). The trace's timestamps
//! come in 3 s bins, about ten requests to an instant, and both load scorers read scraped
//! metrics, so every request of an instant scores the load of the last scrape — the router's
//! own dispatches of that instant unseen. Nearly every prompt opens with the same block, which
//! every replica holds, so the prefix term rarely separates the replicas and the best stale load
//! wins again and again: 77% of an instant's requests go to one replica (least-requests, reading
//! the live count: 40%), TTFT mean 1.73 s against 1.05 s. Spread each bin's requests over its
//! 3 s, or scrape always fresh, and `llm_d` beats least-requests (0.53 vs 0.66 s; fresh 0.93 vs
//! 1.05 s). Upstream (llm-d/llm-d-inference-scheduler @ 520af478) reads the same stale figures:
//! `queuedepth/queue.go` and `kvcacheutilization/kvcache_utilization.go` score
//! `endpoint.GetMetrics()`, which `pkg/epp/backend/metrics/pod_metrics.go` refreshes on a ticker
//! of `RefreshMetricsInterval` (50 ms, `pkg/epp/server/options.go`), and nothing in the default
//! profile counts a dispatch before the next scrape; its `active-request-scorer` (fed per request
//! by `inflight-load-producer`) would, but the default profile does not enable it. Real arrivals
//! are rarely ten to a millisecond, so the loss is the trace's binning meeting a stale signal;
//! core's `decision_log_tests` logs the decisions and pins each step.

use routelab_policy_api::*;
use serde::{Deserialize, Serialize};

use crate::index::block_runs::{HeldRuns, PromptRuns};
use crate::index::lru_runs::LruRuns;
use crate::index::members::{Member, Members};
use crate::lora_load_state;

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum PrefixState {
    Approximate,
    Precise,
}

/// Capacity of each replica's LRU of block hashes.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum LruCapacity {
    /// The replica's KV capacity in blocks (upstream `autoTune`).
    Auto,
    #[serde(untagged)]
    Blocks(u64),
}

impl LruCapacity {
    /// The index's capacity in blocks of `block_tokens` (≥ 1) on a replica described by `ctx`.
    pub fn blocks(self, ctx: &RouterContext, block_tokens: u32) -> Result<u64, String> {
        match self {
            LruCapacity::Blocks(0) => Err("lru_capacity must be at least 1 block, or auto".into()),
            LruCapacity::Blocks(b) => Ok(b),
            // Upstream's fallback when the engine reports no block count: 31,250.
            LruCapacity::Auto => Ok(match ctx.kv_capacity_tokens / block_tokens as u64 {
                0 => 31_250,
                b => b,
            }),
        }
    }
}

#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub queue_weight: f64,
    pub kv_cache_weight: f64,
    pub prefix_weight: f64,
    pub no_hit_lru_weight: f64,
    pub no_hit_lru_size: u32,
    pub match_length_weight: f64,
    pub match_length_scale_tokens: u32,
    pub block_tokens: u32,
    pub max_prefix_blocks: u32,
    pub prefix_state: PrefixState,
    pub lru_capacity: LruCapacity,
    pub lora_weight: f64,
    pub cpu_weight: f64,
    pub remote_weight: f64,
    pub lora_state_weight: f64,
    pub lora_state: lora_load_state::Scores,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            queue_weight: 2.0,
            kv_cache_weight: 2.0,
            prefix_weight: 3.0,
            no_hit_lru_weight: 0.0,
            no_hit_lru_size: 1024,
            match_length_weight: 0.0,
            match_length_scale_tokens: 8192,
            block_tokens: 16,
            max_prefix_blocks: 256,
            prefix_state: PrefixState::Approximate,
            lru_capacity: LruCapacity::Auto,
            lora_weight: 0.0,
            cpu_weight: 0.8,
            remote_weight: 1.0,
            lora_state_weight: 0.0,
            lora_state: lora_load_state::Scores::default(),
        }
    }
}

pub struct LlmD {
    cfg: Config,
    rng: PolicyRng,
    /// The prompt cut into runs of blocks (also cuts eviction notices' paths), for request
    /// `prompt_for`.
    prompt: PromptRuns,
    prompt_for: Option<u64>,
    /// Which replicas hold which blocks, per run of blocks (by id, as `matched` and `cold_lru`).
    index: Index,
    members: Members,
    matched: Vec<u32>,
    /// Per routable index, the prefix scorer's block count: `matched` of its id, plus the
    /// tiers' weighted blocks.
    weighted: Vec<f64>,
    /// Per routable index (the first `routable`).
    scores: Vec<f64>,
    routable: usize,
    /// No-hit LRU: replicas that took a cold request, least recently first.
    cold_lru: Vec<usize>,
    /// Whether request `.0` was cold when scored.
    cold_for: Option<(u64, bool)>,
}

enum Index {
    /// Per replica an LRU of block hashes: it forgets a prompt's first blocks first, so a
    /// replica's blocks can have gaps.
    Approximate(LruRuns),
    /// A replica's blocks are what dispatches added and eviction notices did not take.
    Precise(HeldRuns),
}

impl Policy for LlmD {
    const NAME: &'static str = "llm_d";
    const DESCRIPTION: &'static str =
        "llm-d endpoint picker: weighted queue, KV-utilisation and prefix scorers, max score";
    type Config = Config;
    type Context = RouterContext;
    fn new(cfg: Config, ctx: &RouterContext) -> Result<Self, String> {
        for (name, w) in [
            ("queue_weight", cfg.queue_weight),
            ("kv_cache_weight", cfg.kv_cache_weight),
            ("prefix_weight", cfg.prefix_weight),
            ("no_hit_lru_weight", cfg.no_hit_lru_weight),
            ("lora_weight", cfg.lora_weight),
            ("cpu_weight", cfg.cpu_weight),
            ("remote_weight", cfg.remote_weight),
            ("lora_state_weight", cfg.lora_state_weight),
        ] {
            if !(w >= 0.0 && w.is_finite()) {
                return Err(format!("{name} must be a finite number ≥ 0 (got {w}); 0 switches the scorer off"));
            }
        }
        cfg.lora_state.check()?;
        if !(0.0..=1.0).contains(&cfg.match_length_weight) {
            return Err(format!("match_length_weight must be in [0, 1] (got {})", cfg.match_length_weight));
        }
        if cfg.match_length_scale_tokens == 0 {
            return Err("match_length_scale_tokens must be at least 1 (upstream default 8192)".into());
        }
        if cfg.no_hit_lru_size == 0 {
            return Err("no_hit_lru_size must be at least 1 (upstream default 1024)".into());
        }
        if cfg.block_tokens == 0 {
            return Err("block_tokens must be at least 1 (vLLM's default KV block is 16)".into());
        }
        if cfg.max_prefix_blocks == 0 {
            return Err("max_prefix_blocks must be at least 1 (upstream default 256)".into());
        }
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
            prompt_for: None,
            index,
            members: Members::new(n),
            matched: vec![0; n],
            weighted: vec![0.0; n],
            scores: vec![0.0; n],
            routable: n,
            cold_lru: Vec::new(),
            cold_for: None,
        })
    }
}

impl LlmD {
    /// Scraped metric: requests waiting at replica `i`, as last scraped (signal column 0); the
    /// live view when the caller gives no signal table (unit tests: always fresh).
    fn waiting(replicas: &Replicas<'_>, i: usize) -> f64 {
        if replicas.signal_columns >= 2 { replicas.signal(i, 0) } else { replicas[i].waiting as f64 }
    }

    /// Scraped metric: replica `i`'s KV-cache usage in [0, 1], as last scraped (signal column 1).
    fn kv_usage(replicas: &Replicas<'_>, i: usize) -> f64 {
        if replicas.signal_columns >= 2 {
            return replicas.signal(i, 1);
        }
        let v = &replicas[i];
        if v.kv_capacity_tokens == 0 { 0.0 } else { v.kv_used_tokens as f64 / v.kv_capacity_tokens as f64 }
    }

    /// Cuts the prompt into runs of blocks, once per request: full blocks only when precise,
    /// the partial last block too and at most `max_prefix_blocks` when approximate (upstream).
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
    }

    /// Per replica, the prefix scorer's matched blocks.
    fn match_blocks(&mut self) {
        let runs = &self.prompt.runs;
        match &mut self.index {
            Index::Precise(held) => held.consecutive(runs, self.prompt.blocks, &mut self.matched),
            Index::Approximate(lru) => lru.matched(runs, &mut self.matched),
        }
    }

    /// The signal column of `tier.cpu.matched_tokens` (`tier.remote.matched_tokens` follows),
    /// when the prefix scorer weighs the tiers: precise, and a tier weight other than 0.
    fn tier_column(&self) -> Option<usize> {
        let weighs = self.cfg.cpu_weight > 0.0 || self.cfg.remote_weight > 0.0;
        (self.cfg.prefix_state == PrefixState::Precise && self.cfg.prefix_weight > 0.0 && weighs)
            .then(|| 2 + if self.reads_lora() { LORA_SIGNALS.len() } else { 0 })
    }

    /// Per routable index, `matched` of its id plus the tiers' blocks past it, weighted
    /// (`self.weighted`).
    fn weigh_tiers(&mut self, replicas: &Replicas<'_>) {
        let column = self.tier_column().filter(|&k| replicas.signal_columns as usize >= k + 2);
        let b = self.cfg.block_tokens as u64;
        self.weighted.clear();
        for i in 0..replicas.len() {
            let mut w = self.matched[self.members.id(i)] as f64;
            if let Some(k) = column {
                let blocks = |k| ((replicas.signal(i, k) as u64) / b) as f64;
                w += self.cfg.cpu_weight * blocks(k) + self.cfg.remote_weight * blocks(k + 1);
            }
            self.weighted.push(w);
        }
    }

    /// The totals of the last scoring (`route` or [`LlmD::scores`]), per routable index: what
    /// the max-score picker chose from. Read-only, for decision-level tests.
    pub fn last_scores(&self) -> &[f64] {
        &self.scores
    }

    /// Every replica's weighted total for `request` (fills `self.scores`), with engine metrics
    /// read live from `views`.
    pub fn scores(&mut self, request: &Request<'_>, views: &[ReplicaView]) -> &[f64] {
        self.scores_of(request, &Replicas::new(views))
    }

    /// Every replica's weighted total for `request`, engine metrics from the scraped signals.
    fn scores_of(&mut self, request: &Request<'_>, replicas: &Replicas<'_>) -> &[f64] {
        let n = replicas.len();
        self.routable = n;
        self.scores.clear();
        self.scores.resize(n, 0.0);
        if self.cfg.queue_weight > 0.0 {
            let (lo, hi) = (0..n)
                .map(|i| Self::waiting(replicas, i))
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), q| (a.min(q), b.max(q)));
            for (i, s) in self.scores.iter_mut().enumerate() {
                let q = if hi == lo { 1.0 } else { (hi - Self::waiting(replicas, i)) / (hi - lo) };
                *s += self.cfg.queue_weight * q;
            }
        }
        if self.cfg.kv_cache_weight > 0.0 {
            for (i, s) in self.scores.iter_mut().enumerate() {
                *s += self.cfg.kv_cache_weight * (1.0 - Self::kv_usage(replicas, i)).clamp(0.0, 1.0);
            }
        }
        if self.cfg.lora_weight > 0.0 && replicas.signal_columns >= 2 + LORA_SIGNALS.len() as u32 {
            for (i, s) in self.scores.iter_mut().enumerate() {
                let f = |k: usize| replicas.signal(i, 2 + k);
                *s += self.cfg.lora_weight * lora_affinity(f(0) > 0.0, f(1) > 0.0, f(2) + f(3) < f(4));
            }
        }
        if self.cfg.lora_state_weight > 0.0 && replicas.signal_columns >= 2 + LORA_SIGNALS.len() as u32 {
            // The request fact `adapter` (NaN: the base model).
            let adapter = request.facts().first().filter(|a| !a.is_nan()).map(|&a| a as u32);
            let home = adapter.map_or(0, |a| lora_load_state::home(a, n));
            let w = self.cfg.lora_state_weight;
            for (i, s) in self.scores.iter_mut().enumerate() {
                let f = |k: usize| replicas.signal(i, 2 + k);
                let replica = lora_load_state::Replica { resident: f(5) > 0.0, busy: f(2), slots: f(4) };
                *s += w * lora_load_state::score(&self.cfg.lora_state, adapter, replica, i, home);
            }
        }
        if self.uses_prefix() {
            self.hash_prompt(request);
            self.match_blocks();
        }
        if self.cfg.prefix_weight > 0.0 {
            self.weigh_tiers(replicas);
            let total = self.prompt.blocks;
            if total > 0 {
                let (w, scale) = (self.cfg.match_length_weight, self.cfg.match_length_scale_tokens as f64);
                let b = self.cfg.block_tokens as f64;
                for (s, &m) in self.scores.iter_mut().zip(&self.weighted) {
                    let ratio = m / total as f64;
                    let score = if w > 0.0 {
                        let length = (m * b / scale).min(1.0);
                        w * length * length + (1.0 - w) * ratio
                    } else {
                        ratio
                    };
                    *s += self.cfg.prefix_weight * score.clamp(0.0, 1.0);
                }
            }
        }
        if self.cfg.no_hit_lru_weight > 0.0 {
            let cold = self.is_cold(n);
            self.cold_for = Some((request.id, cold));
            let w = self.cfg.no_hit_lru_weight;
            if !cold {
                self.scores.iter_mut().for_each(|s| *s += w * 0.5);
            } else if n == 1 {
                self.scores[0] += w;
            } else {
                // Never-used replicas first (index order), then the LRU, oldest first.
                let mut rank = 0usize;
                let denom = (n - 1) as f64;
                for (i, s) in self.scores.iter_mut().enumerate() {
                    if !self.cold_lru.contains(&self.members.id(i)) {
                        *s += w * (1.0 - rank as f64 / denom).max(0.0);
                        rank += 1;
                    }
                }
                for &id in &self.cold_lru {
                    if let Some(i) = self.members.index_of(id).filter(|&i| i < n) {
                        self.scores[i] += w * (1.0 - rank as f64 / denom).max(0.0);
                        rank += 1;
                    }
                }
            }
        }
        &self.scores
    }

    /// Whether no routable replica (of `n`) matches any of the prompt's blocks.
    fn is_cold(&self, n: usize) -> bool {
        (0..n).all(|i| self.matched[self.members.id(i)] == 0)
    }

    /// Whether a scorer reads the `lora.*` signals.
    fn reads_lora(&self) -> bool {
        self.cfg.lora_weight > 0.0 || self.cfg.lora_state_weight > 0.0
    }

    /// Whether a scorer reads the prefix index.
    fn uses_prefix(&self) -> bool {
        self.cfg.prefix_weight > 0.0 || self.cfg.no_hit_lru_weight > 0.0
    }

    /// No-hit LRU: a cold request moves its replica (id `r`) to the most-recent end.
    fn touch_cold(&mut self, request: &Request<'_>, r: usize) {
        let cold = match self.cold_for {
            Some((id, cold)) if id == request.id => cold,
            _ => {
                self.match_blocks();
                self.is_cold(self.routable)
            }
        };
        if !cold {
            return;
        }
        self.cold_lru.retain(|&i| i != r);
        self.cold_lru.push(r);
        if self.cold_lru.len() > self.cfg.no_hit_lru_size as usize {
            self.cold_lru.remove(0);
        }
    }

    fn record(&mut self, r: usize) {
        let runs = &self.prompt.runs;
        match &mut self.index {
            Index::Approximate(lru) => lru.record(runs, r),
            Index::Precise(held) => {
                for run in runs {
                    held.insert(run.key, run.blocks, r, None);
                }
            }
        }
    }
}

/// What the LoRA scorers read, in this order (signal columns 2..).
const LORA_SIGNALS: [&str; 6] = [
    signals::LORA_RUNNING,
    signals::LORA_WAITING,
    signals::LORA_RUNNING_ADAPTERS,
    signals::LORA_WAITING_ADAPTERS,
    signals::LORA_MAX_ADAPTERS,
    signals::LORA_RESIDENT,
];

/// GIE's LoRA affinity score of a replica: `active` (a request on the adapter runs there),
/// `waiting` (one waits there), `room` (running + waiting adapters below `max_loras`).
pub fn lora_affinity(active: bool, waiting: bool, room: bool) -> f64 {
    match () {
        _ if active => 1.0,
        _ if room => 0.8,
        _ if waiting => 0.6,
        _ => 0.0,
    }
}

impl RouterPolicy for LlmD {
    fn capabilities(&self) -> Capabilities {
        if self.cfg.prefix_state == PrefixState::Precise { Capabilities::WANTS_EVICTIONS } else { Capabilities::NONE }
    }

    /// Waiting requests and KV utilisation as upstream's EPP reads them: scraped from the engines.
    /// With a LoRA scorer, the `lora.*` figures follow (live).
    fn signals(&self) -> Vec<String> {
        let mut s = vec![signals::SCRAPED_WAITING.into(), signals::SCRAPED_KV_UTILISATION.into()];
        if self.reads_lora() {
            s.extend(LORA_SIGNALS.iter().map(|n| n.to_string()));
        }
        if self.tier_column().is_some() {
            s.extend([signals::TIER_CPU_MATCHED_TOKENS.into(), signals::TIER_REMOTE_MATCHED_TOKENS.into()]);
        }
        s
    }

    /// The load-state scorer reads the request's adapter.
    fn request_facts(&self) -> Vec<String> {
        if self.cfg.lora_state_weight > 0.0 { vec![facts::request::ADAPTER.into()] } else { Vec::new() }
    }

    fn route(&mut self, request: &Request<'_>, replicas: &Replicas<'_>) -> usize {
        self.scores_of(request, replicas);
        // Max score, ties uniformly at random (reservoir sampling over the maxima).
        argmax_random_tie(self.scores[..replicas.len()].iter().copied(), &mut self.rng).expect("at least one replica")
    }

    fn on_dispatch(&mut self, request: &Request<'_>, r: usize) {
        let r = self.members.id(r);
        if self.uses_prefix() {
            self.hash_prompt(request);
            if self.cfg.no_hit_lru_weight > 0.0 {
                self.touch_cold(request, r);
            }
            self.record(r);
        }
    }

    fn on_evict(&mut self, e: &Eviction<'_>) {
        let Index::Precise(held) = &mut self.index else { return };
        let Some(r) = self.members.get(e.replica_index()) else { return };
        if let Some((run, from)) = self.prompt.evicted(e) {
            held.remove(run.key, from, run.blocks, r);
        }
    }

    /// A replica that leaves is forgotten: its blocks and its no-hit LRU place (the EPP's
    /// `RemovePod`).
    fn on_replica_change(&mut self, change: &ReplicaChange) {
        self.routable = change.routable as usize;
        if let Some(Member::Left(id)) = self.members.change(change) {
            match &mut self.index {
                Index::Approximate(lru) => lru.forget(id),
                Index::Precise(held) => held.forget(id),
            }
            self.cold_lru.retain(|&r| r != id);
            self.cold_for = None;
        }
    }

    fn report(&self) -> Vec<(String, f64)> {
        let (replicas, held) = match &self.index {
            Index::Approximate(lru) => (lru.replicas(), (0..lru.replicas()).map(|r| lru.held_blocks(r)).sum::<u64>()),
            Index::Precise(held) => (held.replicas(), (0..held.replicas()).map(|r| held.held_blocks(r)).sum()),
        };
        let n = replicas.max(1) as f64;
        vec![("router_indexed_blocks_mean".into(), held as f64 / n)]
    }
}
