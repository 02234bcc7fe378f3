//! Plain-Rust helpers for policy authors, compiled into each plugin (not part of the ABI): a
//! seeded random stream, argmin and argmax with fair ties (by either of two rules: see "Fair
//! ties" below), a segment-level prefix tree with per-replica holders and LRU order
//! ([`PrefixTree`]), a sliding-window sum ([`WindowSum`]), and a slot that carries what `route`
//! decided to the same request's `on_dispatch` ([`Carried`]). The built-in prefix-aware routers
//! are written with exactly these.
//!
//! ## Fair ties
//!
//! Argmin (and argmax) with fair ties: the candidate with the smallest key, several tied ones
//! broken uniformly at random from the policy's stream. Two rules, both uniform over the tied
//! candidates, that *draw differently*, so the same seed picks other replicas under each:
//!
//! - **reservoir** ([`argmin_random_tie`], [`argmax_random_tie`]): one pass over any iterator;
//!   the `t`-th candidate found equal to the best so far draws once from `0..t` and replaces it
//!   on 0. One draw per tie beyond the first (a tie among 100 costs 99 draws), and a draw is
//!   made for a tie that a later, better key then discards.
//! - **one draw** ([`argmin_one_draw_by`], with [`draw_tie`] its draw): count the candidates at
//!   the minimum, draw one `k` from `0..ties`, take the `k`-th of them in index order. One draw
//!   per decision with a tie, none without, whatever the number tied; a second pass reads the
//!   keys again.
//!
//! A router that replays an upstream's decisions (or an earlier routelab's, seed for seed) uses
//! the rule that upstream draws with: the built-in `least_requests`, `least_work_left` (in the
//! dispatch world) and the `routelab new-policy` template break ties with one draw; `llm_d`,
//! `dynamo_kv`, `ray_prefix_aware` and others with the reservoir. A new router can take either;
//! one draw is cheaper when many candidates tie.
//!
//! Keys should be totally ordered. With a `NaN` among `f64` keys the rules still decide without
//! panicking but not by a common convention, each as the routers that use it always have (see
//! each function): do not rely on it.

use rand::SeedableRng;

/// The random generator every policy should use: a named algorithm (xoshiro256++), so a seed
/// replays exactly whether the policy is linked into the host or loaded from a library.
pub type PolicyRng = rand::rngs::Xoshiro256PlusPlus;

/// A policy's random stream from the seed the host gave it.
pub fn policy_rng(seed: u64) -> PolicyRng {
    PolicyRng::seed_from_u64(seed)
}

mod block_hash;
// since 0.5.9 {
mod carry;
// } since 0.5.9
mod prefix_tree;
mod ties;
mod window;

pub use block_hash::{BLOCK_HASH_SEED, BlockHashing, ChainState, mix64, prefix_hash};
// since 0.5.9 {
pub use carry::{Carried, Kept};
// } since 0.5.9

pub use prefix_tree::{NodeId, PrefixTree, ROOT_PATH_HASH, extend_path_hash};
pub use ties::argmin_random_tie;
// since 0.5.11 {
pub use ties::{argmax_random_tie, argmin_one_draw_by, draw_tie};
// } since 0.5.11
pub use window::WindowSum;
