//! The prefix cache's tests (`prefix_cache.rs`): matching, pinning, LRU eviction, regrowth and
//! pending dispatches by hand, and a randomized sequence of admissions, computations, releases
//! and evictions checked against `PrefixCache::check` after every operation.

use super::*;

fn seg(id: u64, tokens: u32) -> Segment {
    Segment { id, tokens }
}

/// Admits and fully computes `prompt`, then releases it (a finished request).
fn serve(cache: &mut PrefixCache, prompt: &[Segment]) -> Vec<u32> {
    let mut path = Vec::new();
    cache.admit(prompt, &mut path, 0, None);
    for (&n, s) in path.iter().zip(prompt) {
        cache.mark_computed(n, s.tokens);
    }
    cache.release(&path);
    path
}

#[test]
fn match_counts_leading_computed_segments_only() {
    let mut c = PrefixCache::new();
    serve(&mut c, &[seg(1, 13), seg(2, 1000), seg(3, 50)]);
    assert_eq!(c.cached_prefix(&[seg(1, 13), seg(2, 1000), seg(9, 50)]), 1013);
    assert_eq!(c.cached_prefix(&[seg(1, 13), seg(5, 1000)]), 13);
    assert_eq!(c.cached_prefix(&[seg(2, 1000)]), 0, "same document under another path is other content");
    // Allocated but not yet computed content does not match.
    let mut path = Vec::new();
    c.admit(&[seg(1, 13), seg(7, 100)], &mut path, 0, None);
    assert_eq!(c.cached_prefix(&[seg(1, 13), seg(7, 100)]), 13);
    c.mark_computed(path[1], 40);
    assert_eq!(c.cached_prefix(&[seg(1, 13), seg(7, 100)]), 53);
    c.check();
}

#[test]
fn pinned_nodes_survive_eviction_and_lru_order_is_respected() {
    let mut c = PrefixCache::new();
    serve(&mut c, &[seg(1, 10), seg(2, 100)]); // oldest leaf
    serve(&mut c, &[seg(1, 10), seg(3, 100)]);
    let mut running = Vec::new();
    c.admit(&[seg(1, 10), seg(4, 100)], &mut running, 0, None); // pinned
    c.mark_computed(running[1], 100);
    assert_eq!(c.total_tokens(), 310);
    assert_eq!(c.pinned_tokens(), 110);
    let mut ev = Vec::new();
    assert_eq!(c.evict(150, Some(&mut ev)), 150);
    // Doc 2 (least recently used) goes whole, doc 3 loses its last 50 tokens; 1 and 4 are pinned.
    assert_eq!(ev[0], EvictionEvent { path: vec![seg(1, 10), seg(2, 100)], remaining_tokens: 0 });
    assert_eq!(ev[1], EvictionEvent { path: vec![seg(1, 10), seg(3, 100)], remaining_tokens: 50 });
    assert_eq!(c.cached_prefix(&[seg(1, 10), seg(3, 100)]), 60, "a partially evicted segment keeps its leading tokens");
    assert_eq!(c.evict(1000, None), 50, "only unpinned leaves go");
    assert_eq!(c.total_tokens(), 110);
    c.check();
    c.release(&running);
    assert_eq!(c.pinned_tokens(), 0);
    assert_eq!(c.evict(1000, None), 110, "after release the whole path is evictable, leaf before parent");
    assert_eq!(c.total_tokens(), 0);
    c.check();
}

#[test]
fn using_a_prefix_refreshes_it() {
    let mut c = PrefixCache::new();
    serve(&mut c, &[seg(1, 10), seg(2, 100)]);
    serve(&mut c, &[seg(1, 10), seg(3, 100)]);
    serve(&mut c, &[seg(1, 10), seg(2, 100)]); // 2 is now the most recent
    let mut ev = Vec::new();
    c.evict(100, Some(&mut ev));
    assert_eq!(ev[0].path.last().unwrap().id, 3);
}

#[test]
fn regrowing_a_partially_evicted_segment_and_plan_accounting() {
    let mut c = PrefixCache::new();
    serve(&mut c, &[seg(1, 10), seg(2, 100)]);
    c.evict(30, None);
    let prompt = [seg(1, 10), seg(2, 100), seg(3, 5)];
    let plan = c.plan(&prompt);
    assert_eq!(plan, AdmitPlan { cached_tokens: 80, newly_pinned_tokens: 80, new_tokens: 35 });
    let mut path = Vec::new();
    c.admit(&prompt, &mut path, 0, None);
    assert_eq!(c.total_tokens(), 115);
    assert_eq!(c.pinned_tokens(), 115);
    c.check();
}

#[test]
fn releasing_an_uncomputed_path_frees_its_tail() {
    let mut c = PrefixCache::new();
    let mut path = Vec::new();
    c.admit(&[seg(1, 10), seg(2, 100), seg(3, 50)], &mut path, 0, None);
    c.mark_computed(path[0], 10);
    c.mark_computed(path[1], 30);
    c.release(&path); // preempted mid-prefill
    assert_eq!(c.total_tokens(), 40);
    assert_eq!(c.cached_prefix(&[seg(1, 10), seg(2, 100)]), 40);
    c.check();
}

#[test]
fn pending_dispatches_extend_the_exact_match() {
    let mut c = PrefixCache::new();
    serve(&mut c, &[seg(1, 10)]);
    let mut pending = MixMap::default();
    let h1 = extend_path_hash(0, 1);
    pending.insert(h1, 1);
    pending.insert(extend_path_hash(h1, 2), 1);
    assert_eq!(c.cached_or_pending_prefix(&[seg(1, 10), seg(2, 100), seg(3, 5)], &pending), 110);
    assert_eq!(c.cached_or_pending_prefix(&[seg(1, 10), seg(4, 100)], &pending), 10);
}

/// Random admissions (through `plan_path`, as the batcher admits), computations, releases,
/// evictions and cached outputs on a small branching tree of segments: after every operation
/// every node's child hint is a live child and the LRU's remembered first key is its first
/// (`check`), and a lookup through the hints finds what the child map holds.
#[test]
fn random_operations_keep_hints_and_the_lru_head_true() {
    use rand::{RngExt, SeedableRng};
    let mut rng = crate::seeds::SimRng::seed_from_u64(11);
    let mut next = move |n: u64| rng.random_range(0..n);
    let mut c = PrefixCache::new();
    let mut running: Vec<(Vec<Segment>, Vec<u32>)> = Vec::new();
    let (mut admitted, mut evicted) = (0, 0);
    for _ in 0..20_000 {
        match next(5) {
            0 | 1 if running.len() < 12 => {
                // Level k draws one of three ids: chains, and branches at every level.
                let prompt: Vec<Segment> =
                    (0..1 + next(6)).map(|k| seg(k * 10 + next(3), 5 + (k as u32 * 7) % 11)).collect();
                let mut path = Vec::new();
                c.plan_path(&prompt, &mut path);
                c.admit(&prompt, &mut path, next(40), None);
                assert_eq!(path.len(), prompt.len());
                running.push((prompt, path));
                admitted += 1;
            }
            2 if !running.is_empty() => {
                let (prompt, path) = &running[next(running.len() as u64) as usize];
                for (&n, s) in path.iter().zip(prompt) {
                    c.mark_computed(n, s.tokens);
                }
            }
            3 if !running.is_empty() => {
                let (_, path) = running.swap_remove(next(running.len() as u64) as usize);
                // A finished turn's output, cached under its path, as the batcher does.
                if next(2) == 0 && c.nodes[*path.last().unwrap() as usize].computed > 0 {
                    c.insert_computed(*path.last().unwrap(), seg(100 + next(3), 4));
                }
                c.release(&path);
            }
            _ => evicted += c.evict(next(60), None),
        }
        c.check();
        for (&(parent, id), &child) in c.children.iter() {
            assert_eq!(c.child(parent, id), Some(child));
        }
    }
    assert!(admitted > 1000 && evicted > 1000, "{admitted} admitted, {evicted} tokens evicted");
}
