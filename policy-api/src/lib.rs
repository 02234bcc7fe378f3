//! # routelab-policy-api: write a routing policy once, run it built in or as a plugin
//!
//! routelab scores request-routing policies on simulated LLM serving. A policy is one of three
//! kinds:
//!
//! - a **router** picks a replica for each arriving request ([`RouterPolicy`]); the same router
//!   runs in the classic *dispatch* world (FCFS servers) and in the *cluster* world (LLM replicas
//!   with prefix caches);
//! - a **scheduler** orders one replica's waiting queue before each step ([`SchedulerPolicy`]);
//! - a **selector** picks a model for each module of a compound AI system ([`SelectorPolicy`]).
//!
//! ## The contract in five steps
//!
//! 1. Make a `cdylib` crate that depends on this crate (`routelab new-policy DIR --kind router`
//!    generates one that builds as is).
//! 2. Define a config type (`#[derive(Serialize, Deserialize, Default)]`, with
//!    `#[serde(default, deny_unknown_fields)]`) and implement [`Policy`] for your type: its name,
//!    a one-line description, and a constructor from the parsed config and a context (for routers,
//!    [`RouterContext`]: replica count, seed, KV capacity, the GPU [`CostModel`]).
//! 3. Implement the kind's trait. A router's [`RouterPolicy::route`] gets the [`Request`] and a
//!    [`ReplicaView`] per replica and returns an index; the hooks `on_dispatch`, `on_complete` and
//!    `on_evict` default to nothing.
//! 4. List your types in a registry function returning `Vec<Entry>` ([`router`], [`scheduler`],
//!    [`selector`] make entries) and export it with [`export_policies!`].
//! 5. `cargo build --release`, then `routelab compare WORKLOAD --policies
//!    ./target/release/libNAME.so:NAME,least_requests`.
//!
//! ## Rules the host relies on
//!
//! - **Determinism.** Never read wall-clock time or a thread-local/OS random generator. Time comes
//!   in the request (`arrived_at`, simulated); randomness from [`policy_rng`] seeded with the
//!   context's `seed`. The same seed then replays bit for bit, linked in or loaded.
//! - **Panics** are caught at the boundary ([`Guarded`]) and fail that policy's run with a message
//!   naming the policy and the method; other policies in the comparison still report. Returning
//!   an index outside `0..replicas.len()` is an error too.
//! - **Versions.** The host refuses a library built against another 0.x minor of this crate (the
//!   layout of the types in [`types`] is checked when the library loads). Rebuild the plugin
//!   against the host's version.
//! - **Only the types in [`types`] and [`traits`] cross the boundary.** Config crosses as YAML text
//!   and is parsed inside the plugin, so a library may hold any number of policies.
//!
//! ## A router in one page
//!
//! ```
//! use routelab_policy_api::*;
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
//!     fn route(&mut self, _: &Request<'_>, replicas: &[ReplicaView]) -> usize {
//!         (0..replicas.len()).min_by_key(|&i| replicas[i].outstanding_requests).unwrap()
//!     }
//! }
//!
//! pub fn registry() -> Vec<Entry> { vec![router::<Fewest>()] }
//! // In a cdylib crate: routelab_policy_api::export_policies!(registry);
//! ```
#![allow(non_local_definitions)]

/// The version of this crate; a plugin must be built against the same 0.x minor as its host.
pub const API_VERSION: &str = env!("CARGO_PKG_VERSION");

pub mod cost;
pub mod policy;
pub mod root;
pub mod toolkit;
pub mod traits;
pub mod types;

pub use abi_stable;
pub use abi_stable::std_types::{RSlice, RString, RVec};
pub use cost::StepShape;
pub use policy::*;
pub use root::{PolicyInfo, PolicyLib, PolicyLibRef, library};
pub use toolkit::*;
pub use traits::*;
pub use types::*;
