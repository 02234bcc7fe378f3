//! The `cluster.models:` section: several models served by one cluster, each on its own
//! replicas, with its share of the traffic.
//!
//! ```yaml
//! cluster:
//!   replicas: 4                 # = the models' sum
//!   models:
//!     - {name: chat, replicas: 3, share: 0.8}
//!     - {name: coder, replicas: 1, share: 0.2}
//! ```
//!
//! The replicas are the models' in order (model 0's first, as `pools:` numbers its replicas), so
//! the sets are disjoint. Each session (its turns, fan-out, or an agent session's calls) draws one
//! model by share, from its own hash of the run seed (`generate/models.rs`), so adding models does
//! not move arrivals or sizes; a Mooncake trace may give each row's `"model"` by name instead.
//!
//! Routing follows the field's gateways: a request names its model and the gateway sends it to
//! that model's pool, where the model's own scheduler picks a replica (the Gateway API Inference
//! Extension: one `InferencePool` and endpoint picker per base model, body-based routing
//! choosing the pool by the request's `model`; Dynamo: a router per served model). So the host
//! makes one router per model, told that model's replica count and shown only its replicas: a
//! router cannot name a replica of another model, and an index past its model's replicas is
//! refused as any out-of-range answer is. Without `models:` the cluster serves one model (index
//! 0) and nothing changes.
//!
//! By default every model runs the cluster's `gpu:`, `tp:` and `model:` architecture (the names
//! are labels, e.g. two fine-tunes of one size); what differs is the traffic and the replicas.
//! A model may set its own hardware — `gpu:`, `tp:`, `model:` (its size) and `cost_per_hour:`:
//!
//! ```yaml
//!   models:
//!     - {name: small, replicas: 4, share: 0.7, gpu: a6000, model: llama-3-8b}
//!     - {name: large, replicas: 2, share: 0.3, gpu: h100, tp: 4, model: llama-3-70b}
//! ```
//!
//! Then each model's replicas are one GPU pool, run by the `pools:` machinery (`pools.rs`: each
//! replica's steps priced and its KV sized on its pool's hardware), so `pools:` itself is then
//! refused. Routers are still told the cluster's `gpu:`/`model:` at creation (the ABI's one cost
//! model); their views show each replica's own KV capacity and load.

use serde::{Deserialize, Serialize};

use super::ClusterSpec;
use crate::step_model::{Choice, Gpu, Model};
use crate::workload::FieldError;

/// Most models a workload may name.
pub const MAX_MODELS: usize = 256;

/// One served model.
#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// The model's name: lowercase letters, digits, `_`, `-` and `.` (what a request's `model`
    /// says; it becomes part of metric keys).
    pub name: String,
    /// Replicas serving it (≥ 1); the replicas are the models' in order, model 0's first.
    pub replicas: u32,
    /// Its share of sessions, > 0 (shares are normalised over the models).
    pub share: f64,
    /// The GPU its replicas run on (default: the cluster's `gpu`): a catalog GPU or a mapping.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<Choice<Gpu>>,
    /// Tensor-parallel degree of its replicas, 1, 2, 4 or 8 (default: the cluster's `tp`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tp: Option<u32>,
    /// Its architecture, a catalog model or a mapping (default: the cluster's `model`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<Choice<Model>>,
    /// One of its replicas' price per hour (default: the cluster's `cost_per_hour`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_per_hour: Option<f64>,
}

impl ModelSpec {
    /// Whether it sets hardware of its own (then every model is a pool: `pools.rs`).
    pub fn sets_hardware(&self) -> bool {
        self.gpu.is_some() || self.tp.is_some() || self.model.is_some() || self.cost_per_hour.is_some()
    }
}

impl ClusterSpec {
    /// How many models the cluster serves (1 without `models:`).
    pub fn model_count(&self) -> usize {
        self.models.len().max(1)
    }

    /// Where each model's replicas start, and the end: `models + 1` slot numbers (`[0, replicas]`
    /// without `models:`).
    pub fn model_bounds(&self) -> Vec<u32> {
        if self.models.is_empty() {
            return vec![0, self.replicas];
        }
        let mut b = vec![0];
        for m in &self.models {
            b.push(b.last().copied().unwrap_or(0) + m.replicas);
        }
        b
    }

    /// The index of the model named `name`.
    pub fn model_index(&self, name: &str) -> Option<usize> {
        self.models.iter().position(|m| m.name == name)
    }

    /// Checks `models:` against the rest of the cluster (paths relative to the cluster).
    pub(crate) fn validate_models(&self) -> Result<(), FieldError> {
        if self.models.is_empty() {
            return Ok(());
        }
        if self.models.len() > MAX_MODELS {
            return Err(FieldError::new(
                "models",
                format!("{} models; at most {MAX_MODELS}", self.models.len()),
                "merge models",
            ));
        }
        let mut seen: Vec<&str> = Vec::new();
        for (i, m) in self.models.iter().enumerate() {
            let at = |field: &str| format!("models[{i}].{field}");
            let ok = !m.name.is_empty()
                && m.name.len() <= 64
                && m.name.as_bytes()[0].is_ascii_lowercase()
                && m.name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_-.".contains(&b));
            if !ok {
                return Err(FieldError::new(
                    &at("name"),
                    format!(
                        "`{}` is not a model name (lowercase letters, digits, `_`, `-`, `.`, starting with a letter, ≤ 64)",
                        m.name
                    ),
                    "use e.g. `chat`, `llama-3-8b`, `coder_v2`",
                ));
            }
            if seen.contains(&m.name.as_str()) {
                return Err(FieldError::new(
                    &at("name"),
                    format!("the model `{}` is named twice", m.name),
                    "give each model a distinct name",
                ));
            }
            seen.push(&m.name);
            if m.replicas == 0 {
                return Err(FieldError::new(&at("replicas"), "must be at least 1 (got 0)", "use e.g. 2"));
            }
            if !(m.share > 0.0 && m.share.is_finite() && m.share <= 1e9) {
                return Err(FieldError::new(
                    &at("share"),
                    format!("must be a positive number (got {:?})", m.share),
                    "use e.g. 0.8 or 1",
                ));
            }
        }
        let sum: u64 = self.models.iter().map(|m| m.replicas as u64).sum();
        if sum != self.replicas as u64 {
            return Err(FieldError::new(
                "replicas",
                format!("is {} but the models are served by {sum} replicas", self.replicas),
                format!("set `replicas: {sum}` (the models' sum)"),
            ));
        }
        // A model's replicas must stay its own and stay put: the routable set of each model is
        // fixed (no scaler adding replicas, no crash moving router indices, no P/D pools).
        let other = [
            (self.autoscaling.is_some(), "autoscaling"),
            (self.disaggregation.is_some(), "disaggregation"),
            (self.failures.is_some(), "failures"),
            (self.kv_tiers.is_some(), "kv_tiers"),
            (self.lora.is_some(), "lora"),
        ];
        if let Some((_, name)) = other.iter().find(|o| o.0) {
            return Err(FieldError::new(
                "models",
                format!("several models run on fixed aggregated clusters, and this one has `{name}`"),
                if *name == "lora" {
                    "drop `models:`, or drop `lora:` (adapters belong to one base model)".to_string()
                } else {
                    format!("drop `models:`, or drop `{name}`")
                },
            ));
        }
        Ok(())
    }
}
