//! The checks of a `cluster:` section, before anything runs: every field in range, the parts
//! that must agree (pools, tiers, classes, autoscaling, lock-step groups) agreeing, and a step
//! model that yields a usable KV capacity and step time.

use super::*;

impl ClusterSpec {
    pub fn validate(&self) -> Result<(), FieldError> {
        if self.replicas == 0 {
            return Err(FieldError::new("replicas", "must be at least 1 (got 0)", "set `replicas: 4`, say"));
        }
        at_most("replicas", self.replicas, limits::MAX_REPLICAS, "simulate at most 10000 replicas")?;
        if ![1, 2, 4, 8].contains(&self.tp) {
            return Err(FieldError::new(
                "tp",
                format!("must be 1, 2, 4 or 8 (got {})", self.tp),
                "use a tensor-parallel degree of 1, 2, 4 or 8",
            ));
        }
        if !(self.memory_fraction > 0.0 && self.memory_fraction <= 1.0) {
            return Err(FieldError::new(
                "memory_fraction",
                format!("must be in (0, 1] (got {:?})", self.memory_fraction),
                "use e.g. 0.9",
            ));
        }
        let e = &self.efficiency;
        for (name, v) in [("mfu", e.mfu), ("mbu", e.mbu)] {
            if !(v > 0.0 && v <= 1.0) {
                return Err(FieldError::new(
                    &format!("efficiency.{name}"),
                    format!("must be in (0, 1] (got {v:?})"),
                    "use e.g. 0.7",
                ));
            }
        }
        if !(e.step_overhead_s >= 0.0
            && e.allreduce_latency_s >= 0.0
            && e.step_overhead_s <= 10.0
            && e.allreduce_latency_s <= 10.0)
        {
            return Err(FieldError::new(
                "efficiency",
                "overheads must be in [0, 10] s",
                "use e.g. step_overhead_s: 0.0004",
            ));
        }
        let sm = self.step_model()?;
        self.check_step_model(&sm)?;
        if let Some(d) = &self.disaggregation {
            d.validate(self)?;
            if self.lockstep_group() > 1 {
                let fix = "drop `disaggregation:`, or `data_parallel`/`expert_parallel`";
                return Err(FieldError::new("data_parallel", "lock-step groups run on aggregated clusters only", fix));
            }
        }
        if self.autoscaling.is_some() && self.lockstep_group() > 1 {
            // A lock-step group is a fixed set of data-parallel ranks; a scaler adds and drains
            // single replicas.
            let fix = "drop `autoscaling:`, or `data_parallel`/`expert_parallel`";
            return Err(FieldError::new(
                "autoscaling",
                "a fleet of lock-step groups does not scale replica by replica",
                fix,
            ));
        }
        if let Some(t) = &self.kv_tiers {
            if self.disaggregation.is_some() && t.remote.is_some() {
                return Err(FieldError::new(
                    "kv_tiers.remote",
                    "a disaggregated cluster's shared tier is `disaggregation.shared_kv` (per-instance CPU tiers are fine)",
                    "remove `kv_tiers.remote:`, and give the disaggregated cluster a shared tier with `disaggregation.shared_kv:`",
                ));
            }
            t.validate(sm.kv_capacity_tokens, sm.cost.kv_bytes_per_token)?;
        }
        if self.max_batch_requests == 0 {
            return Err(FieldError::new("max_batch_requests", "must be at least 1 (got 0)", "use e.g. 256"));
        }
        if self.scheduler_window == 0 {
            return Err(FieldError::new("scheduler_window", "must be at least 1 (got 0)", "use e.g. 512"));
        }
        if self.scheduler.trim().is_empty() {
            return Err(FieldError::new("scheduler", "is empty", "name a scheduler: fcfs, lpm or priority_groups"));
        }
        if !(self.eviction_delay_s >= 0.0 && self.eviction_delay_s.is_finite()) {
            return Err(FieldError::new(
                "eviction_delay_s",
                format!("must be ≥ 0 (got {:?})", self.eviction_delay_s),
                "use e.g. 0 or 0.05",
            ));
        }
        if !(self.drain_s >= 0.0 && self.drain_s <= MAX_HORIZON) {
            return Err(FieldError::new(
                "drain_s",
                format!("must be in [0, {MAX_HORIZON:.1e}] s (got {:?})", self.drain_s),
                "use e.g. 600",
            ));
        }
        let scrape = self.metrics.scrape_interval_s;
        if !(scrape == 0.0 || (1e-6..=MAX_HORIZON).contains(&scrape)) {
            return Err(FieldError::new(
                "metrics.scrape_interval_s",
                format!("must be 0 (always fresh) or in [1e-6, {MAX_HORIZON:.1e}] s (got {scrape:?})"),
                "use e.g. 0.05 (50 ms, as llm-d scrapes), or 0",
            ));
        }
        if self.eviction_delay_s > MAX_HORIZON {
            return Err(FieldError::new(
                "eviction_delay_s",
                format!("must be at most {MAX_HORIZON:.1e} s"),
                "use e.g. 0 or 0.05",
            ));
        }
        if let Some(a) = &self.autoscaling {
            // On a disaggregated cluster a scaler sizes the prefill and decode pools apart
            // (`pools`, as Dynamo's planner sizes prefill and decode workers); mixed instances,
            // in both pools at once, are in neither count: they stay a fixed set (a chosen
            // limit; they do crash and restart, `pd_failures.rs`).
            if self.disaggregation.as_ref().is_some_and(|d| d.mixed_instances() > 0) {
                return Err(FieldError::new(
                    "autoscaling",
                    "sizes a disaggregated cluster's prefill and decode pools (`autoscaling.pools`), and mixed \
                     instances, in both pools at once, are in neither count; this cluster has \
                     `disaggregation.mixed`",
                    "drop `mixed:` (scale the prefill and decode pools with `autoscaling.pools`), or drop \
                     `autoscaling:`",
                ));
            }
            let pd_start = self.disaggregation.as_ref().map(|d| (d.prefill.instances, d.decode.instances));
            a.validate(self.replicas, pd_start).map_err(|e| e.under("autoscaling"))?;
        }
        self.validate_models()?;
        self.validate_pools()?;
        if let Some(f) = &self.failures {
            // With autoscaling, `replica` names a slot (up to `max_replicas`).
            f.validate(self.slots()).map_err(|e| e.under("failures"))?;
            // A crash takes one replica out of the routable set (on a P/D cluster, out of its
            // pool's candidates, or both pools' for a mixed instance; with autoscaling, it
            // loads again; in lock-step, with its whole group). Slowdowns and lost KV events
            // only stretch steps and drop notices, which every P/D instance has as an
            // aggregated replica does (`form_step`).
        }
        if let Some(c) = self.cost_per_hour {
            if !(c >= 0.0 && c.is_finite()) {
                return Err(FieldError::new("cost_per_hour", format!("must be ≥ 0 (got {c:?})"), "use e.g. 2.5"));
            }
        }
        self.generator.validate().map_err(|e| e.under("generator"))?;
        if let Some(h) = &self.hints {
            h.validate().map_err(|e| e.under("hints"))?;
        }
        if let Some(l) = &self.lora {
            l.validate().map_err(|e| e.under("lora"))?;
        }
        if let Some(slo) = &self.slo {
            slo.validate().map_err(|e| e.under("slo"))?;
        }
        self.arrivals.validate().map_err(|e| e.under("arrivals"))?;
        self::classes::validate(&self.classes, &self.tenants)?;
        self::classes::validate_arrivals(&self.classes, &self.arrivals)?;
        if self.admission.trim().is_empty() {
            return Err(FieldError::new(
                "admission",
                "is empty",
                "name an admission policy (`routelab policies` lists them): admit_all, gie_saturation, token_bucket, vtc, llm_d_flow_control, mooncake_early_reject",
            ));
        }
        match (self.requests, self.duration_s) {
            (None, None) if self.processes().any(|a| !matches!(a, Arrivals::Trace { .. } | Arrivals::Stages(_))) => {
                return Err(FieldError::new(
                    "",
                    "needs `requests` or `duration_s`",
                    "add `requests: 2000` or `duration_s: 600`",
                ));
            }
            (Some(0), _) => return Err(FieldError::new("requests", "must be at least 1 (got 0)", "use e.g. 2000")),
            (_, Some(d)) if !(d > 0.0 && d.is_finite()) => {
                return Err(FieldError::new("duration_s", format!("must be positive (got {d:?})"), "use e.g. 600"));
            }
            _ => {}
        }
        if let Some(d) = self.duration_s {
            fits_clock("duration_s", d, "use e.g. 600 (seconds)")?;
        }
        if let Some(n) = self.requests {
            at_most("requests", n, limits::MAX_CLUSTER_REQUESTS, "use e.g. 100000 requests and more seeds")?;
        }
        if let Some(rate) = self.total_rate() {
            let n = self.expected_requests();
            if n > limits::MAX_CLUSTER_REQUESTS as f64 {
                return Err(FieldError::new(
                    "duration_s",
                    format!(
                        "at {rate} requests/s gives about {n:.3e} requests, above the limit of {}",
                        limits::MAX_CLUSTER_REQUESTS
                    ),
                    "shorten `duration_s` or cap the run with `requests`",
                ));
            }
            let path = if matches!(self.arrivals, Arrivals::Poisson { .. }) {
                "arrivals.poisson.rate"
            } else {
                "arrivals.gamma.rate"
            };
            fits_clock(path, n / rate, "raise the rate, or run fewer requests")?;
            let session = self.generator.think_time_s * self.generator.turns.max() as f64;
            fits_clock("generator.think_time_s", n / rate + session, "shorten the think time")?;
        }
        if let (None, n) = (self.total_rate(), self.expected_requests())
            && n > limits::MAX_CLUSTER_REQUESTS as f64
        {
            // Stages, the cluster's or a class's (a trace counts only `requests` here).
            let path = if matches!(self.arrivals, Arrivals::Stages(_)) { "arrivals.stages" } else { "classes" };
            let m = format!("hold about {n:.3e} requests, above the limit of {}", limits::MAX_CLUSTER_REQUESTS);
            return Err(FieldError::new(path, m, "shorten the stages or cap the run with `requests`"));
        }
        if !matches!(self.arrivals, Arrivals::Trace { .. }) {
            let longest = self.max_prompt_tokens();
            let reserve = match self.reservation {
                Reservation::Full => self.max_output_tokens() as u64,
                Reservation::Estimate { output_tokens } => output_tokens as u64,
            };
            // With GPU pools (or models on hardware of their own) no replica runs the cluster's
            // own step model: the bound is the pools' (`StepModels::row_fit`). A disaggregated
            // cluster's pools are checked on the stream (`check_fits`), naming the pool's GPU.
            let pooled = (self.disaggregation.is_none() && self.pool_count() > 0)
                .then(|| super::StepModels::resolve(self))
                .transpose()?;
            let fit = pooled.as_ref().map_or(&sm, |m| m.row_fit());
            if longest + reserve > fit.kv_capacity_tokens {
                return Err(FieldError::new(
                    "generator",
                    format!(
                        "the longest prompt ({longest} tokens) plus its output reservation ({reserve}) exceeds one replica's KV \
                         capacity ({} tokens on {}, tp {}): such a request could never be admitted",
                        fit.kv_capacity_tokens, fit.gpu.name, fit.tp
                    ),
                    "shorten the contexts or turns, raise tp, or use a GPU with more memory",
                ));
            }
            if self.chunk_tokens == 0 && longest > self.max_step_tokens as u64 {
                return Err(FieldError::new(
                    "chunk_tokens",
                    format!(
                        "0 (unchunked prefill) is invalid here: prompts reach {longest} tokens but one step holds at most \
                         max_step_tokens = {} prefill tokens, so the longest prompt could never be prefilled",
                        self.max_step_tokens
                    ),
                    "use chunked prefill (`chunk_tokens: 512`) or raise `max_step_tokens` above the longest prompt",
                ));
            }
        }
        Ok(())
    }

    /// Derived quantities of a custom GPU or model must be usable: a KV capacity that sums in
    /// 64 bits, and a finite, bounded time for the largest step.
    pub(crate) fn check_step_model(&self, sm: &StepModel) -> Result<(), FieldError> {
        if sm.kv_capacity_tokens == 0 || sm.kv_capacity_tokens > 1 << 40 || !(sm.cost.kv_bytes_per_token > 0.0) {
            return Err(FieldError::new(
                "model",
                format!(
                    "gives a KV capacity of {} tokens per replica, outside what any real GPU holds",
                    sm.kv_capacity_tokens
                ),
                "check memory_gb and the model's layers, kv_heads and head_dim (all must be positive)",
            ));
        }
        let budget = if self.chunk_tokens == 0 { self.max_step_tokens } else { self.chunk_tokens } as u64;
        let worst = routelab_policy_api::StepShape::prefill(budget, sm.kv_capacity_tokens)
            .merge(routelab_policy_api::StepShape::decode(self.max_batch_requests as u64, sm.kv_capacity_tokens));
        let t = sm.cost.shape_time_s(&worst);
        if !(t.is_finite() && t <= 3600.0) {
            return Err(FieldError::new(
                "gpu",
                format!("the largest step would take {t:.3e} s (at most an hour is usable)"),
                "give the GPU a realistic tflops and bandwidth_gb_s (an A6000: 154.8 and 768), and mfu/mbu near 0.7",
            ));
        }
        Ok(())
    }
}
