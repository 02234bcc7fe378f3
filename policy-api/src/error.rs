//! The error every policy call can return, typed across the boundary: what kind of failure it is
//! decides how the host reports it (bad input, exit code 2, or a failed run, exit code 1).

use std::fmt;

use abi_stable::{StableAbi, std_types::RString};

/// What went wrong, as an open set: a `u8` with named values rather than an enum, so a later
/// minor may add kinds without changing the layout. A host treats a kind it does not know as
/// [`ErrorKind::FAILED`].
#[repr(transparent)]
#[derive(StableAbi, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ErrorKind(u8);

impl ErrorKind {
    /// The user's input is wrong: an unknown config key, a value out of range, a problem the
    /// policy refuses (too large a search space). The host reports it as bad input (exit 2).
    pub const BAD_CONFIG: Self = Self(1);
    /// The policy failed while running (an error it returned, an answer out of range).
    pub const FAILED: Self = Self(2);
    /// The policy's code panicked; the panic was caught at the boundary.
    pub const PANICKED: Self = Self(3);

    /// The raw value (for kinds a later minor adds).
    pub const fn raw(self) -> u8 {
        self.0
    }

    /// The kind as this version of the crate understands it: unknown values become `FAILED`.
    pub const fn known(self) -> Self {
        match self.0 {
            1..=3 => self,
            _ => Self::FAILED,
        }
    }
}

impl fmt::Debug for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            1 => f.write_str("BAD_CONFIG"),
            2 => f.write_str("FAILED"),
            3 => f.write_str("PANICKED"),
            n => write!(f, "ErrorKind({n})"),
        }
    }
}

/// A policy's error: its kind and a message that already names the policy and, for a call, the
/// method (`policy 'x' panicked in route: ...`).
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq, Eq)]
pub struct PolicyError {
    /// What kind of failure.
    pub kind: ErrorKind,
    /// What happened, for the user.
    pub message: RString,
}

impl PolicyError {
    /// An error of `kind` with `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self { kind, message: RString::from(message.into()) }
    }
    /// Bad input ([`ErrorKind::BAD_CONFIG`]).
    pub fn bad_config(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::BAD_CONFIG, message)
    }
    /// A failure at run time ([`ErrorKind::FAILED`]).
    pub fn failed(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::FAILED, message)
    }
    /// A caught panic ([`ErrorKind::PANICKED`]).
    pub fn panicked(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::PANICKED, message)
    }
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for PolicyError {}

/// The message alone, for hosts that report errors as text.
impl From<PolicyError> for String {
    fn from(e: PolicyError) -> String {
        e.message.into()
    }
}
