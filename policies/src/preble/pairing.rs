//! A decision-level trace of Preble's P/D pairing, reported as router metrics (`pd_*`).
//!
//! A *pairable* decision is an explore whose decode-heavy test passes: some replica's windowed hit
//! ratio is at least `pd_hit_ratio`. With pairing on it is a paired decision; with pairing off
//! the trace still records it (the request goes to the cheapest replica instead), so the same
//! requests — same seed, same stream — can be compared across the two runs. For each it records
//! the request's prompt and cached tokens, and the load of the decode-heavy replica against the
//! cheapest one (the replica the cost model would have picked). A pairable request places a new
//! prefix (a tool, a video, a document) on a replica, and later requests for that prefix exploit
//! it there: these are its *followers*. Latency is reported for three disjoint groups — pairable
//! requests, followers, and the rest — so a difference between the runs can be located.
//!
//! Nothing here feeds back into a decision.
//!
//! Bounded, so a long-lived gateway does not grow with it: each group's mean is exact, its P99 is
//! exact up to [`KEPT_LATENCIES`] requests and, past that, the P99 of a uniform sample of that
//! many (the requests whose hashed id is smallest: deterministic, no random draw); at most
//! [`PLACED_CAP`] placed prefixes are remembered (later ones are not, so their followers count as
//! `other`).

use std::collections::{HashMap, HashSet};

use routelab_policy_api::{ROOT_PATH_HASH, ReplicaView, Segment, extend_path_hash, mix64};

/// Latencies kept per group for its P99 (past it, a uniform sample of this many).
pub(super) const KEPT_LATENCIES: usize = 1 << 18;
/// Placed prefixes remembered at most.
pub(super) const PLACED_CAP: usize = 1 << 20;

#[derive(Clone, Copy)]
enum Group {
    Pairable,
    Follower,
}

/// One pairable decision: what pairing chose (`heavy`) against what the cost model chose.
pub(super) struct Pairable<'a> {
    pub request: u64,
    pub segments: &'a [Segment],
    pub prompt_tokens: u32,
    pub cached_tokens: u32,
    pub heavy: usize,
    pub hit_ratio: f64,
    pub cheapest: usize,
    pub cheapest_hit_ratio: f64,
    /// L of the decode-heavy replica minus L of the cheapest one.
    pub l_excess_s: f64,
}

#[derive(Default)]
pub(super) struct PairingTrace {
    decisions: u64,
    differs: u64,
    prompt_tokens: f64,
    cached_tokens: f64,
    hit_ratio: f64,
    cheapest_hit_ratio: f64,
    l_excess_s: f64,
    heavy_waiting: f64,
    heavy_running: f64,
    cheapest_waiting: f64,
    cheapest_running: f64,
    /// Path hashes of the prefix nodes pairable requests created (past their cached part).
    placed: HashSet<u64>,
    in_flight: HashMap<u64, Group>,
    pairable_latency: Latencies,
    follower_latency: Latencies,
    other_latency: Latencies,
}

/// One group's latencies: the exact count and sum, and at most `2 × keep` samples for the P99 —
/// every one while there are at most `keep`, then those whose hashed request id is among the
/// `keep` smallest seen (bottom-k sampling, a uniform sample that needs no random draw).
struct Latencies {
    count: u64,
    sum: f64,
    keep: usize,
    /// (hash of the request id, latency).
    kept: Vec<(u64, f64)>,
    /// Samples hashing at or above this are not kept (`u64::MAX` until the first cut).
    below: u64,
}

impl Default for Latencies {
    fn default() -> Self {
        Self::with_cap(KEPT_LATENCIES)
    }
}

impl Latencies {
    fn with_cap(keep: usize) -> Self {
        Self { count: 0, sum: 0.0, keep, kept: Vec::new(), below: u64::MAX }
    }

    fn push(&mut self, request: u64, latency: f64) {
        self.count += 1;
        self.sum += latency;
        let h = mix64(request);
        if self.count as usize > self.keep && h >= self.below {
            return;
        }
        self.kept.push((h, latency));
        if self.kept.len() >= 2 * self.keep {
            self.kept.select_nth_unstable_by_key(self.keep, |&(h, _)| h);
            self.below = self.kept[self.keep].0;
            self.kept.truncate(self.keep);
        }
    }

    /// Mean and nearest-rank 99th percentile (0 for none: a metric must be a number).
    fn mean_p99(&self) -> (f64, f64) {
        if self.count == 0 {
            return (0.0, 0.0);
        }
        let mut sorted: Vec<f64> = self.kept.iter().map(|&(_, l)| l).collect();
        sorted.sort_by(f64::total_cmp);
        let rank = ((0.99 * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
        (self.sum / self.count as f64, sorted[rank])
    }
}

impl PairingTrace {
    pub(super) fn pairable(&mut self, p: Pairable<'_>, views: &[ReplicaView]) {
        self.decisions += 1;
        self.differs += u64::from(p.heavy != p.cheapest);
        self.prompt_tokens += f64::from(p.prompt_tokens);
        self.cached_tokens += f64::from(p.cached_tokens);
        self.hit_ratio += p.hit_ratio;
        self.cheapest_hit_ratio += p.cheapest_hit_ratio;
        self.l_excess_s += p.l_excess_s;
        let (heavy, cheapest) = (views.get(p.heavy), views.get(p.cheapest));
        self.heavy_waiting += heavy.map_or(0.0, |v| f64::from(v.waiting));
        self.heavy_running += heavy.map_or(0.0, |v| f64::from(v.running));
        self.cheapest_waiting += cheapest.map_or(0.0, |v| f64::from(v.waiting));
        self.cheapest_running += cheapest.map_or(0.0, |v| f64::from(v.running));
        let (mut key, mut tokens) = (ROOT_PATH_HASH, 0u32);
        for s in p.segments {
            key = extend_path_hash(key, s.id);
            tokens = tokens.saturating_add(s.tokens);
            if tokens > p.cached_tokens && self.placed.len() < PLACED_CAP {
                self.placed.insert(key);
            }
        }
        self.in_flight.insert(p.request, Group::Pairable);
    }

    /// An exploit of the prefix node `key`: a follower if a pairable request placed it.
    pub(super) fn exploit(&mut self, request: u64, key: u64) {
        if self.placed.contains(&key) {
            self.in_flight.insert(request, Group::Follower);
        }
    }

    pub(super) fn complete(&mut self, request: u64, latency: f64) {
        match self.in_flight.remove(&request) {
            Some(Group::Pairable) => self.pairable_latency.push(request, latency),
            Some(Group::Follower) => self.follower_latency.push(request, latency),
            None => self.other_latency.push(request, latency),
        }
    }

    pub(super) fn report(&self, out: &mut Vec<(String, f64)>) {
        let n = self.decisions.max(1) as f64;
        let mut put = |name: &str, v: f64| out.push((format!("pd_{name}"), v));
        put("pairable_decisions", self.decisions as f64);
        put("pairable_differs_fraction", self.differs as f64 / n);
        put("pairable_prompt_tokens_mean", self.prompt_tokens / n);
        put("pairable_cached_tokens_mean", self.cached_tokens / n);
        put("pairable_hit_ratio_mean", self.hit_ratio / n);
        put("cheapest_hit_ratio_mean", self.cheapest_hit_ratio / n);
        put("heavy_l_excess_mean_s", self.l_excess_s / n);
        put("heavy_waiting_mean", self.heavy_waiting / n);
        put("heavy_running_mean", self.heavy_running / n);
        put("cheapest_waiting_mean", self.cheapest_waiting / n);
        put("cheapest_running_mean", self.cheapest_running / n);
        for (group, latencies) in
            [("pairable", &self.pairable_latency), ("follower", &self.follower_latency), ("other", &self.other_latency)]
        {
            let (mean, p99) = latencies.mean_p99();
            put(&format!("{group}_requests"), latencies.count as f64);
            put(&format!("{group}_latency_mean_s"), mean);
            put(&format!("{group}_latency_p99_s"), p99);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(id: u64, tokens: u32) -> Segment {
        Segment { id, tokens }
    }

    #[test]
    fn followers_are_exploits_of_a_prefix_a_pairable_request_placed() {
        let mut t = PairingTrace::default();
        let segments = [seg(1, 300), seg(2, 1300), seg(3, 200)];
        let views = vec![ReplicaView::default(); 2];
        t.pairable(
            Pairable {
                request: 7,
                segments: &segments,
                prompt_tokens: 1800,
                cached_tokens: 300,
                heavy: 1,
                hit_ratio: 0.9,
                cheapest: 0,
                cheapest_hit_ratio: 0.5,
                l_excess_s: 2.0,
            },
            &views,
        );
        let system = extend_path_hash(ROOT_PATH_HASH, 1);
        let tool = extend_path_hash(system, 2);
        t.exploit(8, tool); // the placed tool: a follower
        t.exploit(9, system); // the shared system prompt was cached already: not one
        t.complete(7, 1.0);
        t.complete(8, 2.0);
        t.complete(9, 4.0);
        let report: HashMap<String, f64> = {
            let mut out = Vec::new();
            t.report(&mut out);
            out.into_iter().collect()
        };
        assert_eq!(report["pd_pairable_decisions"], 1.0);
        assert_eq!(report["pd_pairable_differs_fraction"], 1.0);
        assert_eq!(report["pd_pairable_latency_mean_s"], 1.0);
        assert_eq!(report["pd_follower_requests"], 1.0);
        assert_eq!(report["pd_follower_latency_mean_s"], 2.0);
        assert_eq!(report["pd_other_latency_p99_s"], 4.0);
        assert_eq!(report["pd_heavy_l_excess_mean_s"], 2.0);
    }

    #[test]
    fn latencies_stay_bounded_with_an_exact_mean_and_a_uniform_sample_for_the_p99() {
        let mut l = Latencies::with_cap(16);
        for id in 0..1000u64 {
            l.push(id, id as f64);
            assert!(l.kept.len() < 32, "at most twice the cap is held");
        }
        let (mean, p99) = l.mean_p99();
        assert_eq!(l.count, 1000);
        assert_eq!(mean, 499.5);
        // The kept samples are exactly the 16 smallest hashes of all ids seen (or 16..31 of them
        // between cuts, the smallest first).
        let mut by_hash: Vec<(u64, f64)> = (0..1000u64).map(|id| (mix64(id), id as f64)).collect();
        by_hash.sort_by_key(|&(h, _)| h);
        let mut kept = l.kept.clone();
        kept.sort_by_key(|&(h, _)| h);
        assert_eq!(kept[..], by_hash[..kept.len()]);
        assert!(kept.iter().any(|&(_, v)| v == p99));
        // Under the cap every sample is kept: the P99 is exact.
        let mut small = Latencies::with_cap(16);
        for id in 0..10u64 {
            small.push(id, (10 - id) as f64);
        }
        assert_eq!(small.mean_p99(), (5.5, 10.0));
    }
}
