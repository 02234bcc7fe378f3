//! The `cluster:` section: N LLM replicas (a GPU or a tensor-parallel group each, one model) with
//! prefix caches and a local scheduler, and the generator of their request stream.
//!
//! ```yaml
//! cluster:
//!   replicas: 4
//!   gpu: a6000                 # catalog name, or {name, memory_gb, bandwidth_gb_s, tflops}
//!   model: mistral-7b          # catalog name, or {name, parameters, layers, hidden, heads, kv_heads, head_dim}
//!   tp: 1                      # tensor-parallel degree: 1, 2, 4 or 8
//!   memory_fraction: 0.9
//!   efficiency: {mfu: 0.7235, mbu: 0.8, step_overhead_s: 0.0004, allreduce_latency_s: 1.0e-5}
//!   chunk_tokens: 512          # prefill tokens per step; 0 = unchunked (bounded by max_step_tokens)
//!   max_step_tokens: 32768     # most prefill tokens in one unchunked step
//!   max_batch_requests: 256    # most running requests per replica
//!   calibration: rtx-pro-6000  # optional: a measured profile; the engine fields above and
//!                              # below then default to vLLM's rules (vllm.rs)
//!   reservation: full          # or {estimate: {output_tokens: 64}} (preempts by recompute)
//!   preemption: newest         # or priority: lowest class priority first, and for a waiting higher one
//!   scheduler: fcfs            # a scheduler policy: name or "name{key: value}"
//!   scheduler_window: 512      # waiting requests shown to the scheduler per step (oldest first)
//!   eviction_delay_s: 0        # delay before routers that want evictions hear of them
//!   drain_s: 600               # simulated time allowed after the last arrival
//!   metrics: {scrape_interval_s: 0.05}   # engine metrics scraped for routers; 0 = always fresh
//!   kv_tiers: {cpu: {capacity_gb: 128, bandwidth_gbps: 400}}   # optional (kv_tiers.rs)
//!   autoscaling: {scaler: hpa, interval_s: 15, model_load_s: 60, max_replicas: 8}   # optional (autoscaling.rs)
//!   cost_per_hour: 2.5         # optional: one replica's price per hour, adds `cost`
//!   pools: [{gpu: h100, replicas: 2, cost_per_hour: 4}, {gpu: a100-80, replicas: 2}]   # optional (pools.rs)
//!   models: [{name: chat, replicas: 3, share: 0.8}, {name: coder, replicas: 1, share: 0.2}]   # optional (models.rs)
//!   failures: {crashes: [{replica: 1, at_s: 30}], restart_s: 60, max_retries: 1}   # optional (failures.rs)
//!   generator: {system_prompt_tokens: 13, contexts: {...}, suffix_tokens: ..., output_tokens: ...}
//!   arrivals: {poisson: {rate: 1.0}}   # or {gamma: {rate, cv}}, {trace: {path, time_scale, format}},
//!                              # or {stages: [{rate: 3, duration_s: 20}, …]} (stages.rs)
//!   requests: 2000             # and/or duration_s
//!   slo: {ttft_s: 2, tpot_s: 0.1}   # optional: adds slo_attainment and goodput_rps (workload/slo.rs)
//! ```
//!
//! Token counts are distributions: a number (constant), `{uniform: {min, max}}` or
//! `{lognormal: {mean, cv, max}}` (resampled above `max`, so every distribution is bounded and the
//! longest prompt is known before the run).

mod arrivals;
pub mod autoscaling;
pub mod classes;
pub mod disaggregation;
pub mod failures;
mod generator;
pub mod kv_tiers;
pub mod lora;
pub mod models;
pub mod pools;
pub mod session;
pub mod stages;
pub mod step_models;
mod validate;
pub mod vllm;

pub use generator::{Contexts, Generator, Popularity, TokenShape, Tokens};

use serde::{Deserialize, Serialize};

pub use self::arrivals::{Arrivals, TraceFormat};
pub use self::step_models::{PdStepModels, StepModels};

use super::FieldError;
use super::limits::{self, MAX_HORIZON, at_most, fits_clock};
use crate::step_model::{Calibration, Choice, Efficiency, Gpu, Model, StepModel};

#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClusterSpec {
    /// Number of replicas, each one GPU or one tensor-parallel group running the model.
    pub replicas: u32,
    /// A catalog GPU (a6000, a100-40, a100-80, h100, h200, b200, l40s, rtx-pro-6000, rtx4090) or a mapping {name, memory_gb, bandwidth_gb_s, tflops}.
    #[serde(default = "default_gpu")]
    pub gpu: Choice<Gpu>,
    /// A catalog model (mistral-7b, llama-3-8b, llama-3-70b) or a mapping {name, parameters, layers, hidden, heads, kv_heads, head_dim}.
    #[serde(default = "default_model")]
    pub model: Choice<Model>,
    /// Tensor-parallel degree of a replica: 1, 2, 4 or 8.
    #[serde(default = "one")]
    pub tp: u32,
    /// Replicas a mixture of experts' experts are split across (vLLM's data-parallel engines with
    /// `enable_expert_parallel`): each holds 1/N of them and its expert layers see the tokens of
    /// N replicas; 1 (the default) = every replica holds every expert.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub expert_parallel: u32,
    /// Data-parallel engines of a mixture of experts: groups of N consecutive replicas step in
    /// lock-step (vLLM's `DPEngineCoreProc`: a step lasts as long as the slowest engine's, an
    /// engine without work runs a dummy step). Default: `expert_parallel`. Dense models' engines
    /// are independent in vLLM: only 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_parallel: Option<u32>,
    /// The KV cache's element type: `auto` (the weights'), `fp8` (1 byte) or `bf16`/`fp16` (2 bytes).
    #[serde(default)]
    pub kv_cache_dtype: KvCacheDtype,
    /// Share of GPU memory for weights and KV cache, in (0, 1]; the model must fit.
    #[serde(default = "default_memory_fraction")]
    pub memory_fraction: f64,
    /// How close the step model gets to the roofline (MFU, MBU, per-step and all-reduce overheads).
    #[serde(default)]
    pub efficiency: Efficiency,
    /// Price steps by a profile measured on this GPU instead of the roofline: a shipped profile
    /// (`rtx-pro-6000`, `rtx4090`, `h100-splitwise`, `a100-80-splitwise`) or the mapping
    /// `routelab calibrate` prints (docs/accuracy.md).
    /// A calibrated cluster runs the engine by vLLM's rules, as `routelab accuracy` replays it:
    /// `chunk_tokens`, `budget_counts_decode`, `max_batch_requests`, `reservation`,
    /// `memory_fraction` and `scheduler` default to vLLM's (`workload/cluster/vllm.rs`) unless
    /// the workload writes them out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration: Option<Choice<Calibration>>,
    /// Prefill tokens per step (chunked prefill); 0 = unchunked. With a `calibration` the
    /// default is vLLM's `max_num_batched_tokens`: 8192 on a GPU of at least 70 GiB other than
    /// an A100, else 2048.
    #[serde(default = "default_chunk")]
    pub chunk_tokens: u32,
    /// Whether each decoding request's token counts against `chunk_tokens`, as in vLLM, whose
    /// `max_num_batched_tokens` bounds a step's tokens (decodes first, prefill chunks in the
    /// rest); false: `chunk_tokens` bounds prefill tokens alone, as SGLang's chunked prefill size.
    /// With a `calibration` the default is true.
    #[serde(default)]
    pub budget_counts_decode: bool,
    /// Prefill tokens one unchunked step may hold (vLLM's max_num_batched_tokens): with
    /// `chunk_tokens: 0` every prompt must fit in one step.
    #[serde(default = "default_max_step_tokens")]
    pub max_step_tokens: u32,
    /// Most running requests per replica. With a `calibration` the default is vLLM's
    /// `max_num_seqs`: 1024 on a GPU of at least 70 GiB other than an A100, else 256.
    #[serde(default = "default_max_batch")]
    pub max_batch_requests: u32,
    /// KV memory a request must find free to be admitted: `full` or `{estimate: {output_tokens}}`.
    /// With a `calibration` the default is vLLM's `{estimate: {output_tokens: 1}}`.
    #[serde(default, with = "serde_norway::with::singleton_map")]
    #[schemars(with = "Reservation")]
    pub reservation: Reservation,
    /// Which running request a replica preempts (by recomputation): `newest` (the most recently
    /// admitted, when memory runs out) or `priority` (the lowest class priority, latest arrival
    /// first, also to make room for a waiting request of higher priority): `sim/cluster/replica/priority.rs`.
    #[serde(default, skip_serializing_if = "Preemption::is_newest")]
    pub preemption: Preemption,
    /// The local scheduler of every replica: a policy name, optionally with config in braces.
    #[serde(default = "default_scheduler")]
    pub scheduler: String,
    /// Waiting requests shown to the scheduler per step (the oldest first).
    #[serde(default = "default_window")]
    pub scheduler_window: u32,
    /// Delay (s) before routers that want eviction events hear of them.
    #[serde(default)]
    pub eviction_delay_s: f64,
    /// Simulated time (s) allowed after the last arrival; requests unfinished then count as `unfinished`.
    #[serde(default = "default_drain")]
    pub drain_s: f64,
    /// Engine metrics as routers see them: scraped periodically (`scraped.` signals).
    #[serde(default)]
    pub metrics: EngineMetrics,
    /// Prefill/decode disaggregation: prefill and decode pools and the KV link; absent = aggregated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disaggregation: Option<disaggregation::Disaggregation>,
    /// KV tiers below each replica's GPU memory (aggregated clusters): a CPU tier per replica
    /// and optionally a remote tier they share; absent = GPU memory alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_tiers: Option<kv_tiers::KvTiers>,
    /// A scaler deciding the replica count at an interval (`replicas` is the starting count; on
    /// a disaggregated cluster, each pool's with its own bounds in `pools`): `{scaler,
    /// interval_s, model_load_s, min_replicas, max_replicas, pools}` (autoscaling.rs); absent =
    /// a fixed fleet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<autoscaling::Autoscaling>,
    /// One replica's price per hour (any currency, ≥ 0); with it the run reports `cost`
    /// (replica-seconds × price / 3600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_per_hour: Option<f64>,
    /// Replica crashes, scheduled and/or random, the restart delay and the retry rule, slow
    /// replicas and lost KV events (failures.rs; crashes on P/D too, mixed instances included,
    /// in autoscaled fleets, and in lock-step groups, which fail whole); absent = replicas never
    /// fail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failures: Option<failures::Failures>,
    /// Mixed GPUs: pools of replicas, each on its own GPU type and TP degree with its own price
    /// (`{gpu, tp, replicas, cost_per_hour}` each; pools.rs); `replicas` must be their sum.
    /// Absent = every replica on `gpu`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<pools::GpuPool>,
    /// What the requests look like: shared prompt, contexts, suffix, output, fan-out, turns.
    pub generator: Generator,
    /// How requests arrive: `{poisson: {rate}}`, `{gamma: {rate, cv}}`, `{diurnal: {rate, amplitude, period_s}}`,
    /// `{trace: {path, time_scale, format}}` or `{stages: [{rate, duration_s}, …]}` (Poisson at a rate that
    /// steps over the run).
    #[serde(with = "serde_norway::with::singleton_map")]
    #[schemars(with = "Arrivals")]
    pub arrivals: Arrivals,
    /// Requests to generate (counting turns and fan-out); with `duration_s`, whichever ends first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests: Option<u64>,
    /// Seconds of arrivals to generate; with `requests`, whichever ends first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_s: Option<f64>,
    /// Per-request service-level objective: `{ttft_s, tpot_s, latency_s}`, any subset, seconds.
    /// Adds `slo_attainment` and `goodput_rps` to the metrics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slo: Option<super::slo::Slo>,
    /// Request classes mixed by share, each with a priority, an SLO and optionally its own
    /// sizes (`workload/classes.rs`); absent = one class.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub classes: Vec<self::classes::ClassSpec>,
    /// Tenants sharing the fleet by weight; absent = one tenant.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tenants: Vec<self::classes::TenantSpec>,
    /// What each request tells the router about itself: `{output_tokens: oracle}` or
    /// `{output_tokens: {noisy: {cv}}}` (the request fact `hint.output_tokens`); absent = none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hints: Option<session::Hints>,
    /// LoRA adapters: how many, their popularity, and every replica's adapter slots
    /// (`workload/cluster/lora.rs`); absent = every request on the base model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora: Option<lora::Lora>,
    /// Several models, each on its own replicas with its share of the traffic (`{name,
    /// replicas, share}` each, optionally its own `gpu`, `tp`, `model` and `cost_per_hour`;
    /// `workload/cluster/models.rs`); `replicas` must be their sum. Absent = one model.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<models::ModelSpec>,
    /// The admission policy in front of the router: a policy name, optionally with config in
    /// braces (`admit_all`, the default, admits every request on arrival).
    #[serde(default = "default_admission", skip_serializing_if = "is_default_admission")]
    pub admission: String,
    /// How a run summarises its requests: `auto` (exact up to 1,000,000 requests, sketched
    /// above), `exact` (every request's record kept: memory grows with requests) or `sketch`
    /// (percentiles from HDR histograms within 0.1%: the summary's memory does not grow with
    /// requests). docs/performance.md, "Scale".
    #[serde(default, skip_serializing_if = "Summary::is_auto")]
    pub summary: Summary,
}

/// How a cluster run summarises its requests' distributions (`cluster.summary`).
#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum Summary {
    /// Exact up to [`EXACT_UP_TO`] requests, sketched above.
    #[default]
    Auto,
    /// Every request's record kept: exact nearest-rank percentiles.
    Exact,
    /// HDR histograms (`crate::sketch`): percentiles within 1/1024 + 1 ns, bounded memory.
    Sketch,
}

/// The most requests `summary: auto` keeps exact records of (every shipped workload is below).
pub const EXACT_UP_TO: usize = 1_000_000;

impl ClusterSpec {
    /// Replica slots the simulator keeps: `autoscaling.max_replicas`, else `replicas`. Routers
    /// and schedulers are made for this many.
    pub fn slots(&self) -> u32 {
        self.autoscaling.as_ref().map_or(self.replicas, |a| a.slots())
    }
}

impl Summary {
    fn is_auto(&self) -> bool {
        *self == Summary::Auto
    }

    /// Whether a run of `requests` requests keeps every record.
    pub fn exact(self, requests: usize) -> bool {
        match self {
            Summary::Auto => requests <= EXACT_UP_TO,
            Summary::Exact => true,
            Summary::Sketch => false,
        }
    }
}

fn default_admission() -> String {
    "admit_all".into()
}
fn is_default_admission(s: &String) -> bool {
    s == "admit_all"
}

/// The KV cache's element type (vLLM's `kv_cache_dtype`).
#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum KvCacheDtype {
    /// The weights' type.
    #[default]
    Auto,
    /// One byte per element (FP8 KV beside bf16 weights).
    Fp8,
    Bf16,
    Fp16,
}

fn default_gpu() -> Choice<Gpu> {
    Choice::Name("a6000".into())
}
fn default_model() -> Choice<Model> {
    Choice::Name("mistral-7b".into())
}
fn one() -> u32 {
    1
}
fn is_one(n: &u32) -> bool {
    *n == 1
}
fn default_memory_fraction() -> f64 {
    0.9
}
fn default_chunk() -> u32 {
    512
}
fn default_max_step_tokens() -> u32 {
    32_768
}
fn default_max_batch() -> u32 {
    256
}
fn default_scheduler() -> String {
    "fcfs".into()
}
fn default_window() -> u32 {
    512
}
fn default_drain() -> f64 {
    600.0
}

/// How often the replicas' engine metrics (waiting, running, KV utilisation) are scraped for the
/// routers that read them as `scraped.` signals; counters a router keeps itself are always exact.
#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EngineMetrics {
    /// Seconds between scrapes (production gateways: tens of ms); 0 = always fresh.
    #[serde(default = "default_scrape_interval")]
    pub scrape_interval_s: f64,
}

impl Default for EngineMetrics {
    fn default() -> Self {
        Self { scrape_interval_s: default_scrape_interval() }
    }
}

fn default_scrape_interval() -> f64 {
    0.05
}

/// How much KV memory a request must find free to be admitted.
#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq, Default)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Reservation {
    /// Uncached prompt plus the request's whole output (the simulator knows it; a real server
    /// reserves max_tokens, at least as much). Memory never runs out mid-decode: no preemption.
    #[default]
    Full,
    /// Uncached prompt plus `output_tokens` of headroom; decoding grows past it, and when memory
    /// runs out the most recently admitted request is preempted and later recomputed (vLLM).
    Estimate {
        /// Output tokens reserved at admission, beyond the uncached prompt.
        output_tokens: u32,
    },
}

/// Which running request a replica preempts, and when (`cluster.preemption`).
#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum Preemption {
    /// When memory runs out mid-decode (`estimate` reservation), the most recently admitted
    /// request (vLLM's FCFS policy).
    #[default]
    Newest,
    /// vLLM's priority policy: when memory runs out, the running request of the lowest class
    /// priority, latest arrival first; and before a step, running requests of lower priority
    /// than the most important waiting one, until it fits (any reservation).
    Priority,
}

impl Preemption {
    fn is_newest(&self) -> bool {
        *self == Preemption::Newest
    }
}

impl ClusterSpec {
    /// The resolved step model of one replica.
    pub fn step_model(&self) -> Result<StepModel, FieldError> {
        let gpu = self
            .gpu
            .resolve()
            .map_err(|e| FieldError::new("gpu", e.to_string(), "name a catalog GPU or give a full mapping"))?;
        // A custom GPU's rates and memory: the roofline's max() would silently drop a NaN or
        // negative term (a NaN bandwidth priced every step as compute-bound).
        for (field, value) in
            [("memory_gb", gpu.memory_gb), ("bandwidth_gb_s", gpu.bandwidth_gb_s), ("tflops", gpu.tflops)]
        {
            if !(value > 0.0 && value.is_finite()) {
                return Err(FieldError::new(
                    &format!("gpu.{field}"),
                    format!("must be a positive, finite number (got {value})"),
                    "give the GPU's real figures (an A6000: memory_gb 48, bandwidth_gb_s 768, tflops 154.8)",
                ));
            }
        }
        let mut model = self
            .model
            .resolve()
            .map_err(|e| FieldError::new("model", e.to_string(), "name a catalog model or give a full mapping"))?;
        match self.kv_cache_dtype {
            KvCacheDtype::Auto => {}
            KvCacheDtype::Fp8 => model.kv_bytes_per_element = Some(1),
            KvCacheDtype::Bf16 | KvCacheDtype::Fp16 => model.kv_bytes_per_element = Some(2),
        }
        model.check_moe().map_err(|(field, m)| {
            let fix = "give `moe: {experts, experts_per_token, expert_intermediate}` from the model's config.json, \
                       without active_parameters";
            FieldError::new(&format!("model.{field}"), m, fix)
        })?;
        if self.expert_parallel != 1
            && (model.moe.is_none() || self.expert_parallel == 0 || self.expert_parallel > self.replicas)
        {
            return Err(FieldError::new(
                "expert_parallel",
                format!(
                    "must be 1, or split a mixture of experts across at most `replicas` ({}) (got {} for {})",
                    self.replicas, self.expert_parallel, model.name
                ),
                "leave it out for a dense model; for a MoE at most the replica count",
            ));
        }
        let dp = self.lockstep_group();
        if dp != 1
            && (model.moe.is_none() || dp == 0 || self.replicas % dp != 0 || ![1, dp].contains(&self.expert_parallel))
        {
            return Err(FieldError::new(
                "data_parallel",
                format!(
                    "must be 1, or group a mixture of experts' {} replicas by a divisor, equal to expert_parallel ({}) when that is set (got {dp} for {})",
                    self.replicas, self.expert_parallel, model.name
                ),
                "leave it out for a dense model (vLLM runs dense data-parallel engines independently: count them as replicas)",
            ));
        }
        let sm =
            StepModel::new(gpu, model, self.tp, self.expert_parallel, self.memory_fraction, self.efficiency.clone())
                .map_err(|e| FieldError::new("model", e.message, e.fix))?;
        let Some(choice) = &self.calibration else { return Ok(sm) };
        let fix = format!(
            "name a shipped profile ({}) or paste the mapping `routelab calibrate` prints",
            crate::step_model::calibrated::shipped_names()
        );
        let c = choice.resolve().map_err(|e| FieldError::new("calibration", e.to_string(), &fix))?;
        c.check().map_err(|(field, m)| FieldError::new(&format!("calibration.{field}"), m, &fix))?;
        if c.gpu != sm.gpu.name {
            return Err(FieldError::new(
                "calibration",
                format!("the profile '{}' was measured on {}, but the cluster's GPU is {}", c.name, c.gpu, sm.gpu.name),
                format!("set `gpu: {}`, or calibrate on {} (routelab calibrate)", c.gpu, sm.gpu.name),
            ));
        }
        Ok(sm.calibrated(c))
    }

    /// Replicas that step together (`data_parallel`, by default `expert_parallel`); 1 = each alone.
    pub fn lockstep_group(&self) -> u32 {
        self.data_parallel.unwrap_or(self.expert_parallel)
    }

    /// The longest prompt the generator can produce (trace arrivals: checked per row at run time).
    pub fn max_prompt_tokens(&self) -> u64 {
        let g = &self.generator;
        let ctx = g.contexts.as_ref().map_or(0, |c| c.tokens.max()) as u64;
        let turns = g.turns.max().max(1) as u64;
        if let Some(s) = &g.session {
            return g.system_prompt_tokens as u64
                + ctx
                + self.max_suffix_tokens() as u64
                + s.max_growth_tokens(self.max_output_tokens());
        }
        g.system_prompt_tokens as u64
            + ctx
            + turns * self.max_suffix_tokens() as u64
            + (turns - 1) * self.max_output_tokens() as u64
    }

    /// The largest unique prompt part any class draws.
    fn max_suffix_tokens(&self) -> u32 {
        let own = self.classes.iter().filter_map(|c| c.suffix_tokens.as_ref()).map(Tokens::max).max();
        let generator = self.generator.suffix_tokens.max();
        if self.classes.iter().all(|c| c.suffix_tokens.is_some()) && !self.classes.is_empty() {
            own.unwrap_or(generator)
        } else {
            own.unwrap_or(0).max(generator)
        }
    }

    /// The largest output any class draws.
    pub fn max_output_tokens(&self) -> u32 {
        let own = self.classes.iter().filter_map(|c| c.output_tokens.as_ref()).map(Tokens::max).max();
        let generator = self.generator.output_tokens.max();
        if self.classes.iter().all(|c| c.output_tokens.is_some()) && !self.classes.is_empty() {
            own.unwrap_or(generator)
        } else {
            own.unwrap_or(0).max(generator)
        }
    }
}

impl ClusterSpec {
    /// Whether a run's end reads every request's state, so a sketched run keeps it instead of
    /// retiring finished requests: KV tiers (their figures), a billed fleet (the bill reads every
    /// completion), crashes (a lost request is routed again), LoRA adapters (per request), several models
    /// (their figures read every record at the end).
    pub fn keeps_request_state(&self) -> bool {
        self.kv_tiers.is_some()
            || self.autoscaling.is_some()
            || self.mean_cost_per_hour().is_some()
            || self.failures.is_some()
            || self.lora.is_some()
            || self.models.len() > 1
    }

    /// Requests a synthetic stream will hold, about (`requests`, or rate × `duration_s`, summed
    /// over the cluster's process and the classes' own); trace replays count rows when the trace
    /// is read, so here only `requests` (or 0).
    pub fn expected_requests(&self) -> f64 {
        let by_time: f64 = self
            .processes()
            .map(|a| match (a, a.rate(), self.duration_s) {
                (Arrivals::Stages(s), _, d) => stages::expected_requests(s, d),
                (_, Some(rate), Some(d)) => rate * d,
                _ => f64::INFINITY,
            })
            .sum();
        let n = self.requests.map_or(f64::INFINITY, |n| n as f64).min(by_time);
        if n.is_finite() { n } else { 0.0 }
    }

    /// The arrival processes: the cluster's, then each class's own (`classes[].arrivals`).
    pub fn processes(&self) -> impl Iterator<Item = &Arrivals> {
        std::iter::once(&self.arrivals).chain(self.classes.iter().filter_map(|c| c.arrivals.as_ref()))
    }

    /// Requests per second of every process together, when each has one rate (no trace, no
    /// stages): the cluster's plus the classes' own.
    pub fn total_rate(&self) -> Option<f64> {
        self.processes().map(Arrivals::rate).sum()
    }
}
