//! `llm_d_flow_control`: llm-d's Flow Control (the inference extension's flow controller).
//!
//! Algorithm (kubernetes-sigs/gateway-api-inference-extension; the flow controller llm-d's
//! inference scheduler runs):
//! - a request belongs to the flow `(fairness id, priority)` — here (tenant, class priority) —
//!   and waits in that flow's FIFO queue (the FCFS ordering policy); flows of one priority form
//!   a *band*;
//! - dispatch cycle (`dispatchCycle` in `pkg/epp/flowcontrol/controller/internal/processor.go`,
//!   commit 04a97e67f7807b7daa14f220c25884eabfd80ea6): bands from the highest priority to the
//!   lowest, strictly — the first band with a queued request dispatches one, one per cycle;
//!   nothing is dispatched while the saturation detector says the pool is saturated
//!   (`NewSaturationFilter` in `controller/internal/filter.go`, commit
//!   0fda1092770c88b548a644554710ff796c488dd0: "pause dispatching for all bands");
//! - inside a band the fairness policy picks the flow: `round_robin` (the default here,
//!   `round-robin-fairness-policy`, `pkg/epp/flowcontrol/framework/plugins/interflow/
//!   roundrobin.go` as in zetxqx/gateway-api-inference-extension commit
//!   f56f623875ea5db4d9a34859020d164b35802621: flows sorted by key, the first non-empty flow
//!   after the last one picked, cyclically) or `global_strict` (the flow whose head request
//!   arrived first, `besthead.go` with FCFS ordering — upstream's default);
//! - on arrival a request is rejected when its band's queue is at capacity
//!   (`hasCapacity` in `processor.go`; upstream counts bytes, here requests: `max_held_per_band`,
//!   0 = unbounded); a held request older than the TTL is evicted (shed) — upstream's
//!   `DefaultRequestTTL`, 0 = none, its default (`controller/config.go`, commit
//!   776120354f8ac2cd56e954bf0301176ccd42e016).
//!
//! Parameters (defaults): `fairness` round_robin, `queue_depth_threshold` 5 (the detector's
//! default), `kv_cache_util_threshold` 0.8 (the detector's default, on vLLM's KV usage: see
//! [`super::dispatch_paused`]), `max_held_per_band` 0, `ttl_s` 0.
//!
//! routelab: the controller dispatches as soon as a request is enqueued and the pool is not
//! saturated; here a request arriving with nothing held and the pool not saturated goes at once
//! (it would be dispatched in that very cycle), and one arriving while others are held waits for
//! the next step end, when the host asks `next` (each call is one dispatch cycle). Upstream
//! removes empty flows after a grace period; here flows stay registered, which keeps the
//! round-robin cursor where upstream's would be while the flow lives.

use std::collections::{BTreeMap, VecDeque};

use routelab_policy_api::{AdmissionContext, AdmissionDecision, AdmissionPolicy, Policy, Replicas, Request, facts};
use serde::{Deserialize, Serialize};

use super::{check_kv_threshold, dispatch_paused};

/// How a band picks among its flows.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Fairness {
    /// Take turns: the next non-empty flow after the last one picked, in key order.
    RoundRobin,
    /// The flow whose head request arrived first (FCFS across the band).
    GlobalStrict,
}

/// Fairness, gate, capacity and TTL of [`FlowControl`].
#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct FlowControlConfig {
    /// Fairness between the flows of one band.
    pub fairness: Fairness,
    /// The dispatch gate: a replica with more waiting requests than this has no capacity.
    pub queue_depth_threshold: u32,
    /// The dispatch gate: a replica with a KV utilisation above this has no capacity.
    pub kv_cache_util_threshold: f64,
    /// Most requests held in one band; an arrival beyond it is rejected (0: unbounded).
    pub max_held_per_band: u32,
    /// A held request waiting longer than this (seconds) is shed (0: never).
    pub ttl_s: f64,
}

impl Default for FlowControlConfig {
    fn default() -> Self {
        Self {
            fairness: Fairness::RoundRobin,
            queue_depth_threshold: 5,
            kv_cache_util_threshold: 0.8,
            max_held_per_band: 0,
            ttl_s: 0.0,
        }
    }
}

/// One priority band: its flows by fairness id (tenant), each a FIFO of (id, arrival).
struct Band {
    priority: i64,
    flows: BTreeMap<u32, VecDeque<(u64, f64)>>,
    /// The flow picked last (round-robin's cursor).
    last: Option<u32>,
    held: usize,
}

impl Band {
    /// The flow to dispatch from under `fairness`, if any flow has a request.
    fn pick(&self, fairness: Fairness) -> Option<u32> {
        match fairness {
            Fairness::RoundRobin => {
                let after = self.last.map_or(0, |l| l.saturating_add(1));
                let nonempty = |(k, q): (&u32, &VecDeque<_>)| (!q.is_empty()).then_some(*k);
                self.flows.range(after..).find_map(nonempty).or_else(|| self.flows.iter().find_map(nonempty))
            }
            Fairness::GlobalStrict => {
                let mut best: Option<(u32, f64)> = None;
                for (&k, q) in &self.flows {
                    if let Some(&(_, at)) = q.front()
                        && best.is_none_or(|(_, b)| at < b)
                    {
                        best = Some((k, at));
                    }
                }
                best.map(|(k, _)| k)
            }
        }
    }
}

/// llm-d's Flow Control (see the module documentation).
pub struct FlowControl {
    config: FlowControlConfig,
    /// Bands from the highest priority to the lowest.
    bands: Vec<Band>,
    held: usize,
    rejected: u64,
    expired: u64,
}

impl Policy for FlowControl {
    const NAME: &'static str = "llm_d_flow_control";
    const DESCRIPTION: &'static str = "llm-d Flow Control: a queue per flow (tenant × priority), strict priority bands, \
                                       round-robin (or strict) fairness between a band's flows, dispatch while not saturated";
    type Config = FlowControlConfig;
    type Context = AdmissionContext;
    fn new(config: FlowControlConfig, _: &AdmissionContext) -> Result<Self, String> {
        check_kv_threshold(config.kv_cache_util_threshold)?;
        if !(config.ttl_s >= 0.0 && config.ttl_s.is_finite()) {
            return Err(format!("ttl_s must be finite and ≥ 0 (got {:?}; 0 means no TTL)", config.ttl_s));
        }
        Ok(Self { config, bands: Vec::new(), held: 0, rejected: 0, expired: 0 })
    }
}

impl FlowControl {
    /// The band of `priority`, created in its place if new.
    fn band(&mut self, priority: i64) -> &mut Band {
        let k = match self.bands.iter().position(|b| b.priority <= priority) {
            Some(k) if self.bands[k].priority == priority => k,
            at => {
                let k = at.unwrap_or(self.bands.len());
                self.bands.insert(k, Band { priority, flows: BTreeMap::new(), last: None, held: 0 });
                k
            }
        };
        &mut self.bands[k]
    }

    /// A held request past its TTL at `now` (the oldest flow head found first), if any.
    fn expired_at(&self, now: f64) -> Option<(usize, u32)> {
        if self.config.ttl_s <= 0.0 {
            return None;
        }
        self.bands.iter().enumerate().find_map(|(b, band)| {
            band.flows
                .iter()
                .find_map(|(&f, q)| q.front().filter(|&&(_, at)| now - at > self.config.ttl_s).map(|_| (b, f)))
        })
    }

    fn pop(&mut self, b: usize, flow: u32) -> u64 {
        let band = &mut self.bands[b];
        let (id, _) = band.flows.get_mut(&flow).and_then(VecDeque::pop_front).expect("a non-empty flow");
        band.held -= 1;
        self.held -= 1;
        id
    }
}

impl AdmissionPolicy for FlowControl {
    fn request_facts(&self) -> Vec<String> {
        vec![facts::request::TENANT.into(), facts::request::PRIORITY.into()]
    }

    fn on_arrival(&mut self, req: &Request<'_>, replicas: &Replicas<'_>) -> AdmissionDecision {
        let (tenant, priority) = (req.fact(0) as u32, req.fact(1) as i64);
        let (cap, gate) = (
            self.config.max_held_per_band as usize,
            (self.config.queue_depth_threshold, self.config.kv_cache_util_threshold),
        );
        let held = self.held;
        let band = self.band(priority);
        if cap > 0 && band.held >= cap {
            self.rejected += 1;
            return AdmissionDecision::reject();
        }
        if held == 0 && !dispatch_paused(replicas, gate.0, gate.1) {
            return AdmissionDecision::admit();
        }
        band.flows.entry(tenant).or_default().push_back((req.id, req.arrived_at));
        band.held += 1;
        self.held += 1;
        AdmissionDecision::hold(tenant)
    }

    fn next(&mut self, now: f64, replicas: &Replicas<'_>) -> AdmissionDecision {
        if let Some((b, f)) = self.expired_at(now) {
            self.expired += 1;
            return AdmissionDecision::shed_held(self.pop(b, f));
        }
        if self.held == 0
            || dispatch_paused(replicas, self.config.queue_depth_threshold, self.config.kv_cache_util_threshold)
        {
            return AdmissionDecision::wait();
        }
        let fairness = self.config.fairness;
        let (b, flow) = self
            .bands
            .iter()
            .enumerate()
            .find_map(|(b, band)| band.pick(fairness).map(|f| (b, f)))
            .expect("requests are held");
        self.bands[b].last = Some(flow);
        AdmissionDecision::release(self.pop(b, flow))
    }

    fn report(&self) -> Vec<(String, f64)> {
        vec![("rejected".into(), self.rejected as f64), ("expired".into(), self.expired as f64)]
    }
}

#[cfg(test)]
mod tests {
    use routelab_policy_api::{ReplicaView, World};

    use super::*;

    fn arrive(
        p: &mut FlowControl,
        id: u64,
        at: f64,
        tenant: f64,
        priority: f64,
        views: &Replicas<'_>,
    ) -> AdmissionDecision {
        let f = [tenant, priority];
        p.on_arrival(&Request::new(id, at, 10).with_facts(&f), views)
    }

    /// By hand, saturated pool (6 waiting), arrivals (id: tenant, priority): 1: (0, 0), 2: (0,
    /// 0), 3: (1, 0), 4: (2, 0), 5: (1, 2), 6: (0, −1). Once free, round robin:
    /// band 2 first (strict) → 5; band 0 from the start: tenant 0 → 1, then after 0 → tenant 1
    /// → 3, after 1 → tenant 2 → 4, after 2 wraps → tenant 0 → 2; then band −1 → 6; then wait.
    /// A free pool with nothing held admits at once; a band at capacity rejects.
    #[test]
    fn flow_control_serves_bands_strictly_and_flows_in_turn() {
        let ctx = AdmissionContext::new(World::Cluster, 1, 1);
        let config = FlowControlConfig { max_held_per_band: 4, ..FlowControlConfig::default() };
        let mut p = FlowControl::new(config, &ctx).unwrap();
        let free = [ReplicaView { kv_capacity_tokens: 1000, ..ReplicaView::default() }];
        let busy =
            [ReplicaView { waiting: 6, outstanding_requests: 6, kv_capacity_tokens: 1000, ..ReplicaView::default() }];
        let (free, busy) = (Replicas::new(&free), Replicas::new(&busy));
        assert_eq!(arrive(&mut p, 0, 0.0, 0.0, 0.0, &free), AdmissionDecision::admit());
        for (id, t, prio) in [(1, 0.0, 0.0), (2, 0.0, 0.0), (3, 1.0, 0.0), (4, 2.0, 0.0), (5, 1.0, 2.0), (6, 0.0, -1.0)]
        {
            assert_eq!(arrive(&mut p, id, 0.0, t, prio, &busy), AdmissionDecision::hold(t as u32), "request {id}");
        }
        // Band 0 holds 4 = max_held_per_band: a fifth is rejected, even on a free pool.
        assert_eq!(arrive(&mut p, 7, 0.0, 3.0, 0.0, &free), AdmissionDecision::reject());
        assert_eq!(p.next(1.0, &busy), AdmissionDecision::wait());
        let order: Vec<u64> = std::iter::from_fn(|| {
            let d = p.next(1.0, &free);
            (d.action == AdmissionDecision::ADMIT).then_some(d.request)
        })
        .collect();
        assert_eq!(order, [5, 1, 3, 4, 2, 6]);
        assert_eq!(p.report(), vec![("rejected".to_string(), 1.0), ("expired".to_string(), 0.0)]);
    }

    /// Global strict picks the band's oldest head (arrivals 0.3 for tenant 0, 0.1 and 0.2 for
    /// tenant 1 → 2, 3, 1); with a TTL of 1 s, at 1.25 the request held since 0.2 has waited
    /// 1.05 s > 1: shed first, then the one since 0.3 (0.95 s) is released.
    #[test]
    fn flow_control_global_strict_and_ttl() {
        let ctx = AdmissionContext::new(World::Cluster, 1, 1);
        let busy = [ReplicaView { waiting: 6, outstanding_requests: 6, ..ReplicaView::default() }];
        let free = [ReplicaView::default()];
        let (free, busy) = (Replicas::new(&free), Replicas::new(&busy));
        let strict = FlowControlConfig { fairness: Fairness::GlobalStrict, ..FlowControlConfig::default() };
        let mut p = FlowControl::new(strict, &ctx).unwrap();
        for (id, at, t) in [(1, 0.3, 0.0), (2, 0.1, 1.0), (3, 0.2, 1.0)] {
            arrive(&mut p, id, at, t, 0.0, &busy);
        }
        let order: Vec<u64> = (0..3).map(|_| p.next(1.0, &free).request).collect();
        assert_eq!(order, [2, 3, 1]);
        let ttl = FlowControlConfig { ttl_s: 1.0, ..FlowControlConfig::default() };
        let mut p = FlowControl::new(ttl, &ctx).unwrap();
        arrive(&mut p, 1, 0.3, 0.0, 0.0, &busy);
        arrive(&mut p, 2, 0.2, 1.0, 0.0, &busy);
        assert_eq!(p.next(1.25, &busy), AdmissionDecision::shed_held(2));
        assert_eq!(p.next(1.25, &busy), AdmissionDecision::wait());
        assert_eq!(p.next(1.25, &free), AdmissionDecision::release(1));
    }
}
