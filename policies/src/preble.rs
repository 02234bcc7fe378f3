//! `preble`: Preble's global scheduler — E2 (exploit or explore), load cost L + M + P,
//! rebalancing, autoscaling and prefill/decode pairing.
//!
//! Algorithm (per request; the experiments in docs/experiments.md):
//! - A global prefix tree over every dispatched prompt records which replicas hold (or were
//!   assigned) each node; a prompt is inserted at dispatch, and removed from a replica when that
//!   replica reports the eviction (`on_evict`).
//! - **E2.** `cached` = longest match on the tree, `missed` = prompt − cached. If cached > missed,
//!   *exploit*: among the replicas holding the longest match, the lowest load cost. Otherwise
//!   *explore*: the P/D pairing rule if enabled, else the lowest load cost over all replicas.
//!   (The public code's rule "exploit when the unmatched leaf's tokens < matched tokens, ties
//!   explore" is the same comparison in our token accounting.)
//! - **Load cost** of replica i, in GPU seconds from the host's step model: L = prefill time of the
//!   missed tokens of every request dispatched to i within the window H, plus each one's decode
//!   estimate (window mean output length × per-token decode time); M = what i would have to evict
//!   to fit this request (its LRU plan), each node costing its recompute time × its hit rate in
//!   the window; P = this request's prefill time on i (missed tokens only).
//! - **Rebalancing.** If the most loaded replica's cost exceeds `rebalance_threshold` × the least
//!   loaded's, a request that would exploit the most loaded one goes to the least loaded instead
//!   (its prefix is recomputed there: replicated).
//! - **Autoscaling** (simplified: per prefix, not per subtree). If the window's mean TTFT of
//!   requests exploiting a prefix exceeds `autoscale_factor` × the window's mean TTFT overall, the
//!   cheapest replica overall joins that prefix's candidates, so its traffic splits by cost.
//! - **P/D pairing.** When exploring (a prefill-heavy request), if some replica's prefix hit ratio
//!   (cached ÷ prompt tokens of the requests dispatched to it in the last `pd_window_s`) is at
//!   least `pd_hit_ratio`, go to the replica with the highest such ratio (first on ties), whatever
//!   its load. As Preble's code does it (WukLab/preble @ 8e7906a3b76693c9003d1c7115b8011296c867e1:
//!   `preble/simulator.py` `select_and_prepare_input` takes `np.argmax` of the servers' windowed
//!   hit ratios and keeps it if ≥ 0.7; `runtime_selector` in `preble/global_scheduler_with_time.py`
//!   sends a non-matching request there; the servers' window is `hit_trace_window_size` = 30 s in
//!   `python/sglang/srt/server_args.py`). A high hit ratio stands for "mostly decoding": its
//!   prompts cost little prefill. The code records the ratio when a replica admits a prefill batch
//!   (`schedule_within_group` in `python/sglang/srt/managers/router/model_rpc.py`), with the
//!   server's cache; we record it at dispatch with the global tree's match (the router hears of
//!   admissions only at completion). An earlier version here used the load window H (180 s) and
//!   the cheapest of the qualifying replicas.
//!
//! Parameters (defaults): `window_s` 180; `decode_estimate` single (the paper: one request's
//! per-token time), `batched` (marginal cost in the replica's running batch) or `median_tpot`
//! (the code: `median_tpot_s` 0.15 × output); `decode_load` windowed (every request in the
//! window is charged a decode estimate, the paper's reading) or `running` (only the requests
//! running on the replica now, as `get_node_cost` in the code does); `include_p` true (the code omits P);
//! `rebalance` true, `rebalance_threshold` 1.5 (Th_bal), `rebalance_after_per_replica` 0 (the
//! code: 50); `autoscale` true, `autoscale_factor` 2, `autoscale_min_samples` 10; `pd_pairing`
//! true, `pd_hit_ratio` 0.7, `pd_window_s` 30; `default_output_tokens` 64 (before any completion is seen).
//!
//! Ablations: E2 only = `preble{rebalance: false, autoscale: false, pd_pairing: false}`; the full
//! system also runs the `priority_groups` scheduler on each replica.
//! Replicas coming and going (`on_replica_change`: crashes, autoscaling): Preble (paper and
//! code, WukLab/preble @ 8e7906a3) schedules over a fixed set of GPUs and has no rule for one
//! that leaves. Here the state is kept by id (`index::members`) and a replica that leaves is
//! forgotten as if it had reported evicting every node it held (`on_evict`'s path), with its
//! windows (L's prefill seconds, the P/D hit ratio) emptied; one that joins starts with none.
//! Costs, candidates and the rebalancing and pairing tests cover the routable replicas only.
//!
//! Source: Srivatsa, He, Abhyankar, Li, Zhang, "Preble: Efficient Distributed Prompt Scheduling
//! for LLM Serving", ICLR 2025, §3.2–3.3 (E2, cost model, load adjustment) and its public code.
//! Reports the run's mean L, M and P of the chosen replicas and the count of each decision kind,
//! and a trace of the P/D pairing decisions (`pd_*`, module `pairing`; recorded with pairing off
//! too, as what pairing would have done).

mod config;
mod hits;
mod pairing;

pub use self::config::{Config, DecodeEstimate, DecodeLoad};

use self::hits::{KeyMap, NodeHits, request_key};
use crate::index::members::{Member, Members};

use routelab_policy_api::*;

/// What Preble remembers of one replica within the window.
struct ReplicaWindow {
    /// Prefill seconds of the missed tokens of requests dispatched here.
    prefill_s: WindowSum,
    /// Prompt and cached tokens of the requests dispatched here in the last `pd_window_s`.
    prompt_tokens: WindowSum,
    cached_tokens: WindowSum,
}

/// One replica's load cost split into its parts.
#[derive(Clone, Copy, Default)]
struct Cost {
    l: f64,
    m: f64,
    p: f64,
}

impl Cost {
    fn total(&self) -> f64 {
        self.l + self.m + self.p
    }

    /// L + P: a lower bound of the total (M ≥ 0, and rounding is monotone), known before M.
    fn lower_bound(&self) -> f64 {
        self.l + self.p
    }
}

pub struct Preble {
    cfg: Config,
    model: CostModel,
    kv_capacity_tokens: u64,
    /// By id (`index::members`), as `replicas`, `matches`, `costs` and `needed`.
    tree: PrefixTree,
    members: Members,
    /// The routable replicas' ids, in index order (for the decision being made).
    routable: Vec<usize>,
    replicas: Vec<ReplicaWindow>,
    outputs: WindowSum,
    prompts: WindowSum,
    node_hits: NodeHits,
    prefix_ttft: KeyMap<WindowSum>,
    ttft: WindowSum,
    /// The prefix each exploiting request in flight exploited, by [`request_key`].
    in_flight_prefix: KeyMap<u64>,
    /// The decision `route` made (the prefix key it exploited, if any), for `on_dispatch`; the
    /// per-replica matches it computed are in `matches`.
    carried: Carried<Option<u64>>,
    matches: Vec<u32>,
    /// Replicas holding the longest match (reused across decisions).
    holders: Vec<usize>,
    /// This decision's costs; M is NaN until [`Preble::total`] needs it (planning evictions on
    /// every replica is the expensive part, and most decisions are settled by L + P).
    costs: Vec<Cost>,
    /// Tokens each replica would need for this request (missed + expected output), for M.
    needed: Vec<u64>,
    window_requests: f64,
    dispatched: u64,
    sums: Cost,
    exploit: u64,
    explore: u64,
    rebalanced: u64,
    paired: u64,
    autoscaled: u64,
    /// What pairing did (or, when off, would have done) and how those requests fared.
    pairing_trace: pairing::PairingTrace,
}

// The key of a prompt prefix is its path hash in the toolkit's tree (`extend_path_hash` from
// `ROOT_PATH_HASH` over its segment ids), so a tree node's key is read off the node.

impl Policy for Preble {
    const NAME: &'static str = "preble";
    const DESCRIPTION: &'static str =
        "Preble: E2 exploit/explore with L+M+P load cost, rebalancing, autoscaling, P/D pairing";
    type Config = Config;
    type Context = RouterContext;
    fn new(cfg: Config, ctx: &RouterContext) -> Result<Self, String> {
        let model = ctx.cost.clone().into_option().ok_or(
            "preble prices load in GPU seconds and needs the cluster world's step model (run it on a cluster workload)",
        )?;
        if !(cfg.window_s > 0.0) {
            return Err(format!("window_s must be positive (got {})", cfg.window_s));
        }
        if !(cfg.rebalance_threshold >= 1.0) {
            return Err(format!("rebalance_threshold must be ≥ 1 (got {})", cfg.rebalance_threshold));
        }
        if !(0.0..=1.0).contains(&cfg.pd_hit_ratio) {
            return Err(format!("pd_hit_ratio must be in [0, 1] (got {})", cfg.pd_hit_ratio));
        }
        if !(cfg.pd_window_s > 0.0) {
            return Err(format!("pd_window_s must be positive (got {})", cfg.pd_window_s));
        }
        let n = ctx.replica_count();
        let w = cfg.window_s;
        let pd_w = cfg.pd_window_s;
        Ok(Self {
            model,
            kv_capacity_tokens: ctx.kv_capacity_tokens,
            tree: PrefixTree::without_hash_index(n),
            members: Members::new(n),
            routable: Vec::with_capacity(n),
            replicas: (0..n)
                .map(|_| ReplicaWindow {
                    prefill_s: WindowSum::new(w),
                    prompt_tokens: WindowSum::new(pd_w),
                    cached_tokens: WindowSum::new(pd_w),
                })
                .collect(),
            outputs: WindowSum::new(w),
            prompts: WindowSum::new(w),
            node_hits: NodeHits::new(w),
            prefix_ttft: KeyMap::default(),
            ttft: WindowSum::new(w),
            in_flight_prefix: KeyMap::default(),
            carried: Carried::new(),
            matches: vec![0; n],
            holders: Vec::with_capacity(n),
            costs: vec![Cost::default(); n],
            needed: vec![0; n],
            window_requests: 1.0,
            dispatched: 0,
            sums: Cost::default(),
            exploit: 0,
            explore: 0,
            rebalanced: 0,
            paired: 0,
            autoscaled: 0,
            pairing_trace: Default::default(),
            cfg,
        })
    }
}

impl Preble {
    /// Tokens of `segments` Preble believes replica `r` holds (its global tree; exercise 8).
    pub fn believed_match(&self, segments: &[Segment], r: usize) -> u32 {
        self.tree.match_tokens(segments, r)
    }

    fn mean_output(&mut self, now: f64) -> f64 {
        let n = self.outputs.count(now);
        if n == 0 { self.cfg.default_output_tokens } else { self.outputs.sum(now) / n as f64 }
    }

    fn mean_prompt(&mut self, now: f64) -> f64 {
        let n = self.prompts.count(now);
        if n == 0 { 0.0 } else { self.prompts.sum(now) / n as f64 }
    }

    /// Decode seconds charged to one request on a replica running `batch` requests.
    fn decode_estimate(&self, output: f64, context: f64, batch: u32) -> f64 {
        let ctx = context.max(1.0) as u64;
        match self.cfg.decode_estimate {
            DecodeEstimate::Single => output * self.model.decode_step_time_s(1, ctx),
            DecodeEstimate::Batched => {
                let b = batch as u64;
                let with = self.model.decode_step_time_s(b + 1, (b + 1) * ctx);
                let without = if b == 0 { 0.0 } else { self.model.decode_step_time_s(b, b * ctx) };
                output * (with - without)
            }
            DecodeEstimate::MedianTpot => output * self.cfg.median_tpot_s,
        }
    }

    /// Key and context (tokens above it) of a tree node.
    fn node_key(&self, node: NodeId) -> (u64, u64) {
        (self.tree.path_hash(node), self.tree.context_tokens(node))
    }

    /// M: recompute cost of what replica `r` would evict to fit `needed` more tokens, given the
    /// window's request count.
    fn eviction_cost(&mut self, r: usize, needed: u64, window_requests: f64, now: f64) -> f64 {
        let free = self.kv_capacity_tokens.saturating_sub(self.tree.held_tokens(r));
        if needed <= free {
            return 0.0;
        }
        self.node_hits.expire(now);
        let mut m = 0.0;
        let (tree, hits, model) = (&self.tree, &self.node_hits, &self.model);
        tree.plan_eviction_each(r, needed - free, |node, tokens| {
            let hits = hits.count(tree.path_hash(node)) as f64;
            m += model.prefill_time_s(tokens as u64, tree.context_tokens(node)) * (hits / window_requests).min(1.0);
        });
        m
    }

    /// Every routable replica's L and P (by id; `views` by index).
    fn compute_costs(&mut self, request: &Request<'_>, views: &[ReplicaView]) {
        let now = request.arrived_at;
        let output = self.mean_output(now);
        let context = self.mean_prompt(now).max(request.prompt_tokens as f64);
        // Requests dispatched in the window: `prompts` holds one value per dispatch.
        self.window_requests = self.prompts.count(now).max(1) as f64;
        // Only the batched estimate depends on the replica; the others are the same for all.
        let same_for_all =
            (self.cfg.decode_estimate != DecodeEstimate::Batched).then(|| self.decode_estimate(output, context, 0));
        // P for the last matched length seen: most replicas match the same (often none).
        let mut last_p: Option<(u64, f64)> = None;
        let routable = std::mem::take(&mut self.routable);
        for (i, &r) in routable.iter().enumerate() {
            let matched = self.matches[r] as u64;
            let missed = (request.prompt_tokens as u64).saturating_sub(matched);
            let w = &mut self.replicas[r];
            let (prefill, n) = w.prefill_s.sum_count(now);
            let batch = views.get(i).map_or(0, |v| v.running);
            let decoding = match self.cfg.decode_load {
                DecodeLoad::Windowed => n as f64,
                DecodeLoad::Running => f64::from(batch),
            };
            let estimate = match same_for_all {
                Some(e) => e,
                None => self.decode_estimate(output, context, batch),
            };
            let l = prefill + decoding * estimate;
            let p = match last_p {
                _ if !self.cfg.include_p => 0.0,
                Some((m, p)) if m == matched => p,
                _ => {
                    let p = self.model.prefill_time_s(missed, matched);
                    last_p = Some((matched, p));
                    p
                }
            };
            self.needed[r] = missed + output as u64;
            self.costs[r] = Cost { l, m: f64::NAN, p };
        }
        self.routable = routable;
    }

    /// Replica `r`'s L + M + P for this decision, computing M on first use.
    fn total(&mut self, r: usize, now: f64) -> f64 {
        if self.costs[r].m.is_nan() {
            self.costs[r].m = self.eviction_cost(r, self.needed[r], self.window_requests, now);
        }
        self.costs[r].total()
    }

    /// The cheapest replica among `candidates` (lowest index on ties). The one with the lowest
    /// lower bound is priced first; its total then rules out every candidate whose lower bound
    /// exceeds it, so M is computed only for those that could still win.
    fn cheapest(&mut self, candidates: impl Iterator<Item = usize> + Clone, now: f64) -> Option<usize> {
        let lb = |s: &Self, r: usize| s.costs[r].lower_bound();
        let first = candidates.clone().min_by(|&a, &b| lb(self, a).total_cmp(&lb(self, b)).then(a.cmp(&b)))?;
        let mut best = (self.total(first, now), first);
        for r in candidates {
            if r == first || lb(self, r) > best.0 {
                continue;
            }
            let t = self.total(r, now);
            if t < best.0 || (t == best.0 && r < best.1) {
                best = (t, r);
            }
        }
        Some(best.1)
    }

    /// Whether `choice` is the most loaded replica (the first one on ties), given its total.
    fn is_most_loaded(&mut self, choice: usize, total: f64, now: f64) -> bool {
        let routable = std::mem::take(&mut self.routable);
        let most = routable.iter().all(|&r| {
            r == choice || {
                self.costs[r].lower_bound() <= total && {
                    let t = self.total(r, now);
                    t < total || (t == total && r > choice)
                }
            }
        });
        self.routable = routable;
        most
    }

    /// The decode-heavy replica and its hit ratio: the highest windowed hit ratio (first on
    /// ties), if at least `pd_hit_ratio`.
    fn decode_heavy(&mut self, now: f64) -> Option<(usize, f64)> {
        let mut best: Option<(usize, f64)> = None;
        let routable = std::mem::take(&mut self.routable);
        for &r in &routable {
            let ratio = self.hit_ratio(r, now);
            if best.is_none_or(|(_, b)| ratio > b) {
                best = Some((r, ratio));
            }
        }
        self.routable = routable;
        best.filter(|&(_, ratio)| ratio >= self.cfg.pd_hit_ratio)
    }

    /// Cached ÷ prompt tokens of the requests dispatched to `r` in the last `pd_window_s`.
    fn hit_ratio(&mut self, r: usize, now: f64) -> f64 {
        let w = &mut self.replicas[r];
        let prompt = w.prompt_tokens.sum(now);
        if prompt > 0.0 { w.cached_tokens.sum(now) / prompt } else { 0.0 }
    }

    fn prefix_overloaded(&mut self, key: u64, now: f64) -> bool {
        let Some(w) = self.prefix_ttft.get_mut(&key) else { return false };
        let n = w.count(now);
        if n < self.cfg.autoscale_min_samples {
            return false;
        }
        let prefix_mean = w.sum(now) / n as f64;
        let all = self.ttft.count(now).max(1) as f64;
        prefix_mean > self.cfg.autoscale_factor * (self.ttft.sum(now) / all)
    }
}

impl RouterPolicy for Preble {
    fn capabilities(&self) -> Capabilities {
        Capabilities::WANTS_EVICTIONS
    }

    fn route(&mut self, request: &Request<'_>, replicas: &Replicas<'_>) -> usize {
        let now = request.arrived_at;
        let segments = request.segments();
        self.routable.clear();
        self.routable.extend((0..replicas.len()).map(|i| self.members.id(i)));
        self.tree.match_each(segments, &mut self.matches);
        self.compute_costs(request, replicas);
        let (cached, deepest) = self.tree.longest_match(segments);
        let missed = request.prompt_tokens.saturating_sub(cached);
        // One small copy per decision, so the candidates can be walked while costs are priced.
        let routable = self.routable.clone();
        let all = routable.iter().copied();
        let mut prefix_key = None;
        let chosen = match deepest {
            Some(node) if cached > missed => {
                self.exploit += 1;
                let mut holders = std::mem::take(&mut self.holders);
                holders.clear();
                holders.extend(all.clone().filter(|&r| self.matches[r] >= cached));
                let mut choice = self.cheapest(holders.iter().copied(), now).expect("the longest match has a holder");
                self.holders = holders;
                let key = self.node_key(node).0;
                prefix_key = Some(key);
                self.pairing_trace.exploit(request.id, key);
                // The cheapest replica overall, priced at most once per decision (autoscaling
                // and rebalancing both ask; the costs do not change in between).
                let mut global_min = None;
                if self.cfg.autoscale && self.prefix_overloaded(key, now) {
                    let global = self.cheapest(all.clone(), now).expect("replicas");
                    global_min = Some(global);
                    if self.total(global, now) < self.total(choice, now) && self.matches[global] < cached {
                        self.autoscaled += 1;
                        choice = global;
                    }
                }
                let warm = self.dispatched >= self.cfg.rebalance_after_per_replica * routable.len() as u64;
                if self.cfg.rebalance && warm {
                    let min = match global_min {
                        Some(min) => min,
                        None => self.cheapest(all.clone(), now).expect("replicas"),
                    };
                    let (t_choice, t_min) = (self.total(choice, now), self.total(min, now));
                    if t_choice > self.cfg.rebalance_threshold * t_min && self.is_most_loaded(choice, t_choice, now) {
                        self.rebalanced += 1;
                        choice = min;
                    }
                }
                choice
            }
            _ => {
                self.explore += 1;
                // The decode-heavy test runs with pairing off too, for the trace; so does the
                // cheapest replica with pairing on. Neither changes the decision.
                let heavy = self.decode_heavy(now);
                let cheapest = self.cheapest(all, now).expect("replicas");
                match heavy {
                    Some((r, hit_ratio)) => {
                        let pairable = pairing::Pairable {
                            request: request.id,
                            segments,
                            prompt_tokens: request.prompt_tokens,
                            cached_tokens: cached,
                            heavy: self.members.index_of(r).expect("routable"),
                            hit_ratio,
                            cheapest: self.members.index_of(cheapest).expect("routable"),
                            cheapest_hit_ratio: self.hit_ratio(cheapest, now),
                            l_excess_s: self.costs[r].l - self.costs[cheapest].l,
                        };
                        self.pairing_trace.pairable(pairable, replicas);
                        if self.cfg.pd_pairing {
                            self.paired += 1;
                            r
                        } else {
                            cheapest
                        }
                    }
                    None => cheapest,
                }
            }
        };
        self.total(chosen, now);
        let c = self.costs[chosen];
        self.sums.l += c.l;
        self.sums.m += c.m;
        self.sums.p += c.p;
        let index = self.members.index_of(chosen).expect("only routable replicas are candidates");
        self.carried.keep(request, index, prefix_key)
    }

    fn on_dispatch(&mut self, request: &Request<'_>, replica: usize) {
        let replica = self.members.id(replica);
        let now = request.arrived_at;
        let segments = request.segments();
        let kept = self.carried.take(request);
        let matched = if kept.is_some() { self.matches[replica] } else { self.tree.match_tokens(segments, replica) };
        let missed = request.prompt_tokens.saturating_sub(matched) as u64;
        let w = &mut self.replicas[replica];
        w.prefill_s.add(now, self.model.prefill_time_s(missed, matched as u64));
        w.prompt_tokens.add(now, request.prompt_tokens as f64);
        w.cached_tokens.add(now, matched as f64);
        self.prompts.add(now, request.prompt_tokens as f64);
        self.node_hits.expire(now);
        let mut key = ROOT_PATH_HASH;
        for s in segments {
            key = extend_path_hash(key, s.id);
            self.node_hits.add(now, key);
        }
        if let Some(k) = kept.and_then(|k| k.decision) {
            self.in_flight_prefix.insert(request_key(request.id), k);
        }
        self.tree.insert(segments, replica);
        self.dispatched += 1;
        if self.dispatched % 4096 == 0 {
            // Forget prefixes with no traffic left in the window (`node_hits` forgets by itself).
            self.prefix_ttft.retain(|_, w| w.count(now) > 0);
        }
    }

    fn on_complete(&mut self, c: &Completion) {
        let t = c.completed_at;
        self.outputs.add(t, c.output_tokens as f64);
        self.pairing_trace.complete(c.request_id, t - c.arrived_at);
        self.ttft.add(t, c.ttft);
        if let Some(k) = self.in_flight_prefix.remove(&request_key(c.request_id)) {
            self.prefix_ttft.entry(k).or_insert_with(|| WindowSum::new(self.cfg.window_s)).add(t, c.ttft);
        }
    }

    fn on_evict(&mut self, e: &Eviction<'_>) {
        if let Some(r) = self.members.get(e.replica_index()) {
            self.tree.release_path(e.path(), r, e.remaining_tokens);
        }
    }

    /// A replica that leaves is forgotten: its share of the tree and its windows.
    fn on_replica_change(&mut self, change: &ReplicaChange) {
        if let Some(Member::Left(id)) = self.members.change(change) {
            let held = self.tree.held_tokens(id);
            self.tree.evict_lru(id, held);
            let w = &mut self.replicas[id];
            w.prefill_s = WindowSum::new(self.cfg.window_s);
            w.prompt_tokens = WindowSum::new(self.cfg.pd_window_s);
            w.cached_tokens = WindowSum::new(self.cfg.pd_window_s);
            self.carried.clear();
        }
    }

    fn report(&self) -> Vec<(String, f64)> {
        let n = (self.exploit + self.explore).max(1) as f64;
        let mut out = vec![
            ("cost_l_mean_s".into(), self.sums.l / n),
            ("cost_m_mean_s".into(), self.sums.m / n),
            ("cost_p_mean_s".into(), self.sums.p / n),
            ("exploit_decisions".into(), self.exploit as f64),
            ("explore_decisions".into(), self.explore as f64),
            ("rebalanced_decisions".into(), self.rebalanced as f64),
            ("pd_paired_decisions".into(), self.paired as f64),
            ("autoscaled_decisions".into(), self.autoscaled as f64),
        ];
        self.pairing_trace.report(&mut out);
        out
    }
}
