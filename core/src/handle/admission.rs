//! An admission policy and the contract around it ([`AdmissionHandle`]): its decisions checked,
//! its held requests kept in order, its figures namespaced `admission.<name>`.

use abi_stable::std_types::RSlice;
use routelab_policy_api::{AdmissionBox, AdmissionDecision, Completion, ReplicaView, Replicas, Request, World};

use super::report_of;
use crate::error::{Role, RunError};
use crate::facts::{NegotiationError, RequestFacts, RequestInfo};

/// An admission policy and the contract around it: its decisions are checked (a known action;
/// `next` names a request that is held), its request facts negotiated, its figures namespaced
/// `admission.<name>`. The handle keeps the held requests, in the order they were held.
pub struct AdmissionHandle {
    admission: AdmissionBox,
    label: String,
    facts: RequestFacts,
    unusable: Option<RunError>,
    /// Held request ids, oldest first.
    held: Vec<u64>,
    /// Decisions by action: admitted on arrival, held, rejected, shed, released from hold.
    pub counts: AdmissionCounts,
}

/// How many requests an admission policy admitted, held, rejected and shed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AdmissionCounts {
    pub admitted: u64,
    pub held: u64,
    pub released: u64,
    pub rejected: u64,
    pub shed: u64,
}

/// What became of a request the admission policy was asked about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admitted {
    /// Route it now.
    Now,
    /// Held: `next` releases or sheds it later.
    Held,
    Rejected,
    Shed,
}

impl AdmissionHandle {
    pub fn new(admission: AdmissionBox, world: World, label: &str) -> Self {
        let (facts, unusable) = match admission
            .request_facts()
            .into_result()
            .map_err(|e| NegotiationError::Erred(e.into()))
            .and_then(|n| RequestFacts::negotiate(&n, world))
        {
            Ok(f) => (f, None),
            Err(e) => (RequestFacts::default(), Some(RunError::refused(Role::Admission, label, e.to_string()))),
        };
        Self {
            admission,
            label: label.to_string(),
            facts,
            unusable,
            held: Vec::new(),
            counts: AdmissionCounts::default(),
        }
    }

    pub fn label(&self) -> &str {
        &self.label
    }

    /// Requests held now.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// `req` arrived: what to do with it.
    pub fn arrive(
        &mut self,
        req: &Request<'_>,
        info: &RequestInfo,
        views: &[ReplicaView],
    ) -> Result<Admitted, RunError> {
        if let Some(e) = &self.unusable {
            return Err(e.clone());
        }
        let req = &Request { facts: RSlice::from_slice(self.facts.fill(info)), ..*req };
        let d = self
            .admission
            .on_arrival(req, Replicas::new(views))
            .into_result()
            .map_err(|e| RunError::erred(Role::Admission, &self.label, "on_arrival", e.into()))?;
        Ok(match d.action {
            AdmissionDecision::ADMIT => {
                self.counts.admitted += 1;
                Admitted::Now
            }
            AdmissionDecision::HOLD => {
                self.counts.held += 1;
                self.held.push(req.id);
                Admitted::Held
            }
            AdmissionDecision::REJECT => {
                self.counts.rejected += 1;
                Admitted::Rejected
            }
            AdmissionDecision::SHED => {
                self.counts.shed += 1;
                Admitted::Shed
            }
            other => {
                return Err(RunError::refused(
                    Role::Admission,
                    &self.label,
                    format!("answered on_arrival with the action {other} (known: 0 admit, 1 hold, 2 reject, 3 shed)"),
                ));
            }
        })
    }

    /// Capacity may have freed at `now`: the next held request to route (`Ok(Some((id, true)))`)
    /// or shed (`Some((id, false))`), or `None` (nothing held, or the policy waits).
    pub fn next(&mut self, now: f64, views: &[ReplicaView]) -> Result<Option<(u64, bool)>, RunError> {
        if self.held.is_empty() {
            return Ok(None);
        }
        let d = self
            .admission
            .next(now, Replicas::new(views))
            .into_result()
            .map_err(|e| RunError::erred(Role::Admission, &self.label, "next", e.into()))?;
        let admit = match d.action {
            AdmissionDecision::WAIT => return Ok(None),
            AdmissionDecision::ADMIT => true,
            AdmissionDecision::SHED => false,
            other => {
                return Err(RunError::refused(
                    Role::Admission,
                    &self.label,
                    format!("answered next with the action {other} (known: 0 admit, 3 shed, 4 wait)"),
                ));
            }
        };
        let Some(k) = self.held.iter().position(|&id| id == d.request) else {
            return Err(RunError::refused(
                Role::Admission,
                &self.label,
                format!("released request {} from next, which is not held", d.request),
            ));
        };
        self.held.remove(k);
        if admit {
            self.counts.released += 1;
        } else {
            self.counts.shed += 1;
        }
        Ok(Some((d.request, admit)))
    }

    /// An admitted request finished.
    pub fn complete(&mut self, c: &Completion) -> Result<(), RunError> {
        self.admission
            .on_complete(c)
            .into_result()
            .map_err(|e| RunError::erred(Role::Admission, &self.label, "on_complete", e.into()))
    }

    /// The policy's own figures as `admission.<name>`.
    pub fn report(&self) -> Result<Vec<(String, f64)>, RunError> {
        report_of(Role::Admission, &self.label, "admission", self.admission.report())
    }
}
