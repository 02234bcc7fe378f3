//! Routers for prefill/decode-disaggregated clusters: each answers `route_pair` with a
//! [`PdRoute`](routelab_policy_api::PdRoute) (registered with `pd_router`, which sets `Capabilities::DISAGGREGATED`).
//!
//! Baselines: `pd_random`, `pd_round_robin`, `pd_least_loaded`. Composition: `pd_sglang`
//! (prefill and decode chosen independently by any two built-in routers). The field's decision
//! orders: `pd_dynamo` (prefill, then decode, optional bypass), `pd_llm_d` (decode, decider,
//! prefill), `pd_aibrix` (joint over rolesets), `pd_mooncake` (joint, SLO admission, migration).

/// The hooks a PD router built on [`Pools`] forwards unchanged to its two pool routers; used
/// inside `impl Policy` by `pd_sglang`, `pd_dynamo` and `pd_llm_d`.
macro_rules! forward_pool_hooks {
    () => {
        fn request_facts(&self) -> Vec<String> {
            self.pools.request_facts()
        }
        fn on_dispatch_pair(&mut self, request: &Request<'_>, decision: PdRoute) {
            self.pools.on_dispatch_pair(request, decision);
        }
        fn on_prefill_complete(&mut self, completion: &Completion) {
            self.pools.on_prefill_complete(completion);
        }
        fn on_complete(&mut self, completion: &Completion) {
            self.pools.on_complete(completion);
        }
        fn on_evict(&mut self, eviction: &Eviction<'_>) {
            self.pools.on_evict(eviction);
        }
        fn on_abandon(&mut self, abandoned: &Completion) {
            self.pools.on_abandon(abandoned);
        }
        fn on_pool_change(&mut self, pool: PdPool, change: &ReplicaChange) {
            self.pools.on_pool_change(pool, change);
        }
        fn on_mixed_change(&mut self, prefill: &ReplicaChange, decode: &ReplicaChange) {
            self.pools.on_mixed_change(prefill, decode);
        }
        fn take_failure(&self) -> Option<PolicyError> {
            self.pools.take_failure()
        }
    };
}

pub mod pd_aibrix;
pub mod pd_dynamo;
pub mod pd_least_loaded;
pub mod pd_llm_d;
pub mod pd_mooncake;
pub mod pd_random;
pub mod pd_round_robin;
pub mod pd_sglang;

use routelab_policy_api::abi_stable::std_types::{ROption, RResult, RSlice};
use routelab_policy_api::*;

/// What every PD router asks for.
pub const PD: Capabilities = Capabilities::DISAGGREGATED;

/// The index of the smallest `key`, lowest index on ties. Deterministic on purpose, not one of
/// the toolkit's fair-ties helpers: its users document this rule (`pd_least_loaded`, which has
/// no random stream, and `pd_mooncake`'s `load_balance` and decode choices, whose stream a draw
/// would shift), so a draw would change their decisions.
pub fn argmin_by<K: PartialOrd>(views: &[ReplicaView], key: impl Fn(&ReplicaView) -> K) -> usize {
    let mut best = 0;
    for i in 1..views.len() {
        if key(&views[i]) < key(&views[best]) {
            best = i;
        }
    }
    best
}

/// A router over one pool (a child of a PD router), with where its signal columns are in the
/// PD router's table.
pub struct PoolRouter {
    pub router: RouterBox,
    columns: Vec<usize>,
    scratch: Vec<f64>,
    /// Where the child's request facts are among the PD router's.
    fact_columns: Vec<usize>,
    fact_scratch: Vec<f64>,
    /// The child's first error since the PD router's wrapper last asked
    /// ([`PdRouterPolicy::take_failure`]): a child's failure fails the PD router's call, without
    /// a panic.
    failure: std::cell::Cell<Option<PolicyError>>,
}

impl PoolRouter {
    /// Builds the built-in router `spec` (`name` or `name{key: value}`) for one pool.
    pub fn new(spec: &str, ctx: &RouterContext, role: &str) -> Result<Self, String> {
        let (name, config) = match spec.find('{') {
            Some(i) => (spec[..i].trim(), &spec[i..]),
            None => (spec.trim(), ""),
        };
        let entry = crate::registry()
            .into_iter()
            .find(|e| e.name == name && e.kind() == PolicyKind::Router)
            .ok_or_else(|| format!("{role}: no built-in router named '{name}'"))?;
        let Maker::Router(make) = entry.make else { unreachable!("kind checked") };
        let router = make(config, ctx).map_err(|e| format!("{role}: {}", e.message))?;
        let caps = router.capabilities().into_result().map_err(|e| format!("{role}: {}", e.message))?;
        if caps.disaggregated() {
            return Err(format!(
                "{role}: '{name}' is itself a PD router; give an aggregated router such as round_robin"
            ));
        }
        Ok(Self {
            router,
            columns: Vec::new(),
            scratch: Vec::new(),
            fact_columns: Vec::new(),
            fact_scratch: Vec::new(),
            failure: Default::default(),
        })
    }

    /// The child's pick among `replicas` (its pool), given the PD router's signal table.
    pub fn route(&mut self, req: &Request<'_>, replicas: &Replicas<'_>) -> usize {
        let k = self.columns.len();
        let view = if k == 0 {
            Replicas::new(replicas.views())
        } else {
            self.scratch.clear();
            for i in 0..replicas.len() {
                let row = replicas.signals_of(i);
                self.scratch.extend(self.columns.iter().map(|&c| row[c]));
            }
            Replicas::with_signals(replicas.views(), &self.scratch, k as u32)
        };
        self.fact_scratch.clear();
        self.fact_scratch.extend(self.fact_columns.iter().map(|&c| req.fact(c)));
        let req = Request { facts: RSlice::from_slice(&self.fact_scratch), ..*req };
        // A child's failure is a failure of this policy (the wrapper fails the call with it).
        let r = self.router.route(&req, view);
        self.ok(r) as usize
    }

    /// The child's answer, or its type's default with the error recorded for the wrapper (the
    /// call fails, so the default is never used).
    pub fn ok<T: Default>(&self, r: RResult<T, PolicyError>) -> T {
        r.into_result().unwrap_or_else(|e| {
            let first = self.failure.take();
            self.failure.set(first.or(Some(e)));
            T::default()
        })
    }

    /// `f` on the child router, its error recorded as [`PoolRouter::ok`] does.
    pub fn call<T: Default>(&mut self, f: impl FnOnce(&mut RouterBox) -> RResult<T, PolicyError>) -> T {
        let r = f(&mut self.router);
        self.ok(r)
    }

    /// The child's recorded failure, taken.
    pub fn take_failure(&self) -> Option<PolicyError> {
        self.failure.take()
    }
}

/// A prefill-pool router and a decode-pool router, each told only about its own pool: the
/// plumbing PD routers built from today's routers share (`pd_sglang`, `pd_dynamo`, `pd_llm_d`).
/// At creation each child gets a context with its pool's size, KV capacity and cost model and a
/// seed of its own; after a decision, `on_dispatch` with its own pick (the prefill child only
/// when the request is disaggregated); `on_complete` when the request leaves its pool (the
/// prefill child at the end of the prefill, the decode child at the end of the request);
/// `on_evict` for its own instances; `on_abandon` (the decode child, and the prefill child too
/// when the request's prefill had not completed, with the prefill instance it was placed on) and
/// `on_replica_change` for its own pool's changes. A mixed instance belongs to both pools: both
/// children hear of its evictions, and a pair naming it on both sides (no transfer) is the decode
/// child's alone (dispatched to it, completed by it). The engine signals asked for are the union of the
/// children's, each child seeing its own columns in its own order; figures are reported as
/// `prefill_<name>` and `decode_<name>`.
pub struct Pools {
    pub prefill: PoolRouter,
    pub decode: PoolRouter,
    signals: Vec<String>,
    request_facts: Vec<String>,
    /// The cluster's layout (prefill candidates, mixed instances among them); its prefill
    /// count follows the prefill pool's changes.
    pd: PdContext,
    /// Requests placed on a prefill instance whose prefill has not completed, with that
    /// instance's index (kept current through the prefill pool's changes).
    prefilling: std::collections::HashMap<u64, usize>,
}

impl Pools {
    /// The two children; fails unless the cluster is disaggregated.
    pub fn new(prefill: &str, decode: &str, ctx: &RouterContext) -> Result<Self, String> {
        let pd = ctx.disaggregation.clone().into_option().ok_or("a PD router runs on a disaggregated cluster")?;
        let prefill_ctx = RouterContext {
            replicas: pd.prefill_replicas,
            seed: ctx.seed ^ 0x9E37_79B9_7F4A_7C15,
            kv_capacity_tokens: pd.prefill_kv_capacity_tokens,
            cost: pd.prefill_cost.clone(),
            disaggregation: ROption::RNone,
            ..ctx.clone()
        };
        let decode_ctx = RouterContext { disaggregation: ROption::RNone, ..ctx.clone() };
        let mut prefill = PoolRouter::new(prefill, &prefill_ctx, "prefill")?;
        let mut decode = PoolRouter::new(decode, &decode_ctx, "decode")?;
        let (mut signals, mut request_facts) = (Vec::new(), Vec::new());
        for child in [&mut prefill, &mut decode] {
            let names = child.router.signals().into_result().map_err(|e| e.message.to_string())?;
            child.columns = union(&mut signals, &names);
            let names = child.router.request_facts().into_result().map_err(|e| e.message.to_string())?;
            child.fact_columns = union(&mut request_facts, &names);
        }
        Ok(Self { prefill, decode, signals, request_facts, pd, prefilling: Default::default() })
    }

    /// [`PD`] plus what either child asks for.
    pub fn capabilities(&self) -> Capabilities {
        let known = |c: &PoolRouter| c.router.capabilities().into_result().unwrap_or(Capabilities::NONE);
        PD | known(&self.prefill) | known(&self.decode)
    }
    pub fn signals(&self) -> Vec<String> {
        self.signals.clone()
    }
    pub fn request_facts(&self) -> Vec<String> {
        self.request_facts.clone()
    }
    /// The children hear of their own picks (indices the host checked, so they fit a `u32`).
    pub fn on_dispatch_pair(&mut self, request: &Request<'_>, decision: PdRoute) {
        match decision {
            PdRoute::Disaggregate { prefill, decode, .. } => {
                if self.pd.as_decode(prefill as u32) != Some(decode as u32) {
                    self.prefill.call(|r| r.on_dispatch(request, prefill as u32));
                    self.prefilling.insert(request.id, prefill);
                }
                self.decode.call(|r| r.on_dispatch(request, decode as u32));
            }
            PdRoute::DecodeOnly { decode } => self.decode.call(|r| r.on_dispatch(request, decode as u32)),
            PdRoute::Reject => {}
        }
    }
    pub fn on_prefill_complete(&mut self, completion: &Completion) {
        self.prefilling.remove(&completion.request_id);
        self.prefill.call(|r| r.on_complete(completion));
    }
    /// The request will not complete: the decode child hears it, and the prefill child too if
    /// the prefill had not completed (at the instance it was placed on).
    pub fn on_abandon(&mut self, abandoned: &Completion) {
        if let Some(p) = self.prefilling.remove(&abandoned.request_id) {
            self.prefill.call(|r| r.on_abandon(&Completion { replica: p as u32, ..*abandoned }));
        }
        self.decode.call(|r| r.on_abandon(abandoned));
    }
    /// An instance joined or left `pool`: its child hears it in its own indices.
    pub fn on_pool_change(&mut self, pool: PdPool, change: &ReplicaChange) {
        self.pd.apply_pool_change(pool, change);
        match pool {
            PdPool::Prefill => {
                self.renumber_prefilling(change);
                self.prefill.call(|r| r.on_replica_change(change));
            }
            PdPool::Decode => self.decode.call(|r| r.on_replica_change(change)),
        }
    }
    /// A mixed instance joined or left both pools: each child hears it in its own indices.
    pub fn on_mixed_change(&mut self, prefill: &ReplicaChange, decode: &ReplicaChange) {
        self.pd.apply_mixed_change(prefill);
        self.renumber_prefilling(prefill);
        self.prefill.call(|r| r.on_replica_change(prefill));
        self.decode.call(|r| r.on_replica_change(decode));
    }
    /// The prefill instances of requests still prefilling, through a prefill-pool change: the
    /// instances above one that left move down one index (its requests are abandoned already),
    /// and those at or above one that joined move up one (a prefill-only instance rejoins below
    /// the mixed ones).
    fn renumber_prefilling(&mut self, change: &ReplicaChange) {
        let at = change.replica as usize;
        if change.joined {
            for p in self.prefilling.values_mut() {
                *p += (*p >= at) as usize;
            }
        } else {
            self.prefilling.retain(|_, p| *p != at);
            for p in self.prefilling.values_mut() {
                *p -= (*p > at) as usize;
            }
        }
    }
    pub fn on_complete(&mut self, completion: &Completion) {
        self.decode.call(|r| r.on_complete(completion));
    }
    pub fn on_evict(&mut self, eviction: &Eviction<'_>) {
        if eviction.replica < self.pd.prefill_replicas {
            self.prefill.call(|r| r.on_evict(eviction));
        }
        let first_decode = self.pd.prefill_replicas - self.pd.mixed_replicas;
        if eviction.replica >= first_decode {
            let path = RSlice::from_slice(eviction.path());
            let e = Eviction { replica: eviction.replica - first_decode, path, ..*eviction };
            self.decode.call(|r| r.on_evict(&e));
        }
    }
    /// A child's recorded failure (the prefill child's first), for the wrapper.
    pub fn take_failure(&self) -> Option<PolicyError> {
        let (p, d) = (self.prefill.take_failure(), self.decode.take_failure());
        p.or(d)
    }
    pub fn report(&self) -> Vec<(String, f64)> {
        let mut out = Vec::new();
        for (role, child) in [("prefill", &self.prefill), ("decode", &self.decode)] {
            for s in child.ok(child.router.report()) {
                out.push((format!("{role}_{}", s.name), s.value));
            }
        }
        out
    }
}

/// The column of each of `names` in `all`, appending the names `all` lacks.
fn union(all: &mut Vec<String>, names: &[RString]) -> Vec<usize> {
    names
        .iter()
        .map(|n| {
            all.iter().position(|s| s == n.as_str()).unwrap_or_else(|| {
                all.push(n.to_string());
                all.len() - 1
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use routelab_policy_api::abi_stable::sabi_trait::TD_Opaque;
    use routelab_policy_api::abi_stable::std_types::RNone;

    /// A child that fails every decision (its own wrapper turns the panic into an error).
    struct Boom;
    impl Policy for Boom {
        const NAME: &'static str = "boom";
        const DESCRIPTION: &'static str = "panics in route and on_dispatch";
        type Config = ();
        type Context = RouterContext;
        fn new(_: (), _: &RouterContext) -> Result<Self, String> {
            Ok(Boom)
        }
    }
    impl RouterPolicy for Boom {
        fn route(&mut self, _: &Request<'_>, _: &Replicas<'_>) -> usize {
            panic!("no route")
        }
        fn on_dispatch(&mut self, _: &Request<'_>, _: usize) {
            panic!("no dispatch")
        }
    }

    /// Round robin on both pools, composed through [`Pools`] as pd_sglang is.
    struct Composite {
        pools: Pools,
    }
    impl Policy for Composite {
        const NAME: &'static str = "composite";
        const DESCRIPTION: &'static str = "two children";
        type Config = ();
        type Context = RouterContext;
        fn new(_: (), ctx: &RouterContext) -> Result<Self, String> {
            Ok(Self { pools: Pools::new("round_robin", "round_robin", ctx)? })
        }
    }
    impl PdRouterPolicy for Composite {
        fn route_pair(&mut self, request: &Request<'_>, prefill: &Replicas<'_>, decode: &Replicas<'_>) -> PdRoute {
            let p = self.pools.prefill.route(request, prefill);
            PdRoute::pair(p, self.pools.decode.route(request, decode))
        }
        forward_pool_hooks!();
    }

    fn ctx() -> RouterContext {
        RouterContext {
            disaggregation: routelab_policy_api::abi_stable::std_types::RSome(PdContext {
                prefill_replicas: 2,
                prefill_kv_capacity_tokens: 1000,
                prefill_cost: RNone,
                kv_bytes_per_token: 1.0,
                link_bandwidth_bytes_s: 1e9,
                link_base_latency_s: 0.0,
                mixed_replicas: 0,
                link_layerwise: false,
                model_layers: 1,
                shared_kv_bandwidth_bytes_s: 0.0,
                shared_kv_capacity_tokens: 0,
            }),
            ..RouterContext::new(World::Cluster, 2, 1)
        }
    }

    /// A child's error fails the composite's call with the child's message, as a failure of the
    /// composite (named, with its method) — not as a panic of the composite — and the next call
    /// that goes well is not failed by it.
    #[test]
    fn a_childs_error_fails_the_composite_without_a_panic() {
        let mut c = Composite::new((), &ctx()).unwrap();
        c.pools.prefill.router = Router_TO::from_value(Guarded::new(Boom), TD_Opaque);
        let mut g = GuardedPd::new(c);
        let views = [ReplicaView::default(); 2];
        let (p, d) = (Replicas::new(&views), Replicas::new(&views));
        let req = Request::new(1, 0.0, 10);
        let e = Router::route_pair(&mut g, &req, p, d).into_result().unwrap_err();
        assert_eq!(e.kind, ErrorKind::FAILED, "{e:?}");
        assert_eq!(
            e.message.as_str(),
            "policy 'composite' failed in route_pair: policy 'boom' panicked in route: no route"
        );
        // The decode child works: a decode-only dispatch goes through, and is not failed by the
        // error already reported.
        let decode_only = PdDecision::decode_only(1);
        assert!(Router::on_dispatch_pair(&mut g, &req, decode_only).is_ok());
        let e = Router::on_dispatch_pair(&mut g, &req, PdDecision::pair(0, 1)).into_result().unwrap_err();
        assert!(
            e.message.starts_with("policy 'composite' failed in on_dispatch_pair: policy 'boom' panicked"),
            "{e:?}"
        );
    }
}
