//! One replica: a waiting queue, a running batch, a prefix cache and KV memory, stepped by the
//! batcher. This file owns the state and its accounting; the rest of its implementation is in
//! this folder: `batcher.rs` forms and finishes steps, `async_sched.rs` times them one step
//! ahead, `priority.rs` picks preemption victims by class priority, and `pd.rs` is a prefill or
//! decode instance's side of a KV hand-off. The state is private to this folder: the rest of
//! the cluster world reads figures and calls named operations (`interface.rs`).
//!
//! A replica holds the state of every request it holds (`Held`): a request's state moves in
//! when it is queued here (`enqueue`, `admit_transfer`) and out when it finishes or is handed
//! off (`release`), or when the replica crashes (`cold_restart`). Nothing here reads the
//! cluster's per-request table.
//!
//! KV memory (tokens): `cache.total_tokens()` (prompt segments, shared) + `private_tokens`
//! (each running request's output so far, plus the generated tokens it recomputes after a
//! preemption). Reservation (`cluster.reservation`):
//! - `full` (default): admission needs room for the uncached prompt plus the request's whole
//!   output on top of everything already pinned or reserved, so decoding never runs out and
//!   nothing is ever preempted;
//! - `estimate {output_tokens}`: admission needs room for the uncached prompt plus that headroom;
//!   decoding then allocates one token per step, and when even evicting every unpinned cache node
//!   leaves too little, the most recently admitted request is preempted: its KV is freed, it
//!   rejoins the waiting queue in arrival order, and on readmission it recomputes its prompt (minus
//!   what is still cached) and the tokens it had generated (vLLM's recompute preemption).
//!
//! The router's view: `outstanding_work` is remaining prefill plus remaining output tokens of every
//! request dispatched here (waiting requests count their whole prompt until admission reveals
//! their cache hit); `pending` counts path hashes of prompts dispatched here and not yet computed,
//! for routers that ask for exact matches.

mod async_sched;
mod batcher;
mod interface;
mod pd;
mod priority;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use abi_stable::std_types::RVec;
use routelab_policy_api::{ReplicaView, Segment, WaitingRequest};

use super::prefix_cache::{EvictionEvent, PrefixCache, extend_path_hash};
use super::tiers::ReplicaTiers;
use crate::error::RunError;
use crate::handle::SchedulerHandle;
use crate::ids::{ReplicaId, RequestId};
use crate::time::SimTime;
use crate::workload::cluster::{Preemption, Reservation};
use crate::workload::generate::RequestStream;

/// Where a request is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Phase {
    #[default]
    NotArrived,
    Waiting,
    Prefill,
    /// Disaggregated: prefilled and handed off; its KV cache is on the way to (or waiting for
    /// memory on) a decode instance.
    Transfer,
    Decode,
    Done,
}

/// Per-request simulation state: held by the replica the request is on (`Held`), by the
/// cluster otherwise.
#[derive(Clone, Debug, Default)]
pub struct RequestState {
    pub phase: Phase,
    pub replica: ReplicaId,
    /// Cache nodes of the prompt's segments while admitted.
    pub path: Vec<u32>,
    /// Prompt tokens found cached at the first admission.
    pub cached_tokens: u32,
    /// Prompt tokens loaded at the first admission from the KV tiers [cpu, remote] (`tiers.rs`).
    pub tier_loaded: [u32; 2],
    /// Tokens to prefill: the prompt, plus the generated tokens recomputed after a preemption.
    pub prefill_target: u32,
    /// Tokens of `prefill_target` whose KV exists.
    pub prefill_done: u32,
    /// Output tokens generated (while decoding: as of `decode_entry_step`).
    pub produced: u32,
    pub decode_entry_step: u64,
    /// Bumped on preemption, so stale entries of the finish heap are ignored.
    pub generation: u32,
    pub admit_seq: u64,
    pub running_index: u32,
    pub admitted_at: Option<SimTime>,
    pub first_token_at: Option<SimTime>,
    pub completed_at: Option<SimTime>,
    pub preemptions: u32,
    /// Disaggregated: the instance it is queued on or running on only prefills it, computes the
    /// first token, then hands it off (its phase becomes `Transfer`) instead of decoding it.
    pub handoff: bool,
    /// When the request arrived: its stream's `arrived_at`, or, for a call of an agent session
    /// that waited for others, when it was sent.
    pub arrived_at: SimTime,
    /// When its replica's engine took it in (vLLM's `queued_ts`): on arrival at an idle
    /// replica, else when the step in flight ends (`async_sched.rs`).
    pub queued_at: SimTime,
}

impl RequestState {
    /// Output tokens generated where the request runs now: the first only, when it is handed off.
    pub fn output_here(&self, output_tokens: u32) -> u32 {
        if self.handoff { output_tokens.min(1) } else { output_tokens }
    }
}

/// The states of the requests a replica holds, by request id: its waiting and running
/// requests, and the ones that finished (or were handed off) in the step just ended until the
/// cluster takes them back (`Replica::release`).
#[derive(Default)]
struct Held(crate::seeds::MixMap<RequestId, RequestState>);

impl Held {
    fn get(&self, id: RequestId) -> Option<&RequestState> {
        self.0.get(&id)
    }
}

impl std::ops::Index<RequestId> for Held {
    type Output = RequestState;
    #[inline]
    fn index(&self, id: RequestId) -> &RequestState {
        self.0.get(&id).unwrap_or_else(|| panic!("request {id} is not held by this replica"))
    }
}

impl std::ops::IndexMut<RequestId> for Held {
    #[inline]
    fn index_mut(&mut self, id: RequestId) -> &mut RequestState {
        self.0.get_mut(&id).unwrap_or_else(|| panic!("request {id} is not held by this replica"))
    }
}

/// The KV memory admitting `st` reserves beyond its prompt: its whole output (`full`), or the
/// headroom plus the generated tokens it recomputes after a preemption (`estimate`).
fn reserve_tokens(cfg: &ReplicaConfig, st: &RequestState, req: &crate::workload::generate::GeneratedRequest) -> u64 {
    let output_here = st.output_here(req.output_tokens);
    match cfg.reservation {
        Reservation::Full => output_here as u64,
        Reservation::Estimate { output_tokens } => {
            output_tokens.max(1).min(output_here - st.produced) as u64 + (st.prefill_target - req.prompt_tokens) as u64
        }
    }
}

/// A cluster's `kv_tiers`, with the KV bytes per token and the model's layers: what a replica's
/// tiers are built from.
pub(in crate::sim::cluster) type TierSpec = (crate::workload::cluster::kv_tiers::KvTiers, f64, u32);

/// Static configuration of every replica.
#[derive(Clone, Debug)]
pub struct ReplicaConfig {
    pub kv_capacity_tokens: u64,
    /// Prefill tokens per step (unchunked: `max_step_tokens`).
    pub step_prefill_budget: u32,
    /// Decoding requests' tokens count against the budget (vLLM's `max_num_batched_tokens`).
    pub budget_counts_decode: bool,
    pub max_batch_requests: u32,
    pub reservation: Reservation,
    pub preemption: Preemption,
    pub scheduler_window: u32,
    pub track_pending: bool,
    pub report_evictions: bool,
    /// vLLM's async scheduling (`async_sched.rs`): each step's batch is formed one step ahead.
    pub async_scheduling: bool,
}

impl ReplicaConfig {
    /// A replica of `kv_capacity_tokens` KV tokens, `step_prefill_budget` prefill tokens a
    /// step and at most `max_batch_requests` running, the rest at its simplest: full reservation
    /// (decoding never runs out of memory, so nothing is preempted), decode tokens outside the
    /// budget, the scheduler shown 512 waiting requests, nothing tracked or reported, synchronous
    /// scheduling. An emulated engine's replica, and the tests' starting point.
    pub fn plain(kv_capacity_tokens: u64, step_prefill_budget: u32, max_batch_requests: u32) -> Self {
        Self {
            kv_capacity_tokens,
            step_prefill_budget,
            budget_counts_decode: false,
            max_batch_requests,
            reservation: Reservation::Full,
            preemption: Preemption::Newest,
            scheduler_window: 512,
            track_pending: false,
            report_evictions: false,
            async_scheduling: false,
        }
    }
}

/// One replica's state: private to this folder, read and changed from outside only through the
/// figures and operations of `interface.rs` (and the step, hand-off and queue methods).
pub struct Replica {
    id: ReplicaId,
    cache: PrefixCache,
    /// The KV tiers below the GPU cache, if the cluster has them.
    tiers: Option<Box<ReplicaTiers>>,
    /// Its LoRA adapters, if the workload has `lora:` (`lora.rs`).
    lora: Option<Box<super::lora::Adapters>>,
    /// The states of the requests it holds.
    held: Held,
    /// Not yet admitted, in arrival order.
    waiting: VecDeque<RequestId>,
    /// Admitted and still prefilling, in admission order.
    prefilling: VecDeque<RequestId>,
    /// Every admitted request (prefill or decode), unordered.
    running: Vec<RequestId>,
    /// (step at which it finishes, request, generation) of decoding requests.
    finishing: BinaryHeap<Reverse<(u64, RequestId, u32)>>,
    decoding: u32,
    /// Sum of (prompt + produced) over decoding requests: the KV a decode step reads.
    decode_context_tokens: u64,
    /// KV of generated tokens (not in the tree).
    private_tokens: u64,
    /// Sum of whole outputs of running requests (`full` reservation).
    reserved_output_tokens: u64,
    steps: u64,
    /// Seconds spent in steps (utilisation).
    busy_s: f64,
    busy: bool,
    /// Admission stopped for lack of memory, and nothing has been freed or added since.
    blocked: bool,
    outstanding_work: u64,
    pending: crate::seeds::MixMap<u64, u32>,
    evictions: Vec<EvictionEvent>,
    dispatched: u64,
    preemptions: u64,
    /// The last step formed (a lock-step group's dummy step included): its start and end.
    step_started_at: SimTime,
    step_ends_at: SimTime,
    /// When the last finished step ended, and how many requests it completed.
    last_finish: (SimTime, u32),
    next_admit_seq: u64,
    // Scratch, reused every step.
    chunks: Vec<(RequestId, u32)>,
    /// Scratch: this step's chunks as (new tokens, tokens already computed), for pricing.
    step_chunks: Vec<crate::step_model::Chunk>,
    decode_batch: u32,
    views: Vec<WaitingRequest>,
    shown: Vec<RequestId>,
    order: RVec<u32>,
}

impl Replica {
    /// A replica with `tiers` below its GPU cache: the cache reports what it evicts to them.
    pub fn with_tiers(id: ReplicaId, tiers: ReplicaTiers) -> Self {
        Self { cache: PrefixCache::with_offload(), tiers: Some(Box::new(tiers)), ..Self::new(id) }
    }

    pub fn new(id: ReplicaId) -> Self {
        Self {
            id,
            cache: PrefixCache::new(),
            tiers: None,
            lora: None,
            held: Held::default(),
            waiting: VecDeque::new(),
            prefilling: VecDeque::new(),
            running: Vec::new(),
            finishing: BinaryHeap::new(),
            decoding: 0,
            decode_context_tokens: 0,
            private_tokens: 0,
            reserved_output_tokens: 0,
            steps: 0,
            busy_s: 0.0,
            busy: false,
            blocked: false,
            outstanding_work: 0,
            pending: Default::default(),
            evictions: Vec::new(),
            dispatched: 0,
            preemptions: 0,
            step_started_at: SimTime::ZERO,
            step_ends_at: SimTime::ZERO,
            last_finish: (SimTime::ZERO, 0),
            next_admit_seq: 0,
            chunks: Vec::new(),
            step_chunks: Vec::new(),
            decode_batch: 0,
            views: Vec::new(),
            shown: Vec::new(),
            order: RVec::new(),
        }
    }

    /// KV tokens the engine holds: the whole prefix cache (warm prefixes no request references
    /// included) and running requests' private blocks. What admission into the batch checks.
    pub fn kv_used_tokens(&self) -> u64 {
        self.cache.total_tokens() + self.private_tokens
    }

    /// KV tokens running requests reference, as vLLM's `kv_cache_usage_perc` counts them: cached
    /// blocks no request references are free (evictable at once) — `BlockPool.get_usage` in
    /// vllm/v1/core/block_pool.py, vllm-project/vllm commit
    /// c59cb7941357443da7c5eef75cfa8697d683d228. What every view shows (router, admission,
    /// scaler) and what the emulator's `/metrics` reports, so a policy reads the same signal in
    /// the simulator as from a real engine's scrape.
    pub fn kv_referenced_tokens(&self) -> u64 {
        self.cache.pinned_tokens() + self.private_tokens
    }

    /// What a router sees (without `matched_tokens`).
    pub fn view(&self, cfg: &ReplicaConfig) -> ReplicaView {
        let running = self.running.len() as u32;
        let waiting = self.waiting.len() as u32;
        ReplicaView {
            waiting,
            running,
            outstanding_requests: waiting + running,
            outstanding_work: self.outstanding_work as f64,
            kv_used_tokens: self.kv_referenced_tokens(),
            kv_capacity_tokens: cfg.kv_capacity_tokens,
            matched_tokens: 0,
        }
    }

    pub fn has_work(&self) -> bool {
        !self.running.is_empty() || !self.waiting.is_empty()
    }

    /// A request routed here at `now` joins the waiting queue, its state `st` held here from
    /// now on. A request that had generated tokens elsewhere (`st.produced`: lost in a crash)
    /// recomputes them with its prompt, as after a preemption.
    pub fn enqueue(
        &mut self,
        now: SimTime,
        id: RequestId,
        prompt: &[Segment],
        output_tokens: u32,
        mut st: RequestState,
        cfg: &ReplicaConfig,
    ) {
        st.phase = Phase::Waiting;
        st.replica = self.id;
        st.queued_at = self.pickup_at(now);
        let prompt_tokens: u32 = prompt.iter().map(|s| s.tokens).sum();
        st.prefill_target = prompt_tokens + st.produced;
        self.hold(id, st);
        self.outstanding_work += prompt_tokens as u64 + output_tokens as u64;
        self.waiting.push_back(id);
        self.blocked = false;
        self.dispatched += 1;
        if cfg.track_pending {
            let mut h = 0;
            for s in prompt {
                h = extend_path_hash(h, s.id);
                *self.pending.entry(h).or_default() += 1;
            }
        }
    }

    /// Holds request `id`'s state from now on.
    fn hold(&mut self, id: RequestId, st: RequestState) {
        let before = self.held.0.insert(id, st);
        debug_assert!(before.is_none(), "request {id} held twice by replica {}", self.id);
    }

    /// Runs `f` with the held states lent out beside the replica: the batcher's functions change
    /// both (`f` must read states through its argument; `self.held` is empty meanwhile).
    fn with_held<T>(&mut self, f: impl FnOnce(&mut Self, &mut Held) -> T) -> T {
        let mut held = std::mem::take(&mut self.held);
        let out = f(self, &mut held);
        self.held = held;
        out
    }

    /// The state of request `id`, held here.
    pub fn state(&self, id: RequestId) -> &RequestState {
        &self.held[id]
    }

    /// Gives back the state of request `id`, which finished here or was handed off (its phase
    /// `Done` or `Transfer`): the cluster keeps it from now on.
    pub fn release(&mut self, id: RequestId) -> RequestState {
        let st = self.held.0.remove(&id).unwrap_or_else(|| panic!("request {id} is not held by replica {}", self.id));
        debug_assert!(matches!(st.phase, Phase::Done | Phase::Transfer), "request {id} released while {:?}", st.phase);
        st
    }

    /// The prompt is computed: it no longer counts as pending.
    fn unpend(&mut self, prompt: &[Segment], cfg: &ReplicaConfig) {
        if !cfg.track_pending {
            return;
        }
        let mut h = 0;
        for s in prompt {
            h = extend_path_hash(h, s.id);
            if let Some(n) = self.pending.get_mut(&h) {
                *n -= 1;
                if *n == 0 {
                    self.pending.remove(&h);
                }
            }
        }
    }

    /// KV committed to running requests: pinned prompt nodes plus generated tokens (`estimate`)
    /// or whole reserved outputs (`full`).
    pub(in crate::sim::cluster) fn committed_tokens(&self, cfg: &ReplicaConfig) -> u64 {
        let private = match cfg.reservation {
            Reservation::Full => self.reserved_output_tokens,
            Reservation::Estimate { .. } => self.private_tokens,
        };
        self.cache.pinned_tokens() + private
    }

    /// Evicts unpinned cache so that `extra` more tokens fit physically.
    fn make_room(&mut self, extra: u64, cfg: &ReplicaConfig) {
        let used = self.kv_used_tokens() + extra;
        if used > cfg.kv_capacity_tokens {
            let events = cfg.report_evictions.then_some(&mut self.evictions);
            self.cache.evict(used - cfg.kv_capacity_tokens, events);
        }
    }

    fn add_running(&mut self, id: RequestId, st: &mut RequestState) {
        st.running_index = self.running.len() as u32;
        st.admit_seq = self.next_admit_seq;
        self.next_admit_seq += 1;
        self.running.push(id);
    }

    fn remove_running(&mut self, id: RequestId, states: &mut Held) {
        let i = states[id].running_index as usize;
        debug_assert_eq!(self.running[i], id);
        self.running.swap_remove(i);
        if let Some(&moved) = self.running.get(i) {
            states[moved].running_index = i as u32;
        }
    }

    /// Output tokens generated so far by a decoding request (one whose KV arrived during a
    /// step enters the batch at the next: nothing more yet).
    pub fn produced_now(&self, st: &RequestState) -> u32 {
        match st.phase {
            Phase::Decode => st.produced + self.steps.saturating_sub(st.decode_entry_step) as u32,
            _ => st.produced,
        }
    }

    /// The most recently admitted running request, the victim of vLLM's FCFS policy (`None`
    /// when nothing runs). A request whose KV is still arriving is never a victim (its transfer
    /// is in flight).
    fn newest_running(&self, states: &Held) -> Option<RequestId> {
        self.running
            .iter()
            .filter(|&&r| states[r].phase != Phase::Transfer)
            .max_by_key(|&&r| states[r].admit_seq)
            .copied()
    }

    /// Preempts running request `victim` (recompute later). Under `full` reservation (only
    /// priority preemption preempts there) its reserved output is released too.
    fn preempt(&mut self, victim: RequestId, stream: &RequestStream, states: &mut Held, cfg: &ReplicaConfig) {
        let produced = self.produced_now(&states[victim]);
        let prompt_tokens = stream.request(victim.index()).prompt_tokens;
        let output_tokens = states[victim].output_here(stream.request(victim.index()).output_tokens);
        let st = &states[victim];
        let remaining_work = (output_tokens - produced) as u64
            + if st.phase == Phase::Prefill { (st.prefill_target - st.prefill_done) as u64 } else { 0 };
        match states[victim].phase {
            Phase::Decode => {
                self.decoding -= 1;
                self.decode_context_tokens -= (prompt_tokens + produced) as u64;
            }
            Phase::Prefill => {
                if let Some(pos) = self.prefilling.iter().position(|&r| r == victim) {
                    self.prefilling.remove(pos);
                }
            }
            _ => unreachable!("only running requests are preempted"),
        }
        self.remove_running(victim, states);
        if let Some(a) = super::lora::adapter_of(&self.lora, stream, victim) {
            self.lora.as_mut().expect("tracked").left(a, true);
        }
        let st = &mut states[victim];
        // Private KV: the generated tokens (decoding), or the ones being recomputed (prefill).
        let private = if st.phase == Phase::Decode { produced } else { st.prefill_target - prompt_tokens };
        self.private_tokens -= private as u64;
        if cfg.reservation == Reservation::Full {
            self.reserved_output_tokens -= output_tokens as u64;
        }
        let path = std::mem::take(&mut st.path);
        self.cache.release(&path);
        st.path = path;
        st.path.clear();
        st.produced = produced;
        st.generation += 1;
        st.preemptions += 1;
        st.phase = Phase::Waiting;
        st.prefill_target = prompt_tokens + produced;
        st.prefill_done = 0;
        // Worst case until readmission reveals what is still cached: the whole prompt again.
        self.outstanding_work = self.outstanding_work - remaining_work + (prompt_tokens + output_tokens) as u64;
        // Back into the waiting queue in arrival (= id) order.
        let pos = self.waiting.partition_point(|&r| r < victim);
        self.waiting.insert(pos, victim);
        self.preemptions += 1;
        self.blocked = false;
    }

    /// The scheduler's view of the first `scheduler_window` waiting requests, up to the first
    /// taken in after `taken_in_by` (`async_sched.rs`).
    fn fill_views(&mut self, stream: &RequestStream, states: &Held, cfg: &ReplicaConfig, taken_in_by: SimTime) {
        self.views.clear();
        self.shown.clear();
        for &r in self.waiting.iter().take(cfg.scheduler_window as usize) {
            let st = &states[r];
            if st.queued_at > taken_in_by {
                break;
            }
            let req = stream.request(r.index());
            let cached = self.cache.cached_prefix(stream.prompt(r.index())).min(req.prompt_tokens);
            self.views.push(WaitingRequest {
                id: r.raw() as u64,
                arrived_at: crate::time::seconds(st.arrived_at),
                prompt_tokens: req.prompt_tokens,
                cached_tokens: cached,
                // An empty prompt (a suffix of 0 tokens and nothing shared) has nothing cached.
                remaining_prefill_tokens: st.prefill_target - cached.min(st.prefill_target.saturating_sub(1)),
            });
            self.shown.push(r);
        }
    }

    /// Asks `scheduler` for the admission order of the shown requests (checked by the handle).
    fn ask_scheduler(&mut self, scheduler: &mut SchedulerHandle, now_s: f64) -> Result<(), RunError> {
        scheduler.order(now_s, &self.views, &mut self.order)
    }
}
