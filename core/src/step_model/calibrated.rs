//! A step model fitted to measurements: a GPU's efficiencies and overheads, measured inside vLLM,
//! applied to any model by its shape.
//!
//! One step of a replica (per GPU of a `tp` group; every sum runs over the step's requests):
//!
//! ```text
//! step = step_overhead
//!      + layers · ( max(dense_floor, dense_base + T · dense_per_token)          projections + MLP
//!                 + attention_base + pairs · per_pair + kv · per_kv_token        attention
//!                   (per_kv_token from `attention_mixed_gb_s` when the step also prefills)
//!                 + decodes · attention_per_decode
//!                 + [tp > 1] 2 · (allreduce + T · hidden bytes / allreduce_bw) ) two all-reduces
//!      + head_base + S · head_per_sequence                                       LM head + sampler
//! ```
//! where `T` is the step's tokens (one per decoding request plus every prefill chunk), `pairs`
//! the prefill chunks' (new token, context token) attention pairs, `kv` the decoding requests'
//! context tokens, `S` the sequences that sample a token (decodes and prefill chunks).
//! `dense_floor` = one layer's weights ÷ `dense_gb_s` (reading the weights bounds a small batch),
//! `dense_per_token` = 2 · a layer's active parameters ÷ `dense_tflops`, `per_pair` =
//! 4 · heads · head_dim ÷ `attention_tflops`, `per_kv_token` = a layer's KV bytes per token ÷
//! `attention_gb_s`, `head_base` = the LM head's weights ÷ `head_gb_s`; each per GPU of the group
//! (weights, heads and KV heads split `tp` ways).
//!
//! Per request, outside the engine's steps: `request_overhead_s` is added to the time to the first
//! token and `output_token_s` to every later token (detokenising and streaming).
//!
//! The terms are fitted by `routelab calibrate` ([`super::fit`]) from per-layer timings measured
//! inside vLLM and from measured runs; docs/accuracy.md gives each term's fit error and the
//! profile's error on runs it was not fitted on. Routers see the roofline part of this model in
//! their `CostModel` (effective FLOP/s and bandwidth, the per-step constants folded into the step
//! overhead): the ABI's cost model has no per-layer, per-sequence or attention-specific terms yet.

use std::collections::BTreeMap;

use routelab_policy_api::abi_stable::std_types::Tuple2;
use routelab_policy_api::{Roofline, Step, StepPricer, StepShape};
use serde::{Deserialize, Serialize};

use super::{Choice, Model};

/// A GPU's fitted terms. Rates are effective (what the kernels reach), not datasheet peaks.
#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Calibration {
    /// The profile's name (`rtx-pro-6000`).
    pub name: String,
    /// The catalog GPU it was measured on; a cluster on another GPU is refused.
    pub gpu: String,
    /// Where the measurements come from and how the terms were fitted.
    pub source: String,
    /// Dense layers (projections, MLP) when reading the weights bounds them, GB/s.
    pub dense_gb_s: f64,
    /// Dense layers when compute bounds them, TFLOP/s.
    pub dense_tflops: f64,
    /// Fixed time of one layer's dense kernels in the compute-bound regime, s.
    pub dense_base_s: f64,
    /// Prefill attention, TFLOP/s (4 · heads · head_dim flops per pair).
    pub attention_tflops: f64,
    /// Decode attention reading the KV cache, GB/s.
    pub attention_gb_s: f64,
    /// Decode attention in a step that also prefills (one kernel for both), GB/s.
    pub attention_mixed_gb_s: f64,
    /// Fixed time of one layer's attention kernels, s.
    pub attention_base_s: f64,
    /// Per layer and decoding request, s.
    pub attention_per_decode_s: f64,
    /// The LM head reading its weights (vocab × hidden), GB/s.
    pub head_gb_s: f64,
    /// LM head and sampler per sequence that samples a token, s.
    pub head_per_sequence_s: f64,
    /// Per step, what kernel timings cannot see (scheduler, input preparation, launches), s.
    pub step_overhead_s: f64,
    /// Latency of one all-reduce (two per layer when tp > 1), s.
    pub allreduce_s: f64,
    /// Bandwidth of an all-reduce of the step's activations (tokens × hidden), GB/s.
    pub allreduce_gb_s: f64,
    /// Added to every request's time to first token, s.
    pub request_overhead_s: f64,
    /// Added to every output token after the first, s.
    pub output_token_s: f64,
    /// How well each term fits the measurements it was fitted on (shown by `step-model`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub fit: BTreeMap<String, TermFit>,
}

/// A fitted term's error on its own measurements.
#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TermFit {
    /// Measurements fitted.
    pub points: u32,
    /// Median absolute relative error.
    pub median_error: f64,
    /// 90th percentile of the absolute relative error.
    pub p90_error: f64,
}

/// The profiles shipped with routelab (`workloads/profiles/`), by name.
pub const SHIPPED: [(&str, &str); 2] = [
    ("rtx-pro-6000", include_str!("../../../workloads/profiles/rtx-pro-6000.yaml")),
    ("rtx4090", include_str!("../../../workloads/profiles/rtx4090.yaml")),
];

impl Choice<Calibration> {
    /// A shipped profile by name, or the mapping as given.
    pub fn resolve(&self) -> Result<Calibration, String> {
        match self {
            Choice::Name(n) => match SHIPPED.iter().find(|(k, _)| k == n) {
                Some((_, text)) => serde_norway::from_str(text).map_err(|e| format!("shipped profile '{n}': {e}")),
                None => Err(format!(
                    "unknown calibration '{n}'; shipped: {}; or give the mapping `routelab calibrate` prints",
                    SHIPPED.map(|(k, _)| k).join(", ")
                )),
            },
            Choice::Custom(c) => Ok(c.clone()),
        }
    }
}

impl Calibration {
    /// A profile to fit, with the defaults of the terms kernel timings cannot give: no per-step
    /// or per-request overhead, and an all-reduce over PCIe Gen5 (15 µs, 50 GB/s) for tp > 1.
    pub fn unfitted(name: &str, gpu: &str, source: &str) -> Self {
        Calibration {
            name: name.into(),
            gpu: gpu.into(),
            source: source.into(),
            dense_gb_s: 1.0,
            dense_tflops: 1.0,
            dense_base_s: 0.0,
            attention_tflops: 1.0,
            attention_gb_s: 1.0,
            attention_mixed_gb_s: 1.0,
            attention_base_s: 0.0,
            attention_per_decode_s: 0.0,
            head_gb_s: 1.0,
            head_per_sequence_s: 0.0,
            step_overhead_s: 0.0,
            allreduce_s: 15e-6,
            allreduce_gb_s: 50.0,
            request_overhead_s: 0.0,
            output_token_s: 0.0,
            fit: BTreeMap::new(),
        }
    }

    /// Every rate positive and finite, every time non-negative and finite: the path of the first
    /// that is not, and why.
    pub fn check(&self) -> Result<(), (String, String)> {
        let rates = [
            ("dense_gb_s", self.dense_gb_s),
            ("dense_tflops", self.dense_tflops),
            ("attention_tflops", self.attention_tflops),
            ("attention_gb_s", self.attention_gb_s),
            ("attention_mixed_gb_s", self.attention_mixed_gb_s),
            ("head_gb_s", self.head_gb_s),
            ("allreduce_gb_s", self.allreduce_gb_s),
        ];
        for (k, v) in rates {
            if !(v > 0.0 && v.is_finite() && v < 1e7) {
                return Err((k.into(), format!("must be a positive rate below 10^7 (got {v:?})")));
            }
        }
        let times = [
            ("dense_base_s", self.dense_base_s),
            ("attention_base_s", self.attention_base_s),
            ("attention_per_decode_s", self.attention_per_decode_s),
            ("head_per_sequence_s", self.head_per_sequence_s),
            ("step_overhead_s", self.step_overhead_s),
            ("allreduce_s", self.allreduce_s),
            ("request_overhead_s", self.request_overhead_s),
            ("output_token_s", self.output_token_s),
        ];
        for (k, v) in times {
            if !((0.0..=10.0).contains(&v)) {
                return Err((k.into(), format!("must be a time in [0, 10] s (got {v:?})")));
            }
        }
        Ok(())
    }

    /// The per-GPU coefficients for `model` split `tp` ways.
    pub fn for_model(&self, model: &Model, tp: u32) -> Calibrated {
        let tp = tp.max(1) as f64;
        let bpe = model.bytes_per_element as f64;
        let kv_bpe = model.kv_bytes() as f64;
        let heads = (model.heads as f64 / tp).max(1.0);
        let kv_heads = (model.kv_heads as f64 / tp).max(1.0);
        let d = model.head_dim as f64;
        let gb = 1e9;
        let tf = 1e12;
        let comm = tp > 1.0;
        Calibrated {
            layers: model.layers as f64,
            dense_floor_s: model.layer_weight_params() * bpe / tp / (self.dense_gb_s * gb),
            dense_base_s: self.dense_base_s,
            dense_per_token_s: 2.0 * model.layer_active_params() / tp / (self.dense_tflops * tf),
            attention_base_s: self.attention_base_s,
            attention_per_pair_s: 4.0 * heads * d / (self.attention_tflops * tf),
            attention_per_kv_token_s: 2.0 * kv_heads * d * kv_bpe / (self.attention_gb_s * gb),
            attention_mixed_per_kv_token_s: 2.0 * kv_heads * d * kv_bpe / (self.attention_mixed_gb_s * gb),
            attention_per_decode_s: self.attention_per_decode_s,
            comm_base_s: if comm { 2.0 * self.allreduce_s } else { 0.0 },
            comm_per_token_s: if comm { 2.0 * model.hidden as f64 * bpe / (self.allreduce_gb_s * gb) } else { 0.0 },
            head_base_s: model.vocab as f64 * model.hidden as f64 * bpe / tp / (self.head_gb_s * gb),
            head_per_sequence_s: self.head_per_sequence_s,
            step_overhead_s: self.step_overhead_s,
            request_overhead_s: self.request_overhead_s,
            output_token_s: self.output_token_s,
        }
    }
}

/// A calibration resolved for one model and tp: seconds per unit, per GPU of the group.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Calibrated {
    pub layers: f64,
    pub dense_floor_s: f64,
    pub dense_base_s: f64,
    pub dense_per_token_s: f64,
    pub attention_base_s: f64,
    pub attention_per_pair_s: f64,
    pub attention_per_kv_token_s: f64,
    pub attention_mixed_per_kv_token_s: f64,
    pub attention_per_decode_s: f64,
    pub comm_base_s: f64,
    pub comm_per_token_s: f64,
    pub head_base_s: f64,
    pub head_per_sequence_s: f64,
    pub step_overhead_s: f64,
    pub request_overhead_s: f64,
    pub output_token_s: f64,
}

impl Calibrated {
    /// Seconds for `step`; an empty step costs nothing.
    pub fn step_time_s(&self, step: &Step<'_>) -> f64 {
        let mut tokens = step.decodes;
        let mut pairs = 0.0;
        for c in step.chunks.iter() {
            let (n, done) = (c.new_tokens, c.context_tokens);
            tokens += n;
            let n = n as f64;
            pairs += n * done as f64 + n * (n + 1.0) / 2.0;
        }
        if tokens == 0 {
            return 0.0;
        }
        let t = tokens as f64;
        let sequences = (step.decodes + step.chunks.len() as u64) as f64;
        let dense = self.dense_floor_s.max(self.dense_base_s + t * self.dense_per_token_s);
        let attention = self.attention_base_s
            + pairs * self.attention_per_pair_s
            + step.decode_context_tokens as f64
                * if step.chunks.is_empty() {
                    self.attention_per_kv_token_s
                } else {
                    self.attention_mixed_per_kv_token_s
                }
            + step.decodes as f64 * self.attention_per_decode_s;
        let comm = self.comm_base_s + t * self.comm_per_token_s;
        self.step_overhead_s
            + self.layers * (dense + attention + comm)
            + self.head_base_s
            + sequences * self.head_per_sequence_s
    }
}

/// How a replica's steps are priced: the roofline every router also sees, or a calibration.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Pricer {
    Roofline(Roofline),
    Calibrated(Calibrated),
}

impl Pricer {
    /// Seconds for `step`.
    pub fn step_time_s(&self, step: &Step<'_>) -> f64 {
        match self {
            Pricer::Roofline(cost) => cost.shape_time_s(&StepShape::of(step)),
            Pricer::Calibrated(c) => c.step_time_s(step),
        }
    }

    /// Seconds added to a request's first token and to each later token, outside the steps.
    pub fn per_request_s(&self) -> (f64, f64) {
        match self {
            Pricer::Roofline(_) => (0.0, 0.0),
            Pricer::Calibrated(c) => (c.request_overhead_s, c.output_token_s),
        }
    }
}

/// Routers price steps through the host's own pricer ([`routelab_policy_api::CostModel`]).
impl StepPricer for Pricer {
    fn step_time_s(&self, step: Step<'_>) -> f64 {
        Pricer::step_time_s(self, &step)
    }
    fn per_request_s(&self) -> Tuple2<f64, f64> {
        let (first, per_token) = Pricer::per_request_s(self);
        Tuple2(first, per_token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::step_model::catalog::model;
    use routelab_policy_api::Chunk;

    fn profile() -> Calibration {
        Choice::<Calibration>::Name("rtx-pro-6000".into()).resolve().unwrap()
    }

    #[test]
    fn shipped_profiles_parse_and_check() {
        for (name, _) in SHIPPED {
            let c = Choice::<Calibration>::Name(name.into()).resolve().unwrap();
            assert_eq!(c.name, name);
            c.check().unwrap();
        }
        assert!(Choice::<Calibration>::Name("nope".into()).resolve().unwrap_err().contains("rtx-pro-6000"));
    }

    #[test]
    fn an_empty_step_is_free_and_every_term_adds_time() {
        let c = profile().for_model(&model("llama-3.1-8b").unwrap(), 1);
        assert_eq!(c.step_time_s(&Step::decode(0, 0)), 0.0);
        let one = c.step_time_s(&Step::decode(1, 1000));
        let longer = c.step_time_s(&Step::decode(1, 8000));
        let more = c.step_time_s(&Step::decode(64, 64_000));
        let chunk = c.step_time_s(&Step::mixed(1, 1000, &[Chunk { new_tokens: 2048, context_tokens: 0 }]));
        assert!(one > 0.0 && longer > one && more > longer && chunk > one, "{one} {longer} {more} {chunk}");
        // A chunk on a long cached context costs more than the same chunk alone.
        let cached = c.step_time_s(&Step::mixed(1, 1000, &[Chunk { new_tokens: 2048, context_tokens: 8192 }]));
        assert!(cached > chunk);
    }

    #[test]
    fn tensor_parallel_pays_its_all_reduces_and_splits_the_rest() {
        let p = profile();
        let m = model("qwen3-32b").unwrap();
        let (one, two) = (p.for_model(&m, 1), p.for_model(&m, 2));
        assert_eq!(one.comm_base_s, 0.0);
        assert_eq!(two.comm_base_s, 2.0 * p.allreduce_s);
        assert!((two.dense_floor_s * 2.0 - one.dense_floor_s).abs() < 1e-15);
        assert!((two.attention_per_pair_s * 2.0 - one.attention_per_pair_s).abs() < 1e-20);
    }
}
