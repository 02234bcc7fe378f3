//! A KV tier below GPU memory: a store of prompt KV blocks with a capacity, LRU eviction and a
//! link that loads cross. It serves as the shared tier of a disaggregated cluster (Mooncake
//! Store, LMCache's remote backend: one store every instance reads, filled by the prefill pool
//! with [`KvTier::put`]) and as the per-replica CPU tier and shared remote tier of an aggregated
//! one (filled block by block with what the tier above evicts, [`KvTier::offload`]; see
//! `tiers.rs`).
//!
//! A block is one prompt segment under its path (the prefix cache's node identity, keyed by the
//! path hash). Put: when a prefill instance finishes a prompt, every segment of it is stored (or
//! refreshed); at capacity the least recently used blocks go, deepest first among blocks used at
//! the same time (a prefix is never dropped before its extensions). Get: the longest prefix of a
//! prompt held as whole blocks, refreshed. Loads: `base + tokens × kv_bytes / (bandwidth /
//! concurrent loads)`, `concurrent` counting the loads in flight when one starts (it included);
//! its time is fixed at its start, as a link transfer's is.

use std::collections::BTreeSet;

use routelab_policy_api::Segment;

use super::prefix_cache::extend_path_hash;
use crate::workload::cluster::kv_tiers::KvTierSpec;

pub(super) struct KvTier {
    capacity_tokens: u64,
    bandwidth_bytes_s: f64,
    base_latency_s: f64,
    kv_bytes_per_token: f64,
    /// Path hash → (tokens, LRU key).
    blocks: crate::seeds::MixMap<u64, (u32, (u64, u32))>,
    /// (last use, u32::MAX − depth, path hash): the first is the next victim.
    lru: BTreeSet<(u64, u32, u64)>,
    used_tokens: u64,
    clock: u64,
    /// Loads in flight.
    pub loading: u32,
    /// Prompt tokens loaded from the tier into instances.
    pub loaded_tokens: u64,
    /// Loads carried out.
    pub loads: u64,
    /// Tokens written by [`KvTier::offload`].
    pub offloaded_tokens: u64,
}

impl KvTier {
    pub fn new(spec: &KvTierSpec, kv_bytes_per_token: f64) -> Self {
        Self {
            capacity_tokens: spec.capacity_tokens(kv_bytes_per_token),
            bandwidth_bytes_s: spec.bandwidth_bytes_s(),
            base_latency_s: spec.base_latency_s,
            kv_bytes_per_token,
            blocks: Default::default(),
            lru: BTreeSet::new(),
            used_tokens: 0,
            clock: 0,
            loading: 0,
            loaded_tokens: 0,
            loads: 0,
            offloaded_tokens: 0,
        }
    }

    fn touch(&mut self, hash: u64, depth: u32, tokens: u32) {
        let key = (self.clock, u32::MAX - depth);
        if let Some((_, old)) = self.blocks.insert(hash, (tokens, key)) {
            self.lru.remove(&(old.0, old.1, hash));
        } else {
            self.used_tokens += tokens as u64;
        }
        self.lru.insert((key.0, key.1, hash));
    }

    /// Stores every segment of `prompt` (a prefill computed it), evicting to fit.
    pub fn put(&mut self, prompt: &[Segment]) {
        self.clock += 1;
        let mut hash = 0;
        for (depth, s) in prompt.iter().enumerate() {
            hash = extend_path_hash(hash, s.id);
            if s.tokens as u64 > self.capacity_tokens {
                break;
            }
            self.touch(hash, depth as u32, s.tokens);
        }
        while self.used_tokens > self.capacity_tokens {
            let (_, _, victim) = self.lru.pop_first().expect("used tokens are held by blocks");
            let (tokens, _) = self.blocks.remove(&victim).expect("in the LRU order");
            self.used_tokens -= tokens as u64;
        }
    }

    /// Stores (or refreshes) one block, `tokens` tokens at path `hash`, `depth` segments deep
    /// (the tier above evicted it), then evicts least recently used blocks to fit, pushing
    /// them onto `spilled` as (path hash, depth, tokens). A block larger than the whole tier
    /// goes straight to `spilled`.
    pub fn offload(&mut self, hash: u64, depth: u32, tokens: u32, spilled: &mut Vec<(u64, u32, u32)>) {
        if tokens as u64 > self.capacity_tokens {
            spilled.push((hash, depth, tokens));
            return;
        }
        self.clock += 1;
        self.touch(hash, depth, tokens);
        self.offloaded_tokens += tokens as u64;
        while self.used_tokens > self.capacity_tokens {
            let (_, d, victim) = self.lru.pop_first().expect("used tokens are held by blocks");
            let (t, _) = self.blocks.remove(&victim).expect("in the LRU order");
            self.used_tokens -= t as u64;
            spilled.push((victim, u32::MAX - d, t));
        }
    }

    /// Whether the block at path `hash` is held; a hit refreshes it.
    pub fn hit(&mut self, hash: u64) -> bool {
        let Some(&(tokens, (_, inv_depth))) = self.blocks.get(&hash) else { return false };
        self.clock += 1;
        self.touch(hash, u32::MAX - inv_depth, tokens);
        true
    }

    /// Whether the block at path `hash` is held; changes nothing.
    pub fn holds(&self, hash: u64) -> bool {
        self.blocks.contains_key(&hash)
    }

    /// The leading whole segments of `prompt` held here, as (segments, tokens); refreshes them.
    pub fn get(&mut self, prompt: &[Segment]) -> (usize, u32) {
        self.clock += 1;
        let (mut hash, mut tokens) = (0, 0);
        for (depth, s) in prompt.iter().enumerate() {
            hash = extend_path_hash(hash, s.id);
            if !self.blocks.contains_key(&hash) {
                return (depth, tokens);
            }
            self.touch(hash, depth as u32, s.tokens);
            tokens += s.tokens;
        }
        (prompt.len(), tokens)
    }

    /// Seconds to load `tokens` tokens with the loads in flight (this one included).
    pub fn load_time_s(&self, tokens: u64) -> f64 {
        let share = self.bandwidth_bytes_s / (self.loading + 1) as f64;
        self.base_latency_s + tokens as f64 * self.kv_bytes_per_token / share
    }

    #[cfg(test)]
    pub fn used_tokens(&self) -> u64 {
        self.used_tokens
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(id: u64, tokens: u32) -> Segment {
        Segment { id, tokens }
    }

    fn tier(capacity_tokens: u64) -> KvTier {
        // 1 byte per token: capacity in GB = tokens / 1e9.
        let spec = KvTierSpec { capacity_gb: capacity_tokens as f64 / 1e9, bandwidth_gbps: 8.0, base_latency_s: 0.001 };
        KvTier::new(&spec, 1.0)
    }

    #[test]
    fn the_tier_holds_prefixes_by_path_and_drops_the_least_recent_deepest_blocks_first() {
        let mut t = tier(1000);
        let (sys, a, b) = (seg(1, 100), seg(2, 400), seg(3, 400));
        t.put(&[sys, a]);
        assert_eq!(t.get(&[sys, a, seg(9, 50)]), (2, 500));
        // The same segment after another prefix is another block.
        assert_eq!(t.get(&[a]), (0, 0));
        t.put(&[sys, b]);
        assert_eq!(t.used_tokens(), 900);
        // 100 + 400 + 400 + 400 > 1000: `a` (least recently used) goes, the shared `sys` stays.
        t.put(&[sys, seg(4, 400)]);
        assert_eq!(t.used_tokens(), 900);
        assert_eq!(t.get(&[sys, a]), (1, 100));
        assert_eq!(t.get(&[sys, b]), (2, 500));
        // A refreshed block outlives an older one: `b` was just read, so the next put evicts seg 4.
        t.put(&[sys, seg(5, 400)]);
        assert_eq!(t.get(&[sys, seg(4, 400)]), (1, 100));
        assert_eq!(t.get(&[sys, b]), (2, 500));
    }

    #[test]
    fn a_load_is_base_plus_tokens_over_the_bandwidth_shared_by_loads_in_flight() {
        // 8 Gbit/s = 1e9 B/s at 1 B per token: 1e6 tokens = 1 ms, + 1 ms base; 2 ms with a
        // second load in flight.
        let mut t = tier(10_000);
        assert!((t.load_time_s(1_000_000) - 0.002).abs() < 1e-12);
        t.loading = 1;
        assert!((t.load_time_s(1_000_000) - 0.003).abs() < 1e-12);
    }
}
