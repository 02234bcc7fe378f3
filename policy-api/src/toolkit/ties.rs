//! Argmin and argmax with fair ties, by the reservoir rule and the one-draw rule: see the
//! toolkit's notes ("Fair ties", in `mod.rs`).

use rand::RngExt;

use super::PolicyRng;

/// Index of the smallest `key`, ties broken uniformly at random with `rng` by the reservoir rule
/// (one pass; the `t`-th candidate equal to the best so far replaces it when a draw from `0..t`
/// is 0, so one draw per tie beyond the first). `None` for an empty iterator. See the
/// [toolkit notes](super#fair-ties) for the one-draw rule, as uniform but drawing differently.
///
/// A key that is neither greater than nor equal to the best so far replaces it: a smaller one,
/// and also a `NaN` (or any key after a `NaN` best).
pub fn argmin_random_tie<K: PartialOrd>(keys: impl IntoIterator<Item = K>, rng: &mut PolicyRng) -> Option<usize> {
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

// since 0.5.11 {
/// Index of the largest `key`, ties broken uniformly at random with `rng` by the reservoir rule,
/// exactly as [`argmin_random_tie`] for the smallest: one pass, one draw per tie beyond the
/// first. `None` for an empty iterator. The `llm_d` routers pick their best score with it.
///
/// Not quite `argmin_random_tie` over [`std::cmp::Reverse`] keys: the first key is the best so
/// far whatever it is, and a later key that is neither greater than nor equal to the best is
/// passed over — a smaller one, and also a `NaN` (a `NaN` first key is therefore kept).
pub fn argmax_random_tie<K: PartialOrd>(keys: impl IntoIterator<Item = K>, rng: &mut PolicyRng) -> Option<usize> {
    let mut keys = keys.into_iter().enumerate();
    let (mut best, mut top) = keys.next()?;
    let mut ties = 1u32;
    for (i, k) in keys {
        if k > top {
            (best, top, ties) = (i, k, 1);
        } else if k == top {
            ties += 1;
            if rng.random_range(0..ties) == 0 {
                (best, top) = (i, k);
            }
        }
    }
    Some(best)
}

/// Index (of `0..n`) of the smallest `key(i)`, ties broken by the one-draw rule: count the
/// indices at the minimum, draw `k` with [`draw_tie`] (no draw for a unique minimum), and take
/// the `k`-th of them in index order. Two passes, so `key` is called again for the indices from
/// the first minimum on; it must answer the same both times. `None` when `n` is 0 or every key
/// is `NaN`.
///
/// A key not equal to itself (`NaN`) is passed over: it is never chosen while a key is not.
pub fn argmin_one_draw_by<K: PartialOrd>(n: usize, key: impl Fn(usize) -> K, rng: &mut PolicyRng) -> Option<usize> {
    #[allow(clippy::eq_op)] // `k == k` is false exactly for NaN
    let (first, mut min) = (0..n).map(|i| (i, key(i))).find(|(_, k)| k == k)?;
    let (mut first, mut ties) = (first, 1u32);
    for i in first + 1..n {
        let k = key(i);
        if k < min {
            (min, ties, first) = (k, 1, i);
        } else if k == min {
            ties += 1;
        }
    }
    if ties == 1 {
        return Some(first);
    }
    let k = draw_tie(ties, rng);
    (first..n).filter(|&i| key(i) == min).nth(k as usize)
}

/// The one-draw rule's draw: which of `ties` tied candidates (from 0, in index order), one
/// uniform draw from `0..ties` — none when there is no choice to make (`ties` ≤ 1, answered 0).
/// For a router that counts its tied candidates itself (from an index, a bit set) and must draw
/// as [`argmin_one_draw_by`] would.
pub fn draw_tie(ties: u32, rng: &mut PolicyRng) -> u32 {
    if ties > 1 { rng.random_range(0..ties) } else { 0 }
}

#[cfg(test)]
mod tests {
    use super::super::policy_rng;
    use super::*;

    const DRAWS: usize = 60_000;

    /// How often each of `n` indices was chosen over `DRAWS` decisions with seed 5.
    fn shares(n: usize, mut pick: impl FnMut(&mut PolicyRng) -> Option<usize>) -> Vec<usize> {
        let mut rng = policy_rng(5);
        let mut counts = vec![0; n];
        for _ in 0..DRAWS {
            counts[pick(&mut rng).unwrap()] += 1;
        }
        counts
    }

    /// Each of the tied indices gets a third of the decisions (±0.01, a fixed seed; 5 standard deviations), the others
    /// none: for every helper.
    #[test]
    fn a_tie_among_three_is_shared_evenly() {
        let keys = [4u32, 2, 7, 2, 2, 9];
        let max_keys = keys.map(|k| 10 - k);
        let by_rule: [(&str, Vec<usize>); 3] = [
            ("reservoir min", shares(6, |rng| argmin_random_tie(keys, rng))),
            ("reservoir max", shares(6, |rng| argmax_random_tie(max_keys, rng))),
            ("one draw", shares(6, |rng| argmin_one_draw_by(6, |i| keys[i], rng))),
        ];
        for (rule, counts) in by_rule {
            for (i, &c) in counts.iter().enumerate() {
                if keys[i] == 2 {
                    let share = c as f64 / DRAWS as f64;
                    assert!((share - 1.0 / 3.0).abs() < 0.01, "{rule}: index {i} chosen {share:.4}: {counts:?}");
                } else {
                    assert_eq!(c, 0, "{rule}: index {i} is not at the minimum: {counts:?}");
                }
            }
        }
    }

    /// A unique best makes no draw: the generator is untouched.
    #[test]
    fn a_unique_best_draws_nothing() {
        let untouched = policy_rng(9);
        let mut rng = untouched.clone();
        assert_eq!(argmin_random_tie([3.0, 1.0, 2.0], &mut rng), Some(1));
        assert_eq!(argmax_random_tie([3.0, 1.0, 2.0], &mut rng), Some(0));
        assert_eq!(argmin_one_draw_by(3, |i| [3, 1, 2][i], &mut rng), Some(1));
        assert_eq!(draw_tie(1, &mut rng), 0);
        assert_eq!(draw_tie(0, &mut rng), 0);
        assert!(rng == untouched);
        // A tie does draw.
        argmin_one_draw_by(3, |i| [1, 1, 2][i], &mut rng);
        assert!(rng != untouched);
    }

    #[test]
    fn no_candidates_no_answer() {
        let untouched = policy_rng(9);
        let mut rng = untouched.clone();
        assert_eq!(argmin_random_tie(Vec::<u64>::new(), &mut rng), None);
        assert_eq!(argmax_random_tie(Vec::<u64>::new(), &mut rng), None);
        assert_eq!(argmin_one_draw_by(0, |_| 0u64, &mut rng), None);
        assert_eq!(argmin_one_draw_by(2, |_| f64::NAN, &mut rng), None);
        assert!(rng == untouched);
    }

    /// The rules draw differently: the reservoir once per tie beyond the first (so 2 draws for a
    /// tie among 3), one draw once per decision with a tie, whatever the number tied.
    #[test]
    fn the_rules_draw_differently() {
        let keys = [2u64, 2, 2];
        let (mut reservoir, mut one) = (policy_rng(3), policy_rng(3));
        argmin_random_tie(keys, &mut reservoir);
        argmin_one_draw_by(3, |i| keys[i], &mut one);
        let (mut two_draws, mut one_draw) = (policy_rng(3), policy_rng(3));
        two_draws.random_range(0..2u32);
        two_draws.random_range(0..3u32);
        one_draw.random_range(0..3u32);
        assert!(reservoir == two_draws && one == one_draw);
    }

    /// The one-draw rule passes over NaN keys; the reservoir rules keep their own conventions
    /// (see their docs), which the routers built on them rely on.
    #[test]
    fn nan_keys() {
        let nan = f64::NAN;
        let mut rng = policy_rng(1);
        assert_eq!(argmin_one_draw_by(3, |i| [nan, 2.0, 1.0][i], &mut rng), Some(2));
        assert_eq!(argmin_random_tie([1.0, nan, 2.0], &mut rng), Some(2));
        assert_eq!(argmax_random_tie([1.0, nan, 0.5], &mut rng), Some(0));
        assert_eq!(argmax_random_tie([nan, 3.0], &mut rng), Some(0));
    }
}
// } since 0.5.11
