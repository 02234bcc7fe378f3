//! The cluster world's `disaggregation:` section: prefill and decode pools and the link between
//! them (prefill/decode disaggregation, xPyD). Absent, the cluster is aggregated (the default).
//!
//! ```yaml
//! cluster:
//!   replicas: 10                   # = prefill + mixed + decode instances
//!   disaggregation:
//!     prefill: {instances: 4}      # optional gpu / tp per pool (default: the cluster's)
//!     decode: {instances: 4, gpu: h100, tp: 2}
//!     mixed: {instances: 2}        # optional: prefill, decode, or both for one request
//!     link: {bandwidth_gbps: 100, base_latency_s: 0.0005, layerwise: false}
//!     transfer: missing            # or full_prompt
//!     shared_kv: {capacity_gb: 512, bandwidth_gbps: 100}   # optional shared KV tier
//! ```
//!
//! The model is the cluster's: KV moves between pools only within one model.

use serde::{Deserialize, Serialize};

use super::ClusterSpec;
use super::kv_tiers::{KvTierSpec, check_link, default_base_latency};
use crate::step_model::{Choice, Gpu, StepModel};
use crate::workload::FieldError;
use crate::workload::limits::fits_clock;

#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Disaggregation {
    /// Instances that only prefill (chunked prefill, prefix cache, KV admission); they hand the
    /// first token and the prompt's KV to a decode instance. 0 only with mixed instances.
    pub prefill: Pool,
    /// Instances that decode (continuous batching bounded by KV memory); they also prefill the
    /// requests a router sends them directly (conditional disaggregation). 0 only with mixed
    /// instances.
    pub decode: Pool,
    /// Instances that can prefill, decode, or both for one request (then nothing is
    /// transferred): prefill candidates and decode candidates both. Absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mixed: Option<Pool>,
    /// The network the KV cache crosses from prefill to decode.
    pub link: Link,
    /// Which prompt tokens a transfer moves: `missing` (only what the decode instance does not
    /// have cached, Dynamo's DestinationMissing) or `full_prompt`.
    #[serde(default)]
    pub transfer: TransferTokens,
    /// A KV store every instance reads (Mooncake Store, LMCache): prefill instances put the
    /// prompts they compute; an instance about to prefill a prompt whose prefix the store holds
    /// beyond its own cache loads that part instead of recomputing it. Absent: no tier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_kv: Option<KvTierSpec>,
}

/// One pool of instances.
#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Pool {
    /// Number of instances, at least 1.
    pub instances: u32,
    /// This pool's GPU (a catalog name or a mapping); default: the cluster's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<Choice<Gpu>>,
    /// This pool's tensor-parallel degree; default: the cluster's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tp: Option<u32>,
}

/// Every decode instance's inbound link (decode instances pull the KV, as NIXL reads do in
/// Dynamo and llm-d): concurrent transfers into one decode instance share its bandwidth.
#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Link {
    /// Bandwidth in Gbit/s, > 0 (RoCE 200G ≈ 160 effective, IB NDR 400, NVLink ≈ 3600).
    pub bandwidth_gbps: f64,
    /// Fixed cost of each transfer (RDMA setup, metadata), seconds, ≥ 0.
    #[serde(default = "default_base_latency")]
    pub base_latency_s: f64,
    /// Layer-wise transfer (Mooncake, LMCache, DistServe's pipelining): each layer's KV leaves as
    /// soon as the prefill has computed it, so the transfer overlaps the prefill and only the
    /// last layer's share is left after it (see [`Link::layerwise_end`]). Default off: the whole
    /// transfer starts when the prefill ends.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub layerwise: bool,
}

/// Which prompt tokens a KV transfer moves.
#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum TransferTokens {
    /// Only the prompt tokens the decode instance does not have cached.
    #[default]
    Missing,
    /// The whole prompt, whatever the decode side holds.
    FullPrompt,
}

impl Link {
    /// Bytes per second.
    pub fn bandwidth_bytes_s(&self) -> f64 {
        self.bandwidth_gbps * 1e9 / 8.0
    }

    /// Seconds to move `tokens` tokens of `kv_bytes_per_token` bytes when `concurrent` transfers
    /// (this one included) share the link: `base + tokens · bytes / (bandwidth / concurrent)`.
    pub fn transfer_time_s(&self, tokens: u32, kv_bytes_per_token: f64, concurrent: u32) -> f64 {
        self.base_latency_s + tokens as f64 * kv_bytes_per_token / (self.bandwidth_bytes_s() / concurrent.max(1) as f64)
    }

    /// When a layer-wise transfer of `transfer_s` seconds (base latency included, as from
    /// [`Link::transfer_time_s`]) over `layers` layers ends, for a prefill that ran from
    /// `prefill_start` to `prefill_end` (any time unit, the same for all three).
    ///
    /// Layer i's KV exists once the prefill has computed layer i; the link moves `bytes / L` per
    /// layer. Bandwidth-bound, the stream runs flat out from the prefill's start: it ends at
    /// `prefill_start + transfer_s`. Compute-bound, it keeps up with the prefill and only the last
    /// layer's bytes are left when the prefill ends: `prefill_end + (transfer_s − base) / L`. The
    /// end is the later of the two (never before the prefill ends). With `prefill_start =
    /// prefill_end` (no overlap: the decode side had no memory for it yet) this is the plain
    /// transfer, `prefill_end + transfer_s`.
    pub fn layerwise_end(&self, transfer_s: f64, layers: u32, prefill_start: f64, prefill_end: f64) -> f64 {
        let bytes_s = (transfer_s - self.base_latency_s).max(0.0);
        (prefill_start + transfer_s).max(prefill_end + bytes_s / layers.max(1) as f64)
    }
}

impl Disaggregation {
    /// Mixed instances (0 without a `mixed:` pool).
    pub fn mixed_instances(&self) -> u32 {
        self.mixed.as_ref().map_or(0, |m| m.instances)
    }

    /// The step models of the prefill and the decode pool.
    pub fn step_models(&self, cluster: &ClusterSpec) -> Result<(StepModel, StepModel), FieldError> {
        Ok((
            self.pool_step_model(&self.prefill, "prefill", cluster)?,
            self.pool_step_model(&self.decode, "decode", cluster)?,
        ))
    }

    /// The mixed pool's step model, if it has one.
    pub fn mixed_step_model(&self, cluster: &ClusterSpec) -> Result<Option<StepModel>, FieldError> {
        self.mixed.as_ref().map(|m| self.pool_step_model(m, "mixed", cluster)).transpose()
    }

    fn pool_step_model(&self, p: &Pool, name: &str, cluster: &ClusterSpec) -> Result<StepModel, FieldError> {
        let mut spec = cluster.clone();
        if let Some(g) = &p.gpu {
            spec.gpu = g.clone();
        }
        if let Some(tp) = p.tp {
            spec.tp = tp;
        }
        let under = |e: FieldError| e.under(name).under("disaggregation");
        let sm = spec.step_model().map_err(under)?;
        // The clock guard of `cluster.gpu` holds for every pool's GPU too.
        spec.check_step_model(&sm).map_err(under)?;
        Ok(sm)
    }

    /// Checks the section against its cluster (paths relative to `cluster`).
    pub fn validate(&self, cluster: &ClusterSpec) -> Result<(), FieldError> {
        let under = |e: FieldError| e.under("disaggregation");
        let pools = [("prefill", Some(&self.prefill)), ("decode", Some(&self.decode)), ("mixed", self.mixed.as_ref())];
        let mixed = self.mixed_instances();
        for (name, p) in pools.into_iter().filter_map(|(n, p)| Some((n, p?))) {
            // Mixed instances can stand in for either pool (all-mixed: `prefill` and `decode` 0).
            if p.instances == 0 && (name == "mixed" || mixed == 0) {
                let fix = if name == "mixed" {
                    "give it at least 1 instance, or remove `mixed:`"
                } else {
                    "give each pool at least 1 instance, or remove `disaggregation:` for an aggregated cluster"
                };
                return Err(under(FieldError::new(
                    &format!("{name}.instances"),
                    format!("the {name} pool has no instances"),
                    fix,
                )));
            }
            if let Some(tp) = p.tp
                && ![1, 2, 4, 8].contains(&tp)
            {
                return Err(under(FieldError::new(
                    &format!("{name}.tp"),
                    format!("must be 1, 2, 4 or 8 (got {tp})"),
                    "use 1, 2, 4 or 8",
                )));
            }
        }
        let total = self.prefill.instances as u64 + mixed as u64 + self.decode.instances as u64;
        if total != cluster.replicas as u64 {
            let mixed = if mixed > 0 { format!(" + {mixed} mixed") } else { String::new() };
            return Err(FieldError::new(
                "replicas",
                format!(
                    "is {}, but the pools hold {} prefill{mixed} + {} decode = {total} instances",
                    cluster.replicas, self.prefill.instances, self.decode.instances
                ),
                format!("set `replicas: {total}`"),
            ));
        }
        let l = &self.link;
        check_link("link", l.bandwidth_gbps, l.base_latency_s, "use e.g. 100 (RoCE) or 400 (InfiniBand NDR)")
            .map_err(under)?;
        if let Some(t) = &self.shared_kv {
            t.validate(
                "shared_kv",
                "use e.g. 512 (a few hosts' DRAM), or remove `shared_kv:` for no tier",
                "use e.g. 100 (RDMA to a DRAM pool)",
            )
            .map_err(under)?;
        }
        let (_, decode) = self.step_models(cluster)?;
        let mixed = self.mixed_step_model(cluster)?;
        // The largest transfer (or tier load) alone must fit the clock: a decode instance's whole
        // KV capacity over the link. Beyond it, `now + transfer` would wrap the nanosecond clock.
        let tokens = decode.kv_capacity_tokens.max(mixed.map_or(0, |m| m.kv_capacity_tokens));
        let bytes = tokens as f64 * decode.cost.kv_bytes_per_token;
        let fits = |at: &str, base_latency_s: f64, bandwidth_gbps: f64| {
            let largest = base_latency_s + bytes / (bandwidth_gbps * 1e9 / 8.0);
            fits_clock(
                &format!("{at}.bandwidth_gbps"),
                largest,
                &format!("moving one decode instance's {tokens} tokens of KV must fit the clock: give a realistic bandwidth (e.g. 100)"),
            )
            .map_err(under)
        };
        fits("link", l.base_latency_s, l.bandwidth_gbps)?;
        if let Some(t) = &self.shared_kv {
            fits("shared_kv", t.base_latency_s, t.bandwidth_gbps)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transfer_time_is_base_plus_bytes_over_the_shared_bandwidth() {
        // 100 Gbit/s = 12.5e9 B/s. 1000 tokens × 131072 B = 131.072 MB → 10.48576 ms alone,
        // twice that with two transfers on the link; plus 0.5 ms base.
        let l = Link { bandwidth_gbps: 100.0, base_latency_s: 0.0005, layerwise: false };
        assert!((l.transfer_time_s(1000, 131_072.0, 1) - 0.010_985_76).abs() < 1e-12);
        assert!((l.transfer_time_s(1000, 131_072.0, 2) - 0.021_471_52).abs() < 1e-12);
        assert_eq!(l.transfer_time_s(0, 131_072.0, 3), 0.0005);
    }

    #[test]
    fn a_layerwise_transfer_ends_after_the_prefill_by_the_larger_of_its_last_layer_and_its_lag() {
        let l = Link { bandwidth_gbps: 100.0, base_latency_s: 0.0005, layerwise: true };
        // Bandwidth-bound: 0.5 ms + 100 ms of bytes over 32 layers, prefill 0 → 40 ms: the stream,
        // started with the prefill, ends at 100.5 ms (60.5 ms after the prefill, not 100.5).
        assert!((l.layerwise_end(0.1005, 32, 0.0, 0.040) - 0.1005).abs() < 1e-12);
        // Compute-bound: a 1 s prefill; the last layer's 100/32 ms = 3.125 ms follows its end.
        assert!((l.layerwise_end(0.1005, 32, 0.0, 1.0) - 1.003_125).abs() < 1e-12);
        // No overlap (start = end): the plain transfer.
        assert!((l.layerwise_end(0.1005, 32, 2.0, 2.0) - 2.1005).abs() < 1e-12);
    }
}
