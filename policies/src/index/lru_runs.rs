//! llm-d's approximate prefix index with holders per run of blocks (not a policy): per replica
//! an LRU of block hashes of bounded capacity, and the "any holder" prefix walk.
//!
//! Upstream stamps every block of a routed prompt in order (block 0 oldest) and, past the
//! replica's capacity, forgets its oldest blocks one by one, so a replica can lose a prompt's
//! first blocks and keep its later ones. Stored per run (see [`crate::index::block_runs`]) that stays
//! cheap: the blocks one dispatch gives a run on a replica get consecutive stamps, so a span
//! keeps only the stamp its position 0 would have (`base`: block `j` is stamped `base + j`), and
//! a replica's oldest blocks are the front of the span its oldest dispatch left.

use std::collections::VecDeque;

use crate::index::block_index::KeyMap;
use crate::index::block_runs::Run;

/// Positions `start..end` of a run held by `replica`, block `j` stamped `base + j`.
#[derive(Clone, Copy, Debug)]
struct Aged {
    replica: u32,
    start: u32,
    end: u32,
    base: u64,
}

#[derive(Clone, Debug)]
pub struct LruRuns {
    /// Per run, its spans sorted by (replica, start); a replica's spans are disjoint.
    runs: KeyMap<Vec<Aged>>,
    held: Vec<u64>,
    /// Per replica, (base, run) of every span a dispatch created, oldest first (stale entries,
    /// whose span was since restamped or dropped, are skipped when they come up).
    queues: Vec<VecDeque<(u64, u64)>>,
    /// Blocks stamped so far (upstream's insertion counter).
    clock: u64,
    capacity: u64,
}

impl LruRuns {
    /// Each replica keeps at most `capacity` blocks.
    pub fn new(replicas: usize, capacity: u64) -> Self {
        Self {
            runs: KeyMap::default(),
            held: vec![0; replicas],
            queues: vec![VecDeque::new(); replicas],
            clock: 0,
            capacity,
        }
    }

    pub fn replicas(&self) -> usize {
        self.held.len()
    }

    /// Blocks replica `r` holds.
    pub fn held_blocks(&self, r: usize) -> u64 {
        self.held[r]
    }

    /// Replica `r` was sent a prompt cut into `runs`: all its blocks become `r`'s newest, block
    /// 0 oldest among them; then `r`'s oldest blocks beyond the capacity are forgotten.
    pub fn record(&mut self, runs: &[Run], r: usize) {
        let replica = r as u32;
        for run in runs {
            let base = self.clock + 1;
            self.clock += run.blocks as u64;
            let spans = self.runs.entry(run.key).or_default();
            let blocks = run.blocks;
            let mut covered = 0u64;
            spans.retain_mut(|s| {
                if s.replica != replica || s.start >= blocks {
                    return true;
                }
                covered += (s.end.min(blocks) - s.start) as u64;
                s.start = blocks;
                s.end > blocks
            });
            let at = spans.partition_point(|s| s.replica < replica);
            spans.insert(at, Aged { replica, start: 0, end: blocks, base });
            self.held[r] += blocks as u64 - covered;
            self.queues[r].push_back((base, run.key));
        }
        while self.held[r] > self.capacity {
            let Some(&(base, key)) = self.queues[r].front() else { break };
            let spans = self.runs.get_mut(&key).expect("a queued run has spans");
            let Some(i) = spans.iter().position(|s| s.replica == replica && s.base == base) else {
                self.queues[r].pop_front();
                continue;
            };
            let k = (spans[i].end - spans[i].start).min((self.held[r] - self.capacity) as u32);
            spans[i].start += k;
            self.held[r] -= k as u64;
            if spans[i].start == spans[i].end {
                spans.remove(i);
                self.queues[r].pop_front();
                if spans.is_empty() {
                    self.runs.remove(&key);
                }
            }
        }
    }

    /// Replica `r` holds nothing any more (it left).
    pub fn forget(&mut self, r: usize) {
        let replica = r as u32;
        self.runs.retain(|_, spans| {
            spans.retain(|s| s.replica != replica);
            !spans.is_empty()
        });
        self.held[r] = 0;
        self.queues[r].clear();
    }

    /// Per replica, the blocks it holds among the prompt's leading blocks that some replica holds
    /// (the walk stops at the first block nobody holds).
    pub fn matched(&self, runs: &[Run], out: &mut [u32]) {
        out.fill(0);
        for run in runs {
            let spans = self.runs.get(&run.key).map_or(&[][..], |v| v.as_slice());
            // The first position nobody holds.
            let mut reach = 0;
            loop {
                let before = reach;
                for s in spans {
                    if s.start <= reach && s.end > reach {
                        reach = s.end;
                    }
                }
                if reach == before {
                    break;
                }
            }
            let stop = reach.min(run.blocks);
            for s in spans {
                if s.start < stop {
                    out[s.replica as usize] += s.end.min(stop) - s.start;
                }
            }
            if stop < run.blocks {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::block_index::{BlockIndex, Stamps};
    use crate::index::block_runs::PromptRuns;
    use routelab_policy_api::{BlockHashing, Segment};

    /// What llm-d's approximate producer does per block hash (the code this replaced): match
    /// walking blocks while anyone holds them, record with an insertion counter, pop the oldest.
    struct PerBlock {
        index: BlockIndex,
        lru: Vec<Stamps>,
        clock: u64,
        capacity: u64,
    }

    impl PerBlock {
        fn matched(&self, hashes: &[u64], out: &mut [u32]) {
            out.fill(0);
            for &h in hashes {
                let holders: Vec<usize> = (0..out.len()).filter(|&r| self.index.holds(h, r)).collect();
                if holders.is_empty() {
                    break;
                }
                for r in holders {
                    out[r] += 1;
                }
            }
        }

        fn record(&mut self, hashes: &[u64], r: usize) {
            for &h in hashes {
                self.index.insert(h, r);
                self.clock += 1;
                self.lru[r].stamp(h, r, self.clock);
            }
            while self.lru[r].len() as u64 > self.capacity {
                let Some((h, _)) = self.lru[r].pop_oldest() else { break };
                self.index.remove(h, r);
            }
        }
    }

    /// Same matches and block counts as per-block LRUs, with partial tails, a block limit that
    /// cuts runs short, prompts longer than the capacity and replicas in two bitset words.
    #[test]
    fn runs_match_per_block_lrus() {
        const B: u32 = 8;
        let n = 67;
        let hashing = BlockHashing { block_tokens: B, max_blocks: 20, partial_tail: true };
        let mut g = 0x2545_f491_4f6c_dd1du64;
        let mut below = |k: u64| {
            g ^= g << 13;
            g ^= g >> 7;
            g ^= g << 17;
            g % k
        };
        let mut cut = PromptRuns::new(B);
        let mut runs = LruRuns::new(n, 60);
        let mut reference =
            PerBlock { index: BlockIndex::new(n), lru: vec![Stamps::default(); n], clock: 0, capacity: 60 };
        let (mut out, mut out_ref) = (vec![0; n], vec![0; n]);
        let mut matched = 0;
        for step in 0..3000 {
            let mut p = Vec::new();
            let mut id = 1 + below(3);
            for depth in 0..1 + below(4) {
                p.push(Segment { id: id * 10 + depth, tokens: [3, 16, 40, 45, 100][below(5) as usize] });
                id = id * 3 + below(2);
            }
            let hashes = hashing.hashes(&p);
            cut.cut_limited(&p, hashing.max_blocks, true);
            assert_eq!(cut.blocks, hashes.len() as u64);
            runs.matched(&cut.runs, &mut out);
            reference.matched(&hashes, &mut out_ref);
            assert_eq!(out, out_ref, "step {step}");
            matched += out.iter().filter(|&&m| m > 0).count();
            let r = below(n as u64) as usize % (1 + step % n);
            runs.record(&cut.runs, r);
            reference.record(&hashes, r);
            for r in 0..n {
                assert_eq!(runs.held_blocks(r), reference.index.held_blocks(r), "replica {r}, step {step}");
            }
        }
        assert!(matched > 1000, "the prompts matched something: {matched}");
    }
}
