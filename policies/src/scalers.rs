//! Scalers (policy-api 0.5.4): every `autoscaling.interval_s`, the desired replica count of each
//! pool (one on an aggregated cluster; prefill then decode on a disaggregated one), from its
//! ready replicas' views and the fleet facts (`facts::fleet`). The host clamps each answer to
//! the pool's `[min_replicas, max_replicas]`, starts new replicas (routable after
//! `model_load_s`, cold) and drains removed ones. `hpa` and `llm_d_wva` run their rule on each
//! pool apart, as one HPA or one WVA variant per Deployment would (upstream llm-d deploys the
//! prefill and decode workers as separate Deployments); `dynamo_planner` sizes the prefill pool
//! from the prefill load and the decode pool from the decode load, as upstream's disaggregated
//! planner does.
//!
//! - [`Hpa`] (`hpa`): the Kubernetes Horizontal Pod Autoscaler's rule on a per-replica metric,
//!   with its tolerance, its treatment of not-yet-ready pods and its stabilisation windows.
//! - [`DynamoPlanner`] (`dynamo_planner`): NVIDIA Dynamo's planner in its throughput mode:
//!   predicted load over profiled per-replica capacity, with correction factors.
//! - [`LlmDWva`] (`llm_d_wva`): llm-d's workload-variant autoscaler's saturation (capacity)
//!   analyzer: spare KV and queue capacity over non-saturated replicas, one replica at a time.

use std::collections::VecDeque;

use routelab_policy_api::{Policy, Pool, ReplicaView, ScalerContext, ScalerPolicy, facts::fleet};
use serde::{Deserialize, Serialize};

/// A replica's KV utilisation, 0..1.
fn kv_use(v: &ReplicaView) -> f64 {
    v.kv_used_tokens as f64 / v.kv_capacity_tokens.max(1) as f64
}

/// The Kubernetes HPA on a per-replica metric.
///
/// Upstream (kubernetes/kubernetes): the replica calculator,
/// `pkg/controller/podautoscaler/replica_calculator.go` (commit
/// 00067268967ec95a40035bd666374a1caf48dd1a), `calcPlainMetricReplicas` and `groupPods` (a Pods
/// metric: `GetMetricReplicas`); the stabilisation, `horizontal.go`
/// `stabilizeRecommendationWithBehaviors` in its envelope form since kubernetes/kubernetes#97348
/// ("Up and down scale stabilize with envelope", fixing #96671; the `horizontal.go` of commit
/// 00067268 still has the older form, which looks at one window by the direction of the move;
/// no stored commit of the newer file was found to pin); the rate limit, `horizontal.go`
/// `convertDesiredReplicasWithBehaviorRate` / `calculateScaleUpLimitWithScalingRules` with the
/// default `behavior.scaleUp` of `pkg/apis/autoscaling/v2/defaults.go` (`GenerateHPAScaleUpRules`:
/// 4 Pods and 100 Percent per 15 s, `selectPolicy: Max`); the tolerance, kube-controller-manager's
/// `--horizontal-pod-autoscaler-tolerance` (0.1). Each decision:
///
/// 1. `ratio` = mean of the metric over ready replicas / `target`. With no replica loading:
///    keep the current count if |1 − ratio| ≤ `tolerance` (default 0.1), else
///    `ceil(ratio × ready)`.
/// 2. With replicas loading and `ratio` > 1, they count as using 0 (`rebalanceIgnored`): `new` =
///    sum / (target × (ready + loading)); keep the current count if |1 − new| ≤ tolerance or
///    `new` < 1 (the direction would flip), else `ceil(new × (ready + loading))`. With `ratio`
///    ≤ 1 step 1 applies.
/// 3. Stabilisation: the answer is the current count brought within [min of the
///    recommendations of the last `scale_up_window_s` (default 0), max of those of the last
///    `scale_down_window_s` (default 300)], this one included; a recommendation counts while
///    strictly younger than its window (upstream's `rec.timestamp.After(cutoff)`).
/// 4. The default scale-up rate policy (100% or 4 pods per 15 s, the larger): at most
///    `max(2 × current, current + 4)` per decision (exact for a 15 s interval: upstream's
///    `getReplicasChangePerPeriod` counts only events strictly after `now − 15 s`, so the last
///    decision's is out). The default scale-down policy (100% per 15 s) limits nothing.
/// 5. With no ready replica, upstream's calculator fails ("did not receive metrics for any ready
///    pods") and the HPA keeps the scale without recording a recommendation: so here.
///
/// Deviations, each a modelling choice: a loading replica (model load) is upstream's Pending pod
/// (ignored; 0 on a scale-up), not a Running pod without metrics (`missingPods`, which on a
/// scale-down would count at the target and damp it); the mean is taken in `f64`, where
/// upstream's `GetMetricUtilizationRatio` averages int64 milli-values (truncating to 0.001, which
/// can move a ratio across the tolerance edge or a ceiling only at that last digit); the bounds
/// `[min_replicas, max_replicas]` are the host's clamp (upstream's `MinReplicas`/`MaxReplicas`
/// in the same normalisation), so the answer here may lie outside them; one metric, so no max
/// over metrics.
///
/// The metric (`metric`): `kv_utilisation` (default, target 0.7), `requests` (waiting + running
/// per replica) or `waiting`. "Current" is ready + loading (the Deployment's `spec.replicas`).
pub struct Hpa {
    config: HpaConfig,
    /// Per pool: (time, recommendation), the last `max(window)` seconds' worth.
    history: Vec<VecDeque<(f64, u32)>>,
    decisions: u64,
}

/// Configuration of [`Hpa`].
#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct HpaConfig {
    /// `kv_utilisation`, `requests` or `waiting`.
    pub metric: String,
    /// The per-replica target of the metric (> 0).
    pub target: f64,
    /// Upstream `--horizontal-pod-autoscaler-tolerance` (0.1).
    pub tolerance: f64,
    /// Upstream `behavior.scaleUp.stabilizationWindowSeconds` (0).
    pub scale_up_window_s: f64,
    /// Upstream `behavior.scaleDown.stabilizationWindowSeconds` (300).
    pub scale_down_window_s: f64,
}

impl Default for HpaConfig {
    fn default() -> Self {
        Self {
            metric: "kv_utilisation".into(),
            target: 0.7,
            tolerance: 0.1,
            scale_up_window_s: 0.0,
            scale_down_window_s: 300.0,
        }
    }
}

impl Policy for Hpa {
    const NAME: &'static str = "hpa";
    const DESCRIPTION: &'static str =
        "Kubernetes HPA: ceil(current × metric/target), tolerance 0.1, scale-down stabilisation window";
    type Config = HpaConfig;
    type Context = ScalerContext;
    fn new(config: HpaConfig, _: &ScalerContext) -> Result<Self, String> {
        if !["kv_utilisation", "requests", "waiting"].contains(&config.metric.as_str()) {
            return Err(format!(
                "metric '{}' is not one hpa knows (use kv_utilisation, requests or waiting)",
                config.metric
            ));
        }
        if !(config.target > 0.0 && config.target.is_finite()) {
            return Err(format!("target must be positive (got {})", config.target));
        }
        if !(config.tolerance >= 0.0) || !(config.scale_up_window_s >= 0.0) || !(config.scale_down_window_s >= 0.0) {
            return Err("tolerance and the windows must be ≥ 0".into());
        }
        Ok(Self { config, history: Vec::new(), decisions: 0 })
    }
}

impl Hpa {
    fn metric(&self, v: &ReplicaView) -> f64 {
        match self.config.metric.as_str() {
            "kv_utilisation" => kv_use(v),
            "requests" => (v.waiting + v.running) as f64,
            _ => v.waiting as f64,
        }
    }

    /// Steps 1–2: the replica calculator's recommendation (at least one replica is ready).
    fn recommend(&self, pool: &Pool<'_>) -> u32 {
        let current = pool.fact(fleet::REPLICAS) as u32;
        let ready = pool.replicas.len();
        let loading = pool.fact(fleet::LOADING_REPLICAS) as usize;
        let (target, tol) = (self.config.target, self.config.tolerance);
        let sum: f64 = pool.replicas.iter().map(|v| self.metric(v)).sum();
        let ratio = sum / ready as f64 / target;
        if loading == 0 || ratio <= 1.0 {
            if (1.0 - ratio).abs() <= tol {
                return current;
            }
            return (ratio * ready as f64).ceil() as u32;
        }
        let counted = (ready + loading) as f64;
        let new = sum / counted / target;
        if (1.0 - new).abs() <= tol || new < 1.0 {
            return current;
        }
        (new * counted).ceil() as u32
    }
}

impl ScalerPolicy for Hpa {
    fn desired(&mut self, now: f64, pools: &[Pool<'_>]) -> Vec<u32> {
        self.decisions += 1;
        if self.history.len() < pools.len() {
            self.history.resize(pools.len(), VecDeque::new());
        }
        (0..pools.len()).map(|k| self.desired_of(now, k, &pools[k])).collect()
    }
    fn report(&self) -> Vec<(String, f64)> {
        vec![("decisions".into(), self.decisions as f64)]
    }
}

impl Hpa {
    /// Steps 1–5 for pool `k` (each pool has its own recommendations' history).
    fn desired_of(&mut self, now: f64, k: usize, pool: &Pool<'_>) -> u32 {
        let current = pool.fact(fleet::REPLICAS) as u32;
        if pool.replicas.is_empty() {
            return current;
        }
        let rec = self.recommend(pool);
        let keep = self.config.scale_up_window_s.max(self.config.scale_down_window_s);
        let history = &mut self.history[k];
        while history.front().is_some_and(|&(t, _)| t < now - keep) {
            history.pop_front();
        }
        history.push_back((now, rec));
        let (mut up, mut down) = (rec, rec);
        for &(t, r) in history.iter() {
            if t > now - self.config.scale_up_window_s {
                up = up.min(r);
            }
            if t > now - self.config.scale_down_window_s {
                down = down.max(r);
            }
        }
        let stabilised = current.max(up).min(down);
        stabilised.min((2 * current).max(current + 4))
    }
}

/// NVIDIA Dynamo's planner, throughput mode, for an aggregated replica.
///
/// Upstream (ai-dynamo/dynamo): `components/src/dynamo/planner/utils/prefill_planner.py`
/// (commit 002a7c3130e71d5849540cae64fcba2ed9e2d899) and `decode_planner.py` (commit
/// 0ff5001282458c8804ee72c78a9658e3bf27a011), `_compute_replica_requirements` and
/// `_update_correction_factor`. Every adjustment interval the planner predicts the next
/// interval's requests, ISL and OSL (here the constant predictor: the last interval's), then
///
/// - prefill load = rate × ISL × min(1, `p_correction`), `p_correction` = observed TTFT /
///   expected TTFT (prefix-cache hits make prefill cheaper than profiled, never dearer);
/// - decode load = rate × OSL, against a per-replica decode capacity divided by
///   `d_correction` = observed ITL / expected ITL (upstream reads the throughput its
///   interpolator gives at the corrected ITL target `itl / d_correction`; the profile here is one
///   point, so capacity scales linearly);
/// - replicas = ceil(prefill load / `prefill_tokens_per_s` + decode load /
///   (`decode_tokens_per_s` / d_correction)), at least `min_endpoint`.
///
/// routelab: an aggregated replica does both phases, so the two engine-time shares add before
/// the one ceiling; on a disaggregated cluster (two pools) each pool is sized apart, a ceiling
/// each, as upstream does: prefill = ceil(prefill load / `prefill_tokens_per_s`), decode =
/// ceil(decode load / corrected decode capacity), each at least `min_endpoint`. The
/// profile (`prefill_tokens_per_s`, `decode_tokens_per_s`, `expected_ttft_s`, `expected_itl_s`)
/// is what Dynamo's pre-deployment profiler measures; a correction needs both its observed and
/// expected figures (0 = off), and an interval without completions (TTFT or ITL NaN) keeps the
/// last factor. With no arrivals in an interval the planner keeps its last answer (the current
/// count before any).
///
/// Deviations: upstream's `plan_adjustment` (`planner_core.py` @ 0ff50012) skips the whole
/// adjustment, leaving the scale as it is, when any observed figure is NaN ("no active
/// requests"), where this one still sizes from the arrivals with the last correction factors
/// when only the completions' TTFT or ITL is missing; with no arrivals at all it answers its
/// last count, which is upstream's "no change" unless the host clamped that count.
///
/// Upstream's aggregated planner (`agg_planner.py` @ 0ff50012) refuses throughput
/// scaling ("Aggregated planner only supports load-based scaling") and runs the load-based
/// rule instead (per-worker regressions of TTFT on active prefill tokens and of ITL on active
/// decode blocks; +1 if every worker is above the SLA point of either, −1 if every worker is
/// below `(n − 1)/n × sensitivity` of both; `loadbased_plan_adjustment` in the two files above).
/// That rule regresses each worker's own TTFT and ITL observations over a learning window, which
/// the scaler's view (per-replica queue and KV, fleet-wide means) does not carry, so this built-in
/// is the throughput (disaggregated) formula applied to an aggregated replica; the load-based rule
/// is not implemented. The expected TTFT and ITL are one profile point, where upstream interpolates
/// them at the last ISL and concurrency.
pub struct DynamoPlanner {
    config: DynamoConfig,
    /// The last answer (one count per pool).
    last: Option<Vec<u32>>,
    p_correction: f64,
    d_correction: f64,
}

/// Configuration of [`DynamoPlanner`]: the profile.
#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct DynamoConfig {
    /// Prompt tokens per second one replica prefills at the TTFT target (> 0).
    pub prefill_tokens_per_s: f64,
    /// Output tokens per second one replica decodes at the ITL target (> 0).
    pub decode_tokens_per_s: f64,
    /// TTFT the profile expects at that load, seconds (0: no prefill correction).
    pub expected_ttft_s: f64,
    /// ITL the profile expects at that load, seconds (0: no decode correction).
    pub expected_itl_s: f64,
    /// Upstream `min_endpoint` (1).
    pub min_endpoint: u32,
}

impl Default for DynamoConfig {
    fn default() -> Self {
        Self {
            prefill_tokens_per_s: 8000.0,
            decode_tokens_per_s: 1500.0,
            expected_ttft_s: 0.0,
            expected_itl_s: 0.0,
            min_endpoint: 1,
        }
    }
}

impl Policy for DynamoPlanner {
    const NAME: &'static str = "dynamo_planner";
    const DESCRIPTION: &'static str =
        "Dynamo planner (throughput mode): predicted load / profiled per-replica capacity, with correction factors";
    type Config = DynamoConfig;
    type Context = ScalerContext;
    fn new(config: DynamoConfig, _: &ScalerContext) -> Result<Self, String> {
        if !(config.prefill_tokens_per_s > 0.0 && config.decode_tokens_per_s > 0.0) {
            return Err("prefill_tokens_per_s and decode_tokens_per_s must be positive".into());
        }
        if !(config.expected_ttft_s >= 0.0 && config.expected_itl_s >= 0.0) {
            return Err("expected_ttft_s and expected_itl_s must be ≥ 0".into());
        }
        Ok(Self { config, last: None, p_correction: 1.0, d_correction: 1.0 })
    }
}

impl ScalerPolicy for DynamoPlanner {
    fn desired(&mut self, _now: f64, pools: &[Pool<'_>]) -> Vec<u32> {
        let pool = &pools[0];
        let c = &self.config;
        let (ttft, itl) = (pool.fact(fleet::TTFT_MEAN_S), pool.fact(fleet::TPOT_MEAN_S));
        if c.expected_ttft_s > 0.0 && ttft > 0.0 {
            self.p_correction = ttft / c.expected_ttft_s;
        }
        if c.expected_itl_s > 0.0 && itl > 0.0 {
            self.d_correction = itl / c.expected_itl_s;
        }
        let rate = pool.fact(fleet::ARRIVAL_RATE);
        let (isl, osl) = (pool.fact(fleet::PROMPT_TOKENS_MEAN), pool.fact(fleet::OUTPUT_TOKENS_MEAN));
        if !(rate > 0.0 && isl.is_finite() && osl.is_finite()) {
            let current = || pools.iter().map(|p| p.fact(fleet::REPLICAS) as u32).collect();
            return self.last.clone().unwrap_or_else(current);
        }
        let prefill = rate * isl * self.p_correction.min(1.0) / c.prefill_tokens_per_s;
        let decode = rate * osl / (c.decode_tokens_per_s / self.d_correction.max(f64::MIN_POSITIVE));
        let n = |load: f64| (load.ceil() as u32).max(c.min_endpoint);
        let answer = match pools.len() {
            1 => vec![n(prefill + decode)],
            _ => vec![n(prefill), n(decode)],
        };
        self.last = Some(answer.clone());
        answer
    }
    fn report(&self) -> Vec<(String, f64)> {
        vec![("p_correction".into(), self.p_correction), ("d_correction".into(), self.d_correction)]
    }
}

/// llm-d's workload-variant autoscaler, saturation (capacity) analyzer, for one variant.
///
/// Upstream (llm-d/llm-d-workload-variant-autoscaler): `internal/capacity/analyzer.go` (commit
/// b3ca6d2ca922087286cdef31addbb6f32fdbae4f), `AnalyzeModelCapacity`, `isScaleDownSafe`,
/// `CalculateCapacityTargets`, with `MinNonSaturatedReplicasForScaleDown = 2`; defaults from its
/// `capacity-scaling-config`. Each decision, over the ready replicas:
///
/// - a replica is saturated if its KV utilisation ≥ `kv_cache_threshold` (0.8) or its queue ≥
///   `queue_length_threshold` (5); spare capacity of a non-saturated one = threshold − usage;
/// - scale up (+1 over the ready count) if the average spare KV over non-saturated replicas <
///   `kv_spare_trigger` (0.1) or the average spare queue < `queue_spare_trigger` (3) (with none
///   non-saturated both averages are 0);
/// - else scale down (−1, not below 1) if safe: at least 2 non-saturated replicas, and their
///   summed KV and queue load spread over one fewer still leaves both spares ≥ their triggers;
/// - else keep the ready count.
///
/// While replicas are still loading, the previous target stands (upstream keeps a desired count
/// that differs from the current one: `preservedVariants`, which stops cascading scale-ups). With
/// no ready replica (no metrics) the answer is the current count, as upstream's
/// `CalculateCapacityTargets` gives `CurrentReplicas` when the analysis has no variant.
///
/// Deviations: upstream's test is "the last desired count ≠ the variant's current replicas"
/// (`VariantReplicaState`); here it is "some replica is still loading", the simulator's form of
/// a scale-up not yet complete (a scale-down here is immediate: loading replicas are cancelled
/// and ready ones stop taking requests at once); one variant, so the cheapest/most-expensive
/// variant choice is moot; the queue is the replica's `waiting` count (vLLM's
/// `num_requests_waiting`, upstream's `QueueLength`).
pub struct LlmDWva {
    config: WvaConfig,
    /// Per pool: the last target.
    target: Vec<Option<u32>>,
}

/// Configuration of [`LlmDWva`] (upstream's `capacity-scaling-config` defaults).
#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct WvaConfig {
    /// `kvCacheThreshold` (0.8).
    pub kv_cache_threshold: f64,
    /// `queueLengthThreshold` (5).
    pub queue_length_threshold: f64,
    /// `kvSpareTrigger` (0.1).
    pub kv_spare_trigger: f64,
    /// `queueSpareTrigger` (3).
    pub queue_spare_trigger: f64,
}

impl Default for WvaConfig {
    fn default() -> Self {
        Self { kv_cache_threshold: 0.8, queue_length_threshold: 5.0, kv_spare_trigger: 0.1, queue_spare_trigger: 3.0 }
    }
}

impl Policy for LlmDWva {
    const NAME: &'static str = "llm_d_wva";
    const DESCRIPTION: &'static str =
        "llm-d workload-variant autoscaler: scale up on low spare KV/queue capacity, down when one fewer is safe";
    type Config = WvaConfig;
    type Context = ScalerContext;
    fn new(config: WvaConfig, _: &ScalerContext) -> Result<Self, String> {
        Ok(Self { config, target: Vec::new() })
    }
}

impl ScalerPolicy for LlmDWva {
    fn desired(&mut self, _now: f64, pools: &[Pool<'_>]) -> Vec<u32> {
        if self.target.len() < pools.len() {
            self.target.resize(pools.len(), None);
        }
        (0..pools.len()).map(|k| self.desired_of(k, &pools[k])).collect()
    }
}

impl LlmDWva {
    /// The analysis of pool `k` (a variant of its own).
    fn desired_of(&mut self, k: usize, pool: &Pool<'_>) -> u32 {
        let c = &self.config;
        let ready = pool.replicas.len() as u32;
        if ready == 0 {
            let current = pool.fact(fleet::REPLICAS) as u32;
            self.target[k] = Some(current);
            return current;
        }
        if let Some(t) = self.target[k].filter(|_| pool.fact(fleet::LOADING_REPLICAS) > 0.0) {
            return t;
        }
        let saturated =
            |v: &ReplicaView| kv_use(v) >= c.kv_cache_threshold || v.waiting as f64 >= c.queue_length_threshold;
        let free: Vec<&ReplicaView> = pool.replicas.iter().filter(|v| !saturated(v)).collect();
        let n = free.len() as f64;
        let (kv_load, queue_load): (f64, f64) =
            free.iter().fold((0.0, 0.0), |(k, q), v| (k + kv_use(v), q + v.waiting as f64));
        let (spare_kv, spare_queue) = if free.is_empty() {
            (0.0, 0.0)
        } else {
            (c.kv_cache_threshold - kv_load / n, c.queue_length_threshold - queue_load / n)
        };
        let up = spare_kv < c.kv_spare_trigger || spare_queue < c.queue_spare_trigger;
        let down_safe = free.len() >= 2 && {
            let rest = n - 1.0;
            c.kv_cache_threshold - kv_load / rest >= c.kv_spare_trigger
                && c.queue_length_threshold - queue_load / rest >= c.queue_spare_trigger
        };
        let t = if up {
            ready + 1
        } else if down_safe && ready > 1 {
            ready - 1
        } else {
            ready
        };
        self.target[k] = Some(t);
        t
    }
}

#[cfg(test)]
#[path = "scalers_tests.rs"]
mod tests;
