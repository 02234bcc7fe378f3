//! What the policies of a cluster run are told at creation (the contexts) and per request (the
//! infos), and the check that every request fits a replica: the pieces the gateway and the
//! simulator share.

use abi_stable::std_types::{RNone, RSome, RVec};
use routelab_policy_api::{CostModel, PdContext, RouterContext, SchedulerContext, World};

use super::super::SetupError;
use crate::facts::RequestInfo;
use crate::seeds::stream_seed;
use crate::step_model::StepModel;
use crate::workload::cluster::classes::ClassSpec;
use crate::workload::cluster::{ClusterSpec, StepModels};
use crate::workload::generate::{GeneratedRequest, RequestStream};
use crate::workload::slo::Slo;

/// What a router is told at creation on an aggregated cluster of `replicas` replicas.
pub fn router_context(sm: &StepModel, replicas: u32, run_seed: u64) -> RouterContext {
    RouterContext {
        world: World::Cluster,
        replicas,
        seed: stream_seed(run_seed, "policy.router"),
        kv_capacity_tokens: sm.kv_capacity_tokens,
        cost: RSome(CostModel::new(sm.pricer)),
        disaggregation: RNone,
        facts: RVec::new(),
    }
}

/// What a router is told at creation by a gateway in front of `replicas` live engines
/// (`routelab serve`): the cluster world's context ([`router_context`], so `--seed S` hands the
/// router the stream a workload with `seed: S` does), the engines' KV capacity as the gateway
/// knows it, and the facts a gateway knows ([`crate::facts::gateway_context`]).
pub fn gateway_router_context(
    sm: &StepModel,
    replicas: u32,
    run_seed: u64,
    kv_capacity_tokens: u64,
    scrape_s: f64,
) -> RouterContext {
    RouterContext {
        kv_capacity_tokens,
        facts: crate::facts::gateway_context(scrape_s).into(),
        ..router_context(sm, replicas, run_seed)
    }
}

/// What a router is told at creation on `spec`'s cluster (`models` its resolved step models): on
/// a disaggregated one, `replicas` counts the decode candidates (mixed + decode instances),
/// capacity and cost describe the decode pool, and `disaggregation` the prefill candidates, the
/// link and the shared tier.
pub fn router_context_for(spec: &ClusterSpec, models: &StepModels, run_seed: u64) -> RouterContext {
    let sm = &models.main;
    let facts: RVec<_> = crate::facts::cluster_context_with(
        spec.chunk_tokens,
        spec.max_step_tokens,
        spec.max_batch_requests,
        spec.metrics.scrape_interval_s,
        spec.classes.len(),
        spec.tenants.len(),
        spec.model_count(),
    )
    .into();
    let Some(d) = &spec.disaggregation else {
        // Several models: this is model 0's router (`router_context_for_model`).
        let replicas = if spec.models.is_empty() { spec.slots() } else { spec.models[0].replicas };
        return RouterContext { facts, ..router_context(sm, replicas, run_seed) };
    };
    let pd = models.pd.as_ref().expect("the step models of this spec (`StepModels::resolve`)");
    let (p, dm) = (&pd.prefill, &pd.decode);
    // With autoscaling, the most instances each pool may have (its slots).
    let (prefill, decode) = match spec.autoscaling.as_ref().and_then(|a| a.pools.as_ref()) {
        Some(b) => (b.prefill.max_replicas, b.decode.max_replicas),
        None => (d.prefill.instances, d.decode.instances),
    };
    RouterContext {
        disaggregation: RSome(PdContext {
            prefill_replicas: prefill + d.mixed_instances(),
            prefill_kv_capacity_tokens: p.kv_capacity_tokens,
            prefill_cost: RSome(CostModel::new(p.pricer)),
            kv_bytes_per_token: dm.cost.kv_bytes_per_token,
            link_bandwidth_bytes_s: d.link.bandwidth_bytes_s(),
            link_base_latency_s: d.link.base_latency_s,
            mixed_replicas: d.mixed_instances(),
            link_layerwise: d.link.layerwise,
            model_layers: dm.model.layers,
            shared_kv_bandwidth_bytes_s: d.shared_kv.as_ref().map_or(0.0, |t| t.bandwidth_gbps * 1e9 / 8.0),
            shared_kv_capacity_tokens: d
                .shared_kv
                .as_ref()
                .map_or(0, |t| (t.capacity_gb * 1e9 / dm.cost.kv_bytes_per_token).floor() as u64),
        }),
        facts,
        ..router_context(dm, decode + d.mixed_instances(), run_seed)
    }
}

/// What model `model`'s router is told at creation on `spec`'s cluster of several models
/// (`cluster.models`): its own replica count, and a seed of its own (model 0's is
/// [`router_context_for`]'s, so a one-model run is unchanged).
pub fn router_context_for_model(spec: &ClusterSpec, models: &StepModels, run_seed: u64, model: usize) -> RouterContext {
    let ctx = router_context_for(spec, models, run_seed);
    if model == 0 {
        return ctx;
    }
    RouterContext {
        replicas: spec.models[model].replicas,
        seed: stream_seed(run_seed, &format!("policy.router.model.{model}")),
        ..ctx
    }
}

/// What an admission policy is told at creation on `spec`'s cluster.
pub fn admission_context(
    spec: &ClusterSpec,
    models: &StepModels,
    run_seed: u64,
) -> routelab_policy_api::AdmissionContext {
    let ctx = router_context_for(spec, models, run_seed);
    routelab_policy_api::AdmissionContext {
        world: World::Cluster,
        replicas: spec.slots(),
        seed: stream_seed(run_seed, "policy.admission"),
        kv_capacity_tokens: models.main.kv_capacity_tokens,
        facts: ctx.facts,
    }
}

/// What a scaler is told at creation on `spec`'s cluster (one pool; `spec.autoscaling` set).
pub fn scaler_context(spec: &ClusterSpec, models: &StepModels, run_seed: u64) -> routelab_policy_api::ScalerContext {
    let a = spec.autoscaling.as_ref().expect("a scaler runs on a cluster with autoscaling");
    routelab_policy_api::ScalerContext {
        world: World::Cluster,
        // A disaggregated cluster's prefill and decode pools, in that order.
        pools: if spec.disaggregation.is_some() { 2 } else { 1 },
        seed: stream_seed(run_seed, "policy.scaler"),
        interval_s: a.interval_s,
        model_load_s: a.model_load_s,
        kv_capacity_tokens: models.main.kv_capacity_tokens,
        facts: router_context_for(spec, models, run_seed).facts,
    }
}

/// What the host knows of each request of `stream` beyond its sizes: class, priority, tenant,
/// SLO bounds (the class's, else the cluster's), output length.
pub fn request_infos(spec: &ClusterSpec, stream: &RequestStream) -> Vec<RequestInfo> {
    (0..stream.len()).map(|i| request_info(&spec.classes, spec.slo.as_ref(), stream, i)).collect()
}

/// What the host knows of request `i` of `stream` ([`request_infos`]), for a workload with
/// `classes` and the cluster's `slo`.
pub fn request_info(classes: &[ClassSpec], slo: Option<&Slo>, stream: &RequestStream, i: usize) -> RequestInfo {
    let label = stream.label(i);
    let class = classes.get(label.class as usize);
    let slo = class.and_then(|c| c.slo.as_ref()).or(slo);
    RequestInfo {
        class: label.class,
        priority: class.map_or(0, |c| c.priority),
        tenant: label.tenant,
        slo_ttft_s: slo.and_then(|s| s.ttft_s).unwrap_or(f64::NAN),
        slo_tpot_s: slo.and_then(|s| s.tpot_s).unwrap_or(f64::NAN),
        output_tokens: stream.request(i).output_tokens,
        hint_output_tokens: stream.hint(i),
        session: stream.sessions.as_ref().map_or(f64::NAN, |s| s.session[i] as f64),
        adapter: stream.adapter(i).map_or(f64::NAN, |a| a as f64),
        model: stream.model(i),
        ..RequestInfo::plain()
    }
}

/// What replica `replica`'s scheduler is told at creation.
pub fn scheduler_context(sm: &StepModel, replica: u32, run_seed: u64) -> SchedulerContext {
    SchedulerContext {
        replica,
        seed: stream_seed(run_seed, &format!("policy.scheduler.{replica}")),
        kv_capacity_tokens: sm.kv_capacity_tokens,
        facts: RVec::new(),
    }
}

/// Every request of `stream` fits in the KV memory of one replica it may run on (prompt plus
/// output; [`StepModels::fit_for`] its model): a request that does not could never be admitted.
pub fn check_fits(models: &StepModels, stream: &RequestStream) -> Result<(), SetupError> {
    let model = |k: usize| stream.models.get(k).map_or(0, |&m| m as usize);
    (stream.base..)
        .zip(&stream.requests)
        .enumerate()
        .try_for_each(|(k, (i, r))| check_fit(models.fit_for(model(k)), i, r))
}

/// Request `i` (`r`) fits in one replica's KV memory.
pub fn check_fit(sm: &StepModel, i: usize, r: &GeneratedRequest) -> Result<(), SetupError> {
    if r.prompt_tokens as u64 + r.output_tokens as u64 > sm.kv_capacity_tokens {
        return Err(SetupError::new(
            "arrivals",
            format!(
                "request {i} needs {} prompt + {} output tokens of KV, more than a replica's capacity ({} tokens on {}, tp {})",
                r.prompt_tokens, r.output_tokens, sm.kv_capacity_tokens, sm.gpu.name, sm.tp
            ),
            "raise tp or use a GPU with more memory",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use routelab_policy_api::facts::context::{CLASSES_COUNT, ENGINE_CHUNK_TOKENS, METRICS_SCRAPE_INTERVAL_S};

    use super::*;

    #[test]
    fn a_gateway_tells_its_router_what_the_simulator_does_with_its_own_capacity_and_facts() {
        let yaml = "{replicas: 3, generator: {output_tokens: 1}, arrivals: {poisson: {rate: 1}}, requests: 2}";
        let spec: ClusterSpec = serde_norway::from_str(yaml).unwrap();
        let sm = spec.step_model().unwrap();
        let sim = router_context(&sm, 3, 7);
        let gw = gateway_router_context(&sm, 3, 7, 4_096, 0.25);
        // The same seed derivation and cost model: `--seed 7` draws what `seed: 7` draws.
        assert_eq!((gw.world, gw.replicas, gw.seed), (sim.world, sim.replicas, sim.seed));
        assert_ne!(gw.seed, 7, "the router's stream is derived from the run seed, not the run seed itself");
        assert_eq!(format!("{:?}", gw.cost), format!("{:?}", sim.cost));
        assert_eq!(gw.kv_capacity_tokens, 4_096);
        assert_eq!(gw.fact(METRICS_SCRAPE_INTERVAL_S), Some(0.25));
        assert_eq!(gw.fact(CLASSES_COUNT), Some(1.0));
        assert_eq!(gw.fact(ENGINE_CHUNK_TOKENS), None, "the engines' budgets are not the gateway's to state");
    }
}
