//! Chained block hashes of a prompt ([`BlockHashing`], whose docs give the rule: this module is
//! private, its items are re-exported from `toolkit`).

use crate::Segment;

/// The chain's starting value (Dynamo seeds its XXH3 with 1337 too).
pub const BLOCK_HASH_SEED: u64 = 1337;

/// SplitMix64 finaliser: a bijective, well-avalanching mix of 64 bits.
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Folds one piece of a block — `len` tokens of segment `id` from `offset` — into `acc`. Cheap
/// (one multiply); the block's final [`mix64`] does the avalanche.
#[inline]
fn absorb(acc: u64, id: u64, offset: u32, len: u32) -> u64 {
    (acc.rotate_left(23) ^ id.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (((offset as u64) << 32) | len as u64))
        .wrapping_mul(0xff51_afd7_ed55_8ccd)
}

/// How to cut a prompt into hashed blocks: chained block hashes of a prompt, the way production
/// routers key their prefix indexes — computed from the prompt's segments, never from
/// materialised tokens.
///
/// Production routers cut the token sequence into blocks of B tokens (the engine's KV block:
/// 16 in vLLM by default) and hash block k together with block k−1's hash, so a block hash names
/// the whole prefix that ends with it: two prompts share their first k block hashes exactly when
/// they share their first k·B tokens. Dynamo (`compute_block_hash_for_seq`), vLLM and the
/// precise llm-d scorer hash **full blocks only**; a partial last block is not a cache unit.
/// Routers that hash characters rather than KV blocks (llm-d's approximate producer, vLLM
/// production-stack's hash trie) also hash the partial tail; [`BlockHashing::partial_tail`]
/// offers that, and a tail hash never equals a full block's (its length is part of the hash).
///
/// Here a block's content is described by the pieces of segments it covers — `(segment id,
/// offset in the segment, length)` — which name its tokens exactly, since equal segment ids mean
/// equal tokens. The work is O(blocks + segments) per prompt, with no per-token step and no
/// allocation beyond the output buffer ([`BlockHashing::hashes_into`] reuses the caller's).
/// The hash is SplitMix64-style mixing, not XXH3: the values differ from any upstream router's,
/// the equalities between them do not.
///
/// # Example
///
/// Two prompts that share a 40-token system prompt, then differ: their first two blocks of 16
/// lie wholly inside the shared part and hash alike; the third mixes the shared tail with the
/// different questions. The partial last block is hashed only with `partial_tail`.
///
/// ```
/// use routelab_policy_api::{BlockHashing, Segment};
///
/// let system = Segment { id: 1, tokens: 40 };
/// let a = [system, Segment { id: 2, tokens: 30 }]; // 70 tokens: 4 full blocks and 6 over
/// let b = [system, Segment { id: 3, tokens: 30 }];
/// let blocks = BlockHashing::full_blocks(16);
/// let (ha, hb) = (blocks.hashes(&a), blocks.hashes(&b));
/// assert_eq!(ha.len(), 4);
/// assert_eq!(ha[..2], hb[..2]);
/// assert_ne!(ha[2], hb[2]);
///
/// // The tail, and a cap on the blocks hashed (llm-d's `maxPrefixBlocksToMatch`).
/// let with_tail = BlockHashing { partial_tail: true, ..blocks };
/// let ht = with_tail.hashes(&a);
/// assert_eq!((ht.len(), &ht[..4]), (5, &ha[..]));
/// let capped = BlockHashing { max_blocks: 2, ..blocks };
/// assert_eq!(capped.hashes(&a), ha[..2]);
///
/// // A buffer reused across requests.
/// let mut buf = Vec::new();
/// blocks.hashes_into(&b, &mut buf);
/// assert_eq!(buf, hb);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockHashing {
    /// Tokens per block (B). Must be at least 1.
    pub block_tokens: u32,
    /// Hash at most this many blocks (the rest of a longer prompt is ignored, as llm-d's
    /// `maxPrefixBlocksToMatch` does). `usize::MAX`: no limit.
    pub max_blocks: usize,
    /// Also hash a last block shorter than B (distinct from any full block's hash).
    pub partial_tail: bool,
}

impl BlockHashing {
    /// Full blocks of `block_tokens`, no limit: Dynamo's and vLLM's rule.
    pub fn full_blocks(block_tokens: u32) -> Self {
        Self { block_tokens, max_blocks: usize::MAX, partial_tail: false }
    }

    /// The prompt's block hashes, block 0 first.
    pub fn hashes(&self, segments: &[Segment]) -> Vec<u64> {
        let mut out = Vec::new();
        self.hashes_into(segments, &mut out);
        out
    }

    /// Like [`Self::hashes`], into `out` (cleared first; its capacity is reused).
    pub fn hashes_into(&self, segments: &[Segment], out: &mut Vec<u64>) {
        out.clear();
        let b = self.block_tokens;
        assert!(b > 0, "block_tokens must be at least 1");
        let total: u64 = segments.iter().map(|s| s.tokens as u64).sum();
        let full = (total / b as u64) as usize;
        let tail = self.partial_tail && total % b as u64 != 0;
        let n = (full + tail as usize).min(self.max_blocks);
        out.reserve(n);
        let mut chain = ChainState::START;
        for &s in segments {
            if out.len() >= n {
                break;
            }
            chain.feed(s, b, out, n);
        }
        if out.len() < n {
            out.extend(chain.tail());
        }
    }
}

/// A block-hash chain stopped at a segment boundary, from which it can go on: a router that has
/// hashed a path once can hash a longer path from where it stopped (the part of an eviction's path
/// below the evicted node, say) instead of from the root. Feeding segments one by one gives
/// exactly [`BlockHashing::hashes_into`]'s full-block hashes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChainState {
    /// The last full block's hash (the seed before the first).
    chain: u64,
    /// The open block's accumulator, and its tokens so far (< B).
    acc: u64,
    len: u32,
    /// Full blocks hashed so far.
    blocks: u64,
}

impl ChainState {
    /// Before the first token.
    pub const START: Self = Self { chain: BLOCK_HASH_SEED, acc: BLOCK_HASH_SEED, len: 0, blocks: 0 };

    /// Full blocks hashed so far.
    pub fn blocks(&self) -> u64 {
        self.blocks
    }

    /// Feeds segment `s` in blocks of `block_tokens`, pushing onto `out` the hash of each block it
    /// completes, until `out` holds `limit` hashes.
    #[inline]
    pub fn feed(&mut self, s: Segment, block_tokens: u32, out: &mut Vec<u64>, limit: usize) {
        let mut offset = 0u32;
        while offset < s.tokens && out.len() < limit {
            let take = (s.tokens - offset).min(block_tokens - self.len);
            self.acc = absorb(self.acc, s.id, offset, take);
            self.len += take;
            offset += take;
            if self.len == block_tokens {
                self.chain = mix64(self.acc ^ block_tokens as u64);
                out.push(self.chain);
                self.acc = self.chain;
                self.len = 0;
                self.blocks += 1;
            }
        }
    }

    /// The hash of the open, partial block, if it holds any token.
    pub fn tail(&self) -> Option<u64> {
        (self.len > 0).then(|| mix64(self.acc ^ self.len as u64))
    }
}

/// Hash of the prompt's first `tokens` tokens (all of it if shorter): the key of routers that
/// hash a fixed-length head onto a ring (KubeAI's and SGLang's prefix hashing).
pub fn prefix_hash(segments: &[Segment], tokens: u32) -> u64 {
    let mut acc = BLOCK_HASH_SEED;
    let mut need = tokens;
    let mut len = 0u32;
    for s in segments {
        if need == 0 {
            break;
        }
        let take = s.tokens.min(need);
        if take > 0 {
            acc = absorb(acc, s.id, 0, take);
            need -= take;
            len += take;
        }
    }
    mix64(acc ^ len as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(id: u64, tokens: u32) -> Segment {
        Segment { id, tokens }
    }

    #[test]
    fn shared_prefix_gives_shared_leading_hashes() {
        let h = BlockHashing::full_blocks(16);
        // Both share the system prompt (20) and the document (100): 120 tokens = 7 full blocks
        // (112 tokens); block 7 (tokens 112..128) mixes the document's tail with different questions.
        let a = h.hashes(&[seg(1, 20), seg(2, 100), seg(3, 40)]);
        let b = h.hashes(&[seg(1, 20), seg(2, 100), seg(4, 40)]);
        assert_eq!(a.len(), 10); // 160 / 16
        assert_eq!(a[..7], b[..7]);
        assert!(a[7..].iter().zip(&b[7..]).all(|(x, y)| x != y));
    }

    #[test]
    fn a_hash_names_the_whole_prefix_not_just_the_block() {
        let h = BlockHashing::full_blocks(16);
        // Block 1 covers the same tokens of segment 9 in both, but the prefixes differ.
        let a = h.hashes(&[seg(1, 16), seg(9, 16)]);
        let b = h.hashes(&[seg(2, 16), seg(9, 16)]);
        assert_ne!(a[1], b[1]);
        // Where the block boundaries fall inside a segment matters too.
        let c = h.hashes(&[seg(1, 8), seg(9, 24)]);
        assert_ne!(a[1], c[1]);
    }

    #[test]
    fn partial_tail_is_excluded_or_hashed_distinctly() {
        let full = BlockHashing::full_blocks(16);
        let s = [seg(1, 40)];
        assert_eq!(full.hashes(&s).len(), 2);
        let with_tail = BlockHashing { partial_tail: true, ..full };
        let t = with_tail.hashes(&s);
        assert_eq!(t.len(), 3);
        assert_eq!(t[..2], full.hashes(&s)[..]);
        // The 8-token tail differs from the full block the longer prompt has at the same place.
        let longer = full.hashes(&[seg(1, 48)]);
        assert_ne!(t[2], longer[2]);
        // An exact multiple has no tail.
        assert_eq!(with_tail.hashes(&[seg(1, 32)]).len(), 2);
    }

    #[test]
    fn splitting_is_independent_of_how_the_prompt_is_cut_into_calls() {
        // The same content gives the same hashes however often it is hashed, with a reused buffer,
        // and a block limit truncates without changing the leading hashes.
        let h = BlockHashing::full_blocks(4);
        let s = [seg(5, 3), seg(6, 9), seg(7, 1), seg(8, 11)];
        let a = h.hashes(&s);
        let mut buf = vec![42; 100];
        h.hashes_into(&s, &mut buf);
        assert_eq!(a, buf);
        assert_eq!(a.len(), 6);
        let limited = BlockHashing { max_blocks: 2, ..h }.hashes(&s);
        assert_eq!(limited, a[..2]);
        // Zero-token segments contribute nothing.
        let with_empty = [seg(5, 3), seg(99, 0), seg(6, 9), seg(7, 1), seg(8, 11)];
        assert_eq!(h.hashes(&with_empty), a);
    }

    #[test]
    fn a_chain_resumed_at_a_segment_boundary_gives_the_whole_paths_hashes() {
        let h = BlockHashing::full_blocks(4);
        let s = [seg(5, 3), seg(6, 9), seg(7, 1), seg(8, 11)];
        let mut state = ChainState::START;
        let mut first = Vec::new();
        for &x in &s[..2] {
            state.feed(x, 4, &mut first, usize::MAX);
        }
        assert_eq!(state.blocks(), 3);
        let mut rest = Vec::new();
        for &x in &s[2..] {
            state.feed(x, 4, &mut rest, usize::MAX);
        }
        first.extend(rest);
        assert_eq!(first, h.hashes(&s));
        assert_eq!(state.tail(), None, "24 tokens: no partial block");
    }

    #[test]
    fn block_size_one_distinguishes_every_token_boundary() {
        let h = BlockHashing::full_blocks(1);
        let a = h.hashes(&[seg(1, 3), seg(2, 2)]);
        let b = h.hashes(&[seg(1, 3), seg(3, 2)]);
        assert_eq!(a.len(), 5);
        assert_eq!(a[..3], b[..3]);
        assert_ne!(a[3], b[3]);
        let mut sorted = a.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), 5, "every prefix hashes differently");
    }

    #[test]
    fn prefix_hash_keys_on_the_head_only() {
        assert_eq!(prefix_hash(&[seg(1, 300), seg(2, 50)], 256), prefix_hash(&[seg(1, 300), seg(3, 80)], 256));
        assert_ne!(prefix_hash(&[seg(1, 100), seg(2, 50)], 256), prefix_hash(&[seg(1, 100), seg(3, 50)], 256));
        // A prompt shorter than the head is hashed whole; its length counts.
        assert_ne!(prefix_hash(&[seg(1, 100)], 256), prefix_hash(&[seg(1, 100), seg(2, 1)], 256));
    }
}
