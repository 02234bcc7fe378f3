//! The disaggregated side of a replica (`sim/cluster/pd.rs` runs the cluster around it): a
//! decode instance reserves memory for a handed-off request's KV and starts decoding it when the
//! transfer lands; a prefill instance takes in a prefix migrated from another one.

use super::batcher::mark_computed;
use super::{Phase, Replica, ReplicaConfig, RequestState};
use crate::ids::RequestId;
use crate::time::SimTime;
use crate::workload::cluster::Reservation;
use crate::workload::generate::RequestStream;

impl Replica {
    /// A handed-off request's KV is about to arrive: reserves its memory as an admission would
    /// (the prompt's uncached part, pinned, plus the output reservation; the first token, computed
    /// on the prefill side, is private KV from now). Returns the prompt tokens already cached
    /// here, its state (`take`, called only then) held here from now on; or `None` when memory
    /// or batch slots are short (the caller keeps the state and retries later).
    pub(in crate::sim::cluster) fn admit_transfer(
        &mut self,
        id: RequestId,
        stream: &RequestStream,
        take: impl FnOnce() -> RequestState,
        cfg: &ReplicaConfig,
    ) -> Option<u32> {
        let req = stream.request(id.index());
        let prompt = stream.prompt(id.index());
        if self.running.len() >= cfg.max_batch_requests as usize {
            return None;
        }
        let mut path = Vec::new();
        let plan = self.cache.plan_path(prompt, &mut path);
        let reserve = match cfg.reservation {
            Reservation::Full => req.output_tokens as u64,
            Reservation::Estimate { output_tokens } => output_tokens.max(1).min(req.output_tokens) as u64,
        };
        if self.committed_tokens(cfg) + plan.newly_pinned_tokens + plan.new_tokens + reserve > cfg.kv_capacity_tokens {
            return None;
        }
        let mut st = take();
        let over = (self.kv_used_tokens() + plan.new_tokens + 1).saturating_sub(cfg.kv_capacity_tokens);
        let events = cfg.report_evictions.then_some(&mut self.evictions);
        self.cache.admit(prompt, &mut path, over, events);
        st.path = path;
        self.private_tokens += 1;
        if cfg.reservation == Reservation::Full {
            self.reserved_output_tokens += req.output_tokens as u64;
        }
        st.replica = self.id;
        st.handoff = false;
        st.prefill_target = req.prompt_tokens;
        st.prefill_done = req.prompt_tokens;
        self.outstanding_work += (req.output_tokens - st.produced) as u64;
        self.dispatched += 1;
        self.blocked = false;
        self.add_running(id, &mut st);
        self.hold(id, st);
        Some(plan.cached_tokens.min(req.prompt_tokens))
    }

    /// Copies the leading `segments` of a prompt into this prefill instance's cache, computed
    /// (a prefix migrated from another instance), if memory allows after evicting unpinned
    /// cache; returns whether it did.
    pub(in crate::sim::cluster) fn insert_prefix(
        &mut self,
        segments: &[routelab_policy_api::Segment],
        cfg: &ReplicaConfig,
    ) -> bool {
        let mut path = Vec::new();
        let plan = self.cache.plan_path(segments, &mut path);
        if self.committed_tokens(cfg) + plan.newly_pinned_tokens + plan.new_tokens > cfg.kv_capacity_tokens {
            return false;
        }
        let over = (self.kv_used_tokens() + plan.new_tokens).saturating_sub(cfg.kv_capacity_tokens);
        let events = cfg.report_evictions.then_some(&mut self.evictions);
        self.cache.admit(segments, &mut path, over, events);
        let tokens = segments.iter().map(|s| s.tokens).sum();
        mark_computed(&mut self.cache, segments, &path, 0, tokens);
        self.cache.release(&path);
        self.blocked = false;
        true
    }

    /// The transfer of `id` ended at `now`: its prompt is computed here and it decodes from the
    /// next step on. Returns true when it had nothing left to generate (it completed now).
    pub(in crate::sim::cluster) fn begin_decode(
        &mut self,
        id: RequestId,
        now: SimTime,
        stream: &RequestStream,
        cfg: &ReplicaConfig,
    ) -> bool {
        self.with_held(|rep, held| rep.begin_decode_held(id, now, stream, held, cfg))
    }

    /// [`Replica::begin_decode`] with the held states lent out.
    fn begin_decode_held(
        &mut self,
        id: RequestId,
        now: SimTime,
        stream: &RequestStream,
        states: &mut super::Held,
        cfg: &ReplicaConfig,
    ) -> bool {
        let req = stream.request(id.index());
        let st = &mut states[id];
        debug_assert_eq!(st.phase, Phase::Transfer);
        mark_computed(&mut self.cache, stream.prompt(id.index()), &st.path, 0, req.prompt_tokens);
        // A request lost once and routed again keeps the first token the client saw.
        st.first_token_at.get_or_insert(now);
        if st.produced >= req.output_tokens {
            st.phase = Phase::Decode;
            st.decode_entry_step = self.steps;
            self.decoding += 1;
            self.decode_context_tokens += (req.prompt_tokens + st.produced) as u64;
            self.complete(id, now, stream, states, cfg, true);
            return true;
        }
        // A step running now does not include it: it enters the batch at the next step, whose
        // number is `steps + 1` if one is running (`produced_now` counts from there).
        st.phase = Phase::Decode;
        st.decode_entry_step = self.steps + self.busy as u64;
        self.decoding += 1;
        self.decode_context_tokens += (req.prompt_tokens + st.produced) as u64;
        let at = st.decode_entry_step + (req.output_tokens - st.produced) as u64;
        self.finishing.push(std::cmp::Reverse((at, id, st.generation)));
        false
    }
}
