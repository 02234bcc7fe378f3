//! KV tiers below GPU memory: the `cluster.kv_tiers:` section (a CPU tier per replica,
//! optionally — aggregated clusters only — a remote tier every replica shares; on a
//! disaggregated cluster the CPU tiers sit under the instances that prefill), and the tier spec
//! it shares with a disaggregated cluster's `shared_kv:`.
//!
//! ```yaml
//! cluster:
//!   kv_tiers:
//!     cpu: {capacity_gb: 128, bandwidth_gbps: 400, base_latency_s: 0.00005}   # per replica
//!     remote: {capacity_gb: 4000, bandwidth_gbps: 100}                       # optional, shared
//!     layerwise: true
//! ```
//!
//! What the simulator does with them is in `sim/cluster/tiers.rs`.

use serde::{Deserialize, Serialize};

use crate::workload::FieldError;
use crate::workload::limits::fits_clock;

/// One KV tier: its capacity and the link loads from it cross.
#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct KvTierSpec {
    /// Capacity in GB (1e9 bytes), > 0; least recently used blocks go when full.
    pub capacity_gb: f64,
    /// Read bandwidth in Gbit/s, > 0, shared by the loads in flight.
    pub bandwidth_gbps: f64,
    /// Fixed cost of each load, seconds, ≥ 0.
    #[serde(default = "default_base_latency")]
    pub base_latency_s: f64,
}

pub(super) fn default_base_latency() -> f64 {
    0.0005
}

/// Per-replica KV tiers of an aggregated cluster: GPU memory → `cpu` → `remote`.
#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct KvTiers {
    /// Host memory of each replica (vLLM's CPU offloading, LMCache's local CPU backend, Dynamo
    /// KVBM's G2): prompt segments the GPU cache evicts are written here; a prompt whose prefix
    /// continues here beyond the GPU cache loads that part instead of recomputing it.
    pub cpu: KvTierSpec,
    /// A store every replica shares (Mooncake Store, LMCache's remote backend, KVBM's G3/G4):
    /// what the CPU tiers evict goes here, and any replica loads from it. Absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<KvTierSpec>,
    /// Loads overlap the step layer by layer (LMCache's layer-wise retrieval, KVBM's
    /// layer-gated transfers): the step takes `max(compute + load / L, load + compute / L)` for
    /// L model layers instead of `compute + load`. Default true.
    #[serde(default = "yes")]
    pub layerwise: bool,
}

fn yes() -> bool {
    true
}

impl KvTierSpec {
    /// Read bandwidth in bytes per second.
    pub fn bandwidth_bytes_s(&self) -> f64 {
        self.bandwidth_gbps * 1e9 / 8.0
    }

    /// Capacity in tokens of `kv_bytes_per_token` bytes.
    pub fn capacity_tokens(&self, kv_bytes_per_token: f64) -> u64 {
        (self.capacity_gb * 1e9 / kv_bytes_per_token).floor() as u64
    }

    /// Checks the tier's figures (paths relative to the tier, `at`); `capacity_fix` and
    /// `bandwidth_fix` say what to write instead.
    pub fn validate(&self, at: &str, capacity_fix: &str, bandwidth_fix: &str) -> Result<(), FieldError> {
        if !(self.capacity_gb > 0.0 && self.capacity_gb.is_finite() && self.capacity_gb <= 1e9) {
            return Err(FieldError::new(
                &format!("{at}.capacity_gb"),
                format!("must be a positive number of GB (got {:?})", self.capacity_gb),
                capacity_fix,
            ));
        }
        check_link(at, self.bandwidth_gbps, self.base_latency_s, bandwidth_fix)
    }

    /// The largest load — `tokens` tokens of `kv_bytes_per_token` — must fit the clock.
    pub fn check_largest_load(&self, at: &str, tokens: u64, kv_bytes_per_token: f64) -> Result<(), FieldError> {
        let largest = self.base_latency_s + tokens as f64 * kv_bytes_per_token / self.bandwidth_bytes_s();
        fits_clock(
            &format!("{at}.bandwidth_gbps"),
            largest,
            &format!(
                "moving one instance's {tokens} tokens of KV must fit the clock: give a realistic bandwidth (e.g. 100)"
            ),
        )
    }
}

/// A link's bandwidth (Gbit/s) and fixed latency per transfer (paths under `at`).
pub fn check_link(at: &str, bandwidth_gbps: f64, base_latency_s: f64, fix: &str) -> Result<(), FieldError> {
    if !(bandwidth_gbps > 0.0 && bandwidth_gbps.is_finite() && bandwidth_gbps <= 1e6) {
        return Err(FieldError::new(
            &format!("{at}.bandwidth_gbps"),
            format!("must be a positive number of Gbit/s (got {bandwidth_gbps:?})"),
            fix,
        ));
    }
    if !(0.0..=10.0).contains(&base_latency_s) {
        return Err(FieldError::new(
            &format!("{at}.base_latency_s"),
            format!("must be in [0, 10] s (got {base_latency_s:?})"),
            "use e.g. 0.0005",
        ));
    }
    Ok(())
}

impl KvTiers {
    /// Checks the section (paths relative to `cluster`) for replicas of `kv_capacity_tokens`
    /// tokens of `kv_bytes_per_token` bytes.
    pub fn validate(&self, kv_capacity_tokens: u64, kv_bytes_per_token: f64) -> Result<(), FieldError> {
        let under = |e: FieldError| e.under("kv_tiers");
        self.cpu
            .validate(
                "cpu",
                "use e.g. 128 (a share of the host's DRAM), or remove `kv_tiers:` for GPU memory alone",
                "use e.g. 400 (PCIe 5 x16, about 50 GB/s)",
            )
            .map_err(under)?;
        self.cpu.check_largest_load("cpu", kv_capacity_tokens, kv_bytes_per_token).map_err(under)?;
        if let Some(r) = &self.remote {
            r.validate(
                "remote",
                "use e.g. 4000 (a pooled store), or remove `remote:`",
                "use e.g. 100 (RDMA to a DRAM pool)",
            )
            .map_err(under)?;
            r.check_largest_load("remote", kv_capacity_tokens, kv_bytes_per_token).map_err(under)?;
        }
        Ok(())
    }
}
