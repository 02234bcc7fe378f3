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

use std::fmt::Write as _;

use routelab_policy_api::CostModel;
use serde::{Deserialize, Serialize};

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
#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(untagged)]
pub enum Choice<T> {
    Name(String),
    Custom(T),
}

impl Choice<Gpu> {
    pub fn resolve(&self) -> Result<Gpu, String> {
        match self {
            Choice::Name(n) => gpu(n).ok_or_else(|| {
                format!(
                    "unknown GPU '{n}'; catalog: {}; or give a mapping {{name, memory_gb, bandwidth_gb_s, tflops}}",
                    GPU_NAMES.join(", ")
                )
            }),
            Choice::Custom(g) => Ok(g.clone()),
        }
    }
}

impl Choice<Model> {
    pub fn resolve(&self) -> Result<Model, String> {
        match self {
            Choice::Name(n) => model(n).ok_or_else(|| {
                format!(
                    "unknown model '{n}'; catalog: {}; or give a mapping {{name, parameters, layers, hidden, heads, kv_heads, head_dim}}",
                    MODEL_NAMES.join(", ")
                )
            }),
            Choice::Custom(m) => Ok(m.clone()),
        }
    }
}

pub const GPU_NAMES: [&str; 6] = ["a6000", "a100-40", "a100-80", "h100", "h200", "l40s"];
pub const MODEL_NAMES: [&str; 3] = ["mistral-7b", "llama-3-8b", "llama-3-70b"];

/// A catalog GPU by name (datasheet peaks: dense fp16 tensor FLOP/s, HBM/GDDR bandwidth).
pub fn gpu(name: &str) -> Option<Gpu> {
    let (memory_gb, bandwidth_gb_s, tflops) = match name {
        "a6000" => (48.0, 768.0, 154.8),
        "a100-40" => (40.0, 1555.0, 312.0),
        "a100-80" => (80.0, 2039.0, 312.0),
        "h100" => (80.0, 3350.0, 989.5),
        "h200" => (141.0, 4800.0, 989.5),
        "l40s" => (48.0, 864.0, 362.05),
        _ => return None,
    };
    Some(Gpu { name: name.into(), memory_gb, bandwidth_gb_s, tflops })
}

/// A catalog model by name (shapes from the published configs).
pub fn model(name: &str) -> Option<Model> {
    let (parameters, layers, hidden, heads, kv_heads) = match name {
        "mistral-7b" => (7_241_732_096, 32, 4096, 32, 8),
        "llama-3-8b" => (8_030_261_248, 32, 4096, 32, 8),
        "llama-3-70b" => (70_553_706_496, 80, 8192, 64, 8),
        _ => return None,
    };
    Some(Model { name: name.into(), parameters, layers, hidden, heads, kv_heads, head_dim: 128, bytes_per_element: 2 })
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
    pub memory_fraction: f64,
    pub efficiency: Efficiency,
    /// The roofline, shared with routers through [`routelab_policy_api::RouterContext::cost`].
    pub cost: CostModel,
    pub kv_capacity_tokens: u64,
}

impl StepModel {
    /// Builds the model; fails when the weights leave no room for a single KV token.
    pub fn new(
        gpu: Gpu,
        model: Model,
        tp: u32,
        memory_fraction: f64,
        efficiency: Efficiency,
    ) -> Result<Self, DoesNotFit> {
        let tpf = tp.max(1) as f64;
        let weight_bytes = model.parameters as f64 * model.bytes_per_element as f64;
        let kv_bytes_per_token =
            2.0 * model.layers as f64 * model.kv_heads as f64 * model.head_dim as f64 * model.bytes_per_element as f64;
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
        let cost = CostModel {
            flops_per_s: gpu.tflops * 1e12 * efficiency.mfu * tpf,
            bytes_per_s: gpu.bandwidth_gb_s * 1e9 * efficiency.mbu * tpf,
            linear_flops_per_token: 2.0 * model.parameters as f64,
            attention_flops_per_pair: 4.0 * model.layers as f64 * model.heads as f64 * model.head_dim as f64,
            weight_bytes,
            kv_bytes_per_token,
            step_overhead_s: efficiency.step_overhead_s + comm,
        };
        Ok(Self { gpu, model, tp, memory_fraction, efficiency, cost, kv_capacity_tokens })
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
        Self::new(g, m, tp, memory_fraction, Efficiency::default())
    }
}

/// The `routelab step-model` text: KV bytes per token, KV capacity, prefill times for a few
/// lengths, decode step times for a few batch sizes and contexts (memory_fraction 0.9, default
/// efficiency). Fails for unknown names or a model that does not fit.
pub fn describe(gpu_name: &str, model_name: &str, tp: u32) -> Result<String, DoesNotFit> {
    if ![1, 2, 4, 8].contains(&tp) {
        return Err(DoesNotFit {
            message: format!("tp must be 1, 2, 4 or 8 (got {tp})"),
            fix: "pass --tp 1, 2, 4 or 8".into(),
        });
    }
    let sm = StepModel::from_catalog(gpu_name, model_name, tp, 0.9)?;
    Ok(describe_model(&sm))
}

/// [`describe`] for an already resolved model.
pub fn describe_model(sm: &StepModel) -> String {
    let (g, m, e, c) = (&sm.gpu, &sm.model, &sm.efficiency, &sm.cost);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "step model: {} on {} × {} (tp {}), memory_fraction {}",
        m.name, sm.tp, g.name, sm.tp, sm.memory_fraction
    );
    let _ = writeln!(
        s,
        "  compute   {:.1} TFLOP/s effective = {} TFLOP/s peak × mfu {} × tp {}",
        c.flops_per_s / 1e12,
        g.tflops,
        e.mfu,
        sm.tp
    );
    let _ = writeln!(
        s,
        "  bandwidth {:.1} GB/s effective = {} GB/s peak × mbu {} × tp {}",
        c.bytes_per_s / 1e9,
        g.bandwidth_gb_s,
        e.mbu,
        sm.tp
    );
    let _ = writeln!(
        s,
        "  step overhead {:.3} ms{}",
        c.step_overhead_s * 1e3,
        if sm.tp > 1 { " (includes 2 all-reduces per layer)" } else { "" }
    );
    let _ = writeln!(
        s,
        "  weights {:.2} GB ({} parameters × {} bytes)",
        c.weight_bytes / 1e9,
        m.parameters,
        m.bytes_per_element
    );
    let _ = writeln!(
        s,
        "  KV per token {} bytes = 2 × {} layers × {} kv heads × {} head dim × {} bytes",
        c.kv_bytes_per_token, m.layers, m.kv_heads, m.head_dim, m.bytes_per_element
    );
    let _ = writeln!(
        s,
        "  KV capacity {} tokens = floor(({} GB × {} × {} − {:.2} GB) / {} bytes)",
        sm.kv_capacity_tokens,
        g.memory_gb,
        sm.tp,
        sm.memory_fraction,
        c.weight_bytes / 1e9,
        c.kv_bytes_per_token
    );
    let _ = writeln!(s, "\nprefill, alone in one step (no cached context)");
    let _ = writeln!(s, "  {:>8}  {:>10}  {:>12}", "tokens", "time [s]", "tokens/s");
    for n in [512u64, 2_100, 8_000, 21_000] {
        let t = c.prefill_time_s(n, 0);
        let _ = writeln!(s, "  {:>8}  {:>10.4}  {:>12.0}", n, t, n as f64 / t);
    }
    let _ = writeln!(s, "\ndecode step (one token per running request)");
    let _ = writeln!(s, "  {:>6}  {:>9}  {:>10}  {:>16}", "batch", "context", "step [ms]", "per request [ms]");
    for (batch, ctx) in [(1u64, 100u64), (1, 2_000), (8, 2_000), (32, 2_000), (64, 2_000), (32, 8_000)] {
        let t = c.decode_step_time_s(batch, batch * ctx);
        let _ = writeln!(s, "  {:>6}  {:>9}  {:>10.2}  {:>16.2}", batch, ctx, t * 1e3, t * 1e3 / batch as f64);
    }
    s
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

    #[test]
    fn describe_prints_the_anchors() {
        let d = describe("a6000", "mistral-7b", 1).unwrap();
        assert!(d.contains("219089 tokens"), "{d}");
        assert!(d.contains("131072"), "{d}");
        assert!(d.contains("21000"), "{d}");
    }
}
