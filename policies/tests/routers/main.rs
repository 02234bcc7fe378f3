//! The built-in policies' tests as one test binary, each former file a module: one link of the
//! policies instead of six (the README's test command builds every test binary of the workspace).

mod bounded_state;
mod common;
mod field_options_2026;
mod field_routers;
mod field_routers_2026;
mod llm_d_upstream_cases;
mod pd_routers;
mod preble_branches;
mod prefix_routers;
mod tier_routers;
