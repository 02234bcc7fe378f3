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
    /// A catalog GPU (a6000, a100-40, a100-80, h100, h200, b200, l40s, rtx-pro-6000, rtx4090) or a mapping {name, memory_gb, bandwidth_gb_s, tflops}.
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
    /// How many groups of replicas run hardware of their own: the `pools:`, or — when one of
    /// `cluster.models` sets `gpu:`, `tp:`, `model:` or `cost_per_hour:` — the models, each
    /// model's replicas one pool (`models.rs`). 0: every replica is the cluster's.
    pub fn pool_count(&self) -> usize {
        if !self.pools.is_empty() {
            self.pools.len()
        } else if self.models.iter().any(|m| m.sets_hardware()) {
            self.models.len()
        } else {
            0
        }
    }

    /// Where pool `i` is written: `pools[i]` or `models[i]` (error paths).
    fn pool_field(&self, i: usize) -> String {
        if self.pools.is_empty() { format!("models[{i}]") } else { format!("pools[{i}]") }
    }

    /// Pool `i` as a cluster of its own (its GPU, TP degree, model and replica count; no pools,
    /// one model).
    pub fn pool_spec(&self, i: usize) -> ClusterSpec {
        let mut s = self.clone();
        if let Some(p) = self.pools.get(i) {
            s.gpu = p.gpu.clone();
            s.tp = p.tp.unwrap_or(self.tp);
            s.replicas = p.replicas;
            s.cost_per_hour = p.cost_per_hour.or(self.cost_per_hour);
        } else {
            let m = &self.models[i];
            s.gpu = m.gpu.clone().unwrap_or_else(|| self.gpu.clone());
            s.tp = m.tp.unwrap_or(self.tp);
            s.model = m.model.clone().unwrap_or_else(|| self.model.clone());
            s.replicas = m.replicas;
            s.cost_per_hour = m.cost_per_hour.or(self.cost_per_hour);
        }
        s.pools = Vec::new();
        s.models = Vec::new();
        s
    }

    /// Each pool's step model, in order (empty without pools).
    pub fn pool_step_models(&self) -> Result<Vec<StepModel>, FieldError> {
        (0..self.pool_count())
            .map(|i| {
                let s = self.pool_spec(i);
                let at = self.pool_field(i);
                let sm = s.step_model().map_err(|e| e.under(&at))?;
                s.check_step_model(&sm).map_err(|e| e.under(&at))?;
                Ok(sm)
            })
            .collect()
    }

    /// Each replica's pool, in replica order (empty without pools).
    pub fn replica_pools(&self) -> Vec<u8> {
        (0..self.pool_count()).flat_map(|i| std::iter::repeat_n(i as u8, self.pool_spec(i).replicas as usize)).collect()
    }

    /// The price per replica-hour averaged over the replicas (pools priced each), if every
    /// replica has a price.
    pub fn mean_cost_per_hour(&self) -> Option<f64> {
        if self.pool_count() == 0 {
            return self.cost_per_hour;
        }
        let mut sum = 0.0;
        for i in 0..self.pool_count() {
            let p = self.pool_spec(i);
            sum += p.cost_per_hour? * p.replicas as f64;
        }
        Some(sum / self.replicas.max(1) as f64)
    }

    /// Checks the pools (`pools:`, or the models' own hardware) against the rest of the cluster.
    pub(crate) fn validate_pools(&self) -> Result<(), FieldError> {
        if self.pool_count() == 0 {
            return Ok(());
        }
        if let Some(i) = self.models.iter().position(|m| m.sets_hardware()).filter(|_| !self.pools.is_empty()) {
            return Err(FieldError::new(
                &format!("models[{i}]"),
                "sets its own hardware, and the cluster has `pools:` too",
                "give each model's `gpu`/`tp`/`model`/`cost_per_hour` under `models:` and drop `pools:`, or drop them from the model",
            ));
        }
        let sum: u64 = self.pools.iter().map(|p| p.replicas as u64).sum();
        if !self.pools.is_empty() && sum != self.replicas as u64 {
            return Err(FieldError::new(
                "replicas",
                format!("is {} but the pools hold {sum} replicas", self.replicas),
                format!("set `replicas: {sum}` (the pools' sum)"),
            ));
        }
        let section = if self.pools.is_empty() { "models with their own hardware" } else { "GPU pools" };
        let remedy = if self.pools.is_empty() { "the models' `gpu`/`tp`/`model`" } else { "`pools:`" };
        let other = [
            (self.autoscaling.is_some(), "autoscaling"),
            (self.disaggregation.is_some(), "disaggregation"),
            (self.lockstep_group() > 1, "data_parallel"),
        ];
        if let Some((_, name)) = other.iter().find(|o| o.0) {
            return Err(FieldError::new(
                if self.pools.is_empty() { "models" } else { "pools" },
                format!("{section} run on fixed aggregated clusters of single replicas, and this one has `{name}`"),
                format!("drop {remedy}, or drop `{name}`"),
            ));
        }
        for i in 0..self.pool_count() {
            let p = self.pool_spec(i);
            let at = |field: &str| format!("{}.{field}", self.pool_field(i));
            if p.replicas == 0 {
                return Err(FieldError::new(&at("replicas"), "must be at least 1 (got 0)", "use e.g. 2"));
            }
            if ![1, 2, 4, 8].contains(&p.tp) {
                return Err(FieldError::new(
                    &at("tp"),
                    format!("must be 1, 2, 4 or 8 (got {})", p.tp),
                    "use a tensor-parallel degree of 1, 2, 4 or 8",
                ));
            }
            if let Some(c) = p.cost_per_hour {
                if !(c >= 0.0 && c.is_finite()) {
                    return Err(FieldError::new(
                        &at("cost_per_hour"),
                        format!("must be ≥ 0 (got {c:?})"),
                        "use e.g. 2.5",
                    ));
                }
            }
        }
        self.pool_step_models().map(drop)
    }
}
