use super::*;
use crate::index::block_index::BlockIndex;
use routelab_policy_api::BlockHashing;
use routelab_policy_api::abi_stable::std_types::RSlice;

/// A small deterministic generator (the test needs no statistical quality).
struct Lcg(u64);
impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// Prompts drawn from a few shared heads, with segments that sometimes come shorter (a run's
/// prefix) and sometimes complete no block.
fn prompt(g: &mut Lcg) -> Vec<Segment> {
    let mut p = Vec::new();
    let mut id = 1 + g.below(3);
    for depth in 0..1 + g.below(4) {
        let tokens = [3, 16, 40, 40, 57, 100][g.below(6) as usize] as u32;
        p.push(Segment { id: id * 10 + depth, tokens });
        id = id * 3 + g.below(2);
    }
    p
}

/// The run indexes answer what per-block hash sets answer, through dispatches, completions,
/// and either partial evictions (including of blocks a later dispatch re-added, as a delayed
/// notice does) or TTL expiry.
#[test]
fn runs_match_per_block_sets() {
    for ttl in [false, true] {
        against_per_block_sets(ttl);
    }
}

fn against_per_block_sets(ttl: bool) {
    const B: u32 = 8;
    let n = 70; // two bitset words
    let full = BlockHashing::full_blocks(B);
    let mut g = Lcg(7);
    let mut cut = PromptRuns::new(B);
    let (mut held, mut held_ref) = (HeldRuns::new(n), BlockIndex::new(n));
    let (mut active, mut active_ref) = (ActiveRuns::new(n), BlockIndex::new(n));
    let mut refs: std::collections::HashMap<(u64, usize), u32> = Default::default();
    let mut stamps: std::collections::HashMap<(u64, usize), u64> = Default::default();
    let mut in_flight: Vec<(Vec<Segment>, usize)> = Vec::new();
    let (mut out, mut out_ref) = (vec![0; n], vec![0; n]);
    let mut stamp = 0u64;
    let mut checked = 0;
    for step in 0..2000 {
        let p = prompt(&mut g);
        let hashes = full.hashes(&p);
        cut.cut(&p);
        assert_eq!(cut.blocks, hashes.len() as u64);
        let runs = cut.runs.clone();
        held.consecutive(&runs, cut.blocks, &mut out);
        held_ref.consecutive(&hashes, &mut out_ref);
        assert_eq!(out, out_ref, "held, step {step}");
        active.consecutive(&runs, cut.blocks, &mut out);
        active_ref.consecutive(&hashes, &mut out_ref);
        assert_eq!(out, out_ref, "active, step {step}");
        checked += out.iter().filter(|&&x| x > 0).count();
        match g.below(4) {
            0 | 1 => {
                let r = g.below(n as u64) as usize;
                let lead = hashes.iter().take_while(|&&h| held_ref.holds(h, r)).count() as u64;
                assert_eq!(held.leading(&runs, r), lead);
                stamp += g.below(2);
                for run in &runs {
                    held.insert(run.key, run.blocks, r, ttl.then_some(stamp));
                    active.add(run.key, run.blocks, r);
                }
                for &h in &hashes {
                    held_ref.insert(h, r);
                    if ttl {
                        stamps.insert((h, r), stamp);
                    }
                    let c = refs.entry((h, r)).or_default();
                    *c += 1;
                    if *c == 1 {
                        active_ref.insert(h, r);
                    }
                }
                in_flight.push((p, r));
            }
            2 if !in_flight.is_empty() => {
                let (p, r) = in_flight.swap_remove(g.below(in_flight.len() as u64) as usize);
                cut.cut(&p);
                for run in &cut.runs {
                    active.remove(run.key, run.blocks, r);
                }
                for h in full.hashes(&p) {
                    let c = refs.get_mut(&(h, r)).unwrap();
                    *c -= 1;
                    if *c == 0 {
                        refs.remove(&(h, r));
                        active_ref.remove(h, r);
                    }
                }
            }
            _ if ttl => {
                let limit = stamp.saturating_sub(3);
                held.expire_before(limit);
                stamps.retain(|&(h, r), s| {
                    let keep = *s >= limit;
                    if !keep {
                        held_ref.remove(h, r);
                    }
                    keep
                });
            }
            _ => {
                // Evict a random cut of a random prefix of the prompt from a random replica.
                let r = g.below(n as u64) as usize;
                let path = &p[..1 + g.below(p.len() as u64) as usize];
                let remaining = g.below(path.last().unwrap().tokens as u64 + 1) as u32;
                let e = Eviction {
                    replica: r as u32,
                    evicted_at: 0.0,
                    path: RSlice::from_slice(path),
                    remaining_tokens: remaining,
                };
                if let Some((run, from)) = cut.evicted(&e) {
                    held.remove(run.key, from, run.blocks, r);
                }
                let before: u32 = path[..path.len() - 1].iter().map(|s| s.tokens).sum();
                let first_gone = ((before + remaining) / B) as usize;
                for &h in full.hashes(path).iter().skip(first_gone) {
                    held_ref.remove(h, r);
                }
            }
        }
        for r in 0..n {
            assert_eq!(held.held_blocks(r), held_ref.held_blocks(r), "held blocks of {r}, step {step}");
            assert_eq!(active.held_blocks(r), active_ref.held_blocks(r), "active blocks of {r}, step {step}");
        }
    }
    assert!(checked > 1000, "the prompts matched something: {checked}");
}
