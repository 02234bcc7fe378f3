//! Helpers shared by the block-hash routers (not a policy): which replicas hold each block hash,
//! and a recency queue for TTL and LRU bookkeeping.
//!
//! [`BlockIndex`] is the common shape of Dynamo's radix tree, llm-d's `hashToPods`, AIBrix's
//! `PrefixHashTable` and production-stack's hash trie once hashes are chained (a chained hash
//! names its whole prefix, so a flat map from hash to holders is the trie). Holders are a bitset
//! per block: one map entry per block and 64 replicas; with more replicas, word w of a block
//! lives in the w-th map (so a replica that leaves is forgotten from its word's map alone).
//!
//! Dynamo and llm-d keep holders per run of blocks instead ([`crate::index::block_runs`],
//! [`crate::index::lru_runs`]): the same answers at a cost per prompt segment rather than per block.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use routelab_policy_api::mix64;

/// Keys are already well-mixed 64-bit hashes: hash them as themselves.
#[derive(Default)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ *b as u64;
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

/// A map keyed by a 64-bit hash.
pub type KeyMap<V> = HashMap<u64, V, BuildHasherDefault<KeyHasher>>;

/// One key per (block hash, replica), for per-holder bookkeeping (TTL stamps, reference counts).
#[inline]
pub fn pair_key(hash: u64, replica: usize) -> u64 {
    mix64(hash ^ ((replica as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)))
}

/// Which replicas hold each block hash, and how many blocks each replica holds.
#[derive(Clone, Debug)]
pub struct BlockIndex {
    words: usize,
    /// Per word of 64 replicas: block hash → holder bits.
    bits: Vec<KeyMap<u64>>,
    held: Vec<u64>,
    /// Scratch of [`Self::consecutive`]: replicas still matching.
    alive: Vec<u64>,
}

impl BlockIndex {
    pub fn new(replicas: usize) -> Self {
        let words = replicas.div_ceil(64).max(1);
        Self { words, bits: vec![KeyMap::default(); words], held: vec![0; replicas], alive: vec![0; words] }
    }

    pub fn replicas(&self) -> usize {
        self.held.len()
    }

    /// Blocks replica `r` holds.
    pub fn held_blocks(&self, r: usize) -> u64 {
        self.held[r]
    }

    /// Word `w` of `hash`'s holder bitset (replicas 64·w ..).
    #[inline]
    pub fn word(&self, hash: u64, w: usize) -> u64 {
        self.bits[w].get(&hash).copied().unwrap_or(0)
    }

    pub fn words(&self) -> usize {
        self.words
    }

    pub fn holds(&self, hash: u64, r: usize) -> bool {
        self.word(hash, r / 64) >> (r % 64) & 1 == 1
    }

    /// Records that `r` holds `hash`; true if it did not before.
    pub fn insert(&mut self, hash: u64, r: usize) -> bool {
        let e = self.bits[r / 64].entry(hash).or_insert(0);
        let bit = 1u64 << (r % 64);
        let new = *e & bit == 0;
        *e |= bit;
        self.held[r] += new as u64;
        new
    }

    /// Forgets that `r` holds `hash`; true if it did.
    pub fn remove(&mut self, hash: u64, r: usize) -> bool {
        let map = &mut self.bits[r / 64];
        let Some(e) = map.get_mut(&hash) else { return false };
        let bit = 1u64 << (r % 64);
        let had = *e & bit != 0;
        *e &= !bit;
        if *e == 0 {
            map.remove(&hash);
        }
        self.held[r] -= had as u64;
        had
    }

    /// Forgets `hash` on every replica that holds it (a whole trie node); returns how many did.
    pub fn remove_block(&mut self, hash: u64) -> u32 {
        let mut had = 0;
        for w in 0..self.words {
            let Some(mut bits) = self.bits[w].remove(&hash) else { continue };
            while bits != 0 {
                self.held[w * 64 + bits.trailing_zeros() as usize] -= 1;
                had += 1;
                bits &= bits - 1;
            }
        }
        had
    }

    /// Forgets every hash `r` holds (a replica that left).
    pub fn forget(&mut self, r: usize) {
        let bit = 1u64 << (r % 64);
        self.bits[r / 64].retain(|_, e| {
            *e &= !bit;
            *e != 0
        });
        self.held[r] = 0;
    }

    /// Per replica, how many leading blocks of `hashes` it holds without a gap (Dynamo's overlap,
    /// the longest-prefix match of every radix-tree router). Stops at the first block nobody
    /// still in the race holds.
    pub fn consecutive(&mut self, hashes: &[u64], out: &mut [u32]) {
        let n = out.len();
        let mut alive = std::mem::take(&mut self.alive);
        alive.fill(u64::MAX);
        if n % 64 != 0 {
            alive[self.words - 1] = (1u64 << (n % 64)) - 1;
        }
        out.fill(hashes.len() as u32);
        if self.words == 1 {
            // One word (≤ 64 replicas): the common case, without the loop over words.
            let mut a = alive[0];
            for (k, &h) in hashes.iter().enumerate() {
                let bits = self.bits[0].get(&h).copied().unwrap_or(0) & a;
                let mut dropped = a & !bits;
                while dropped != 0 {
                    out[dropped.trailing_zeros() as usize] = k as u32;
                    dropped &= dropped - 1;
                }
                a = bits;
                if a == 0 {
                    break;
                }
            }
            self.alive = alive;
            return;
        }
        for (k, &h) in hashes.iter().enumerate() {
            let mut any = false;
            for (w, a) in alive.iter_mut().enumerate() {
                if *a == 0 {
                    continue;
                }
                let bits = self.word(h, w) & *a;
                let mut dropped = *a & !bits;
                while dropped != 0 {
                    out[w * 64 + dropped.trailing_zeros() as usize] = k as u32;
                    dropped &= dropped - 1;
                }
                *a = bits;
                any |= bits != 0;
            }
            if !any {
                break;
            }
        }
        self.alive = alive;
    }
}

/// Entries stamped with a time or counter, expired oldest first. A re-stamped entry leaves its
/// old queue slot behind; the slot is skipped when it comes up (its stamp no longer matches).
#[derive(Clone, Debug, Default)]
pub struct Stamps {
    current: KeyMap<u64>,
    queue: VecDeque<(u64, u64, u32)>,
}

impl Stamps {
    /// Stamps (`hash`, `r`) with `stamp` (stamps must not decrease); true if it was not stamped.
    /// An entry already carrying `stamp` is left alone (Dynamo's bucketed TTL does the same).
    pub fn stamp(&mut self, hash: u64, r: usize, stamp: u64) -> bool {
        match self.current.insert(pair_key(hash, r), stamp) {
            Some(s) if s == stamp => false,
            old => {
                self.queue.push_back((stamp, hash, r as u32));
                old.is_none()
            }
        }
    }

    /// Removes entries stamped before `limit`, calling `expire(hash, replica)` for each.
    pub fn expire_before(&mut self, limit: u64, mut expire: impl FnMut(u64, usize)) {
        while let Some(&(s, h, r)) = self.queue.front() {
            if s >= limit {
                break;
            }
            self.queue.pop_front();
            let k = pair_key(h, r as usize);
            if self.current.get(&k) == Some(&s) {
                self.current.remove(&k);
                expire(h, r as usize);
            }
        }
    }

    /// Removes the oldest live entry; returns it.
    pub fn pop_oldest(&mut self) -> Option<(u64, usize)> {
        while let Some((s, h, r)) = self.queue.pop_front() {
            let k = pair_key(h, r as usize);
            if self.current.get(&k) == Some(&s) {
                self.current.remove(&k);
                return Some((h, r as usize));
            }
        }
        None
    }

    /// Drops the queue's stale slots once they outnumber the live entries (plus a margin): a
    /// queue re-stamped on every use would otherwise grow with the uses, not the entries.
    /// Amortised O(1) a stamp; the live entries keep their order.
    pub fn compact(&mut self) {
        if self.queue.len() <= 2 * self.current.len() + 1024 {
            return;
        }
        let current = &self.current;
        self.queue.retain(|&(s, h, r)| current.get(&pair_key(h, r as usize)) == Some(&s));
    }

    /// Forgets (`hash`, `r`) (its queue slot becomes stale).
    pub fn forget(&mut self, hash: u64, r: usize) {
        self.current.remove(&pair_key(hash, r));
    }

    /// Live entries.
    pub fn len(&self) -> usize {
        self.current.len()
    }

    pub fn is_empty(&self) -> bool {
        self.current.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consecutive_counts_leading_blocks_per_replica_across_words() {
        let mut ix = BlockIndex::new(70);
        let h = [11u64, 22, 33, 44];
        for &b in &h[..3] {
            ix.insert(b, 2);
        }
        ix.insert(h[0], 69);
        ix.insert(h[1], 69);
        // Replica 5 holds block 1 but not block 0: no prefix.
        ix.insert(h[1], 5);
        let mut out = vec![0; 70];
        ix.consecutive(&h, &mut out);
        assert_eq!((out[2], out[69], out[5], out[0]), (3, 2, 0, 0));
        assert!(ix.remove(h[0], 69) && !ix.remove(h[0], 69));
        assert_eq!(ix.held_blocks(69), 1);
        ix.consecutive(&h, &mut out);
        assert_eq!(out[69], 0);
    }

    #[test]
    fn stamps_expire_only_their_latest_stamp() {
        let mut s = Stamps::default();
        assert!(s.stamp(1, 0, 10));
        assert!(s.stamp(2, 0, 11));
        assert!(!s.stamp(1, 0, 20)); // refreshed
        let mut gone = Vec::new();
        s.expire_before(15, |h, r| gone.push((h, r)));
        assert_eq!(gone, vec![(2, 0)]);
        assert_eq!(s.pop_oldest(), Some((1, 0)));
        assert!(s.is_empty());
    }

    #[test]
    fn compaction_drops_only_stale_slots_and_keeps_the_order() {
        let mut s = Stamps::default();
        for t in 0..5000u64 {
            s.stamp(t % 3, 0, t);
            s.compact();
        }
        assert!(s.queue.len() <= 2 * 3 + 1024, "{} slots for 3 entries", s.queue.len());
        assert_eq!(
            (s.pop_oldest(), s.pop_oldest(), s.pop_oldest(), s.pop_oldest()),
            (Some((2, 0)), Some((0, 0)), Some((1, 0)), None)
        );
    }

    #[test]
    fn remove_block_forgets_every_holder_across_words() {
        let mut ix = BlockIndex::new(130);
        for r in [0, 63, 64, 129] {
            ix.insert(7, r);
        }
        ix.insert(8, 64);
        assert_eq!(ix.remove_block(7), 4);
        assert_eq!(ix.remove_block(7), 0);
        assert_eq!((ix.held_blocks(0), ix.held_blocks(64), ix.held_blocks(129)), (0, 1, 0));
        assert!(ix.holds(8, 64) && !ix.holds(7, 64));
    }
}
