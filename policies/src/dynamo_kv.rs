//! `dynamo_kv`: NVIDIA Dynamo's KV-aware router (the default worker selector).
//!
//! Algorithm (per request, for every replica w; block = `block_tokens` tokens):
//! 1. `overlap_w` = leading blocks of the prompt the router believes w has cached (chained block
//!    hashes, full blocks only, matched from block 0 without a gap).
//! 2. `prefill_blocks_w = (active_prefill_tokens_w + prompt_tokens) / block_tokens`, where
//!    `active_prefill_tokens_w` is the uncached prompt tokens of w's requests still waiting for
//!    their prefill.
//! 3. `decode_blocks_w` = the distinct prompt blocks of w's in-flight requests plus the blocks of
//!    this prompt not among them (KV blocks de-duplicated by hash: `router_assume_kv_reuse`).
//! 4. `cost_w = prefill_load_scale · max(prefill_blocks_w − overlap_score_credit · overlap_w, 0)
//!    + decode_blocks_w`.
//! 5. `temperature` 0: the lowest cost, ties uniformly at random (reservoir sampling). Above 0:
//!    sample w with probability ∝ `exp(−(cost_w − min) / ((max − min) · temperature))`
//!    (uniform when all costs are equal).
//! 6. At dispatch the prompt's blocks are recorded for w. Prefix state (`prefix_state`):
//!    `events` — kept until the replica reports evicting them (`on_evict`, which the host
//!    delivers after the workload's `eviction_delay_s`: Dynamo's KV events); `approximate` —
//!    the router's own decisions, each block forgotten `ttl_s` after it was last routed to w
//!    (`--no-router-kv-events`), expiry rounded up to 100 ms buckets as upstream does.
//!
//! Parameters (defaults): `block_tokens` 16, `overlap_score_credit` 1.0, `prefill_load_scale`
//! 1.0, `temperature` 0, `prefix_state` events, `ttl_s` 120.
//! `block_tokens` 16: Dynamo takes the block size from the engine, and 16 is vLLM's default KV
//! block on CUDA (SGLang pages are 1 token, TensorRT-LLM's default 32): the common deployment.
//!
//! Source: ai-dynamo/dynamo `lib/kv-router`, read in the published crate `dynamo-kv-router`
//! 1.6.1: `src/scheduling/selector/reference.rs` (`worker_logit`, `softmax_sample_index`,
//! reservoir ties), `src/scheduling/config.rs` (defaults), `src/indexer/pruning.rs` (TTL 120 s,
//! 100 ms buckets, refreshed by every routing decision), `src/protocols.rs` (full blocks only),
//! `src/sequences/prefill_tracker.rs` (active prefill tokens).
//!
//! Deviations, and why:
//! - Dynamo learns a request's prefill is done from its first streamed token; the host gives a
//!   router no first-token hook, so the requests still waiting are taken as the last
//!   `waiting_w` dispatched to w (FIFO admission) — an engine metric, read in
//!   [`DynamoKv::queued_requests`] only. A request mid-prefill (chunked) counts as done. It is
//!   the live count, not the `scraped.waiting` signal: it stands in for Dynamo's own tracking,
//!   which is exact, not for a scrape.
//! - Events mode records blocks at dispatch (the simulator emits no "stored" events), so a
//!   block counts as cached a prefill earlier than Dynamo would see it.
//! - Host and disk tiers, the credit decay (default 0), the queue threshold (default off),
//!   per-request overrides, DP ranks and the 2^20-node pruning are not modelled.
//! - Blocks are hashed from segments (toolkit `BlockHashing`), not XXH3 over token ids.

use rand::RngExt;
use routelab_policy_api::*;
use serde::{Deserialize, Serialize};

use crate::index::block_index::KeyMap;
use crate::index::block_runs::{ActiveRuns, HeldRuns, PromptRuns, Run};

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum PrefixState {
    /// Blocks stay until the replica reports their eviction (KV events).
    Events,
    /// Blocks expire `ttl_s` after the last routing decision that touched them.
    Approximate,
}

#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub block_tokens: u32,
    pub overlap_score_credit: f64,
    pub prefill_load_scale: f64,
    pub temperature: f64,
    pub prefix_state: PrefixState,
    pub ttl_s: f64,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            block_tokens: 16,
            overlap_score_credit: 1.0,
            prefill_load_scale: 1.0,
            temperature: 0.0,
            prefix_state: PrefixState::Events,
            ttl_s: 120.0,
        }
    }
}

/// Upstream rounds TTL expiries up to 100 ms buckets.
const BUCKETS_PER_S: f64 = 10.0;

struct InFlight {
    replica: usize,
    runs: Vec<Run>,
}

pub struct DynamoKv {
    cfg: Config,
    rng: PolicyRng,
    /// Blocks believed cached, per replica (stamped with their expiry bucket when approximate).
    cached: HeldRuns,
    /// Prompt blocks of in-flight requests (the decode load).
    active: ActiveRuns,
    in_flight: KeyMap<InFlight>,
    /// Per replica: cumulative uncached prompt tokens of the requests dispatched there, in order.
    prefill_cum: Vec<Vec<u64>>,
    /// The prompt's blocks as runs (also cuts eviction notices' paths), for request `prompt_for`.
    prompt: PromptRuns,
    prompt_for: Option<u64>,
    /// The request whose overlaps `overlap` holds.
    overlap_for: Option<u64>,
    overlap: Vec<u32>,
    shared: Vec<u32>,
    costs: Vec<f64>,
    chosen_overlap_blocks: u64,
    decisions: u64,
}

impl Policy for DynamoKv {
    const NAME: &'static str = "dynamo_kv";
    const DESCRIPTION: &'static str =
        "NVIDIA Dynamo KV router: prefill blocks minus cached overlap plus decode blocks, argmin or softmax";
    type Config = Config;
    type Context = RouterContext;
    fn new(cfg: Config, ctx: &RouterContext) -> Result<Self, String> {
        if cfg.block_tokens == 0 {
            return Err("block_tokens must be at least 1 (Dynamo uses the engine's KV block, 16 for vLLM)".into());
        }
        for (name, v) in
            [("overlap_score_credit", cfg.overlap_score_credit), ("prefill_load_scale", cfg.prefill_load_scale)]
        {
            if !(v >= 0.0 && v.is_finite()) {
                return Err(format!("{name} must be a finite number ≥ 0 (got {v})"));
            }
        }
        if !(cfg.temperature >= 0.0 && cfg.temperature.is_finite()) {
            return Err(format!("temperature must be ≥ 0 (got {}); 0 picks the cheapest replica", cfg.temperature));
        }
        if !(cfg.ttl_s > 0.0 && cfg.ttl_s.is_finite()) {
            return Err(format!("ttl_s must be positive (got {})", cfg.ttl_s));
        }
        let n = ctx.replicas as usize;
        Ok(Self {
            prompt: PromptRuns::new(cfg.block_tokens),
            cfg,
            rng: policy_rng(ctx.seed),
            cached: HeldRuns::new(n),
            active: ActiveRuns::new(n),
            in_flight: KeyMap::default(),
            prefill_cum: vec![vec![0]; n],
            prompt_for: None,
            overlap_for: None,
            overlap: vec![0; n],
            shared: vec![0; n],
            costs: vec![0.0; n],
            chosen_overlap_blocks: 0,
            decisions: 0,
        })
    }
}

impl DynamoKv {
    /// Requests queued at the replica and not yet admitted: the one engine metric this router
    /// reads (see the module docs).
    fn queued_requests(v: &ReplicaView) -> u32 {
        v.waiting
    }

    /// Uncached prompt tokens of the requests still waiting on replica `r`.
    fn active_prefill_tokens(&self, r: usize, view: &ReplicaView) -> u64 {
        let cum = &self.prefill_cum[r];
        let last = cum.len() - 1;
        let k = (Self::queued_requests(view) as usize).min(last);
        cum[last] - cum[last - k]
    }

    fn hash_prompt(&mut self, request: &Request<'_>) {
        if self.prompt_for != Some(request.id) {
            self.prompt.cut(request.segments.as_slice());
            self.prompt_for = Some(request.id);
        }
    }

    fn expire(&mut self, now: f64) {
        if self.cfg.prefix_state == PrefixState::Approximate {
            self.cached.expire_before((now * BUCKETS_PER_S).floor() as u64 + 1);
        }
    }

    /// Every replica's cost for `request` (fills `self.costs`).
    pub fn costs(&mut self, request: &Request<'_>, replicas: &[ReplicaView]) -> &[f64] {
        self.expire(request.arrived_at);
        self.hash_prompt(request);
        let (runs, blocks) = (&self.prompt.runs, self.prompt.blocks);
        self.cached.consecutive(runs, blocks, &mut self.overlap);
        self.active.consecutive(runs, blocks, &mut self.shared);
        self.overlap_for = Some(request.id);
        let b = self.cfg.block_tokens as f64;
        let request_blocks = request.prompt_tokens.div_ceil(self.cfg.block_tokens) as f64;
        for (r, view) in replicas.iter().enumerate() {
            let prefill_blocks = (self.active_prefill_tokens(r, view) + request.prompt_tokens as u64) as f64 / b;
            let credit = self.cfg.overlap_score_credit * self.overlap[r] as f64;
            let decode_blocks = self.active.held_blocks(r) as f64 + request_blocks - self.shared[r] as f64;
            self.costs[r] = self.cfg.prefill_load_scale * (prefill_blocks - credit).max(0.0) + decode_blocks;
        }
        &self.costs
    }

    /// Upstream's softmax sampling over normalised costs.
    fn softmax_pick(&mut self) -> usize {
        let (lo, hi) = self.costs.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &c| (a.min(c), b.max(c)));
        let n = self.costs.len();
        let u: f64 = self.rng.random();
        if lo == hi {
            return ((u * n as f64) as usize).min(n - 1);
        }
        let scale = (hi - lo) * self.cfg.temperature;
        let sum: f64 = self.costs.iter().map(|&c| (-(c - lo) / scale).exp()).sum();
        let mut acc = 0.0;
        for (i, &c) in self.costs.iter().enumerate() {
            acc += (-(c - lo) / scale).exp() / sum;
            if u <= acc {
                return i;
            }
        }
        n - 1
    }
}

impl RouterPolicy for DynamoKv {
    fn capabilities(&self) -> Capabilities {
        if self.cfg.prefix_state == PrefixState::Events { Capabilities::WANTS_EVICTIONS } else { Capabilities::NONE }
    }

    fn route(&mut self, request: &Request<'_>, replicas: &Replicas<'_>) -> usize {
        self.costs(request, replicas);
        let pick = if self.cfg.temperature == 0.0 {
            argmin_random_tie(self.costs.iter().copied(), &mut self.rng).expect("replicas")
        } else {
            self.softmax_pick()
        };
        self.decisions += 1;
        self.chosen_overlap_blocks += self.overlap[pick] as u64;
        pick
    }

    fn on_dispatch(&mut self, request: &Request<'_>, r: usize) {
        self.hash_prompt(request);
        let runs = &self.prompt.runs;
        let overlap =
            if self.overlap_for == Some(request.id) { self.overlap[r] as u64 } else { self.cached.leading(runs, r) };
        let bucket = (self.cfg.prefix_state == PrefixState::Approximate)
            .then(|| ((request.arrived_at + self.cfg.ttl_s) * BUCKETS_PER_S).ceil() as u64);
        for run in runs {
            self.cached.insert(run.key, run.blocks, r, bucket);
            self.active.add(run.key, run.blocks, r);
        }
        let uncached = (request.prompt_tokens as u64).saturating_sub(overlap * self.cfg.block_tokens as u64);
        let cum = &mut self.prefill_cum[r];
        cum.push(cum.last().copied().unwrap_or(0) + uncached);
        self.in_flight.insert(mix64(request.id), InFlight { replica: r, runs: runs.clone() });
    }

    fn on_complete(&mut self, c: &Completion) {
        let Some(f) = self.in_flight.remove(&mix64(c.request_id)) else { return };
        for run in &f.runs {
            self.active.remove(run.key, run.blocks, f.replica);
        }
    }

    fn on_evict(&mut self, e: &Eviction<'_>) {
        if self.cfg.prefix_state != PrefixState::Events {
            return;
        }
        if let Some((run, from)) = self.prompt.evicted(e) {
            self.cached.remove(run.key, from, run.blocks, e.replica as usize);
        }
    }

    fn report(&self) -> Vec<(String, f64)> {
        let n = self.cached.replicas().max(1) as f64;
        let held: u64 = (0..self.cached.replicas()).map(|r| self.cached.held_blocks(r)).sum();
        vec![
            ("router_overlap_blocks_mean".into(), self.chosen_overlap_blocks as f64 / self.decisions.max(1) as f64),
            ("router_cached_blocks_mean".into(), held as f64 / n),
        ]
    }
}
