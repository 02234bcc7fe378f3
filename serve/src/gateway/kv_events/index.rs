//! One backend's KV cache as its events tell it: which prefixes (as the gateway's segment paths)
//! the engine holds.
//!
//! A stored block is placed under its parent block (`parent_block_hash`, or the root when none).
//! Engine blocks of any size are read: vLLM's 16-token blocks, SGLang's pages (1 token by
//! default). Along a chain, the token ids fill the gateway's blocks of [`BLOCK_TOKENS`]: each
//! gateway block completed inside an engine block gets the segment id the gateway computes for a
//! prompt with `--tokenizer` ([`crate::text::segment_id`]) and the path hash prompts are matched
//! against, held while that engine block is; the ids after the last boundary (fewer than 16) are
//! carried to the block's children. A block whose parent is unknown (stored before the gateway
//! listened, or lost in a gap) cannot be placed and is counted, not kept.
//!
//! Bounded: at most `max_tokens` tokens in held blocks; past that (the engine stores more than
//! it removes: removals were lost) the view is dropped and the caller falls back.

use std::collections::HashMap;

use routelab_core::sim::cluster::prefix_cache::extend_path_hash;
use routelab_policy_api::Segment;

use super::wire::BlockKey;
use crate::text::BLOCK_TOKENS;

#[derive(Clone, Debug)]
struct Block {
    parent: Option<BlockKey>,
    /// The gateway segments completed inside this engine block, and their paths.
    segments: Box<[Segment]>,
    paths: Box<[u64]>,
    /// At the block's end: the last completed segment's id and path, and the ids after it.
    seg_end: u64,
    path_end: u64,
    carry: Box<[u32]>,
    tokens: u32,
}

#[derive(Debug, Default)]
pub struct KvIndex {
    blocks: HashMap<BlockKey, Block>,
    /// Every gateway path inside the stored blocks, with the number of blocks holding it.
    paths: HashMap<u64, u32>,
    tokens: usize,
    max_tokens: usize,
    /// Stored blocks that could not be placed (unknown parent, token ids that do not fit).
    pub unplaced: u64,
}

/// What applying an event did, for the router.
#[derive(Debug)]
pub enum Applied {
    Nothing,
    /// These prefixes (root first, the removed block's last segment last) left the cache.
    Removed(Vec<Vec<Segment>>),
    /// The index outgrew its bound and was dropped.
    Overflow,
}

impl KvIndex {
    pub fn new(max_tokens: usize) -> Self {
        Self { max_tokens, ..Self::default() }
    }

    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Whether the engine holds the prefix whose path hash is `path`.
    pub fn holds(&self, path: u64) -> bool {
        self.paths.contains_key(&path)
    }

    pub fn clear(&mut self) {
        self.blocks.clear();
        self.paths.clear();
        self.tokens = 0;
    }

    /// Calls `f` with the prefix of every block that completes a gateway segment, children before
    /// their parent (as a cache evicts: leaves first), e.g. to report a clear as evictions.
    /// Blocks in a broken chain are skipped.
    pub fn for_each_prefix_leaf_first(&self, f: &mut dyn FnMut(&[Segment])) {
        let mut children: HashMap<Option<BlockKey>, Vec<BlockKey>> = HashMap::new();
        for (&k, b) in &self.blocks {
            children.entry(b.parent.filter(|p| self.blocks.contains_key(p))).or_default().push(k);
        }
        let mut path: Vec<Segment> = Vec::new();
        let mut stack: Vec<(BlockKey, bool)> = children.get(&None).into_iter().flatten().map(|&k| (k, false)).collect();
        while let Some((k, done)) = stack.pop() {
            let b = &self.blocks[&k];
            if done {
                if !b.segments.is_empty() {
                    f(&path);
                }
                path.truncate(path.len() - b.segments.len());
                continue;
            }
            path.extend_from_slice(&b.segments);
            stack.push((k, true));
            stack.extend(children.get(&Some(k)).into_iter().flatten().map(|&c| (c, false)));
        }
    }

    /// Stores a chain of blocks: `hashes` each the child of the one before, the first under
    /// `parent`, `token_ids` theirs in order, `block_size` each (the last may be shorter).
    pub fn stored(
        &mut self,
        hashes: &[BlockKey],
        parent: Option<BlockKey>,
        token_ids: &[u32],
        block_size: u32,
    ) -> Applied {
        let bs = block_size as usize;
        if bs == 0 || token_ids.len().div_ceil(bs) != hashes.len() {
            self.unplaced += hashes.len() as u64;
            return Applied::Nothing;
        }
        let (mut seg_id, mut path, mut carry) = match parent {
            None => (0, 0, Vec::new()),
            Some(p) => match self.blocks.get(&p) {
                Some(b) => (b.seg_end, b.path_end, b.carry.to_vec()),
                None => {
                    self.unplaced += hashes.len() as u64;
                    return Applied::Nothing;
                }
            },
        };
        let mut parent = parent;
        for (&h, ids) in hashes.iter().zip(token_ids.chunks(bs)) {
            if self.tokens + ids.len() > self.max_tokens && !self.blocks.contains_key(&h) {
                self.clear();
                return Applied::Overflow;
            }
            let (mut segments, mut paths) = (Vec::new(), Vec::new());
            for &t in ids {
                carry.push(t);
                if carry.len() == BLOCK_TOKENS {
                    seg_id = crate::text::segment_id(seg_id, &carry);
                    path = extend_path_hash(path, seg_id);
                    segments.push(Segment { id: seg_id, tokens: BLOCK_TOKENS as u32 });
                    paths.push(path);
                    carry.clear();
                }
            }
            for p in &paths {
                *self.paths.entry(*p).or_default() += 1;
            }
            let block = Block {
                parent,
                segments: segments.into(),
                paths: paths.into(),
                seg_end: seg_id,
                path_end: path,
                carry: carry.as_slice().into(),
                tokens: ids.len() as u32,
            };
            self.tokens += ids.len();
            if let Some(old) = self.blocks.insert(h, block) {
                // Stored again (a replay overlap): its paths count once.
                self.tokens -= old.tokens as usize;
                self.forget(&old);
            }
            parent = Some(h);
        }
        Applied::Nothing
    }

    /// Removes blocks; returns the removed prefixes that no other engine block still holds.
    /// Prefixes are read before anything is removed, so a chain removed first block first (as
    /// SGLang removes a node's pages) still names them.
    pub fn removed(&mut self, hashes: &[BlockKey]) -> Applied {
        let prefixes: Vec<Option<Vec<Segment>>> = hashes
            .iter()
            .map(|h| self.blocks.get(h).filter(|b| !b.paths.is_empty()).and_then(|_| self.segments_to(*h)))
            .collect();
        let mut gone = Vec::new();
        for (h, prefix) in hashes.iter().zip(prefixes) {
            let Some(b) = self.blocks.remove(h) else { continue };
            self.tokens -= b.tokens as usize;
            if self.forget(&b) {
                gone.extend(prefix);
            }
        }
        if gone.is_empty() { Applied::Nothing } else { Applied::Removed(gone) }
    }

    /// Drops `b`'s paths; true when its last path is no longer held by any block.
    fn forget(&mut self, b: &Block) -> bool {
        let mut last_gone = false;
        for p in b.paths.iter() {
            if let Some(n) = self.paths.get_mut(p) {
                *n -= 1;
                if *n == 0 {
                    self.paths.remove(p);
                    last_gone = Some(p) == b.paths.last();
                }
            }
        }
        last_gone
    }

    /// The gateway segments from the root to the end of block `h` (`None`: unknown block, or a
    /// chain that loops or breaks).
    pub fn segments_to(&self, h: BlockKey) -> Option<Vec<Segment>> {
        let mut chain = vec![self.blocks.get(&h)?];
        while let Some(p) = chain.last().and_then(|b| b.parent) {
            chain.push(self.blocks.get(&p)?);
            if chain.len() > self.blocks.len() {
                return None;
            }
        }
        Some(chain.iter().rev().flat_map(|b| b.segments.iter().copied()).collect())
    }
}
