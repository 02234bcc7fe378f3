//! Autoscaling: the `cluster.autoscaling:` section. A scaler (the fifth policy kind, policy-api
//! 0.5.4) is asked every `interval_s` how many replicas each pool should have; `cluster.replicas`
//! is how many the run starts with.
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
//! On a disaggregated cluster (`disaggregation:` without `mixed:`) the prefill and the decode
//! pool scale apart, each within its own bounds (`pools`, required there); the pools start
//! with `disaggregation.prefill.instances` and `decode.instances`, and `max_replicas` is the
//! fleet's budget over both (Dynamo's planner's `max_gpu_budget`, in instances): a scale-up
//! never takes the instances paid for, draining ones included, past it.
//!
//! ```yaml
//!   autoscaling:
//!     scaler: dynamo_planner
//!     max_replicas: 8            # both pools together
//!     pools:
//!       prefill: {min_replicas: 1, max_replicas: 4}
//!       decode: {min_replicas: 1, max_replicas: 6}
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
    /// Most replicas at once, draining ones included (≥ `min_replicas`, ≥ `replicas`); on a
    /// disaggregated cluster, both pools' together.
    pub max_replicas: u32,
    /// Disaggregated clusters only (and required there): each pool's own bounds. Absent: one
    /// pool, bounded by `min_replicas` and `max_replicas`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pools: Option<PdPools>,
}

/// The bounds of a disaggregated cluster's two pools.
#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PdPools {
    /// The prefill instances' bounds (the pool starts with `disaggregation.prefill.instances`).
    pub prefill: PoolBounds,
    /// The decode instances' bounds (the pool starts with `disaggregation.decode.instances`).
    pub decode: PoolBounds,
}

/// One pool's bounds: the host clamps the scaler's answer for the pool to `[min_replicas,
/// max_replicas]`.
#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, Copy, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PoolBounds {
    /// Fewest instances (≥ 1).
    #[serde(default = "default_min")]
    pub min_replicas: u32,
    /// Most instances at once, draining ones included (≥ `min_replicas`, ≥ the pool's starting
    /// instances).
    pub max_replicas: u32,
}

impl PoolBounds {
    fn validate(&self, start: u32) -> Result<(), FieldError> {
        if self.min_replicas == 0 {
            return Err(FieldError::new("min_replicas", "must be at least 1 (got 0)", "use e.g. 1"));
        }
        if self.max_replicas < self.min_replicas.max(start) {
            return Err(FieldError::new(
                "max_replicas",
                format!(
                    "is {} but must be at least min_replicas ({}) and the pool's starting instances ({start})",
                    self.max_replicas, self.min_replicas
                ),
                format!("use e.g. max_replicas: {}", self.min_replicas.max(start) * 2),
            ));
        }
        Ok(())
    }
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
    /// Checks the bounds against the cluster's starting `replicas` and, on a disaggregated
    /// cluster, its pools' starting instances (`pd_start`: prefill, decode).
    pub fn validate(&self, replicas: u32, pd_start: Option<(u32, u32)>) -> Result<(), FieldError> {
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
        if self.slots() > 4096 {
            return Err(FieldError::new(
                "max_replicas",
                format!("is {}, above the 4096 the simulator allows", self.slots()),
                "use at most 4096",
            ));
        }
        if let Some(p) = &self.pools {
            let Some((prefill, decode)) = pd_start else {
                return Err(FieldError::new(
                    "pools",
                    "sets per-pool bounds, and this cluster is aggregated (one pool)",
                    "drop `pools:` (min_replicas and max_replicas bound the one pool), or add `disaggregation:`",
                ));
            };
            if self.min_replicas > 1 {
                return Err(FieldError::new(
                    "min_replicas",
                    format!("is {}, and on a disaggregated cluster each pool has its own", self.min_replicas),
                    "set pools.prefill.min_replicas and pools.decode.min_replicas instead",
                ));
            }
            p.prefill.validate(prefill).map_err(|e| e.under("pools.prefill"))?;
            p.decode.validate(decode).map_err(|e| e.under("pools.decode"))?;
        } else if pd_start.is_some() {
            return Err(FieldError::new(
                "pools",
                "is missing: on a disaggregated cluster the prefill and decode pools scale apart, each within \
                 its own bounds",
                "add e.g. `pools: {prefill: {min_replicas: 1, max_replicas: 4}, decode: {min_replicas: 1, \
                 max_replicas: 4}}`",
            ));
        }
        Ok(())
    }

    /// Replica slots the simulator keeps: `max_replicas`, or on a disaggregated cluster the two
    /// pools' `max_replicas` (prefill slots first).
    pub fn slots(&self) -> u32 {
        self.pools.as_ref().map_or(self.max_replicas, |p| p.prefill.max_replicas + p.decode.max_replicas)
    }
}
