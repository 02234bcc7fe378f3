//! `aibrix_lora`: AIBrix's LoRA routing — the model-adapter controller places each adapter on
//! pods, and the gateway routes a request for the adapter among the pods that hold it.
//!
//! Algorithm (per request; load = running requests, counted by the gateway itself):
//! 1. A request on the base model (request fact `adapter` NaN) goes to the least-loaded replica,
//!    ties uniformly at random (`least-request`).
//! 2. A request on adapter `a`: with `adapter_replicas: one`, `a` is placed on first sight on
//!    the replica holding the fewest adapters, the lowest index on ties (the controller's
//!    `leastAdapters` scheduler, run when the `ModelAdapter` appears: here, when its first
//!    request does), and every request on `a` goes there — the gateway's candidates are the
//!    pods of the adapter's service, one pod. With `adapter_replicas: all` every replica holds
//!    every adapter and the request goes to the least-loaded replica, as a base request.
//!
//! Parameters (defaults): `adapter_replicas` one (`one` | `all`).
//!
//! Source: vllm-project/aibrix @ e3e10f9e: `pkg/controller/modeladapter/modeladapter_controller.go`
//! (`reconcileReplicas`: `spec.replicas` nil loads on all matching pods, 1 on one pod chosen by
//! the scheduler; `DefaultModelAdapterSchedulerPolicy = "leastAdapters"`),
//! `pkg/controller/modeladapter/scheduling/least_adapters.go` (fewest `ListModelsByPod`, strict
//! `<` in list order), `api/model/v1alpha1/modeladapter_types.go` (`Replicas`: nil or 1),
//! `pkg/plugins/gateway/gateway_req_body.go` (`ListPodsByModel(model)`: the adapter's pods are
//! the candidates) and `pkg/plugins/gateway/algorithms/least_request.go` (fewest
//! `realtime_num_requests_running`, ties at random).
//!
//! Deviations, and why:
//! - Upstream places an adapter when its `ModelAdapter` object is created, before traffic; the
//!   router learns an adapter from its first request, so placement is in order of first request
//!   (with `leastAdapters`' tie rule this deals adapters round-robin over the replicas).
//! - Upstream loads a placed adapter through vLLM's runtime API once; the replica's adapter
//!   cache (`cluster.lora.max_cpu_loras`) may still evict it, and the next request then loads it
//!   again — vLLM's LRU does the same to a runtime-loaded adapter.
//! - `adapter_replicas: one` is not upstream's recommended default (nil: all pods), which leaves
//!   routing to the gateway algorithm alone; it is the mode in which AIBrix routes by adapter.
//! - A replica index beyond the current replicas (a fleet that shrank) is placed again.

use routelab_policy_api::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum AdapterReplicas {
    One,
    All,
}

#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub adapter_replicas: AdapterReplicas,
}

impl Default for Config {
    fn default() -> Self {
        Self { adapter_replicas: AdapterReplicas::One }
    }
}

/// No replica yet.
const UNPLACED: u32 = u32::MAX;

pub struct AibrixLora {
    cfg: Config,
    rng: PolicyRng,
    /// Per adapter: its replica ([`UNPLACED`] before its first request).
    home: Vec<u32>,
    /// Per replica: adapters placed there.
    placed: Vec<u32>,
    /// Per replica: requests routed there and not yet complete.
    running: Vec<u32>,
}

impl Policy for AibrixLora {
    const NAME: &'static str = "aibrix_lora";
    const DESCRIPTION: &'static str =
        "AIBrix LoRA routing: each adapter on the replica with the fewest adapters, its requests there";
    type Config = Config;
    type Context = RouterContext;
    fn new(cfg: Config, ctx: &RouterContext) -> Result<Self, String> {
        let n = ctx.replica_count();
        Ok(Self { cfg, rng: policy_rng(ctx.seed), home: Vec::new(), placed: vec![0; n], running: vec![0; n] })
    }
}

impl AibrixLora {
    /// The replica of adapter `a` among `n`, placing it first if it has none there.
    fn place(&mut self, a: usize, n: usize) -> usize {
        if self.home.len() <= a {
            self.home.resize(a + 1, UNPLACED);
        }
        self.placed.resize(n.max(self.placed.len()), 0);
        let h = self.home[a] as usize;
        if h < n {
            return h;
        }
        // leastAdapters: the fewest, the first on ties.
        let r = (0..n).min_by_key(|&r| (self.placed[r], r)).expect("replicas");
        self.placed[r] += 1;
        self.home[a] = r as u32;
        r
    }
}

impl RouterPolicy for AibrixLora {
    fn request_facts(&self) -> Vec<String> {
        vec![facts::request::ADAPTER.into()]
    }

    fn route(&mut self, request: &Request<'_>, replicas: &Replicas<'_>) -> usize {
        let n = replicas.len();
        self.running.resize(n.max(self.running.len()), 0);
        let adapter = request.facts().first().filter(|a| !a.is_nan()).map(|&a| a as usize);
        match (adapter, self.cfg.adapter_replicas) {
            (Some(a), AdapterReplicas::One) => self.place(a, n),
            _ => argmin_random_tie(self.running[..n].iter().copied(), &mut self.rng).expect("replicas"),
        }
    }

    fn on_dispatch(&mut self, _request: &Request<'_>, r: usize) {
        if self.running.len() <= r {
            self.running.resize(r + 1, 0);
        }
        self.running[r] += 1;
    }

    fn on_complete(&mut self, c: &Completion) {
        if let Some(l) = self.running.get_mut(c.replica_index()) {
            *l = l.saturating_sub(1);
        }
    }

    fn report(&self) -> Vec<(String, f64)> {
        let placed = self.home.iter().filter(|&&h| h != UNPLACED).count();
        vec![("router_adapters_placed".into(), placed as f64)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn router(adapter_replicas: AdapterReplicas, n: u32) -> AibrixLora {
        AibrixLora::new(Config { adapter_replicas }, &RouterContext::new(World::Cluster, n, 7)).unwrap()
    }

    fn route(p: &mut AibrixLora, id: u64, adapter: f64, views: &[ReplicaView]) -> usize {
        let facts = [adapter];
        let req = Request::new(id, 0.0, 100).with_facts(&facts);
        let r = p.route(&req, &Replicas::new(views));
        p.on_dispatch(&req, r);
        r
    }

    /// leastAdapters with strict `<`: adapters go to the replica with the fewest, the first on
    /// ties — so in order of first request they deal out 0, 1, 2, 0, …; a placed adapter's
    /// requests all go to its replica whatever the load; base requests go to the least loaded.
    #[test]
    fn adapters_placed_on_the_fewest_and_requests_follow_them() {
        let views = vec![ReplicaView::default(); 3];
        let mut p = router(AdapterReplicas::One, 3);
        let homes: Vec<usize> = [5.0, 9.0, 1.0, 2.0, 5.0, 5.0, 9.0]
            .iter()
            .enumerate()
            .map(|(i, &a)| route(&mut p, i as u64, a, &views))
            .collect();
        assert_eq!(homes, [0, 1, 2, 0, 0, 0, 1]);
        // Replica 0 now has 4 in flight, 1 has 2, 2 has 1: a base request goes to 2.
        assert_eq!(route(&mut p, 10, f64::NAN, &views), 2);
        assert_eq!(p.report(), vec![("router_adapters_placed".to_string(), 4.0)]);
        let mut p2 = router(AdapterReplicas::All, 3);
        for i in 0..30 {
            let r = route(&mut p2, i, 3.0, &views);
            assert!(r < 3);
        }
        // `all`: adapter requests balance like base ones: 30 requests, 10 each.
        assert_eq!(p2.running, [10, 10, 10]);
    }

    #[test]
    fn a_fleet_that_shrank_places_again() {
        let mut p = router(AdapterReplicas::One, 4);
        let four = vec![ReplicaView::default(); 4];
        let homes: Vec<usize> = (0..4).map(|a| route(&mut p, a, a as f64, &four)).collect();
        assert_eq!(homes, [0, 1, 2, 3]);
        let two = vec![ReplicaView::default(); 2];
        // Adapter 3's replica is gone: placed again on the first of the two with fewest (1 each).
        assert_eq!(route(&mut p, 9, 3.0, &two), 0);
        assert_eq!(route(&mut p, 10, 1.0, &two), 1);
    }
}
