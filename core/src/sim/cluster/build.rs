//! Building a run: the stream checked against every pool's replicas, the replicas, schedulers,
//! scrapes, disaggregation, tiers, adapters and the window of held requests wired together.

use super::*;

impl<'a> ClusterSim<'a> {
    /// Checks the stream against the replicas (every request must fit in one replica's KV) and
    /// wires `router` (labelled `label` in errors) and `schedulers`, one per replica slot. `models` are
    /// `spec`'s resolved step models.
    pub fn build(
        spec: &ClusterSpec,
        models: &StepModels,
        stream: impl Into<Feed<'a>>,
        router: RouterBox,
        schedulers: Schedulers,
        label: &str,
    ) -> Result<Self, SetupError> {
        // Slots: `autoscaling.max_replicas`, else `replicas`; the first `replicas` start ready.
        let n = spec.slots() as usize;
        if schedulers.boxes.len() != n {
            return Err(SetupError::new(
                "scheduler",
                format!("{} schedulers for {n} replicas", schedulers.boxes.len()),
                "give one scheduler per replica",
            ));
        }
        // Several models: this router is model 0's, bounded by its replicas (`models.rs`).
        let bound = if spec.models.len() > 1 { spec.models[0].replicas } else { spec.replicas };
        let mut router = RouterHandle::new(router, bound, World::Cluster, label);
        // Every change to a view goes through `refresh_views` (`slots.rs`), which names it: the
        // signal table refills only those rows.
        router.track_view_changes();
        let caps = router.capabilities();
        let pools = match &spec.disaggregation {
            Some(d) => {
                if !caps.disaggregated() {
                    return Err(SetupError::new(
                        "disaggregation",
                        format!("policy '{label}' is not a disaggregation router, and this cluster is disaggregated"),
                        format!(
                            "use a PD router (pd_dynamo, pd_llm_d, pd_aibrix, pd_mooncake, pd_random, pd_round_robin, pd_least_loaded), or compose: \"pd_sglang{{prefill: {0}, decode: {0}}}\"",
                            label
                        ),
                    ));
                }
                check_mixed_changes(spec, caps, label)?;
                let pd = models.pd.as_ref().expect("the step models of this spec (`StepModels::resolve`)");
                Some((d, &pd.prefill, &pd.decode, &pd.mixed))
            }
            None if caps.disaggregated() => {
                return Err(SetupError::new(
                    "disaggregation",
                    format!("policy '{label}' is a disaggregation router, and this cluster is aggregated"),
                    "add a `disaggregation:` section (prefill and decode pools, link), or use an aggregated router",
                ));
            }
            None => None,
        };
        let sm = &models.main;
        let (psm, dsm, msm) = pools.map_or((sm, sm, sm), |(_, p, d, m)| (p, d, m));
        let mut stream: Feed<'a> = stream.into();
        let (total, sessions) = (stream.len(), stream.sessions.is_some());
        // Request ids are `u32` (`RequestId`): every id below `total` must fit.
        if total > u32::MAX as usize {
            return Err(SetupError::new(
                "requests",
                format!("{total} requests in one run"),
                format!("generate at most {} requests", u32::MAX),
            ));
        }
        // A disaggregated cluster's own figures and an agent session's makespan read every
        // record (their state is per request).
        let exact = spec.summary.exact(total) || spec.disaggregation.is_some() || sessions;
        let retiring = !exact && !spec.keeps_request_state();
        if stream.needs_fit_check() {
            check_fits(models, &stream)?;
        }
        let gpu_pools = &models.pools;
        let pool_cfg = |sm: &StepModel| ReplicaConfig {
            kv_capacity_tokens: sm.kv_capacity_tokens,
            step_prefill_budget: if spec.chunk_tokens == 0 { spec.max_step_tokens } else { spec.chunk_tokens },
            budget_counts_decode: spec.budget_counts_decode,
            max_batch_requests: spec.max_batch_requests,
            reservation: spec.reservation.clone(),
            preemption: spec.preemption,
            scheduler_window: spec.scheduler_window,
            track_pending: caps.needs_exact_match(),
            report_evictions: caps.wants_evictions(),
            async_scheduling: sm.calibration.as_ref().is_some_and(|c| c.async_scheduling),
        };
        // On a disaggregated cluster the tiers sit under the instances that prefill (prefill-only
        // and mixed): a decode-only instance's cache holds what transfers bring.
        // With autoscaling each pool has its `max_replicas` slots (prefill first), the first
        // `instances` of each up at the start.
        let pd_slots = spec
            .autoscaling
            .as_ref()
            .and_then(|a| a.pools.as_ref())
            .map(|p| (p.prefill.max_replicas, p.decode.max_replicas));
        let prefill_slots = |d: &crate::workload::cluster::disaggregation::Disaggregation| {
            pd_slots.map_or(d.prefill.instances, |(p, _)| p)
        };
        let tiered = |r: u32| pools.as_ref().is_none_or(|(d, ..)| r < prefill_slots(d) + d.mixed_instances());
        let mut replicas: Vec<Replica> = (0..n as u32)
            .map(|r| match &spec.kv_tiers {
                Some(t) if tiered(r) => Replica::with_tiers(
                    ReplicaId::from_u32(r),
                    ReplicaTiers::new(t, sm.cost.kv_bytes_per_token, sm.model.layers),
                ),
                _ => Replica::new(ReplicaId::from_u32(r)),
            })
            .collect();
        if let Some(l) = lora::tracked(spec)? {
            for r in &mut replicas {
                r.track_adapters(l);
            }
        }
        let last_arrival = stream.last_arrival();
        let scrape_interval = (router.reads_scrapes() && spec.metrics.scrape_interval_s > 0.0)
            .then(|| ticks(spec.metrics.scrape_interval_s).max(SimTime::TICK));
        let mut schedulers: Vec<SchedulerHandle> = schedulers.into_handles();
        let priority_preemption = spec.preemption == Preemption::Priority;
        if !retiring || schedulers.iter().any(|s| s.reads_facts()) || priority_preemption {
            stream.hold_all();
        }
        if schedulers.iter().any(|s| s.reads_facts()) || priority_preemption {
            // A scheduler that reads request facts reads them by id, of every request (and so
            // does priority preemption, through the handle).
            let infos: std::sync::Arc<[RequestInfo]> = request_infos(spec, &stream).into();
            for s in &mut schedulers {
                s.set_infos(infos.clone());
            }
        }
        // Step ends wait in one slot per replica, outside the heap (`EventQueue::with_slots`), on
        // up to 16 slots: on 1,000 mostly idle replicas the tree's 10-level paths cost more than
        // the heap of the busy ones' step ends (docs/performance.md); above, every event is heaped.
        let slots = if n <= 16 { n } else { 0 };
        let mut queue = EventQueue::with_slots(slots, |k| Event::StepEnd(ReplicaId::from_u32(k)));
        if scrape_interval.is_some() {
            // The first scrape at time 0, before any arrival (events run before arrivals at a tie).
            queue.push(SimTime::ZERO, Event::Scrape);
        }
        let waiting_for =
            stream.sessions.as_ref().map_or_else(Vec::new, |s| s.after.iter().map(|r| r.len() as u32).collect());
        let dependents = stream.sessions.as_ref().map_or_else(Vec::new, |s| {
            let mut d = vec![Vec::new(); total];
            for i in 0..total {
                for &p in s.parents(i) {
                    d[p as usize].push(RequestId::new(i));
                }
            }
            d
        });
        let done_state = RequestState { phase: Phase::Done, ..Default::default() };
        let mut sim = Self {
            scrape_interval,
            stream,
            cfgs: ByPool {
                prefill: pool_cfg(psm),
                decode: pool_cfg(dsm),
                mixed: pool_cfg(msm),
                gpu: gpu_pools.iter().map(pool_cfg).collect(),
            },
            pricers: ByPool {
                prefill: psm.pricer,
                decode: dsm.pricer,
                mixed: msm.pricer,
                gpu: gpu_pools.iter().map(|m| m.pricer).collect(),
            },
            gpu_pool: spec.replica_pools(),
            pd: pools.map(|(d, _, dm, _)| Pd::new(d, pd_slots, dm.cost.kv_bytes_per_token, dm.model.layers, total)),
            eviction_delay: ticks(spec.eviction_delay_s),
            horizon: last_arrival.saturating_add(ticks(spec.drain_s)),
            router,
            schedulers,
            replicas: super::slots::Slots::new(replicas),
            states: Window::new(super::kept::Kept::Here(done_state)),
            queue,
            views: vec![ReplicaView::default(); spec.replicas as usize],
            completed: Vec::new(),
            next: 0,
            arrived: 0,
            last_arrived: RequestId::default(),
            waiting_for,
            dependents,
            done: 0,
            probes: Probes {
                half: total / 2,
                waiting_at_half: 0,
                waiting_at_end: 0,
                sample_every: (total / 20).max(1),
                replication: Replication::default(),
            },
            slo: spec.slo.clone(),
            admission: None,
            infos: Window::new(RequestInfo::plain()),
            ends: Window::new(End::Served),
            dispatched_at: Window::new(SimTime::ZERO),
            classes: spec.classes.clone(),
            tenants: spec.tenants.clone(),
            admission_metrics: spec.admission.trim() != "admit_all",
            remote_tier: spec
                .kv_tiers
                .as_ref()
                .and_then(|t| t.remote.as_ref())
                .map(|r| KvTier::new(r, sm.cost.kv_bytes_per_token)),
            exact,
            lockstep: spec.lockstep_group().max(1) as usize,
            group_busy: vec![false; n / spec.lockstep_group().max(1) as usize],
            tally: Tally::new(exact, spec.classes.clone(), spec.tenants.clone(), spec.slo.clone().map(Cow::Owned)),
            retiring,
            routable: match (pd_slots, &spec.disaggregation) {
                // The prefill instances up, then the decode ones (`Pd::r_decode_start`).
                (Some((p, _)), Some(d)) => {
                    (0..d.prefill.instances).chain(p..p + d.decode.instances).map(ReplicaId::from_u32).collect()
                }
                _ => (0..spec.replicas).map(ReplicaId::from_u32).collect(),
            },
            index_of: (0..n).map(RouterIndex::new).collect(),
            routable_since: vec![SimTime::ZERO; n],
            fleet: None,
            autoscaling: spec.autoscaling.clone(),
            tier_spec: spec.kv_tiers.clone().map(|t| (t, sm.cost.kv_bytes_per_token, sm.model.layers)),
            cost_per_hour: spec.mean_cost_per_hour(),
            failures: None,
            models: super::models::Models::of(spec),
            runs: None,
            decode_runs: true,
        };
        for k in 0..sim.routable.len() {
            sim.index_of[sim.routable[k]] = RouterIndex::new(k);
        }
        if !sim.retiring {
            sim.held_up_to(total);
        }
        Ok(sim)
    }
}

/// A P/D router whose library predates policy-api 0.5.13 (no
/// [`routelab_policy_api::Capabilities::HEARS_MIXED_CHANGES`]) cannot hear a mixed instance leave both pools at once:
/// refused where mixed instances may crash.
pub(super) fn check_mixed_changes(
    spec: &ClusterSpec,
    caps: routelab_policy_api::Capabilities,
    label: &str,
) -> Result<(), SetupError> {
    let mixed = spec.disaggregation.as_ref().is_some_and(|d| d.mixed_instances() > 0);
    let crashes = spec.failures.as_ref().is_some_and(|f| f.has_crashes());
    if mixed && crashes && !caps.contains(routelab_policy_api::Capabilities::HEARS_MIXED_CHANGES) {
        return Err(SetupError::new(
            "failures",
            format!(
                "policy '{label}' cannot hear a mixed instance leave both pools at once (it was built against \
                 policy-api before 0.5.13), and this cluster's mixed instances may crash"
            ),
            "rebuild the router against routelab-policy-api 0.5.13 or later, or drop `mixed:` or the crashes",
        ));
    }
    Ok(())
}
