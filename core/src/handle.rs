//! The host's side of the policy contract, written once for every world and front end.
//!
//! A [`RouterHandle`] owns a router and the order of its calls: `route` → bounds check →
//! `on_dispatch`; `on_complete` and `on_evict` as the world reports them; `report` at the end.
//! In the checked profile it keeps a ledger of the contract: a dispatched request ends once, in
//! `on_complete` or `on_abandon` (a retry dispatches it again), and nothing ends undispatched.
//! A [`SchedulerHandle`] owns one replica's local scheduler and checks its answers (every index
//! in range, none twice). Both turn a policy's failure into a [`RunError`] that names it, and
//! namespace what the policy reports (`router.<stat>`, `scheduler.<stat>`, `selector.<stat>`), so
//! a policy's figures can never overwrite or be mistaken for the host's metrics (host keys have
//! no dot). Nothing here knows the simulator's events or time: a world (or a gateway) calls these
//! methods with the policy-api's types.

use abi_stable::std_types::{RResult, RSlice, RVec};
use routelab_policy_api::{
    Capabilities, Completion, Eviction, PdDecision, PolicyError, ReplicaChange, ReplicaView, Request, RouterBox, Stat,
    World,
};

use crate::error::{Role, RunError};
use crate::facts::{NegotiationError, RequestFacts, RequestInfo, negotiate_facts};
use crate::signals::SignalTable;

mod admission;
mod scheduler;

pub use admission::{AdmissionCounts, AdmissionHandle, Admitted};
pub use scheduler::{SchedulerHandle, Schedulers, scheduler_stats};

/// A routing decision the router made and the host has not yet carried out (see
/// [`RouterHandle::route`]). Every ticket ends exactly once, in [`RouterHandle::commit`] or
/// [`RouterHandle::decline`]; dropping one that did not is a host bug (a debug assertion).
#[must_use = "end the ticket with commit or decline"]
#[derive(Debug)]
pub struct Ticket {
    /// The replica the router chose.
    pub replica: u32,
    ended: bool,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        debug_assert!(self.ended || std::thread::panicking(), "a routing ticket was dropped without commit or decline");
    }
}

/// A router and the contract around it.
pub struct RouterHandle {
    router: RouterBox,
    label: String,
    replicas: usize,
    caps: Capabilities,
    /// The engine signals it negotiated, and the table they are written to.
    signals: SignalTable,
    /// The request facts it negotiated, and the buffer they are written to.
    facts: RequestFacts,
    /// Why the router cannot run (its `capabilities` or `signals` failed), reported at the first
    /// dispatch. The loader checks both at creation already; this covers routers made otherwise.
    unusable: Option<RunError>,
    /// The checked profile's ledger of the contract: the requests dispatched and not yet ended
    /// (each ends once, in `complete` or `abandon`, and only after a dispatch).
    #[cfg(debug_assertions)]
    open: std::collections::HashSet<u64>,
}

impl RouterHandle {
    /// `label` names the policy in errors; `replicas` bounds its answers; `world` says which
    /// request facts the host has.
    pub fn new(router: RouterBox, replicas: u32, world: World, label: &str) -> Self {
        let (caps, mut unusable) = match router.capabilities().into_result() {
            Ok(c) => (c.known(), None),
            Err(e) => (Capabilities::NONE, Some(policy_error(label, "capabilities", e.into()))),
        };
        let mut refuse = |e: NegotiationError| {
            unusable = unusable.take().or(Some(RunError::refused(Role::Policy, label, e.to_string())));
        };
        let signals = SignalTable::negotiate(&router).unwrap_or_else(|e| {
            refuse(e);
            SignalTable::default()
        });
        let facts = negotiate_facts(&router, world).unwrap_or_else(|e| {
            refuse(e);
            RequestFacts::default()
        });
        Self {
            router,
            label: label.to_string(),
            replicas: replicas as usize,
            caps,
            signals,
            facts,
            unusable,
            #[cfg(debug_assertions)]
            open: Default::default(),
        }
    }

    /// The routable replicas changed (autoscaling): from now on the router's answers are bounded
    /// by `change.routable`, and it hears `on_replica_change`.
    pub fn replicas_changed(&mut self, change: &ReplicaChange) -> Result<(), RunError> {
        self.replicas = change.routable as usize;
        self.router
            .on_replica_change(change)
            .into_result()
            .map_err(|e| policy_error(&self.label, "on_replica_change", e.into()))
    }

    /// An instance joined or left one pool of a disaggregated cluster (`pool`:
    /// [`ReplicaChange::PREFILL`] or [`ReplicaChange::DECODE`]; `change` counts in that pool);
    /// `instances` is how many routable instances both pools hold now (the views' length).
    pub fn pool_changed(&mut self, pool: u8, change: &ReplicaChange, instances: usize) -> Result<(), RunError> {
        self.replicas = instances;
        self.router
            .on_pool_change(pool, change)
            .into_result()
            .map_err(|e| policy_error(&self.label, "on_pool_change", e.into()))
    }

    /// A mixed instance joined or left both pools of a disaggregated cluster (`instances`
    /// routable now): one notice with its index in each.
    pub fn mixed_changed(
        &mut self,
        prefill: &ReplicaChange,
        decode: &ReplicaChange,
        instances: usize,
    ) -> Result<(), RunError> {
        self.replicas = instances;
        self.router
            .on_mixed_change(prefill, decode)
            .into_result()
            .map_err(|e| policy_error(&self.label, "on_mixed_change", e.into()))
    }

    /// Whether the router reads scraped engine metrics (the world then scrapes them).
    pub fn reads_scrapes(&self) -> bool {
        self.signals.reads_scrapes()
    }

    /// The world scraped every replica's metrics at `at_s`: the `scraped.` signals hold these
    /// until the next scrape.
    pub fn scrape(&mut self, views: &[ReplicaView], at_s: f64) {
        self.signals.scrape(views, at_s);
    }

    /// The world reports every change to a view from now on ([`Self::view_changed`]), so the
    /// router's signal table is refilled only where something changed.
    pub fn track_view_changes(&mut self) {
        self.signals.track_changes();
    }

    /// Replica `replica`'s view changed (after [`Self::track_view_changes`]).
    pub fn view_changed(&mut self, replica: usize) {
        self.signals.changed(replica);
    }

    /// When `replica`'s queued work ends: the `busy_until` signal (0 until a world sets it).
    pub fn set_busy_until(&mut self, replica: usize, at: f64) {
        self.signals.set_busy_until(replica, at);
    }

    /// Requests admitted to `replica` whose first token is not out yet: the `prefilling` signal.
    pub fn set_prefilling(&mut self, replica: usize, requests: u32) {
        self.signals.set_prefilling(replica, requests);
    }

    /// Whether the router reads the `lora.*` signals.
    pub fn reads_lora(&self) -> bool {
        self.signals.reads_lora()
    }

    /// Whether the router reads the `tier.*` signals.
    pub fn reads_tiers(&self) -> bool {
        self.signals.reads_tiers()
    }

    /// The routed request's GPU match on `replica` continued in its KV tiers [cpu, remote].
    pub fn set_tier_matches(&mut self, replica: usize, tokens: [u32; 2]) {
        self.signals.set_tier_matches(replica, tokens);
    }

    /// What `replica` holds of the routed request's adapter (the `lora.*` signals).
    pub fn set_lora(&mut self, replica: usize, figures: crate::signals::AdapterFigures) {
        self.signals.set_lora(replica, figures);
    }

    /// What the router asked for at creation (read once).
    pub fn capabilities(&self) -> Capabilities {
        self.caps
    }

    pub fn label(&self) -> &str {
        &self.label
    }

    /// Asks the router where `req` goes among `views` (one per replica), checks the answer and
    /// tells the router the decision (`on_dispatch`): [`Self::route`] then [`Self::commit`] there.
    pub fn dispatch(&mut self, req: &Request<'_>, info: &RequestInfo, views: &[ReplicaView]) -> Result<u32, RunError> {
        let ticket = self.route(req, info, views)?;
        let replica = ticket.replica;
        self.commit(ticket, req, info, replica)
    }

    /// Asks the router where `req` goes among `views` (one per replica) and checks the answer; the
    /// router hears nothing more until the ticket ends: [`Self::commit`] when the request is sent
    /// (to the replica chosen, or another one a front end had to pick), [`Self::decline`] when it
    /// is sent nowhere on this decision.
    pub fn route(&mut self, req: &Request<'_>, info: &RequestInfo, views: &[ReplicaView]) -> Result<Ticket, RunError> {
        debug_assert_eq!(views.len(), self.replicas);
        if let Some(e) = &self.unusable {
            return Err(e.clone());
        }
        let req = &Request { facts: RSlice::from_slice(self.facts.fill(info)), ..*req };
        let i = self
            .router
            .route(req, self.signals.replicas(views, req.arrived_at))
            .into_result()
            .map_err(|e| policy_error(&self.label, "route", e.into()))? as usize;
        let n = self.replicas;
        if i >= n {
            return Err(RunError::refused(
                Role::Policy,
                &self.label,
                format!("returned replica {i}, but there are only {n} replicas (valid: 0..{})", n - 1),
            ));
        }
        Ok(Ticket { replica: i as u32, ended: false })
    }

    /// `req` was sent to `replica` on `ticket`'s decision: the router hears `on_dispatch`. From
    /// then on the request ends exactly once, in [`Self::complete`] or [`Self::abandon`].
    pub fn commit(
        &mut self,
        mut ticket: Ticket,
        req: &Request<'_>,
        info: &RequestInfo,
        replica: u32,
    ) -> Result<u32, RunError> {
        ticket.ended = true;
        assert!((replica as usize) < self.replicas, "a host commits to one of its replicas");
        let req = &Request { facts: RSlice::from_slice(self.facts.fill(info)), ..*req };
        self.router
            .on_dispatch(req, replica)
            .into_result()
            .map_err(|e| policy_error(&self.label, "on_dispatch", e.into()))?;
        let id = req.id;
        self.opened(id);
        Ok(replica)
    }

    /// The ledger: request `id` was dispatched (it must not be open already).
    fn opened(&mut self, _id: u64) {
        #[cfg(debug_assertions)]
        assert!(self.open.insert(_id), "request {_id} dispatched to '{}' again before it ended", self.label);
    }

    /// The ledger: request `id` ends (it must be open).
    fn ended(&mut self, _id: u64, _how: &str) {
        #[cfg(debug_assertions)]
        assert!(
            self.open.remove(&_id),
            "request {_id} ended ({_how}) at '{}' without a dispatch, or for the second time",
            self.label
        );
    }

    /// `ticket`'s request was sent nowhere on this decision (no healthy replica took it): the
    /// router, which heard only `route`, hears nothing.
    pub fn decline(&mut self, mut ticket: Ticket) {
        ticket.ended = true;
    }

    /// Disaggregated clusters: asks the router what to do with `req` given every replica's view,
    /// the prefill candidates being `views[..prefill_end]`, the decode ones `views[decode_start..]`; checks the
    /// answer (a known action, indices within their pool) and tells the router (`on_dispatch_pair`).
    pub fn dispatch_pair(
        &mut self,
        req: &Request<'_>,
        info: &RequestInfo,
        views: &[ReplicaView],
        prefill_end: usize,
        decode_start: usize,
    ) -> Result<PdDecision, RunError> {
        debug_assert_eq!(views.len(), self.replicas);
        if let Some(e) = &self.unusable {
            return Err(e.clone());
        }
        let req = &Request { facts: RSlice::from_slice(self.facts.fill(info)), ..*req };
        let (prefill, decode) = self.signals.pools(views, prefill_end, decode_start, req.arrived_at);
        let d = self
            .router
            .route_pair(req, prefill, decode)
            .into_result()
            .map_err(|e| policy_error(&self.label, "route_pair", e.into()))?;
        let (np, nd) = (prefill_end as u32, (self.replicas - decode_start) as u32);
        let bad = match d.action {
            PdDecision::DISAGGREGATE if d.prefill >= np => {
                Some(format!("prefill instance {}, but there are {np}", d.prefill))
            }
            PdDecision::DISAGGREGATE if d.prefix_from != PdDecision::NO_SOURCE && d.prefix_from >= np => {
                Some(format!("prefix source {}, but there are {np} prefill instances", d.prefix_from))
            }
            PdDecision::DISAGGREGATE | PdDecision::DECODE_ONLY if d.decode >= nd => {
                Some(format!("decode instance {}, but there are {nd}", d.decode))
            }
            PdDecision::DISAGGREGATE | PdDecision::DECODE_ONLY | PdDecision::REJECT => None,
            other => Some(format!("the unknown action {other} (known: 0 disaggregate, 1 decode only, 2 reject)")),
        };
        if let Some(what) = bad {
            return Err(RunError::refused(Role::Policy, &self.label, format!("returned {what} from route_pair")));
        }
        self.router
            .on_dispatch_pair(req, d)
            .into_result()
            .map_err(|e| policy_error(&self.label, "on_dispatch_pair", e.into()))?;
        if d.action != PdDecision::REJECT {
            // A rejected request is counted, not served: it never ends at the router.
            let id = req.id;
            self.opened(id);
        }
        Ok(d)
    }

    /// Disaggregated clusters: a request finished its prefill (`c.replica` in the prefill pool).
    pub fn prefill_complete(&mut self, c: &Completion) -> Result<(), RunError> {
        #[cfg(debug_assertions)]
        assert!(self.open.contains(&c.request_id), "request {} prefilled without a dispatch", c.request_id);
        self.router.on_prefill_complete(c).into_result().map_err(|e| self.fail("on_prefill_complete", e.into()))
    }

    /// A request dispatched earlier has finished.
    pub fn complete(&mut self, c: &Completion) -> Result<(), RunError> {
        self.ended(c.request_id, "on_complete");
        self.router.on_complete(c).into_result().map_err(|e| self.fail("on_complete", e.into()))
    }

    /// A request dispatched earlier will not complete where it went (the client gave up, the
    /// send failed). A router built against policy-api 0.5.0 hears it as a completion.
    pub fn abandon(&mut self, c: &Completion) -> Result<(), RunError> {
        self.ended(c.request_id, "on_abandon");
        self.router.on_abandon(c).into_result().map_err(|e| self.fail("on_abandon", e.into()))
    }

    /// A replica's cache dropped a path (delivered only to routers that want evictions).
    pub fn evicted(&mut self, e: &Eviction<'_>) -> Result<(), RunError> {
        self.router.on_evict(e).into_result().map_err(|e| self.fail("on_evict", e.into()))
    }

    /// The router's own figures as `router.<name>`.
    pub fn report(&self) -> Result<Vec<(String, f64)>, RunError> {
        report_of(Role::Policy, &self.label, "router", self.router.report())
    }

    fn fail(&self, method: &str, e: String) -> RunError {
        policy_error(&self.label, method, e)
    }
}

/// A router's, scheduler's or selector's error from `method`.
pub fn policy_error(label: &str, method: &str, e: String) -> RunError {
    RunError::erred(Role::Policy, label, method, e)
}

/// A policy's `report` answer as its figures `<kind>.<name>` ([`namespaced`]); its error, or a
/// bad name, fails the run naming the policy (`role`, `label`).
pub fn report_of(
    role: Role,
    label: &str,
    kind: &str,
    answer: RResult<RVec<Stat>, PolicyError>,
) -> Result<Vec<(String, f64)>, RunError> {
    let stats = answer.into_result().map_err(|e| RunError::erred(role, label, "report", e.into()))?;
    namespaced(kind, stats).map_err(|m| RunError::failed(role, label, m))
}

/// `stats` as `<kind>.<name>`; refuses names that are empty, repeated, or hold anything but ASCII
/// letters, digits and `_` (they become JSON keys and CSV column headers).
pub fn namespaced(kind: &str, stats: RVec<Stat>) -> Result<Vec<(String, f64)>, String> {
    let mut out: Vec<(String, f64)> = Vec::with_capacity(stats.len());
    let mut seen = std::collections::HashSet::with_capacity(stats.len());
    for s in stats {
        let name = s.name.as_str();
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(format!(
                "its {kind} reported a figure named {name:?}; names are ASCII letters, digits and `_` (e.g. cache_decisions)"
            ));
        }
        let key = format!("{kind}.{name}");
        if !seen.insert(key.clone()) {
            return Err(format!("its {kind} reported the figure {name:?} twice"));
        }
        out.push((key, s.value));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(names: &[&str]) -> RVec<Stat> {
        names.iter().map(|n| Stat { name: (*n).into(), value: 1.0 }).collect()
    }

    #[test]
    fn stats_are_namespaced_and_bad_names_refused() {
        assert_eq!(
            namespaced("router", stats(&["a_1", "B"])).unwrap(),
            vec![("router.a_1".into(), 1.0), ("router.B".into(), 1.0)]
        );
        for bad in ["", "a,b", "a\nb", "a.b", "latency mean"] {
            assert!(namespaced("router", stats(&[bad])).is_err(), "{bad:?}");
        }
        assert!(namespaced("router", stats(&["x", "x"])).unwrap_err().contains("twice"));
    }

    fn round_robin() -> RouterHandle {
        let spec = crate::plugin::PolicySpec::parse("round_robin").unwrap();
        let router = crate::plugin::Loader::new().router(&spec, &crate::sim::dispatch::router_context(2, 1)).unwrap();
        RouterHandle::new(router, 2, World::Dispatch, "round_robin")
    }

    fn done(id: u64) -> Completion {
        Completion {
            request_id: id,
            replica: 0,
            arrived_at: 0.0,
            completed_at: 1.0,
            ttft: 1.0,
            prompt_tokens: 0,
            cached_tokens: 0,
            output_tokens: 0,
        }
    }

    /// The ledger lets a request end once per dispatch: dispatched, abandoned, dispatched again
    /// (a retry) and completed is the contract kept.
    #[test]
    fn a_request_ends_once_per_dispatch() {
        let mut h = round_robin();
        let views = [ReplicaView::default(); 2];
        let req = Request::new(7, 0.0, 0);
        h.dispatch(&req, &RequestInfo::plain(), &views).unwrap();
        h.abandon(&done(7)).unwrap();
        h.dispatch(&req, &RequestInfo::plain(), &views).unwrap();
        h.complete(&done(7)).unwrap();
    }

    /// A host that ends a request twice breaks the contract: the checked profile stops it there.
    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(
        expected = "request 7 ended (on_complete) at 'round_robin' without a dispatch, or for the second time"
    )]
    fn a_request_ended_twice_is_caught_in_the_checked_profile() {
        let mut h = round_robin();
        h.dispatch(&Request::new(7, 0.0, 0), &RequestInfo::plain(), &[ReplicaView::default(); 2]).unwrap();
        h.complete(&done(7)).unwrap();
        h.complete(&done(7)).unwrap();
    }

    /// Nor may a request end that was never dispatched (a declined ticket leaves nothing open).
    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "request 3 ended (on_abandon) at 'round_robin' without a dispatch")]
    fn a_declined_request_has_nothing_to_end() {
        let mut h = round_robin();
        let t = h.route(&Request::new(3, 0.0, 0), &RequestInfo::plain(), &[ReplicaView::default(); 2]).unwrap();
        h.decline(t);
        h.abandon(&done(3)).unwrap();
    }
}
