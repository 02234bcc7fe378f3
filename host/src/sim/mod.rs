//! The simulated worlds. Nothing here prints; every run is a pure function of workload, seed and
//! policy.

pub mod dispatch;
pub mod event_queue;
