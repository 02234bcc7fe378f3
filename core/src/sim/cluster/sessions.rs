//! Agent sessions (`generator.session`): how the calls that wait for others are sent, and the
//! session-level metrics of the stream.
//!
//! Over the sessions whose every call completed: `session_makespan_*_s` = the last call's
//! completion − the first call's arrival; `session_llm_mean_s` = the time within the makespan
//! during which at least one of the session's calls was in flight (sent, last token not out:
//! the session was blocked on the LLM), `session_tool_mean_s` = the rest (no call in flight:
//! only tools were running), and `session_llm_share` = Σ LLM time ÷ Σ makespan. `sessions`
//! counts every session of the stream, `sessions_completed` those whose calls all completed.

use super::summary::RequestRecord;
use super::{ClusterSim, End, Event};
use crate::error::RunError;
use crate::ids::RequestId;
use crate::metrics::{Metrics, quantile};
use crate::time::SimTime;
use crate::workload::generate::Sessions;

/// One completed session's figures: (makespan, time with a call in flight), in seconds.
pub(super) fn session_times(calls: &[&RequestRecord]) -> Option<(f64, f64)> {
    if calls.is_empty() || calls.iter().any(|r| !r.completed_at_s.is_finite()) {
        return None;
    }
    let mut spans: Vec<(f64, f64)> = calls.iter().map(|r| (r.arrived_at_s, r.completed_at_s)).collect();
    spans.sort_by(|a, b| a.0.total_cmp(&b.0));
    // The union of the calls' spans, as runs of overlapping calls.
    let start = spans[0].0;
    let (mut open, mut end, mut busy) = (spans[0].0, spans[0].1, 0.0);
    for &(a, b) in &spans[1..] {
        if a > end {
            busy += end - open;
            (open, end) = (a, b);
        } else {
            end = end.max(b);
        }
    }
    busy += end - open;
    Some((end - start, busy))
}

pub(super) fn push_session_metrics(m: &mut Metrics, records: &[RequestRecord], s: &Sessions) {
    let mut by_session: Vec<Vec<&RequestRecord>> = vec![Vec::new(); s.count as usize];
    for (r, &k) in records.iter().zip(&s.session) {
        by_session[k as usize].push(r);
    }
    let times: Vec<(f64, f64)> = by_session.iter().filter_map(|c| session_times(c)).collect();
    let n = times.len() as f64;
    let mean = |f: &dyn Fn(&(f64, f64)) -> f64| if n > 0.0 { times.iter().map(f).sum::<f64>() / n } else { f64::NAN };
    let mut makespans: Vec<f64> = times.iter().map(|t| t.0).collect();
    let total: f64 = makespans.iter().sum();
    m.push("sessions", s.count as f64);
    m.push("sessions_completed", n);
    m.push("session_makespan_mean_s", mean(&|t| t.0));
    m.push("session_makespan_p50_s", quantile(&mut makespans, 0.5));
    m.push("session_makespan_p90_s", quantile(&mut makespans, 0.9));
    m.push("session_llm_mean_s", mean(&|t| t.1));
    m.push("session_tool_mean_s", mean(&|t| t.0 - t.1));
    m.push("session_llm_share", if total > 0.0 { times.iter().map(|t| t.1).sum::<f64>() / total } else { f64::NAN });
}

/// How the calls of agent sessions that wait for others are sent (the loop in `mod.rs`).
impl ClusterSim<'_> {
    /// Passes over the stream's calls that wait for others (they arrive by [`Event::Release`],
    /// even when what they wait for is already done: a recorded trace's later calls come in the
    /// stream long after their parents).
    pub(super) fn skip_dependents(&mut self) {
        let Some(s) = &self.stream.sessions else { return };
        while s.after.get(self.next).is_some_and(|a| !a.is_empty()) {
            self.next += 1;
        }
    }

    /// Request `id` is done at `now`: the calls of its session that waited only for it (and
    /// whatever else is done) are sent after their tool pause.
    pub(super) fn release_dependents(&mut self, now: SimTime, id: RequestId) {
        let Some(s) = &self.stream.sessions else { return };
        for &d in &self.dependents[id] {
            let w = &mut self.waiting_for[d];
            *w -= 1;
            if *w == 0 && self.ends[d] == End::Served {
                self.queue.push(now + s.pause[d], Event::Release(d));
            }
        }
    }

    /// Request `id` was turned away (rejected or shed): the calls of its session that wait for
    /// it will never be sent; they are shed with it.
    pub(super) fn abandon_dependents(&mut self, id: RequestId) {
        if self.dependents.is_empty() {
            return;
        }
        let mut stack: Vec<RequestId> = self.dependents[id].clone();
        while let Some(d) = stack.pop() {
            if self.ends[d] == End::Served {
                self.ends[d] = End::Shed;
                self.done += 1;
                stack.extend_from_slice(&self.dependents[d]);
            }
        }
    }

    /// A call of an agent session is sent at `now`.
    pub(super) fn on_release(&mut self, now: SimTime, id: RequestId) -> Result<(), RunError> {
        self.held_up_to(id.index() + 1);
        self.state_mut(id).arrived_at = now;
        self.dispatched_at[id] = now;
        self.arrive(now, id)
    }
}
