//! Crashes on a disaggregated cluster (`cluster.failures` with `disaggregation`): what an
//! instance's crash loses besides its own queues, and the P/D half of the retry rule
//! (`failures.rs` has the rest).
//!
//! A crashed **prefill** instance loses what it was prefilling or had queued, and the prompts
//! migrating or loading from the shared tier into it. A transfer it had started (the request
//! handed off) completes: the model treats the KV as sent at the hand-off.
//! A crashed **decode** instance loses what it was decoding, what it was prefilling itself
//! (decode-only), the transfers into it (void at their end) and the handed-off requests waiting
//! for its memory. The requests bound for it that are still before their hand-off on a prefill
//! instance are abandoned too (the router hears it now, with the instance's index, before it
//! leaves); their prefill runs on, as a real prefill worker's would, and they are lost when it
//! ends — the hand-off finds no one to take the KV (as in Dynamo and llm-d, where the decode
//! worker drives the remote prefill and a broken decode stream is what migration catches).
//!
//! A crashed **mixed** instance is both: it loses all of the above on either side.
//!
//! The router hears `on_abandon` for every request lost, `replica` its decode candidate (a
//! request whose prefill had not completed gets no `on_prefill_complete` afterwards), then
//! `on_pool_change` (left) in the crashed instance's pool, or `on_mixed_change` (left) in both
//! for a mixed instance (policy-api 0.5.13; a router without
//! `Capabilities::HEARS_MIXED_CHANGES` is refused at build). A restarted instance rejoins at the
//! top of its own range: prefill-only, mixed or decode-only (`routable.rs`).
//!
//! A lost request is routed again (a new `route_pair`) up to `max_retries` times, keeping its
//! arrival time and, if the client had it, its first token; unlike on an aggregated cluster it
//! starts its output again from nothing (the P/D path has no rule yet for re-prefilling the
//! generated tokens on a prefill instance, which then hands off more than one token): a
//! deviation from Dynamo's migration, which carries the generated tokens, that costs a retried
//! request the decode steps of what it had streamed. A request routed while either pool has no
//! routable instance fails.

use routelab_policy_api::{Completion, PdPool};

use super::ClusterSim;
use crate::error::RunError;
use crate::ids::{ReplicaId, RequestId};
use crate::time::{SimTime, seconds};

impl ClusterSim<'_> {
    /// Instance `s` crashes: pushes to `lost` the requests it loses beyond its own queues
    /// (module docs).
    pub(super) fn pd_crash_losses(&mut self, s: ReplicaId, lost: &mut Vec<RequestId>) {
        let n = self.stream.len();
        let pd = self.pd.as_mut().expect("disaggregated");
        if pd.orphan.len() < n {
            pd.orphan.resize(n, false);
        }
        if pd.prefills(s) {
            // Prefill (a mixed instance is both): the prompts on their way into it.
            let (ours, others): (Vec<RequestId>, Vec<RequestId>) =
                pd.in_flight.iter().partition(|&&id| pd.migrating[id].0 == s);
            pd.in_flight = others;
            for &id in &ours {
                if let Some(tier) = pd.tier.as_mut().filter(|_| pd.tier_loaded[id] > 0) {
                    tier.loading -= 1;
                    pd.tier_loaded[id] = 0;
                }
            }
            lost.extend(ours);
        }
        if let Some(k) = pd.decode_row(s) {
            // Decode: the hand-offs waiting for its memory; its transfers in flight are void.
            lost.extend(pd.waiting[k].drain(..));
            pd.active[k] = 0;
        }
    }

    /// Decode instance `s` crashed: the requests bound for it that are still before their
    /// hand-off (queued or running on a prefill instance, or on their way to one) become
    /// orphans; returns them (none for a prefill instance).
    pub(super) fn pd_orphans(&mut self, s: ReplicaId) -> Vec<RequestId> {
        if self.pd.as_ref().expect("disaggregated").is_prefill_only(s) {
            return Vec::new();
        }
        let bound: Vec<RequestId> = self.bound_before_handoff(s).collect();
        let pd = self.pd.as_mut().expect("disaggregated");
        let mut orphans = Vec::new();
        for id in bound {
            if !pd.orphan[id] {
                pd.orphan[id] = true;
                orphans.push(id);
            }
        }
        orphans
    }

    /// The index `abandoned.replica` names for request `id`: its decode candidate on a
    /// disaggregated cluster, else the router index of `s`, the replica it was lost on.
    pub(super) fn abandoned_index(&self, id: RequestId, s: ReplicaId) -> u32 {
        match &self.pd {
            Some(pd) => {
                let d = pd.decode_of[id].expect("an abandoned P/D request's decode instance is decided");
                pd.pool_index(self.index_of[d], PdPool::Decode)
            }
            None => self.index_of[s].raw(),
        }
    }

    /// Request `id` is about to be routed again: its P/D state is reset (module docs: its
    /// output starts again; a first token the client saw stays).
    pub(super) fn pd_reset(&mut self, id: RequestId) {
        let Some(pd) = self.pd.as_mut() else { return };
        pd.decode_of[id] = None;
        pd.transfer_s[id] = f64::NAN;
        pd.decode_cached[id] = 0;
        if let Some(t) = pd.tier_loaded.get_mut(id.index()) {
            *t = 0;
        }
        pd.orphan[id] = false;
        pd.handed_over(id);
        let st = self.state_mut(id);
        st.handoff = false;
        st.produced = 0;
    }

    /// Orphan `id` (its decode instance crashed) finished its prefill at `now`: it is lost
    /// now, without an `on_prefill_complete` (the router was told it was abandoned).
    pub(super) fn orphan_handed_off(&mut self, now: SimTime, id: RequestId) -> Result<(), RunError> {
        self.pd.as_mut().expect("disaggregated").orphan[id] = false;
        self.retry_or_fail(now, id, 0)
    }

    /// The router hears that request `id` will not complete where it was placed (`produced`:
    /// tokens it had streamed).
    pub(super) fn abandon(&mut self, now: SimTime, id: RequestId, index: u32, produced: u32) -> Result<(), RunError> {
        let st = self.state(id);
        let q = self.stream.request(id.index());
        let c = Completion {
            request_id: id.raw() as u64,
            replica: index,
            arrived_at: seconds(st.arrived_at),
            completed_at: seconds(now),
            ttft: st.first_token_at.map_or(f64::NAN, |t| seconds(t - st.arrived_at)),
            prompt_tokens: q.prompt_tokens,
            cached_tokens: st.cached_tokens,
            output_tokens: produced,
        };
        self.router.abandon(&c)
    }
}
