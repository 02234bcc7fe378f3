//! The policy objects that cross the boundary, as abi_stable trait objects.
//!
//! Plugin authors do not implement these directly: implement the plain-Rust traits of
//! [`crate::policy`] and let [`crate::export_policies!`] wrap them; the wrapper catches panics so
//! that a bug in a policy becomes an error naming it, never a crash of the host.
//! Every method returns `RResult`, `Err` carrying a message that already names policy and method.

use abi_stable::{
    sabi_trait,
    sabi_types::RMut,
    std_types::{RBox, RResult, RSlice, RString, RVec},
};

use crate::types::*;

/// A router: picks a replica for each arriving request (both the dispatch and the cluster world).
#[sabi_trait]
pub trait Router: Send {
    /// What this router asks of the host; read once, at creation.
    fn capabilities(&self) -> Capabilities;
    /// The replica index (`0..replicas.len()`) for `request`.
    fn route(&mut self, request: &Request<'_>, replicas: RSlice<'_, ReplicaView>) -> RResult<u32, RString>;
    /// The host dispatched `request` to `replica` (the index `route` returned).
    fn on_dispatch(&mut self, request: &Request<'_>, replica: u32) -> RResult<(), RString>;
    /// A request this router placed finished.
    fn on_complete(&mut self, completion: &Completion) -> RResult<(), RString>;
    /// A replica evicted cache content (only with `wants_evictions`).
    fn on_evict(&mut self, eviction: &Eviction<'_>) -> RResult<(), RString>;
    /// Figures to report at the end of a run.
    #[sabi(last_prefix_field)]
    fn report(&self) -> RResult<RVec<Stat>, RString>;
}

/// A replica's local scheduler: orders the waiting queue before each step.
#[sabi_trait]
pub trait Scheduler: Send {
    /// Clear `order`, then fill it with indices into `waiting` in the order the host should try to
    /// admit them. Indices left out are not admitted this step.
    fn order(
        &mut self,
        now: f64,
        waiting: RSlice<'_, WaitingRequest>,
        order: &mut RVec<u32>,
    ) -> RResult<(), RString>;
    #[sabi(last_prefix_field)]
    fn report(&self) -> RResult<RVec<Stat>, RString>;
}

/// The host's side of a selection: runs allocations on the training set and counts them.
#[sabi_trait]
pub trait Evaluator {
    /// Run `allocation` (a model index per module) on every training question. Counts one
    /// evaluation against the budget; fails once the budget is spent.
    fn evaluate(&mut self, allocation: RSlice<'_, u32>) -> RResult<Evaluation, RString>;
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
    fn select(&mut self, problem: &Problem, evaluator: EvaluatorMut<'_>) -> RResult<RVec<u32>, RString>;
    #[sabi(last_prefix_field)]
    fn report(&self) -> RResult<RVec<Stat>, RString>;
}

/// An owned router object, from the built-ins or from a loaded library.
pub type RouterBox = Router_TO<'static, RBox<()>>;
/// An owned scheduler object.
pub type SchedulerBox = Scheduler_TO<'static, RBox<()>>;
/// An owned selector object.
pub type SelectorBox = Selector_TO<'static, RBox<()>>;
/// The evaluator a selector borrows for one `select` call.
pub type EvaluatorMut<'a> = Evaluator_TO<'a, RMut<'a, ()>>;
