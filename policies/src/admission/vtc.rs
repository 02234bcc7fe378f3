//! `vtc`: virtual token counter fairness between tenants, at the gateway.
//!
//! Algorithm (Sheng et al., "Fairness in Serving Large Language Models", OSDI'24; the artifact's
//! queue `slora/server/router/vtc_req_queue.py`, Ying1123/VTC-artifact commit
//! 14c19b70065950006a223b830e5e4b70dd13a62e, `VTCReqQueue`):
//! - one counter per tenant (the request fact `tenant`), the service it has been given;
//! - a request joins its tenant's FIFO queue; when that queue was empty, the tenant's counter is
//!   *lifted* to `max(own, min of the counters of the other tenants with queued requests)`, so a
//!   tenant that was idle cannot bank credit (`append`);
//! - whenever capacity frees, the tenant with the smallest counter among those with queued
//!   requests sends its oldest request, and its counter grows by `prompt tokens × input_price /
//!   weight` (`generate_new_batch`);
//! - each generated token adds `output_price / weight` (`update_counter`).
//!
//! Parameters (defaults): `input_price` 1 and `output_price` 2 (the artifact's defaults, and
//! AIBrix's `defaultInputTokenWeight`/`defaultOutputTokenWeight`); `weights` per tenant index
//! (empty: all 1; the workload's `tenants:` weights are not told to policies, so repeat them
//! here); the dispatch gate `queue_depth_threshold` 5 and `kv_cache_util_threshold` 0.8 (the
//! detector's defaults, on vLLM's KV usage: see [`super::dispatch_paused`]).
//!
//! routelab: the artifact's queue sits inside the engine and dispatches while the batch has
//! memory; here it sits at the gateway in front of the router, and "capacity frees" is the
//! inference extension's saturation detector saying the pool is not saturated (the gate its flow
//! control puts in front of its own VTC fairness policy,
//! `pkg/epp/framework/plugins/flowcontrol/fairness/vtc/vtc.go`, kubernetes-sigs/
//! gateway-api-inference-extension commit b0130c3906ae261380bacace0dca6ca8ba416693). A request
//! arriving while nothing is held and the pool is not saturated goes at once (it would be the
//! only one in the queue); one arriving while requests are held waits its turn, released at the
//! next step end. Output tokens are charged when the request completes (the gateway hears of
//! them then), not token by token. AIBrix's `vtc-basic` (`pkg/plugins/gateway/algorithms/vtc/
//! vtc_basic.go`, vllm-project/aibrix commit 0d536acf6984119e86b716cf4fbca07a44cafcf1) keeps the
//! same counters (a sliding window of `input + 2 × output` tokens per user) but uses them to pick
//! a pod, not an order; its routing half is not this policy. Ties between equal counters go to
//! the lowest tenant index (the artifact's `min` takes the first tenant it met).

use std::collections::{HashMap, VecDeque};

use routelab_policy_api::{
    AdmissionContext, AdmissionDecision, AdmissionPolicy, Completion, Policy, Replicas, Request, facts,
};
use serde::{Deserialize, Serialize};

use super::{check_kv_threshold, dispatch_paused};

/// Prices, weights and the dispatch gate of [`Vtc`].
#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct VtcConfig {
    /// Counter units per prompt token (the artifact's default 1).
    pub input_price: f64,
    /// Counter units per output token (the artifact's default 2).
    pub output_price: f64,
    /// Weight per tenant index (missing tenants: 1); a tenant's counter grows by cost / weight.
    pub weights: Vec<f64>,
    /// The dispatch gate: a replica with more waiting requests than this has no capacity.
    pub queue_depth_threshold: u32,
    /// The dispatch gate: a replica with a KV utilisation above this has no capacity.
    pub kv_cache_util_threshold: f64,
}

impl Default for VtcConfig {
    fn default() -> Self {
        Self {
            input_price: 1.0,
            output_price: 2.0,
            weights: Vec::new(),
            queue_depth_threshold: 5,
            kv_cache_util_threshold: 0.8,
        }
    }
}

/// Virtual token counter fairness (see the module documentation).
pub struct Vtc {
    config: VtcConfig,
    /// Per tenant: the counter.
    counters: Vec<f64>,
    /// Per tenant: held requests (id, prompt tokens), oldest first.
    queues: Vec<VecDeque<(u64, u32)>>,
    held: usize,
    /// Admitted and not finished: id → tenant (to charge its output when it completes).
    in_flight: HashMap<u64, usize>,
}

impl Policy for Vtc {
    const NAME: &'static str = "vtc";
    const DESCRIPTION: &'static str = "virtual token counter fairness (VTC, OSDI'24): while saturated, hold; release the least-served tenant's oldest";
    type Config = VtcConfig;
    type Context = AdmissionContext;
    fn new(config: VtcConfig, ctx: &AdmissionContext) -> Result<Self, String> {
        let prices_ok = |p: f64| p >= 0.0 && p.is_finite();
        if !prices_ok(config.input_price) || !prices_ok(config.output_price) {
            return Err(format!(
                "input_price and output_price must be finite and ≥ 0 (got {:?}, {:?})",
                config.input_price, config.output_price
            ));
        }
        if let Some(w) = config.weights.iter().find(|w| !(**w > 0.0 && w.is_finite())) {
            return Err(format!("every weight must be finite and > 0 (got {w:?})"));
        }
        check_kv_threshold(config.kv_cache_util_threshold)?;
        let tenants = ctx.fact(facts::context::TENANTS_COUNT).unwrap_or(1.0).max(1.0) as usize;
        Ok(Self {
            config,
            counters: vec![0.0; tenants],
            queues: vec![VecDeque::new(); tenants],
            held: 0,
            in_flight: HashMap::new(),
        })
    }
}

impl Vtc {
    fn weight(&self, tenant: usize) -> f64 {
        self.config.weights.get(tenant).copied().unwrap_or(1.0)
    }

    fn grow(&mut self, tenant: usize) {
        if tenant >= self.counters.len() {
            self.counters.resize(tenant + 1, 0.0);
            self.queues.resize(tenant + 1, VecDeque::new());
        }
    }

    /// `tenant`'s request `id` of `prompt` tokens is sent: its counter pays for the prompt.
    fn send(&mut self, tenant: usize, id: u64, prompt: u32) {
        self.counters[tenant] += prompt as f64 * self.config.input_price / self.weight(tenant);
        self.in_flight.insert(id, tenant);
    }

    /// The tenant with the smallest counter among those with held requests (lowest index on ties).
    fn least_served(&self) -> Option<usize> {
        let mut best: Option<usize> = None;
        for (t, q) in self.queues.iter().enumerate() {
            if !q.is_empty() && best.is_none_or(|b| self.counters[t] < self.counters[b]) {
                best = Some(t);
            }
        }
        best
    }

    /// The tenants' counters (for tests and reports).
    pub fn counters(&self) -> &[f64] {
        &self.counters
    }

    fn gate(&self, replicas: &Replicas<'_>) -> bool {
        dispatch_paused(replicas, self.config.queue_depth_threshold, self.config.kv_cache_util_threshold)
    }
}

impl AdmissionPolicy for Vtc {
    fn request_facts(&self) -> Vec<String> {
        vec![facts::request::TENANT.into()]
    }

    fn on_arrival(&mut self, req: &Request<'_>, replicas: &Replicas<'_>) -> AdmissionDecision {
        let tenant = req.fact(0) as usize;
        self.grow(tenant);
        if self.held == 0 && !self.gate(replicas) {
            self.send(tenant, req.id, req.prompt_tokens);
            return AdmissionDecision::admit();
        }
        if self.queues[tenant].is_empty() {
            // Lift: an idle tenant comes back at the least-served backlogged tenant's level.
            let others = self.queues.iter().enumerate().filter(|(t, q)| *t != tenant && !q.is_empty());
            if let Some(min) = others.map(|(t, _)| self.counters[t]).min_by(f64::total_cmp) {
                self.counters[tenant] = self.counters[tenant].max(min);
            }
        }
        self.queues[tenant].push_back((req.id, req.prompt_tokens));
        self.held += 1;
        AdmissionDecision::hold(tenant as u32)
    }

    fn next(&mut self, _now: f64, replicas: &Replicas<'_>) -> AdmissionDecision {
        if self.held == 0 || self.gate(replicas) {
            return AdmissionDecision::wait();
        }
        let t = self.least_served().expect("requests are held");
        let (id, prompt) = self.queues[t].pop_front().expect("a non-empty queue");
        self.held -= 1;
        self.send(t, id, prompt);
        AdmissionDecision::release(id)
    }

    fn on_complete(&mut self, c: &Completion) {
        if let Some(t) = self.in_flight.remove(&c.request_id) {
            self.counters[t] += c.output_tokens as f64 * self.config.output_price / self.weight(t);
        }
    }

    fn report(&self) -> Vec<(String, f64)> {
        let (lo, hi) = self.counters.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &c| (l.min(c), h.max(c)));
        vec![("counter_spread".into(), if self.counters.is_empty() { 0.0 } else { hi - lo })]
    }
}

#[cfg(test)]
mod tests {
    use routelab_policy_api::{Fact, ReplicaView, World};

    use super::*;

    fn completion(id: u64, output: u32) -> Completion {
        Completion {
            request_id: id,
            replica: 0,
            arrived_at: 0.0,
            completed_at: 1.0,
            ttft: 0.1,
            prompt_tokens: 0,
            cached_tokens: 0,
            output_tokens: output,
        }
    }

    /// By hand, three tenants, weights 1, 2, 1, prices 1 and 2, one replica:
    /// - free pool, nothing held: tenant 0's 100-token request goes at once → c0 = 100;
    /// - saturated (6 waiting > 5): tenant 0's 50 and tenant 1's 40 are held; tenant 1's queue
    ///   was empty and tenant 0 is backlogged at 100 → c1 lifted 0 → 100;
    /// - request 1 completes with 10 output tokens → c0 = 100 + 10 × 2 = 120;
    /// - still saturated: `next` waits; free: `next` picks tenant 1 (100 < 120), c1 = 100 + 40/2
    ///   = 120; then tie 120 = 120 → tenant 0 (lowest index), c0 = 170; then nothing held: wait;
    /// - tenant 2 arrives while tenant 1 holds one at 120: lifted 0 → 120.
    #[test]
    fn vtc_lifts_idle_tenants_and_releases_the_least_served() {
        let mut ctx = AdmissionContext::new(World::Cluster, 1, 1);
        ctx.facts.push(Fact::new(facts::context::TENANTS_COUNT, 3.0));
        // The detector's KV threshold 0.8 (upstream's), to see the idle-replica rule at the end.
        let config = VtcConfig { weights: vec![1.0, 2.0, 1.0], kv_cache_util_threshold: 0.8, ..VtcConfig::default() };
        let mut p = Vtc::new(config, &ctx).unwrap();
        let free = [ReplicaView { kv_capacity_tokens: 1000, ..ReplicaView::default() }];
        let busy =
            [ReplicaView { waiting: 6, outstanding_requests: 6, kv_capacity_tokens: 1000, ..ReplicaView::default() }];
        let (free, busy) = (Replicas::new(&free), Replicas::new(&busy));
        let arrive = |p: &mut Vtc, id: u64, tenant: f64, prompt: u32, views: &Replicas<'_>| {
            let f = [tenant];
            p.on_arrival(&Request::new(id, 0.0, prompt).with_facts(&f), views)
        };
        assert_eq!(arrive(&mut p, 1, 0.0, 100, &free), AdmissionDecision::admit());
        assert_eq!(p.counters(), &[100.0, 0.0, 0.0]);
        assert_eq!(arrive(&mut p, 2, 0.0, 50, &busy), AdmissionDecision::hold(0));
        assert_eq!(arrive(&mut p, 3, 1.0, 40, &busy), AdmissionDecision::hold(1));
        assert_eq!(p.counters(), &[100.0, 100.0, 0.0]);
        p.on_complete(&completion(1, 10));
        assert_eq!(p.counters(), &[120.0, 100.0, 0.0]);
        assert_eq!(p.next(1.0, &busy), AdmissionDecision::wait());
        assert_eq!(p.next(1.0, &free), AdmissionDecision::release(3));
        assert_eq!(p.counters(), &[120.0, 120.0, 0.0]);
        assert_eq!(p.next(1.0, &free), AdmissionDecision::release(2));
        assert_eq!(p.counters(), &[170.0, 120.0, 0.0]);
        assert_eq!(p.next(1.0, &free), AdmissionDecision::wait());
        assert_eq!(arrive(&mut p, 4, 1.0, 10, &busy), AdmissionDecision::hold(1));
        assert_eq!(arrive(&mut p, 5, 2.0, 10, &busy), AdmissionDecision::hold(2));
        assert_eq!(p.counters(), &[170.0, 120.0, 120.0]);
        // A completion of a request VTC never admitted changes nothing.
        p.on_complete(&completion(99, 1000));
        assert_eq!(p.counters(), &[170.0, 120.0, 120.0]);
        // An idle replica whose cache fills 900 of 1000 KV tokens (> 0.8: "saturated") still
        // takes work: tenants 1 and 2 tie at 120 → tenant 1's request 4; one running request on it
        // makes it busy, and the gate holds.
        let idle_full = [ReplicaView { kv_used_tokens: 900, kv_capacity_tokens: 1000, ..ReplicaView::default() }];
        assert_eq!(p.next(2.0, &Replicas::new(&idle_full)), AdmissionDecision::release(4));
        let running_full = [ReplicaView { running: 1, outstanding_requests: 1, ..idle_full[0] }];
        assert_eq!(p.next(2.0, &Replicas::new(&running_full)), AdmissionDecision::wait());
    }
}
