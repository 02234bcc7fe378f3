//! Prefill/decode disaggregation (xPyD) in the cluster world: the same [`ClusterSim`] with its
//! replicas split into a prefill pool (`0..split`) and a decode pool (`split..`), one more event
//! (a KV transfer's end) and the handlers around it.
//!
//! A request's life: the router ([`crate::handle::RouterHandle::dispatch_pair`]) returns a
//! [`PdDecision`]. `DISAGGREGATE`: the prefill instance queues it like any request but generates
//! only the first token, then hands it off (`Phase::Transfer`; its prompt stays in the prefill
//! cache, unpinned). The decode instance must then find KV memory for it — the prompt's
//! uncached part plus the output reservation, exactly as an admission — *before* the transfer
//! starts (the transfer occupies decode memory from its start); until it does, handed-off
//! requests wait per decode instance in FIFO order. The transfer takes
//! `base_latency + tokens × kv_bytes_per_token / (bandwidth / concurrent)`, `concurrent` counting
//! the transfers in flight into that decode instance when it starts (this one included; a
//! transfer's time is fixed at its start), `tokens` = the prompt tokens the decode instance lacks
//! (`transfer: missing`) or the whole prompt (`full_prompt`). At its end the prompt's KV is
//! computed on the decode instance, the first token reaches the user (TTFT includes the
//! transfer) and the request decodes its remaining tokens there. `DECODE_ONLY`: the decode
//! instance queues and prefills the request itself (conditional disaggregation). `REJECT`: the
//! request is counted and never served.
//!
//! Layer-wise transfers (`link: {layerwise: true}`): a transfer that starts at its hand-off
//! streamed alongside the prefill, so it ends at [`Link::layerwise_end`] (the later of prefill
//! start + transfer and prefill end + one layer's share); one that waited for decode memory did
//! not overlap. Memory is reserved at the hand-off either way.
//!
//! Shared KV tier (`shared_kv:`, [`super::kv_tier`]): a prefill instance puts each prompt it
//! hands off; before a prompt joins a prefill (or decode-only) instance's queue, the part of its
//! prefix the tier holds beyond that instance's cache is loaded, as a migration is (below), and
//! the request queues when it lands. A prefix migration, when the router asks for one, replaces
//! the tier load.
//!
//! Mixed instances (`mixed:`) sit between the pools (`decode_start..prefill_end`): prefill
//! candidates for the router's `prefill` view, decode candidates for its `decode` view. Whether
//! an instance hands a request off is per request (`RequestState::handoff`): a `DISAGGREGATE`
//! pair naming one mixed instance on both sides runs there like any aggregated request.
//!
//! Metrics added to the cluster's (which then cover served requests, `rejected` excluded):
//! `transfer_time_mean_s` (over transferred requests), `transfer_share` (Σ transfer
//! time ÷ Σ latency over them); `prefill_utilisation`, `decode_utilisation` (share of
//! instance-time spent in steps: every instance from the first arrival to the last completion,
//! or with autoscaling the pool's paid replica-seconds, `fleet.rs`); `prefill_hit_rate` (prompt
//! tokens cached at prefill admission ÷ prompt tokens, transferred requests) and
//! `decode_hit_rate` (prompt tokens the decode instance already held, at transfer start or at its
//! own admission ÷ prompt tokens, every served request); `decode_only_share`; `rejected`;
//! `prefix_migrations`; with a tier, `tier_hit_rate` (tokens loaded ÷ prompt tokens, served
//! requests) and `tier_tokens_loaded`.
//!
//! Admission control (`cluster.admission`) stands in front of the P/D router as it does in front
//! of an aggregated one, through the same calls (`ClusterSim::arrive`, `release_held`): its views
//! are every instance's (prefill, mixed, then decode), a held request meets the router when it is
//! released, a rejected or shed one never does (and counts in neither `rejected` nor
//! `decode_only_share`'s served requests). Capacity also frees when a request completes at its
//! transfer's end, so held requests are offered then too.
//!
//! Prefix migration (`PdDecision::prefix_from`, Mooncake): before the prefill, the whole prompt
//! segments cached on the source prefill instance that the chosen one lacks are copied over one
//! link (`base + tokens × kv_bytes / bandwidth`, not shared with decode transfers); the request
//! joins the chosen instance's queue when the copy lands, and the copy is cached there (unpinned;
//! skipped if pinned memory leaves no room).

use std::collections::VecDeque;

use routelab_policy_api::{Completion, PdDecision, PdPool, Request};

use super::kv_tier::KvTier;
use super::replica::{Phase, Replica};
use super::{ClusterSim, Event, RequestRecord};
use crate::error::RunError;
use crate::ids::{ReplicaId, RequestId, RouterIndex};
use crate::metrics::Metrics;
use crate::time::{SimTime, seconds, ticks};
use crate::workload::cluster::disaggregation::{Disaggregation, Link, TransferTokens};

/// The disaggregated cluster's own state.
pub(super) struct Pd {
    /// Instances are laid out prefill-only `0..decode_start`, mixed `decode_start..prefill_end`,
    /// decode-only `prefill_end..`: the prefill candidates are `0..prefill_end`, the decode
    /// candidates `decode_start..` (both include the mixed ones).
    pub decode_start: usize,
    pub prefill_end: usize,
    /// `decode_start` in router indices (the routable set, `routable.rs`): the decode
    /// candidates are router indices `r_decode_start..`, the prefill ones
    /// `0..`[`Pd::r_prefill_end`]. Equal to `decode_start` while every instance is up; a crashed
    /// prefill-only instance leaves the range below it, and one that restarts rejoins at its top.
    pub r_decode_start: usize,
    /// Mixed instances routable now (router indices `r_decode_start..r_prefill_end()`): a
    /// crashed one leaves that range, and one that restarts rejoins at its top.
    pub r_mixed: usize,
    link: Link,
    transfer: TransferTokens,
    kv_bytes_per_token: f64,
    /// The model's layers (layer-wise transfers move one layer's KV at a time).
    layers: u32,
    /// Per request: when its prefill ended (its hand-off), for layer-wise transfers.
    handoff_at: Vec<SimTime>,
    /// Requests prefilled and decoded on one mixed instance (no transfer).
    local: u64,
    /// Per decode candidate: transfers in flight into it.
    pub(super) active: Vec<u32>,
    /// Per decode candidate: handed-off requests waiting for its KV memory, in hand-off order.
    pub(super) waiting: Vec<VecDeque<RequestId>>,
    /// Per request: its decode instance, once decided.
    pub(super) decode_of: Vec<Option<ReplicaId>>,
    /// Per request: the transfer's duration (NaN when it had none).
    pub transfer_s: Vec<f64>,
    /// Per request: prompt tokens its decode instance already held.
    pub(super) decode_cached: Vec<u32>,
    pub rejected: Vec<bool>,
    decode_only: u64,
    /// Per request being migrated: its prefill instance and the prompt segments copied to it.
    pub(super) migrating: Vec<(ReplicaId, u32)>,
    /// Prefix copies between prefill instances carried out.
    migrations: u64,
    /// The shared KV tier, if any.
    pub(super) tier: Option<KvTier>,
    /// Per request: prompt tokens its prefilling instance loaded from the tier (0: none; > 0
    /// while `migrating` holds its load).
    pub tier_loaded: Vec<u32>,
    /// Requests whose prefix migration or tier load is in flight (lost if their prefill
    /// instance crashes first: `pd_failures.rs`).
    pub in_flight: Vec<RequestId>,
    /// Per request: its decode instance crashed before its hand-off; the router was told it
    /// was abandoned, and it is lost when its prefill ends (`pd_failures.rs`).
    pub orphan: Vec<bool>,
    /// Per request: the prefill instance that handed it off (`None` before its hand-off, and
    /// once its KV is handed over); a draining prefill instance stays until its hand-offs'
    /// transfers end (`fleet_pd.rs`).
    pub(super) prefill_of: Vec<Option<ReplicaId>>,
    /// Per prefill instance: the requests it handed off whose transfer has not ended.
    pub(super) handing: Vec<u32>,
}

impl Pd {
    /// `slots`: with autoscaling, the prefill and decode pools' slots (`autoscaling.pools`'
    /// `max_replicas`; the instances up at the start are the first of each pool's); else each
    /// pool has its instances.
    pub fn new(
        d: &Disaggregation,
        slots: Option<(u32, u32)>,
        kv_bytes_per_token: f64,
        layers: u32,
        requests: usize,
    ) -> Self {
        let (prefill_slots, decode_slots) =
            slots.unwrap_or((d.prefill.instances, d.decode.instances + d.mixed_instances()));
        let decode = decode_slots as usize;
        Self {
            decode_start: prefill_slots as usize,
            prefill_end: (prefill_slots + d.mixed_instances()) as usize,
            r_decode_start: d.prefill.instances as usize,
            r_mixed: d.mixed_instances() as usize,
            local: 0,
            link: d.link.clone(),
            transfer: d.transfer,
            kv_bytes_per_token,
            layers,
            handoff_at: if d.link.layerwise { vec![SimTime::ZERO; requests] } else { Vec::new() },
            active: vec![0; decode],
            waiting: vec![VecDeque::new(); decode],
            decode_of: vec![None; requests],
            transfer_s: vec![f64::NAN; requests],
            decode_cached: vec![0; requests],
            rejected: vec![false; requests],
            decode_only: 0,
            migrating: vec![(ReplicaId::default(), 0); requests],
            migrations: 0,
            tier: d.shared_kv.as_ref().map(|t| KvTier::new(t, kv_bytes_per_token)),
            tier_loaded: if d.shared_kv.is_some() { vec![0; requests] } else { Vec::new() },
            in_flight: Vec::new(),
            orphan: Vec::new(),
            prefill_of: vec![None; requests],
            handing: vec![0; (prefill_slots + d.mixed_instances()) as usize],
        }
    }
}

impl Pd {
    /// Request `id`'s KV is no longer its prefill instance's to send (its transfer ended, or
    /// the request was lost or failed).
    pub(super) fn handed_over(&mut self, id: RequestId) {
        if let Some(p) = self.prefill_of[id].take() {
            self.handing[p] -= 1;
        }
    }

    /// `prefill_end` in router indices: the routable mixed instances follow the routable
    /// prefill-only ones.
    pub fn r_prefill_end(&self) -> usize {
        self.r_decode_start + self.r_mixed
    }

    /// Router index `k` in pool `pool`'s own indices, as its router numbers the candidates: a
    /// prefill candidate's is its router index, a decode candidate's its router index −
    /// `r_decode_start` (the one place that offset is taken; [`Pd::router_index`] adds it back).
    pub fn pool_index(&self, k: RouterIndex, pool: PdPool) -> u32 {
        match pool {
            PdPool::Prefill => k.raw(),
            PdPool::Decode => k.raw() - self.r_decode_start as u32,
        }
    }

    /// The router index of pool `pool`'s candidate `i` (the router's answer): the inverse of
    /// [`Pd::pool_index`].
    pub fn router_index(&self, pool: PdPool, i: u32) -> RouterIndex {
        match pool {
            PdPool::Prefill => RouterIndex::from_u32(i),
            PdPool::Decode => RouterIndex::new(self.r_decode_start + i as usize),
        }
    }

    /// Whether instance `s` is a mixed one (a candidate of both pools).
    pub fn is_mixed(&self, s: ReplicaId) -> bool {
        (self.decode_start..self.prefill_end).contains(&s.index())
    }

    /// Whether instance `s` is a prefill-only one (below `decode_start`).
    pub fn is_prefill_only(&self, s: ReplicaId) -> bool {
        s.index() < self.decode_start
    }

    /// Whether instance `s` is a prefill candidate: prefill-only or mixed (below `prefill_end`).
    pub fn prefills(&self, s: ReplicaId) -> bool {
        s.index() < self.prefill_end
    }

    /// Decode candidate `d`'s row in the per-decode-candidate tables (`active`, `waiting`): its
    /// slot − `decode_start` (the one place that offset is taken); `None` for a prefill-only
    /// instance.
    pub fn decode_row(&self, d: ReplicaId) -> Option<usize> {
        d.index().checked_sub(self.decode_start)
    }
}

impl ClusterSim<'_> {
    /// A request arrives at a disaggregated cluster: the router decides with both pools' views.
    pub(super) fn on_arrival_pd(&mut self, now: SimTime, id: RequestId, req: &Request<'_>) -> Result<(), RunError> {
        let pd = self.pd.as_ref().expect("disaggregated");
        let (first, end) = (pd.r_decode_start, pd.r_prefill_end());
        // The request's class, tenant and SLO, as an aggregated router sees them.
        let decision = self.router.dispatch_pair(req, &self.infos[id], &self.views, end, first)?;
        // The pools' indices to instances (slots).
        let routable = &self.routable;
        let slot = |pd: &Pd, pool, i| routable[pd.router_index(pool, i)];
        let stream = &*self.stream;
        let prompt = stream.prompt(id.index());
        let pd = self.pd.as_mut().expect("disaggregated");
        let target = match decision.action {
            PdDecision::DISAGGREGATE => {
                let (p, d) = (slot(pd, PdPool::Prefill, decision.prefill), slot(pd, PdPool::Decode, decision.decode));
                pd.decode_of[id] = Some(d);
                if p == d {
                    // One mixed instance both prefills and decodes: nothing to transfer.
                    pd.local += 1;
                    return self.prefill_at(now, id, d);
                }
                super::kept::here_mut(&mut self.states, id).handoff = true;
                if decision.prefix_from != PdDecision::NO_SOURCE && slot(pd, PdPool::Prefill, decision.prefix_from) != p
                {
                    let src = slot(pd, PdPool::Prefill, decision.prefix_from);
                    // Copy the whole segments of the prompt cached on `src` that `p` lacks.
                    let have = self.replicas[p].cached_prefix(prompt);
                    // What `src` holds in GPU memory, continued in its CPU tier (`kv_tiers`).
                    let there = self.replicas[src].cached_prefix_with_cpu(prompt);
                    let (mut n, mut tokens) = (0, 0);
                    while n < prompt.len() && tokens + prompt[n].tokens <= there {
                        tokens += prompt[n].tokens;
                        n += 1;
                    }
                    if tokens > have {
                        let dur = pd.link.transfer_time_s(tokens - have, pd.kv_bytes_per_token, 1);
                        pd.migrating[id] = (p, n as u32);
                        pd.in_flight.push(id);
                        let generation = self.state(id).generation;
                        self.queue.push(now + ticks(dur).max(SimTime::TICK), Event::MigrationEnd { id, generation });
                        return Ok(());
                    }
                }
                p
            }
            PdDecision::DECODE_ONLY => {
                let d = slot(pd, PdPool::Decode, decision.decode);
                pd.decode_of[id] = Some(d);
                pd.decode_only += 1;
                d
            }
            _ => {
                pd.rejected[id] = true;
                self.state_mut(id).phase = Phase::Done;
                self.done += 1;
                self.abandon_dependents(id);
                return Ok(());
            }
        };
        self.prefill_at(now, id, target)
    }

    /// Request `id` prefills on `target`: after a load from the shared tier if it holds more of
    /// the prompt than `target` does, at once otherwise.
    fn prefill_at(&mut self, now: SimTime, id: RequestId, target: ReplicaId) -> Result<(), RunError> {
        if self.load_from_tier(now, id, target) {
            return Ok(());
        }
        self.join_queue(now, id, target)
    }

    /// Request `id` is about to prefill on `target`: if the shared tier holds more of its prompt
    /// than `target`'s cache, that part is loaded first (the request waits for it, as for a
    /// migration); returns whether a load started.
    fn load_from_tier(&mut self, now: SimTime, id: RequestId, target: ReplicaId) -> bool {
        let Some(tier) = self.pd.as_mut().and_then(|pd| pd.tier.as_mut()) else { return false };
        let prompt = self.stream.prompt(id.index());
        let (n, held) = tier.get(prompt);
        let have = self.replicas[target].cached_prefix(prompt);
        if held <= have {
            return false;
        }
        let dur = tier.load_time_s((held - have) as u64);
        tier.loading += 1;
        let pd = self.pd.as_mut().expect("disaggregated");
        pd.tier_loaded[id] = held - have;
        pd.migrating[id] = (target, n as u32);
        pd.in_flight.push(id);
        let generation = self.state(id).generation;
        self.queue.push(now + ticks(dur).max(SimTime::TICK), Event::MigrationEnd { id, generation });
        true
    }

    /// Request `id` joins `target`'s queue at `now` (a prefill instance keeps only its first
    /// token); an idle instance starts.
    fn join_queue(&mut self, now: SimTime, id: RequestId, target: ReplicaId) -> Result<(), RunError> {
        let out = self.state(id).output_here(self.stream.request(id.index()).output_tokens);
        let st = super::kept::hand(&mut self.states, id, target);
        let rep = &mut self.replicas[target];
        let cfg = &self.cfgs[super::pool_of(self.pd.as_ref(), target)];
        rep.enqueue(now, id, self.stream.prompt(id.index()), out, st, cfg);
        if !rep.busy() {
            self.start_step(target, now)?;
        }
        Ok(())
    }

    /// Prefill instance `p` finished request `id`'s prefill at `now`: the router hears of it and
    /// the request queues for its decode instance's memory.
    pub(super) fn on_handoff(&mut self, now: SimTime, p: ReplicaId, id: RequestId) -> Result<(), RunError> {
        if self.pd.as_ref().is_some_and(|pd| pd.orphan.get(id.index()) == Some(&true)) {
            return self.orphan_handed_off(now, id);
        }
        let (q, st) = (self.stream.request(id.index()), self.state(id));
        let pd = self.pd.as_ref().expect("disaggregated");
        let c = Completion {
            request_id: id.raw() as u64,
            replica: pd.pool_index(self.index_of[p], PdPool::Prefill),
            arrived_at: seconds(st.arrived_at),
            completed_at: seconds(now),
            ttft: seconds(now - st.arrived_at),
            prompt_tokens: q.prompt_tokens,
            cached_tokens: st.cached_tokens,
            output_tokens: q.output_tokens,
        };
        self.router.prefill_complete(&c)?;
        let pd = self.pd.as_mut().expect("disaggregated");
        if let Some(tier) = &mut pd.tier {
            tier.put(self.stream.prompt(id.index()));
        }
        let d = pd.decode_of[id].expect("a handed-off request's decode instance is decided");
        pd.prefill_of[id] = Some(p);
        pd.handing[p] += 1;
        if pd.link.layerwise {
            pd.handoff_at[id] = now;
        }
        let k = pd.decode_row(d).expect("a decode instance");
        pd.waiting[k].push_back(id);
        self.start_transfers(now, d);
        Ok(())
    }

    /// Starts the transfers into decode instance `d` that its memory now admits, in hand-off
    /// order (the first that does not fit stops the rest, as admission does). Nothing for a
    /// prefill instance or an aggregated cluster.
    pub(super) fn start_transfers(&mut self, now: SimTime, d: ReplicaId) {
        let Some(pd) = self.pd.as_mut() else { return };
        let Some(k) = pd.decode_row(d) else { return };
        // A mixed instance takes transfers too, with its own pool's memory (not the decode pool's).
        let cfg = &self.cfgs[super::pool_of(Some(&*pd), d)];
        while let Some(&id) = pd.waiting[k].front() {
            let table = &mut self.states;
            let take = || super::kept::hand(table, id, d);
            let Some(cached) = self.replicas[d].admit_transfer(id, &self.stream, take, cfg) else { break };
            pd.waiting[k].pop_front();
            let prompt = self.stream.request(id.index()).prompt_tokens;
            let tokens = match pd.transfer {
                TransferTokens::Missing => prompt - cached,
                TransferTokens::FullPrompt => prompt,
            };
            pd.active[k] += 1;
            let dur = pd.link.transfer_time_s(tokens, pd.kv_bytes_per_token, pd.active[k]);
            let (end, shown) = if pd.link.layerwise {
                // The stream overlapped the prefill only if the decode side had room at once
                // (memory is reserved here, at the hand-off: an approximation that holds it for
                // less time than a real layer-wise transfer, which needs it from the start).
                let ended = pd.handoff_at[id];
                let started = if now == ended { self.replicas[d].state(id).admitted_at.unwrap_or(now) } else { now };
                let end = pd.link.layerwise_end(dur, pd.layers, seconds(started), seconds(ended));
                let end = ticks(end).max(now + SimTime::TICK);
                // What the request waits after its prefill: the part the overlap did not hide.
                (end, seconds(end - now))
            } else {
                (now + ticks(dur).max(SimTime::TICK), dur)
            };
            pd.transfer_s[id] = shown;
            pd.decode_cached[id] = cached;
            self.queue.push(end, Event::TransferEnd { id, generation: self.replicas[d].state(id).generation });
        }
    }

    /// The prefix of request `id` (migrated from another prefill instance, or loaded from the
    /// shared tier) reached its instance at `now`: cached there (if memory allows), the request
    /// joins that instance's queue.
    pub(super) fn on_migration_end(&mut self, now: SimTime, id: RequestId) -> Result<(), RunError> {
        let pd = self.pd.as_mut().expect("disaggregated");
        let (p, n) = pd.migrating[id];
        if let Some(k) = pd.in_flight.iter().position(|&x| x == id) {
            pd.in_flight.swap_remove(k);
        }
        let from_tier = pd.tier_loaded.get(id.index()).is_some_and(|&t| t > 0);
        let prompt = self.stream.prompt(id.index());
        let cfg = &self.cfgs[super::pool_of(Some(pd), p)];
        let landed = self.replicas[p].insert_prefix(&prompt[..n as usize], cfg);
        match pd.tier.as_mut() {
            Some(tier) if from_tier => {
                tier.loading -= 1;
                if landed {
                    tier.loads += 1;
                    tier.loaded_tokens += pd.tier_loaded[id] as u64;
                } else {
                    pd.tier_loaded[id] = 0;
                }
            }
            _ => pd.migrations += landed as u64,
        }
        self.join_queue(now, id, p)
    }

    /// Request `id`'s KV arrived at its decode instance at `now`.
    pub(super) fn on_transfer_end(&mut self, now: SimTime, id: RequestId) -> Result<(), RunError> {
        let pd = self.pd.as_mut().expect("disaggregated");
        let d = pd.decode_of[id].expect("a transferred request's decode instance is decided");
        let k = pd.decode_row(d).expect("a decode instance");
        pd.active[k] -= 1;
        // The prefill instance's part is over: a draining one may go (`fleet_pd.rs`).
        pd.handed_over(id);
        let cfg = &self.cfgs[super::pool_of(Some(&*pd), d)];
        let finished = self.replicas[d].begin_decode(id, now, &self.stream, cfg);
        if finished {
            self.take_back(id);
            self.report_completion(now, d, id)?;
            self.start_transfers(now, d);
        }
        if !self.replicas[d].busy() {
            self.start_step(d, now)?;
        }
        if finished {
            // Capacity freed without a step's end: held requests may go (as after a step).
            self.release_held(now)?;
        }
        self.settle_drains(now);
        Ok(())
    }

    /// The disaggregation metrics (see the module docs), from the served requests' records;
    /// `end` is the run's last completion.
    pub(super) fn pd_metrics(&self, records: &[RequestRecord], end: SimTime, m: &mut Metrics) {
        let pd = self.pd.as_ref().expect("disaggregated");
        let served = |i: &usize| !pd.rejected[*i];
        let done: Vec<usize> =
            (0..records.len()).filter(served).filter(|&i| records[i].completed_at_s.is_finite()).collect();
        let moved: Vec<usize> = done.iter().copied().filter(|&i| pd.transfer_s[i].is_finite()).collect();
        let sum = |f: &dyn Fn(usize) -> f64| moved.iter().map(|&i| f(i)).sum::<f64>();
        let transfer = sum(&|i| pd.transfer_s[i]);
        let latency = sum(&|i| records[i].completed_at_s - records[i].arrived_at_s);
        m.push("transfer_time_mean_s", if moved.is_empty() { f64::NAN } else { transfer / moved.len() as f64 });
        m.push("transfer_share", if latency > 0.0 { transfer / latency } else { f64::NAN });
        let first = records.first().map_or(0.0, |r| r.arrived_at_s);
        let last = done.iter().map(|&i| records[i].completed_at_s).fold(first, f64::max);
        let span = last - first;
        // Busy time over the pool's instance-time: with a scaler, the replica-seconds it paid for
        // (its `replica_seconds_prefill`/`_decode`); else every instance over the span.
        let util = |pool: &[Replica], paid: Option<f64>| {
            let busy: f64 = pool.iter().map(|r| r.busy_s()).sum();
            match paid {
                Some(paid) if paid > 0.0 => busy / paid,
                None if span > 0.0 => busy / (span * pool.len() as f64),
                _ => f64::NAN,
            }
        };
        let paid = |k: usize| self.fleet.as_ref().map(|f| f.pool_paid_seconds(k, end));
        m.push("prefill_utilisation", util(&self.replicas[..pd.decode_start], paid(0)));
        m.push("decode_utilisation", util(&self.replicas[pd.prefill_end..], paid(1)));
        let ratio = |idx: &mut dyn Iterator<Item = usize>, cached: &dyn Fn(usize) -> u32| {
            let (c, p) =
                idx.fold((0u64, 0u64), |(c, p), i| (c + cached(i) as u64, p + records[i].prompt_tokens as u64));
            if p > 0 { c as f64 / p as f64 } else { f64::NAN }
        };
        m.push("prefill_hit_rate", ratio(&mut moved.iter().copied(), &|i| records[i].cached_tokens));
        let decode_cached =
            |i: usize| if pd.transfer_s[i].is_finite() { pd.decode_cached[i] } else { records[i].cached_tokens };
        m.push("decode_hit_rate", ratio(&mut done.iter().copied(), &decode_cached));
        // Served: neither rejected by the router nor turned away by admission control.
        let served_n = (0..records.len()).filter(|&i| !pd.rejected[i] && records[i].end == super::End::Served).count();
        m.push("decode_only_share", if served_n > 0 { pd.decode_only as f64 / served_n as f64 } else { f64::NAN });
        m.push("rejected", pd.rejected.iter().filter(|r| **r).count() as f64);
        m.push("prefix_migrations", pd.migrations as f64);
        if pd.prefill_end > pd.decode_start {
            // (Mixed instances never autoscale.)
            m.push("mixed_utilisation", util(&self.replicas[pd.decode_start..pd.prefill_end], None));
            m.push("local_share", if served_n > 0 { pd.local as f64 / served_n as f64 } else { f64::NAN });
        }
        if let Some(tier) = &pd.tier {
            let prompts: u64 = done.iter().map(|&i| records[i].prompt_tokens as u64).sum();
            let loaded: u64 = done.iter().map(|&i| pd.tier_loaded[i] as u64).sum();
            m.push("tier_hit_rate", if prompts > 0 { loaded as f64 / prompts as f64 } else { f64::NAN });
            m.push("tier_tokens_loaded", tier.loaded_tokens as f64);
        }
    }
}
