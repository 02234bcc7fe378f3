//! The host's one error type. Three things go wrong, and each has its exit code:
//! - bad input ([`InputError`]: a workload, trace, override or setup check; exit 2), found while
//!   preparing and building, before any long work starts;
//! - a policy that cannot be had ([`LoadError`]: missing library, unknown name, bad config — exit
//!   2 — or a constructor that panicked — exit 1);
//! - a failed run ([`RunError`]: a policy erred, panicked or answered out of range — it names
//!   the policy and, where one failed, the method; exit 1).

use std::fmt;

use crate::input::InputError;
use crate::plugin::LoadError;

/// Which kind of policy a [`RunError`] blames, as its message names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// A router, a replica's scheduler or a selector: "policy 'NAME'".
    Policy,
    /// An admission policy: "admission policy 'NAME'".
    Admission,
    /// An autoscaler: "scaler 'NAME'".
    Scaler,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Policy => "policy",
            Role::Admission => "admission policy",
            Role::Scaler => "scaler",
        })
    }
}

/// The policy a [`RunError`] blames: its kind and its label as the run names it
/// (`least_requests`, `lib.so:my_router{k: 2}`).
#[derive(Clone, Debug, PartialEq)]
pub struct Culprit {
    pub role: Role,
    pub label: String,
}

impl Culprit {
    pub fn new(role: Role, label: &str) -> Self {
        Self { role, label: label.to_string() }
    }
}

/// A failed run. Other policies of a comparison are unaffected; the message names the policy.
#[derive(Clone, Debug, PartialEq)]
pub enum RunError {
    /// The policy returned an error from `method` (or panicked there, caught at the ABI boundary).
    Erred { policy: Culprit, method: String, message: String },
    /// The policy answered what the host cannot use, or needs what the host does not have:
    /// `what` reads after its name ("returned replica 9, but there are only 4 replicas …").
    Refused { policy: Culprit, what: String },
    /// The policy's run could not go on for a reason the host gives (its figures cannot be
    /// named as metrics; its replica's scheduler failed): `what`.
    Failed { policy: Culprit, what: String },
    /// A run no single policy is to blame for (a compound study asked of a space too large).
    Run(String),
}

impl RunError {
    /// `policy` erred in `method` with `message`.
    pub fn erred(role: Role, label: &str, method: &str, message: String) -> Self {
        RunError::Erred { policy: Culprit::new(role, label), method: method.to_string(), message }
    }

    /// `policy` answered `what` (a phrase that reads after its name).
    pub fn refused(role: Role, label: &str, what: String) -> Self {
        RunError::Refused { policy: Culprit::new(role, label), what }
    }

    /// `policy`'s run failed: `what`.
    pub fn failed(role: Role, label: &str, what: String) -> Self {
        RunError::Failed { policy: Culprit::new(role, label), what }
    }

    /// The policy to blame, if one is.
    pub fn policy(&self) -> Option<&Culprit> {
        match self {
            RunError::Erred { policy, .. } | RunError::Refused { policy, .. } | RunError::Failed { policy, .. } => {
                Some(policy)
            }
            RunError::Run(_) => None,
        }
    }

    /// The ABI method that erred, if a policy's method did.
    pub fn method(&self) -> Option<&str> {
        match self {
            RunError::Erred { method, .. } => Some(method),
            _ => None,
        }
    }
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // A message that already names the policy (policy-api's wrapper names it when a
            // policy panics or answers out of range) is shown as it is.
            RunError::Erred { policy: Culprit { role, label }, method, message } => {
                if message.starts_with("policy '") {
                    f.write_str(message)
                } else {
                    write!(f, "{role} '{label}' failed in {method}: {message}")
                }
            }
            RunError::Refused { policy: Culprit { role, label }, what } => write!(f, "{role} '{label}' {what}"),
            RunError::Failed { policy: Culprit { role, label }, what } => write!(f, "{role} '{label}': {what}"),
            RunError::Run(what) => f.write_str(what),
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_error_names_its_policy_and_method_in_fields_and_in_words() {
        let e = RunError::erred(Role::Admission, "hold_batch", "next", "no capacity figure".into());
        assert_eq!(e.policy(), Some(&Culprit::new(Role::Admission, "hold_batch")));
        assert_eq!(e.method(), Some("next"));
        assert_eq!(e.to_string(), "admission policy 'hold_batch' failed in next: no capacity figure");
        // policy-api's wrapper already names the policy when one panics: shown as it is.
        let said = "policy 'x' panicked in route: boom".to_string();
        assert_eq!(RunError::erred(Role::Policy, "x", "route", said.clone()).to_string(), said);
        let e = RunError::refused(Role::Scaler, "hpa", "answered 2 replica counts for 1 pool".into());
        assert_eq!((e.to_string().as_str(), e.method()), ("scaler 'hpa' answered 2 replica counts for 1 pool", None));
        assert_eq!(RunError::failed(Role::Policy, "lpm", "bad name".into()).to_string(), "policy 'lpm': bad name");
        assert_eq!(RunError::Run("too large".into()).policy(), None);
        assert_eq!(Error::from(RunError::Run("x".into())).exit_code(), 1);
    }
}
