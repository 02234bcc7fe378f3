//! Preble's per-prefix hit counts over a sliding window, keyed by well-mixed 64-bit hashes.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

/// Prefix keys are already well-mixed 64-bit hashes: hash them as themselves.
#[derive(Default)]
pub(super) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) | *b as u64;
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

pub(super) type KeyMap<V> = HashMap<u64, V, BuildHasherDefault<KeyHasher>>;

/// A request id spread over 64 bits for a [`KeyMap`] (ids are consecutive; the map's probe uses
/// the top bits). An odd multiplier is a bijection, so distinct ids stay distinct.
pub(super) fn request_key(id: u64) -> u64 {
    id.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// How many times each prefix was dispatched within the window: one time-ordered log of
/// (time, key) for all prefixes and a count per key, so a new prefix costs a map entry rather
/// than a window of its own, and a prefix leaves the map when its last hit leaves the window.
/// Counts equal a `WindowSum` per key because dispatch times never decrease.
pub(super) struct NodeHits {
    window: f64,
    log: VecDeque<(f64, u64)>,
    counts: KeyMap<u32>,
}

impl NodeHits {
    pub(super) fn new(window: f64) -> Self {
        Self { window, log: VecDeque::new(), counts: KeyMap::default() }
    }

    /// Drops the hits that fell out of the window ending at `now` (the same test as `WindowSum`).
    pub(super) fn expire(&mut self, now: f64) {
        while let Some(&(t, key)) = self.log.front() {
            if t > now - self.window {
                break;
            }
            self.log.pop_front();
            if let std::collections::hash_map::Entry::Occupied(mut e) = self.counts.entry(key) {
                *e.get_mut() -= 1;
                if *e.get() == 0 {
                    e.remove();
                }
            }
        }
    }

    pub(super) fn add(&mut self, now: f64, key: u64) {
        self.log.push_back((now, key));
        *self.counts.entry(key).or_insert(0) += 1;
    }

    /// Hits of `key` in the window as of the last [`NodeHits::expire`].
    pub(super) fn count(&self, key: u64) -> u32 {
        self.counts.get(&key).copied().unwrap_or(0)
    }
}
