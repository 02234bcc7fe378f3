//! # routelab-policy-api: write a routing policy once, run it built in or as a plugin
//!
//! routelab scores request-routing policies on simulated LLM serving. A policy is one of five
//! kinds (the fourth, admission, since 0.5.2: [`mod@admission`]; the fifth, scaler, since 0.5.4:
//! [`mod@scaler`]):
//!
//! - a **router** picks a replica for each arriving request ([`RouterPolicy`]); the same router
//!   runs in the classic *dispatch* world (FCFS servers) and in the *cluster* world (LLM replicas
//!   with prefix caches);
//! - a **scheduler** orders one replica's waiting queue before each step ([`SchedulerPolicy`]);
//! - a **selector** picks a model for each module of a compound AI system ([`SelectorPolicy`]);
//! - an **admission** policy decides, before routing, whether a request is admitted now, held,
//!   rejected or shed (`AdmissionPolicy`, 0.5.2);
//! - a **scaler** decides, at an interval, how many replicas each pool should have
//!   (`ScalerPolicy`, 0.5.4).
//!
//! ## The contract in five steps
//!
//! 1. Make a `cdylib` crate that depends on this crate (`routelab new-policy DIR --kind router`
//!    generates one that builds as is).
//! 2. Define a config type (`#[derive(Serialize, Deserialize, Default)]`, with
//!    `#[serde(default, deny_unknown_fields)]`) and implement [`Policy`] for your type: its name,
//!    a one-line description, and a constructor from the parsed config and a context (for routers,
//!    [`RouterContext`]: replica count, seed, KV capacity, the host's step pricer [`CostModel`],
//!    named facts).
//! 3. Implement the kind's trait. A router's [`RouterPolicy::route`] gets the [`Request`] and a
//!    [`ReplicaView`] per replica (through [`Replicas`], which also carries the engine
//!    [`signals`] the router asked for) and returns an index; the hooks `on_dispatch`,
//!    `on_complete`, `on_abandon` and `on_evict` default to nothing (`on_abandon`: as
//!    `on_complete`).
//! 4. List your types in a registry function returning `Vec<Entry>` ([`router`], [`pd_router`],
//!    [`scheduler`], [`selector`] make entries) and export it with [`export_policies!`].
//! 5. `cargo build --release`, then `routelab compare WORKLOAD --policies
//!    ./target/release/libNAME.so:NAME,least_requests`.
//!
//! ## Rules the host relies on
//!
//! - **Determinism.** Never read wall-clock time or a thread-local/OS random generator. Time comes
//!   in the request (`arrived_at`, simulated); randomness from [`policy_rng`] seeded with the
//!   context's `seed` (the [`rand`] crate's traits are re-exported here, so `use
//!   routelab_policy_api::*;` is enough to call `rng.random_range(..)`). The same seed then
//!   replays bit for bit, linked in or loaded.
//! - **Errors are typed.** Every call returns a [`PolicyError`] on failure, whose [`ErrorKind`]
//!   says how the host reports it: `BAD_CONFIG` (a constructor's `Err`, a config that does not
//!   parse: bad input, exit code 2), `FAILED` (a run-time failure, exit code 1) or `PANICKED`.
//! - **Panics** are caught at the boundary ([`Guarded`]) — in every method, in the constructor, in
//!   the config's `Default`/`Serialize`, in the registry function and in the policy's destructor —
//!   and fail that policy's run with a message naming the policy and the method; other policies in
//!   the comparison still report. Returning an index outside `0..replicas.len()` is an error too
//!   (checked before any cast, so 2^32 does not wrap to replica 0). What is *not* contained:
//!   `abort`, `process::exit`, stack overflow, out-of-memory, a segfault in `unsafe` code, an
//!   endless loop — a library runs in the host's process.
//! - **Only the types in [`types`], [`error`], [`cost`] and [`traits`] cross the boundary.** Config crosses
//!   as YAML text and is parsed inside the plugin, so a library may hold any number of policies.
//!
//! ## Versions: what needs a rebuild
//!
//! The host refuses a library built against another 0.x minor of this crate ("rebuild the plugin
//! against …"); within a minor, every change is made so that a library built against an earlier
//! patch keeps loading and behaving as before. A test (`host/tests/integration/compat.rs`) builds
//! a plugin against the minor's first patch (0.M.0, now 0.5.0) — this crate relabelled so, with
//! every item a later patch appended cut out (each sits between `// since 0.M.N {` and
//! `// } since 0.M.N` lines) — loads it in the current host, checks its decisions bit for bit, and
//! that an appended method's default (`on_abandon`'s) runs for it.
//!
//! Growth points (compatible, a patch release; old plugins keep loading):
//!
//! | What grows | How |
//! |---|---|
//! | a figure about each replica | a new engine signal name ([`signals`]) |
//! | a figure about a request | a new request-fact name ([`facts::request`]) |
//! | a figure a policy is told at creation | a new context-fact name ([`facts::context`]) |
//! | a pricing question | a method appended to [`StepPricer`], with a default body |
//! | a hook | a method appended to a trait after its `#[sabi(last_prefix_field)]` method, with a default body (as `Router::on_abandon` in 0.5.1); where no default would be right for an older library, a capability bit the plain-Rust wrapper sets beside it, so a host refuses the older library before the run instead (`on_mixed_change` and `HEARS_MIXED_CHANGES` in 0.5.13) |
//! | a capability | a new [`Capabilities`] bit (hosts ignore bits they do not know) |
//! | an error kind, a P/D action | a new [`ErrorKind`] / [`PdDecision`] code (hosts treat unknown kinds as `FAILED`, refuse unknown actions) |
//! | a policy kind | a field appended to the root module [`root::PolicyLib`] (`missing_field(option)`), with its own listing (as admission in 0.5.2 and scaler in 0.5.4: [`PolicyKind`] cannot grow) |
//! | plain-Rust helpers | new types, functions and methods (`policy`, `toolkit`, `cost`) |
//!
//! A name a policy asks for that its host does not know (a newer plugin on an older host) is a
//! clear error at creation, never a wrong value.
//!
//! Breaking (a new minor; every plugin must be rebuilt):
//! - adding, removing, reordering or retyping a field of any `#[repr(C)]` type in [`types`]
//!   (`Request`, `ReplicaView`, contexts, …) or [`error`] — which the growth points above make
//!   unnecessary;
//! - changing a method's signature, or adding a method before a trait's `last_prefix_field`;
//! - adding a variant to an `enum` that crosses ([`World`], [`PolicyKind`]);
//! - changing what a field, name or method means.
//!
//! `CHANGELOG.md` lists every change with its kind.
//!
//! ## Prefill/decode disaggregation
//!
//! On a disaggregated cluster a request needs a prefill instance *and* a decode instance, and the
//! field orders that choice in five ways: decode first then a decider then prefill (llm-d),
//! prefill first then decode by load (Dynamo), both independently (SGLang), jointly over pairs
//! (AIBrix), jointly with admission control and prefix migration (Mooncake); some skip the
//! prefill pool when most of the prompt is cached. A router with
//! [`Capabilities::DISAGGREGATED`] answers [`Router::route_pair`] with a [`PdDecision`] (in plain
//! Rust, [`PdRouterPolicy::route_pair`] with a [`PdRoute`], which the wrapper converts): it sees
//! *both* pools' views in one call and returns a pair, a decode instance alone
//! ([`PdDecision::DECODE_ONLY`]) or a rejection ([`PdDecision::REJECT`]).
//!
//! Why one call that sees both pools rather than a new policy kind (a "prefill router" and a
//! "decode router" called in turn): every order above is a function of both views, so one call
//! expresses all of them, while a fixed call order would hard-code one (llm-d's decider needs the
//! decode pick before the prefill one, Dynamo the reverse, AIBrix neither). Keeping it a router
//! also keeps one loader path, one handle, one `report`, the same signals and the same
//! `on_complete` bookkeeping; composing two plain routers (SGLang's independent choice) is itself
//! a router (`pd_sglang`). The context's [`PdContext`] gives what a real PD router knows: pool
//! sizes, capacities, cost models, the link (layer-wise or not) and the shared KV tier.
//!
//! Mixed instances (0.4.0) can prefill, decode, or both for one request. Rather than a third
//! view, the two views overlap: the prefill candidates end with the mixed instances and the
//! decode candidates start with them, so every router written for two pools keeps working (it
//! simply has more candidates on each side), and "both on one instance, no transfer" is a
//! `DISAGGREGATE` pair naming the same mixed instance twice ([`PdContext::as_decode`]).
//!
//! ## A router in one page
//!
//! ```
//! use routelab_policy_api::prelude::*;
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize, Default)]
//! #[serde(default, deny_unknown_fields)]
//! pub struct Config {}
//!
//! /// Fewest outstanding requests, lowest index on ties.
//! pub struct Fewest;
//!
//! impl Policy for Fewest {
//!     const NAME: &'static str = "fewest";
//!     const DESCRIPTION: &'static str = "fewest outstanding requests, lowest index on ties";
//!     type Config = Config;
//!     type Context = RouterContext;
//!     fn new(_: Config, _: &RouterContext) -> Result<Self, String> { Ok(Fewest) }
//! }
//!
//! impl RouterPolicy for Fewest {
//!     fn route(&mut self, _: &Request<'_>, replicas: &Replicas<'_>) -> usize {
//!         (0..replicas.len()).min_by_key(|&i| replicas[i].outstanding_requests).unwrap()
//!     }
//! }
//!
//! pub fn registry() -> Vec<Entry> { vec![router::<Fewest>()] }
//! // In a cdylib crate: routelab_policy_api::export_policies!(registry);
//! ```
#![allow(non_local_definitions)]
#![warn(missing_docs)]

/// The version of this crate; a plugin must be built against the same 0.x minor as its host.
pub const API_VERSION: &str = env!("CARGO_PKG_VERSION");

// since 0.5.2 {
mod accessors;
pub mod admission;
pub mod admission_policy;
// } since 0.5.2
pub mod cost;
pub mod error;
pub mod facts;
pub mod policy;
pub mod root;
// since 0.5.4 {
pub mod scaler;
pub mod scaler_policy;
// } since 0.5.4
pub mod signals;
pub mod toolkit;
pub mod traits;
pub mod types;

/// What a policy author needs, and none of the ABI's machinery (the `#[sabi_trait]` objects, the
/// root module, the `R*` std types): `use routelab_policy_api::prelude::*;`. The crate root
/// re-exports everything, the ABI included, for hosts and for code written before the prelude.
pub mod prelude {
    pub use crate::cost::{Chunk, CostModel, Roofline, Step, StepShape};
    pub use crate::policy::{
        Entry, EvaluateFn, PdRoute, PdRouterPolicy, Policy, RouterPolicy, SchedulerPolicy, SelectorPolicy, pd_router,
        router, scheduler, selector,
    };
    pub use crate::toolkit::*;
    pub use crate::types::{
        Capabilities, Completion, Evaluation, Eviction, Fact, ModelInfo, ModuleInfo, PdContext, Problem, ReplicaView,
        Replicas, Request, RouterContext, SchedulerContext, Segment, SelectorContext, Waiting, WaitingRequest, World,
    };
    pub use crate::{export_policies, facts, signals};
    // since 0.5.2 {
    pub use crate::admission::{AdmissionContext, AdmissionDecision, AdmissionInfo};
    pub use crate::admission_policy::{AdmissionPolicy, admission};
    // } since 0.5.2
    // since 0.5.4 {
    pub use crate::scaler::{Pool, ReplicaChange, ScalerContext};
    pub use crate::scaler_policy::{ScalerPolicy, scaler};
    // } since 0.5.4
    // since 0.5.8 {
    pub use crate::policy::PdPool;
    // } since 0.5.8
    pub use rand::{Rng, RngExt, SeedableRng, seq::IndexedRandom, seq::SliceRandom};
}

// since 0.5.2 {
pub use admission::{Admission, AdmissionBox, AdmissionContext, AdmissionDecision, AdmissionInfo};
pub use admission_policy::{AdmissionPolicy, admission};
// } since 0.5.2
// since 0.5.4 {
pub use scaler::{Pool, ReplicaChange, Scaler, ScalerBox, ScalerContext, ScalerInfo};
pub use scaler_policy::{ScalerPolicy, scaler};
// } since 0.5.4
pub use abi_stable;
pub use abi_stable::std_types::{RSlice, RString, RVec};
pub use cost::{Chunk, CostModel, Roofline, Step, StepPricer, StepShape};
pub use error::{ErrorKind, PolicyError};
pub use policy::*;
/// The `rand` crate this API is built with, for what the re-exported traits do not cover
/// (distributions, `seq` helpers): `routelab_policy_api::rand::distr::Uniform`.
pub use rand;
/// The traits a policy needs to draw from [`PolicyRng`]: `rng.random::<f64>()`,
/// `rng.random_range(0..n)`, `rng.random_bool(p)`, `slice.shuffle(&mut rng)`, `slice.choose(&mut rng)`.
pub use rand::{Rng, RngExt, SeedableRng, seq::IndexedRandom, seq::SliceRandom};
pub use root::{PolicyInfo, PolicyKind, PolicyLib, PolicyLibRef, library};
pub use toolkit::*;
pub use traits::*;
pub use types::*;
