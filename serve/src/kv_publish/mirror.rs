//! What the emulated engine's cache holds, turned into KV events.
//!
//! The replica's prefix cache knows segments by id, not token ids; the engine hands the mirror
//! each prompt's token ids when it arrives ([`Mirror::hold`]) and lets go when it ends
//! ([`Mirror::release`]). After each step, [`Mirror::sync`] compares the cache's wholly computed
//! 16-token segments (a partial last block is not a block, as in vLLM) with what was published:
//! new ones go out as `BlockStored` (each chain of new blocks in one event, parents first),
//! gone ones (evicted, or cut) as one `BlockRemoved`. A step costs O(cache nodes).
//!
//! Bounded: token ids are kept only for segments of prompts in flight and for published blocks
//! (at most the cache's blocks).

use std::collections::{HashMap, HashSet};

use routelab_core::sim::cluster::prefix_cache::{PrefixCache, extend_path_hash};
use routelab_policy_api::Segment;

use super::{Event, Publisher};
use crate::text::BLOCK_TOKENS;

#[derive(Debug)]
struct Entry {
    ids: Box<[u32]>,
    /// Requests in flight with this block in their prompt.
    refs: u32,
    published: bool,
}

/// The engine's cache as published, and the events that bring a subscriber up to date.
#[derive(Debug, Default)]
pub struct Tracker {
    entries: HashMap<u64, Entry>,
    /// Scratch: this step's computed blocks, path → parent path.
    current: HashMap<u64, u64>,
}

/// A [`Tracker`] and where its events go.
pub struct Mirror {
    pub publisher: Publisher,
    pub tracker: Tracker,
}

impl Mirror {
    pub fn new(publisher: Publisher) -> Self {
        Self { publisher, tracker: Tracker::default() }
    }

    pub fn hold(&mut self, prompt: &[Segment], ids: &[u32]) {
        self.tracker.hold(prompt, ids)
    }

    pub fn release(&mut self, prompt: &[Segment]) {
        self.tracker.release(prompt)
    }

    /// Publishes what changed in `cache` since the last call.
    pub fn sync(&mut self, cache: &PrefixCache) {
        let events = self.tracker.changes(cache);
        self.publisher.publish(&events);
    }

    /// The cache was emptied (the engine reset its replica).
    pub fn cleared(&mut self) {
        let events = self.tracker.cleared();
        self.publisher.publish(&events);
    }
}

impl Tracker {
    /// Token ids kept (bounded by the prompts in flight and the cache's blocks).
    pub fn kept(&self) -> usize {
        self.entries.len()
    }

    /// Full blocks of `prompt` (whose token ids are `ids`), by path hash.
    fn blocks<'a>(prompt: &'a [Segment], ids: &'a [u32]) -> impl Iterator<Item = (u64, &'a [u32])> + 'a {
        let mut path = 0;
        prompt
            .iter()
            .zip(ids.chunks(BLOCK_TOKENS))
            .take_while(|(s, c)| s.tokens as usize == BLOCK_TOKENS && c.len() == BLOCK_TOKENS)
            .map(move |(s, c)| {
                path = extend_path_hash(path, s.id);
                (path, c)
            })
    }

    /// A request arrived: keep its blocks' token ids while it runs.
    pub fn hold(&mut self, prompt: &[Segment], ids: &[u32]) {
        for (path, c) in Self::blocks(prompt, ids) {
            let e = self.entries.entry(path).or_insert_with(|| Entry { ids: c.into(), refs: 0, published: false });
            e.refs += 1;
        }
    }

    /// A request ended (after the step's [`Mirror::sync`]).
    pub fn release(&mut self, prompt: &[Segment]) {
        let mut path = 0;
        for s in prompt.iter().take_while(|s| s.tokens as usize == BLOCK_TOKENS) {
            path = extend_path_hash(path, s.id);
            if let Some(e) = self.entries.get_mut(&path) {
                e.refs = e.refs.saturating_sub(1);
                if e.refs == 0 && !e.published {
                    self.entries.remove(&path);
                }
            }
        }
    }

    /// The events from what was published to what `cache` holds now.
    pub fn changes(&mut self, cache: &PrefixCache) -> Vec<Event> {
        self.current.clear();
        self.current.extend(
            cache
                .computed_segments()
                .filter(|(_, _, s)| s.tokens as usize == BLOCK_TOKENS)
                .map(|(p, parent, _)| (p, parent)),
        );
        let mut removed = Vec::new();
        self.entries.retain(|path, e| {
            if e.published && !self.current.contains_key(path) {
                e.published = false;
                removed.push(*path);
            }
            e.published || e.refs > 0
        });
        removed.sort_unstable();
        let mut new: Vec<u64> =
            (self.current.keys()).filter(|&&p| self.entries.get(&p).is_some_and(|e| !e.published)).copied().collect();
        new.sort_unstable();
        let fresh: HashSet<u64> = new.iter().copied().collect();
        let mut events = Vec::new();
        if !removed.is_empty() {
            events.push(Event::Removed(removed));
        }
        // Chains of new blocks, each from a leaf up to its first block whose parent is not new
        // (or is in another chain); parents' chains go first.
        let parents: HashSet<u64> = new.iter().map(|p| self.current[p]).filter(|p| fresh.contains(p)).collect();
        let mut done: HashSet<u64> = HashSet::new();
        let mut chains: Vec<Vec<u64>> = Vec::new();
        // From each new leaf up; a branch stops where another chain passed.
        for &p in new.iter().filter(|p| !parents.contains(p)) {
            let mut chain = Vec::new();
            let mut q = p;
            while fresh.contains(&q) && done.insert(q) {
                chain.push(q);
                q = self.current[&q];
            }
            if !chain.is_empty() {
                chain.reverse();
                chains.push(chain);
            }
        }
        // A chain found later may be the parent of one found earlier: order by depth of the
        // first block's parent along published or new blocks (short walks: chains meet).
        let depth = |mut p: u64| {
            let mut d = 0u32;
            while p != 0 && d < u32::MAX {
                match self.current.get(&p) {
                    Some(&parent) => {
                        p = parent;
                        d += 1;
                    }
                    None => break,
                }
            }
            d
        };
        chains.sort_by_key(|c| (depth(c[0]), c[0]));
        for chain in chains {
            let parent = Some(self.current[&chain[0]]).filter(|&p| p != 0);
            let mut ids = Vec::with_capacity(chain.len() * BLOCK_TOKENS);
            for p in &chain {
                let e = self.entries.get_mut(p).expect("new blocks have ids");
                e.published = true;
                ids.extend_from_slice(&e.ids);
            }
            events.push(Event::Stored { keys: chain, parent, ids });
        }
        events
    }

    /// The cache was emptied: nothing is published any more.
    pub fn cleared(&mut self) -> Vec<Event> {
        self.entries.retain(|_, e| {
            e.published = false;
            e.refs > 0
        });
        vec![Event::Cleared]
    }
}
