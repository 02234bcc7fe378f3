//! The plain-Rust side: what a policy author implements, and how it becomes an ABI object.
//!
//! Implement [`Policy`] (name, description, config, constructor) and one of [`RouterPolicy`],
//! [`SchedulerPolicy`], [`SelectorPolicy`]; list the type in a registry with [`router`],
//! [`scheduler`] or [`selector`]; export the registry with [`crate::export_policies!`].
//! Every call from the host passes through a guard that catches panics.

use std::panic::{AssertUnwindSafe, catch_unwind};

use abi_stable::{
    sabi_trait::TD_Opaque,
    std_types::{RErr, ROk, RResult, RSlice, RString, RVec},
};
use serde::{Serialize, de::DeserializeOwned};

use crate::traits::*;
use crate::types::*;

/// Identity, configuration and constructor of a policy of any kind.
pub trait Policy: Sized + Send + 'static {
    /// The name users type (`least_requests`); unique within a library and kind.
    const NAME: &'static str;
    /// One line for `routelab policies`.
    const DESCRIPTION: &'static str;
    /// Parsed from the user's YAML (`name{key: value}`); use `#[serde(default, deny_unknown_fields)]`
    /// so a typo is an error and every omitted key takes its default.
    type Config: Serialize + DeserializeOwned + Default;
    /// [`RouterContext`], [`SchedulerContext`] or [`SelectorContext`].
    type Context;
    /// Build the policy; an `Err` is shown to the user as a configuration error.
    fn new(config: Self::Config, context: &Self::Context) -> Result<Self, String>;
}

/// A router in plain Rust. Panics are caught by the host-facing wrapper.
pub trait RouterPolicy: Policy<Context = RouterContext> {
    /// What the router asks of the host (exact prefix matches, eviction events).
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }
    /// The replica index for `request`, given a view of every replica.
    fn route(&mut self, request: &Request<'_>, replicas: &[ReplicaView]) -> usize;
    /// The host dispatched `request` to `replica`.
    fn on_dispatch(&mut self, _request: &Request<'_>, _replica: usize) {}
    /// A request this router placed has finished.
    fn on_complete(&mut self, _completion: &Completion) {}
    /// A replica evicted cache content (only when `wants_evictions`).
    fn on_evict(&mut self, _eviction: &Eviction<'_>) {}
    /// Named figures for the end-of-run report, shown as `router.<name>` (a scheduler's as
    /// `scheduler.<name>` summed over replicas, a selector's as `selector.<name>`). Names are
    /// ASCII letters, digits and `_`, each at most once; anything else fails the run.
    fn report(&self) -> Vec<(String, f64)> {
        Vec::new()
    }
}

/// A local scheduler in plain Rust.
pub trait SchedulerPolicy: Policy<Context = SchedulerContext> {
    /// Push indices into `waiting` onto `order` (already cleared) in admission order.
    fn order(&mut self, now: f64, waiting: &[WaitingRequest], order: &mut Vec<u32>);
    fn report(&self) -> Vec<(String, f64)> {
        Vec::new()
    }
}

/// A model selector in plain Rust.
pub trait SelectorPolicy: Policy<Context = SelectorContext> {
    /// A model index per module. Use `evaluator` to score allocations on the training set.
    fn select(&mut self, problem: &Problem, evaluator: &mut dyn EvaluateFn) -> Result<Vec<u32>, String>;
    fn report(&self) -> Vec<(String, f64)> {
        Vec::new()
    }
}

/// The evaluator as a selector sees it: a plain-Rust view of the host's [`Evaluator`].
pub trait EvaluateFn {
    /// Run `allocation` on the training set (counts against the budget; fails once it is spent).
    fn evaluate(&mut self, allocation: &[u32]) -> Result<Evaluation, String>;
    /// Evaluations made so far.
    fn evaluations(&self) -> u64;
    /// Evaluations left, if the run has a budget.
    fn remaining(&self) -> Option<u64>;
}

impl EvaluateFn for EvaluatorMut<'_> {
    fn evaluate(&mut self, allocation: &[u32]) -> Result<Evaluation, String> {
        Evaluator::evaluate(self, RSlice::from_slice(allocation)).into_result().map_err(String::from)
    }
    fn evaluations(&self) -> u64 {
        Evaluator::evaluations(self)
    }
    fn remaining(&self) -> Option<u64> {
        Evaluator::remaining(self).into_option()
    }
}

/// The kind of a policy.
pub use crate::root::PolicyKind;

/// Runs `f`, turning a panic into an error that names the policy and the method.
fn guard<T>(policy: &str, method: &str, f: impl FnOnce() -> T) -> RResult<T, RString> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => ROk(v),
        Err(payload) => {
            let msg = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic payload".into());
            RErr(format!("policy '{policy}' panicked in {method}: {msg}").into())
        }
    }
}

fn stats(v: Vec<(String, f64)>) -> RVec<Stat> {
    v.into_iter().map(|(name, value)| Stat { name: name.into(), value }).collect()
}

/// Adapts a plain-Rust policy to the ABI traits, catching panics in every call.
pub struct Guarded<P>(pub P);

impl<P: RouterPolicy> Router for Guarded<P> {
    fn capabilities(&self) -> Capabilities {
        // A panic here would cross the boundary; capabilities are read once and must not panic,
        // so fall back to none if the policy's code does.
        catch_unwind(AssertUnwindSafe(|| self.0.capabilities())).unwrap_or_default()
    }
    fn route(&mut self, request: &Request<'_>, replicas: RSlice<'_, ReplicaView>) -> RResult<u32, RString> {
        guard(P::NAME, "route", || self.0.route(request, replicas.as_slice()) as u32)
    }
    fn on_dispatch(&mut self, request: &Request<'_>, replica: u32) -> RResult<(), RString> {
        guard(P::NAME, "on_dispatch", || self.0.on_dispatch(request, replica as usize))
    }
    fn on_complete(&mut self, completion: &Completion) -> RResult<(), RString> {
        guard(P::NAME, "on_complete", || self.0.on_complete(completion))
    }
    fn on_evict(&mut self, eviction: &Eviction<'_>) -> RResult<(), RString> {
        guard(P::NAME, "on_evict", || self.0.on_evict(eviction))
    }
    fn report(&self) -> RResult<RVec<Stat>, RString> {
        guard(P::NAME, "report", || stats(self.0.report()))
    }
}

impl<P: SchedulerPolicy> Scheduler for Guarded<P> {
    fn order(&mut self, now: f64, waiting: RSlice<'_, WaitingRequest>, order: &mut RVec<u32>) -> RResult<(), RString> {
        guard(P::NAME, "order", || {
            let mut v = std::mem::take(order).into_vec();
            v.clear();
            self.0.order(now, waiting.as_slice(), &mut v);
            *order = v.into();
        })
    }
    fn report(&self) -> RResult<RVec<Stat>, RString> {
        guard(P::NAME, "report", || stats(self.0.report()))
    }
}

impl<P: SelectorPolicy> Selector for Guarded<P> {
    fn select(&mut self, problem: &Problem, mut evaluator: EvaluatorMut<'_>) -> RResult<RVec<u32>, RString> {
        match guard(P::NAME, "select", || self.0.select(problem, &mut evaluator)) {
            ROk(Ok(v)) => ROk(v.into()),
            ROk(Err(e)) => RErr(format!("policy '{}' failed in select: {e}", P::NAME).into()),
            RErr(e) => RErr(e),
        }
    }
    fn report(&self) -> RResult<RVec<Stat>, RString> {
        guard(P::NAME, "report", || stats(self.0.report()))
    }
}

/// Parses `config` (YAML text; empty means all defaults) into `P::Config`.
pub fn parse_config<P: Policy>(config: &str) -> Result<P::Config, String> {
    if config.trim().is_empty() {
        return Ok(P::Config::default());
    }
    serde_norway::from_str(config).map_err(|e| format!("config of '{}': {e}", P::NAME))
}

fn build<P: Policy>(config: &str, context: &P::Context) -> Result<P, String> {
    let cfg = parse_config::<P>(config)?;
    P::new(cfg, context).map_err(|e| format!("config of '{}': {e}", P::NAME))
}

/// A constructor of one kind of policy object.
#[derive(Clone, Copy)]
pub enum Maker {
    Router(fn(&str, &RouterContext) -> Result<RouterBox, String>),
    Scheduler(fn(&str, &SchedulerContext) -> Result<SchedulerBox, String>),
    Selector(fn(&str, &SelectorContext) -> Result<SelectorBox, String>),
}

/// One policy in a library's registry.
#[derive(Clone, Copy)]
pub struct Entry {
    pub name: &'static str,
    pub description: &'static str,
    /// The full default configuration as YAML.
    pub default_config: fn() -> String,
    pub make: Maker,
}

impl Entry {
    pub fn kind(&self) -> PolicyKind {
        match self.make {
            Maker::Router(_) => PolicyKind::Router,
            Maker::Scheduler(_) => PolicyKind::Scheduler,
            Maker::Selector(_) => PolicyKind::Selector,
        }
    }
}

fn default_config<P: Policy>() -> String {
    serde_norway::to_string(&P::Config::default()).unwrap_or_default()
}

/// Registry entry for a router type.
pub fn router<P: RouterPolicy>() -> Entry {
    Entry {
        name: P::NAME,
        description: P::DESCRIPTION,
        default_config: default_config::<P>,
        make: Maker::Router(|config, ctx| {
            build::<P>(config, ctx).map(|p| Router_TO::from_value(Guarded(p), TD_Opaque))
        }),
    }
}

/// Registry entry for a scheduler type.
pub fn scheduler<P: SchedulerPolicy>() -> Entry {
    Entry {
        name: P::NAME,
        description: P::DESCRIPTION,
        default_config: default_config::<P>,
        make: Maker::Scheduler(|config, ctx| {
            build::<P>(config, ctx).map(|p| Scheduler_TO::from_value(Guarded(p), TD_Opaque))
        }),
    }
}

/// Registry entry for a selector type.
pub fn selector<P: SelectorPolicy>() -> Entry {
    Entry {
        name: P::NAME,
        description: P::DESCRIPTION,
        default_config: default_config::<P>,
        make: Maker::Selector(|config, ctx| {
            build::<P>(config, ctx).map(|p| Selector_TO::from_value(Guarded(p), TD_Opaque))
        }),
    }
}
