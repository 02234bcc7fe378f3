//! The fifth policy kind (0.5.4): **scaler**, which decides how many replicas each pool of a
//! cluster should have. Asked every `interval_s` of simulated time with each pool's ready
//! replicas' views and the fleet's signals as named figures ([`crate::facts::fleet`]: queue, KV
//! utilisation, arrival rate, SLO attainment so far, replica counts); it answers the desired
//! replica count of every pool. The host clamps the answer to the pool's `[min, max]`, starts
//! new replicas (routable after a model-load delay, with cold caches) and drains removed ones
//! (no new requests; in-flight requests finish; then they go).
//!
//! Added in a patch through the root module's growth point, as admission was in 0.5.2:
//! [`crate::root::PolicyLib`] gained `scaler_policies` and `new_scaler` after its prefix (a
//! library built before 0.5.4 reads as offering no scaler), and scaler entries have their own
//! listing, since [`crate::PolicyKind`] cannot grow within 0.5.
//!
//! Routers hear of replicas coming and going through [`crate::Router::on_replica_change`]
//! (0.5.4, appended after the vtable's prefix; its default does nothing). What they see needs
//! no hook: the views handed to `route` are the routable replicas only, indexed in the order
//! they became routable, and a scale-down drains the newest first, so a replica keeps its index
//! while it is routable (a stack); a replica that joins later may take the index of one that
//! left. `completion.replica` is the index the request was placed at.

use abi_stable::{
    StableAbi, sabi_trait,
    std_types::{RBox, RResult, RSlice, RString, RVec},
};

use crate::error::PolicyError;
use crate::types::*;

/// What a scaler is told at creation: a fixed core plus named facts.
#[repr(C)]
#[derive(StableAbi, Clone, Debug)]
pub struct ScalerContext {
    /// The world the policy runs in.
    pub world: World,
    /// How many pools it decides for (1 on an aggregated cluster).
    pub pools: u32,
    /// Seed of this policy's own random stream (see [`crate::policy_rng`]).
    pub seed: u64,
    /// Seconds of simulated time between two calls of [`Scaler::desired`].
    pub interval_s: f64,
    /// Seconds a new replica takes to become routable (the model load).
    pub model_load_s: f64,
    /// KV capacity of one replica in tokens.
    pub kv_capacity_tokens: u64,
    /// Named figures ([`crate::facts::context`]).
    pub facts: RVec<Fact>,
}

impl ScalerContext {
    /// A context for `pools` pools asked every `interval_s`, with `seed` and no facts.
    pub fn new(world: World, pools: u32, seed: u64, interval_s: f64) -> Self {
        Self { world, pools, seed, interval_s, model_load_s: 0.0, kv_capacity_tokens: 0, facts: RVec::new() }
    }
    /// The value of context fact `name`, if the host gave it.
    pub fn fact(&self, name: &str) -> Option<f64> {
        self.facts.iter().find(|f| f.name == name).map(|f| f.value)
    }
}

/// One pool as a scaler sees it at a decision.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug)]
pub struct Pool<'a> {
    /// The pool's ready (routable) replicas' views; loading and draining replicas are not here
    /// (their counts are facts).
    pub replicas: Replicas<'a>,
    /// The pool's and the fleet's figures by name ([`crate::facts::fleet`]).
    pub facts: RSlice<'a, Fact>,
}

impl Pool<'_> {
    /// The value of fleet fact `name` (NaN if the host did not give it).
    pub fn fact(&self, name: &str) -> f64 {
        self.facts.iter().find(|f| f.name == name).map_or(f64::NAN, |f| f.value)
    }
}

/// A change in the routable replicas, as [`crate::Router::on_replica_change`] hears it.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq)]
pub struct ReplicaChange {
    /// When (simulated seconds).
    pub at: f64,
    /// The index the replica has (joined) or had (left) among the routable replicas.
    pub replica: u32,
    /// `true`: it became routable (cold caches); `false`: it stopped taking requests (it drains
    /// what it has; completions still name this index).
    pub joined: bool,
    /// How many replicas are routable after the change (the views' length from now on).
    pub routable: u32,
}

// since 0.5.8 {
impl ReplicaChange {
    /// [`crate::Router::on_pool_change`]'s pool: the prefill candidates.
    pub const PREFILL: u8 = 0;
    /// [`crate::Router::on_pool_change`]'s pool: the decode candidates.
    pub const DECODE: u8 = 1;
}
// } since 0.5.8

/// A scaler object, as it crosses the boundary (implement [`crate::ScalerPolicy`]).
#[sabi_trait]
pub trait Scaler: Send {
    /// The desired replica count of each pool (one entry per pool, in order), at `now`.
    fn desired(&mut self, now: f64, pools: RSlice<'_, Pool<'_>>) -> RResult<RVec<u32>, PolicyError>;
    /// Figures to report at the end of a run.
    #[sabi(last_prefix_field)]
    fn report(&self) -> RResult<RVec<Stat>, PolicyError>;
}

/// An owned scaler object.
pub type ScalerBox = Scaler_TO<'static, RBox<()>>;

/// One exported scaler, as the root module's `scaler_policies` lists it.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub struct ScalerInfo {
    /// The policy's name (`Policy::NAME`).
    pub name: RString,
    /// Its one-line description (`Policy::DESCRIPTION`).
    pub description: RString,
    /// The default configuration as YAML text, or why it could not be had.
    pub default_config: RResult<RString, PolicyError>,
}
