//! Plain-Rust helpers for policy authors, compiled into each plugin (not part of the ABI): a
//! seeded random stream, random tie-breaking, a segment-level prefix tree with per-replica
//! holders and LRU order ([`PrefixTree`]), a sliding-window sum ([`WindowSum`]), and a slot that
//! carries what `route` decided to the same request's `on_dispatch` ([`Carried`]). The built-in
//! prefix-aware routers are written with exactly these.

use rand::SeedableRng;

/// The random generator every policy should use: a named algorithm (xoshiro256++), so a seed
/// replays exactly whether the policy is linked into the host or loaded from a library.
pub type PolicyRng = rand::rngs::Xoshiro256PlusPlus;

/// A policy's random stream from the seed the host gave it.
pub fn policy_rng(seed: u64) -> PolicyRng {
    PolicyRng::seed_from_u64(seed)
}

/// Index of the smallest `key`, ties broken uniformly at random with `rng` (reservoir sampling,
/// one pass). `None` for an empty iterator.
pub fn argmin_random_tie<K: PartialOrd>(keys: impl IntoIterator<Item = K>, rng: &mut PolicyRng) -> Option<usize> {
    use rand::RngExt;
    let mut best: Option<(usize, K)> = None;
    let mut ties = 0u32;
    for (i, k) in keys.into_iter().enumerate() {
        match &best {
            Some((_, b)) if k > *b => {}
            Some((_, b)) if k == *b => {
                ties += 1;
                if rng.random_range(0..ties) == 0 {
                    best = Some((i, k));
                }
            }
            _ => {
                best = Some((i, k));
                ties = 1;
            }
        }
    }
    best.map(|(i, _)| i)
}

mod block_hash;
// since 0.5.9 {
mod carry;
// } since 0.5.9
mod prefix_tree;
mod window;

pub use block_hash::{BLOCK_HASH_SEED, BlockHashing, ChainState, mix64, prefix_hash};
// since 0.5.9 {
pub use carry::{Carried, Kept};
// } since 0.5.9

pub use prefix_tree::{NodeId, PrefixTree, ROOT_PATH_HASH, extend_path_hash};
pub use window::WindowSum;
