//! The host's one error type. Three things go wrong, and each has its exit code:
//! - bad input ([`InputError`]: a workload, trace, override or setup check; exit 2), found while
//!   preparing and building, before any long work starts;
//! - a policy that cannot be had ([`LoadError`]: missing library, unknown name, bad config — exit
//!   2 — or a constructor that panicked — exit 1);
//! - a failed run ([`RunError`]: a policy erred, panicked or answered out of range; exit 1).

use std::fmt;

use crate::plugin::LoadError;
use crate::workload::InputError;

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

#[derive(Clone, Debug, PartialEq)]
pub enum Error {
    Input(InputError),
    Load(LoadError),
    Run(RunError),
}

impl Error {
    /// 2 for bad input, 1 for a failing policy.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Input(_) => 2,
            Error::Load(e) => e.exit_code(),
            Error::Run(_) => 1,
        }
    }
}

impl LoadError {
    /// 2 for errors in what the user gave, 1 for a failing policy.
    pub fn exit_code(&self) -> i32 {
        if self.is_input_error() { 2 } else { 1 }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Input(e) => e.fmt(f),
            Error::Load(e) => e.fmt(f),
            Error::Run(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for Error {}

impl From<InputError> for Error {
    fn from(e: InputError) -> Self {
        Error::Input(e)
    }
}

impl From<LoadError> for Error {
    fn from(e: LoadError) -> Self {
        Error::Load(e)
    }
}

impl From<RunError> for Error {
    fn from(e: RunError) -> Self {
        Error::Run(e)
    }
}

/// The exit code of an error chain that holds one of the host's errors (1 otherwise).
pub fn exit_code_of(e: &anyhow::Error) -> i32 {
    for cause in e.chain() {
        if let Some(e) = cause.downcast_ref::<Error>() {
            return e.exit_code();
        }
        if cause.downcast_ref::<InputError>().is_some() {
            return 2;
        }
        if let Some(l) = cause.downcast_ref::<LoadError>() {
            return l.exit_code();
        }
    }
    1
}
