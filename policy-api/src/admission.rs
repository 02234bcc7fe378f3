//! The fourth policy kind (0.5.2): **admission**, which decides before routing whether a request
//! is admitted now, held in a queue, rejected or shed, and which held request goes next when
//! capacity frees.
//!
//! Added in a patch through the root module's growth point: [`crate::root::PolicyLib`] gained the
//! field `new_admission` after its prefix (a library built before 0.5.2 reads as offering no
//! admission policy), and the libraries' admission entries are listed by its own field
//! `admission_policies`, not by `policies()`: [`crate::PolicyKind`] crosses the boundary inside
//! [`crate::PolicyInfo`], and a fourth variant would change its layout (a breaking change), so
//! admission is not one of its variants.
//!
//! The host's order of calls, per request: [`Admission::on_arrival`] (before the router sees it);
//! on `ADMIT` the router places it at once; on `HOLD` the host keeps it; then, whenever capacity
//! may have freed (a replica's step ended) and requests are held, [`Admission::next`] until it
//! answers `WAIT`. Each admitted request that finishes is reported to [`Admission::on_complete`].
//! Every request ends exactly once: finished, rejected, shed, or unfinished at the horizon.

use abi_stable::{
    StableAbi, sabi_trait,
    std_types::{RBox, RResult, RString, RVec},
};

use crate::error::PolicyError;
use crate::types::*;

/// What an admission policy is told at creation: a fixed core plus named facts.
#[repr(C)]
#[derive(StableAbi, Clone, Debug)]
pub struct AdmissionContext {
    /// The world the policy runs in.
    pub world: World,
    /// Number of replicas it sees views of.
    pub replicas: u32,
    /// Seed of this policy's own random stream (see [`crate::policy_rng`]).
    pub seed: u64,
    /// KV capacity of one replica in tokens.
    pub kv_capacity_tokens: u64,
    /// Named figures ([`crate::facts::context`]: among them `classes.count`, `tenants.count`).
    pub facts: RVec<Fact>,
}

impl AdmissionContext {
    /// A context with `replicas` replicas, `seed` and no facts.
    pub fn new(world: World, replicas: u32, seed: u64) -> Self {
        Self { world, replicas, seed, kv_capacity_tokens: 0, facts: RVec::new() }
    }
    /// The value of context fact `name`, if the host gave it.
    pub fn fact(&self, name: &str) -> Option<f64> {
        self.facts.iter().find(|f| f.name == name).map(|f| f.value)
    }
}

/// An admission decision: an action code (an open set of `u8`s, like [`PdDecision`]: a host
/// refuses a code it does not know), a queue and, from [`Admission::next`], a request.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AdmissionDecision {
    /// [`Self::ADMIT`], [`Self::HOLD`], [`Self::REJECT`], [`Self::SHED`] or [`Self::WAIT`].
    pub action: u8,
    /// `HOLD`: the queue the request waits in (reported per queue; the policy's own numbering).
    pub queue: u32,
    /// From `next`: the held request (its id) to admit or shed.
    pub request: u64,
}

impl AdmissionDecision {
    /// Admit: the router places the request now.
    pub const ADMIT: u8 = 0;
    /// Hold the request (on arrival only); `next` releases it later.
    pub const HOLD: u8 = 1;
    /// Turn the request away on arrival (rate limit, predicted overload: an HTTP 429).
    pub const REJECT: u8 = 2;
    /// Drop a sheddable request (on arrival, or a held one from `next`).
    pub const SHED: u8 = 3;
    /// From `next`: release nothing now.
    pub const WAIT: u8 = 4;

    /// Admit now.
    pub const fn admit() -> Self {
        Self { action: Self::ADMIT, queue: 0, request: 0 }
    }
    /// Hold in `queue`.
    pub const fn hold(queue: u32) -> Self {
        Self { action: Self::HOLD, queue, request: 0 }
    }
    /// Reject on arrival.
    pub const fn reject() -> Self {
        Self { action: Self::REJECT, queue: 0, request: 0 }
    }
    /// Shed.
    pub const fn shed() -> Self {
        Self { action: Self::SHED, queue: 0, request: 0 }
    }
    /// From `next`: admit held request `id`.
    pub const fn release(id: u64) -> Self {
        Self { action: Self::ADMIT, queue: 0, request: id }
    }
    /// From `next`: shed held request `id`.
    pub const fn shed_held(id: u64) -> Self {
        Self { action: Self::SHED, queue: 0, request: id }
    }
    /// From `next`: nothing now.
    pub const fn wait() -> Self {
        Self { action: Self::WAIT, queue: 0, request: 0 }
    }
}

/// An admission policy object, as it crosses the boundary (implement [`crate::admission_policy::AdmissionPolicy`]).
#[sabi_trait]
pub trait Admission: Send {
    /// The request facts ([`crate::facts::request`]) this policy reads, by name; read once.
    fn request_facts(&self) -> RResult<RVec<RString>, PolicyError>;
    /// `request` arrived (`request.arrived_at` is now); `replicas` are the replicas' views.
    fn on_arrival(&mut self, request: &Request<'_>, replicas: Replicas<'_>) -> RResult<AdmissionDecision, PolicyError>;
    /// Capacity may have freed at `now` and requests are held: a held request to admit or shed,
    /// or `WAIT`. The host calls it again after each `ADMIT`/`SHED`.
    fn next(&mut self, now: f64, replicas: Replicas<'_>) -> RResult<AdmissionDecision, PolicyError>;
    /// An admitted request finished.
    fn on_complete(&mut self, completion: &Completion) -> RResult<(), PolicyError>;
    /// Figures to report at the end of a run.
    #[sabi(last_prefix_field)]
    fn report(&self) -> RResult<RVec<Stat>, PolicyError>;
}

/// An owned admission object.
pub type AdmissionBox = Admission_TO<'static, RBox<()>>;

/// One exported admission policy, as the root module's `admission_policies` lists it.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub struct AdmissionInfo {
    /// The policy's name (`Policy::NAME`).
    pub name: RString,
    /// Its one-line description (`Policy::DESCRIPTION`).
    pub description: RString,
    /// The default configuration as YAML text, or why it could not be had.
    pub default_config: RResult<RString, PolicyError>,
}
