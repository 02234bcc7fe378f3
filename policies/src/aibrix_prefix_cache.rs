//! `aibrix_prefix_cache`: AIBrix gateway's `prefix-cache` routing algorithm.
//!
//! Algorithm (per request; load = running requests, counted by the gateway itself):
//! 1. Load guard: if `max − min > imbalance_abs` over all replicas, only the replicas at the
//!    minimum stay candidates for the prefix match.
//! 2. Match the prompt's full blocks (`block_tokens`) on a global table of block hashes, each
//!    recording the replicas that were sent it: walk from block 0; at each block the candidates
//!    shrink to those holding it, and each survivor's match becomes `(i + 1) · 100 / blocks`
//!    percent (integer division); stop when none is left. Replicas that matched ≥ 1 block are
//!    the matched set.
//! 3. Shuffle the matched set, sort it stably by (match % descending, load ascending), and take
//!    the first replica whose load ≤ mean + `std_dev_factor` · σ (sample standard deviation over
//!    all replicas' loads).
//! 4. If nothing matched or none passed: the least-loaded replica, ties uniformly at random.
//! 5. Record all the prompt's block hashes for the chosen replica. The table holds at most
//!    `capacity_tokens / block_tokens` blocks, least recently recorded evicted first, and drops a
//!    block not recorded again within `idle_eviction_s` (checked every second).
//!
//! Parameters (defaults): `block_tokens` 16, `imbalance_abs` 8, `std_dev_factor` 1,
//! `capacity_tokens` 200,000, `idle_eviction_s` 1200.
//!
//! Source: vllm-project/aibrix @ e3e10f9e, `pkg/plugins/gateway/algorithms/prefix_cache.go`
//! (`routeOriginal`, `getTargetPodListOnLoadImbalance`, `getTargetPodFromMatchedPods`, imbalance
//! 8, σ factor 1), `least_request.go` (`selectTargetPodWithLeastRequestCount`,
//! `getRequestCounts` → `realtime_num_requests_running`, the gateway's own in-flight count
//! (kept here by the router itself, exact: not the `scraped.running` signal),
//! `pkg/cache/cache_trace.go`), `util.go` (sample σ), `pkg/utils/prefixcacheindexer/hash.go`
//! (`seqSearchPrefix`, `AddPrefix`, 200,000 blocks of 4 bytes, 20-minute idle eviction every 1 s)
//! and `pkg/utils/lrustore/lru_store.go` (a lookup does not refresh an entry).
//!
//! Deviations, and why: upstream's default character tokenizer makes a block 4 bytes of text,
//! about one token; hashing every token would cost 16 times more per request for a match that
//! moves by under 16 tokens, so blocks are 16 tokens here, and the table's default capacity
//! keeps upstream's reach in tokens (200,000 blocks × ~1 token). The gateway's in-flight count
//! is the router's own (`on_dispatch` / `on_complete`), fresh like upstream's.

use rand::RngExt;
use routelab_policy_api::*;
use serde::{Deserialize, Serialize};

use crate::block_index::{BlockIndex, KeyMap};

#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub block_tokens: u32,
    pub imbalance_abs: u32,
    pub std_dev_factor: f64,
    pub capacity_tokens: u64,
    pub idle_eviction_s: f64,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            block_tokens: 16,
            imbalance_abs: 8,
            std_dev_factor: 1.0,
            capacity_tokens: 200_000,
            idle_eviction_s: 1200.0,
        }
    }
}

pub struct AibrixPrefixCache {
    cfg: Config,
    rng: PolicyRng,
    hashing: BlockHashing,
    table: BlockIndex,
    /// Each block's last recording (a sequence number) and the FIFO of recordings: the table's
    /// LRU order, which is also its idle order.
    last_put: KeyMap<u64>,
    puts: std::collections::VecDeque<(u64, u64, f64)>,
    seq: u64,
    capacity_blocks: usize,
    next_idle_check: f64,
    running: Vec<u32>,
    hashes: Vec<u64>,
    hashes_for: Option<u64>,
    percent: Vec<u32>,
    alive: Vec<u64>,
    matched: Vec<usize>,
    imbalanced_decisions: u64,
    prefix_decisions: u64,
}

impl Policy for AibrixPrefixCache {
    const NAME: &'static str = "aibrix_prefix_cache";
    const DESCRIPTION: &'static str =
        "AIBrix prefix-cache: load-spread guard, best match under mean + 1σ running, else least request";
    type Config = Config;
    type Context = RouterContext;
    fn new(cfg: Config, ctx: &RouterContext) -> Result<Self, String> {
        if cfg.block_tokens == 0 {
            return Err("block_tokens must be at least 1".into());
        }
        if !(cfg.std_dev_factor >= 0.0 && cfg.std_dev_factor.is_finite()) {
            return Err(format!("std_dev_factor must be ≥ 0 (got {})", cfg.std_dev_factor));
        }
        if cfg.capacity_tokens < cfg.block_tokens as u64 {
            return Err(format!("capacity_tokens must hold at least one block of {} tokens", cfg.block_tokens));
        }
        if !(cfg.idle_eviction_s > 0.0) {
            return Err(format!("idle_eviction_s must be positive (got {})", cfg.idle_eviction_s));
        }
        let n = ctx.replicas as usize;
        Ok(Self {
            hashing: BlockHashing::full_blocks(cfg.block_tokens),
            capacity_blocks: (cfg.capacity_tokens / cfg.block_tokens as u64) as usize,
            cfg,
            rng: policy_rng(ctx.seed),
            table: BlockIndex::new(n),
            last_put: KeyMap::default(),
            puts: Default::default(),
            seq: 0,
            next_idle_check: 1.0,
            running: vec![0; n],
            hashes: Vec::new(),
            hashes_for: None,
            percent: vec![0; n],
            alive: vec![0; n.div_ceil(64).max(1)],
            matched: Vec::with_capacity(n),
            imbalanced_decisions: 0,
            prefix_decisions: 0,
        })
    }
}

impl AibrixPrefixCache {
    fn hash_prompt(&mut self, request: &Request<'_>) {
        if self.hashes_for != Some(request.id) {
            self.hashing.hashes_into(request.segments.as_slice(), &mut self.hashes);
            self.hashes_for = Some(request.id);
        }
    }

    /// Drops a block from the table (all its replicas).
    fn drop_block(&mut self, h: u64) {
        self.last_put.remove(&h);
        for r in 0..self.running.len() {
            self.table.remove(h, r);
        }
    }

    /// Idle eviction, on upstream's 1 s tick (run at the first decision at or after it).
    fn evict_idle(&mut self, now: f64) {
        if now < self.next_idle_check {
            return;
        }
        self.next_idle_check = now.floor() + 1.0;
        while let Some(&(seq, h, at)) = self.puts.front() {
            if now - at <= self.cfg.idle_eviction_s {
                break;
            }
            self.puts.pop_front();
            if self.last_put.get(&h) == Some(&seq) {
                self.drop_block(h);
            }
        }
    }

    /// The least-loaded replica, ties uniformly at random.
    fn least_request(&mut self) -> usize {
        argmin_random_tie(self.running.iter().copied(), &mut self.rng).expect("replicas")
    }

    /// Fills `percent` for the candidates in `alive` (cleared to 0 elsewhere) and `matched`.
    fn match_prefix(&mut self) {
        self.percent.fill(0);
        self.matched.clear();
        let blocks = self.hashes.len() as u32;
        for (i, &h) in self.hashes.iter().enumerate() {
            let mut any = false;
            for w in 0..self.alive.len() {
                self.alive[w] &= self.table.word(h, w);
                any |= self.alive[w] != 0;
            }
            if !any {
                break;
            }
            let pct = (i as u32 + 1) * 100 / blocks;
            for (w, &bits) in self.alive.iter().enumerate() {
                let mut b = bits;
                while b != 0 {
                    self.percent[w * 64 + b.trailing_zeros() as usize] = pct;
                    b &= b - 1;
                }
            }
        }
        self.matched.extend((0..self.percent.len()).filter(|&r| self.percent[r] > 0));
    }
}

impl RouterPolicy for AibrixPrefixCache {
    fn route(&mut self, request: &Request<'_>, _: &Replicas<'_>) -> usize {
        self.evict_idle(request.arrived_at);
        self.hash_prompt(request);
        let n = self.running.len();
        let (lo, hi) = self.running.iter().fold((u32::MAX, 0), |(a, b), &l| (a.min(l), b.max(l)));
        self.alive.fill(0);
        let imbalanced = hi - lo > self.cfg.imbalance_abs;
        for r in 0..n {
            if !imbalanced || self.running[r] == lo {
                self.alive[r / 64] |= 1 << (r % 64);
            }
        }
        self.imbalanced_decisions += imbalanced as u64;
        self.match_prefix();
        if !self.matched.is_empty() {
            let mean = self.running.iter().map(|&l| l as f64).sum::<f64>() / n as f64;
            let sd = if n <= 1 {
                0.0
            } else {
                (self.running.iter().map(|&l| (l as f64 - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt()
            };
            let mut matched = std::mem::take(&mut self.matched);
            for i in (1..matched.len()).rev() {
                let j = self.rng.random_range(0..=i);
                matched.swap(i, j);
            }
            matched.sort_by(|&a, &b| self.percent[b].cmp(&self.percent[a]).then(self.running[a].cmp(&self.running[b])));
            let pick = matched.iter().copied().find(|&r| self.running[r] as f64 <= mean + self.cfg.std_dev_factor * sd);
            self.matched = matched;
            if let Some(r) = pick {
                self.prefix_decisions += 1;
                return r;
            }
        }
        self.least_request()
    }

    fn on_dispatch(&mut self, request: &Request<'_>, r: usize) {
        self.running[r] += 1;
        self.hash_prompt(request);
        let hashes = std::mem::take(&mut self.hashes);
        for &h in &hashes {
            self.seq += 1;
            self.table.insert(h, r);
            self.last_put.insert(h, self.seq);
            self.puts.push_back((self.seq, h, request.arrived_at));
            if self.last_put.len() > self.capacity_blocks {
                // The least recently recorded block goes (the one just recorded is the most recent).
                while let Some((seq, old, _)) = self.puts.pop_front() {
                    if self.last_put.get(&old) == Some(&seq) {
                        self.drop_block(old);
                        break;
                    }
                }
            }
        }
        self.hashes = hashes;
    }

    fn on_complete(&mut self, c: &Completion) {
        let l = &mut self.running[c.replica as usize];
        *l = l.saturating_sub(1);
    }

    fn report(&self) -> Vec<(String, f64)> {
        vec![
            ("prefix_decisions".into(), self.prefix_decisions as f64),
            ("imbalanced_decisions".into(), self.imbalanced_decisions as f64),
            ("router_table_blocks".into(), self.last_put.len() as f64),
        ]
    }
}
