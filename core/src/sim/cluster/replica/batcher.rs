//! Continuous batching: how a replica forms a step and what finishing it does.
//!
//! A step, formed at its start: (1) make KV room for one new token per decoding request and for
//! prefills that may finish (evicting unpinned cache; under `estimate` reservation, preempting the
//! newest request if that is not enough); (2) give the prefill budget (`chunk_tokens`, or
//! `max_step_tokens` unchunked) to requests still in prefill, in admission order; (3) while budget,
//! batch slots and KV memory last, admit waiting requests in the order the local scheduler returns
//! (the first that does not fit stops admission: no skipping ahead, as in vLLM and SGLang).
//! The step costs `CostModel::step_time_s` of the decode batch merged with every prefill chunk.
//! Finishing it: chunks advance and mark cache nodes computed; a request whose prefill completes
//! emits its first token (TTFT) and starts decoding; decoders finish after exactly
//! `output − produced` more steps (a heap keyed by step, so a step costs O(changes), not O(batch)).
//! A plain decode step — the last one prefilled nothing and finished nobody, nothing waits — is
//! ended and the next formed in one call (`next_decode_step`): most steps of a long decode.

use super::{Held, Phase, Replica, ReplicaConfig, reserve_tokens};
use crate::error::RunError;
use crate::handle::SchedulerHandle;
use crate::ids::RequestId;
use crate::sim::cluster::kv_tier::KvTier;
use crate::step_model::{Chunk, Pricer, Step};
use crate::time::{SimTime, seconds};
use crate::workload::cluster::Reservation;
use crate::workload::generate::RequestStream;

impl Replica {
    /// Forms the step starting at `now`. Returns its duration in seconds, or `None` when there is
    /// nothing to run (the replica goes idle until the next arrival); the replica is busy while
    /// the step runs.
    pub fn start_step(
        &mut self,
        now: SimTime,
        stream: &RequestStream,
        cfg: &ReplicaConfig,
        pricer: &Pricer,
        scheduler: &mut SchedulerHandle,
    ) -> Result<Option<f64>, RunError> {
        let step = self.with_held(|rep, held| rep.form_step(now, stream, held, cfg, pricer, scheduler, None))?;
        self.busy = step.is_some();
        Ok(step)
    }

    /// The cluster world's [`Replica::start_step`]: nothing to form without work, and the
    /// replica may have KV tiers (`tiers.rs`), `remote` the cluster's shared tier: admissions
    /// load what the tiers hold, the step waits for the loads, and what the GPU cache evicted
    /// goes down. The replica is busy while the step runs, idle otherwise.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::sim::cluster) fn start_step_tiered(
        &mut self,
        now: SimTime,
        stream: &RequestStream,
        cfg: &ReplicaConfig,
        pricer: &Pricer,
        scheduler: &mut SchedulerHandle,
        remote: Option<&mut KvTier>,
    ) -> Result<Option<f64>, RunError> {
        let step = match self.has_work() {
            true => self.with_held(|rep, held| rep.form_step(now, stream, held, cfg, pricer, scheduler, remote))?,
            false => None,
        };
        self.busy = step.is_some();
        Ok(step)
    }

    /// Forms the step starting at `now`: its duration in seconds, `None` when nothing runs.
    #[allow(clippy::too_many_arguments)]
    fn form_step(
        &mut self,
        now: SimTime,
        stream: &RequestStream,
        states: &mut Held,
        cfg: &ReplicaConfig,
        pricer: &Pricer,
        scheduler: &mut SchedulerHandle,
        mut remote: Option<&mut KvTier>,
    ) -> Result<Option<f64>, RunError> {
        // Every finished request's state was given back (`release`): none is left behind.
        debug_assert_eq!(states.0.len(), self.waiting.len() + self.running.len(), "replica {}: held states", self.id);
        self.chunks.clear();
        // (1) Room for this step's new tokens: one per decoder, one per prefill that may finish.
        // (0) Under priority preemption, room for the most important waiting request first.
        self.preempt_for_waiting(stream, states, cfg, scheduler);
        let mut need = self.decoding as u64 + self.prefilling.len() as u64;
        while self.cache.pinned_tokens() + self.private_tokens + need > cfg.kv_capacity_tokens {
            debug_assert!(matches!(cfg.reservation, Reservation::Estimate { .. }), "full reservation never runs out");
            let Some(victim) = self.memory_victim(states, cfg, scheduler) else {
                break;
            };
            self.preempt(victim, stream, states, cfg);
            need = self.decoding as u64 + self.prefilling.len() as u64;
        }
        self.make_room(need, cfg);
        self.decode_batch = self.decoding;
        self.private_tokens += self.decoding as u64;

        // (2) Requests already prefilling keep their place.
        let mut budget = match cfg.budget_counts_decode {
            true => cfg.step_prefill_budget.saturating_sub(self.decode_batch),
            false => cfg.step_prefill_budget,
        };
        for &r in &self.prefilling {
            if budget == 0 {
                break;
            }
            let st = &states[r];
            let left = st.prefill_target - st.prefill_done;
            let n = left.min(budget);
            budget -= n;
            self.chunks.push((r, n));
            if n == left {
                self.private_tokens += 1;
            }
        }

        // (3) Admissions in the scheduler's order, of the requests taken in when the batch was
        // formed (one step ahead under async scheduling, with the slots of requests that just
        // finished still held: `async_sched.rs`).
        let (taken_in_by, held) = self.look_ahead(now, states, cfg);
        let slots = cfg.max_batch_requests.saturating_sub(held) as usize;
        if budget > 0 && !self.blocked && !self.waiting.is_empty() && self.running.len() < slots {
            self.fill_views(stream, states, cfg, taken_in_by);
            self.ask_scheduler(scheduler, seconds(now))?;
            let mut admitted = false;
            for k in 0..self.order.len() {
                if budget == 0 || self.running.len() >= slots {
                    break;
                }
                let i = self.order[k] as usize;
                let r = self.shown[i];
                // A batch uses at most `max_loras` adapters: vLLM skips such a request.
                let adapter = crate::sim::cluster::lora::adapter_of(&self.lora, stream, r);
                if adapter.is_some_and(|a| !self.lora.as_ref().expect("tracked").can_run(a)) {
                    continue;
                }
                let req = stream.request(r.index());
                let prompt = stream.prompt(r.index());
                let st = &mut states[r];
                // The matched nodes go straight to `admit` (a waiting request's path is empty).
                debug_assert!(st.path.is_empty(), "a waiting request holds a path");
                let mut path = std::mem::take(&mut st.path);
                let plan = self.cache.plan_path(prompt, &mut path);
                let redo = st.prefill_target - req.prompt_tokens;
                let output_here = st.output_here(req.output_tokens);
                let reserve = reserve_tokens(cfg, st, req);
                if self.committed_tokens(cfg) + plan.newly_pinned_tokens + plan.new_tokens + reserve
                    > cfg.kv_capacity_tokens
                {
                    path.clear();
                    st.path = path;
                    self.blocked = true;
                    break;
                }
                // At least one token is computed, so the first token has a step; none for an empty prompt.
                let most = st.prefill_target.saturating_sub(1);
                let gpu_cached = plan.cached_tokens.min(most);
                // Past the GPU's match, what the tiers hold is loaded rather than computed.
                let loaded = match self.tiers.as_mut() {
                    Some(t) => t.lookup(prompt, plan.cached_tokens, remote.as_deref_mut()),
                    None => [0, 0],
                };
                let cached = (plan.cached_tokens + loaded[0] + loaded[1]).min(most);
                let left = st.prefill_target - cached;
                let n = left.min(budget);
                let private = redo as u64 + (n == left) as u64;
                let over = (self.kv_used_tokens() + plan.new_tokens + private).saturating_sub(cfg.kv_capacity_tokens);
                let events = cfg.report_evictions.then_some(&mut self.evictions);
                self.cache.admit(prompt, &mut path, over, events);
                st.path = path;
                self.private_tokens += private;
                if cfg.reservation == Reservation::Full {
                    self.reserved_output_tokens += output_here as u64;
                }
                debug_assert!(cached <= req.prompt_tokens, "cached tokens exceed the prompt");
                // The loaded tokens (CPU first, as the match runs) are computed once the step's
                // loads land, before its chunks.
                let from_cpu = loaded[0].min(cached - gpu_cached);
                let from_tiers = [from_cpu, cached - gpu_cached - from_cpu];
                if cached > gpu_cached {
                    mark_computed(&mut self.cache, prompt, &st.path, gpu_cached, cached);
                    self.tiers.as_mut().expect("loads come from tiers").add_load(from_tiers);
                }
                if st.admitted_at.is_none() {
                    st.admitted_at = Some(now);
                    st.cached_tokens = gpu_cached;
                    st.tier_loaded = from_tiers;
                }
                st.prefill_done = cached;
                st.phase = Phase::Prefill;
                self.outstanding_work -= cached as u64;
                budget -= n;
                self.chunks.push((r, n));
                self.prefilling.push_back(r);
                self.add_running(r, st);
                if let Some(a) = adapter {
                    self.lora.as_mut().expect("tracked").admit(a);
                }
                admitted = true;
            }
            if admitted {
                self.drop_admitted_from_front(states);
            }
        }

        debug_assert!(self.kv_used_tokens() <= cfg.kv_capacity_tokens, "replica {}: KV used exceeds capacity", self.id);
        if let Some(t) = self.tiers.as_mut() {
            t.cascade(&mut self.cache, remote.as_deref_mut());
        }
        if self.decode_batch == 0 && self.chunks.iter().all(|&(_, n)| n == 0) {
            return Ok(None);
        }
        self.step_chunks.clear();
        self.step_chunks.extend(
            self.chunks
                .iter()
                .map(|&(r, n)| Chunk { new_tokens: n as u64, context_tokens: states[r].prefill_done as u64 }),
        );
        let step = Step::mixed(self.decode_batch as u64, self.decode_context_tokens, &self.step_chunks);
        let compute_s = pricer.step_time_s(&step);
        let step_s = match self.tiers.as_mut() {
            Some(t) => t.step_time_s(compute_s, remote),
            None => compute_s,
        };
        // Cold adapter loads run before the step's forward pass (vLLM's `execute_model`).
        Ok(Some(match self.lora.as_mut().map(|l| l.take_step_load_s()) {
            Some(load_s) if load_s > 0.0 => step_s + load_s,
            _ => step_s,
        }))
    }

    /// The step that ended at `now` if it was a plain decode step, and the next one formed: the
    /// whole of [`Replica::finish_step`] and [`Replica::start_step_tiered`] when the ended step
    /// had no prefill chunk and finished no request, nothing waits or prefills, and the decode
    /// batch finds its KV room without preempting (no tiers, no adapters). Returns the next
    /// step's duration, or `None`, having changed nothing, when the general path must run.
    /// Most steps of a long decode are such steps; this one skips the general path's checks and
    /// scratch lists (the same arithmetic in the same order: `decode_steps_are_the_general_path`
    /// runs both on the same replicas).
    pub(in crate::sim::cluster) fn next_decode_step(
        &mut self,
        now: SimTime,
        cfg: &ReplicaConfig,
        pricer: &Pricer,
    ) -> Option<f64> {
        if !self.plain_decode_end(cfg) {
            return None;
        }
        self.advance_plain_decode(now, cfg);
        Some(pricer.step_time_s(&Step::mixed(self.decode_batch as u64, self.decode_context_tokens, &[])))
    }

    /// Whether the step ending now is a plain decode step whose successor is one too (the
    /// conditions of [`Replica::next_decode_step`]).
    #[inline]
    fn plain_decode_end(&self, cfg: &ReplicaConfig) -> bool {
        let need = self.decoding as u64;
        need > 0
            && self.chunks.is_empty()
            && self.waiting.is_empty()
            && self.prefilling.is_empty()
            && self.tiers.is_none()
            && self.lora.is_none()
            && self.finishing.peek().is_none_or(|&std::cmp::Reverse((at, _, _))| at > self.steps + 1)
            && self.cache.pinned_tokens() + self.private_tokens + need <= cfg.kv_capacity_tokens
    }

    /// The state change of a plain decode step ending at `now` and its successor forming
    /// (everything of [`Replica::next_decode_step`] but the pricing).
    #[inline]
    fn advance_plain_decode(&mut self, now: SimTime, cfg: &ReplicaConfig) {
        let need = self.decoding as u64;
        // `finish_step` without chunks or finishers.
        self.steps += 1;
        self.decode_context_tokens += self.decode_batch as u64;
        self.outstanding_work -= self.decode_batch as u64;
        self.last_finish = (now, 0);
        // `form_step` with nothing to admit or prefill.
        self.make_room(need, cfg);
        self.decode_batch = self.decoding;
        self.private_tokens += need;
        debug_assert!(self.kv_used_tokens() <= cfg.kv_capacity_tokens, "replica {}: KV used exceeds capacity", self.id);
    }

    /// The plain decode steps ending at `ends[..k]` (k = `ends.len()` − 1), each forming the
    /// next, which ends at the following entry: [`Replica::advance_plain_decode`] k times, with
    /// the KV room of all k steps made at once — eviction takes tokens off the LRU order
    /// greedily, so cutting the k steps' tokens in one call leaves the cache as k cuts would
    /// (`runs_change_no_outcome_and_carry_most_steps` compares whole runs).
    pub(in crate::sim::cluster) fn advance_plain_decodes(&mut self, ends: &[SimTime], cfg: &ReplicaConfig) {
        let k = ends.len() as u64 - 1;
        let need = self.decoding as u64;
        debug_assert_eq!(need, self.decode_batch as u64, "a run's batch is fixed");
        self.steps += k;
        self.decode_context_tokens += k * need;
        self.outstanding_work -= k * need;
        self.last_finish = (ends[ends.len() - 2], 0);
        self.make_room(k * need, cfg);
        self.private_tokens += k * need;
        debug_assert!(self.kv_used_tokens() <= cfg.kv_capacity_tokens, "replica {}: KV used exceeds capacity", self.id);
        for w in ends.windows(2) {
            self.step_began(w[0], w[1] - w[0]);
        }
    }

    /// A run of plain decode steps, planned right after [`Replica::next_decode_step`] formed one
    /// that ends at `first_end`: while nothing from outside changes this replica, the steps
    /// that follow are plain decode steps until one of its requests finishes, its KV runs out,
    /// or (`report_evictions`) a step would cut the cache, and each one's duration is known
    /// now (the batch is fixed, its context grows by one token per request a step). Fills
    /// `ends` with T₁ = `first_end`, T₂, …, T_{m+1}: the steps ending at T₁…T_m are plain (at
    /// most `max` of them), and the one ending at T_{m+1} is not known to be. The same
    /// arithmetic as stepping one by one (`decode_steps_are_the_general_path` checks every planned end).
    pub(in crate::sim::cluster) fn plan_decode_run(
        &self,
        first_end: SimTime,
        cfg: &ReplicaConfig,
        pricer: &Pricer,
        max: u64,
        ends: &mut Vec<SimTime>,
    ) {
        ends.clear();
        ends.push(first_end);
        let need = self.decoding as u64;
        debug_assert_eq!(need, self.decode_batch as u64, "planned right after a plain decode step");
        let finish_at = self.finishing.peek().map_or(u64::MAX, |&std::cmp::Reverse((at, _, _))| at);
        let (pinned, cached) = (self.cache.pinned_tokens(), self.cache.total_tokens());
        // The k-th end from now (`plain_decode_end` then, with k − 1 more steps' tokens) is
        // plain while nobody finishes by step `steps + k`, and `used + k × need` KV tokens fit
        // (pinned + private: room; cached + private: no cut the router hears of). Each bound
        // only tightens with k, so the run is the k up to the least of them.
        let fits = |used: u64| match (cfg.kv_capacity_tokens.checked_sub(used), need) {
            (None, _) => 0,
            (Some(_), 0) => max,
            (Some(left), _) => left / need,
        };
        let mut m = max.min(finish_at.saturating_sub(self.steps + 1)).min(fits(pinned + self.private_tokens));
        if cfg.report_evictions {
            m = m.min(fits(cached + self.private_tokens));
        }
        pricer.decode_run_ends(need, self.decode_context_tokens, m, first_end, ends);
    }

    /// Tokens of the step just formed: one per decoding request plus every chunk's.
    pub(in crate::sim::cluster) fn step_tokens(&self) -> u64 {
        self.decode_batch as u64 + self.chunks.iter().map(|&(_, n)| n as u64).sum::<u64>()
    }

    /// Removes the requests admitted this step from the waiting queue, keeping its order. Only
    /// the shown front (`scheduler_window` requests) can have been admitted, so only it is
    /// scanned: filtering the whole queue every step made an overloaded replica quadratic in
    /// its backlog.
    fn drop_admitted_from_front(&mut self, states: &Held) {
        let front = self.shown.len();
        let mut kept = 0;
        for i in 0..front {
            let r = self.waiting[i];
            if states[r].phase == Phase::Waiting {
                self.waiting[kept] = r;
                kept += 1;
            }
        }
        self.waiting.drain(kept..front);
    }

    /// Applies the step that ends at `now`; pushes requests that finished (or were handed off)
    /// onto `completed`, their states held here until [`Replica::release`] takes them.
    pub fn finish_step(
        &mut self,
        now: SimTime,
        stream: &RequestStream,
        cfg: &ReplicaConfig,
        completed: &mut Vec<RequestId>,
    ) {
        self.with_held(|rep, held| rep.finish_held(now, stream, held, cfg, completed));
    }

    /// [`Replica::finish_step`] with the held states lent out.
    fn finish_held(
        &mut self,
        now: SimTime,
        stream: &RequestStream,
        states: &mut Held,
        cfg: &ReplicaConfig,
        completed: &mut Vec<RequestId>,
    ) {
        self.steps += 1;
        let completed_before = completed.len();
        self.decode_context_tokens += self.decode_batch as u64;
        self.outstanding_work -= self.decode_batch as u64;
        let mut prefill_finished = false;
        for k in 0..self.chunks.len() {
            let (r, n) = self.chunks[k];
            let req = stream.request(r.index());
            let prompt = stream.prompt(r.index());
            let st = &mut states[r];
            let before = st.prefill_done;
            st.prefill_done += n;
            self.outstanding_work -= n as u64;
            mark_computed(&mut self.cache, prompt, &st.path, before, st.prefill_done.min(req.prompt_tokens));
            if st.prefill_done < st.prefill_target {
                continue;
            }
            prefill_finished = true;
            self.unpend(prompt, cfg);
            st.produced += 1;
            self.outstanding_work -= 1;
            if st.handoff {
                // Handed off: the first token reaches the user with the KV, at the transfer's end.
                self.complete(r, now, stream, states, cfg, false);
                completed.push(r);
                continue;
            }
            st.first_token_at.get_or_insert(now);
            if st.produced >= req.output_tokens {
                st.phase = Phase::Done; // leaves `prefilling` below
                self.complete(r, now, stream, states, cfg, false);
                completed.push(r);
            } else {
                st.phase = Phase::Decode;
                st.decode_entry_step = self.steps;
                self.decoding += 1;
                self.decode_context_tokens += (req.prompt_tokens + st.produced) as u64;
                self.finishing.push(std::cmp::Reverse((
                    self.steps + (req.output_tokens - st.produced) as u64,
                    r,
                    st.generation,
                )));
            }
        }
        if prefill_finished {
            self.prefilling.retain(|&r| states[r].phase == Phase::Prefill);
        }
        while let Some(&std::cmp::Reverse((at, r, generation))) = self.finishing.peek() {
            if at > self.steps {
                break;
            }
            self.finishing.pop();
            match states.get(r) {
                Some(st) if st.generation == generation && st.phase == Phase::Decode => {}
                _ => continue, // preempted since (or lost in a crash)
            }
            self.complete(r, now, stream, states, cfg, true);
            completed.push(r);
        }
        self.last_finish = (now, (completed.len() - completed_before) as u32);
    }

    /// Frees a finished request: its output KV (kept in the cache when a later turn reuses it)
    /// and its pins. On a prefill instance "finished" means handed off: the prompt stays cached
    /// (unpinned), and the request's phase becomes `Transfer`.
    pub(super) fn complete(
        &mut self,
        r: RequestId,
        now: SimTime,
        stream: &RequestStream,
        states: &mut Held,
        cfg: &ReplicaConfig,
        decoding: bool,
    ) {
        let req = stream.request(r.index());
        let st = &mut states[r];
        let produced = self.produced_now(st);
        let output_here = st.output_here(req.output_tokens);
        debug_assert_eq!(produced, output_here);
        if decoding {
            self.decoding -= 1;
            self.decode_context_tokens -= (req.prompt_tokens + produced) as u64;
        }
        self.private_tokens -= produced as u64;
        if cfg.reservation == Reservation::Full {
            self.reserved_output_tokens -= output_here as u64;
        }
        if let (Some(seg), Some(&last), false) = (req.output_segment, st.path.last(), st.handoff) {
            self.cache.insert_computed(last, seg);
        }
        self.cache.release(&st.path);
        st.path = Vec::new();
        debug_assert!(st.completed_at.is_none(), "request {r} completed twice");
        st.produced = produced;
        if st.handoff {
            st.phase = Phase::Transfer;
        } else {
            st.phase = Phase::Done;
            st.completed_at = Some(now);
        }
        self.remove_running(r, states);
        if let Some(a) = crate::sim::cluster::lora::adapter_of(&self.lora, stream, r) {
            self.lora.as_mut().expect("tracked").left(a, false);
        }
        self.blocked = false;
    }
}

/// Marks the nodes of prompt positions `from..to` computed.
pub(super) fn mark_computed(
    cache: &mut crate::sim::cluster::prefix_cache::PrefixCache,
    prompt: &[routelab_policy_api::Segment],
    path: &[u32],
    from: u32,
    to: u32,
) {
    let mut start = 0;
    for (s, &node) in prompt.iter().zip(path) {
        let end = start + s.tokens;
        if end > from && start < to {
            cache.mark_computed(node, to.min(end) - start);
        }
        if end >= to {
            break;
        }
        start = end;
    }
}
