//! What the rest of the cluster world reads of a replica and does to it, besides forming and
//! finishing steps (`batcher.rs`) and the P/D hand-off (`pd.rs`): read-only figures for views,
//! reports and metrics, and named operations for the few changes made from outside (step
//! timing, autoscaling and crashes, adapters, tiers). The state itself is private to this
//! folder.

use std::collections::VecDeque;

use routelab_policy_api::Segment;

use super::{Replica, RequestState, TierSpec};
use crate::ids::{ReplicaId, RequestId};
use crate::sim::cluster::kv_tier::KvTier;
use crate::sim::cluster::lora::{Adapters, adapter_of};
use crate::sim::cluster::prefix_cache::{EvictionEvent, PrefixCache};
use crate::sim::cluster::tiers::ReplicaTiers;
use crate::time::SimTime;
use crate::workload::cluster::lora::Lora;
use crate::workload::generate::RequestStream;

impl Replica {
    /// Its GPU prefix cache (read-only: what the summary samples, what an emulator mirrors).
    #[inline]
    pub fn cache(&self) -> &PrefixCache {
        &self.cache
    }

    /// The KV tiers below its GPU cache, if the cluster has them.
    #[inline]
    pub(in crate::sim::cluster) fn tiers(&self) -> Option<&ReplicaTiers> {
        self.tiers.as_deref()
    }

    /// Its LoRA adapters, if the workload has `lora:`.
    #[inline]
    pub(in crate::sim::cluster) fn lora(&self) -> Option<&Adapters> {
        self.lora.as_deref()
    }

    /// Its slot in the cluster.
    #[inline]
    pub(in crate::sim::cluster) fn id(&self) -> ReplicaId {
        self.id
    }

    /// Requests not yet admitted, in arrival order.
    #[inline]
    pub fn waiting(&self) -> &VecDeque<RequestId> {
        &self.waiting
    }

    /// Admitted requests (prefill or decode), unordered.
    #[inline]
    pub fn running(&self) -> &[RequestId] {
        &self.running
    }

    /// How many admitted requests are still prefilling (their first token not out).
    #[inline]
    pub(in crate::sim::cluster) fn prefilling_len(&self) -> usize {
        self.prefilling.len()
    }

    /// Whether a step is running (a crashed replica's void step included).
    #[inline]
    pub(in crate::sim::cluster) fn busy(&self) -> bool {
        self.busy
    }

    /// Steps finished.
    #[inline]
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Seconds spent in steps (utilisation).
    #[inline]
    pub(in crate::sim::cluster) fn busy_s(&self) -> f64 {
        self.busy_s
    }

    /// Requests dispatched here (a P/D decode instance counts each transfer it takes).
    #[inline]
    pub(in crate::sim::cluster) fn dispatched(&self) -> u64 {
        self.dispatched
    }

    /// Recompute preemptions so far.
    #[inline]
    pub(in crate::sim::cluster) fn preemptions(&self) -> u64 {
        self.preemptions
    }

    /// Prompt tokens of `prompt` cached here, or pending (dispatched here, not yet computed):
    /// a router's `matched_tokens`.
    #[inline]
    pub(in crate::sim::cluster) fn matched_tokens(&self, prompt: &[Segment]) -> u32 {
        self.cache.cached_or_pending_prefix(prompt, &self.pending)
    }

    /// Prompt tokens of `prompt` its GPU cache holds.
    #[inline]
    pub(in crate::sim::cluster) fn cached_prefix(&self, prompt: &[Segment]) -> u32 {
        self.cache.cached_prefix(prompt)
    }

    /// Prompt tokens of `prompt` its GPU cache holds, continued in its CPU tier (if any).
    pub(in crate::sim::cluster) fn cached_prefix_with_cpu(&self, prompt: &[Segment]) -> u32 {
        let gpu = self.cache.cached_prefix(prompt);
        let below = self.tiers.as_deref().map_or(0, |t| t.peek(prompt, gpu, None)[0]);
        gpu + below
    }

    /// Its `tier.*.matched_tokens` for `prompt` (`None` without tiers): the GPU match, cached or
    /// pending, continued in its CPU tier and in the `remote` one.
    pub(in crate::sim::cluster) fn tier_matches(
        &self,
        prompt: &[Segment],
        remote: Option<&KvTier>,
    ) -> Option<[u32; 2]> {
        let t = self.tiers.as_deref()?;
        let gpu = self.matched_tokens(prompt);
        Some(t.peek(prompt, gpu, remote))
    }

    /// Every replica of a run with `lora:` tracks the workload's adapters.
    pub(in crate::sim::cluster) fn track_adapters(&mut self, spec: &Lora) {
        self.lora = Some(Box::new(Adapters::new(spec)));
    }

    /// Request `id` joined the waiting queue: its adapter (if any) is wanted here.
    pub(in crate::sim::cluster) fn adapter_enqueued(&mut self, stream: &RequestStream, id: RequestId) {
        if let Some(a) = adapter_of(&self.lora, stream, id) {
            self.lora.as_mut().expect("tracked").enqueued(a);
        }
    }

    /// A step of `t` ticks that runs requests started at `now`.
    #[inline]
    pub(in crate::sim::cluster) fn step_began(&mut self, now: SimTime, t: SimTime) {
        self.busy_s += crate::time::seconds(t);
        (self.step_started_at, self.step_ends_at) = (now, now + t);
    }

    /// Its lock-step group's step of `t` ticks started at `now` with nothing here to run: the
    /// dummy step holds the engine (what arrives waits for the group's step) but counts no busy
    /// time.
    #[inline]
    pub(in crate::sim::cluster) fn dummy_step_began(&mut self, now: SimTime, t: SimTime) {
        (self.step_started_at, self.step_ends_at) = (now, now + t);
    }

    /// The step that was running when it crashed ended (void): it is idle.
    #[inline]
    pub(in crate::sim::cluster) fn void_step_ended(&mut self) {
        self.busy = false;
    }

    /// The cache evictions the last step caused (with `report_evictions`), handed over.
    #[inline]
    pub fn drain_evictions(&mut self) -> std::vec::Drain<'_, EvictionEvent> {
        self.evictions.drain(..)
    }

    /// Whether the last step caused evictions to hand over (a cheap check before draining).
    #[inline]
    pub(in crate::sim::cluster) fn has_evictions(&self) -> bool {
        !self.evictions.is_empty()
    }

    /// The running step ended: its loads from the KV tiers (if any) are no longer in flight.
    #[inline]
    pub(in crate::sim::cluster) fn tier_loads_ended(&mut self, remote: Option<&mut KvTier>) {
        if let Some(t) = self.tiers.as_mut() {
            t.step_ended(remote);
        }
    }

    /// An off replica (autoscaling) starts loading: cold prefix cache, adapters and KV tiers
    /// (`tier_spec`: the cluster's `kv_tiers`, the KV bytes per token, the model's layers).
    pub(in crate::sim::cluster) fn cold_start(&mut self, tier_spec: Option<&TierSpec>) {
        self.cache = if self.tiers.is_some() { PrefixCache::with_offload() } else { PrefixCache::new() };
        if let Some(l) = self.lora.as_mut() {
            l.cold_start();
        }
        if let (Some(t), Some(spec)) = (self.tiers.as_mut(), tier_spec) {
            **t = ReplicaTiers::new(&spec.0, spec.1, spec.2);
        }
    }

    /// It crashed: it becomes a fresh replica (empty caches and queues, GPU and CPU tiers
    /// emptied; the shared remote tier is not its own), keeping its id, the counters the summary
    /// reads and whether a step runs (a step in flight still ends, void). Gives back the states
    /// of the requests it held, in no particular order.
    pub(in crate::sim::cluster) fn cold_restart(
        &mut self,
        tier_spec: Option<&TierSpec>,
    ) -> impl Iterator<Item = (RequestId, RequestState)> + use<> {
        let mut fresh = match (&self.tiers, tier_spec) {
            (Some(_), Some(spec)) => Replica::with_tiers(self.id, ReplicaTiers::new(&spec.0, spec.1, spec.2)),
            _ => Replica::new(self.id),
        };
        fresh.steps = self.steps;
        fresh.busy_s = self.busy_s;
        fresh.dispatched = self.dispatched;
        fresh.preemptions = self.preemptions;
        fresh.busy = self.busy;
        std::mem::replace(self, fresh).held.0.into_iter()
    }
}
