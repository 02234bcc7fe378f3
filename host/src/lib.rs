//! routelab: a lab for request-routing policies in LLM serving.
//!
//! Data flows one way: a [`workload`] (YAML) → a request stream generated once per seed and
//! replayed identically for every policy (common random numbers) → a world in [`sim`] driving a
//! policy loaded by [`plugin`] → per-request records → [`metrics`] → [`report`].
//! Nothing in `sim` prints.

pub mod bench;
pub mod builtin;
pub mod capacity;
pub mod cli;
pub mod error;
pub mod exercises;
pub mod handle;
pub mod isolate;
pub mod metrics;
pub mod plugin;
pub mod report;
pub mod runner;
pub mod scaffold;
pub mod schema;
pub mod seeds;
pub mod serve;
pub mod signals;
pub mod sim;
pub mod step_model;
pub mod suggest;
pub mod workload;
