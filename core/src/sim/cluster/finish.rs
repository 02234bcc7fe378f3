//! The end of a cluster run: every request ended once (checked), its record, the host's
//! figures (exact or sketched), then the policies' own.

use super::summary::{self, RequestRecord, RunOutcome};
use super::{ClusterSim, End, replica_pool, sessions};
use crate::error::RunError;
use crate::handle::scheduler_stats;
use crate::ids::RequestId;
use crate::time::{SimTime, seconds};

impl ClusterSim<'_> {
    /// Request `i`'s record (not yet retired).
    pub(super) fn record(&self, i: RequestId) -> RequestRecord {
        let pd_rejected = self.pd.as_ref().is_some_and(|pd| pd.rejected[i]);
        let (q, st) = (self.stream.request(i.index()), self.state(i));
        let t = |x: Option<SimTime>| x.map_or(f64::NAN, seconds);
        // Per-request costs outside the engine's steps (a calibration's API and
        // detokenisation time), charged where the request's tokens come out.
        let pool = replica_pool(self.pd.as_ref(), &self.gpu_pool, st.replica);
        let (first, per_token) = self.pricers[pool].per_request_s();
        let later = per_token * q.output_tokens.saturating_sub(1) as f64;
        RequestRecord {
            replica: st.replica.raw(),
            arrived_at_s: seconds(st.arrived_at),
            queued_at_s: if st.phase == super::replica::Phase::NotArrived { f64::NAN } else { seconds(st.queued_at) },
            admitted_at_s: t(st.admitted_at),
            first_token_at_s: t(st.first_token_at) + first,
            completed_at_s: t(st.completed_at) + first + later,
            prompt_tokens: q.prompt_tokens,
            cached_tokens: st.cached_tokens,
            output_tokens: q.output_tokens,
            preemptions: st.preemptions,
            class: self.infos[i].class,
            tenant: self.infos[i].tenant,
            model: self.infos[i].model,
            end: if pd_rejected { End::Rejected } else { self.ends[i] },
            dispatched_at_s: seconds(self.dispatched_at[i]),
        }
    }

    /// Whether request `i` (not yet retired) has ended: finished, rejected or shed.
    pub(super) fn ended(&self, i: RequestId) -> bool {
        self.state(i).completed_at.is_some()
            || self.ends[i] != End::Served
            || self.pd.as_ref().is_some_and(|pd| pd.rejected[i])
    }

    /// A sketched run's summary takes the records of the requests at the front that have ended
    /// (in request order, as [`Self::finish`] would), and their state is dropped.
    pub(super) fn retire(&mut self) {
        if !self.retiring {
            return;
        }
        while self.states.front().is_some() && self.ended(RequestId::new(self.states.base())) {
            let r = self.record(RequestId::new(self.states.base()));
            self.tally.add(&r);
            self.states.pop_front();
            self.infos.pop_front();
            self.ends.pop_front();
            self.dispatched_at.pop_front();
        }
        self.stream.forget_below(self.states.base());
    }

    /// Per-request records, the host's metrics, then the policies' own figures.
    pub(super) fn finish(mut self) -> Result<RunOutcome, RunError> {
        let total = self.stream.len();
        // Calls of agent sessions that never arrived still have a record.
        self.held_up_to(total);
        let retired = self.states.base();
        // Conservation: every request ends exactly once — finished, rejected or shed — or is
        // still unfinished at the horizon (held requests included); never two of these. A
        // retired request ended once.
        #[cfg(debug_assertions)]
        {
            let pd_rejected = |i: RequestId| self.pd.as_ref().is_some_and(|pd| pd.rejected[i]);
            let mut ended = retired;
            for i in (retired..total).map(RequestId::new) {
                let st = self.state(i);
                let ways = [st.completed_at.is_some(), pd_rejected(i), self.ends[i] != End::Served];
                let n = ways.iter().filter(|w| **w).count();
                assert!(n <= 1, "request {i} ended {n} times ({ways:?})");
                ended += n;
            }
            assert_eq!(self.done, ended, "the count of ended requests drifted");
        }
        // Over every request in order; the cluster's own figures over the served ones (rejected
        // and shed requests were never served), the SLO's over all (a rejection misses it).
        let records: Vec<RequestRecord> =
            if self.exact { (0..total).map(|i| self.record(RequestId::new(i))).collect() } else { Vec::new() };
        let mut model_tally = self.models.as_ref().map(|ms| ms.tally(self.exact, &self.classes, self.slo.as_ref()));
        if self.exact {
            records.iter().for_each(|r| self.tally.add(r));
            if let Some(t) = &mut model_tally {
                records.iter().for_each(|r| t.add(r));
            }
        } else {
            for i in (retired..total).map(RequestId::new) {
                let r = self.record(i);
                self.tally.add(&r);
                if let Some(t) = &mut model_tally {
                    t.add(&r);
                }
            }
        }
        let p = &self.probes;
        let mut metrics =
            self.tally.summary(&self.replicas, p.waiting_at_half, p.waiting_at_end, p.replication.factor());
        // The run's end: its last completion (with a scaler, its last decision or load if later).
        let end =
            (retired..total).filter_map(|i| self.state(RequestId::new(i)).completed_at).max().unwrap_or(SimTime::ZERO);
        if self.pd.is_some() {
            self.pd_metrics(&records, end, &mut metrics);
        }
        if self.replicas.first().is_some_and(|r| r.tiers().is_some()) {
            debug_assert_eq!(retired, 0, "a run with KV tiers keeps every request's state");
            let prompts = self.stream.requests.iter().map(|q| q.prompt_tokens);
            let states = (0..total).map(|i| self.state(RequestId::new(i)));
            summary::push_tier_metrics(&mut metrics, prompts, states, &self.replicas, self.remote_tier.as_ref());
        }
        if !self.classes.is_empty() || !self.tenants.is_empty() {
            self.tally.push_groups(&mut metrics);
        } else if self.slo.is_some() {
            self.tally.push_slo(&mut metrics);
        }
        if let Some(t) = model_tally {
            t.push(&mut metrics);
        }
        if self.replicas.first().is_some_and(|r| r.lora().is_some()) {
            super::lora::push_lora_metrics(&mut metrics, self.replicas.iter().filter_map(|r| r.lora()));
        }
        if let Some(s) = &self.stream.sessions {
            sessions::push_session_metrics(&mut metrics, &records, s);
        }
        if let Some(a) = self.admission.as_ref().filter(|_| self.admission_metrics) {
            self.tally.push_admission(&mut metrics, a.counts.held);
        }
        if let Some(f) = &mut self.fleet {
            let end = end.max(f.last);
            f.push_metrics(&mut metrics, end, self.cost_per_hour);
        } else if self.cost_per_hour.is_some() {
            // A fixed fleet is paid for from the start until its last request finishes.
            let replicas = self.replicas.len() as f64;
            super::fleet::push_cost(&mut metrics, replicas * seconds(end), end, self.cost_per_hour);
        }
        if let Some(f) = &self.failures {
            let paid = match &self.fleet {
                Some(fleet) => fleet.replica_seconds(),
                None => seconds(end) * self.replicas.len() as f64,
            };
            f.push_metrics(&mut metrics, end, paid);
        }
        let detail = (!self.exact).then(|| {
            let (latency_quantiles, finished_share) = self.tally.latency_cdf(crate::metrics::CDF_POINTS);
            crate::metrics::Detail { latency_quantiles, finished_share, ..Default::default() }
        });
        for (k, v) in self.router_report()?.into_iter().chain(scheduler_stats(&self.schedulers)?) {
            metrics.push(k, v);
        }
        if let Some(a) = &self.admission {
            for (k, v) in a.report()? {
                metrics.push(k, v);
            }
        }
        if let Some(f) = &self.fleet {
            for (k, v) in f.report()? {
                metrics.push(k, v);
            }
        }
        Ok(RunOutcome { metrics, records, detail })
    }
}
