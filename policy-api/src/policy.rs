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

mod guarded;

pub use self::guarded::{Guarded, GuardedPd};
pub(crate) use self::guarded::{guard, names, panic_message, stats};

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
    /// Request facts to receive with every request, by name ([`crate::facts::request`]); their
    /// values arrive in the request in this order (`request.fact(k)`).
    fn request_facts(&self) -> Vec<String> {
        Vec::new()
    }
    /// The replica index for `request`, given a view of every replica. An index outside
    /// `0..replicas.len()` fails the run.
    fn route(&mut self, request: &Request<'_>, replicas: &Replicas<'_>) -> usize;
    /// The host dispatched `request` to `replica`: the next routing call after this request's
    /// `route` (a request sent nowhere gets none, and the next call is the next `route`). A
    /// gateway may have sent it to another replica than the one chosen (its backend was down).
    /// What `route` worked out travels here in [`crate::toolkit::Carried`].
    fn on_dispatch(&mut self, _request: &Request<'_>, _replica: usize) {}
    /// A request this router placed has finished.
    fn on_complete(&mut self, _completion: &Completion) {}
    /// A request this router placed will not complete there (the client gave up, the send
    /// failed). Default: as [`RouterPolicy::on_complete`].
    fn on_abandon(&mut self, abandoned: &Completion) {
        self.on_complete(abandoned)
    }
    // since 0.5.4 {
    /// A replica became routable or stopped taking requests (autoscaling, 0.5.4). Default:
    /// nothing (the views already show only routable replicas).
    fn on_replica_change(&mut self, _change: &crate::scaler::ReplicaChange) {}
    // } since 0.5.4
    /// A replica evicted cache content (only with [`Capabilities::WANTS_EVICTIONS`]).
    fn on_evict(&mut self, _eviction: &Eviction<'_>) {}
    /// Named figures for the end-of-run report, shown as `router.<name>` (a scheduler's as
    /// `scheduler.<name>` summed over replicas, a selector's as `selector.<name>`). Names are
    /// ASCII letters, digits and `_`, each at most once; anything else fails the run.
    fn report(&self) -> Vec<(String, f64)> {
        Vec::new()
    }
}

/// What a P/D router decides for one request, in plain Rust. Indices are into the `prefill` and
/// `decode` candidates of [`PdRouterPolicy::route_pair`]; the wrapper checks each against its
/// pool before converting it to the ABI's [`PdDecision`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PdRoute {
    /// Prefill on `prefill`, move the KV cache to `decode`, decode there. With `prefix_from`,
    /// first copy the prompt's cached prefix from that prefill candidate to `prefill` (Mooncake's
    /// hot-prefix migration).
    Disaggregate {
        /// Index into the prefill candidates.
        prefill: usize,
        /// Index into the decode candidates.
        decode: usize,
        /// A prefill candidate to copy the cached prefix from first.
        prefix_from: Option<usize>,
    },
    /// Skip the prefill pool: `decode` prefills the request itself (conditional disaggregation).
    DecodeOnly {
        /// Index into the decode candidates.
        decode: usize,
    },
    /// Turn the request away (admission control); it is counted, not served.
    Reject,
}

impl PdRoute {
    /// Prefill on `prefill`, decode on `decode`.
    pub const fn pair(prefill: usize, decode: usize) -> Self {
        Self::Disaggregate { prefill, decode, prefix_from: None }
    }
    /// The prefill candidate, when the request is disaggregated.
    pub const fn prefill(&self) -> Option<usize> {
        match *self {
            PdRoute::Disaggregate { prefill, .. } => Some(prefill),
            _ => None,
        }
    }
    /// The decode candidate, unless the request is rejected.
    pub const fn decode(&self) -> Option<usize> {
        match *self {
            PdRoute::Disaggregate { decode, .. } | PdRoute::DecodeOnly { decode } => Some(decode),
            PdRoute::Reject => None,
        }
    }
    /// The decision as the ABI carries it, every index checked against its pool before the cast.
    pub fn to_decision(self, prefill_len: usize, decode_len: usize) -> Result<PdDecision, String> {
        let index = |what: &str, i: usize, len: usize| match u32::try_from(i) {
            Ok(v) if i < len => Ok(v),
            _ => Err(format!("{what} {i} of {len}")),
        };
        Ok(match self {
            PdRoute::Disaggregate { prefill, decode, prefix_from } => {
                let d = PdDecision::pair(
                    index("prefill instance", prefill, prefill_len)?,
                    index("decode instance", decode, decode_len)?,
                );
                match prefix_from {
                    Some(s) => d.with_prefix_from(index("prefix source", s, prefill_len)?),
                    None => d,
                }
            }
            PdRoute::DecodeOnly { decode } => PdDecision::decode_only(index("decode instance", decode, decode_len)?),
            PdRoute::Reject => PdDecision::reject(),
        })
    }
    /// The plain form of an ABI decision (`None` for an action this version does not know).
    pub fn from_decision(d: PdDecision) -> Option<Self> {
        match d.action {
            PdDecision::DISAGGREGATE => Some(PdRoute::Disaggregate {
                prefill: d.prefill as usize,
                decode: d.decode as usize,
                prefix_from: (d.prefix_from != PdDecision::NO_SOURCE).then_some(d.prefix_from as usize),
            }),
            PdDecision::DECODE_ONLY => Some(PdRoute::DecodeOnly { decode: d.decode as usize }),
            PdDecision::REJECT => Some(PdRoute::Reject),
            _ => None,
        }
    }
}

/// A router for prefill/decode-disaggregated clusters, in plain Rust: it sees both pools in one
/// call and answers a [`PdRoute`]. Registered with [`pd_router`], which sets
/// [`Capabilities::DISAGGREGATED`] for it (the host refuses it on other clusters). Panics are
/// caught by the host-facing wrapper.
pub trait PdRouterPolicy: Policy<Context = RouterContext> {
    /// What the router asks of the host besides [`Capabilities::DISAGGREGATED`].
    fn capabilities(&self) -> Capabilities {
        Capabilities::NONE
    }
    /// Engine signals to receive, by name ([`crate::signals`]), as for [`RouterPolicy::signals`].
    fn signals(&self) -> Vec<String> {
        Vec::new()
    }
    /// Request facts to receive, by name ([`crate::facts::request`]).
    fn request_facts(&self) -> Vec<String> {
        Vec::new()
    }
    /// The decision for `request`, given a view of every prefill and every decode candidate.
    /// Indices out of range fail the run.
    fn route_pair(&mut self, request: &Request<'_>, prefill: &Replicas<'_>, decode: &Replicas<'_>) -> PdRoute;
    /// The host carried out `decision` for `request` (a rejection included).
    fn on_dispatch_pair(&mut self, _request: &Request<'_>, _decision: PdRoute) {}
    /// A request finished its prefill on prefill candidate `completion.replica` (its end comes
    /// later through `on_complete`, indexed in the decode candidates).
    fn on_prefill_complete(&mut self, _completion: &Completion) {}
    /// A request this router placed has finished (`completion.replica`: its decode candidate).
    fn on_complete(&mut self, _completion: &Completion) {}
    /// A request this router placed will not complete where it was placed (an instance it was
    /// on, or was bound for, crashed; the host may route it again as a new decision);
    /// `abandoned.replica` is its decode candidate, as for `on_complete`, whether or not its
    /// prefill had completed. Default: as `on_complete`.
    fn on_abandon(&mut self, abandoned: &Completion) {
        self.on_complete(abandoned)
    }
    // since 0.5.8 {
    /// An instance joined or left `pool`'s candidates (0.5.8): `change.replica` and
    /// `change.routable` count in that pool, as `route_pair`'s views index it (the instances
    /// above a leaving one move down one index; a joining one takes the top index). Default:
    /// nothing (the views already show only routable instances).
    fn on_pool_change(&mut self, _pool: PdPool, _change: &crate::scaler::ReplicaChange) {}
    // } since 0.5.8
    // since 0.5.13 {
    /// A mixed instance (a candidate of both pools) joined or left both at once (0.5.13):
    /// `prefill` counts in the prefill candidates, `decode` in the decode candidates, as for
    /// [`Self::on_pool_change`] (a mixed instance sits above the prefill-only ones and below the
    /// decode-only ones: it leaves from, and rejoins at, the top of the prefill candidates and
    /// the top of the mixed ones among the decode candidates). Default: `on_pool_change` for
    /// each pool in turn, which is right for a router keeping per-pool state by index; one that
    /// pairs the pools' indices ([`PdContext::as_decode`]) keeps its context current with
    /// [`PdContext::apply_mixed_change`].
    fn on_mixed_change(&mut self, prefill: &crate::scaler::ReplicaChange, decode: &crate::scaler::ReplicaChange) {
        self.on_pool_change(PdPool::Prefill, prefill);
        self.on_pool_change(PdPool::Decode, decode);
    }
    // } since 0.5.13
    /// A cache eviction (only with [`Capabilities::WANTS_EVICTIONS`]); `eviction.replica` is the
    /// instance index (see [`PdContext`]).
    fn on_evict(&mut self, _eviction: &Eviction<'_>) {}
    /// Named figures for the end-of-run report, as for [`RouterPolicy::report`].
    fn report(&self) -> Vec<(String, f64)> {
        Vec::new()
    }
    // since 0.5.10 {
    /// A failure the router recorded instead of panicking (0.5.10) — a composed child router's
    /// error, say, which a plain method cannot return: the wrapper asks after every call and, if
    /// there is one, fails that call with it (the host names this policy and the method). Keep
    /// it in a `Cell<Option<PolicyError>>` so `report(&self)` can record one too. Default: none.
    fn take_failure(&self) -> Option<PolicyError> {
        None
    }
    // } since 0.5.10
}

// since 0.5.8 {
/// One pool of a disaggregated cluster, as [`PdRouterPolicy::on_pool_change`] names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PdPool {
    /// The prefill candidates (`route_pair`'s `prefill` views).
    Prefill,
    /// The decode candidates (`route_pair`'s `decode` views).
    Decode,
}

impl PdPool {
    /// The pool the ABI's `pool` number names ([`crate::ReplicaChange::PREFILL`] or
    /// [`crate::ReplicaChange::DECODE`]), if any.
    pub const fn from_abi(pool: u8) -> Option<Self> {
        match pool {
            crate::scaler::ReplicaChange::PREFILL => Some(Self::Prefill),
            crate::scaler::ReplicaChange::DECODE => Some(Self::Decode),
            _ => None,
        }
    }
}
// } since 0.5.8

// since 0.5.13 {
/// Keeping a router's copy of the pools' counts current as instances come and go (here rather
/// than beside [`PdContext`]'s fields, so that `types` stays below `policy` and `scaler`).
impl PdContext {
    /// Added in 0.5.13. Keeps the counts current through a change in one pool
    /// ([`crate::PdRouterPolicy::on_pool_change`]): after a prefill-only instance joined or
    /// left, the prefill candidates are `change.routable` and the mixed ones unchanged; a
    /// decode-pool change leaves the counts as they are.
    pub fn apply_pool_change(&mut self, pool: PdPool, change: &crate::scaler::ReplicaChange) {
        if pool == PdPool::Prefill {
            self.prefill_replicas = change.routable;
        }
    }
    /// Added in 0.5.13. Keeps the counts current through a mixed instance's change
    /// ([`crate::PdRouterPolicy::on_mixed_change`]): one more or one fewer mixed candidate.
    pub fn apply_mixed_change(&mut self, prefill: &crate::scaler::ReplicaChange) {
        self.prefill_replicas = prefill.routable;
        self.mixed_replicas =
            if prefill.joined { self.mixed_replicas + 1 } else { self.mixed_replicas.saturating_sub(1) };
    }
}
// } since 0.5.13

/// A local scheduler in plain Rust.
pub trait SchedulerPolicy: Policy<Context = SchedulerContext> {
    /// Request facts to receive for every waiting request, by name ([`crate::facts::request`]);
    /// their values arrive in `waiting` in this order (`waiting.fact(i, k)`).
    fn request_facts(&self) -> Vec<String> {
        Vec::new()
    }
    /// Push indices into `waiting` onto `order` (already cleared) in admission order. Indices
    /// left out stay waiting for the next step; see [`Scheduler::order`] for the whole contract.
    fn order(&mut self, now: f64, waiting: &Waiting<'_>, order: &mut Vec<u32>);
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
        Evaluator::evaluate(self, RSlice::from_slice(allocation)).into_result().map_err(|e| e.message.into())
    }
    fn evaluations(&self) -> u64 {
        Evaluator::evaluations(self)
    }
    fn remaining(&self) -> Option<u64> {
        Evaluator::remaining(self).into_option()
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
pub(crate) fn build<P: Policy>(config: &str, context: &P::Context) -> Result<P, PolicyError> {
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
    // since 0.5.2 {
    /// Builds an admission policy from config text and context (0.5.2).
    Admission(fn(&str, &crate::admission::AdmissionContext) -> Result<crate::admission::AdmissionBox, PolicyError>),
    // } since 0.5.2
    // since 0.5.4 {
    /// Builds a scaler from config text and context (0.5.4).
    Scaler(fn(&str, &crate::scaler::ScalerContext) -> Result<crate::scaler::ScalerBox, PolicyError>),
    // } since 0.5.4
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

pub(crate) fn default_config<P: Policy>() -> String {
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

/// Registry entry for a prefill/decode router type.
pub fn pd_router<P: PdRouterPolicy>() -> Entry {
    Entry {
        name: P::NAME,
        description: P::DESCRIPTION,
        default_config: default_config::<P>,
        make: Maker::Router(|config, ctx| {
            build::<P>(config, ctx).map(|p| Router_TO::from_value(GuardedPd::new(p), TD_Opaque))
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
