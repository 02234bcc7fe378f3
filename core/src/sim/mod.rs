//! The simulated worlds. Nothing here prints; every run is a pure function of workload, seed and
//! policy.

pub mod cluster;
pub mod compound;
pub mod dispatch;
pub mod event_queue;

/// A world that cannot be built from its input (e.g. a trace row larger than a replica's
/// memory): bad input, found before the first event. `field` is the world section's field at
/// fault (`arrivals`), which the runner turns into an input error naming the workload file.
#[derive(Clone, Debug, PartialEq)]
pub struct SetupError {
    pub field: String,
    pub message: String,
    pub fix: String,
}

impl SetupError {
    pub fn new(field: &str, message: impl Into<String>, fix: impl Into<String>) -> Self {
        Self { field: field.into(), message: message.into(), fix: fix.into() }
    }
}

impl std::fmt::Display for SetupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}\n  fix: {}", self.field, self.message, self.fix)
    }
}

impl std::error::Error for SetupError {}

/// A stream that cannot be generated is an arrivals error of the world being built (here, not
/// in `workload`, which the simulator's modules depend on: no module circle).
impl From<crate::workload::generate::GenerateError> for SetupError {
    fn from(e: crate::workload::generate::GenerateError) -> Self {
        SetupError::new("arrivals", e.to_string(), "see the message")
    }
}
