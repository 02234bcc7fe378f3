//! vLLM's engine rules in routelab's terms: the one place that says what "the engine as vLLM
//! runs it" sets, shared by `routelab accuracy`'s replay (`accuracy/replay.rs`, with the
//! measured run's knobs) and by every cluster workload that selects a `calibration` (with vLLM's
//! default knobs for its GPU), where any of these fields the workload writes out wins.
//!
//! The rules, from vLLM 0.19's v1 scheduler (`vllm/v1/core/sched/scheduler.py`,
//! `Scheduler.schedule`): a step's tokens are bounded by `max_num_batched_tokens`, each running
//! decode taking one and prefill chunks the rest (`chunk_tokens: max_num_batched_tokens`,
//! `budget_counts_decode: true`); at most `max_num_seqs` running requests
//! (`max_batch_requests`); waiting requests admitted in arrival order (`scheduler: fcfs`) with KV
//! for the prompt and one output token (`reservation: {estimate: {output_tokens: 1}}`), the
//! newest running request preempted by recomputation when blocks run out (`preemption: newest`,
//! the default); KV memory from `gpu_memory_utilization` 0.9 (`memory_fraction`).
//!
//! vLLM's default knobs when the command line gives none (`vllm/engine/arg_utils.py`,
//! `EngineArgs.get_batch_defaults`, the `OPENAI_API_SERVER` usage context a routed server runs
//! in): `max_num_batched_tokens` 8192 and `max_num_seqs` 1024 on a GPU of at least 70 GiB that
//! is not an A100, else 2048 and 256.

use super::{ClusterSpec, Reservation};
use crate::step_model::Gpu;

/// The `cluster:` fields vLLM's rules set; a workload that writes one out keeps its value.
pub const FIELDS: [&str; 6] =
    ["memory_fraction", "chunk_tokens", "budget_counts_decode", "max_batch_requests", "reservation", "scheduler"];

/// vLLM's default `gpu_memory_utilization`.
pub const GPU_MEMORY_UTILIZATION: f64 = 0.9;

/// The engine knobs the rules take: vLLM's names.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct VllmEngine {
    pub max_num_batched_tokens: u32,
    pub max_num_seqs: u32,
}

impl VllmEngine {
    /// vLLM's defaults on a GPU of at least 70 GiB that is not an A100 (H100, RTX PRO 6000).
    pub const LARGE_GPU: Self = Self { max_num_batched_tokens: 8192, max_num_seqs: 1024 };
    /// vLLM's defaults on any other GPU.
    pub const SMALL_GPU: Self = Self { max_num_batched_tokens: 2048, max_num_seqs: 256 };

    /// vLLM's defaults for a server on `gpu` (module docs).
    pub fn defaults_for(gpu: &Gpu) -> Self {
        let large = gpu.memory_gb * 1e9 >= 70.0 * (1u64 << 30) as f64 && !gpu.name.to_lowercase().contains("a100");
        if large { Self::LARGE_GPU } else { Self::SMALL_GPU }
    }

    /// Sets each of [`FIELDS`] of `spec` for which `given` is false to vLLM's rule.
    pub fn apply(&self, spec: &mut ClusterSpec, given: impl Fn(&str) -> bool) {
        for field in FIELDS {
            if given(field) {
                continue;
            }
            match field {
                "memory_fraction" => spec.memory_fraction = GPU_MEMORY_UTILIZATION,
                "chunk_tokens" => spec.chunk_tokens = self.max_num_batched_tokens,
                "budget_counts_decode" => spec.budget_counts_decode = true,
                "max_batch_requests" => spec.max_batch_requests = self.max_num_seqs,
                "reservation" => spec.reservation = Reservation::Estimate { output_tokens: 1 },
                "scheduler" => spec.scheduler = "fcfs".into(),
                _ => unreachable!("every rule field is set above"),
            }
        }
    }
}

impl ClusterSpec {
    /// With a `calibration`, runs the engine by vLLM's rules with vLLM's default knobs for
    /// `gpu`, except the fields `given` says the workload wrote out; without one, nothing
    /// changes (the lecture's engine). An unknown GPU is left for validation to report.
    pub fn engine_defaults(&mut self, given: impl Fn(&str) -> bool) {
        if self.calibration.is_none() {
            return;
        }
        let Ok(gpu) = self.gpu.resolve() else { return };
        VllmEngine::defaults_for(&gpu).apply(self, given);
    }
}

#[cfg(test)]
#[path = "vllm_tests.rs"]
mod tests;
