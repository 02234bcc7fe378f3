//! Data that crosses the plugin boundary.
//!
//! Every type here is `#[repr(C)]` and derives [`StableAbi`], so the host and a plugin built
//! separately agree on its layout; abi_stable checks that agreement when the library loads.
//! Changing any of them is an ABI change: bump this crate's 0.x minor version.

use abi_stable::{
    StableAbi,
    std_types::{ROption, RSlice, RString, RVec},
};

mod capabilities;

/// A run of prompt tokens with an identity: a system prompt, a document, a tool description, a
/// question. Two requests share a prefix when their prompts start with the same segments.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Segment {
    /// Identity of the content; equal ids mean equal tokens.
    pub id: u64,
    /// Length in tokens.
    pub tokens: u32,
}

/// A request as a router sees it at its arrival.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug)]
pub struct Request<'a> {
    /// Unique within a run, increasing in arrival order.
    pub id: u64,
    /// Simulated arrival time: seconds in the cluster world, mean service times in the dispatch world.
    pub arrived_at: f64,
    /// Prompt length in tokens (0 in the dispatch world).
    pub prompt_tokens: u32,
    /// The prompt as segments, in order (empty in the dispatch world).
    pub segments: RSlice<'a, Segment>,
    /// The request facts the policy asked for at creation ([`crate::facts::request`]), one value
    /// per name in the order asked (empty if none): the growth point for what later minors tell
    /// about a request (its class, tenant, length hints) without changing this layout.
    pub facts: RSlice<'a, f64>,
}

impl<'a> Request<'a> {
    /// A request with no segments and no facts (tests, the dispatch world).
    pub const fn new(id: u64, arrived_at: f64, prompt_tokens: u32) -> Self {
        Self { id, arrived_at, prompt_tokens, segments: RSlice::EMPTY, facts: RSlice::EMPTY }
    }
    /// This request with `segments` as its prompt.
    pub const fn with_segments(self, segments: &'a [Segment]) -> Self {
        Self { segments: RSlice::from_slice(segments), ..self }
    }
    /// This request with `facts` (one value per request fact the policy asked for).
    pub const fn with_facts(self, facts: &'a [f64]) -> Self {
        Self { facts: RSlice::from_slice(facts), ..self }
    }
    /// The `column`-th request fact the policy asked for (the position of its name in the list).
    #[inline]
    pub fn fact(&self, column: usize) -> f64 {
        self.facts.as_slice()[column]
    }
}

/// What a router may know of one replica (a server in the dispatch world) when it decides.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, Default, PartialEq)]
pub struct ReplicaView {
    /// Requests queued and not yet started (dispatch) or not yet admitted (cluster).
    pub waiting: u32,
    /// Requests in service (dispatch: 0 or 1) or in the running batch (cluster).
    pub running: u32,
    /// Requests dispatched here and not finished: `waiting + running`.
    pub outstanding_requests: u32,
    /// Work dispatched here and not done: remaining service time (dispatch) or remaining prefill
    /// plus decode tokens (cluster). In the dispatch world it changes continuously, so the host
    /// keeps it exact (an O(replicas) refresh per request) only for routers whose
    /// [`Capabilities::needs_outstanding_work`] is set, and leaves it 0 otherwise.
    pub outstanding_work: f64,
    /// KV cache tokens in use (0 in the dispatch world).
    pub kv_used_tokens: u64,
    /// KV cache capacity in tokens (0 in the dispatch world).
    pub kv_capacity_tokens: u64,
    /// This request's prefix match on this replica, counting cached segments and segments of
    /// requests already dispatched here but not yet computed. Filled only for routers whose
    /// [`Capabilities::needs_exact_match`] is set; 0 otherwise.
    pub matched_tokens: u32,
}

/// What a router sees of the replicas when it decides: a [`ReplicaView`] per replica and the
/// engine signals it negotiated at creation ([`crate::signals`]), as one dense row-major table of
/// `len() × signal_columns` values (row `i` is replica `i`, column `k` the `k`-th name the router
/// asked for, in that order).
///
/// It dereferences to `[ReplicaView]`, so `replicas.len()`, `replicas[i]` and
/// `replicas.iter()` work as on a slice. Per-replica figures a later minor adds arrive as new
/// signal names, never as new fields, so this layout does not change.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug)]
pub struct Replicas<'a> {
    /// One view per replica.
    pub views: RSlice<'a, ReplicaView>,
    /// `views.len() × signal_columns` values, replica-major.
    pub signals: RSlice<'a, f64>,
    /// Signals per replica: the number of names the router asked for (0 if none).
    pub signal_columns: u32,
}

impl<'a> Replicas<'a> {
    /// Views without signals.
    #[inline]
    pub fn new(views: &'a [ReplicaView]) -> Self {
        Self { views: RSlice::from_slice(views), signals: RSlice::EMPTY, signal_columns: 0 }
    }

    /// Views with a signal table of `columns` values per replica. Panics if the table's length
    /// is not `views.len() × columns` (a host bug, caught where the table is built).
    #[inline]
    pub fn with_signals(views: &'a [ReplicaView], signals: &'a [f64], columns: u32) -> Self {
        assert_eq!(
            Some(signals.len()),
            views.len().checked_mul(columns as usize),
            "a signal table holds replicas × columns values"
        );
        Self { views: RSlice::from_slice(views), signals: RSlice::from_slice(signals), signal_columns: columns }
    }

    /// The views as a slice, for the lifetime of the data.
    #[inline]
    pub fn views(&self) -> &'a [ReplicaView] {
        self.views.as_slice()
    }

    /// Every negotiated signal of replica `replica`, in the order the router asked for them.
    #[inline]
    pub fn signals_of(&self, replica: usize) -> &'a [f64] {
        let k = self.signal_columns as usize;
        &self.signals.as_slice()[replica * k..(replica + 1) * k]
    }

    /// Signal `column` (the position of its name in the router's list) of replica `replica`.
    #[inline]
    pub fn signal(&self, replica: usize, column: usize) -> f64 {
        self.signals_of(replica)[column]
    }
}

impl<'a> From<&'a [ReplicaView]> for Replicas<'a> {
    fn from(views: &'a [ReplicaView]) -> Self {
        Self::new(views)
    }
}

impl std::ops::Deref for Replicas<'_> {
    type Target = [ReplicaView];
    #[inline]
    fn deref(&self) -> &[ReplicaView] {
        self.views.as_slice()
    }
}

/// What a disaggregation router decides for one request on a prefill/decode-disaggregated
/// cluster ([`crate::Router::route_pair`]): an [`action`](Self::action) and indices into the
/// prefill and the decode candidates. Build it with [`PdDecision::pair`],
/// [`PdDecision::decode_only`] or [`PdDecision::reject`].
///
/// The action is a `u8` code, not an enum, so a later minor can add actions without changing the
/// layout; a host refuses codes it does not know (the run fails naming the policy).
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PdDecision {
    /// [`PdDecision::DISAGGREGATE`], [`PdDecision::DECODE_ONLY`] or [`PdDecision::REJECT`].
    pub action: u8,
    /// Index into the prefill candidates (read only for `DISAGGREGATE`).
    pub prefill: u32,
    /// Index into the decode candidates (read for `DISAGGREGATE` and `DECODE_ONLY`).
    pub decode: u32,
    /// `DISAGGREGATE` only: a prefill instance to copy this prompt's cached prefix from before
    /// the prefill starts (Mooncake's hot-prefix migration: the prefill instance then holds a
    /// replica of it); [`PdDecision::NO_SOURCE`] for none.
    pub prefix_from: u32,
}

impl PdDecision {
    /// Prefill on `prefill`, move the KV cache to `decode`, decode there.
    pub const DISAGGREGATE: u8 = 0;
    /// Skip the prefill pool: `decode` prefills the request itself (conditional disaggregation).
    pub const DECODE_ONLY: u8 = 1;
    /// Turn the request away (admission control, e.g. Mooncake's SLO check); it is counted, not served.
    pub const REJECT: u8 = 2;
    /// No prefix migration.
    pub const NO_SOURCE: u32 = u32::MAX;

    /// Prefill on `prefill`, decode on `decode`.
    pub const fn pair(prefill: u32, decode: u32) -> Self {
        Self { action: Self::DISAGGREGATE, prefill, decode, prefix_from: Self::NO_SOURCE }
    }
    /// Prefill and decode on decode instance `decode`.
    pub const fn decode_only(decode: u32) -> Self {
        Self { action: Self::DECODE_ONLY, prefill: 0, decode, prefix_from: Self::NO_SOURCE }
    }
    /// Reject the request.
    pub const fn reject() -> Self {
        Self { action: Self::REJECT, prefill: 0, decode: 0, prefix_from: Self::NO_SOURCE }
    }
    /// This decision, with the prompt's cached prefix first copied from prefill instance `source`
    /// to the chosen prefill instance (over the same kind of link as the KV transfer).
    pub const fn with_prefix_from(self, source: u32) -> Self {
        Self { prefix_from: source, ..self }
    }
}

/// What a router on a disaggregated cluster is told at creation besides [`RouterContext`]'s
/// decode-pool figures: the prefill pool, the link the KV cache crosses and the shared KV tier.
///
/// Instances are laid out prefill-only, mixed, decode-only. The prefill candidates (every
/// `route_pair`'s `prefill` view) are the first `prefill_replicas` instances; the decode
/// candidates (its `decode` view, [`RouterContext::replicas`] of them) start at instance
/// `prefill_replicas − mixed_replicas`: the last `mixed_replicas` prefill candidates are the first
/// `mixed_replicas` decode candidates ([`PdContext::as_decode`], [`PdContext::as_prefill`]). A
/// `DISAGGREGATE` pair naming one mixed instance on both sides is served there with no transfer.
#[repr(C)]
#[derive(StableAbi, Clone, Debug)]
pub struct PdContext {
    /// Prefill candidates: prefill-only instances plus mixed ones (0.4.0: mixed ones included).
    pub prefill_replicas: u32,
    /// KV capacity of one prefill instance in tokens.
    pub prefill_kv_capacity_tokens: u64,
    /// The prefill instances' step-time model.
    pub prefill_cost: ROption<CostModel>,
    /// Bytes of KV cache per prompt token moved from prefill to decode.
    pub kv_bytes_per_token: f64,
    /// Bandwidth of one decode instance's inbound link, bytes/s (shared by concurrent transfers).
    pub link_bandwidth_bytes_s: f64,
    /// Fixed cost of one transfer (setup, metadata), seconds.
    pub link_base_latency_s: f64,
    /// Instances that can prefill, decode, or both for one request (0.4.0).
    pub mixed_replicas: u32,
    /// The link streams the KV layer by layer alongside the prefill (0.4.0): only about one
    /// layer's share of the transfer follows a prefill that is not bandwidth-bound.
    pub link_layerwise: bool,
    /// The model's layers (0.4.0).
    pub model_layers: u32,
    /// Read bandwidth of the shared KV tier, bytes/s, shared by concurrent loads; 0 when the
    /// cluster has none (0.4.0).
    pub shared_kv_bandwidth_bytes_s: f64,
    /// Capacity of the shared KV tier in tokens; 0 when the cluster has none (0.4.0).
    pub shared_kv_capacity_tokens: u64,
}

impl PdContext {
    /// The decode-candidate index of prefill candidate `prefill`, when it is a mixed instance.
    pub const fn as_decode(&self, prefill: u32) -> Option<u32> {
        let first_mixed = self.prefill_replicas - self.mixed_replicas;
        if prefill >= first_mixed && prefill < self.prefill_replicas { Some(prefill - first_mixed) } else { None }
    }
    /// The prefill-candidate index of decode candidate `decode`, when it is a mixed instance.
    pub const fn as_prefill(&self, decode: u32) -> Option<u32> {
        if decode < self.mixed_replicas { Some(self.prefill_replicas - self.mixed_replicas + decode) } else { None }
    }
}

/// A finished request, reported to the router that placed it.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq)]
pub struct Completion {
    /// The finished request's [`Request::id`].
    pub request_id: u64,
    /// The replica that served it (the index the router returned).
    pub replica: u32,
    /// Simulated arrival time, as in [`Request::arrived_at`].
    pub arrived_at: f64,
    /// Simulated time the last output token was out (dispatch: end of service).
    pub completed_at: f64,
    /// Time from arrival to the first output token (dispatch: start of service).
    pub ttft: f64,
    /// Prompt length in tokens (0 in the dispatch world).
    pub prompt_tokens: u32,
    /// Prompt tokens found in the replica's cache at admission.
    pub cached_tokens: u32,
    /// Output tokens generated (0 in the dispatch world).
    pub output_tokens: u32,
}

/// A replica evicted part of its prefix cache. Delivered only to routers whose
/// [`Capabilities::wants_evictions`] is set, after the workload's configured delay.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug)]
pub struct Eviction<'a> {
    /// The replica whose cache lost the content. On a disaggregated cluster this is the instance
    /// index: `0..prefill_replicas` are the prefill candidates, `prefill_replicas −
    /// mixed_replicas..` the decode candidates (see [`PdContext`]).
    pub replica: u32,
    /// Simulated time of the eviction (not of the delivery).
    pub evicted_at: f64,
    /// Segments from the root of the cache to the evicted node, the evicted one last.
    pub path: RSlice<'a, Segment>,
    /// Tokens of the last segment still cached after the eviction (0: wholly evicted).
    pub remaining_tokens: u32,
}

/// What a router asks of the host, as bit flags. All off by default; each costs the host work.
///
/// A `u64` of flags so that later minors can add capabilities without changing the layout: a host
/// ignores bits it does not know (it just does not provide that service), and a router built
/// before a flag existed never sets it.
#[repr(transparent)]
#[derive(StableAbi, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Capabilities {
    bits: u64,
}

/// A named figure a policy reports at the end of a run (e.g. Preble's mean load cost, or
/// exploit/explore decision counts). The host puts them beside its own metrics.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub struct Stat {
    /// The figure's key in the results (`snake_case`; the host keeps its own keys apart).
    pub name: RString,
    /// Its value.
    pub value: f64,
}

/// Which world a router runs in.
#[repr(u8)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq)]
pub enum World {
    /// Classic load balancing: FCFS servers, jobs with a service time.
    Dispatch,
    /// LLM replicas with continuous batching and prefix caches.
    Cluster,
}

/// What the host tells a router at creation: what a real router would know.
///
/// A fixed core plus named [`facts`](Self::facts): what a later minor tells a router at creation
/// arrives as a new fact name ([`crate::facts::context`]), never as a new field, so this layout
/// does not change.
#[repr(C)]
#[derive(StableAbi, Clone, Debug)]
pub struct RouterContext {
    /// The world the router runs in.
    pub world: World,
    /// Number of replicas (servers in the dispatch world); `route` always sees this many views.
    pub replicas: u32,
    /// Seed of this policy's own random stream; derive every random choice from it.
    pub seed: u64,
    /// KV capacity of one replica in tokens (0 in the dispatch world).
    pub kv_capacity_tokens: u64,
    /// The replicas' step-time model (cluster world): the host's own, roofline or calibrated, so
    /// cost-based routers price a step exactly as the host does and need not hard-code a GPU.
    pub cost: ROption<CostModel>,
    /// On a prefill/decode-disaggregated cluster: the prefill pool and the link (then `replicas`,
    /// `kv_capacity_tokens` and `cost` describe the decode pool). `RNone` everywhere else.
    pub disaggregation: ROption<PdContext>,
    /// Named figures beyond the core ([`crate::facts::context`]); a host lists every fact it
    /// knows, a policy reads the ones it wants with [`RouterContext::fact`].
    pub facts: RVec<Fact>,
}

impl RouterContext {
    /// A context with `replicas` replicas, `seed`, no KV, no cost model and no facts.
    pub fn new(world: World, replicas: u32, seed: u64) -> Self {
        Self {
            world,
            replicas,
            seed,
            kv_capacity_tokens: 0,
            cost: ROption::RNone,
            disaggregation: ROption::RNone,
            facts: RVec::new(),
        }
    }
    /// The value of context fact `name`, if the host gave it.
    pub fn fact(&self, name: &str) -> Option<f64> {
        find_fact(&self.facts, name)
    }
}

/// What the host tells each replica's local scheduler at creation: a fixed core plus named facts
/// (see [`RouterContext`]).
#[repr(C)]
#[derive(StableAbi, Clone, Debug)]
pub struct SchedulerContext {
    /// Index of the replica this scheduler serves.
    pub replica: u32,
    /// Seed of this scheduler's own random stream (see [`crate::policy_rng`]).
    pub seed: u64,
    /// KV capacity of the replica in tokens.
    pub kv_capacity_tokens: u64,
    /// Named figures beyond the core ([`crate::facts::context`]).
    pub facts: RVec<Fact>,
}

impl SchedulerContext {
    /// A context for replica `replica` with `seed`, `kv_capacity_tokens` and no facts.
    pub fn new(replica: u32, seed: u64, kv_capacity_tokens: u64) -> Self {
        Self { replica, seed, kv_capacity_tokens, facts: RVec::new() }
    }
    /// The value of context fact `name`, if the host gave it.
    pub fn fact(&self, name: &str) -> Option<f64> {
        find_fact(&self.facts, name)
    }
}

/// A named number: the growth point of contexts. Names are `snake_case`, grouped by a prefix
/// (`engine.chunk_tokens`); [`crate::facts`] lists the names this version defines.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub struct Fact {
    /// The fact's name.
    pub name: RString,
    /// Its value.
    pub value: f64,
}

impl Fact {
    /// The fact `name` = `value`.
    pub fn new(name: &str, value: f64) -> Self {
        Self { name: name.into(), value }
    }
}

fn find_fact(facts: &[Fact], name: &str) -> Option<f64> {
    facts.iter().find(|f| f.name == name).map(|f| f.value)
}

/// A request waiting for admission on one replica, as its local scheduler sees it.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq)]
pub struct WaitingRequest {
    /// The request's [`Request::id`].
    pub id: u64,
    /// Simulated arrival time in seconds.
    pub arrived_at: f64,
    /// Prompt length in tokens.
    pub prompt_tokens: u32,
    /// Prompt tokens this replica's cache holds now.
    pub cached_tokens: u32,
    /// Prompt tokens still to prefill if admitted now.
    pub remaining_prefill_tokens: u32,
}

/// What a scheduler sees of its replica's queue: a [`WaitingRequest`] per waiting request and the
/// request facts it asked for at creation ([`crate::facts::request`]), as one dense row-major
/// table of `len() × fact_columns` values. It dereferences to `[WaitingRequest]`.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug)]
pub struct Waiting<'a> {
    /// One row per waiting request, in arrival order.
    pub rows: RSlice<'a, WaitingRequest>,
    /// `rows.len() × fact_columns` values, request-major.
    pub facts: RSlice<'a, f64>,
    /// Request facts per request: the number of names the scheduler asked for (0 if none).
    pub fact_columns: u32,
}

impl<'a> Waiting<'a> {
    /// Rows without facts.
    #[inline]
    pub fn new(rows: &'a [WaitingRequest]) -> Self {
        Self { rows: RSlice::from_slice(rows), facts: RSlice::EMPTY, fact_columns: 0 }
    }
    /// Rows with a fact table of `columns` values per row. Panics if the table's length is not
    /// `rows.len() × columns` (a host bug).
    #[inline]
    pub fn with_facts(rows: &'a [WaitingRequest], facts: &'a [f64], columns: u32) -> Self {
        assert_eq!(Some(facts.len()), rows.len().checked_mul(columns as usize), "a fact table holds rows × columns");
        Self { rows: RSlice::from_slice(rows), facts: RSlice::from_slice(facts), fact_columns: columns }
    }
    /// Request fact `column` of waiting request `row`.
    #[inline]
    pub fn fact(&self, row: usize, column: usize) -> f64 {
        self.facts.as_slice()[row * self.fact_columns as usize + column]
    }
}

impl std::ops::Deref for Waiting<'_> {
    type Target = [WaitingRequest];
    #[inline]
    fn deref(&self) -> &[WaitingRequest] {
        self.rows.as_slice()
    }
}

/// What the host tells a selector at creation: its seed and the shape of the problem it will
/// get, so a selector can refuse a problem it cannot handle (too large a space) before any run;
/// a fixed core plus named facts (see [`RouterContext`]).
#[repr(C)]
#[derive(StableAbi, Clone, Debug, Default, PartialEq)]
pub struct SelectorContext {
    /// Seed of this selector's own random stream (see [`crate::policy_rng`]).
    pub seed: u64,
    /// Modules of the compound system (`Problem::modules.len()`).
    pub modules: u32,
    /// Models each module may call (`Problem::models.len()`).
    pub models: u32,
    /// Questions in the training set (`Problem::train_questions`).
    pub train_questions: u32,
    /// Most allocations the selector may evaluate, if limited (`Problem::budget`).
    pub budget: ROption<u64>,
    /// Named figures beyond the core ([`crate::facts::context`]).
    pub facts: RVec<Fact>,
}

impl SelectorContext {
    /// The value of context fact `name`, if the host gave it.
    pub fn fact(&self, name: &str) -> Option<f64> {
        find_fact(&self.facts, name)
    }
}

/// One module of a compound AI system.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub struct ModuleInfo {
    /// The module's name in the system (`locate`, `solve`, ...).
    pub name: RString,
    /// The skill the module exercises (locate, solve, generate, critique, debate, ...).
    pub skill: RString,
}

/// One model a module may call.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub struct ModelInfo {
    /// The model's name, as users write it in `--start`.
    pub name: RString,
    /// Price per call.
    pub price: f64,
}

/// The selection problem: pick one model (an index into `models`) for each module.
#[repr(C)]
#[derive(StableAbi, Clone, Debug)]
pub struct Problem {
    /// The modules, in allocation order.
    pub modules: RVec<ModuleInfo>,
    /// The models; an allocation holds indices into this list.
    pub models: RVec<ModelInfo>,
    /// Questions in the training set (each evaluation runs them all).
    pub train_questions: u32,
    /// Allocation to start from, if the user named one.
    pub start: ROption<RVec<u32>>,
    /// Most allocations the selector may evaluate, if limited.
    pub budget: ROption<u64>,
}

/// The result of running one allocation on the training set.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub struct Evaluation {
    /// Per question: was the end-to-end answer right.
    pub correct: RVec<bool>,
    /// Per question and module (question-major: `q * modules + m`): the diagnoser's verdict that
    /// module `m` caused question `q`'s error. Always false for correctly answered questions.
    pub faults: RVec<bool>,
    /// Price of one question under this allocation.
    pub cost_per_question: f64,
}

pub use crate::cost::CostModel;
