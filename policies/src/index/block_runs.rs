//! Holders per run of blocks, for the block-hash routers Dynamo and llm-d (llm-d's approximate
//! LRU is in [`crate::index::lru_runs`]). Not a policy.
//!
//! A *run* is the blocks one prompt segment completes: the chain state where the segment starts
//! and the segment's content fix every one of them, so a run is named by its first block's hash
//! and two prompts that share it share the run's first `min(blocks)` blocks (a shorter segment with
//! the same id gives a prefix of the run). Every index here stores holders per run — which
//! replicas hold which positions of it — instead of one map entry per (block, replica):
//! dispatch, completion, eviction and matching cost per segment instead of per block (≈ 110
//! blocks in 3 segments on tool_use, ≈ 750 in ≈ 24 on the Mooncake replay). What they answer
//! is what per-block hash sets answer: a block at position `j` of run `k` is held by `r` exactly
//! when one of `r`'s spans of `k` covers `j` (tested against [`crate::index::block_index::BlockIndex`]).
//!
//! [`PromptRuns`] cuts a prompt into runs, and resumes the chain at the deepest path prefix met
//! before (a memo keyed by a hash of the prefix's segments), so shared system prompts and
//! documents are hashed once, not on every decision.

use std::collections::VecDeque;

use routelab_policy_api::{ChainState, Eviction, Segment, mix64};

use crate::index::block_index::KeyMap;

/// The blocks one segment completes: the first one's hash, and how many.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    pub key: u64,
    pub blocks: u32,
}

/// Cuts prompts and eviction paths into runs of full blocks (Dynamo's and vLLM's rule; llm-d's
/// approximate producer adds the partial last block), memoising the chain state at the end of
/// every path prefix.
#[derive(Clone, Debug)]
pub struct PromptRuns {
    block_tokens: u32,
    /// Per path prefix (key from [`Self::extend`]): the chain after it, and its last segment's run.
    memo: KeyMap<(ChainState, Run)>,
    /// The last prompt's runs (segments that complete no block are left out), and its blocks.
    pub runs: Vec<Run>,
    pub blocks: u64,
    /// Scratch: block hashes of one segment, keys of an eviction path's prefixes.
    scratch: Vec<u64>,
    keys: Vec<u64>,
}

impl PromptRuns {
    /// Past this many memoised prefixes (≈ 64 bytes each) all are dropped; they are rebuilt
    /// when met again. Most prompts end in a segment of their own, so this bounds the memo.
    pub const MAX_MEMO: usize = 1 << 18;
    const ROOT_KEY: u64 = 0x243f_6a88_85a3_08d3;

    pub fn new(block_tokens: u32) -> Self {
        assert!(block_tokens > 0, "block_tokens must be at least 1");
        Self {
            block_tokens,
            memo: KeyMap::default(),
            runs: Vec::new(),
            blocks: 0,
            scratch: Vec::new(),
            keys: Vec::new(),
        }
    }

    /// The key of a path extended by segment `s`. Eviction paths run to hundreds of segments
    /// and each key depends on the one before, so the chain gets one multiply per segment; the
    /// segment's own mix does not wait for it.
    #[inline]
    fn extend(key: u64, s: Segment) -> u64 {
        key.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ mix64(s.id ^ (s.tokens as u64).rotate_left(40))
    }

    /// The chain after the prefix `key` (ending in `s`, following `state`) and `s`'s run.
    fn step(&mut self, key: u64, state: ChainState, s: Segment) -> (ChainState, Run) {
        if let Some(&hit) = self.memo.get(&key) {
            return hit;
        }
        let mut next = state;
        self.scratch.clear();
        next.feed(s, self.block_tokens, &mut self.scratch, usize::MAX);
        let run = Run { key: self.scratch.first().copied().unwrap_or(0), blocks: self.scratch.len() as u32 };
        if self.memo.len() >= Self::MAX_MEMO {
            self.memo.clear();
        }
        self.memo.insert(key, (next, run));
        (next, run)
    }

    /// Cuts `segments` into [`Self::runs`] (and [`Self::blocks`]).
    pub fn cut(&mut self, segments: &[Segment]) {
        self.cut_limited(segments, usize::MAX, false);
    }

    /// Like [`Self::cut`], the blocks [`BlockHashing`](routelab_policy_api::BlockHashing) with
    /// these `max_blocks` and `partial_tail` would hash: the first `max_blocks` only, and the
    /// partial last block (if any, and if under the limit) as a run of its own.
    pub fn cut_limited(&mut self, segments: &[Segment], max_blocks: usize, partial_tail: bool) {
        self.runs.clear();
        self.blocks = 0;
        let max = max_blocks as u64;
        let (mut key, mut state) = (Self::ROOT_KEY, ChainState::START);
        for &s in segments {
            key = Self::extend(key, s);
            let mut run;
            (state, run) = self.step(key, state, s);
            if run.blocks == 0 {
                continue;
            }
            if self.blocks + run.blocks as u64 >= max {
                run.blocks = (max - self.blocks) as u32;
                self.runs.push(run);
                self.blocks = max;
                return;
            }
            self.runs.push(run);
            self.blocks += run.blocks as u64;
        }
        if let Some(tail) = state.tail().filter(|_| partial_tail) {
            self.runs.push(Run { key: tail, blocks: 1 });
            self.blocks += 1;
        }
    }

    /// The blocks eviction `e` took from its replica: positions `from..` of the returned run (the
    /// run of the path's last segment; blocks before the cut are intact, and blocks reaching past
    /// the last segment were its children's, reported when those went).
    pub fn evicted(&mut self, e: &Eviction<'_>) -> Option<(Run, u32)> {
        let (&last, above) = e.path().split_last()?;
        // Resume at the deepest prefix of the path met before (usually its parent).
        self.keys.clear();
        let mut key = Self::ROOT_KEY;
        for &s in above {
            key = Self::extend(key, s);
            self.keys.push(key);
        }
        let (mut done, mut state) = (0, ChainState::START);
        for j in (0..above.len()).rev() {
            if let Some(&(st, _)) = self.memo.get(&self.keys[j]) {
                (done, state) = (j + 1, st);
                break;
            }
        }
        for (j, &s) in above.iter().enumerate().skip(done) {
            (state, _) = self.step(self.keys[j], state, s);
        }
        let before: u64 = above.iter().map(|s| s.tokens as u64).sum();
        let first_here = state.blocks();
        let last_key = Self::extend(key, last);
        let (_, run) = self.step(last_key, state, last);
        if e.remaining_tokens == 0 {
            // Wholly evicted: its prefix is likely gone for good; keep the memo small.
            self.memo.remove(&last_key);
        }
        let first_gone = (before + e.remaining_tokens as u64) / self.block_tokens as u64;
        let from = (first_gone - first_here).min(run.blocks as u64) as u32;
        (from < run.blocks).then_some((run, from))
    }
}

/// Which replicas are still matching while [`HeldRuns::consecutive`] and
/// [`ActiveRuns::consecutive`] walk a prompt's runs, and how far each got into the current run.
#[derive(Clone, Debug)]
struct Race {
    alive: Vec<u64>,
    lead: Vec<u32>,
}

impl Race {
    fn new(replicas: usize) -> Self {
        Self { alive: vec![0; replicas.div_ceil(64).max(1)], lead: vec![0; replicas] }
    }

    fn start(&mut self, out: &mut [u32], total: u64) {
        let n = out.len();
        self.alive.fill(u64::MAX);
        if n % 64 != 0 {
            *self.alive.last_mut().expect("one word") = (1u64 << (n % 64)) - 1;
        }
        out.fill(total as u32);
    }

    fn is_alive(&self, r: usize) -> bool {
        self.alive[r / 64] >> (r % 64) & 1 == 1
    }

    /// Offers `r` a lead of `len` blocks into the current run (the longest offer counts).
    #[inline]
    fn offer(&mut self, r: usize, len: u32) {
        if self.is_alive(r) && len > self.lead[r] {
            self.lead[r] = len;
        }
    }

    /// Ends the current run of `blocks` blocks starting at block `base`: every replica still
    /// matching that holds fewer of its blocks stops there. False when none is left.
    fn settle(&mut self, base: u64, blocks: u32, out: &mut [u32]) -> bool {
        let mut any = false;
        for (w, word) in self.alive.iter_mut().enumerate() {
            let mut bits = *word;
            while bits != 0 {
                let r = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                let lead = std::mem::take(&mut self.lead[r]);
                if lead < blocks {
                    out[r] = (base + lead as u64) as u32;
                    *word &= !(1u64 << (r % 64));
                }
            }
            any |= *word != 0;
        }
        any
    }
}

/// Positions `start..end` of a run held by `replica`, stamped (TTL mode; 0 otherwise).
#[derive(Clone, Copy, Debug)]
struct Span {
    replica: u32,
    start: u32,
    end: u32,
    stamp: u64,
}

/// The blocks each replica is believed to cache, per run: a replica's spans of one run are
/// disjoint (usually one, from position 0), and a run's spans are sorted by (replica, start).
/// Optionally stamped for expiry (Dynamo's TTL): then touching spans with different stamps
/// stay apart, so a replica's lead into a run is the end of its chain of touching spans from 0.
#[derive(Clone, Debug)]
pub struct HeldRuns {
    runs: KeyMap<Vec<Span>>,
    held: Vec<u64>,
    /// (stamp, run, replica) in stamping order, for [`Self::expire_before`].
    queue: VecDeque<(u64, u64, u32)>,
    race: Race,
}

impl HeldRuns {
    pub fn new(replicas: usize) -> Self {
        Self { runs: KeyMap::default(), held: vec![0; replicas], queue: VecDeque::new(), race: Race::new(replicas) }
    }

    pub fn replicas(&self) -> usize {
        self.held.len()
    }

    /// Blocks replica `r` holds.
    pub fn held_blocks(&self, r: usize) -> u64 {
        self.held[r]
    }

    /// Records that `r` holds the first `blocks` blocks of `run`, stamped `stamp` (stamps must not
    /// decrease; `None`: no expiry). A block already held keeps being held and takes the stamp.
    pub fn insert(&mut self, run: u64, blocks: u32, r: usize, stamp: Option<u64>) {
        if blocks == 0 {
            return;
        }
        let spans = self.runs.entry(run).or_default();
        let replica = r as u32;
        let mut covered = 0u64;
        spans.retain_mut(|s| {
            if s.replica != replica || s.start >= blocks {
                return true;
            }
            covered += (s.end.min(blocks) - s.start) as u64;
            if s.end > blocks {
                s.start = blocks;
                return true;
            }
            false
        });
        self.held[r] += blocks as u64 - covered;
        let stamp_value = stamp.unwrap_or(0);
        // The replica's remaining spans all start at `blocks` or later: the new one goes first,
        // joined with the next if that touches it with the same stamp.
        let at = spans.partition_point(|s| s.replica < replica);
        match spans.get_mut(at) {
            Some(next) if next.replica == replica && next.start == blocks && next.stamp == stamp_value => {
                next.start = 0
            }
            _ => spans.insert(at, Span { replica, start: 0, end: blocks, stamp: stamp_value }),
        }
        if let Some(s) = stamp {
            self.queue.push_back((s, run, replica));
        }
    }

    /// Forgets positions `from..to` of `run` for `r`.
    pub fn remove(&mut self, run: u64, from: u32, to: u32, r: usize) {
        let Some(spans) = self.runs.get_mut(&run) else { return };
        let replica = r as u32;
        let mut removed = 0u64;
        let mut split = None;
        for (i, s) in spans.iter().enumerate() {
            if s.replica == replica && s.start < from && s.end > to {
                split = Some((i + 1, Span { start: to, ..*s }));
            }
        }
        spans.retain_mut(|s| {
            if s.replica != replica || s.end <= from || s.start >= to {
                return true;
            }
            removed += (s.end.min(to) - s.start.max(from)) as u64;
            match (s.start < from, s.end > to) {
                // (Straddling: its tail was taken out above.)
                (true, _) => {
                    s.end = from;
                    true
                }
                (false, true) => {
                    s.start = to;
                    true
                }
                (false, false) => false,
            }
        });
        if let Some((at, tail)) = split {
            // The span before it was cut short but kept: the tail goes right after it.
            spans.insert(at, tail);
        }
        if spans.is_empty() {
            self.runs.remove(&run);
        }
        self.held[r] -= removed;
    }

    /// Replica `r` holds nothing any more (it left; its queued stamps find nothing of it, or
    /// only younger spans a later life stamped, which they leave alone).
    pub fn forget(&mut self, r: usize) {
        let replica = r as u32;
        self.runs.retain(|_, spans| {
            spans.retain(|s| s.replica != replica);
            !spans.is_empty()
        });
        self.held[r] = 0;
    }

    /// Forgets every block stamped before `limit`.
    pub fn expire_before(&mut self, limit: u64) {
        while let Some(&(s, run, replica)) = self.queue.front() {
            if s >= limit {
                break;
            }
            self.queue.pop_front();
            let Some(spans) = self.runs.get_mut(&run) else { continue };
            let mut removed = 0u64;
            spans.retain(|sp| {
                let gone = sp.replica == replica && sp.stamp < limit;
                removed += gone as u64 * (sp.end - sp.start) as u64;
                !gone
            });
            if spans.is_empty() {
                self.runs.remove(&run);
            }
            self.held[replica as usize] -= removed;
        }
    }

    /// How far one replica's spans (sorted) cover a run from position 0 without a gap.
    fn lead(spans: &[Span]) -> u32 {
        let mut lead = 0;
        for s in spans {
            if s.start != lead {
                break;
            }
            lead = s.end;
        }
        lead
    }

    /// Per replica, how many leading blocks of the prompt cut into `runs` (`total` blocks) it
    /// holds without a gap.
    pub fn consecutive(&mut self, runs: &[Run], total: u64, out: &mut [u32]) {
        self.race.start(out, total);
        let mut base = 0u64;
        for run in runs {
            let spans = self.runs.get(&run.key).map_or(&[][..], |v| v.as_slice());
            let mut i = 0;
            while i < spans.len() {
                let replica = spans[i].replica;
                let group = spans[i..].iter().take_while(|s| s.replica == replica).count();
                self.race.offer(replica as usize, Self::lead(&spans[i..i + group]));
                i += group;
            }
            if !self.race.settle(base, run.blocks, out) {
                return;
            }
            base += run.blocks as u64;
        }
    }

    /// How many leading blocks of the prompt cut into `runs` replica `r` holds without a gap.
    pub fn leading(&self, runs: &[Run], r: usize) -> u64 {
        let mut n = 0u64;
        for run in runs {
            let spans = self.runs.get(&run.key).map_or(&[][..], |v| v.as_slice());
            let first = spans.partition_point(|s| s.replica < r as u32);
            let group = spans[first..].iter().take_while(|s| s.replica == r as u32).count();
            let lead = Self::lead(&spans[first..first + group]);
            n += lead.min(run.blocks) as u64;
            if lead < run.blocks {
                break;
            }
        }
        n
    }
}

/// The prompt blocks of in-flight requests, per run: how many requests on each replica hold
/// each prefix length of it (a block is in flight on `r` while any of them covers it).
#[derive(Clone, Debug)]
pub struct ActiveRuns {
    /// Per run: (replica, blocks, requests).
    runs: KeyMap<Vec<(u32, u32, u32)>>,
    held: Vec<u64>,
    race: Race,
}

impl ActiveRuns {
    pub fn new(replicas: usize) -> Self {
        Self { runs: KeyMap::default(), held: vec![0; replicas], race: Race::new(replicas) }
    }

    /// Distinct blocks of `r`'s in-flight requests.
    pub fn held_blocks(&self, r: usize) -> u64 {
        self.held[r]
    }

    fn longest(refs: &[(u32, u32, u32)], replica: u32) -> u32 {
        refs.iter().filter(|e| e.0 == replica).map(|e| e.1).max().unwrap_or(0)
    }

    /// A request on `r` holds the first `blocks` blocks of `run`.
    pub fn add(&mut self, run: u64, blocks: u32, r: usize) {
        let refs = self.runs.entry(run).or_default();
        let replica = r as u32;
        if let Some(e) = refs.iter_mut().find(|e| e.0 == replica && e.1 == blocks) {
            e.2 += 1;
            return;
        }
        let before = Self::longest(refs, replica);
        refs.push((replica, blocks, 1));
        self.held[r] += blocks.saturating_sub(before) as u64;
    }

    /// The request [`Self::add`]ed with the same arguments is done.
    pub fn remove(&mut self, run: u64, blocks: u32, r: usize) {
        let Some(refs) = self.runs.get_mut(&run) else { return };
        let replica = r as u32;
        let Some(i) = refs.iter().position(|e| e.0 == replica && e.1 == blocks) else { return };
        refs[i].2 -= 1;
        if refs[i].2 > 0 {
            return;
        }
        refs.swap_remove(i);
        let after = Self::longest(refs, replica);
        self.held[r] -= blocks.saturating_sub(after) as u64;
        if refs.is_empty() {
            self.runs.remove(&run);
        }
    }

    /// Replica `r` has no request in flight any more (it left).
    pub fn forget(&mut self, r: usize) {
        let replica = r as u32;
        self.runs.retain(|_, refs| {
            refs.retain(|e| e.0 != replica);
            !refs.is_empty()
        });
        self.held[r] = 0;
    }

    /// Per replica, how many leading blocks of the prompt cut into `runs` (`total` blocks) its
    /// in-flight requests hold.
    pub fn consecutive(&mut self, runs: &[Run], total: u64, out: &mut [u32]) {
        self.race.start(out, total);
        let mut base = 0u64;
        for run in runs {
            for &(replica, blocks, _) in self.runs.get(&run.key).map_or(&[][..], |v| v.as_slice()) {
                self.race.offer(replica as usize, blocks);
            }
            if !self.race.settle(base, run.blocks, out) {
                return;
            }
            base += run.blocks as u64;
        }
    }
}

#[cfg(test)]
mod tests;
