//! `chwbl`: consistent hashing with bounded loads on a prompt's head (KubeAI's `PrefixHash`
//! strategy; SGLang model gateway's `prefix_hash` policy as an option).
//!
//! Algorithm (per request):
//! 1. Key = hash of the prompt's first `prefix_tokens` tokens (the whole prompt if shorter).
//! 2. The ring holds `virtual_nodes` points per replica, sorted by hash. Start at the first
//!    point at or after the key (wrapping round).
//! 3. A replica may take the request if `in_flight ≤ load_factor · (total_in_flight + 1) /
//!    replicas` (always when nothing is in flight), or, with `balance_abs_threshold` a > 0, if
//!    `in_flight ≤ max(that, (total + 1) / replicas + a)` (SGLang's margin).
//! 4. `overflow: walk` (KubeAI): walk clockwise to the first replica that may take it; if none
//!    may, the first point's replica. `overflow: least_load` (SGLang 1.13): the first point's
//!    replica if it may take it, else the least-loaded replica that may (lowest index on ties),
//!    else the first point's replica.
//!
//! Load = the router's own count of requests it dispatched and has not seen complete (both
//! upstreams count in-flight requests themselves).
//!
//! Parameters (defaults): `prefix_tokens` 256, `load_factor` 1.25, `virtual_nodes` 256,
//! `overflow` walk, `balance_abs_threshold` 0.
//!
//! Source: substratusai/kubeai @ 2f32ef49, `internal/loadbalancer/balance_chwbl.go` (walk, load
//! check with the "+1", 256 replicas per endpoint, xxhash) and `api/k8s/v1/model_types.go`
//! (defaults 125 %, 256, 100 characters); SGLang model gateway `smg` 1.13.0,
//! `src/policies/prefix_hash.rs` (256 tokens, load factor 1.25, absolute margin 10, least-load
//! overflow).
//!
//! Replicas coming and going (`on_replica_change`: crashes, autoscaling): the ring holds a
//! replica's points while it is routable, and a replica that leaves is forgotten with its
//! in-flight count, as KubeAI deletes a removed endpoint's points (`balance_chwbl.go` @
//! 8fbbb358, `chwblRemoveEndpoint`; `chwblAddEndpoint` for a new one) and divides the load
//! bound by the endpoints there are now (`chwblLoadOK`'s `len(g.endpoints)`). The ring is built once
//! over every slot the router may see, keyed by id (`index::members`); a walk skips the points
//! of ids not routable now, which is the ring without them. A replica that joins takes its id's
//! points (upstream a new pod's name hashes anew); the load average divides by the routable
//! count.
//!
//! Deviations, and why: KubeAI keys on the first 100 characters of the first *user* message; a
//! prompt here carries no roles, so the key is the prompt's head as in SGLang, and the default
//! length is SGLang's 256 tokens (KubeAI's 100 characters ≈ 25 tokens is `prefix_tokens: 25`).
//! A shared system prompt longer than the head therefore sends every request to the same ring
//! point, and only the load bound spreads them: that is what both upstreams would do with such
//! prompts. Ring points are SplitMix64 hashes of (replica, i), not xxhash of "name‖i".

use routelab_policy_api::*;
use serde::{Deserialize, Serialize};

use crate::index::members::{Member, Members};

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Overflow {
    /// KubeAI: clockwise to the next replica under the bound.
    Walk,
    /// SGLang: the least-loaded replica under the bound.
    LeastLoad,
}

#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub prefix_tokens: u32,
    pub load_factor: f64,
    pub virtual_nodes: u32,
    pub overflow: Overflow,
    pub balance_abs_threshold: u32,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            prefix_tokens: 256,
            load_factor: 1.25,
            virtual_nodes: 256,
            overflow: Overflow::Walk,
            balance_abs_threshold: 0,
        }
    }
}

pub struct Chwbl {
    cfg: Config,
    /// (point, replica id), sorted by point.
    ring: Vec<(u64, u32)>,
    /// Per id (`index::members`): requests in flight.
    in_flight: Vec<u32>,
    members: Members,
    /// Routable replicas at the last decision.
    routable: usize,
    total: u64,
    first_choice: u64,
    decisions: u64,
}

impl Policy for Chwbl {
    const NAME: &'static str = "chwbl";
    const DESCRIPTION: &'static str =
        "consistent hashing with bounded loads on the prompt's head (KubeAI, SGLang prefix_hash)";
    type Config = Config;
    type Context = RouterContext;
    fn new(cfg: Config, ctx: &RouterContext) -> Result<Self, String> {
        if cfg.prefix_tokens == 0 {
            return Err("prefix_tokens must be at least 1".into());
        }
        if !(cfg.load_factor >= 1.0 && cfg.load_factor.is_finite()) {
            return Err(format!("load_factor must be ≥ 1 (got {}); KubeAI's minimum is 100 %", cfg.load_factor));
        }
        if cfg.virtual_nodes == 0 {
            return Err("virtual_nodes must be at least 1 (KubeAI uses 256)".into());
        }
        let mut ring: Vec<(u64, u32)> = (0..ctx.replicas)
            .flat_map(|r| (0..cfg.virtual_nodes).map(move |i| (mix64(mix64(r as u64 + 1) ^ i as u64), r)))
            .collect();
        ring.sort_unstable();
        let n = ctx.replica_count();
        Ok(Self {
            cfg,
            ring,
            in_flight: vec![0; n],
            members: Members::new(n),
            routable: n,
            total: 0,
            first_choice: 0,
            decisions: 0,
        })
    }
}

impl Chwbl {
    /// Whether id `r` may take the request.
    fn load_ok(&self, r: usize) -> bool {
        if self.total == 0 {
            return true;
        }
        let avg = (self.total + 1) as f64 / self.routable as f64;
        let bound = (avg * self.cfg.load_factor).max(if self.cfg.balance_abs_threshold > 0 {
            avg + self.cfg.balance_abs_threshold as f64
        } else {
            0.0
        });
        self.in_flight[r] as f64 <= bound
    }

    /// The routable index of ring point `k`'s replica, if it is routable now.
    fn routable_at(&self, k: usize) -> Option<usize> {
        self.members.index_of(self.ring[k].1 as usize).filter(|&i| i < self.routable)
    }
}

impl RouterPolicy for Chwbl {
    fn route(&mut self, request: &Request<'_>, replicas: &Replicas<'_>) -> usize {
        self.decisions += 1;
        self.routable = replicas.len();
        let key = prefix_hash(request.segments(), self.cfg.prefix_tokens);
        let len = self.ring.len();
        let at = self.ring.partition_point(|&(p, _)| p < key);
        // The first point of a routable replica at or after the key (wrapping round).
        let (start, first) =
            (0..len).find_map(|k| self.routable_at((at + k) % len).map(|i| ((at + k) % len, i))).expect("replicas");
        let ok = |i: usize| self.load_ok(self.members.id(i));
        if ok(first) {
            self.first_choice += 1;
            return first;
        }
        match self.cfg.overflow {
            Overflow::Walk => {
                (1..len).filter_map(|k| self.routable_at((start + k) % len)).find(|&i| ok(i)).unwrap_or(first)
            }
            Overflow::LeastLoad => (0..self.routable)
                .filter(|&i| ok(i))
                .min_by_key(|&i| self.in_flight[self.members.id(i)])
                .unwrap_or(first),
        }
    }

    fn on_dispatch(&mut self, request: &Request<'_>, r: usize) {
        let id = self.members.place(request.id, r);
        self.in_flight[id] += 1;
        self.total += 1;
    }

    fn on_complete(&mut self, c: &Completion) {
        let Some(id) = self.members.finish(c.request_id) else { return };
        let l = &mut self.in_flight[id];
        if *l > 0 {
            *l -= 1;
            self.total -= 1;
        }
    }

    /// A replica that leaves takes its points and its load with it (KubeAI's `RemoveEndpoint`).
    fn on_replica_change(&mut self, change: &ReplicaChange) {
        self.routable = change.routable as usize;
        if let Some(Member::Left(id)) = self.members.change(change) {
            self.total -= self.in_flight[id] as u64;
            self.in_flight[id] = 0;
        }
    }

    fn report(&self) -> Vec<(String, f64)> {
        vec![("ring_first_choice_share".into(), self.first_choice as f64 / self.decisions.max(1) as f64)]
    }
}
