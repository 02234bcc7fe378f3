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
//!
//! Replicas coming and going (`on_replica_change`: crashes, autoscaling): state is kept by id
//! (`index::members`) and a replica that leaves is forgotten — its running count and its bit in
//! every block's holders. Upstream the gateway routes over the pods its informer cache lists
//! (`pkg/cache/informers.go` @ 00895699, `deletePod`: the pod, its model mappings and its
//! metrics go, so its request count goes with it), and a new pod's name never matches the old
//! pod's table entries; a reused id here must start with none of them, so they are cleared.
//!
//! The table is one slot per block (hash, holders bitset, last recording time) on an intrusive
//! list in order of last recording: LRU eviction and idle eviction both take the list's head, and
//! dropping a block frees its slot whatever the replica count (it used to cost one map removal per
//! replica: 29% of the time at 8 replicas). Requests are recorded as they arrive, so recording
//! order is time order and the head is also the idlest block.

use rand::RngExt;
use routelab_policy_api::*;
use serde::{Deserialize, Serialize};

use crate::index::block_index::KeyMap;
use crate::index::members::{Member, Members};

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

/// No slot (end of the list, or a block not in the table).
const NIL: u32 = u32::MAX;
/// `next` of a freed slot, so a stale slot number is recognised.
const FREED: u32 = u32::MAX - 1;

/// One block of the table: 32 bytes, so recording or matching a block touches one cache line.
#[derive(Clone, Copy)]
struct Slot {
    hash: u64,
    /// When it was last recorded.
    at: f64,
    /// Neighbours in recording order (`NIL` at the ends; `next` is `FREED` once freed).
    prev: u32,
    next: u32,
    /// Holders among replicas 0–63 (the rest in `Table::more_holders`).
    holders: u64,
}

/// AIBrix's prefix hash table: per block, the replicas it was recorded for and when it was last
/// recorded, on a list from least to most recently recorded.
struct Table {
    /// Words of holder bits per slot beyond the first (64 replicas a word).
    more_words: usize,
    slot_of: KeyMap<u32>,
    slots: Vec<Slot>,
    more_holders: Vec<u64>,
    free: Vec<u32>,
    head: u32,
    tail: u32,
    len: usize,
}

impl Table {
    fn new(replicas: usize) -> Self {
        Self {
            more_words: replicas.div_ceil(64).max(1) - 1,
            slot_of: KeyMap::default(),
            slots: Vec::new(),
            more_holders: Vec::new(),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }

    #[inline]
    fn slot(&self, hash: u64) -> u32 {
        self.slot_of.get(&hash).copied().unwrap_or(NIL)
    }

    /// Word `w` of the holders of slot `s` (none for `NIL`).
    #[inline]
    fn holders(&self, s: u32, w: usize) -> u64 {
        match (s, w) {
            (NIL, _) => 0,
            (_, 0) => self.slots[s as usize].holders,
            _ => self.more_holders[s as usize * self.more_words + w - 1],
        }
    }

    fn unlink(&mut self, s: u32) {
        let Slot { prev: p, next: n, .. } = self.slots[s as usize];
        if p == NIL {
            self.head = n
        } else {
            self.slots[p as usize].next = n
        }
        if n == NIL { self.tail = p } else { self.slots[n as usize].prev = p }
    }

    /// Records `hash` for replica `r` at time `at`, making it the most recent block. `hint` is
    /// the slot a lookup found for it earlier (or `NIL`); it is used only if still `hash`'s.
    fn record(&mut self, hash: u64, hint: u32, r: usize, at: f64) {
        let s = if hint != NIL && self.slots[hint as usize].next != FREED && self.slots[hint as usize].hash == hash {
            self.unlink(hint);
            hint
        } else if let Some(&s) = self.slot_of.get(&hash) {
            self.unlink(s);
            s
        } else {
            let s = self.free.pop().unwrap_or_else(|| {
                self.slots.push(Slot { hash: 0, at: 0.0, prev: NIL, next: NIL, holders: 0 });
                if self.more_words > 0 {
                    self.more_holders.resize(self.more_holders.len() + self.more_words, 0);
                }
                self.slots.len() as u32 - 1
            });
            self.slot_of.insert(hash, s);
            self.slots[s as usize].hash = hash;
            self.len += 1;
            s
        };
        let tail = self.tail;
        if tail == NIL {
            self.head = s
        } else {
            self.slots[tail as usize].next = s
        }
        self.tail = s;
        let slot = &mut self.slots[s as usize];
        slot.prev = tail;
        slot.next = NIL;
        slot.at = at;
        if r < 64 {
            slot.holders |= 1 << r;
        } else {
            self.more_holders[s as usize * self.more_words + r / 64 - 1] |= 1 << (r % 64);
        }
    }

    /// Replica `r` holds no block any more (a block nobody holds stays until it is evicted:
    /// matching stops there, as at a block not in the table).
    fn forget(&mut self, r: usize) {
        let words = self.more_words;
        for (s, slot) in self.slots.iter_mut().enumerate() {
            if slot.next == FREED {
                continue;
            }
            if r < 64 {
                slot.holders &= !(1 << r);
            } else {
                self.more_holders[s * words + r / 64 - 1] &= !(1 << (r % 64));
            }
        }
    }

    /// The least recently recorded block's time, if any.
    fn oldest_at(&self) -> Option<f64> {
        (self.head != NIL).then(|| self.slots[self.head as usize].at)
    }

    /// Drops the least recently recorded block (from all its replicas).
    fn drop_oldest(&mut self) {
        let s = self.head;
        self.unlink(s);
        let slot = &mut self.slots[s as usize];
        self.slot_of.remove(&slot.hash);
        slot.holders = 0;
        slot.next = FREED;
        if self.more_words > 0 {
            let i = s as usize * self.more_words;
            self.more_holders[i..i + self.more_words].fill(0);
        }
        self.free.push(s);
        self.len -= 1;
    }
}

/// The block hashes of prompt heads met before (every segment but the last), so a prompt whose
/// system prompt and context were hashed before hashes only its last segment (hashing was ≈ 20%
/// of the router's time on tool_use). A pure cache: the hashes are those of
/// [`BlockHashing::hashes_into`] with full blocks (unless two heads' 64-bit keys collide, as
/// unlikely as two block hashes colliding); it is emptied past [`Self::MAX_HASHES`].
#[derive(Default)]
struct PrefixHashes {
    /// Head key → chain state after the head, and the head's hashes in `pool`.
    heads: KeyMap<(ChainState, u32, u32)>,
    pool: Vec<u64>,
}

impl PrefixHashes {
    const MAX_HASHES: usize = 1 << 20;

    fn hashes_into(&mut self, segments: &[Segment], block_tokens: u32, out: &mut Vec<u64>) {
        out.clear();
        let Some((&last, head)) = segments.split_last() else { return };
        let key = head.iter().fold(0x243f_6a88_85a3_08d3u64, |k, s| {
            mix64(k.rotate_left(29) ^ s.id.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ s.tokens as u64)
        });
        let mut state = match self.heads.get(&key) {
            Some(&(state, start, len)) => {
                out.extend_from_slice(&self.pool[start as usize..(start + len) as usize]);
                state
            }
            None => {
                let mut state = ChainState::START;
                for &s in head {
                    state.feed(s, block_tokens, out, usize::MAX);
                }
                if self.pool.len() + out.len() > Self::MAX_HASHES {
                    self.pool.clear();
                    self.heads.clear();
                }
                if out.len() <= Self::MAX_HASHES {
                    self.heads.insert(key, (state, self.pool.len() as u32, out.len() as u32));
                    self.pool.extend_from_slice(out);
                }
                state
            }
        };
        state.feed(last, block_tokens, out, usize::MAX);
    }
}

pub struct AibrixPrefixCache {
    cfg: Config,
    rng: PolicyRng,
    table: Table,
    capacity_blocks: usize,
    next_idle_check: f64,
    /// Per id (`index::members`), as the table's holder bits and `percent`.
    running: Vec<u32>,
    members: Members,
    hashes: Vec<u64>,
    hashes_for: Option<u64>,
    prefixes: PrefixHashes,
    /// The slots `route` found for the leading blocks of request `slots_for` (hints for
    /// `on_dispatch`, which records the same blocks).
    slots: Vec<u32>,
    slots_for: Option<u64>,
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
        let n = ctx.replica_count();
        Ok(Self {
            capacity_blocks: (cfg.capacity_tokens / cfg.block_tokens as u64) as usize,
            cfg,
            rng: policy_rng(ctx.seed),
            table: Table::new(n),
            next_idle_check: 1.0,
            running: vec![0; n],
            members: Members::new(n),
            hashes: Vec::new(),
            hashes_for: None,
            prefixes: PrefixHashes::default(),
            slots: Vec::new(),
            slots_for: None,
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
            self.prefixes.hashes_into(request.segments(), self.cfg.block_tokens, &mut self.hashes);
            self.hashes_for = Some(request.id);
        }
    }

    /// Idle eviction, on upstream's 1 s tick (run at the first decision at or after it).
    fn evict_idle(&mut self, now: f64) {
        if now < self.next_idle_check {
            return;
        }
        self.next_idle_check = now.floor() + 1.0;
        while self.table.oldest_at().is_some_and(|at| now - at > self.cfg.idle_eviction_s) {
            self.table.drop_oldest();
        }
    }

    /// The least-loaded of the `n` routable replicas (an index), ties uniformly at random.
    fn least_request(&mut self, n: usize) -> usize {
        let (members, running) = (&self.members, &self.running);
        argmin_random_tie((0..n).map(|i| running[members.id(i)]), &mut self.rng).expect("replicas")
    }

    /// Fills `percent` for the candidates in `alive` (0 elsewhere), `matched` (those above 0
    /// percent, ascending) and `slots`. A replica that drops out before block `k` matched `k`
    /// blocks: its percent is written once, when it drops out (or at the end).
    fn match_prefix(&mut self, request_id: u64) {
        self.percent.fill(0);
        self.matched.clear();
        self.slots.clear();
        self.slots_for = Some(request_id);
        let blocks = self.hashes.len() as u32;
        if blocks == 0 {
            return;
        }
        let mut k = 0;
        let mut any = true;
        while any && k < blocks {
            let s = self.table.slot(self.hashes[k as usize]);
            self.slots.push(s);
            any = false;
            for w in 0..self.alive.len() {
                let kept = self.alive[w] & self.table.holders(s, w);
                let mut dropped = self.alive[w] & !kept;
                while dropped != 0 {
                    self.percent[w * 64 + dropped.trailing_zeros() as usize] = k * 100 / blocks;
                    dropped &= dropped - 1;
                }
                self.alive[w] = kept;
                any |= kept != 0;
            }
            k += 1;
        }
        for (w, &bits) in self.alive.iter().enumerate() {
            let mut b = bits;
            while b != 0 {
                self.percent[w * 64 + b.trailing_zeros() as usize] = k * 100 / blocks;
                b &= b - 1;
            }
        }
        self.matched.extend((0..self.percent.len()).filter(|&r| self.percent[r] > 0));
    }
}

impl RouterPolicy for AibrixPrefixCache {
    fn route(&mut self, request: &Request<'_>, replicas: &Replicas<'_>) -> usize {
        self.evict_idle(request.arrived_at);
        self.hash_prompt(request);
        // Loads of the routable replicas, in index order; the table, `alive`, `percent` and
        // `matched` are by id.
        let n = replicas.len();
        let (members, running) = (&self.members, &self.running);
        let load = |i: usize| running[members.id(i)];
        let (lo, hi) = (0..n).map(load).fold((u32::MAX, 0), |(a, b), l| (a.min(l), b.max(l)));
        self.alive.fill(0);
        let imbalanced = hi - lo > self.cfg.imbalance_abs;
        for i in 0..n {
            if !imbalanced || load(i) == lo {
                let r = members.id(i);
                self.alive[r / 64] |= 1 << (r % 64);
            }
        }
        self.imbalanced_decisions += imbalanced as u64;
        self.match_prefix(request.id);
        if !self.matched.is_empty() {
            let (members, running) = (&self.members, &self.running);
            let load = |i: usize| running[members.id(i)] as f64;
            let mean = (0..n).map(load).sum::<f64>() / n as f64;
            let sd = if n <= 1 {
                0.0
            } else {
                ((0..n).map(|i| (load(i) - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt()
            };
            let matched = &mut self.matched;
            for i in (1..matched.len()).rev() {
                let j = self.rng.random_range(0..=i);
                matched.swap(i, j);
            }
            // Upstream sorts the shuffled set stably by (match % descending, load ascending) and
            // takes the first under the limit: the best key under the limit, ties to the
            // earliest in shuffled order — one pass, no sort.
            let limit = mean + self.cfg.std_dev_factor * sd;
            let mut pick: Option<usize> = None;
            for &r in matched.iter() {
                if self.running[r] as f64 > limit {
                    continue;
                }
                let better = match pick {
                    None => true,
                    Some(p) => (self.percent[r], self.running[p]) > (self.percent[p], self.running[r]),
                };
                if better {
                    pick = Some(r);
                }
            }
            if let Some(r) = pick {
                self.prefix_decisions += 1;
                return self.members.index_of(r).expect("only routable ids are candidates");
            }
        }
        self.least_request(n)
    }

    fn on_dispatch(&mut self, request: &Request<'_>, r: usize) {
        let r = self.members.place(request.id, r);
        self.running[r] += 1;
        self.hash_prompt(request);
        let hints: &[u32] = if self.slots_for == Some(request.id) { &self.slots } else { &[] };
        for (i, &h) in self.hashes.iter().enumerate() {
            self.table.record(h, hints.get(i).copied().unwrap_or(NIL), r, request.arrived_at);
            if self.table.len > self.capacity_blocks {
                // The least recently recorded block goes (the one just recorded is the most recent).
                self.table.drop_oldest();
            }
        }
    }

    fn on_complete(&mut self, c: &Completion) {
        if let Some(id) = self.members.finish(c.request_id) {
            let l = &mut self.running[id];
            *l = l.saturating_sub(1);
        }
    }

    /// A replica that leaves is forgotten: its running count and its table entries.
    fn on_replica_change(&mut self, change: &ReplicaChange) {
        if let Some(Member::Left(id)) = self.members.change(change) {
            self.running[id] = 0;
            self.table.forget(id);
        }
    }

    fn report(&self) -> Vec<(String, f64)> {
        vec![
            ("prefix_decisions".into(), self.prefix_decisions as f64),
            ("imbalanced_decisions".into(), self.imbalanced_decisions as f64),
            ("router_table_blocks".into(), self.table.len as f64),
        ]
    }
}

#[cfg(test)]
mod tests;
