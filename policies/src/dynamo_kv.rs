//! `dynamo_kv`: NVIDIA Dynamo's KV-aware router (the default worker selector).
//!
//! Algorithm (per request, for every replica w; block = `block_tokens` tokens):
//! 1. `overlap_w` = leading blocks of the prompt the router believes w has cached (chained block
//!    hashes, full blocks only, matched from block 0 without a gap).
//! 2. `prefill_blocks_w = (active_prefill_tokens_w + prompt_tokens) / block_tokens` (a fraction),
//!    where `active_prefill_tokens_w` is the uncached prompt tokens (`prompt − overlap · block`
//!    at dispatch) of w's requests whose first token is not out yet.
//! 3. `decode_blocks_w` = the distinct prompt blocks of w's in-flight requests plus the full
//!    blocks of this prompt (`prompt_tokens / block_tokens`, rounded down) not among them (KV
//!    blocks de-duplicated by hash: `router_assume_kv_reuse`).
//! 4. `role: aggregated` (default; also the prefill pool), `cost: linear` (default):
//!    `cost_w = prefill_load_scale · adjusted_w + decode_blocks_w + decode_active_request_weight ·
//!    active_requests_w`, where `adjusted_w = max(prefill_blocks_w − credit_w, 0)` and
//!    `credit_w = overlap_score_credit · overlap_w + host_cache_hit_weight · host_w +
//!    disk_cache_hit_weight · disk_w` (`host_w`, `disk_w`: the blocks past `overlap_w` that w's
//!    CPU tier and the shared remote tier hold — the engine signals `tier.cpu.matched_tokens` and
//!    `tier.remote.matched_tokens` over `block_tokens`, rounded down; 0 without KV tiers) (`prefill_floor: true`, the pinned crate) or the same without the `max`
//!    (`prefill_floor: false`, Dynamo since PR #11714: a credit above 1 can then push the
//!    prefill term below 0 and offset decode load; at a credit ≤ 1 the two are equal, since
//!    `overlap_w ≤ prompt_tokens / block_tokens ≤ prefill_blocks_w`), and `active_requests_w` is
//!    the router's count of w's requests dispatched and not finished.
//!    `cost: lmetric` (Dynamo PR #11028, after the LMetric paper): `cost_w = adjusted_w ·
//!    (decode_blocks_w + 1)` with the floored `adjusted_w` — prefill and decode pressure
//!    multiply instead of adding. Upstream keeps the decode pool on `linear` and requires
//!    prefill tracking, so `lmetric` is refused with `role: decode`; the PR's formula has no
//!    `prefill_load_scale` and no active-request term, so both must stay at their defaults.
//!    `role: decode` (a decode pool: no prefill tracking): `cost_w = max(0, decode_blocks_w −
//!    credit_w) + decode_active_request_weight · active_requests_w`, which is
//!    `decode_blocks_w + …` at `overlap_score_credit` 0.
//! 5. `temperature` 0: the lowest cost, ties uniformly at random (reservoir sampling). Above 0:
//!    sample w with probability ∝ `exp(−(cost_w − min) / ((max − min) · temperature))`
//!    (uniform when all costs are equal), computed as upstream computes it
//!    ([`softmax_sample_index`]), so one draw picks the same replica in both.
//! 6. At dispatch the prompt's blocks are recorded for w, and its uncached tokens (`prompt −
//!    round((overlap_w + host_cache_hit_weight · host_w + disk_cache_hit_weight · disk_w) ·
//!    block_tokens)`, upstream's `effective_cached_tokens`) join w's active prefill tokens. Prefix state (`prefix_state`):
//!    `events` — kept until the replica reports evicting them (`on_evict`, which the host
//!    delivers after the workload's `eviction_delay_s`: Dynamo's KV events); `approximate` —
//!    the router's own decisions, each block forgotten `ttl_s` after it was last routed to w
//!    (`--no-router-kv-events`), expiry rounded up to 100 ms buckets as upstream does.
//!
//! Parameters (defaults): `block_tokens` 16, `overlap_score_credit` 1.0, `prefill_load_scale`
//! 1.0, `temperature` 0, `prefix_state` events, `ttl_s` 120, `role` aggregated, `cost` linear,
//! `prefill_floor` true, `decode_active_request_weight` 0 (upstream's default; its agentic
//! preset, PR #13447, uses 64 with credit 2 and scale 4), `host_cache_hit_weight` 0.75,
//! `disk_cache_hit_weight` 0.25 (upstream's defaults; the tier terms apply with `prefix_state:
//! events` only — upstream learns tiers from KV events, and its approximate indexer has none).
//! `block_tokens` 16: Dynamo takes the block size from the engine, and 16 is vLLM's default KV
//! block on CUDA (SGLang pages are 1 token, TensorRT-LLM's default 32): the common deployment.
//!
//! Source: ai-dynamo/dynamo `lib/kv-router`, read in the published crate `dynamo-kv-router`
//! 1.6.1 (crates.io), paths inside it:
//! - `src/scheduling/selector/reference.rs`: `worker_logit` (l. 286–422: the decode-pool branch
//!   `max(0, decode_blocks − overlap_credit_blocks)` at l. 340–363 when `worker_type ==
//!   "decode"`, no prefill tracking and a positive credit; otherwise `raw_prefill_tokens =
//!   active_prefill_tokens + isl` at l. 366–378), `softmax_sample_index` (l. 40–89),
//!   reservoir ties (`pick_default_worker`, l. 526–543);
//! - `src/scheduling/selector/mod.rs` l. 247–256: `decode_cost_blocks =
//!   potential_decode_blocks()`; `src/sequences/prompt_registry.rs` l. 41 and l. 312–318:
//!   `active_decode_blocks + additional_active_blocks`, the latter `query_len − overlap_depth`
//!   over the request's block hashes, which `src/protocols.rs` l. 114–129
//!   (`complete_block_count`: `tokens / block_size`) makes full blocks only;
//! - `src/sequences/prefill_tracker.rs` and `src/scheduling/prefill_load.rs` l. 17
//!   (`effective_prefill_tokens = isl − cached`, no decay without a duration estimate);
//!   `src/sequences/multi_worker.rs` l. 1057 (`mark_prefill_completed`, called on the first
//!   token, drops a request's prefill tokens);
//! - `src/scheduling/config.rs` (defaults; `default_host_cache_hit_weight` 0.75 and
//!   `default_disk_cache_hit_weight` 0.25 at l. 79–85), `src/indexer/pruning.rs` (TTL 120 s,
//!   100 ms buckets, refreshed by every routing decision);
//! - KV tiers: `src/scheduling/selector/reference.rs` l. 326–331 (`overlap_credit_blocks =
//!   credit · device + host_cache_hit_weight · host_overlap_blocks + disk_cache_hit_weight ·
//!   disk_overlap_blocks`, used by both branches), `src/scheduling/overlap.rs`
//!   (`tier_overlap_blocks_from_tiered_matches`: host-pinned hits are the blocks continuing the
//!   device match, disk and external hits the blocks continuing that; `cache_hit_weight_for_tier`
//!   l. 361–367; `cache_hit_estimates_from_tiered_matches`: effective cached tokens =
//!   round(weighted blocks · block size)).
//!
//! The 2026 options: `prefill_floor: false` follows ai-dynamo/dynamo PR #11714 (merged
//! 2026-07-15, head 47a8602e: "remove the zero floor from adjusted prefill blocks"; the
//! Python binding's `KvRouterConfig` docs since: a credit above 1 "can make adjusted prefill
//! cost negative"); the decode pool's clamp stays, as upstream keeps it. `cost: lmetric`
//! follows PR #11028 (open at the time of writing; `RouterSelectionPolicy::Lmetric`, formula
//! `adjusted_prefill_blocks * (decode_blocks + 1)`, linear kept for disaggregated decode).
//! `decode_active_request_weight` is in the pinned crate (`reference.rs` l. 333–334).
//!
//! `testing/dynamo-diff` runs this router and the crate's on the same states and asserts equal
//! costs, cheapest sets and softmax picks (the active-request weight included); the two
//! options the crate predates are pinned by hand-computed tests in
//! `policies/tests/routers/field_options_2026.rs`.
//!
//! Replicas coming and going (`on_replica_change`: crashes, autoscaling): state is kept by id
//! (`index::members`); a replica that leaves is forgotten — its cached and in-flight blocks,
//! its active requests and its prefill load — as Dynamo's indexer removes a worker that left
//! from every block it held (ai-dynamo/dynamo @ 4276866e, `lib/kv-router/src/radix_tree.rs`,
//! `remove_worker` → `remove_or_clear_worker_blocks`, called when the worker's instance goes
//! away); one that joins starts with none. Costs are computed for the routable replicas only.
//!
//! Deviations, and why:
//! - Dynamo learns a request's prefill is done from its first streamed token. Here the
//!   requests that still owe theirs are the last `waiting_w + prefilling_w` dispatched to w
//!   (FIFO admission and first tokens; `prefilling` is the engine signal for requests admitted
//!   whose first token is not out, chunked prefill included) — read in
//!   [`DynamoKv::prefill_pending`] only. Out-of-order first tokens (a short prompt admitted
//!   beside a long one) are attributed to the newest requests.
//! - Events mode records blocks at dispatch (the simulator emits no "stored" events), so a
//!   block counts as cached a prefill earlier than Dynamo would see it.
//! - Tier hits are the host's exact walk past the GPU match (signals), not the router's own
//!   index of tiered KV events: no eviction delay below the GPU, and the walk tries the CPU tier
//!   then the remote tier segment by segment where upstream's chain takes every host block
//!   before the first disk one.
//! - The credit decay (default 0), the queue threshold (default off),
//!   per-request overrides, DP ranks and the 2^20-node pruning are not modelled.
//! - Blocks are hashed from segments (toolkit `BlockHashing`), not XXH3 over token ids.
//!
//! Hints (agentic requests): no option, because upstream's worker selection reads none. Dynamo's
//! agent hints (`nvext.agent_hints`: `osl`, `priority`, `speculative_prefill`; ai-dynamo/dynamo
//! @ 03f06d19, `lib/llm/src/protocols/openai/nvext.rs`, `AgentHints`) reach the router as
//! `expected_output_tokens`, which the cost above never reads: it is used only with
//! `router_track_output_blocks` (off by default), where the request's stream adds an output
//! block at each block boundary and weighs the request's own blocks by `max(0, 1 − generated /
//! osl)` (@ ecd29799, `lib/llm/src/kv_router.rs`, the response-stream loop; @ 04df1c42,
//! `lib/kv-router/src/sequences/single.rs`, `add_output_block`) — it needs every streamed token,
//! which a routelab router does not hear (dispatch and completion only), and routelab's
//! `dynamo_kv` counts prompt blocks only, as the default does. `priority` orders the router's
//! queue (`router_queue_threshold`), an admission step, not the selection. The request fact
//! `hint.output_tokens` is read by `least_work_left{work: hints}`.

use rand::RngExt;
use routelab_policy_api::*;
use serde::{Deserialize, Serialize};

use crate::index::block_index::KeyMap;
use crate::index::block_runs::{ActiveRuns, HeldRuns, PromptRuns, Run};
use crate::index::members::{Member, Members};

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
    pub role: Role,
    pub cost: Cost,
    pub prefill_floor: bool,
    pub decode_active_request_weight: f64,
    pub host_cache_hit_weight: f64,
    pub disk_cache_hit_weight: f64,
}

/// How the prefill and decode terms combine (upstream's `router_selection_policy`).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Cost {
    /// `prefill_load_scale · adjusted_prefill + decode_blocks` (Dynamo's default).
    Linear,
    /// `adjusted_prefill · (decode_blocks + 1)` (PR #11028).
    Lmetric,
}

/// Which of upstream's two cost formulas the router uses.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Prefill load (tracked) minus the overlap credit, plus decode blocks: an aggregated
    /// worker or the prefill pool.
    Aggregated,
    /// A decode pool's router: no prefill tracking; `max(0, decode_blocks − credit · overlap)`
    /// while the credit is positive (conditional disaggregation keeps it), else `decode_blocks`.
    Decode,
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
            role: Role::Aggregated,
            cost: Cost::Linear,
            prefill_floor: true,
            decode_active_request_weight: 0.0,
            host_cache_hit_weight: 0.75,
            disk_cache_hit_weight: 0.25,
        }
    }
}

/// Upstream rounds TTL expiries up to 100 ms buckets.
const BUCKETS_PER_S: f64 = 10.0;

struct InFlight {
    /// The id (`index::members`) it was placed on.
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
    /// Per replica: requests dispatched and not finished (upstream's `active_requests`).
    /// Per id (`index::members`), as `cached`, `active`, `prefill_cum`, `overlap` and `shared`;
    /// `costs` per routable index.
    active_requests: Vec<u32>,
    members: Members,
    /// Per replica: cumulative uncached prompt tokens of the requests dispatched there, in order.
    prefill_cum: Vec<Vec<u64>>,
    /// The prompt's blocks as runs (also cuts eviction notices' paths), for request `prompt_for`.
    prompt: PromptRuns,
    prompt_for: Option<u64>,
    /// The request whose overlaps `overlap` holds.
    overlap_for: Option<u64>,
    overlap: Vec<u32>,
    /// Per id: `overlap` plus the weighted tier blocks (upstream's effective overlap).
    effective: Vec<f64>,
    shared: Vec<u32>,
    costs: Vec<f64>,
    probabilities: Vec<f64>,
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
        for (name, v) in [
            ("overlap_score_credit", cfg.overlap_score_credit),
            ("prefill_load_scale", cfg.prefill_load_scale),
            ("decode_active_request_weight", cfg.decode_active_request_weight),
            ("host_cache_hit_weight", cfg.host_cache_hit_weight),
            ("disk_cache_hit_weight", cfg.disk_cache_hit_weight),
        ] {
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
        if cfg.cost == Cost::Lmetric {
            let clash = if cfg.role == Role::Decode {
                Some("role: decode (upstream keeps the decode pool on linear; lmetric needs prefill tracking)")
            } else if !cfg.prefill_floor {
                Some(
                    "prefill_floor: false (a negative prefill term times decode load would prefer the busiest replica)",
                )
            } else if cfg.prefill_load_scale != 1.0 {
                Some("prefill_load_scale ≠ 1 (the lmetric product has no scale; it would not change the argmin)")
            } else if cfg.decode_active_request_weight != 0.0 {
                Some("decode_active_request_weight ≠ 0 (the lmetric product has no active-request term)")
            } else {
                None
            };
            if let Some(clash) = clash {
                return Err(format!("cost: lmetric does not combine with {clash}; use cost: linear for it"));
            }
        }
        let n = ctx.replica_count();
        Ok(Self {
            prompt: PromptRuns::new(cfg.block_tokens),
            cfg,
            rng: policy_rng(ctx.seed),
            cached: HeldRuns::new(n),
            active: ActiveRuns::new(n),
            in_flight: KeyMap::default(),
            active_requests: vec![0; n],
            members: Members::new(n),
            prefill_cum: vec![vec![0]; n],
            prompt_for: None,
            overlap_for: None,
            overlap: vec![0; n],
            effective: vec![0.0; n],
            shared: vec![0; n],
            costs: vec![0.0; n],
            probabilities: Vec::with_capacity(n),
            chosen_overlap_blocks: 0,
            decisions: 0,
        })
    }
}

impl DynamoKv {
    /// Requests on replica `r` whose prefill is not done: queued (`waiting`) plus admitted with
    /// the first token not yet out (the `prefilling` signal) — the engine metrics this router
    /// reads in place of Dynamo's own prefill tracking (see the module docs).
    fn prefill_pending(replicas: &Replicas<'_>, r: usize) -> u64 {
        let prefilling = if replicas.signal_columns > 0 { replicas.signal(r, 0) as u64 } else { 0 };
        replicas[r].waiting as u64 + prefilling
    }

    /// Uncached prompt tokens of the requests on routable index `r` whose first token is not out
    /// yet.
    fn active_prefill_tokens(&self, r: usize, replicas: &Replicas<'_>) -> u64 {
        let cum = &self.prefill_cum[self.members.id(r)];
        let last = cum.len() - 1;
        let k = (Self::prefill_pending(replicas, r) as usize).min(last);
        cum[last] - cum[last - k]
    }

    /// Whether the cost reads the KV tiers' matches (signal columns 1 and 2).
    fn reads_tiers(&self) -> bool {
        self.cfg.prefix_state == PrefixState::Events
            && (self.cfg.host_cache_hit_weight > 0.0 || self.cfg.disk_cache_hit_weight > 0.0)
    }

    /// Replica `r`'s blocks past the GPU match held in its CPU tier and in the remote tier
    /// (signal columns 1 and 2, in whole blocks; 0 when the caller gives no such columns).
    fn tier_blocks(&self, replicas: &Replicas<'_>, r: usize) -> (f64, f64) {
        if !self.reads_tiers() || replicas.signal_columns < 3 {
            return (0.0, 0.0);
        }
        let b = self.cfg.block_tokens as u64;
        let blocks = |k| ((replicas.signal(r, k) as u64) / b) as f64;
        (blocks(1), blocks(2))
    }

    fn hash_prompt(&mut self, request: &Request<'_>) {
        if self.prompt_for != Some(request.id) {
            self.prompt.cut(request.segments());
            self.prompt_for = Some(request.id);
        }
    }

    fn expire(&mut self, now: f64) {
        if self.cfg.prefix_state == PrefixState::Approximate {
            self.cached.expire_before((now * BUCKETS_PER_S).floor() as u64 + 1);
        }
    }

    /// Every replica's cost for `request` (fills `self.costs`).
    pub fn costs(&mut self, request: &Request<'_>, replicas: &Replicas<'_>) -> &[f64] {
        self.expire(request.arrived_at);
        self.hash_prompt(request);
        let (runs, blocks) = (&self.prompt.runs, self.prompt.blocks);
        self.cached.consecutive(runs, blocks, &mut self.overlap);
        self.active.consecutive(runs, blocks, &mut self.shared);
        self.overlap_for = Some(request.id);
        let b = self.cfg.block_tokens as f64;
        // Full blocks only: upstream's decode load counts the request's block hashes, and a
        // partial last block has none.
        let request_blocks = (request.prompt_tokens / self.cfg.block_tokens) as f64;
        let n = replicas.len();
        self.costs.resize(n, 0.0);
        for r in 0..n {
            let id = self.members.id(r);
            let (host, disk) = self.tier_blocks(replicas, r);
            let device = self.overlap[id] as f64;
            let (wh, wd) = (self.cfg.host_cache_hit_weight, self.cfg.disk_cache_hit_weight);
            self.effective[id] = device + wh * host + wd * disk;
            let credit = self.cfg.overlap_score_credit * device + wh * host + wd * disk;
            let decode_blocks = self.active.held_blocks(id) as f64 + request_blocks - self.shared[id] as f64;
            let active_cost = self.cfg.decode_active_request_weight * self.active_requests[id] as f64;
            self.costs[r] = match self.cfg.role {
                Role::Decode if self.cfg.overlap_score_credit > 0.0 => (decode_blocks - credit).max(0.0) + active_cost,
                Role::Decode => decode_blocks + active_cost,
                Role::Aggregated => {
                    let prefill_blocks =
                        (self.active_prefill_tokens(r, replicas) + request.prompt_tokens as u64) as f64 / b;
                    let adjusted = prefill_blocks - credit;
                    let adjusted = if self.cfg.prefill_floor { adjusted.max(0.0) } else { adjusted };
                    match self.cfg.cost {
                        Cost::Linear => self.cfg.prefill_load_scale * adjusted + decode_blocks + active_cost,
                        Cost::Lmetric => adjusted * (decode_blocks + 1.0),
                    }
                }
            };
        }
        &self.costs[..n]
    }

    /// Upstream's softmax sampling over normalised costs at draw `u`.
    fn softmax_pick(&mut self, n: usize) -> usize {
        let u: f64 = self.rng.random();
        softmax_sample_index(&self.costs[..n], self.cfg.temperature, u, &mut self.probabilities)
    }
}

/// Dynamo's `softmax_sample_index` (`scheduling/selector/reference.rs`), operation for operation
/// so that the same draw `sample` ∈ [0, 1) picks the same row: probabilities
/// `exp(c/m · s − min/m · s)` with `s = −1 / ((max − min)/m · temperature)` (`m` = 1 unless the
/// range overflows), normalised, then the first row whose cumulative probability reaches
/// `sample`; uniform when all costs are equal. `probabilities` is scratch.
pub fn softmax_sample_index(costs: &[f64], temperature: f64, sample: f64, probabilities: &mut Vec<f64>) -> usize {
    assert!(!costs.is_empty(), "softmax over no replicas");
    let (min_cost, max_cost) =
        costs.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &c| (lo.min(c), hi.max(c)));
    probabilities.clear();
    if min_cost == max_cost {
        probabilities.resize(costs.len(), 1.0 / costs.len() as f64);
    } else {
        let range = max_cost - min_cost;
        let magnitude = if range.is_finite() { 1.0 } else { min_cost.abs().max(max_cost.abs()) };
        let min_normalized = min_cost / magnitude;
        let scale = -1.0 / ((max_cost / magnitude - min_normalized) * temperature);
        let max_scaled = min_normalized * scale;
        probabilities.extend(costs.iter().map(|&c| (c / magnitude * scale - max_scaled).exp()));
    }
    let sum: f64 = probabilities.iter().sum();
    for p in probabilities.iter_mut() {
        *p /= sum;
    }
    let mut cumulative = 0.0;
    for (row, p) in probabilities.iter().enumerate() {
        cumulative += p;
        if sample <= cumulative {
            return row;
        }
    }
    costs.len() - 1
}

impl RouterPolicy for DynamoKv {
    fn signals(&self) -> Vec<String> {
        let mut s = vec![signals::PREFILLING.into()];
        if self.reads_tiers() {
            s.extend([signals::TIER_CPU_MATCHED_TOKENS.into(), signals::TIER_REMOTE_MATCHED_TOKENS.into()]);
        }
        s
    }

    fn capabilities(&self) -> Capabilities {
        if self.cfg.prefix_state == PrefixState::Events { Capabilities::WANTS_EVICTIONS } else { Capabilities::NONE }
    }

    fn route(&mut self, request: &Request<'_>, replicas: &Replicas<'_>) -> usize {
        self.costs(request, replicas);
        let n = replicas.len();
        let pick = if self.cfg.temperature == 0.0 {
            argmin_random_tie(self.costs[..n].iter().copied(), &mut self.rng).expect("replicas")
        } else {
            self.softmax_pick(n)
        };
        self.decisions += 1;
        self.chosen_overlap_blocks += self.overlap[self.members.id(pick)] as u64;
        pick
    }

    fn on_dispatch(&mut self, request: &Request<'_>, r: usize) {
        let r = self.members.id(r);
        self.hash_prompt(request);
        let runs = &self.prompt.runs;
        // Upstream's effective cached tokens: the weighted overlap in tokens, rounded.
        let cached = if self.overlap_for == Some(request.id) {
            (self.effective[r] * self.cfg.block_tokens as f64).round() as u64
        } else {
            self.cached.leading(runs, r) * self.cfg.block_tokens as u64
        };
        let bucket = (self.cfg.prefix_state == PrefixState::Approximate)
            .then(|| ((request.arrived_at + self.cfg.ttl_s) * BUCKETS_PER_S).ceil() as u64);
        for run in runs {
            self.cached.insert(run.key, run.blocks, r, bucket);
            self.active.add(run.key, run.blocks, r);
        }
        let uncached = (request.prompt_tokens as u64).saturating_sub(cached);
        let cum = &mut self.prefill_cum[r];
        cum.push(cum.last().copied().unwrap_or(0) + uncached);
        self.in_flight.insert(mix64(request.id), InFlight { replica: r, runs: runs.clone() });
        self.active_requests[r] += 1;
    }

    fn on_complete(&mut self, c: &Completion) {
        let Some(f) = self.in_flight.remove(&mix64(c.request_id)) else { return };
        self.active_requests[f.replica] -= 1;
        for run in &f.runs {
            self.active.remove(run.key, run.blocks, f.replica);
        }
    }

    fn on_evict(&mut self, e: &Eviction<'_>) {
        if self.cfg.prefix_state != PrefixState::Events {
            return;
        }
        let Some(r) = self.members.get(e.replica_index()) else { return };
        if let Some((run, from)) = self.prompt.evicted(e) {
            self.cached.remove(run.key, from, run.blocks, r);
        }
    }

    /// A replica that leaves is forgotten: its blocks, its in-flight requests (their completions
    /// will find nothing) and its prefill load (upstream `remove_worker`).
    fn on_replica_change(&mut self, change: &ReplicaChange) {
        if let Some(Member::Left(id)) = self.members.change(change) {
            self.cached.forget(id);
            self.active.forget(id);
            self.in_flight.retain(|_, f| f.replica != id);
            self.active_requests[id] = 0;
            self.prefill_cum[id] = vec![0];
            self.overlap_for = None;
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
