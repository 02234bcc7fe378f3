//! Autoscaling: the `cluster.autoscaling:` section of an aggregated cluster. A scaler (the fifth
//! policy kind, policy-api 0.5.4) is asked every `interval_s` how many replicas the pool should
//! have; `cluster.replicas` is how many the run starts with.
//!
//! ```yaml
//! cluster:
//!   replicas: 2                  # at the start
//!   cost_per_hour: 2.5           # one replica's price per hour (adds `cost`)
//!   autoscaling:
//!     scaler: "hpa{target: 0.6}" # a scaler: name or "name{key: value}", built in or LIB:NAME
//!     interval_s: 15             # between decisions
//!     model_load_s: 60           # a new replica's start-up: routable this long after it is asked for
//!     min_replicas: 1
//!     max_replicas: 8
//! ```
//!
//! What the simulator does with it is in `sim/cluster/fleet.rs`.

use serde::{Deserialize, Serialize};

use crate::workload::FieldError;
use crate::workload::limits::fits_clock;

/// The scaler and the bounds it works within.
#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Autoscaling {
    /// The scaler: `hpa`, `dynamo_planner`, `llm_d_wva`, optionally with config in braces, or
    /// `LIB:NAME` from a library.
    pub scaler: String,
    /// Seconds between the scaler's decisions (> 0).
    #[serde(default = "default_interval")]
    pub interval_s: f64,
    /// Seconds from a scale-up decision until the new replica takes requests (≥ 0): the model
    /// load. It starts with cold caches.
    #[serde(default = "default_model_load")]
    pub model_load_s: f64,
    /// Fewest replicas (≥ 1): the host clamps every decision to `[min_replicas, max_replicas]`.
    #[serde(default = "default_min")]
    pub min_replicas: u32,
    /// Most replicas at once, draining ones included (≥ `min_replicas`, ≥ `replicas`).
    pub max_replicas: u32,
}

fn default_interval() -> f64 {
    15.0
}
fn default_model_load() -> f64 {
    60.0
}
fn default_min() -> u32 {
    1
}

impl Autoscaling {
    /// Checks the bounds against the cluster's starting `replicas`.
    pub fn validate(&self, replicas: u32) -> Result<(), FieldError> {
        if self.scaler.trim().is_empty() {
            return Err(FieldError::new("scaler", "is empty", "name a scaler: hpa, dynamo_planner or llm_d_wva"));
        }
        if !(self.interval_s > 0.0) {
            return Err(FieldError::new(
                "interval_s",
                format!("must be positive (got {:?})", self.interval_s),
                "use e.g. 15",
            ));
        }
        fits_clock("interval_s", self.interval_s, "use e.g. 15 (seconds)")?;
        if !(self.model_load_s >= 0.0) {
            return Err(FieldError::new(
                "model_load_s",
                format!("must be ≥ 0 (got {:?})", self.model_load_s),
                "use e.g. 60",
            ));
        }
        fits_clock("model_load_s", self.model_load_s, "use e.g. 60 (seconds)")?;
        if self.min_replicas == 0 {
            return Err(FieldError::new("min_replicas", "must be at least 1 (got 0)", "use e.g. 1"));
        }
        if self.max_replicas < self.min_replicas.max(replicas) {
            return Err(FieldError::new(
                "max_replicas",
                format!(
                    "is {} but must be at least min_replicas ({}) and the starting replicas ({replicas})",
                    self.max_replicas, self.min_replicas
                ),
                format!("use e.g. max_replicas: {}", self.min_replicas.max(replicas) * 2),
            ));
        }
        if self.max_replicas > 4096 {
            return Err(FieldError::new(
                "max_replicas",
                format!("is {}, above the 4096 the simulator allows", self.max_replicas),
                "use at most 4096",
            ));
        }
        Ok(())
    }
}
