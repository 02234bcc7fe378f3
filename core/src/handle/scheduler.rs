//! A replica's local scheduler and the contract around it ([`SchedulerHandle`]): its answers
//! checked (every index in range, none twice), its request facts negotiated, its failures named
//! as the scheduler's, its figures summed over replicas as `scheduler.<name>`.

use abi_stable::std_types::RVec;
use routelab_policy_api::{SchedulerBox, Waiting, WaitingRequest};

use super::{policy_error, report_of};
use crate::error::{Role, RunError};
use crate::facts::{RequestFacts, RequestInfo, negotiate_scheduler_facts};

/// The local schedulers of a cluster run, one per replica slot, and the label that names them in
/// errors (`fcfs`, `lib.so:mine`): a scheduler's failure blames the scheduler, not the router.
pub struct Schedulers {
    pub label: String,
    pub boxes: Vec<SchedulerBox>,
}

impl Schedulers {
    pub fn new(label: &str, boxes: Vec<SchedulerBox>) -> Self {
        Self { label: label.to_string(), boxes }
    }

    /// One handle per replica slot, in slot order.
    pub fn into_handles(self) -> Vec<SchedulerHandle> {
        let label: std::sync::Arc<str> = self.label.into();
        self.boxes.into_iter().enumerate().map(|(r, s)| SchedulerHandle::new(s, r as u32, label.clone())).collect()
    }
}

/// One replica's local scheduler and the checks on its answers.
pub struct SchedulerHandle {
    scheduler: SchedulerBox,
    replica: u32,
    /// Names the scheduler in errors.
    label: std::sync::Arc<str>,
    taken: Vec<bool>,
    /// Why the scheduler cannot run (it asks for request facts the cluster world lacks).
    unusable: Option<RunError>,
    /// The request facts it negotiated, every request's info (by request id) and the table the
    /// waiting requests' values are written to.
    facts: RequestFacts,
    infos: std::sync::Arc<[RequestInfo]>,
    table: Vec<f64>,
}

impl SchedulerHandle {
    /// Replica `replica`'s scheduler, named `label` in errors.
    pub fn new(scheduler: SchedulerBox, replica: u32, label: std::sync::Arc<str>) -> Self {
        let (facts, unusable) = match negotiate_scheduler_facts(&scheduler) {
            Ok(f) => (f, None),
            Err(e) => (
                RequestFacts::default(),
                Some(RunError::refused(Role::Policy, &label, format!("(the scheduler of replica {replica}) {e}"))),
            ),
        };
        let infos = Vec::new().into();
        Self { scheduler, replica, label, taken: Vec::new(), unusable, facts, infos, table: Vec::new() }
    }

    /// The label that names it in errors.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// What the host knows of every request, by request id: the source of the request facts
    /// the scheduler negotiated (a request id beyond it reads as a plain request).
    pub fn set_infos(&mut self, infos: std::sync::Arc<[RequestInfo]>) {
        self.infos = infos;
    }

    /// Request `id`'s class priority, from the infos [`Self::set_infos`] gave (0 beyond them).
    pub fn priority(&self, id: crate::ids::RequestId) -> i32 {
        self.infos.get(id.index()).map_or(0, |i| i.priority)
    }

    /// Whether it negotiated request facts (then it reads the infos [`Self::set_infos`] gives).
    pub fn reads_facts(&self) -> bool {
        !self.facts.is_empty()
    }

    /// The admission order of `waiting` at `now_s`, into `order`: indices into `waiting`, each at
    /// most once (those left out wait).
    pub fn order(&mut self, now_s: f64, waiting: &[WaitingRequest], order: &mut RVec<u32>) -> Result<(), RunError> {
        let id = self.replica;
        if let Some(e) = &self.unusable {
            return Err(e.clone());
        }
        let shown = if self.facts.is_empty() {
            Waiting::new(waiting)
        } else {
            self.table.clear();
            let plain = RequestInfo::plain();
            for w in waiting {
                self.facts.append(self.infos.get(w.id as usize).unwrap_or(&plain), &mut self.table);
            }
            Waiting::with_facts(waiting, &self.table, self.facts.len() as u32)
        };
        self.scheduler
            .order(now_s, shown, order)
            .into_result()
            .map_err(|e| policy_error(&self.label, "order", e.into()))?;
        self.taken.clear();
        self.taken.resize(waiting.len(), false);
        for &i in order.iter() {
            let i = i as usize;
            if i >= waiting.len() {
                return Err(RunError::refused(
                    Role::Policy,
                    &self.label,
                    format!(
                        "(the scheduler of replica {id}) returned index {i}, but only {} requests wait (valid: 0..{})",
                        waiting.len(),
                        waiting.len().saturating_sub(1)
                    ),
                ));
            }
            if std::mem::replace(&mut self.taken[i], true) {
                let what = format!("(the scheduler of replica {id}) returned index {i} twice");
                return Err(RunError::refused(Role::Policy, &self.label, what));
            }
        }
        Ok(())
    }
}

/// Every replica's scheduler figures, summed over replicas, as `scheduler.<name>` (in the order
/// the first replica reports them).
pub fn scheduler_stats(schedulers: &[SchedulerHandle]) -> Result<Vec<(String, f64)>, RunError> {
    let mut sum: Vec<(String, f64)> = Vec::new();
    // Where each name is in `sum`: linear in the figures, however many a scheduler reports.
    let mut at: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for s in schedulers {
        for (name, value) in report_of(Role::Policy, &s.label, "scheduler", s.scheduler.report())? {
            match at.get(&name) {
                Some(&i) => sum[i].1 += value,
                None => {
                    at.insert(name.clone(), sum.len());
                    sum.push((name, value));
                }
            }
        }
    }
    Ok(sum)
}
