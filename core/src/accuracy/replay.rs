//! Replaying a measured run in the cluster world and comparing every figure.
//!
//! The engine as vLLM 0.19's v1 scheduler runs it, by the rules of
//! `workload/cluster/vllm.rs` (the same a calibrated cluster workload runs by) with the run's
//! `max_num_batched_tokens` and `max_num_seqs`: decode-first steps under a token budget,
//! chunked prefill, FCFS admission with KV for the prompt and one output token, preemption by
//! recomputation, prefix caching at 16-token blocks (full blocks only), the replica's KV
//! capacity from `gpu_memory_utilization` 0.9 (vLLM's default). With `data_parallel_size` > 1,
//! one replica per engine behind `vllm_dp_lb` (vLLM's own DP load balancer: the lowest
//! `4 · waiting + running` from counts its coordinator publishes every 100 ms, here the scrape
//! interval); with `enable_expert_parallel` on a
//! mixture of experts, the experts split across those replicas (`expert_parallel: dp`), and a
//! mixture of experts' engines step in lock-step (`data_parallel: dp`; `sim/cluster/lockstep.rs`).
//! The engine schedules one step ahead (vLLM's async scheduling, `sim/cluster/replica/async_sched.rs`)
//! when the profile declares it, unless the run's `engine_kwargs.async_scheduling` says how it
//! scheduled; the roofline replays a synchronous engine.

use std::path::Path;

use routelab_policy_api::PolicyKind;

use super::{Bundle, Compared, figures};
use crate::error::Error;
use crate::plugin::{Loader, PolicySpec};
use crate::sim;
use crate::step_model::catalog::{gpu_for_device, model_for_name};
use crate::step_model::{Calibration, Choice};
use crate::workload::cluster::ClusterSpec;
use crate::workload::cluster::vllm::VllmEngine;
use crate::workload::generate::block_stream;
use crate::workload::{FieldError, InputError};

use super::bundle::STREAM_BLOCK_TOKENS;

/// How often vLLM's DP coordinator publishes the engines' counts while they change
/// (`vllm/v1/engine/coordinator.py` @ 0090ad12: `min_stats_update_interval_ms = 100`), the
/// replay's scrape interval: `vllm_dp_lb` routes on counts this old at most.
pub const VLLM_DP_STATS_INTERVAL_S: f64 = 0.1;

/// How to replay: the catalog names (from the bundle unless given) and the step model.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Replay {
    pub gpu: Option<String>,
    pub model: Option<String>,
    pub tp: Option<u32>,
    /// `None`: the roofline; else a calibration.
    pub calibration: Option<Calibration>,
    /// The router in front of several engines (a policy spec); `None`: `vllm_dp_lb`.
    pub router: Option<String>,
}

/// One run replayed: per figure, measured vs simulated.
#[derive(Clone, Debug, PartialEq)]
pub struct RunAccuracy {
    pub run: String,
    pub gpu: String,
    pub model: String,
    pub tp: u32,
    pub figures: Vec<(&'static str, Compared)>,
}

impl RunAccuracy {
    pub fn get(&self, key: &str) -> Option<Compared> {
        self.figures.iter().find(|(k, _)| *k == key).map(|(_, c)| *c)
    }
}

/// The cluster `bundle` ran on, as routelab's engine (see the module docs).
pub fn engine_spec(bundle: &Bundle, how: &Replay) -> Result<ClusterSpec, InputError> {
    let meta_file = bundle.dir.join("meta.json");
    let bad = |field: &str, message: String, fix: String| InputError::new(&meta_file, message, fix).in_field(field);
    let gpu = match (&how.gpu, &bundle.meta.device) {
        (Some(g), _) => g.clone(),
        (None, Some(d)) => gpu_for_device(d)
            .ok_or_else(|| {
                bad(
                    "device",
                    format!("unknown device '{d}'"),
                    "pass --gpu with a catalog GPU (routelab step-model --help)".into(),
                )
            })?
            .to_string(),
        (None, None) => {
            return Err(bad(
                "device",
                "the run does not name its device".into(),
                "pass --gpu with a catalog GPU, or add \"device\" to meta.json".into(),
            ));
        }
    };
    let model = match &how.model {
        Some(m) => m.clone(),
        None => model_for_name(&bundle.meta.model)
            .ok_or_else(|| {
                bad(
                    "model",
                    format!("unknown model '{}'", bundle.meta.model),
                    "pass --model with a catalog model".into(),
                )
            })?
            .to_string(),
    };
    let m = &bundle.meta;
    let tp = how.tp.unwrap_or(m.tp);
    let kv = match m.kv_cache_dtype.as_str() {
        d if d.starts_with("fp8") => "fp8",
        "bfloat16" | "bf16" => "bf16",
        "float16" | "fp16" | "half" => "fp16",
        "auto" => "auto",
        other => {
            let fix = "use auto, fp8, bf16 or fp16".to_string();
            return Err(bad("engine_kwargs.kv_cache_dtype", format!("unknown KV cache dtype '{other}'"), fix));
        }
    };
    // vLLM splits the experts across every GPU of the data-parallel group when asked; a dense
    // model ignores the flag.
    let is_moe = crate::step_model::model(&model).is_some_and(|m| m.moe.is_some());
    let ep = if m.expert_parallel && is_moe { m.dp } else { 1 };
    // A MoE's data-parallel engines step in lock-step; a dense model's are independent.
    let lockstep = if is_moe { m.dp } else { 1 };
    let yaml = format!(
        "{{replicas: {}, gpu: {gpu}, model: {model}, tp: {tp}, expert_parallel: {ep}, data_parallel: {lockstep}, kv_cache_dtype: {kv}, \
         metrics: {{scrape_interval_s: {VLLM_DP_STATS_INTERVAL_S}}}, \
         drain_s: 100000, generator: {{suffix_tokens: 1, output_tokens: 1}}, \
         arrivals: {{poisson: {{rate: 1}}}}, requests: {}}}",
        m.dp,
        bundle.rows.len()
    );
    let mut spec: ClusterSpec = serde_norway::from_str(&yaml).map_err(|e| bad("", e.to_string(), String::new()))?;
    // vLLM's rules, every one of them, with the run's knobs or else vLLM's defaults for the GPU
    // (an unknown GPU is refused below, whatever the knobs).
    let defaults = spec.gpu.resolve().map_or(VllmEngine::SMALL_GPU, |g| VllmEngine::defaults_for(&g));
    let engine = VllmEngine {
        max_num_batched_tokens: m.max_num_batched_tokens.unwrap_or(defaults.max_num_batched_tokens),
        max_num_seqs: m.max_num_seqs.unwrap_or(defaults.max_num_seqs),
    };
    engine.apply(&mut spec, |_| false);
    // The engine schedules as the profile declares, unless the run says how it scheduled.
    let calibration = how.calibration.clone().map(|mut c| {
        c.async_scheduling = m.async_scheduling.unwrap_or(c.async_scheduling);
        c
    });
    spec.calibration = calibration.map(Choice::Custom);
    let as_input = |e: FieldError| InputError::from_field(&meta_file, e.under("(replayed cluster)"));
    spec.validate().map_err(as_input)?;
    spec.step_model().map_err(as_input)?;
    Ok(spec)
}

/// Replays `bundle` and compares each figure.
pub fn replay(bundle: &Bundle, how: &Replay) -> Result<RunAccuracy, Error> {
    let mut spec = engine_spec(bundle, how)?;
    // Compared request by request: every record, however long the run.
    spec.summary = crate::workload::cluster::Summary::Exact;
    let stream = block_stream(&bundle.rows, STREAM_BLOCK_TOKENS, 1.0, None, None);
    let router = match &how.router {
        _ if spec.replicas == 1 => "round_robin",
        Some(r) => r.as_str(),
        None => "vllm_dp_lb",
    };
    let sm = spec.step_model().map_err(|e| InputError::from_field(Path::new("<replay>"), e))?;
    let ctx = sim::cluster::router_context(&sm, spec.replicas, 1);
    let router = Loader::new().resolve(&PolicySpec::parse(router)?, PolicyKind::Router)?.router(&ctx)?;
    let outcome = crate::runner::run_cluster(&spec, &stream, router, "replay", 1)?;
    // Records are in the stream's (arrival) order; `order` maps them back to requests.
    let mut sim_figs = Vec::with_capacity(outcome.records.len());
    // Timed from when the engine took the request in, as vLLM's `queued_ts`.
    for rec in &outcome.records {
        let ttft = rec.first_token_at_s - rec.queued_at_s;
        let tpot = (rec.output_tokens > 1)
            .then(|| (rec.completed_at_s - rec.first_token_at_s) / (rec.output_tokens - 1) as f64);
        sim_figs.push((ttft, tpot, rec.completed_at_s - rec.queued_at_s));
    }
    let real: Vec<_> = bundle.measured.iter().map(|r| r.figures()).collect();
    let (real, sim) = (figures(&real), figures(&sim_figs));
    let figures = real.iter().zip(&sim).map(|(&(k, r), &(_, s))| (k, Compared::new(r, s))).collect();
    Ok(RunAccuracy {
        run: bundle.name.clone(),
        gpu: sm.gpu.name.clone(),
        model: sm.model.name.clone(),
        tp: sm.tp,
        figures,
    })
}

/// Median and mean of the absolute errors of `key` across runs.
pub fn across(runs: &[RunAccuracy], key: &str) -> (f64, f64) {
    let mut e: Vec<f64> = runs.iter().filter_map(|r| r.get(key)).map(|c| c.error.abs()).collect();
    if e.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let mean = e.iter().sum::<f64>() / e.len() as f64;
    e.sort_by(f64::total_cmp);
    let n = e.len();
    let median = if n % 2 == 1 { e[n / 2] } else { (e[n / 2 - 1] + e[n / 2]) / 2.0 };
    (median, mean)
}

/// Fits `calibration.layer_overhead_s` (what kernel timings cannot see, per step and layer) so
/// that the mean TPOT of `runs` replayed matches the measured one on average: bisection on the
/// mean signed error, which grows with the overhead. Returns the fitted profile and the
/// remaining mean signed error. Per layer rather than per step: fitted on Llama-3.1-8B (32
/// layers) a per-step constant left Qwen3-32B (64 layers) 4.7% fast per token, a per-layer one
/// 1.9% (docs/accuracy.md).
pub fn fit_step_overhead(runs: &[Bundle], how: &Replay) -> Result<(Calibration, f64), Error> {
    let base = how.calibration.clone().expect("a calibration to fit");
    let error_at = |overhead: f64| -> Result<f64, Error> {
        let mut c = base.clone();
        c.layer_overhead_s = overhead;
        let h = Replay { calibration: Some(c), ..how.clone() };
        let mut sum = 0.0;
        for b in runs {
            sum += replay(b, &h)?.get("tpot_mean_s").map_or(0.0, |c| c.error);
        }
        Ok(sum / runs.len().max(1) as f64)
    };
    let (mut lo, mut hi) = (0.0, 1e-3);
    if error_at(lo)? < 0.0 {
        for _ in 0..24 {
            let mid = (lo + hi) / 2.0;
            if error_at(mid)? < 0.0 {
                lo = mid;
            } else {
                hi = mid;
            }
        }
    }
    // Already too slow with no overhead: none.
    let overhead = (lo * 1e10).round() / 1e10;
    let e = error_at(overhead)?;
    let mut c = base.clone();
    c.layer_overhead_s = overhead;
    Ok((c, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The replayed engine is the one this module spelled out field by field before the rules
    /// moved to `workload/cluster/vllm.rs`: the same spec, so the same replay and figures.
    #[test]
    fn the_replayed_engine_is_vllms_rules_with_the_runs_knobs() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../workloads/ground-truth/RTXPRO6000_Llama-3.1-8B");
        let bundle = crate::accuracy::load(&dir, None).unwrap();
        let how = Replay {
            calibration: Choice::<Calibration>::Name("rtx-pro-6000".into()).resolve().ok(),
            ..Default::default()
        };
        let spec = engine_spec(&bundle, &how).unwrap();
        let yaml = format!(
            "{{replicas: 1, gpu: rtx-pro-6000, model: llama-3.1-8b, tp: 1, expert_parallel: 1, data_parallel: 1, kv_cache_dtype: auto, memory_fraction: 0.9, chunk_tokens: 2048, \
             metrics: {{scrape_interval_s: 0.1}}, \
             budget_counts_decode: true, max_batch_requests: 128, reservation: {{estimate: {{output_tokens: 1}}}}, \
             scheduler: fcfs, drain_s: 100000, generator: {{suffix_tokens: 1, output_tokens: 1}}, \
             arrivals: {{poisson: {{rate: 1}}}}, requests: {}}}",
            bundle.rows.len()
        );
        let mut spelled: ClusterSpec = serde_norway::from_str(&yaml).unwrap();
        spelled.calibration = spec.calibration.clone();
        assert_eq!(spec, spelled);
    }
}
