//! Failures: the `cluster.failures:` section of an aggregated, fixed cluster. Replicas crash at
//! set times and/or at random (each replica's time to failure exponential with mean `mtbf_s`,
//! drawn from the run's seed), are down for `restart_s`, and come back with cold caches.
//!
//! ```yaml
//! cluster:
//!   failures:
//!     crashes: [{replica: 1, at_s: 30}]   # scheduled crashes (replica index from 0, time)
//!     mtbf_s: 3600        # optional: mean seconds between a replica's random crashes
//!     restart_s: 60       # down time: the restart (pod reschedule and model load)
//!     max_retries: 1      # times a request lost in a crash is sent again; then it fails
//! ```
//!
//! What the simulator does with it is in `sim/cluster/failures.rs`.

use serde::{Deserialize, Serialize};

use crate::workload::FieldError;
use crate::workload::limits::fits_clock;

/// When replicas crash, how long they stay down, and what becomes of their requests.
#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Failures {
    /// Scheduled crashes: `{replica, at_s}` each (a crash of a replica that is down is ignored).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub crashes: Vec<Crash>,
    /// Mean time between failures of each replica, seconds (> 0): after every start a replica's
    /// next crash is drawn exponential with this mean from the run's seed; absent = only the
    /// scheduled crashes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtbf_s: Option<f64>,
    /// Seconds a crashed replica is down before it takes requests again, with empty caches (≥ 0).
    #[serde(default = "default_restart")]
    pub restart_s: f64,
    /// How many times a request that was on a crashed replica is routed again (Dynamo's
    /// `migration_limit`); a request lost more often fails. 0 = lost requests fail.
    #[serde(default = "default_retries")]
    pub max_retries: u32,
}

/// One scheduled crash.
#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Crash {
    /// The replica (0-based, as in `replicas`).
    pub replica: u32,
    /// When, seconds from the start.
    pub at_s: f64,
}

fn default_restart() -> f64 {
    60.0
}
fn default_retries() -> u32 {
    1
}

impl Failures {
    /// Checks the section against the cluster's `replicas`.
    pub fn validate(&self, replicas: u32) -> Result<(), FieldError> {
        if self.crashes.is_empty() && self.mtbf_s.is_none() {
            return Err(FieldError::new(
                "crashes",
                "no crash is scheduled and `mtbf_s` is absent: nothing would fail",
                "add `crashes: [{replica: 0, at_s: 30}]` or `mtbf_s: 3600`, or drop `failures:`",
            ));
        }
        for (i, c) in self.crashes.iter().enumerate() {
            let path = format!("crashes[{i}]");
            if c.replica >= replicas {
                return Err(FieldError::new(
                    &format!("{path}.replica"),
                    format!("is {} but the cluster has {replicas} replicas (indices 0..{replicas})", c.replica),
                    format!("use a replica index below {replicas}"),
                ));
            }
            if !(c.at_s >= 0.0) {
                return Err(FieldError::new(
                    &format!("{path}.at_s"),
                    format!("must be ≥ 0 (got {:?})", c.at_s),
                    "use e.g. 30",
                ));
            }
            fits_clock(&format!("{path}.at_s"), c.at_s, "use e.g. 30 (seconds)")?;
        }
        if let Some(m) = self.mtbf_s {
            if !(m > 0.0) {
                return Err(FieldError::new("mtbf_s", format!("must be positive (got {m:?})"), "use e.g. 3600"));
            }
            fits_clock("mtbf_s", m, "use e.g. 3600 (seconds)")?;
        }
        if !(self.restart_s >= 0.0) {
            return Err(FieldError::new("restart_s", format!("must be ≥ 0 (got {:?})", self.restart_s), "use e.g. 60"));
        }
        fits_clock("restart_s", self.restart_s, "use e.g. 60 (seconds)")?;
        Ok(())
    }
}
