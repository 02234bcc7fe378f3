//! `vllm_prefix_aware`: vLLM production-stack's `prefixaware` routing logic.
//!
//! Algorithm (per request):
//! 1. The prompt is cut into chunks of `chunk_tokens` (the last, shorter chunk included) and
//!    looked up in a trie of chunk hashes whose nodes record every replica that was sent a
//!    prompt through them. Nothing is ever evicted.
//! 2. Walk from the root while the replicas recorded at the next node intersect the set still
//!    in play (initially all replicas); each step adds `chunk_tokens` to the match length and
//!    narrows the set to the intersection.
//! 3. If the match length is below `min_match_tokens`, route to the replica with the lowest
//!    request rate over the last `qps_window_s` seconds (a replica never routed to first; the
//!    first in index order on ties). Otherwise pick uniformly at random from the set in play —
//!    with no match at all that is every replica, so a miss is a uniformly random pick.
//! 4. Record the prompt under the chosen replica.
//!
//! Parameters (defaults): `chunk_tokens` 32, `min_match_tokens` 0, `qps_window_s` 60.
//!
//! Source: vllm-project/production-stack @ a6c01db0, `src/vllm_router/routers/routing_logic.py`
//! (`PrefixAwareRouter`, `_qps_routing`), `src/vllm_router/prefix/hashtrie.py` (128-character
//! chunks, xxh64, no eviction), `src/vllm_router/parsers/parser.py` (`--prefix-min-match-length`
//! 0, `--request-stats-window` 60 s).
//!
//! Deviations, and why: upstream chunks characters of the concatenated messages; 128 characters
//! at about 4 characters per token is `chunk_tokens` 32 here (the simulator has no text), and
//! `min_match_tokens` counts tokens where upstream counts characters. A trie node is identified
//! by its chained chunk hash (the same thing: a chained hash names its whole path).

use rand::RngExt;
use routelab_policy_api::*;
use serde::{Deserialize, Serialize};

use crate::block_index::BlockIndex;

#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub chunk_tokens: u32,
    pub min_match_tokens: u32,
    pub qps_window_s: f64,
}

impl Default for Config {
    fn default() -> Self {
        Self { chunk_tokens: 32, min_match_tokens: 0, qps_window_s: 60.0 }
    }
}

pub struct VllmPrefixAware {
    cfg: Config,
    rng: PolicyRng,
    hashing: BlockHashing,
    trie: BlockIndex,
    /// Requests routed to each replica within the QPS window, and whether it ever got one.
    recent: Vec<WindowSum>,
    ever: Vec<bool>,
    hashes: Vec<u64>,
    hashes_for: Option<u64>,
    in_play: Vec<u64>,
    next: Vec<u64>,
    below_min_match: u64,
}

impl Policy for VllmPrefixAware {
    const NAME: &'static str = "vllm_prefix_aware";
    const DESCRIPTION: &'static str = "vLLM production-stack prefixaware: never-evicted chunk trie, random among the longest matches";
    type Config = Config;
    type Context = RouterContext;
    fn new(cfg: Config, ctx: &RouterContext) -> Result<Self, String> {
        if cfg.chunk_tokens == 0 {
            return Err("chunk_tokens must be at least 1 (upstream's 128 characters ≈ 32 tokens)".into());
        }
        if !(cfg.qps_window_s > 0.0 && cfg.qps_window_s.is_finite()) {
            return Err(format!("qps_window_s must be positive (got {})", cfg.qps_window_s));
        }
        let n = ctx.replicas as usize;
        Ok(Self {
            hashing: BlockHashing { block_tokens: cfg.chunk_tokens, max_blocks: usize::MAX, partial_tail: true },
            recent: vec![WindowSum::new(cfg.qps_window_s); n],
            cfg,
            rng: policy_rng(ctx.seed),
            trie: BlockIndex::new(n),
            ever: vec![false; n],
            hashes: Vec::new(),
            hashes_for: None,
            in_play: vec![0; n.div_ceil(64).max(1)],
            next: vec![0; n.div_ceil(64).max(1)],
            below_min_match: 0,
        })
    }
}

impl VllmPrefixAware {
    fn hash_prompt(&mut self, request: &Request<'_>) {
        if self.hashes_for != Some(request.id) {
            self.hashing.hashes_into(request.segments.as_slice(), &mut self.hashes);
            self.hashes_for = Some(request.id);
        }
    }

    /// Walks the trie; leaves the replicas in play in `self.in_play` and returns the match length.
    fn longest_match(&mut self, n: usize) -> u32 {
        self.in_play.fill(u64::MAX);
        if n % 64 != 0 {
            let last = self.in_play.len() - 1;
            self.in_play[last] = (1u64 << (n % 64)) - 1;
        }
        let mut chunks = 0u32;
        for &h in &self.hashes {
            let mut any = false;
            for (w, next) in self.next.iter_mut().enumerate() {
                *next = self.trie.word(h, w) & self.in_play[w];
                any |= *next != 0;
            }
            if !any {
                break;
            }
            self.in_play.copy_from_slice(&self.next);
            chunks += 1;
        }
        chunks * self.cfg.chunk_tokens
    }
}

impl RouterPolicy for VllmPrefixAware {
    fn route(&mut self, request: &Request<'_>, replicas: &[ReplicaView]) -> usize {
        let n = replicas.len();
        self.hash_prompt(request);
        let matched = self.longest_match(n);
        if matched < self.cfg.min_match_tokens {
            self.below_min_match += 1;
            let now = request.arrived_at;
            if let Some(r) = self.ever.iter().position(|&e| !e) {
                return r;
            }
            let mut best = 0;
            let mut best_qps = f64::INFINITY;
            for (r, w) in self.recent.iter_mut().enumerate() {
                let qps = w.sum(now);
                if qps < best_qps {
                    best_qps = qps;
                    best = r;
                }
            }
            return best;
        }
        let count: u32 = self.in_play.iter().map(|w| w.count_ones()).sum();
        let mut k = self.rng.random_range(0..count);
        for (w, &bits) in self.in_play.iter().enumerate() {
            let c = bits.count_ones();
            if k < c {
                let mut b = bits;
                for _ in 0..k {
                    b &= b - 1;
                }
                return w * 64 + b.trailing_zeros() as usize;
            }
            k -= c;
        }
        unreachable!("the set in play is never empty")
    }

    fn on_dispatch(&mut self, request: &Request<'_>, r: usize) {
        self.hash_prompt(request);
        for &h in &self.hashes {
            self.trie.insert(h, r);
        }
        self.ever[r] = true;
        self.recent[r].add(request.arrived_at, 1.0);
    }

    fn report(&self) -> Vec<(String, f64)> {
        let n = self.trie.replicas().max(1) as f64;
        let held: u64 = (0..self.trie.replicas()).map(|r| self.trie.held_blocks(r)).sum();
        vec![
            ("below_min_match_decisions".into(), self.below_min_match as f64),
            ("router_trie_chunks_mean".into(), held as f64 / n),
        ]
    }
}
