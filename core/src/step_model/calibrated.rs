//! A step model fitted to measurements: a GPU's efficiencies and overheads, measured inside vLLM,
//! applied to any model by its shape.
//!
//! One step of a replica (per GPU of a `tp` group; every sum runs over the step's requests):
//!
//! ```text
//! step = step_overhead + layers · layer_overhead
//!      + layers · ( max(dense_floor, dense_base + T · dense_per_token)          projections + MLP
//!                 + attention_base + pairs · per_pair + kv · per_kv_token        attention
//!                   (per_kv_token from `attention_mixed_head_gb_s` when the step also prefills)
//!                 + decodes · attention_per_decode
//!                 + [tp > 1] 2 · (allreduce + T · hidden bytes / allreduce_bw) ) two all-reduces
//!      + head_base + S · head_per_sequence                                       LM head + sampler
//! ```
//! A mixture of experts adds, per layer, its experts beside the shared weights (the dense term
//! then covers attention projections, norms and the router only):
//!
//! ```text
//!   max(touched · expert_floor, T · k · expert_per_pair)                          experts
//!   + [ep > 1] 2 · (allreduce + (ep − 1) · T · hidden bytes / allreduce_bw)       dispatch, combine
//! touched = (experts / ep) · (1 − (1 − k / experts)^(ep · T))
//! ```
//! `touched` is the expected number of this GPU's experts that at least one of the step's tokens
//! goes to (`k` of `experts` per token, uniform routing; with expert parallelism over `ep`
//! data-parallel replicas every replica holds `experts / ep` of them and sees the tokens of all
//! `ep`, taken as loaded like itself): a decode step reads the weights the active experts touch,
//! never more than the experts it holds; `expert_floor` = one expert's weights ÷ `dense_gb_s`,
//! `expert_per_pair` = 2 · one expert's parameters ÷ `dense_tflops`, so a prefill computes on the
//! active parameters alone. Both rates are the dense layers' (no term is fitted on a MoE); against
//! the MoE block timings LLMServingSim measured for Qwen3-30B-A3B on the RTX PRO 6000 the form
//! is within 6.8% (median) on grid points whose expert count matches their token count
//! (docs/accuracy.md). Dispatch and combine are vLLM's default all2all backend (an all-gather
//! and a reduce-scatter of the tokens' hidden states), priced at the all-reduce's rates.
//! where `T` is the step's tokens (one per decoding request plus every prefill chunk), `pairs`
//! the prefill chunks' (new token, context token) attention pairs, `kv` the decoding requests'
//! context tokens, `S` the sequences that sample a token (decodes and prefill chunks).
//! `dense_floor` = one layer's weights ÷ `dense_gb_s` (reading the weights bounds a small batch),
//! `dense_base` = `dense_base_share` · `dense_floor` (the compute-bound line's intercept grows
//! with the layer: in the layer timings of Llama-3.1-8B at TP1 and TP2 and of Qwen3-32B it is
//! ~0.59 of the weight-read time, where one constant was 22% slow at TP2 and 9% fast on
//! Qwen3-32B), `dense_per_token` = 2 · a layer's active parameters ÷ `dense_tflops`, `per_pair` =
//! 4 · heads · head_dim ÷ `attention_tflops`, `per_kv_token` = a layer's KV bytes per token ÷
//! `attention_gb_s` — beside a prefill chunk, the KV bytes once per *query* head ÷
//! `attention_mixed_head_gb_s` (the prefill kernel does not share a KV head's reads between
//! its query heads: with KV heads instead, Qwen3's mixed steps, 8 query heads a KV head against
//! Llama's 4, came out 34–38% fast against their layer timings; with query heads, within 4%),
//! `head_base` = the LM head's weights ÷ `head_gb_s`; each per GPU of the group (weights, heads
//! and KV heads split `tp` ways).
//!
//! Per request, outside the engine's steps: `request_overhead_s` is added to the time to the first
//! token and `output_token_s` to every later token (detokenising and streaming).
//!
//! The terms are fitted by `routelab calibrate` ([`super::fit`]) from per-layer timings measured
//! inside vLLM and from measured runs; docs/accuracy.md gives each term's fit error and the
//! profile's error on runs it was not fitted on. Routers price with this very model: their
//! `CostModel` wraps the replica's [`Pricer`] (every term above, the experts included). The
//! roofline kept beside it (`StepModel::cost`: effective FLOP/s and bandwidth, the per-step
//! constants folded into its overhead) only describes the profile. What routers cannot see is
//! the lock-step of a MoE's data-parallel engines (`sim/cluster/lockstep.rs`).

use std::collections::BTreeMap;

use crate::time::{SimTime, ticks};
use routelab_policy_api::abi_stable::std_types::Tuple2;
use routelab_policy_api::{Roofline, Step, StepPricer, StepShape};
use serde::{Deserialize, Serialize};

use super::{Choice, ChoiceError, Model};

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
    /// Intercept of one layer's dense kernels in the compute-bound regime, as a share of the
    /// layer's weight-read time (`dense_floor`).
    pub dense_base_share: f64,
    /// Prefill attention, TFLOP/s (4 · heads · head_dim flops per pair).
    pub attention_tflops: f64,
    /// Decode attention reading the KV cache, GB/s.
    pub attention_gb_s: f64,
    /// Decode attention in a step that also prefills (one kernel for both): KV bytes read once
    /// per query head, GB/s.
    pub attention_mixed_head_gb_s: f64,
    /// Fixed time of one layer's attention kernels, s.
    pub attention_base_s: f64,
    /// Per layer and decoding request, s.
    pub attention_per_decode_s: f64,
    /// The LM head reading its weights (vocab × hidden), GB/s.
    pub head_gb_s: f64,
    /// LM head and sampler per sequence that samples a token, s.
    pub head_per_sequence_s: f64,
    /// Per step, what kernel timings cannot see (scheduler, input preparation), s.
    pub step_overhead_s: f64,
    /// Per step and decoder layer, what kernel timings cannot see (launch gaps, synchronisation:
    /// the runs' unexplained time grows with the layer count), s.
    #[serde(default)]
    pub layer_overhead_s: f64,
    /// Latency of one all-reduce (two per layer when tp > 1), s.
    pub allreduce_s: f64,
    /// Bandwidth of an all-reduce of the step's activations (tokens × hidden), GB/s.
    pub allreduce_gb_s: f64,
    /// Added to every request's time to first token, s.
    pub request_overhead_s: f64,
    /// Added to every output token after the first, s.
    pub output_token_s: f64,
    /// The engine schedules one step ahead (vLLM's async scheduling, on by default since it
    /// stopped being opt-in): a step's batch is formed when the step before it starts, so a
    /// request the engine picks up mid-step joins the step after the next, and a slot a request
    /// frees at a step's end is refilled one step later (`sim/cluster/replica/async_sched.rs`). Declared
    /// by a profile whose overheads were fitted on runs of such an engine; off by default (the
    /// replica forms each step when the last one ends).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub async_scheduling: bool,
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

/// The profiles shipped with routelab (`workloads/profiles/`), by name: two fitted to layer
/// timings measured inside vLLM 0.19 (and, for the RTX PRO 6000, its measured runs), two fitted
/// to Splitwise's whole Llama-2-70B steps (late-2023 software; docs/accuracy.md).
pub const SHIPPED: [(&str, &str); 4] = [
    ("rtx-pro-6000", include_str!("../../../workloads/profiles/rtx-pro-6000.yaml")),
    ("rtx4090", include_str!("../../../workloads/profiles/rtx4090.yaml")),
    ("h100-splitwise", include_str!("../../../workloads/profiles/h100-splitwise.yaml")),
    ("a100-80-splitwise", include_str!("../../../workloads/profiles/a100-80-splitwise.yaml")),
];

/// The shipped profiles' names, for messages: "rtx-pro-6000, rtx4090, …".
pub fn shipped_names() -> String {
    SHIPPED.map(|(k, _)| k).join(", ")
}

impl Choice<Calibration> {
    /// A shipped profile by name, or the mapping as given.
    pub fn resolve(&self) -> Result<Calibration, ChoiceError> {
        match self {
            Choice::Name(n) => match SHIPPED.iter().find(|(k, _)| k == n) {
                Some((_, text)) => serde_norway::from_str(text)
                    .map_err(|e| ChoiceError::Shipped { name: n.clone(), message: e.to_string() }),
                None => Err(ChoiceError::UnknownCalibration(n.clone())),
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
            dense_base_share: 0.0,
            attention_tflops: 1.0,
            attention_gb_s: 1.0,
            attention_mixed_head_gb_s: 1.0,
            attention_base_s: 0.0,
            attention_per_decode_s: 0.0,
            head_gb_s: 1.0,
            head_per_sequence_s: 0.0,
            step_overhead_s: 0.0,
            layer_overhead_s: 0.0,
            allreduce_s: 15e-6,
            allreduce_gb_s: 50.0,
            request_overhead_s: 0.0,
            output_token_s: 0.0,
            async_scheduling: false,
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
            ("attention_mixed_head_gb_s", self.attention_mixed_head_gb_s),
            ("head_gb_s", self.head_gb_s),
            ("allreduce_gb_s", self.allreduce_gb_s),
        ];
        for (k, v) in rates {
            if !(v > 0.0 && v.is_finite() && v < 1e7) {
                return Err((k.into(), format!("must be a positive rate below 10^7 (got {v:?})")));
            }
        }
        let times = [
            ("attention_base_s", self.attention_base_s),
            ("attention_per_decode_s", self.attention_per_decode_s),
            ("head_per_sequence_s", self.head_per_sequence_s),
            ("step_overhead_s", self.step_overhead_s),
            ("layer_overhead_s", self.layer_overhead_s),
            ("allreduce_s", self.allreduce_s),
            ("request_overhead_s", self.request_overhead_s),
            ("output_token_s", self.output_token_s),
        ];
        if !((0.0..=10.0).contains(&self.dense_base_share)) {
            return Err((
                "dense_base_share".into(),
                format!("must be a share in [0, 10] (got {:?})", self.dense_base_share),
            ));
        }
        for (k, v) in times {
            if !((0.0..=10.0).contains(&v)) {
                return Err((k.into(), format!("must be a time in [0, 10] s (got {v:?})")));
            }
        }
        Ok(())
    }

    /// The per-GPU coefficients for `model` split `tp` ways, its experts (if any) `ep` ways.
    pub fn for_model(&self, model: &Model, tp: u32, ep: u32) -> Calibrated {
        let tp = tp.max(1) as f64;
        let ep = ep.max(1) as f64;
        let bpe = model.bytes_per_element as f64;
        let kv_bpe = model.kv_bytes() as f64;
        let heads = (model.heads as f64 / tp).max(1.0);
        let kv_heads = (model.kv_heads as f64 / tp).max(1.0);
        let d = model.head_dim as f64;
        let gb = 1e9;
        let tf = 1e12;
        let comm = tp > 1.0;
        let dense_floor_s = model.layer_shared_params() * bpe / tp / (self.dense_gb_s * gb);
        Calibrated {
            layers: model.layers as f64,
            dense_floor_s,
            dense_base_s: self.dense_base_share * dense_floor_s,
            dense_per_token_s: 2.0
                * if model.moe.is_some() { model.layer_shared_params() } else { model.layer_active_params() }
                / tp
                / (self.dense_tflops * tf),
            experts: model.moe.as_ref().map_or(0.0, |m| m.experts as f64 / ep),
            expert_hit: model.moe.as_ref().map_or(0.0, |m| m.experts_per_token as f64 / m.experts.max(1) as f64),
            experts_per_token: model.moe.as_ref().map_or(0.0, |m| m.experts_per_token as f64),
            ep,
            expert_floor_s: model.expert_params() * bpe / tp / (self.dense_gb_s * gb),
            expert_per_pair_s: 2.0 * model.expert_params() / tp / (self.dense_tflops * tf),
            dispatch_base_s: if ep > 1.0 { 2.0 * self.allreduce_s } else { 0.0 },
            dispatch_per_token_s: if ep > 1.0 {
                2.0 * (ep - 1.0) * model.hidden as f64 * bpe / (self.allreduce_gb_s * gb)
            } else {
                0.0
            },
            attention_base_s: self.attention_base_s,
            attention_per_pair_s: 4.0 * heads * d / (self.attention_tflops * tf),
            attention_per_kv_token_s: 2.0 * kv_heads * d * kv_bpe / (self.attention_gb_s * gb),
            attention_mixed_per_kv_token_s: 2.0 * heads * d * kv_bpe / (self.attention_mixed_head_gb_s * gb),
            attention_per_decode_s: self.attention_per_decode_s,
            comm_base_s: if comm { 2.0 * self.allreduce_s } else { 0.0 },
            comm_per_token_s: if comm { 2.0 * model.hidden as f64 * bpe / (self.allreduce_gb_s * gb) } else { 0.0 },
            head_base_s: model.vocab as f64 * model.hidden as f64 * bpe / tp / (self.head_gb_s * gb),
            head_per_sequence_s: self.head_per_sequence_s,
            step_overhead_s: self.step_overhead_s + model.layers as f64 * self.layer_overhead_s,
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
    /// A mixture of experts' experts held by this GPU (0 for a dense model).
    pub experts: f64,
    /// The chance that one token goes to a given expert (k / experts).
    pub expert_hit: f64,
    pub experts_per_token: f64,
    /// Replicas the experts are split across.
    pub ep: f64,
    pub expert_floor_s: f64,
    pub expert_per_pair_s: f64,
    pub dispatch_base_s: f64,
    pub dispatch_per_token_s: f64,
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
        let dense = self.dense_s(t);
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
        let experts = self.experts_time_s(t);
        self.step_overhead_s
            + self.layers * (dense + attention + comm + experts)
            + self.head_base_s
            + sequences * self.head_per_sequence_s
    }
}

impl Calibrated {
    /// One layer's projections and MLP for a step of `t` tokens: `max(floor, base + t · per_token)`.
    pub fn dense_s(&self, t: f64) -> f64 {
        self.dense_floor_s.max(self.dense_base_s + t * self.dense_per_token_s)
    }

    /// One layer's experts and their dispatch for a step of `t` tokens (0 for a dense model).
    pub fn experts_time_s(&self, t: f64) -> f64 {
        self.experts_in_group_s(t, self.ep * t)
    }

    /// One layer's experts and their dispatch on a GPU whose step has `own` tokens, when the
    /// data-parallel group it steps with has `group` tokens in all (lock-step, where each
    /// engine's tokens are known): its experts see `group` tokens, `group / ep` of them each on
    /// average, and it gathers the `group − own` tokens of the others. With `group = ep · own`
    /// this is [`Calibrated::experts_time_s`].
    pub fn experts_in_group_s(&self, own: f64, group: f64) -> f64 {
        if self.experts == 0.0 {
            return 0.0;
        }
        let touched = self.experts * (1.0 - (1.0 - self.expert_hit).powf(group));
        let experts =
            (touched * self.expert_floor_s).max(group / self.ep * self.experts_per_token * self.expert_per_pair_s);
        let others = if self.ep > 1.0 { (group - own).max(0.0) / (self.ep - 1.0) } else { 0.0 };
        experts + self.dispatch_base_s + others * self.dispatch_per_token_s
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

    /// Appends to `ends` the ends of `m` plain decode steps after `end`: the k-th (from 1) of
    /// `batch` decodes over `context_tokens + k × batch` context tokens, each at least a tick,
    /// exactly as pricing each with [`Pricer::step_time_s`] and adding its ticks. One match for
    /// the whole run, so the roofline's loop is the formula alone (a decode run prices up to 64
    /// steps at a time).
    pub fn decode_run_ends(&self, batch: u64, context_tokens: u64, m: u64, end: SimTime, ends: &mut Vec<SimTime>) {
        fn extend(m: u64, mut end: SimTime, ends: &mut Vec<SimTime>, step_s: impl Fn(u64) -> f64) {
            ends.reserve(m as usize);
            for k in 1..=m {
                end += ticks(step_s(k)).max(SimTime::TICK);
                ends.push(end);
            }
        }
        let context = |k: u64| context_tokens + k * batch;
        match self {
            // `StepShape::of` a step without chunks is its decode shape.
            Pricer::Roofline(cost) => {
                extend(m, end, ends, |k| cost.shape_time_s(&StepShape::decode(batch, context(k))))
            }
            Pricer::Calibrated(c) => extend(m, end, ends, |k| c.step_time_s(&Step::mixed(batch, context(k), &[]))),
        }
    }

    /// What a step of `own` tokens costs more (or less) in a lock-step group of `group` tokens
    /// than [`Pricer::step_time_s`] priced it, its experts taken as loaded like itself: the
    /// experts see the group's real tokens. 0 on the roofline and for a dense model.
    pub fn lockstep_delta_s(&self, own: u64, group: u64) -> f64 {
        match self {
            Pricer::Roofline(_) => 0.0,
            Pricer::Calibrated(c) => {
                let (own, group) = (own as f64, group as f64);
                c.layers * (c.experts_in_group_s(own, group) - c.experts_time_s(own))
            }
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
        assert!(Choice::<Calibration>::Name("nope".into()).resolve().unwrap_err().to_string().contains("rtx-pro-6000"));
    }

    #[test]
    fn an_empty_step_is_free_and_every_term_adds_time() {
        let c = profile().for_model(&model("llama-3.1-8b").unwrap(), 1, 1);
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

    /// A toy mixture of experts with round numbers, priced by hand: 2 layers, hidden 1,000, 4
    /// experts of 3 × 1,000 × 500 = 1.5M parameters (3 MB), 2 per token, 1M shared parameters a
    /// layer (2 MB), no vocabulary.
    #[test]
    fn a_mixture_of_experts_reads_the_experts_its_tokens_touch_and_computes_on_the_active_ones() {
        let m = Model {
            name: "toy-moe".into(),
            parameters: 14_000_000,
            layers: 2,
            hidden: 1000,
            heads: 8,
            kv_heads: 2,
            head_dim: 100,
            bytes_per_element: 2,
            vocab: 0,
            active_parameters: None,
            moe: Some(super::super::Moe { experts: 4, experts_per_token: 2, expert_intermediate: 500 }),
            kv_bytes_per_element: None,
        };
        let mut p = Calibration::unfitted("toy", "rtx-pro-6000", "test");
        p.dense_gb_s = 1000.0; // 1e12 B/s
        p.dense_tflops = 10.0; // 1e13 FLOP/s
        p.dense_base_share = 0.5;
        p.attention_tflops = 1000.0;
        p.step_overhead_s = 1e-3;
        p.allreduce_s = 1e-5;
        p.allreduce_gb_s = 1.0;
        let close = |got: f64, want: f64| assert!((got - want).abs() < 1e-12, "got {got}, want {want}");

        // Three decodes, no context. Shared: floor 2 MB / 1e12 = 2 µs against 1 µs + 3 · 0.2 µs:
        // 2 µs. Experts: 4 · (1 − (1 − 2/4)³) = 3.5 touched · 3 µs = 10.5 µs against
        // 3 · 2 pairs · 0.3 µs = 1.8 µs: 10.5 µs. Step: 1 ms + 2 layers · 12.5 µs.
        let one = p.for_model(&m, 1, 1);
        close(one.step_time_s(&Step::decode(3, 0)), 1e-3 + 2.0 * (2e-6 + 10.5e-6));

        // Split over two replicas: each holds 2 experts, which the 6 tokens of both miss with
        // chance (1/2)⁶: 2 · 63/64 = 1.96875 touched · 3 µs = 5.90625 µs; dispatch and combine
        // 2 · (10 µs + 3 tokens · 2,000 B / 1e9 B/s) = 32 µs.
        let split = p.for_model(&m, 1, 2);
        close(split.step_time_s(&Step::decode(3, 0)), 1e-3 + 2.0 * (2e-6 + 5.90625e-6 + 32e-6));

        // A 100-token prefill computes on the active experts only: 100 · 2 · 0.3 µs = 60 µs (all 4
        // experts' weights would be 12 µs to read); shared 1 µs + 100 · 0.2 µs = 21 µs; attention
        // 5,050 pairs · 4 · 8 · 100 / 1e15 = 16.16 ns.
        let prefill = Step::mixed(0, 0, &[Chunk { new_tokens: 100, context_tokens: 0 }]);
        close(one.step_time_s(&prefill), 1e-3 + 2.0 * (21e-6 + 60e-6 + 5050.0 * 3.2e-12));

        // Ten decodes touch 4 · (1 − 2⁻¹⁰) experts: nearly all, never more than the 12 µs of
        // reading all four (their 6 µs of compute stays below).
        close(one.experts_time_s(10.0), 4.0 * (1.0 - 0.5f64.powi(10)) * 3e-6);
        assert!(one.experts_time_s(10.0) < 12e-6);
    }

    /// The expert term, with the dense rates fitted on Llama-3.1-8B, against the MoE block of
    /// Qwen3-30B-A3B measured on the same GPU (fitted on nothing): on the grid points whose
    /// distinct expert count is one a step of that many tokens can have (within 60% of the
    /// expected count, or all 128), the median error is 6.8% (docs/accuracy.md).
    #[test]
    fn the_expert_term_predicts_the_measured_moe_block() {
        let c = profile().for_model(&model("qwen3-30b-a3b").unwrap(), 1, 1);
        let text = include_str!(
            "../../../workloads/profiles/measured/RTXPRO6000_Qwen3-30B-A3B-Instruct-2507_bf16_tp1/moe.csv"
        );
        let mut errors = Vec::new();
        for line in text.lines().skip(1) {
            let v: Vec<f64> = line.split(',').map(|x| x.parse().unwrap()).collect();
            let (tokens, touched, real) = (v[0], v[1], v[2] * 1e-6);
            let expected = 128.0 * (1.0 - (1.0 - 8.0 / 128.0f64).powf(tokens));
            if (touched - expected).abs() / expected < 0.6 || touched == 128.0 {
                let model = (touched * c.expert_floor_s).max(tokens * 8.0 * c.expert_per_pair_s);
                errors.push(((model - real) / real).abs());
            }
        }
        errors.sort_by(f64::total_cmp);
        let median = errors[errors.len() / 2];
        assert!(errors.len() >= 20 && median < 0.08, "{} points, median error {median}", errors.len());
    }

    /// In lock-step a GPU's experts see the group's tokens: a group loaded evenly prices as
    /// before, a busy engine beside an idle one prices its experts on fewer tokens, and an idle
    /// engine's dummy step on more.
    #[test]
    fn a_lockstep_group_prices_the_experts_on_its_real_tokens() {
        let c = profile().for_model(&model("qwen3-30b-a3b").unwrap(), 1, 2);
        let p = Pricer::Calibrated(c);
        for t in [1.0, 7.0, 300.0, 2048.0] {
            assert!((c.experts_in_group_s(t, 2.0 * t) - c.experts_time_s(t)).abs() < 1e-15);
        }
        assert!(p.lockstep_delta_s(2048, 2049) < 0.0);
        assert!(p.lockstep_delta_s(1, 2049) > 0.0);
        let dense = profile().for_model(&model("llama-3.1-8b").unwrap(), 1, 1);
        assert_eq!(Pricer::Calibrated(dense).lockstep_delta_s(10, 500), 0.0);
    }

    #[test]
    fn tensor_parallel_pays_its_all_reduces_and_splits_the_rest() {
        let p = profile();
        let m = model("qwen3-32b").unwrap();
        let (one, two) = (p.for_model(&m, 1, 1), p.for_model(&m, 2, 1));
        assert_eq!(one.comm_base_s, 0.0);
        assert_eq!(two.comm_base_s, 2.0 * p.allreduce_s);
        assert!((two.dense_floor_s * 2.0 - one.dense_floor_s).abs() < 1e-15);
        assert!((two.attention_per_pair_s * 2.0 - one.attention_per_pair_s).abs() < 1e-20);
    }
}
