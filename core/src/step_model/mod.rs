//! The "paper GPU": a roofline step model of one replica (one GPU or a tensor-parallel group
//! running one model).
//!
//! A step processes one batch (decode tokens of running requests plus prefill chunks). Its time is
//! `max(flops / (peak_flops · mfu · tp), bytes / (bandwidth · mbu · tp)) + step_overhead`, priced
//! by [`CostModel::step_time_s`] in policy-api so routers and the host agree exactly; this module
//! only builds the [`CostModel`] from the catalog and computes the KV capacity.
//!
//! Calibration (docs/architecture.md, pinned by tests): mistral-7b on one a6000 at memory_fraction 0.9 has
//! 131,072 KV bytes per token and 219,089 tokens of KV capacity; the default MFU 0.7235 gives
//! ≈ 112 TFLOP/s effective (a lone 2,100-token prefill ≈ 0.28 s, 21,000 ≈ 3.75 s); MBU 0.8 gives a
//! lone decode step ≈ 23.6 ms + 0.4 ms overhead.
//!
//! Tensor parallelism (tp = 1, 2, 4, 8): compute, bandwidth and memory scale by tp (each GPU holds
//! a 1/tp shard of weights and KV heads). Communication: Megatron-style TP does two all-reduces per
//! layer per step; we charge each a fixed latency (`allreduce_latency_s`, default 10 µs, the
//! latency-bound regime of small decode batches on NVLink/PCIe) added to the step overhead:
//! `step_overhead_s + 2 · layers · allreduce_latency_s` when tp > 1. The bandwidth term of the
//! all-reduce (activations, ∝ tokens) is ignored: it is small next to the weight reads at the batch
//! sizes we simulate, and the ABI's cost model has no per-token overhead field.

use routelab_policy_api::Roofline;
use serde::{Deserialize, Serialize};

pub mod calibrated;
pub mod catalog;
mod describe;
pub mod fit;

pub use calibrated::{Calibration, Pricer};
pub use catalog::{GPU_NAMES, MODEL_NAMES, gpu, model};
pub use describe::{PrefillPrice, describe, describe_model, describe_prefill};
pub use routelab_policy_api::{Chunk, Step};

/// One GPU type. Units: bytes are 10^9 per GB.
#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Gpu {
    /// Shown in reports.
    pub name: String,
    /// Device memory, GB (10^9 bytes).
    pub memory_gb: f64,
    /// Peak memory bandwidth, GB/s.
    pub bandwidth_gb_s: f64,
    /// Peak dense fp16 tensor throughput, TFLOP/s.
    pub tflops: f64,
}

/// One model's shape.
#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Model {
    /// Shown in reports.
    pub name: String,
    /// Parameter count.
    pub parameters: u64,
    /// Transformer layers.
    pub layers: u32,
    /// Hidden size.
    pub hidden: u32,
    /// Attention heads.
    pub heads: u32,
    /// Key/value heads (grouped-query attention).
    pub kv_heads: u32,
    /// Dimension of one head.
    pub head_dim: u32,
    /// Bytes per weight and per KV element (2 for fp16/bf16).
    #[serde(default = "two")]
    pub bytes_per_element: u32,
    /// Vocabulary size (the embedding and the LM head; 0 = unknown, counted as layer weights).
    #[serde(default)]
    pub vocab: u32,
    /// Parameters one token computes with, for a mixture of experts (absent = all of them; with
    /// `moe`, derived from it and not given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_parameters: Option<u64>,
    /// The experts of a mixture of experts, in every decoder layer (absent = a dense model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe: Option<Moe>,
    /// Bytes per KV-cache element when the cache has its own dtype (1 for FP8 KV beside bf16
    /// weights); absent = `bytes_per_element`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_bytes_per_element: Option<u32>,
}

/// A mixture-of-experts layer: `experts` SwiGLU MLPs (gate, up and down projections of
/// `hidden × expert_intermediate`), of which each token goes through `experts_per_token`
/// (Hugging Face's `num_experts`, `num_experts_per_tok`, `moe_intermediate_size`).
#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Moe {
    /// Experts per layer.
    pub experts: u32,
    /// Experts each token goes through (top-k).
    pub experts_per_token: u32,
    /// Intermediate size of one expert's MLP.
    pub expert_intermediate: u32,
}

impl Model {
    /// Parameters of one expert (its gate, up and down projections); 0 for a dense model.
    pub fn expert_params(&self) -> f64 {
        self.moe.as_ref().map_or(0.0, |m| 3.0 * self.hidden as f64 * m.expert_intermediate as f64)
    }

    /// Parameters of one layer's experts, all of them; 0 for a dense model.
    pub fn layer_expert_params(&self) -> f64 {
        self.moe.as_ref().map_or(0.0, |m| m.experts as f64 * self.expert_params())
    }

    /// Parameters one token computes with: all of them for a dense model, the shared layers and
    /// `experts_per_token` experts a layer for a mixture of experts.
    pub fn active_params(&self) -> f64 {
        match (&self.moe, self.active_parameters) {
            (Some(m), _) => {
                self.parameters as f64
                    - self.layers as f64 * (m.experts - m.experts_per_token) as f64 * self.expert_params()
            }
            (None, Some(a)) => a as f64,
            (None, None) => self.parameters as f64,
        }
    }

    /// A mixture of experts' shape adds up: the path of the first field that does not, and why.
    pub fn check_moe(&self) -> Result<(), (String, String)> {
        let Some(m) = &self.moe else { return Ok(()) };
        if self.active_parameters.is_some() {
            return Err((
                "active_parameters".into(),
                "a model with `moe` derives its active parameters from it".into(),
            ));
        }
        if m.experts == 0 || m.experts_per_token == 0 || m.experts_per_token > m.experts {
            let why = format!("must be in 1..=experts ({}) (got {})", m.experts, m.experts_per_token);
            return Err(("moe.experts_per_token".into(), why));
        }
        if !(self.layer_expert_params() > 0.0 && self.layer_expert_params() < self.layer_weight_params()) {
            let why = format!(
                "{} experts of 3 × {} × {} parameters do not fit in a layer of {:.0} parameters",
                m.experts,
                self.hidden,
                m.expert_intermediate,
                self.layer_weight_params()
            );
            return Err(("moe.expert_intermediate".into(), why));
        }
        Ok(())
    }

    /// Bytes per KV-cache element.
    pub fn kv_bytes(&self) -> u32 {
        self.kv_bytes_per_element.unwrap_or(self.bytes_per_element)
    }

    /// Weights of one decoder layer: all parameters but the embedding and the LM head, per layer.
    pub fn layer_weight_params(&self) -> f64 {
        (self.parameters as f64 - 2.0 * self.vocab as f64 * self.hidden as f64).max(0.0) / self.layers.max(1) as f64
    }

    /// Parameters one token computes with in one decoder layer.
    pub fn layer_active_params(&self) -> f64 {
        match (&self.moe, self.active_parameters) {
            (None, None) => self.layer_weight_params(),
            _ => {
                (self.active_params() - 2.0 * self.vocab as f64 * self.hidden as f64).max(0.0)
                    / self.layers.max(1) as f64
            }
        }
    }

    /// Weights of one decoder layer outside its experts (attention, norms, the router); all of
    /// them for a dense model.
    pub fn layer_shared_params(&self) -> f64 {
        (self.layer_weight_params() - self.layer_expert_params()).max(0.0)
    }
}

fn two() -> u32 {
    2
}

/// How close the software gets to the hardware roofline.
#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Efficiency {
    /// Model FLOPs utilisation of prefill-bound steps.
    pub mfu: f64,
    /// Memory bandwidth utilisation of decode-bound steps.
    pub mbu: f64,
    /// Fixed time per step: kernel launches, scheduling, sampling.
    pub step_overhead_s: f64,
    /// Latency of one all-reduce between tensor-parallel GPUs (two per layer per step; tp > 1 only).
    pub allreduce_latency_s: f64,
}

impl Default for Efficiency {
    fn default() -> Self {
        Self { mfu: 0.7235, mbu: 0.8, step_overhead_s: 0.0004, allreduce_latency_s: 10e-6 }
    }
}

/// A GPU or model in a workload: a catalog name, or a full entry.
#[derive(Serialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(untagged)]
pub enum Choice<T> {
    Name(String),
    Custom(T),
}

/// A string is a name; anything else must be a full entry, and the entry's own error (an unknown
/// or missing field, a wrong type) is the one reported — an untagged enum would only say that
/// nothing matched.
impl<'de, T: Deserialize<'de>> Deserialize<'de> for Choice<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for V<T> {
            type Value = Choice<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a catalog name or a mapping")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Self::Value, E> {
                Ok(Choice::Name(s.to_string()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(Choice::Custom)
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

/// A [`Choice`] by a name routelab does not have (its message lists what it has), or a shipped
/// profile that does not read.
#[derive(Debug, Clone, PartialEq)]
pub enum ChoiceError {
    /// No catalog GPU of this name.
    UnknownGpu(String),
    /// No catalog model of this name.
    UnknownModel(String),
    /// No shipped calibration profile of this name.
    UnknownCalibration(String),
    /// The shipped profile `name` does not parse (`message` says why).
    Shipped { name: String, message: String },
}

impl std::fmt::Display for ChoiceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChoiceError::UnknownGpu(n) => write!(
                f,
                "unknown GPU '{n}'; catalog: {}; or give a mapping {{name, memory_gb, bandwidth_gb_s, tflops}}",
                GPU_NAMES.join(", ")
            ),
            ChoiceError::UnknownModel(n) => write!(
                f,
                "unknown model '{n}'; catalog: {}; or give a mapping {{name, parameters, layers, hidden, heads, kv_heads, head_dim}}",
                MODEL_NAMES.join(", ")
            ),
            ChoiceError::UnknownCalibration(n) => write!(
                f,
                "unknown calibration '{n}'; shipped: {}; or give the mapping `routelab calibrate` prints",
                calibrated::shipped_names()
            ),
            ChoiceError::Shipped { name, message } => write!(f, "shipped profile '{name}': {message}"),
        }
    }
}

impl std::error::Error for ChoiceError {}

impl Choice<Gpu> {
    pub fn resolve(&self) -> Result<Gpu, ChoiceError> {
        match self {
            Choice::Name(n) => gpu(n).ok_or_else(|| ChoiceError::UnknownGpu(n.clone())),
            Choice::Custom(g) => Ok(g.clone()),
        }
    }
}

impl Choice<Model> {
    pub fn resolve(&self) -> Result<Model, ChoiceError> {
        match self {
            Choice::Name(n) => model(n).ok_or_else(|| ChoiceError::UnknownModel(n.clone())),
            Choice::Custom(m) => Ok(m.clone()),
        }
    }
}

/// A model that does not fit: the numbers and what to change.
#[derive(Debug, Clone, PartialEq)]
pub struct DoesNotFit {
    pub message: String,
    pub fix: String,
}

impl std::fmt::Display for DoesNotFit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}\n  fix: {}", self.message, self.fix)
    }
}

/// One replica's resolved step model.
#[derive(Debug, Clone, PartialEq)]
pub struct StepModel {
    pub gpu: Gpu,
    pub model: Model,
    pub tp: u32,
    /// Replicas a mixture of experts' experts are split across (expert parallelism beside data
    /// parallelism); 1 otherwise.
    pub ep: u32,
    pub memory_fraction: f64,
    pub efficiency: Efficiency,
    /// The roofline (with a calibration: its effective rates and per-step constants in the
    /// roofline's form), for bounds such as the clock guard; steps are priced by `pricer`.
    pub cost: Roofline,
    pub kv_capacity_tokens: u64,
    /// The measured profile the steps are priced by, if any (else the roofline).
    pub calibration: Option<Calibration>,
    /// How the replica prices its steps.
    pub pricer: Pricer,
}

impl StepModel {
    /// Builds the model; fails when the weights leave no room for a single KV token. With `ep`
    /// > 1 a replica holds 1/`ep` of a mixture of experts' experts.
    pub fn new(
        gpu: Gpu,
        model: Model,
        tp: u32,
        ep: u32,
        memory_fraction: f64,
        efficiency: Efficiency,
    ) -> Result<Self, DoesNotFit> {
        let tpf = tp.max(1) as f64;
        let held = if ep > 1 {
            let elsewhere = model.layers as f64 * model.layer_expert_params() * (1.0 - 1.0 / ep as f64);
            model.parameters as f64 - elsewhere
        } else {
            model.parameters as f64
        };
        let weight_bytes = held * model.bytes_per_element as f64;
        let kv_bytes_per_token =
            2.0 * model.layers as f64 * model.kv_heads as f64 * model.head_dim as f64 * model.kv_bytes() as f64;
        let usable = gpu.memory_gb * 1e9 * tpf * memory_fraction;
        let free = usable - weight_bytes;
        // Negated so that a NaN (memory_gb or memory_fraction) does not fit either.
        if !(free >= kv_bytes_per_token) {
            let per_gpu_weights = weight_bytes / tpf / 1e9;
            let min_tp = [1u32, 2, 4, 8].into_iter().find(|&t| {
                gpu.memory_gb * 1e9 * t as f64 * memory_fraction - weight_bytes >= kv_bytes_per_token * 1024.0
            });
            let fix = match min_tp {
                Some(t) if t > tp => {
                    format!("raise tp to {t} (or more), use a GPU with more memory, or a smaller model")
                }
                _ => "use a GPU with more memory, a smaller model, or raise memory_fraction (at most 1)".to_string(),
            };
            return Err(DoesNotFit {
                message: format!(
                    "{} does not fit on {} × {}: weights {:.1} GB ({:.1} GB per GPU) but usable memory is {:.1} GB \
                     ({} GB × {} GPU(s) × memory_fraction {}), leaving no room for the KV cache",
                    model.name,
                    tp,
                    gpu.name,
                    weight_bytes / 1e9,
                    per_gpu_weights,
                    usable / 1e9,
                    gpu.memory_gb,
                    tp,
                    memory_fraction
                ),
                fix,
            });
        }
        let kv_capacity_tokens = (free / kv_bytes_per_token).floor() as u64;
        let comm = if tp > 1 { 2.0 * model.layers as f64 * efficiency.allreduce_latency_s } else { 0.0 };
        let cost = Roofline {
            flops_per_s: gpu.tflops * 1e12 * efficiency.mfu * tpf,
            bytes_per_s: gpu.bandwidth_gb_s * 1e9 * efficiency.mbu * tpf,
            linear_flops_per_token: 2.0 * model.active_params(),
            attention_flops_per_pair: 4.0 * model.layers as f64 * model.heads as f64 * model.head_dim as f64,
            weight_bytes,
            kv_bytes_per_token,
            step_overhead_s: efficiency.step_overhead_s + comm,
        };
        let pricer = Pricer::Roofline(cost);
        let ep = ep.max(1);
        Ok(Self {
            gpu,
            model,
            tp,
            ep,
            memory_fraction,
            efficiency,
            cost,
            kv_capacity_tokens,
            calibration: None,
            pricer,
        })
    }

    /// Prices the steps by `calibration` (measured on this GPU) instead of the roofline; routers
    /// price with it too (their cost model is `pricer`).
    pub fn calibrated(mut self, calibration: Calibration) -> Self {
        let c = calibration.for_model(&self.model, self.tp, self.ep);
        let tpf = self.tp.max(1) as f64;
        self.cost.flops_per_s = calibration.dense_tflops * 1e12 * tpf;
        self.cost.bytes_per_s = calibration.dense_gb_s * 1e9 * tpf;
        self.cost.step_overhead_s =
            c.step_overhead_s + c.layers * (c.dense_base_s + c.attention_base_s + c.comm_base_s) + c.head_base_s;
        self.pricer = Pricer::Calibrated(c);
        self.calibration = Some(calibration);
        self
    }

    /// Catalog names with default efficiency.
    pub fn from_catalog(gpu_name: &str, model_name: &str, tp: u32, memory_fraction: f64) -> Result<Self, DoesNotFit> {
        let g = gpu(gpu_name).ok_or_else(|| DoesNotFit {
            message: format!("unknown GPU '{gpu_name}'"),
            fix: format!("use one of: {}", GPU_NAMES.join(", ")),
        })?;
        let m = model(model_name).ok_or_else(|| DoesNotFit {
            message: format!("unknown model '{model_name}'"),
            fix: format!("use one of: {}", MODEL_NAMES.join(", ")),
        })?;
        Self::new(g, m, tp, 1, memory_fraction, Efficiency::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mistral_a6000() -> StepModel {
        StepModel::from_catalog("a6000", "mistral-7b", 1, 0.9).unwrap()
    }

    fn within(x: f64, target: f64, tol: f64) -> bool {
        (x - target).abs() <= tol * target
    }

    #[test]
    fn kv_bytes_and_capacity_are_exact() {
        let sm = mistral_a6000();
        assert_eq!(sm.cost.kv_bytes_per_token, 131_072.0);
        assert_eq!(sm.cost.weight_bytes, 14_483_464_192.0);
        assert_eq!(sm.kv_capacity_tokens, 219_089);
    }

    #[test]
    fn an_fp8_kv_cache_halves_kv_bytes_and_keeps_the_weights() {
        let bf16 = mistral_a6000();
        let mut m = model("mistral-7b").unwrap();
        m.kv_bytes_per_element = Some(1);
        let fp8 = StepModel::new(gpu("a6000").unwrap(), m, 1, 1, 0.9, Efficiency::default()).unwrap();
        assert_eq!(fp8.cost.kv_bytes_per_token, bf16.cost.kv_bytes_per_token / 2.0);
        assert_eq!(fp8.cost.weight_bytes, bf16.cost.weight_bytes);
        assert_eq!(fp8.kv_capacity_tokens, 2 * bf16.kv_capacity_tokens + 1);
    }

    #[test]
    fn a_mixture_of_experts_must_add_up_and_split_its_experts_only() {
        let mut m = model("qwen3-30b-a3b").unwrap();
        assert_eq!(m.check_moe(), Ok(()));
        m.active_parameters = Some(3_000_000_000);
        assert_eq!(m.check_moe().unwrap_err().0, "active_parameters");
        m.active_parameters = None;
        m.moe.as_mut().unwrap().experts_per_token = 129;
        assert_eq!(m.check_moe().unwrap_err().0, "moe.experts_per_token");
        m.moe.as_mut().unwrap().experts_per_token = 8;
        m.moe.as_mut().unwrap().expert_intermediate = 7680;
        assert_eq!(m.check_moe().unwrap_err().0, "moe.expert_intermediate");
        // Split two ways, a replica holds the shared weights and half the experts.
        let one = StepModel::from_catalog("rtx-pro-6000", "qwen3-30b-a3b", 1, 0.9).unwrap();
        let m = model("qwen3-30b-a3b").unwrap();
        let two = StepModel::new(gpu("rtx-pro-6000").unwrap(), m.clone(), 1, 2, 0.9, Efficiency::default()).unwrap();
        let half = 48.0 * m.layer_expert_params() / 2.0 * 2.0;
        assert_eq!(one.cost.weight_bytes - two.cost.weight_bytes, half);
        assert!(two.kv_capacity_tokens > one.kv_capacity_tokens);
    }

    #[test]
    fn lone_prefills_hit_the_anchors() {
        let c = mistral_a6000().cost;
        let short = c.prefill_time_s(2_100, 0);
        let long = c.prefill_time_s(21_000, 0);
        assert!(within(short, 0.28, 0.05), "2,100-token prefill took {short} s");
        assert!(within(long, 3.77, 0.05), "21,000-token prefill took {long} s");
        // Effective compute ≈ 112 TFLOP/s.
        assert!(within(c.flops_per_s, 112e12, 0.001), "{}", c.flops_per_s);
    }

    #[test]
    fn lone_decode_step_is_about_24_ms() {
        let c = mistral_a6000().cost;
        let t = c.decode_step_time_s(1, 100);
        assert!(within(t, 0.024, 0.05), "decode step {t} s");
    }

    #[test]
    fn batched_decode_is_far_cheaper_per_request() {
        let c = mistral_a6000().cost;
        let single = c.decode_step_time_s(1, 2_000);
        let batched = c.decode_step_time_s(32, 32 * 2_000);
        assert!(batched < 32.0 * single / 4.0, "32 × 2K batched {batched} s vs single {single} s");
        assert!(batched > single, "reading 64K tokens of KV must cost something");
    }

    #[test]
    fn tensor_parallel_scales_and_pays_communication() {
        let one = mistral_a6000();
        let four = StepModel::from_catalog("a6000", "mistral-7b", 4, 0.9).unwrap();
        assert_eq!(four.cost.flops_per_s, 4.0 * one.cost.flops_per_s);
        assert!(four.kv_capacity_tokens > 4 * one.kv_capacity_tokens);
        assert!((four.cost.step_overhead_s - (0.0004 + 64.0 * 10e-6)).abs() < 1e-12);
    }

    #[test]
    fn a_model_that_does_not_fit_says_so_with_numbers_and_a_fix() {
        let e = StepModel::from_catalog("a6000", "llama-3-70b", 1, 0.9).unwrap_err();
        assert!(e.message.contains("141.1 GB"), "{}", e.message);
        assert!(e.fix.contains("raise tp to 4"), "{}", e.fix);
        assert!(StepModel::from_catalog("a6000", "llama-3-70b", 4, 0.9).is_ok());
        assert!(describe("a6000", "llama-3-70b", 1).is_err());
    }

    /// Exercise 3's two conventions: without attention over the cached part a prefill costs what
    /// the new tokens cost as a prompt of their own; with it, more.
    #[test]
    fn prefill_price_ignores_the_cached_part_only_in_the_second_convention() {
        let sm = StepModel::from_catalog("a6000", "mistral-7b", 1, 0.9).unwrap();
        let p = sm.prefill_price(23_000, 21_013);
        assert_eq!((p.new_tokens, p.cached_tokens), (1_987, 21_013));
        let alone = sm.prefill_price(1_987, 0);
        assert_eq!(alone.with_cached_attention_s, alone.without_cached_attention_s);
        assert_eq!(p.without_cached_attention_s, alone.with_cached_attention_s);
        assert!(p.with_cached_attention_s > 1.5 * p.without_cached_attention_s, "{p:?}");
        assert_eq!(sm.prefill_price(10, 50).new_tokens, 0, "cached beyond the prompt is clamped");
    }

    #[test]
    fn describe_prints_the_anchors() {
        let d = describe("a6000", "mistral-7b", 1).unwrap();
        assert!(d.contains("219089 tokens"), "{d}");
        assert!(d.contains("131072"), "{d}");
        assert!(d.contains("21000"), "{d}");
    }
}
