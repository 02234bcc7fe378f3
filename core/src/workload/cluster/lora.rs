//! The `cluster.lora:` section: requests on LoRA adapters of the served base model, and the
//! adapter slots of every replica.
//!
//! ```yaml
//! cluster:
//!   lora:
//!     adapters: 32              # fine-tuned variants of the base model
//!     popularity: {zipf: {s: 1.1}}
//!     base_share: 0.1           # share of sessions on the base model (no adapter)
//!     max_loras: 4              # distinct adapters one batch may use (vLLM's --max-loras)
//!     max_cpu_loras: 8          # adapters a replica keeps loaded, LRU (vLLM's --max-cpu-loras)
//!     size_mb: 160              # one adapter's weights
//!     load_gb_per_s: 2.0        # effective load bandwidth (disk or network to the GPU)
//! ```
//!
//! The adapter model follows vLLM: `vllm/lora/worker_manager.py` @ 9495bf0d
//! (`LRUCacheWorkerLoRAManager.add_lora`: a missing adapter is read from its checkpoint after
//! the oldest is removed when the cache is full; a present one is only touched) and the v1
//! scheduler's `max_loras` skip (`vllm/v1/core/sched/scheduler.py` @ b4622cf9). A batch uses at most `max_loras` distinct
//! adapters (a waiting request whose adapter would exceed that is skipped, and later ones may
//! still be admitted); a replica keeps up to `max_cpu_loras` adapters loaded, least recently used
//! out first; an adapter not loaded is read in before the step that first runs it
//! (`_apply_adapters` runs inside `execute_model`), so the cold load — `size_mb / load_gb_per_s`
//! — lengthens that step for the whole batch: it is on the step's critical path, not the one
//! request's. Without `max_loras` every adapter is loaded at start (vLLM's `--lora-modules` on
//! an unlimited fleet): no load, no limit, today's behaviour.
//!
//! Which requests use which adapter: a session (a group of turns or an agent session; a trace
//! row without a session) draws one adapter by `popularity` — index 0 the most popular — or the
//! base model with probability `base_share`, from the run seed's own stream, so arrivals and
//! sizes do not move. A prompt's KV is the adapter's own (vLLM hashes the adapter into every
//! block's key): requests on different adapters share no cached prefix.

use serde::{Deserialize, Serialize};

use super::Popularity;
use crate::workload::FieldError;

/// Most adapters a workload may name (bounds the per-replica tables).
pub const MAX_ADAPTERS: u32 = 100_000;

#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Lora {
    /// How many adapters of the base model the workload's requests use (≥ 1).
    pub adapters: u32,
    /// How sessions pick an adapter: `uniform` or `{zipf: {s}}` (adapter 0 the most popular).
    #[serde(default, with = "serde_norway::with::singleton_map")]
    #[schemars(with = "Popularity")]
    pub popularity: Popularity,
    /// Share of sessions on the base model, without an adapter (0 by default).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub base_share: f64,
    /// Most distinct adapters one batch may use (vLLM's `max_loras`); absent: unlimited, every
    /// adapter loaded from the start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_loras: Option<u32>,
    /// Adapters a replica keeps loaded, least recently used evicted first (vLLM's
    /// `max_cpu_loras`, ≥ `max_loras`); absent: `max_loras`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cpu_loras: Option<u32>,
    /// One adapter's weights, MB (160 by default: about a rank-16 adapter on every projection
    /// of an 8B model in fp16).
    #[serde(default = "default_size_mb")]
    pub size_mb: f64,
    /// Effective bandwidth of a cold load, GB/s (2 by default: a local NVMe read and the copy
    /// to the GPU).
    #[serde(default = "default_load_gb_per_s")]
    pub load_gb_per_s: f64,
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}
fn default_size_mb() -> f64 {
    160.0
}
fn default_load_gb_per_s() -> f64 {
    2.0
}

impl Lora {
    /// Seconds one cold load takes: `size_mb / (1000 · load_gb_per_s)`.
    pub fn load_s(&self) -> f64 {
        self.size_mb / (1000.0 * self.load_gb_per_s)
    }

    /// The adapters a replica keeps loaded (`None`: all, always).
    pub fn cache_slots(&self) -> Option<u32> {
        self.max_loras.map(|m| self.max_cpu_loras.unwrap_or(m))
    }

    pub fn validate(&self) -> Result<(), FieldError> {
        if self.adapters == 0 || self.adapters > MAX_ADAPTERS {
            return Err(FieldError::new(
                "adapters",
                format!("must be in 1..={MAX_ADAPTERS} (got {})", self.adapters),
                "use e.g. 32",
            ));
        }
        if let Popularity::Zipf { s } = self.popularity {
            if !(s > 0.0 && s.is_finite()) {
                return Err(FieldError::new("popularity.zipf.s", format!("must be > 0 (got {s:?})"), "use e.g. 1.1"));
            }
        }
        if !(0.0..1.0).contains(&self.base_share) {
            return Err(FieldError::new(
                "base_share",
                format!("must be in [0, 1) (got {:?})", self.base_share),
                "use e.g. 0.1, or drop `lora:` for base-model traffic only",
            ));
        }
        if self.max_loras == Some(0) {
            return Err(FieldError::new("max_loras", "must be at least 1", "use e.g. 4, or drop it for no limit"));
        }
        match (self.max_loras, self.max_cpu_loras) {
            (None, Some(_)) => {
                return Err(FieldError::new(
                    "max_cpu_loras",
                    "needs `max_loras` (without it every adapter stays loaded)",
                    "add `max_loras: 4`, or drop `max_cpu_loras`",
                ));
            }
            (Some(m), Some(c)) if c < m => {
                return Err(FieldError::new(
                    "max_cpu_loras",
                    format!("must be at least max_loras ({m}; got {c}): a batch's adapters must all be loaded"),
                    format!("use max_cpu_loras: {m} or more"),
                ));
            }
            _ => {}
        }
        for (field, v, fix) in
            [("size_mb", self.size_mb, "use e.g. 160"), ("load_gb_per_s", self.load_gb_per_s, "use e.g. 2.0")]
        {
            if !(v > 0.0 && v.is_finite()) {
                return Err(FieldError::new(field, format!("must be a number > 0 (got {v:?})"), fix));
            }
        }
        Ok(())
    }
}
