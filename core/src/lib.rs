//! routelab-core: the simulator as a library — no async, no HTTP, no plotting, no CLI.
//!
//! Data flows one way: a [`workload`] (YAML) → a request stream generated once per seed and
//! replayed identically for every policy (common random numbers) → a world in [`sim`] driving a
//! policy loaded by [`plugin`] through a [`handle`] → per-request records → [`metrics`]. The
//! [`runner`] prepares a workload once and runs every (policy, seed) cell, on threads or in
//! isolated child processes. Nothing here prints.
//!
//! Layers, bottom up (a module uses only modules on its own line or below; a test over the `use`
//! lines, `host/tests/integration/layers.rs`, keeps every crate free of module circles):
//! - [`time`], [`seeds`], [`suggest`], [`metrics`], [`signals`], [`step_model`]
//! - [`workload`] (with [`builtin`] and [`schema`] above it), [`plugin`]
//! - [`error`], [`handle`]
//! - [`sim`]
//! - [`runner`], [`accuracy`]

pub mod accuracy;
pub mod builtin;
pub mod error;
pub mod facts;
pub mod handle;
pub mod ids;
pub mod input;
pub mod metrics;
pub mod plugin;
pub mod runner;
pub mod schema;
pub mod seeds;
pub mod signals;
pub mod sim;
pub mod sketch;
pub mod step_model;
pub mod suggest;
pub mod time;
pub mod workload;
