//! The policy objects that cross the boundary, as abi_stable trait objects.
//!
//! Plugin authors do not implement these directly: implement the plain-Rust traits of
//! [`crate::policy`] and let [`crate::export_policies!`] wrap them; the wrapper catches panics so
//! that a bug in a policy becomes an error naming it (see the crate docs for what is and is not
//! contained). Every method returns `RResult`, `Err` carrying a [`PolicyError`] whose message
//! already names policy and method.
//!
//! Each trait's vtable is a prefix type: the methods up to the one marked
//! `#[sabi(last_prefix_field)]` are the 0.5 prefix and never move; a later patch appends methods
//! after it, each with a default body. Called on an object from a library built before the method
//! existed, the default body runs (abi_stable's fallback), so such a library keeps loading and
//! working. `Router::on_abandon` (0.5.1) is the first such addition; a test builds a plugin
//! against 0.5.0 and shows its default running.
//!
//! An item appended in a patch sits between `// since 0.M.N {` and `// } since 0.M.N` lines: the
//! compatibility test (`host/tests/integration/compat.rs`) makes the earlier patch by cutting
//! them out.

use abi_stable::{
    sabi_trait,
    sabi_types::RMut,
    std_types::{RBox, RResult, RSlice, RString, RVec},
};

use crate::error::PolicyError;
use crate::types::*;

/// A router: picks a replica for each arriving request (both the dispatch and the cluster world),
/// or a prefill/decode decision on a disaggregated cluster.
#[sabi_trait]
pub trait Router: Send {
    /// What this router asks of the host; read once, at creation. Unknown bits are ignored.
    fn capabilities(&self) -> RResult<Capabilities, PolicyError>;
    /// The engine signals ([`crate::signals`]) this router reads, by name; read once, at
    /// creation. Their values arrive in [`Replicas`], in this order.
    fn signals(&self) -> RResult<RVec<RString>, PolicyError>;
    /// The request facts ([`crate::facts::request`]) this router reads, by name; read once, at
    /// creation. Their values arrive in [`Request::facts`], in this order.
    fn request_facts(&self) -> RResult<RVec<RString>, PolicyError>;
    /// The replica index (`0..replicas.len()`) for `request` (routers without
    /// [`Capabilities::DISAGGREGATED`]).
    fn route(&mut self, request: &Request<'_>, replicas: Replicas<'_>) -> RResult<u32, PolicyError>;
    /// What to do with `request` given both pools of a disaggregated cluster (routers with
    /// [`Capabilities::DISAGGREGATED`]).
    fn route_pair(
        &mut self,
        request: &Request<'_>,
        prefill: Replicas<'_>,
        decode: Replicas<'_>,
    ) -> RResult<PdDecision, PolicyError>;
    /// The host dispatched `request` to `replica` (the index `route` returned).
    fn on_dispatch(&mut self, request: &Request<'_>, replica: u32) -> RResult<(), PolicyError>;
    /// The host carried out `decision` for `request` (a rejection included).
    fn on_dispatch_pair(&mut self, request: &Request<'_>, decision: PdDecision) -> RResult<(), PolicyError>;
    /// A request this router sent to a prefill instance finished its prefill there
    /// (`completion.replica` indexes the prefill candidates, `completed_at` is the end of the
    /// prefill, `ttft` the time to it); its KV cache now moves to the decode instance. The
    /// request's end arrives later through `on_complete`, with `replica` indexing the decode
    /// candidates.
    fn on_prefill_complete(&mut self, completion: &Completion) -> RResult<(), PolicyError>;
    /// A request this router placed finished.
    fn on_complete(&mut self, completion: &Completion) -> RResult<(), PolicyError>;
    /// A replica evicted cache content (only with [`Capabilities::WANTS_EVICTIONS`]).
    fn on_evict(&mut self, eviction: &Eviction<'_>) -> RResult<(), PolicyError>;
    /// Figures to report at the end of a run.
    #[sabi(last_prefix_field)]
    fn report(&self) -> RResult<RVec<Stat>, PolicyError>;

    // since 0.5.1 {
    /// Added in 0.5.1. A request this router placed will not complete where it was placed: the
    /// client gave up, or the send failed (a gateway may then route it again, as a new decision).
    /// `abandoned` describes it as far as it got (`completed_at`: when it was abandoned;
    /// `output_tokens`: tokens streamed before). The default, which a library built against
    /// 0.5.0 answers with, treats it as a completion.
    fn on_abandon(&mut self, abandoned: &Completion) -> RResult<(), PolicyError> {
        self.on_complete(abandoned)
    }
    // } since 0.5.1

    // since 0.5.4 {
    /// Added in 0.5.4. A replica became routable (cold caches) or stopped taking requests (it
    /// drains): autoscaling ([the `scaler` module](mod@crate::scaler)). The views `route` gets already show only the
    /// routable replicas; a router keeping per-replica state may reset it here. The default,
    /// which a library built before 0.5.4 answers with, does nothing.
    fn on_replica_change(&mut self, change: &crate::scaler::ReplicaChange) -> RResult<(), PolicyError> {
        let _ = change;
        abi_stable::std_types::ROk(())
    }
    // } since 0.5.4

    // since 0.5.8 {
    /// Added in 0.5.8. On a disaggregated cluster, an instance joined or left one pool's
    /// candidates (a crash, a restart): `pool` is [`crate::ReplicaChange::PREFILL`] or
    /// [`crate::ReplicaChange::DECODE`], and `change.replica` / `change.routable` count in that
    /// pool's candidates, as `route_pair`'s `prefill` or `decode` views index them. The default,
    /// which a library built before 0.5.8 answers with, does nothing (the views already show
    /// only routable instances).
    fn on_pool_change(&mut self, pool: u8, change: &crate::scaler::ReplicaChange) -> RResult<(), PolicyError> {
        let _ = (pool, change);
        abi_stable::std_types::ROk(())
    }
    // } since 0.5.8

    // since 0.5.13 {
    /// Added in 0.5.13. On a disaggregated cluster, a mixed instance (a candidate of both pools)
    /// joined or left both pools at once (a crash, a restart): `prefill` counts in the prefill
    /// candidates and `decode` in the decode candidates, as [`Self::on_pool_change`]'s changes
    /// do. The host calls it only on routers with [`Capabilities::HEARS_MIXED_CHANGES`] and
    /// refuses crashes on mixed instances for the others; the default, which a library built
    /// before 0.5.13 would answer with, fails, so such a library can never miscount its pools.
    fn on_mixed_change(
        &mut self,
        prefill: &crate::scaler::ReplicaChange,
        decode: &crate::scaler::ReplicaChange,
    ) -> RResult<(), PolicyError> {
        let _ = (prefill, decode);
        abi_stable::std_types::RErr(PolicyError::failed(
            "built against policy-api before 0.5.13, it cannot hear that a mixed instance joined or left; rebuild it",
        ))
    }
    // } since 0.5.13
}

/// A replica's local scheduler: orders the waiting queue before each step.
#[sabi_trait]
pub trait Scheduler: Send {
    /// The request facts ([`crate::facts::request`]) this scheduler reads, by name; read once,
    /// at creation. Their values arrive in [`Waiting`], in this order.
    fn request_facts(&self) -> RResult<RVec<RString>, PolicyError>;
    /// `waiting` holds the first `scheduler_window` requests of the replica's queue, in arrival
    /// order. Clear `order`, then fill it with indices into `waiting` in the order the host should try to
    /// admit them. The host admits from the front while KV capacity and the step's token budget
    /// allow, and stops at the first request that does not fit. Indices left out are not admitted
    /// this step; they stay waiting, in their arrival order, and are offered again next step. An
    /// index out of range or listed twice fails the run.
    fn order(&mut self, now: f64, waiting: Waiting<'_>, order: &mut RVec<u32>) -> RResult<(), PolicyError>;
    /// Figures to report at the end of a run.
    #[sabi(last_prefix_field)]
    fn report(&self) -> RResult<RVec<Stat>, PolicyError>;
}

/// The host's side of a selection: runs allocations on the training set and counts them.
#[sabi_trait]
pub trait Evaluator {
    /// Run `allocation` (a model index per module) on every training question. Counts one
    /// evaluation against the budget; fails once the budget is spent.
    fn evaluate(&mut self, allocation: RSlice<'_, u32>) -> RResult<Evaluation, PolicyError>;
    /// Evaluations made so far.
    fn evaluations(&self) -> u64;
    /// Evaluations left, if the run has a budget.
    #[sabi(last_prefix_field)]
    fn remaining(&self) -> abi_stable::std_types::ROption<u64>;
}

/// A model selector for a compound AI system (the compound world).
#[sabi_trait]
pub trait Selector: Send {
    /// An allocation (a model index per module) for `problem`, found with `evaluator`.
    fn select(&mut self, problem: &Problem, evaluator: EvaluatorMut<'_>) -> RResult<RVec<u32>, PolicyError>;
    /// Figures to report at the end of a run.
    #[sabi(last_prefix_field)]
    fn report(&self) -> RResult<RVec<Stat>, PolicyError>;
}

/// An owned router object, from the built-ins or from a loaded library.
pub type RouterBox = Router_TO<'static, RBox<()>>;
/// An owned scheduler object.
pub type SchedulerBox = Scheduler_TO<'static, RBox<()>>;
/// An owned selector object.
pub type SelectorBox = Selector_TO<'static, RBox<()>>;
/// The evaluator a selector borrows for one `select` call.
pub type EvaluatorMut<'a> = Evaluator_TO<'a, RMut<'a, ()>>;
