//! How a plain-Rust policy becomes an ABI object: [`Guarded`] (and [`GuardedPd`] for a P/D
//! router) implements the ABI traits over it, catching panics in every call, range-checking every
//! replica index before its cast, and naming the policy and the method in every error.

use super::*;

/// A panic payload as text.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".into())
}

/// Runs `f`, turning a panic into an error that names the policy and the method.
pub(crate) fn guard<T>(policy: &str, method: &str, f: impl FnOnce() -> T) -> RResult<T, PolicyError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => ROk(v),
        Err(payload) => {
            RErr(PolicyError::panicked(format!("policy '{policy}' panicked in {method}: {}", panic_message(&*payload))))
        }
    }
}

pub(crate) fn stats(v: Vec<(String, f64)>) -> RVec<Stat> {
    v.into_iter().map(|(name, value)| Stat { name: name.into(), value }).collect()
}

/// `index` as a `u32` replica index, checked against `len` before any cast: a `usize` answer of
/// 2^32 or more must not wrap around to a valid replica.
fn replica_index(policy: &str, method: &str, index: usize, len: usize) -> RResult<u32, PolicyError> {
    match u32::try_from(index) {
        Ok(i) if index < len => ROk(i),
        _ => RErr(PolicyError::failed(format!(
            "policy '{policy}' returned replica {index} from {method}, but there are only {len} (valid: 0..{})",
            len.saturating_sub(1)
        ))),
    }
}

/// Adapts a plain-Rust policy to the ABI traits, catching panics in every call, its destructor's
/// included (a panic unwinding out of the vtable's drop would abort the host).
pub struct Guarded<P> {
    policy: ManuallyDrop<P>,
}

impl<P> Guarded<P> {
    /// Wraps `policy`.
    pub fn new(policy: P) -> Self {
        Self { policy: ManuallyDrop::new(policy) }
    }
    /// The wrapped policy.
    pub fn get(&self) -> &P {
        &self.policy
    }
    // since 0.5.2 {
    /// The wrapped policy, mutably.
    pub fn get_mut(&mut self) -> &mut P {
        &mut self.policy
    }
    // } since 0.5.2
}

impl<P> Drop for Guarded<P> {
    fn drop(&mut self) {
        // SAFETY: `policy` is dropped exactly once, here, and never used again: `self` is being
        // dropped and `ManuallyDrop` keeps the compiler from dropping the field a second time.
        // If the policy's destructor panics, the rest of its fields leak; the host lives on
        // (the panic message was already printed by the panic hook).
        let _ = catch_unwind(AssertUnwindSafe(|| unsafe { ManuallyDrop::drop(&mut self.policy) }));
    }
}

pub(crate) fn names(v: Vec<String>) -> RVec<RString> {
    v.into_iter().map(RString::from).collect()
}

fn not_a(policy: &str, method: &str, what: &str) -> RResult<(), PolicyError> {
    RErr(PolicyError::failed(format!("policy '{policy}' is {what}; the host called {method}")))
}

impl<P: RouterPolicy> Router for Guarded<P> {
    fn capabilities(&self) -> RResult<Capabilities, PolicyError> {
        // A plain router never answers route_pair, whatever bits it sets.
        guard(P::NAME, "capabilities", || {
            Capabilities::from_bits_retain(self.policy.capabilities().bits() & !Capabilities::DISAGGREGATED.bits())
        })
    }
    fn signals(&self) -> RResult<RVec<RString>, PolicyError> {
        guard(P::NAME, "signals", || names(self.policy.signals()))
    }
    fn request_facts(&self) -> RResult<RVec<RString>, PolicyError> {
        guard(P::NAME, "request_facts", || names(self.policy.request_facts()))
    }
    fn route(&mut self, request: &Request<'_>, replicas: Replicas<'_>) -> RResult<u32, PolicyError> {
        let len = replicas.len();
        match guard(P::NAME, "route", || self.policy.route(request, &replicas)) {
            ROk(i) => replica_index(P::NAME, "route", i, len),
            RErr(e) => RErr(e),
        }
    }
    fn route_pair(&mut self, _: &Request<'_>, _: Replicas<'_>, _: Replicas<'_>) -> RResult<PdDecision, PolicyError> {
        not_a(P::NAME, "route_pair", "not a P/D router").map(|()| PdDecision::reject())
    }
    fn on_dispatch(&mut self, request: &Request<'_>, replica: u32) -> RResult<(), PolicyError> {
        // u32 → usize widens on every target the host supports (32- and 64-bit).
        guard(P::NAME, "on_dispatch", || self.policy.on_dispatch(request, replica as usize))
    }
    fn on_dispatch_pair(&mut self, _: &Request<'_>, _: PdDecision) -> RResult<(), PolicyError> {
        not_a(P::NAME, "on_dispatch_pair", "not a P/D router")
    }
    fn on_prefill_complete(&mut self, _: &Completion) -> RResult<(), PolicyError> {
        not_a(P::NAME, "on_prefill_complete", "not a P/D router")
    }
    fn on_complete(&mut self, completion: &Completion) -> RResult<(), PolicyError> {
        guard(P::NAME, "on_complete", || self.policy.on_complete(completion))
    }
    fn on_evict(&mut self, eviction: &Eviction<'_>) -> RResult<(), PolicyError> {
        guard(P::NAME, "on_evict", || self.policy.on_evict(eviction))
    }
    fn report(&self) -> RResult<RVec<Stat>, PolicyError> {
        guard(P::NAME, "report", || stats(self.policy.report()))
    }
    // since 0.5.1 {
    fn on_abandon(&mut self, abandoned: &Completion) -> RResult<(), PolicyError> {
        guard(P::NAME, "on_abandon", || self.policy.on_abandon(abandoned))
    }
    // } since 0.5.1
    // since 0.5.4 {
    fn on_replica_change(&mut self, change: &crate::scaler::ReplicaChange) -> RResult<(), PolicyError> {
        guard(P::NAME, "on_replica_change", || self.policy.on_replica_change(change))
    }
    // } since 0.5.4
}

/// Adapts a plain P/D router to the ABI's [`Router`] (through [`pd_router`]).
pub struct GuardedPd<P>(Guarded<P>);

impl<P> GuardedPd<P> {
    /// Wraps `policy`.
    pub fn new(policy: P) -> Self {
        Self(Guarded::new(policy))
    }
    /// The wrapped policy.
    pub fn get(&self) -> &P {
        self.0.get()
    }
}

/// `policy`'s recorded failure, if any, as the failure of `method` ([`PdRouterPolicy::take_failure`]).
fn recorded<P: PdRouterPolicy>(_policy: &P, _method: &str) -> Option<PolicyError> {
    // since 0.5.10 {
    if let Some(e) = _policy.take_failure() {
        return Some(PolicyError::failed(format!("policy '{}' failed in {_method}: {}", P::NAME, e.message)));
    }
    // } since 0.5.10
    None
}

/// `r` unless the policy recorded a failure during the call.
fn or_recorded<P: PdRouterPolicy, T>(policy: &P, method: &str, r: RResult<T, PolicyError>) -> RResult<T, PolicyError> {
    match (r, recorded(policy, method)) {
        (RErr(e), _) => RErr(e),
        (ROk(_), Some(e)) => RErr(e),
        (ROk(v), None) => ROk(v),
    }
}

impl<P: PdRouterPolicy> Router for GuardedPd<P> {
    fn capabilities(&self) -> RResult<Capabilities, PolicyError> {
        guard(P::NAME, "capabilities", || {
            let caps = self.get().capabilities() | Capabilities::DISAGGREGATED;
            // since 0.5.13 {
            let caps = caps | Capabilities::HEARS_MIXED_CHANGES;
            // } since 0.5.13
            caps
        })
    }
    fn signals(&self) -> RResult<RVec<RString>, PolicyError> {
        guard(P::NAME, "signals", || names(self.get().signals()))
    }
    fn request_facts(&self) -> RResult<RVec<RString>, PolicyError> {
        guard(P::NAME, "request_facts", || names(self.get().request_facts()))
    }
    fn route(&mut self, _: &Request<'_>, _: Replicas<'_>) -> RResult<u32, PolicyError> {
        not_a(P::NAME, "route", "a P/D router").map(|()| 0)
    }
    fn route_pair(
        &mut self,
        request: &Request<'_>,
        prefill: Replicas<'_>,
        decode: Replicas<'_>,
    ) -> RResult<PdDecision, PolicyError> {
        let policy = &mut self.0.policy;
        let r = guard(P::NAME, "route_pair", || policy.route_pair(request, &prefill, &decode));
        match or_recorded(&**policy, "route_pair", r) {
            ROk(route) => match route.to_decision(prefill.len(), decode.len()) {
                Ok(d) => ROk(d),
                Err(what) => {
                    RErr(PolicyError::failed(format!("policy '{}' failed in route_pair: it returned {what}", P::NAME)))
                }
            },
            RErr(e) => RErr(e),
        }
    }
    fn on_dispatch(&mut self, _: &Request<'_>, _: u32) -> RResult<(), PolicyError> {
        not_a(P::NAME, "on_dispatch", "a P/D router")
    }
    fn on_dispatch_pair(&mut self, request: &Request<'_>, decision: PdDecision) -> RResult<(), PolicyError> {
        let Some(route) = PdRoute::from_decision(decision) else {
            return RErr(PolicyError::failed(format!("the host dispatched an unknown action {}", decision.action)));
        };
        let policy = &mut self.0.policy;
        let r = guard(P::NAME, "on_dispatch_pair", || policy.on_dispatch_pair(request, route));
        or_recorded(&**policy, "on_dispatch_pair", r)
    }
    fn on_prefill_complete(&mut self, completion: &Completion) -> RResult<(), PolicyError> {
        let policy = &mut self.0.policy;
        let r = guard(P::NAME, "on_prefill_complete", || policy.on_prefill_complete(completion));
        or_recorded(&**policy, "on_prefill_complete", r)
    }
    fn on_complete(&mut self, completion: &Completion) -> RResult<(), PolicyError> {
        let policy = &mut self.0.policy;
        let r = guard(P::NAME, "on_complete", || policy.on_complete(completion));
        or_recorded(&**policy, "on_complete", r)
    }
    fn on_evict(&mut self, eviction: &Eviction<'_>) -> RResult<(), PolicyError> {
        let policy = &mut self.0.policy;
        let r = guard(P::NAME, "on_evict", || policy.on_evict(eviction));
        or_recorded(&**policy, "on_evict", r)
    }
    fn report(&self) -> RResult<RVec<Stat>, PolicyError> {
        let r = guard(P::NAME, "report", || stats(self.get().report()));
        or_recorded(self.get(), "report", r)
    }
    // since 0.5.1 {
    fn on_abandon(&mut self, abandoned: &Completion) -> RResult<(), PolicyError> {
        let policy = &mut self.0.policy;
        let r = guard(P::NAME, "on_abandon", || policy.on_abandon(abandoned));
        or_recorded(&**policy, "on_abandon", r)
    }
    // } since 0.5.1
    // since 0.5.8 {
    fn on_pool_change(&mut self, pool: u8, change: &crate::scaler::ReplicaChange) -> RResult<(), PolicyError> {
        let Some(pool) = PdPool::from_abi(pool) else {
            return RErr(PolicyError::failed(format!("the host named an unknown pool {pool}")));
        };
        let policy = &mut self.0.policy;
        let r = guard(P::NAME, "on_pool_change", || policy.on_pool_change(pool, change));
        or_recorded(&**policy, "on_pool_change", r)
    }
    // } since 0.5.8
    // since 0.5.13 {
    fn on_mixed_change(
        &mut self,
        prefill: &crate::scaler::ReplicaChange,
        decode: &crate::scaler::ReplicaChange,
    ) -> RResult<(), PolicyError> {
        let policy = &mut self.0.policy;
        let r = guard(P::NAME, "on_mixed_change", || policy.on_mixed_change(prefill, decode));
        or_recorded(&**policy, "on_mixed_change", r)
    }
    // } since 0.5.13
}

impl<P: SchedulerPolicy> Scheduler for Guarded<P> {
    fn request_facts(&self) -> RResult<RVec<RString>, PolicyError> {
        guard(P::NAME, "request_facts", || names(self.policy.request_facts()))
    }
    fn order(&mut self, now: f64, waiting: Waiting<'_>, order: &mut RVec<u32>) -> RResult<(), PolicyError> {
        guard(P::NAME, "order", || {
            let mut v = std::mem::take(order).into_vec();
            v.clear();
            self.policy.order(now, &waiting, &mut v);
            *order = v.into();
        })
    }
    fn report(&self) -> RResult<RVec<Stat>, PolicyError> {
        guard(P::NAME, "report", || stats(self.policy.report()))
    }
}

impl<P: SelectorPolicy> Selector for Guarded<P> {
    fn select(&mut self, problem: &Problem, mut evaluator: EvaluatorMut<'_>) -> RResult<RVec<u32>, PolicyError> {
        match guard(P::NAME, "select", || self.policy.select(problem, &mut evaluator)) {
            ROk(Ok(v)) => ROk(v.into()),
            ROk(Err(e)) => RErr(PolicyError::failed(format!("policy '{}' failed in select: {e}", P::NAME))),
            RErr(e) => RErr(e),
        }
    }
    fn report(&self) -> RResult<RVec<Stat>, PolicyError> {
        guard(P::NAME, "report", || stats(self.policy.report()))
    }
}
