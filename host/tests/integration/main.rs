//! routelab's integration tests: one binary, a module per area (ripgrep's layout).
//! Plugin libraries are built by the tests themselves (`common::plugins`), so a clean clone
//! passes with `cargo test --release --workspace` and nothing prebuilt.

mod accuracy;
mod admission;
mod autoscaling;
mod capacity;
mod classes;
mod cli;
mod cli_errors;
mod cluster;
mod common;
mod compat;
mod compound;
mod dispatch_results;
mod fleet;
mod hardening;
mod isolate;
mod layers;
mod llama;
mod loader;
mod lora;
mod models;
mod pd;
mod plan;
mod plan_shapes;
mod report;
mod scale;
mod serve_engines;
mod serve_faults;
mod serve_soak;
mod serving;
mod snapshots;
mod standalone;
mod tiers;
