//! `vllm_prefix_aware`: vLLM production-stack's `prefixaware` routing logic.
//!
//! Algorithm (per request):
//! 1. The prompt is cut into chunks of `chunk_tokens` (the last, shorter chunk included) and
//!    looked up in a trie of chunk hashes whose nodes record every replica that was sent a
//!    prompt through them. The trie holds at most `max_chunks` nodes (below).
//! 2. Walk from the root while the replicas recorded at the next node intersect the set still
//!    in play (initially all replicas); each step adds `chunk_tokens` to the match length and
//!    narrows the set to the intersection.
//! 3. If the match length is below `min_match_tokens`, route to the replica with the lowest
//!    request rate over the last `qps_window_s` seconds (a replica never routed to first; the
//!    first in index order on ties). Otherwise pick uniformly at random from the set in play —
//!    with no match at all that is every replica, so a miss is a uniformly random pick.
//! 4. Record the prompt under the chosen replica; every node on its path becomes the most
//!    recently used. While the trie has more than `max_chunks` nodes, the least recently used
//!    node is forgotten (on every replica). A node is used whenever a path through it is, after
//!    its descendants, so the least recently used node is always a leaf: the replicas recorded
//!    at a node stay a subset of those at its parent.
//!
//! Parameters (defaults): `chunk_tokens` 32, `min_match_tokens` 0, `qps_window_s` 60,
//! `max_chunks` 16,777,216 (2^24).
//!
//! Source: vllm-project/production-stack @ a6c01db0, `src/vllm_router/routers/routing_logic.py`
//! (`PrefixAwareRouter`, `_qps_routing`), `src/vllm_router/prefix/hashtrie.py` (128-character
//! chunks, xxh64, no eviction), `src/vllm_router/parsers/parser.py` (`--prefix-min-match-length`
//! 0, `--request-stats-window` 60 s).
//!
//! Replicas coming and going (`on_replica_change`: crashes, autoscaling): state is kept by id
//! (`index::members`). Upstream matches only among the endpoints available now
//! (`route_request`: `longest_prefix_match(prompt, available_endpoints)`, same file and commit)
//! and a new endpoint's URL matches nothing old; so here a replica that leaves is forgotten —
//! its trie entries and its request rate — and one that joins starts with none (and counts as
//! never routed to for `_qps_routing`).
//!
//! Deviations, and why: upstream chunks characters of the concatenated messages; 128 characters
//! at about 4 characters per token is `chunk_tokens` 32 here (the simulator has no text), and
//! `min_match_tokens` counts tokens where upstream counts characters. A trie node is identified
//! by its chained chunk hash (the same thing: a chained hash names its whole path).
//!
//! The bound is ours: production-stack's merged `HashTrie` never evicts, and the router's
//! memory grows until it is killed (vllm-project/production-stack issue #687); the open pull
//! request #711 ("Add HashTrie LRU to prevent OOM") evicts least-recently-used nodes, children
//! first, once the router's memory passes `PREFIXAWARE_MAX_MEMORY_SIZE_GB` (default 2). Here the
//! limit counts nodes, not bytes, so that decisions do not depend on the allocator: 2^24 nodes
//! is ≈ 2.1 GB (1.9 GiB) at the ≈ 124 bytes a node `routelab bench` measures ("router memory":
//! the holder bits, the recency entry and its queue slot), that pull request's 2 GB. No shipped workload reaches it (`router_evicted_chunks` 0 on each:
//! docs/performance.md, "Bounded router state"), so their results are those of the unbounded
//! trie; `max_chunks: 18446744073709551615` is upstream's unbounded trie.

use rand::RngExt;
use routelab_policy_api::*;
use serde::{Deserialize, Serialize};

use crate::index::block_index::{BlockIndex, Stamps};
use crate::index::members::{Member, Members};
use crate::index::qps::QpsWindow;

#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub chunk_tokens: u32,
    pub min_match_tokens: u32,
    pub qps_window_s: f64,
    pub max_chunks: u64,
}

impl Default for Config {
    fn default() -> Self {
        Self { chunk_tokens: 32, min_match_tokens: 0, qps_window_s: 60.0, max_chunks: 1 << 24 }
    }
}

pub struct VllmPrefixAware {
    cfg: Config,
    rng: PolicyRng,
    hashing: BlockHashing,
    /// By id (`index::members`), as `qps` and `in_play`.
    trie: BlockIndex,
    members: Members,
    qps: QpsWindow,
    hashes: Vec<u64>,
    hashes_for: Option<u64>,
    in_play: Vec<u64>,
    /// The request whose match `in_play` holds, and its chunks matched.
    matched: Option<(u64, usize)>,
    below_min_match: u64,
    /// The trie's nodes by last use (one entry per node, stamped with `clock`).
    recency: Stamps,
    clock: u64,
    evicted_chunks: u64,
}

impl Policy for VllmPrefixAware {
    const NAME: &'static str = "vllm_prefix_aware";
    const DESCRIPTION: &'static str =
        "vLLM production-stack prefixaware: chunk trie (LRU past 2^24 nodes), random among the longest matches";
    type Config = Config;
    type Context = RouterContext;
    fn new(cfg: Config, ctx: &RouterContext) -> Result<Self, String> {
        if cfg.chunk_tokens == 0 {
            return Err("chunk_tokens must be at least 1 (upstream's 128 characters ≈ 32 tokens)".into());
        }
        if !(cfg.qps_window_s > 0.0 && cfg.qps_window_s.is_finite()) {
            return Err(format!("qps_window_s must be positive (got {})", cfg.qps_window_s));
        }
        if cfg.max_chunks == 0 {
            return Err("max_chunks must be at least 1 (the trie's node limit; 16777216 by default)".into());
        }
        let n = ctx.replica_count();
        Ok(Self {
            hashing: BlockHashing { block_tokens: cfg.chunk_tokens, max_blocks: usize::MAX, partial_tail: true },
            qps: QpsWindow::new(n, cfg.qps_window_s),
            cfg,
            rng: policy_rng(ctx.seed),
            trie: BlockIndex::new(n),
            members: Members::new(n),
            hashes: Vec::new(),
            hashes_for: None,
            in_play: vec![0; n.div_ceil(64).max(1)],
            matched: None,
            below_min_match: 0,
            recency: Stamps::default(),
            clock: 0,
            evicted_chunks: 0,
        })
    }
}

impl VllmPrefixAware {
    fn hash_prompt(&mut self, request: &Request<'_>) {
        if self.hashes_for != Some(request.id) {
            self.hashing.hashes_into(request.segments(), &mut self.hashes);
            self.hashes_for = Some(request.id);
        }
    }

    /// Whether any replica recorded chunk `h`.
    fn present(&self, h: u64) -> bool {
        (0..self.trie.words()).any(|w| self.trie.word(h, w) != 0)
    }

    /// Walks the trie; leaves the replicas in play in `self.in_play` and returns the chunks matched.
    ///
    /// Every insert records a whole prompt, and a chained hash names its whole prefix, so a
    /// replica recorded at chunk k is recorded at chunks 0..k too: holder sets only shrink along
    /// a path and the chunks present form a prefix of the prompt. Upstream's walk (intersect
    /// while non-empty) therefore ends at the last present chunk, with that chunk's holders in
    /// play — found with a few lookups instead of one per chunk.
    fn longest_match(&mut self, request: &Request<'_>, n: usize) -> usize {
        let hint = self.last_segment_chunk(request);
        let hashes = std::mem::take(&mut self.hashes);
        let matched = leading_true(hashes.len(), hint, |k| self.present(hashes[k]));
        if matched == 0 {
            // Every routable replica (ids; only routable ones hold chunks: a replica that left
            // was forgotten).
            self.in_play.fill(0);
            for i in 0..n {
                let r = self.members.id(i);
                self.in_play[r / 64] |= 1 << (r % 64);
            }
        } else {
            for w in 0..self.in_play.len() {
                self.in_play[w] = self.trie.word(hashes[matched - 1], w);
            }
        }
        self.hashes = hashes;
        self.matched = Some((request.id, matched));
        matched
    }

    /// Marks the prompt's chunks used, deepest first (a node's stamp then exceeds every
    /// descendant's), and forgets least recently used nodes while the trie is over its limit.
    fn touch_and_trim(&mut self) {
        for &h in self.hashes.iter().rev() {
            self.clock += 1;
            self.recency.stamp(h, 0, self.clock);
        }
        while self.recency.len() as u64 > self.cfg.max_chunks {
            let (h, _) = self.recency.pop_oldest().expect("over the limit: not empty");
            self.trie.remove_block(h);
            self.evicted_chunks += 1;
            // A match found before this may name a forgotten node.
            self.matched = None;
        }
        self.recency.compact();
    }

    /// The chunk where the prompt's last segment starts: where a prompt that shares everything
    /// but its own tail stops matching (a search hint; any hint gives the same answer).
    fn last_segment_chunk(&self, request: &Request<'_>) -> usize {
        let segs = request.segments();
        let head: u64 = segs.iter().map(|s| s.tokens as u64).sum::<u64>() - segs.last().map_or(0, |s| s.tokens as u64);
        (head / self.cfg.chunk_tokens as u64) as usize
    }
}

/// For a predicate true on 0..k and false on k..n (monotone), finds k: probes `hint` and its
/// neighbour first, then bisects what is left.
fn leading_true(n: usize, hint: usize, mut pred: impl FnMut(usize) -> bool) -> usize {
    let (mut lo, mut hi) = (0usize, n);
    if hint < n {
        if pred(hint) {
            lo = hint + 1;
        } else {
            hi = hint;
            if hi > 0 && pred(hi - 1) {
                lo = hi;
            }
        }
    }
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if pred(mid) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

impl RouterPolicy for VllmPrefixAware {
    fn route(&mut self, request: &Request<'_>, replicas: &Replicas<'_>) -> usize {
        let n = replicas.len();
        self.hash_prompt(request);
        let matched = self.longest_match(request, n) as u32 * self.cfg.chunk_tokens;
        if matched < self.cfg.min_match_tokens {
            self.below_min_match += 1;
            let members = &self.members;
            return self.qps.lowest_of(request.arrived_at, n, |i| members.id(i));
        }
        let count: u32 = self.in_play.iter().map(|w| w.count_ones()).sum();
        let k = self.rng.random_range(0..count);
        let id = crate::index::min_index::nth_set_bit(&self.in_play, k).expect("the set in play is never empty");
        self.members.index_of(id).expect("only routable replicas are in play")
    }

    fn on_dispatch(&mut self, request: &Request<'_>, r: usize) {
        let r = self.members.id(r);
        self.hash_prompt(request);
        // `r` holds a prefix of the chunks (see `longest_match`): insert from its end. A replica
        // in play holds exactly the matched chunks.
        let held = match self.matched {
            Some((id, m)) if id == request.id && self.in_play[r / 64] >> (r % 64) & 1 == 1 => m,
            _ => {
                let (trie, hashes) = (&self.trie, &self.hashes);
                leading_true(hashes.len(), 0, |k| trie.holds(hashes[k], r))
            }
        };
        for &h in &self.hashes[held..] {
            self.trie.insert(h, r);
        }
        self.touch_and_trim();
        self.qps.record(r, request.arrived_at);
    }

    /// A replica that leaves is forgotten: its trie entries and its request rate.
    fn on_replica_change(&mut self, change: &ReplicaChange) {
        if let Some(Member::Left(id)) = self.members.change(change) {
            self.trie.forget(id);
            self.qps.forget(id);
            self.matched = None;
        }
    }

    fn report(&self) -> Vec<(String, f64)> {
        let n = self.trie.replicas().max(1) as f64;
        let held: u64 = (0..self.trie.replicas()).map(|r| self.trie.held_blocks(r)).sum();
        vec![
            ("below_min_match_decisions".into(), self.below_min_match as f64),
            ("router_trie_chunks_mean".into(), held as f64 / n),
            ("router_trie_nodes".into(), self.recency.len() as f64),
            ("router_evicted_chunks".into(), self.evicted_chunks as f64),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::leading_true;

    #[test]
    fn leading_true_finds_the_boundary_from_any_hint() {
        for n in 0..9 {
            for k in 0..=n {
                for hint in 0..=n + 1 {
                    let mut probes = 0;
                    let got = leading_true(n, hint, |i| {
                        probes += 1;
                        i < k
                    });
                    assert_eq!(got, k, "n {n} k {k} hint {hint}");
                    assert!(probes <= 2 + n.max(1).ilog2() as usize + 1, "n {n} k {k} hint {hint}: {probes} probes");
                }
            }
        }
        // A right hint settles it in two probes.
        let mut probes = 0;
        assert_eq!(
            leading_true(1000, 600, |i| {
                probes += 1;
                i < 600
            }),
            600
        );
        assert_eq!(probes, 2);
    }
}
