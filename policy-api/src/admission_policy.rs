//! The plain-Rust side of the admission kind (0.5.2): what an author implements
//! ([`AdmissionPolicy`]), its panic-catching wrapper and its registry entry. The ABI side is in
//! [the `admission` module](mod@crate::admission).

use abi_stable::{
    sabi_trait::TD_Opaque,
    std_types::{RResult, RString, RVec},
};

use crate::admission::{Admission, Admission_TO, AdmissionContext, AdmissionDecision};
use crate::error::PolicyError;
use crate::policy::{Entry, Maker, Policy, build, default_config, guard, names, stats};
use crate::types::*;

/// An admission policy in plain Rust. Panics are caught by the host-facing wrapper.
pub trait AdmissionPolicy: Policy<Context = AdmissionContext> {
    /// Request facts to receive with every request, by name (`request.fact(k)`).
    fn request_facts(&self) -> Vec<String> {
        Vec::new()
    }
    /// The decision for `request` on arrival.
    fn on_arrival(&mut self, request: &Request<'_>, replicas: &Replicas<'_>) -> AdmissionDecision;
    /// The next held request to admit or shed, or [`AdmissionDecision::wait`] (the default: a
    /// policy that never holds).
    fn next(&mut self, _now: f64, _replicas: &Replicas<'_>) -> AdmissionDecision {
        AdmissionDecision::wait()
    }
    /// An admitted request finished.
    fn on_complete(&mut self, _completion: &Completion) {}
    /// Named figures for the end-of-run report.
    fn report(&self) -> Vec<(String, f64)> {
        Vec::new()
    }
}

impl<P: AdmissionPolicy> Admission for crate::policy::Guarded<P> {
    fn request_facts(&self) -> RResult<RVec<RString>, PolicyError> {
        guard(P::NAME, "request_facts", || names(self.get().request_facts()))
    }
    fn on_arrival(&mut self, request: &Request<'_>, replicas: Replicas<'_>) -> RResult<AdmissionDecision, PolicyError> {
        let p = self.get_mut();
        guard(P::NAME, "on_arrival", || p.on_arrival(request, &replicas))
    }
    fn next(&mut self, now: f64, replicas: Replicas<'_>) -> RResult<AdmissionDecision, PolicyError> {
        let p = self.get_mut();
        guard(P::NAME, "next", || p.next(now, &replicas))
    }
    fn on_complete(&mut self, completion: &Completion) -> RResult<(), PolicyError> {
        let p = self.get_mut();
        guard(P::NAME, "on_complete", || p.on_complete(completion))
    }
    fn report(&self) -> RResult<RVec<Stat>, PolicyError> {
        guard(P::NAME, "report", || stats(self.get().report()))
    }
}

/// Registry entry for an admission policy type.
pub fn admission<P: AdmissionPolicy>() -> Entry {
    Entry {
        name: P::NAME,
        description: P::DESCRIPTION,
        default_config: default_config::<P>,
        make: Maker::Admission(|config, ctx| {
            build::<P>(config, ctx).map(|p| Admission_TO::from_value(crate::policy::Guarded::new(p), TD_Opaque))
        }),
    }
}
