//! routelab, the command: the CLI, reports, capacity search, benchmarks, the course exercises and
//! the policy scaffold, on top of two libraries:
//! - `routelab-core` (`core/`): workloads, the step model, the three worlds, the router handle and
//!   engine signals, the policy loader, the runner and metrics — no async, HTTP, plots or CLI;
//! - `routelab-serve` (`serve/`): the same policies and replica model behind real HTTP
//!   (`routelab serve`, `emulate`, `replay`).
//!
//! Data flows one way: a workload (YAML) → a request stream generated once per seed and replayed
//! identically for every policy (common random numbers) → a world driving a policy loaded by the
//! core's loader → per-request records → metrics → [`report`]. docs/architecture.md draws the
//! layers and what may depend on what.

pub mod bench;
pub mod capacity;
pub mod cli;
pub mod exercises;
pub mod plan;
pub mod report;
pub mod scaffold;
