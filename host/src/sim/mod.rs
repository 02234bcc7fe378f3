//! The simulated worlds. Nothing here prints; every run is a pure function of workload, seed and
//! policy.

pub mod compound;
pub mod dispatch;
pub mod cluster;
pub mod event_queue;

/// A failed run: the policy erred or panicked, or answered with a replica that does not exist.
/// The message names the policy; other policies of a comparison are unaffected.
#[derive(Clone, Debug, PartialEq)]
pub struct RunError(pub String);

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RunError {}
