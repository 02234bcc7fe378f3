//! The plain-Rust side: what a policy author implements, and how it becomes an ABI object.
//!
//! Implement [`Policy`] (name, description, config, constructor) and one of [`RouterPolicy`],
//! [`SchedulerPolicy`], [`SelectorPolicy`]; list the type in a registry with [`router`],
//! [`scheduler`] or [`selector`]; export the registry with [`crate::export_policies!`].
//! Every call from the host passes through a guard that catches panics.

use std::mem::ManuallyDrop;
use std::panic::{AssertUnwindSafe, catch_unwind};

use abi_stable::{
    sabi_trait::TD_Opaque,
    std_types::{RErr, ROk, RResult, RSlice, RString, RVec},
};
use serde::{Serialize, de::DeserializeOwned};

use crate::error::PolicyError;
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
    /// Build the policy; an `Err` is shown to the user as a configuration error (bad input).
    fn new(config: Self::Config, context: &Self::Context) -> Result<Self, String>;
}

/// A router in plain Rust. Panics are caught by the host-facing wrapper.
pub trait RouterPolicy: Policy<Context = RouterContext> {
    /// What the router asks of the host (exact prefix matches, eviction events, exact work).
    fn capabilities(&self) -> Capabilities {
        Capabilities::NONE
    }
    /// Engine signals to receive on every `route`, by name ([`crate::signals`]); their values
    /// arrive in `replicas` in this order (`replicas.signal(i, k)`).
    fn signals(&self) -> Vec<String> {
        Vec::new()
    }
    /// The replica index for `request`, given a view of every replica. An index outside
    /// `0..replicas.len()` fails the run.
    fn route(&mut self, request: &Request<'_>, replicas: &Replicas<'_>) -> usize;
    /// On a prefill/decode-disaggregated cluster (routers with [`Capabilities::DISAGGREGATED`]):
    /// a [`PdDecision`] given a view of every prefill and every decode instance. The default
    /// routes twice: `route` over `prefill`, then over `decode`. Indices out of range, or an
    /// unknown action, fail the run.
    fn route_pair(&mut self, request: &Request<'_>, prefill: &Replicas<'_>, decode: &Replicas<'_>) -> PdDecision {
        PdDecision::pair(self.route(request, prefill) as u32, self.route(request, decode) as u32)
    }
    /// The host carried out `decision` for `request` (disaggregated clusters).
    fn on_dispatch_pair(&mut self, _request: &Request<'_>, _decision: PdDecision) {}
    /// A request finished its prefill on prefill instance `completion.replica` (disaggregated
    /// clusters; its end comes later through `on_complete`, indexed in the decode pool).
    fn on_prefill_complete(&mut self, _completion: &Completion) {}
    /// The host dispatched `request` to `replica`.
    fn on_dispatch(&mut self, _request: &Request<'_>, _replica: usize) {}
    /// A request this router placed has finished.
    fn on_complete(&mut self, _completion: &Completion) {}
    /// A replica evicted cache content (only with [`Capabilities::WANTS_EVICTIONS`]).
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
    /// Push indices into `waiting` onto `order` (already cleared) in admission order. Indices
    /// left out stay waiting for the next step; see [`Scheduler::order`] for the whole contract.
    fn order(&mut self, now: f64, waiting: &[WaitingRequest], order: &mut Vec<u32>);
    /// Named figures for the end-of-run report.
    fn report(&self) -> Vec<(String, f64)> {
        Vec::new()
    }
}

/// A model selector in plain Rust.
pub trait SelectorPolicy: Policy<Context = SelectorContext> {
    /// A model index per module. Use `evaluator` to score allocations on the training set.
    fn select(&mut self, problem: &Problem, evaluator: &mut dyn EvaluateFn) -> Result<Vec<u32>, String>;
    /// Named figures for the end-of-run report.
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

/// A panic payload as text.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".into())
}

/// Runs `f`, turning a panic into an error that names the policy and the method.
fn guard<T>(policy: &str, method: &str, f: impl FnOnce() -> T) -> RResult<T, PolicyError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => ROk(v),
        Err(payload) => {
            RErr(PolicyError::panicked(format!("policy '{policy}' panicked in {method}: {}", panic_message(&*payload))))
        }
    }
}

fn stats(v: Vec<(String, f64)>) -> RVec<Stat> {
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

impl<P: RouterPolicy> Router for Guarded<P> {
    fn capabilities(&self) -> RResult<Capabilities, PolicyError> {
        guard(P::NAME, "capabilities", || self.policy.capabilities())
    }
    fn signals(&self) -> RResult<RVec<RString>, PolicyError> {
        guard(P::NAME, "signals", || self.policy.signals().into_iter().map(RString::from).collect())
    }
    fn route(&mut self, request: &Request<'_>, replicas: Replicas<'_>) -> RResult<u32, PolicyError> {
        let len = replicas.len();
        match guard(P::NAME, "route", || self.policy.route(request, &replicas)) {
            ROk(i) => replica_index(P::NAME, "route", i, len),
            RErr(e) => RErr(e),
        }
    }
    fn route_pair(
        &mut self,
        request: &Request<'_>,
        prefill: Replicas<'_>,
        decode: Replicas<'_>,
    ) -> RResult<PdDecision, PolicyError> {
        let d = match guard(P::NAME, "route_pair", || self.policy.route_pair(request, &prefill, &decode)) {
            ROk(d) => d,
            RErr(e) => return RErr(e),
        };
        let (p_ok, d_ok) = (d.prefill < prefill.len() as u32, d.decode < decode.len() as u32);
        let bad = match d.action {
            PdDecision::DISAGGREGATE if !p_ok => Some(format!("prefill instance {} of {}", d.prefill, prefill.len())),
            PdDecision::DISAGGREGATE
                if d.prefix_from != PdDecision::NO_SOURCE && d.prefix_from >= prefill.len() as u32 =>
            {
                Some(format!("prefix source {} of {} prefill instances", d.prefix_from, prefill.len()))
            }
            PdDecision::DISAGGREGATE | PdDecision::DECODE_ONLY if !d_ok => {
                Some(format!("decode instance {} of {}", d.decode, decode.len()))
            }
            PdDecision::DISAGGREGATE | PdDecision::DECODE_ONLY | PdDecision::REJECT => None,
            other => Some(format!("unknown action {other}")),
        };
        match bad {
            None => ROk(d),
            Some(what) => {
                RErr(PolicyError::failed(format!("policy '{}' failed in route_pair: it returned {what}", P::NAME)))
            }
        }
    }
    fn on_dispatch_pair(&mut self, request: &Request<'_>, decision: PdDecision) -> RResult<(), PolicyError> {
        guard(P::NAME, "on_dispatch_pair", || self.policy.on_dispatch_pair(request, decision))
    }
    fn on_prefill_complete(&mut self, completion: &Completion) -> RResult<(), PolicyError> {
        guard(P::NAME, "on_prefill_complete", || self.policy.on_prefill_complete(completion))
    }
    fn on_dispatch(&mut self, request: &Request<'_>, replica: u32) -> RResult<(), PolicyError> {
        // u32 → usize widens on every target the host supports (32- and 64-bit).
        guard(P::NAME, "on_dispatch", || self.policy.on_dispatch(request, replica as usize))
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
}

impl<P: SchedulerPolicy> Scheduler for Guarded<P> {
    fn order(
        &mut self,
        now: f64,
        waiting: RSlice<'_, WaitingRequest>,
        order: &mut RVec<u32>,
    ) -> RResult<(), PolicyError> {
        guard(P::NAME, "order", || {
            let mut v = std::mem::take(order).into_vec();
            v.clear();
            self.policy.order(now, waiting.as_slice(), &mut v);
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

/// Parses `config` (YAML text; empty means all defaults) into `P::Config`.
pub fn parse_config<P: Policy>(config: &str) -> Result<P::Config, String> {
    if config.trim().is_empty() {
        return Ok(P::Config::default());
    }
    serde_norway::from_str(config).map_err(|e| format!("config of '{}': {e}", P::NAME))
}

/// Parses the config and calls the constructor; both failures are bad input, a panic in either
/// (the config's `Default` or `Deserialize`, or `new`) is caught and typed as one.
fn build<P: Policy>(config: &str, context: &P::Context) -> Result<P, PolicyError> {
    let made = catch_unwind(AssertUnwindSafe(|| {
        let cfg = parse_config::<P>(config).map_err(PolicyError::bad_config)?;
        P::new(cfg, context).map_err(|e| PolicyError::bad_config(format!("config of '{}': {e}", P::NAME)))
    }));
    made.unwrap_or_else(|payload| {
        Err(PolicyError::panicked(format!(
            "policy '{}' panicked in its constructor: {}",
            P::NAME,
            panic_message(&*payload)
        )))
    })
}

/// A constructor of one kind of policy object.
#[derive(Clone, Copy)]
pub enum Maker {
    /// Builds a router from config text and context.
    Router(fn(&str, &RouterContext) -> Result<RouterBox, PolicyError>),
    /// Builds a scheduler from config text and context.
    Scheduler(fn(&str, &SchedulerContext) -> Result<SchedulerBox, PolicyError>),
    /// Builds a selector from config text and context.
    Selector(fn(&str, &SelectorContext) -> Result<SelectorBox, PolicyError>),
}

/// One policy in a library's registry.
#[derive(Clone, Copy)]
pub struct Entry {
    /// [`Policy::NAME`].
    pub name: &'static str,
    /// [`Policy::DESCRIPTION`].
    pub description: &'static str,
    /// The full default configuration as YAML (may panic if the config's `Default` or
    /// `Serialize` does: call it under `catch_unwind`).
    pub default_config: fn() -> String,
    /// The constructor.
    pub make: Maker,
}

impl Entry {
    /// The default configuration as YAML, with a panic in the config's `Default` or `Serialize`
    /// turned into an error naming the policy.
    pub fn default_config_checked(&self) -> Result<String, PolicyError> {
        catch_unwind(self.default_config).map_err(|payload| {
            PolicyError::panicked(format!(
                "policy '{}' panicked building its default config: {}",
                self.name,
                panic_message(&*payload)
            ))
        })
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
            build::<P>(config, ctx).map(|p| Router_TO::from_value(Guarded::new(p), TD_Opaque))
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
            build::<P>(config, ctx).map(|p| Scheduler_TO::from_value(Guarded::new(p), TD_Opaque))
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
            build::<P>(config, ctx).map(|p| Selector_TO::from_value(Guarded::new(p), TD_Opaque))
        }),
    }
}
