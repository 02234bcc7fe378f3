//! `least_work_left` (LWL): the replica with the least outstanding work.
//!
//! Algorithm: the replica whose outstanding work is smallest, ties uniformly at random.
//! - Cluster world (and the gateway): scan every view's `outstanding_work` (remaining prefill +
//!   decode tokens); ties broken reservoir-style, one draw per tied replica
//!   ([`argmin_random_tie`]).
//! - Dispatch world: the same order from figures that do not move with the clock. An idle server
//!   (no request outstanding) has no work left; a busy one has `busy_until − now` (the
//!   `busy_until` signal: when its FCFS backlog drains), so among busy servers the order of
//!   `busy_until` is the order of remaining work, at every instant. Key: 0 when idle, else the
//!   bits of `busy_until` (a positive `f64` orders by its bits). Ties — idle servers, mostly —
//!   take one uniform draw `k` and the `k`-th tied server in index order ([`argmin_one_draw_by`]),
//!   which is what lets the index below answer without visiting them. From [`INDEX_FROM`]
//!   servers the decision comes from that index ([`MinIndex`]: idle servers as a bit set, the
//!   keys in a tournament tree), which re-reads only the servers a report (`on_dispatch`,
//!   `on_complete`) says changed; it needs live views, so it is used while the `scraped.age_s`
//!   signal is 0 (the dispatch world shows a stale snapshot as a scrape) and rebuilt after a
//!   decision on a snapshot, which scans.
//!
//! - `work: hints` (cluster world, an option): the router keeps its own tally instead of reading
//!   the engine's `outstanding_work` (which the simulator computes from the true output
//!   lengths, an oracle no real engine has). Each request placed on replica r adds its prompt
//!   tokens not already cached there (`matched_tokens`, an exact prefix match) plus its expected
//!   output: the request fact `hint.output_tokens`, or, without a hint (NaN),
//!   `default_output_ratio` × its prompt tokens (llm-d's length estimate defaults to 1.5 × the
//!   input). A completion takes the request's share back. Decision: the least `tally_r +
//!   uncached_r`, ties as above. With the workload's `hints: {output_tokens: oracle}` this bounds
//!   what a perfect length predictor buys; with `noisy` hints, what a real one does.
//!
//! Parameters (defaults): `work` `views` (or `hints`), `default_output_ratio` 1.5 (with
//! `work: hints`). Randomness for ties from the host's seed.
//! Source: "least work left" / "join the queue with the least work" (Harchol-Balter, *Performance
//! Modeling and Design of Computer Systems*, ch. 24): with FCFS servers it is equivalent to
//! central-queue M/G/k, which is why its tail beats JSQ's when sizes are heavy-tailed.
//!
//! Same decisions as a scan of `outstanding_work`: the host keeps time in integer nanounits and
//! shows both figures as `f64`, and two different ends stay two different `busy_until` values
//! below 2^51 ns ≈ 2.25 million mean service times (past that, ends a few ns apart could round
//! to one value and tie). Until issue 14 the dispatch world used the cluster's per-tie draws on
//! `outstanding_work`, which the host refreshed at every server before every arrival; per-seed
//! results changed then, the tie-break is as uniform (`min_index` tests).

use routelab_policy_api::*;

use crate::index::members::{Member, Members};
use crate::index::min_index::{INDEX_FROM, MinIndex, decide, report};

/// Where the work left comes from.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum Work {
    /// The replicas' views: `outstanding_work` (cluster), `busy_until` (dispatch).
    #[default]
    Views,
    /// The router's own tally of prompt tokens not cached and expected output (cluster world).
    Hints,
}

#[derive(serde::Serialize, serde::Deserialize, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// `views` (the engine's figures) or `hints` (the router's own tally from length hints).
    pub work: Work,
    /// Expected output as a multiple of the prompt when a request has no hint (`work: hints`).
    pub default_output_ratio: f64,
}

impl Default for Config {
    fn default() -> Self {
        Self { work: Work::Views, default_output_ratio: 1.5 }
    }
}

pub struct LeastWorkLeft {
    rng: PolicyRng,
    world: World,
    cfg: Config,
    /// `work: hints`: every replica's tally, and each request's (replica, share) until it completes.
    /// By id (`index::members`).
    tally: Vec<f64>,
    members: Members,
    shares: std::collections::HashMap<u64, (u32, f64)>,
    /// The share of the request being placed (set by `route`, kept by `on_dispatch`).
    placing: f64,
    /// The index, in the dispatch world from [`INDEX_FROM`] servers.
    index: Option<MinIndex>,
}

/// Columns of the signals it asks for in the dispatch world.
const BUSY_UNTIL: usize = 0;
const AGE: usize = 1;

impl Policy for LeastWorkLeft {
    const NAME: &'static str = "least_work_left";
    const DESCRIPTION: &'static str = "least outstanding work (service time or tokens), random ties";
    type Config = Config;
    type Context = RouterContext;
    fn new(cfg: Config, ctx: &RouterContext) -> Result<Self, String> {
        if cfg.work == Work::Hints && ctx.world != World::Cluster {
            return Err("work: hints needs the cluster world (requests with prompts and output hints)".into());
        }
        if !(cfg.default_output_ratio >= 0.0 && cfg.default_output_ratio.is_finite()) {
            return Err(format!("default_output_ratio must be ≥ 0 (got {})", cfg.default_output_ratio));
        }
        let index = (ctx.world == World::Dispatch && ctx.replicas >= INDEX_FROM).then(MinIndex::default);
        Ok(Self {
            rng: policy_rng(ctx.seed),
            world: ctx.world,
            tally: vec![0.0; ctx.replica_count()],
            members: Members::new(ctx.replica_count()),
            shares: Default::default(),
            placing: 0.0,
            cfg,
            index,
        })
    }
}

impl RouterPolicy for LeastWorkLeft {
    fn capabilities(&self) -> Capabilities {
        match (self.world, self.cfg.work) {
            (World::Dispatch, _) => Capabilities::NONE,
            (World::Cluster, Work::Views) => Capabilities::NEEDS_OUTSTANDING_WORK,
            (World::Cluster, Work::Hints) => Capabilities::NEEDS_EXACT_MATCH,
        }
    }
    fn request_facts(&self) -> Vec<String> {
        match self.cfg.work {
            Work::Views => Vec::new(),
            Work::Hints => vec![facts::request::HINT_OUTPUT_TOKENS.into()],
        }
    }
    fn signals(&self) -> Vec<String> {
        match self.world {
            World::Dispatch => vec![signals::BUSY_UNTIL.into(), signals::SCRAPED_AGE_S.into()],
            World::Cluster => Vec::new(),
        }
    }
    fn route(&mut self, req: &Request<'_>, replicas: &Replicas<'_>) -> usize {
        if self.cfg.work == Work::Hints {
            let hint = req.fact(0);
            let prompt = req.prompt_tokens as f64;
            self.placing = if hint.is_nan() { self.cfg.default_output_ratio * prompt } else { hint };
            let uncached = |r: &ReplicaView| prompt - (r.matched_tokens as f64).min(prompt);
            let (members, tally) = (&self.members, &self.tally);
            let work = replicas.iter().enumerate().map(|(i, r)| tally[members.id(i)] + uncached(r));
            let k = argmin_random_tie(work, &mut self.rng).expect("at least one replica");
            self.placing += uncached(&replicas[k]);
            return k;
        }
        if self.world == World::Cluster {
            let work = replicas.iter().map(|r| r.outstanding_work);
            return argmin_random_tie(work, &mut self.rng).expect("at least one replica");
        }
        let (views, table, columns) = (replicas.views(), replicas.signals.as_slice(), replicas.signal_columns as usize);
        let count = |i: usize| views[i].outstanding_requests;
        let key = |i: usize| if count(i) == 0 { 0 } else { table[i * columns + BUSY_UNTIL].to_bits() };
        let live = replicas.signal(0, AGE) == 0.0;
        match &mut self.index {
            Some(index) if !live => {
                index.invalidate();
                argmin_one_draw_by(replicas.len(), key, &mut self.rng).expect("at least one replica")
            }
            index => decide(index.as_mut(), replicas.len(), key, count, &mut self.rng),
        }
    }
    fn on_dispatch(&mut self, req: &Request<'_>, replica: usize) {
        if self.cfg.work == Work::Hints {
            let id = self.members.id(replica);
            self.tally[id] += self.placing;
            self.shares.insert(req.id, (id as u32, self.placing));
        }
        report(&mut self.index, replica, 1);
    }
    fn on_complete(&mut self, c: &Completion) {
        if let Some((r, share)) = self.shares.remove(&c.request_id) {
            // Clamped: a float sum taken apart in another order may end a hair below 0.
            self.tally[r as usize] = (self.tally[r as usize] - share).max(0.0);
        }
        report(&mut self.index, c.replica_index(), -1);
    }
    /// With `work: hints`, a replica that leaves takes its tally, and the shares of its requests,
    /// with it (kept by id, `index::members`).
    fn on_replica_change(&mut self, change: &ReplicaChange) {
        if let Some(Member::Left(id)) = self.members.change(change) {
            self.tally[id] = 0.0;
            self.shares.retain(|_, &mut (r, _)| r as usize != id);
        }
    }
}

#[cfg(test)]
mod tests {
    use abi_stable::std_types::RNone;
    use rand::RngExt;

    use super::*;

    fn lwl(world: World, replicas: u32) -> LeastWorkLeft {
        let ctx = RouterContext {
            world,
            replicas,
            seed: 5,
            kv_capacity_tokens: 0,
            cost: RNone,
            disaggregation: RNone,
            facts: Default::default(),
        };
        LeastWorkLeft::new(Default::default(), &ctx).unwrap()
    }

    const REQ: Request<'static> = Request::new(0, 1.0, 0);

    /// Hand-computed dispatch-world decisions. Outstanding requests [2, 0, 1, 0, 3] and
    /// `busy_until` [5.5, 0.75, 2.25, 0.5, 2.0] at time 1: servers 1 and 3 are idle (their ends
    /// are past), so they tie at no work and one draw from the policy's stream (seed 5) picks
    /// between them. With no idle server (counts [2, 1, 1, 4]) the least work is server 2's
    /// (2.0 − 1 = 1.0, against 4.5, 1.25, 8.0), chosen without a draw.
    #[test]
    fn dispatch_decisions_by_hand() {
        let mut p = lwl(World::Dispatch, 5);
        assert_eq!(p.capabilities(), Capabilities::NONE, "no per-arrival refresh of outstanding_work");
        let views = |counts: &[u32]| -> Vec<ReplicaView> {
            counts.iter().map(|&c| ReplicaView { outstanding_requests: c, ..Default::default() }).collect()
        };
        let with = |busy: &[f64]| busy.iter().flat_map(|&b| [b, 0.0]).collect::<Vec<f64>>();
        let (v, s) = (views(&[2, 0, 1, 0, 3]), with(&[5.5, 0.75, 2.25, 0.5, 2.0]));
        let mut draw = policy_rng(5);
        let expected = [1, 3][draw.random_range(0..2u32) as usize];
        assert_eq!(p.route(&REQ, &Replicas::with_signals(&v, &s, 2)), expected);
        assert!(p.rng == draw, "one draw for the tie");
        let (v, s) = (views(&[2, 1, 1, 4]), with(&[5.5, 2.25, 2.0, 9.0]));
        assert_eq!(p.route(&REQ, &Replicas::with_signals(&v, &s, 2)), 2);
        assert!(p.rng == draw, "no draw without a tie");
    }

    /// `work: hints` by hand: a request's share is its uncached prompt where it goes plus its
    /// hinted output (or 1.5 × its prompt without a hint), and a completion takes it back.
    #[test]
    fn hinted_work_is_tallied_by_hand() {
        let ctx = RouterContext::new(World::Cluster, 2, 5);
        let cfg = Config { work: Work::Hints, ..Default::default() };
        let mut p = LeastWorkLeft::new(cfg, &ctx).unwrap();
        assert!(p.capabilities().needs_exact_match());
        assert_eq!(p.request_facts(), vec![facts::request::HINT_OUTPUT_TOKENS.to_string()]);
        let views = |m: [u32; 2]| m.map(|matched_tokens| ReplicaView { matched_tokens, ..Default::default() });
        // Prompt 50, all cached on replica 1: it goes there (work 0 against 50) and adds 100.
        let a = Request::new(1, 0.0, 50).with_facts(&[100.0]);
        assert_eq!(p.route(&a, &Replicas::new(&views([0, 50]))), 1);
        p.on_dispatch(&a, 1);
        // Prompt 10, no hint: replica 0 (10 against 100 + 10); its share is 10 + 1.5 × 10.
        let b = Request::new(2, 0.0, 10).with_facts(&[f64::NAN]);
        assert_eq!(p.route(&b, &Replicas::new(&views([0, 0]))), 0);
        p.on_dispatch(&b, 0);
        assert_eq!(p.tally, [25.0, 100.0]);
        p.on_complete(&Completion {
            request_id: 1,
            replica: 1,
            arrived_at: 0.0,
            completed_at: 1.0,
            ttft: 0.5,
            prompt_tokens: 50,
            cached_tokens: 50,
            output_tokens: 100,
        });
        assert_eq!(p.tally, [25.0, 0.0]);
        assert!(LeastWorkLeft::new(cfg_hints(), &RouterContext::new(World::Dispatch, 2, 5)).is_err());
    }

    fn cfg_hints() -> Config {
        Config { work: Work::Hints, ..Default::default() }
    }

    /// In the cluster world the views' `outstanding_work` (tokens) decides, and no signals are asked.
    #[test]
    fn cluster_reads_outstanding_work() {
        let mut p = lwl(World::Cluster, 3);
        assert!(p.capabilities().needs_outstanding_work() && p.signals().is_empty());
        let v: Vec<ReplicaView> =
            [300.0, 120.0, 200.0].iter().map(|&w| ReplicaView { outstanding_work: w, ..Default::default() }).collect();
        assert_eq!(p.route(&REQ, &Replicas::new(&v)), 1);
    }
}
