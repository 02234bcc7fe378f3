//! Data that crosses the plugin boundary.
//!
//! Every type here is `#[repr(C)]` and derives [`StableAbi`], so the host and a plugin built
//! separately agree on its layout; abi_stable checks that agreement when the library loads.
//! Changing any of them is an ABI change: bump this crate's 0.x minor version.

use abi_stable::{
    StableAbi,
    std_types::{ROption, RSlice, RString, RVec},
};

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
    /// The job's size where the world exposes it: its service time in the dispatch world. `RNone`
    /// where a real router could not know it.
    pub size_hint: ROption<f64>,
    /// The prompt as segments, in order (empty in the dispatch world).
    pub segments: RSlice<'a, Segment>,
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

/// A finished request, reported to the router that placed it.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq)]
pub struct Completion {
    pub request_id: u64,
    pub replica: u32,
    pub arrived_at: f64,
    pub completed_at: f64,
    /// Time from arrival to the first output token (dispatch: start of service).
    pub ttft: f64,
    pub prompt_tokens: u32,
    /// Prompt tokens found in the replica's cache at admission.
    pub cached_tokens: u32,
    pub output_tokens: u32,
}

/// A replica evicted part of its prefix cache. Delivered only to routers whose
/// [`Capabilities::wants_evictions`] is set, after the workload's configured delay.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug)]
pub struct Eviction<'a> {
    pub replica: u32,
    /// Simulated time of the eviction (not of the delivery).
    pub evicted_at: f64,
    /// Segments from the root of the cache to the evicted node, the evicted one last.
    pub path: RSlice<'a, Segment>,
    /// Tokens of the last segment still cached after the eviction (0: wholly evicted).
    pub remaining_tokens: u32,
}

/// What a router asks of the host. All off by default; each costs the host work.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// Fill [`ReplicaView::matched_tokens`] for every replica on every request.
    pub needs_exact_match: bool,
    /// Call `on_evict` for every cache eviction.
    pub wants_evictions: bool,
    /// Keep [`ReplicaView::outstanding_work`] exact on every request.
    pub needs_outstanding_work: bool,
}

/// A named figure a policy reports at the end of a run (e.g. Preble's mean load cost, or
/// exploit/explore decision counts). The host puts them beside its own metrics.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub struct Stat {
    pub name: RString,
    pub value: f64,
}

/// Which world a router runs in.
#[repr(u8)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq)]
pub enum World {
    Dispatch,
    Cluster,
}

/// What the host tells a router at creation: what a real router would know.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug)]
pub struct RouterContext {
    pub world: World,
    pub replicas: u32,
    /// Seed of this policy's own random stream; derive every random choice from it.
    pub seed: u64,
    /// KV capacity of one replica in tokens (0 in the dispatch world).
    pub kv_capacity_tokens: u64,
    /// The replicas' step-time model (cluster world), so cost-based routers need not hard-code a GPU.
    pub cost: ROption<CostModel>,
}

/// What the host tells each replica's local scheduler at creation.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug)]
pub struct SchedulerContext {
    pub replica: u32,
    pub seed: u64,
    pub kv_capacity_tokens: u64,
}

/// A request waiting for admission on one replica, as its local scheduler sees it.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq)]
pub struct WaitingRequest {
    pub id: u64,
    pub arrived_at: f64,
    pub prompt_tokens: u32,
    /// Prompt tokens this replica's cache holds now.
    pub cached_tokens: u32,
    /// Prompt tokens still to prefill if admitted now.
    pub remaining_prefill_tokens: u32,
}

/// What the host tells a selector at creation.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug)]
pub struct SelectorContext {
    pub seed: u64,
}

/// One module of a compound AI system.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub struct ModuleInfo {
    pub name: RString,
    /// The skill the module exercises (locate, solve, generate, critique, debate, ...).
    pub skill: RString,
}

/// One model a module may call.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub struct ModelInfo {
    pub name: RString,
    /// Price per call.
    pub price: f64,
}

/// The selection problem: pick one model (an index into `models`) for each module.
#[repr(C)]
#[derive(StableAbi, Clone, Debug)]
pub struct Problem {
    pub modules: RVec<ModuleInfo>,
    pub models: RVec<ModelInfo>,
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

/// The replicas' step-time model: a roofline of one GPU (or tensor-parallel group) running one
/// model. Plain data; the methods below are compiled into each side, so host and plugins price a
/// step the same way.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq)]
pub struct CostModel {
    /// Effective compute rate, FLOP/s (peak × MFU × tensor-parallel degree).
    pub flops_per_s: f64,
    /// Effective memory bandwidth, bytes/s (peak × MBU × tensor-parallel degree).
    pub bytes_per_s: f64,
    /// Dense FLOPs per token: 2 × parameters.
    pub linear_flops_per_token: f64,
    /// Attention FLOPs per (new token, context token) pair: 4 × layers × heads × head_dim.
    pub attention_flops_per_pair: f64,
    /// Bytes of weights read once per step.
    pub weight_bytes: f64,
    /// KV cache bytes per token: 2 × layers × kv_heads × head_dim × bytes per element.
    pub kv_bytes_per_token: f64,
    /// Fixed time added to every step (kernel launches, scheduling, tensor-parallel communication).
    pub step_overhead_s: f64,
}
