//! Mixed GPUs: the `cluster.pools:` section of an aggregated cluster. Each pool runs the
//! cluster's model on its own GPU type (and tensor-parallel degree), priced per replica-hour;
//! the replicas are the pools' in order (pool 0's first).
//!
//! ```yaml
//! cluster:
//!   replicas: 6                  # = the pools' sum
//!   gpu: h100                    # what routers are told of (their cost model, KV capacity)
//!   pools:
//!     - {gpu: h100, replicas: 2, cost_per_hour: 4.0}
//!     - {gpu: a100-80, replicas: 4, cost_per_hour: 2.2}
//! ```
//!
//! Every other field (model, efficiency, chunking, scheduler, …) is the cluster's. The step model
//! prices each replica's steps on its pool's GPU, and its KV capacity is its pool's. Routers are
//! told one cost model at creation (the cluster's `gpu:`, the ABI's one slot); the views they get
//! at each decision show each replica's own KV capacity and load.

use serde::{Deserialize, Serialize};

use super::ClusterSpec;
use crate::step_model::{Choice, Gpu, StepModel};
use crate::workload::FieldError;

/// One pool of replicas of one GPU type.
#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GpuPool {
    /// A catalog GPU (a6000, a100-40, a100-80, h100, h200, l40s) or a mapping {name, memory_gb, bandwidth_gb_s, tflops}.
    pub gpu: Choice<Gpu>,
    /// Tensor-parallel degree of this pool's replicas (default: the cluster's `tp`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tp: Option<u32>,
    /// Replicas of this pool (≥ 1).
    pub replicas: u32,
    /// One replica's price per hour (default: the cluster's `cost_per_hour`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_per_hour: Option<f64>,
}

impl ClusterSpec {
    /// Pool `i` as a cluster of its own (its GPU, TP degree and replica count; no pools).
    pub fn pool_spec(&self, i: usize) -> ClusterSpec {
        let p = &self.pools[i];
        let mut s = self.clone();
        s.gpu = p.gpu.clone();
        s.tp = p.tp.unwrap_or(self.tp);
        s.replicas = p.replicas;
        s.cost_per_hour = p.cost_per_hour.or(self.cost_per_hour);
        s.pools = Vec::new();
        s
    }

    /// Each pool's step model, in order (empty without pools).
    pub fn pool_step_models(&self) -> Result<Vec<StepModel>, FieldError> {
        (0..self.pools.len())
            .map(|i| {
                let s = self.pool_spec(i);
                let sm = s.step_model().map_err(|e| e.under(&format!("pools[{i}]")))?;
                s.check_step_model(&sm).map_err(|e| e.under(&format!("pools[{i}]")))?;
                Ok(sm)
            })
            .collect()
    }

    /// The price per replica-hour averaged over the replicas (pools priced each), if every
    /// replica has a price.
    pub fn mean_cost_per_hour(&self) -> Option<f64> {
        if self.pools.is_empty() {
            return self.cost_per_hour;
        }
        let mut sum = 0.0;
        for i in 0..self.pools.len() {
            sum += self.pool_spec(i).cost_per_hour? * self.pools[i].replicas as f64;
        }
        Some(sum / self.replicas.max(1) as f64)
    }

    /// Checks the pools against the rest of the cluster.
    pub(crate) fn validate_pools(&self) -> Result<(), FieldError> {
        if self.pools.is_empty() {
            return Ok(());
        }
        let sum: u64 = self.pools.iter().map(|p| p.replicas as u64).sum();
        if sum != self.replicas as u64 {
            return Err(FieldError::new(
                "replicas",
                format!("is {} but the pools hold {sum} replicas", self.replicas),
                format!("set `replicas: {sum}` (the pools' sum)"),
            ));
        }
        let other = [
            (self.autoscaling.is_some(), "autoscaling"),
            (self.disaggregation.is_some(), "disaggregation"),
            (self.lockstep_group() > 1, "data_parallel"),
        ];
        if let Some((_, name)) = other.iter().find(|o| o.0) {
            return Err(FieldError::new(
                "pools",
                format!("GPU pools run on fixed aggregated clusters of single replicas, and this one has `{name}`"),
                format!("drop `pools:`, or drop `{name}`"),
            ));
        }
        for (i, p) in self.pools.iter().enumerate() {
            if p.replicas == 0 {
                return Err(FieldError::new(
                    &format!("pools[{i}].replicas"),
                    "must be at least 1 (got 0)",
                    "use e.g. 2",
                ));
            }
            if let Some(tp) = p.tp.filter(|tp| ![1, 2, 4, 8].contains(tp)) {
                return Err(FieldError::new(
                    &format!("pools[{i}].tp"),
                    format!("must be 1, 2, 4 or 8 (got {tp})"),
                    "use a tensor-parallel degree of 1, 2, 4 or 8",
                ));
            }
            if let Some(c) = p.cost_per_hour {
                if !(c >= 0.0 && c.is_finite()) {
                    return Err(FieldError::new(
                        &format!("pools[{i}].cost_per_hour"),
                        format!("must be ≥ 0 (got {c:?})"),
                        "use e.g. 2.5",
                    ));
                }
            }
        }
        self.pool_step_models().map(drop)
    }
}
