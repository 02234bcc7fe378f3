//! `least_requests` (join the shortest queue, JSQ): the replica with the fewest outstanding requests.
//!
//! Algorithm: scan every replica's `outstanding_requests` (waiting + running); among the minima
//! pick one uniformly at random (one pass, reservoir sampling), so ties do not all land on the
//! lowest index.
//! Parameters: none. Randomness for ties from the host's seed.
//! Source: JSQ (Winston 1977; Weber 1978); the SGLang router's and Envoy's `least_request`.
//! Under stale information (a snapshot refreshed every T) every arrival sees the same shortest
//! queue and herds onto it (Mitzenmacher 2000).
//!
//! In the dispatch world the same decision is made without reading every view: a tournament
//! tree over the counts ([`CountIndex`]) replays the reservoir scan — the same draws in the same
//! order, so the same replica and the same generator state — visiting only the subtrees that
//! hold a running minimum, and per decision the router re-reads only the views that can have
//! changed. That rests on how the dispatch world changes a view: only at a dispatch or a
//! departure it reports (`on_dispatch`, `on_complete`) or, with stale information, by showing a
//! server's true count at an earlier moment. So a view that showed the router's own count
//! (dispatches − completions) and has had no report since cannot change; a view that showed
//! something else (a lagging snapshot) is re-read on every decision until it catches up. The
//! cluster world and the gateway change views in other ways (queued admissions, unhealthy
//! backends), so there the router scans. Debug builds check every indexed decision against the
//! scan, generator state included.

use routelab_policy_api::*;

pub struct LeastRequests {
    rng: PolicyRng,
    /// The index, in the dispatch world only (see the module notes).
    index: Option<CountIndex>,
}

impl Policy for LeastRequests {
    const NAME: &'static str = "least_requests";
    const DESCRIPTION: &'static str = "join the shortest queue (fewest outstanding requests), random ties";
    type Config = crate::NoConfig;
    type Context = RouterContext;
    fn new(_: Self::Config, ctx: &RouterContext) -> Result<Self, String> {
        let index = (ctx.world == World::Dispatch && ctx.replicas >= INDEX_FROM).then(CountIndex::default);
        Ok(Self { rng: policy_rng(ctx.seed), index })
    }
}

impl RouterPolicy for LeastRequests {
    fn route(&mut self, _: &Request<'_>, replicas: &Replicas<'_>) -> usize {
        let scan = |rng: &mut PolicyRng| argmin_random_tie(replicas.iter().map(|r| r.outstanding_requests), rng);
        let indexed = self.index.as_mut().is_some_and(|index| index.catch_up(replicas));
        let (true, Some(index)) = (indexed, &self.index) else {
            return scan(&mut self.rng).expect("at least one replica");
        };
        #[cfg(debug_assertions)]
        let mut scan_rng = self.rng.clone();
        let i = index.argmin_random_tie(&mut self.rng);
        #[cfg(debug_assertions)]
        {
            assert_eq!(Some(i), scan(&mut scan_rng), "the index chose another replica than the scan");
            assert!(scan_rng == self.rng, "the index drew differently from the scan");
        }
        i
    }
    fn on_dispatch(&mut self, _: &Request<'_>, replica: usize) {
        if let Some(index) = &mut self.index {
            index.reported(replica, 1);
        }
    }
    fn on_complete(&mut self, c: &Completion) {
        if let Some(index) = &mut self.index {
            index.reported(c.replica as usize, -1);
        }
    }
}

/// Below this many replicas the scan is as fast or faster than keeping the index. Measured CPU s for
/// 2·10^5 requests at ρ 0.9, scan → index: 256 servers 0.075 → 0.095, 512 even, 1,024 0.17 → 0.15.
const INDEX_FROM: u32 = 1024;

/// When more than `1 / LAGGING_SHARE` of the views lag the router's own counts (stale
/// information refreshed rarely), re-reading them costs more than a scan: the router then scans
/// for `SCAN_SPELL` decisions and rebuilds the index after.
const LAGGING_SHARE: usize = 8;
const SCAN_SPELL: u32 = 256;

/// `outstanding_requests` per replica as last read from the views, in a tournament tree of
/// (minimum, how many leaves hold it) per node; plus the router's own count per replica and the
/// replicas to re-read before the next decision.
#[derive(Default)]
struct CountIndex {
    replicas: usize,
    /// Leaves at `leaves..2 × leaves` (a power of two ≥ `replicas`); node `k`'s children are
    /// `2k` and `2k + 1`. Padding leaves hold `u64::MAX`, above every count, with no holders.
    min: Vec<u64>,
    holders: Vec<u32>,
    leaves: usize,
    /// Dispatches minus completions reported per replica.
    own: Vec<i64>,
    /// Replicas to re-read at the next decision, without repeats (`queued` marks them).
    stale: Vec<usize>,
    queued: Vec<bool>,
    /// Decisions left to answer by scanning, and whether the tree must be rebuilt after them.
    scan_for: u32,
    rebuild: bool,
}

impl CountIndex {
    /// A report changed `replica`'s count by `delta`: its view must be re-read.
    fn reported(&mut self, replica: usize, delta: i64) {
        if let Some(own) = self.own.get_mut(replica) {
            *own += delta;
            if self.scan_for == 0 {
                self.queue(replica);
            }
        }
    }

    fn queue(&mut self, replica: usize) {
        if !self.queued[replica] {
            self.queued[replica] = true;
            self.stale.push(replica);
        }
    }

    /// Brings the tree in step with `views`: the first call (or a change in the number of
    /// replicas, or the end of a scanning spell) reads them all; later calls only the queued
    /// ones. False when this decision is to be made by scanning.
    fn catch_up(&mut self, views: &[ReplicaView]) -> bool {
        if self.scan_for > 0 {
            self.scan_for -= 1;
            return false;
        }
        if views.len() != self.replicas || self.rebuild {
            self.build(views);
        } else {
            self.reread(views);
        }
        if self.stale.len() * LAGGING_SHARE > self.replicas {
            for &r in &self.stale {
                self.queued[r] = false;
            }
            self.stale.clear();
            (self.scan_for, self.rebuild) = (SCAN_SPELL, true);
            return false;
        }
        true
    }

    fn reread(&mut self, views: &[ReplicaView]) {
        let mut stale = std::mem::take(&mut self.stale);
        stale.retain(|&r| {
            let count = views[r].outstanding_requests;
            if self.min[self.leaves + r] != count as u64 {
                self.set(r, count);
            }
            // A view behind the router's own count (a snapshot) may still move unannounced.
            let lagging = count as i64 != self.own[r];
            self.queued[r] = lagging;
            lagging
        });
        self.stale = stale;
    }

    /// Reads every view; the router's own counts survive unless the number of replicas changed.
    fn build(&mut self, views: &[ReplicaView]) {
        let n = views.len();
        let leaves = n.next_power_of_two();
        let mut own = std::mem::take(&mut self.own);
        if own.len() != n {
            own = views.iter().map(|v| v.outstanding_requests as i64).collect();
        }
        *self = Self {
            replicas: n,
            min: vec![u64::MAX; 2 * leaves],
            holders: vec![0; 2 * leaves],
            leaves,
            own,
            stale: Vec::new(),
            queued: vec![false; n],
            scan_for: 0,
            rebuild: false,
        };
        for (i, v) in views.iter().enumerate() {
            self.min[leaves + i] = v.outstanding_requests as u64;
            self.holders[leaves + i] = 1;
            if v.outstanding_requests as i64 != self.own[i] {
                self.queue(i);
            }
        }
        for k in (1..leaves).rev() {
            self.pull(k);
        }
    }

    fn set(&mut self, replica: usize, count: u32) {
        let mut k = self.leaves + replica;
        self.min[k] = count as u64;
        while k > 1 {
            k /= 2;
            let before = (self.min[k], self.holders[k]);
            self.pull(k);
            // Nodes above an unchanged one are unchanged too.
            if (self.min[k], self.holders[k]) == before {
                break;
            }
        }
    }

    /// Node `k`'s minimum and holders from its children's.
    fn pull(&mut self, k: usize) {
        let (l, r) = (2 * k, 2 * k + 1);
        let (ml, mr) = (self.min[l], self.min[r]);
        self.min[k] = ml.min(mr);
        self.holders[k] = if ml == mr {
            self.holders[l] + self.holders[r]
        } else if ml < mr {
            self.holders[l]
        } else {
            self.holders[r]
        };
    }

    /// Exactly [`argmin_random_tie`] over the indexed counts: the scan in index order, where a
    /// subtree above the running minimum is skipped, a subtree whose minimum equals it
    /// contributes its holders as ties (one draw each, as the scan would make them), and only a
    /// subtree below it is entered.
    fn argmin_random_tie(&self, rng: &mut PolicyRng) -> usize {
        let mut scan = Scan { best: u64::MAX, ties: 0, chosen: 0 };
        self.visit(1, &mut scan, rng);
        scan.chosen
    }

    fn visit(&self, k: usize, scan: &mut Scan, rng: &mut PolicyRng) {
        let m = self.min[k];
        if m > scan.best || self.holders[k] == 0 {
            return;
        }
        if m == scan.best {
            // On local copies, so the generator's state stays in registers through the draws.
            let (mut local, mut ties, mut last) = (rng.clone(), scan.ties, 0);
            for t in 1..=self.holders[k] {
                ties += 1;
                if local.random_range(0..ties) == 0 {
                    last = t;
                }
            }
            (*rng, scan.ties) = (local, ties);
            if last > 0 {
                scan.chosen = self.holder(k, last, m);
            }
        } else if k >= self.leaves {
            *scan = Scan { best: m, ties: 1, chosen: k - self.leaves };
        } else {
            self.visit(2 * k, scan, rng);
            self.visit(2 * k + 1, scan, rng);
        }
    }

    /// The `nth` (from 1) leaf holding `value` under node `k`, whose minimum is `value`.
    fn holder(&self, mut k: usize, mut nth: u32, value: u64) -> usize {
        while k < self.leaves {
            let l = 2 * k;
            if self.min[l] == value && nth <= self.holders[l] {
                k = l;
            } else {
                if self.min[l] == value {
                    nth -= self.holders[l];
                }
                k = l + 1;
            }
        }
        k - self.leaves
    }
}

/// The reservoir scan's state: the running minimum, how many replicas hold it so far, and the
/// one currently kept.
struct Scan {
    best: u64,
    ties: u32,
    chosen: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The dispatch world's pattern with many ties: true counts change a few at a time and are
    /// reported; the router sees them either live or as a snapshot refreshed every few decisions.
    /// Whenever the index answers, it matches the scan in choice and in generator state.
    #[test]
    fn index_replays_the_scan() {
        let mut gen_ = policy_rng(7);
        for n in [1usize, 2, 3, 5, 16, 100, 1024] {
            for refresh_every in [1, 3, 50] {
                let mut truth = vec![0u32; n];
                let mut views = vec![ReplicaView::default(); n];
                let mut index = CountIndex::default();
                let (mut a, mut b) = (policy_rng(n as u64), policy_rng(n as u64));
                let mut indexed = 0;
                for step in 0..400 {
                    for _ in 0..gen_.random_range(0..3) {
                        let r = gen_.random_range(0..n);
                        let up = truth[r] == 0 || gen_.random_bool(0.5);
                        truth[r] = if up { truth[r] + 1 } else { truth[r] - 1 };
                        index.reported(r, if up { 1 } else { -1 });
                    }
                    if step % refresh_every == 0 {
                        for (v, &t) in views.iter_mut().zip(&truth) {
                            v.outstanding_requests = t;
                        }
                    }
                    let want = argmin_random_tie(views.iter().map(|v| v.outstanding_requests), &mut b);
                    let got = if index.catch_up(&views) {
                        indexed += 1;
                        Some(index.argmin_random_tie(&mut a))
                    } else {
                        argmin_random_tie(views.iter().map(|v| v.outstanding_requests), &mut a)
                    };
                    assert_eq!(got, want, "n = {n}, refresh every {refresh_every}, step {step}");
                    assert!(a == b, "generator states differ (n = {n}, refresh every {refresh_every})");
                }
                // Live views never lag, so the index answers every decision.
                assert!(
                    refresh_every > 1 || indexed == 400,
                    "the index answered only {indexed} of 400 (n = {n}, every {refresh_every})"
                );
            }
        }
    }
}
