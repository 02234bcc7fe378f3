//! Engine signals: per-replica figures a router asks for by name.
//!
//! A router lists the names it wants in [`crate::RouterPolicy::signals`]; the host reads the list
//! once, right after creating the router, and refuses a name it does not provide (a configuration
//! error naming the signal and listing the ones it has). On every `route` call the values arrive in
//! [`crate::Replicas`] as one dense table, a row per replica and a column per name in the order
//! the router asked: `replicas.signal(i, k)`.
//!
//! Why names and not fields: a figure added later (scraped engine metrics, their age, a block
//! hash count) is a new name in this list and a new column for the routers that ask for it. The
//! layout of [`crate::ReplicaView`] and [`crate::Replicas`] does not change, so plugins built
//! before the name existed keep loading; a plugin that asks for a name its host does not know
//! gets a clear error at creation instead of a wrong value.
//!
//! What [`crate::ReplicaView`] holds (waiting, running, outstanding, KV used and capacity) is
//! read there and only there; a signal is a figure the view does not have.
//!
//! Values are `f64`. A signal the world has no notion of (KV figures in the dispatch world) is
//! `0.0`, like the matching [`crate::ReplicaView`] field. Names are `snake_case`; a group of
//! figures sampled together shares a prefix (`scraped.`), and a sampled group carries its age as
//! its own signal (`scraped.age_s`), so staleness is data, not a layout.

/// Fraction of the KV cache in use, `kv_used_tokens / kv_capacity_tokens` (0 with no capacity).
pub const KV_UTILISATION: &str = "kv_utilisation";

/// [`crate::ReplicaView::waiting`] at the replica's last metrics scrape (the workload's `cluster.metrics.scrape_interval_s`;
/// with interval 0, the live value).
pub const SCRAPED_WAITING: &str = "scraped.waiting";
/// [`crate::ReplicaView::running`] at the last scrape.
pub const SCRAPED_RUNNING: &str = "scraped.running";
/// [`KV_UTILISATION`] at the last scrape.
pub const SCRAPED_KV_UTILISATION: &str = "scraped.kv_utilisation";
/// Seconds since the last scrape of the replica (0 with interval 0).
pub const SCRAPED_AGE_S: &str = "scraped.age_s";

/// When the replica's queued work ends if nothing more arrives: in the dispatch world the time
/// (in mean service times, like [`crate::Request::arrived_at`]) its FCFS backlog drains; in
/// balls into bins, where nothing departs, its total work. Unlike `outstanding_work` it does not
/// move with the clock, so a router can keep replicas ordered by it and re-read only the ones
/// it was told changed (`on_dispatch`, `on_complete`). Meaningful only while the replica has
/// requests outstanding; 0 in the cluster world, where batching makes it unknown.
pub const BUSY_UNTIL: &str = "busy_until";

/// Requests admitted to the replica whose first token is not out yet: in prefill, chunked or
/// not (cluster world; on a disaggregated cluster, an instance's requests it prefills). With
/// `waiting` it says which requests still owe their prefill, as a router that tracks each
/// request's first token (Dynamo) knows. 0 in the dispatch world.
pub const PREFILLING: &str = "prefilling";

// since 0.5.5 {
/// LoRA adapters (0.5.5): whether the adapter of the request being routed (the request fact
/// `adapter`) is loaded on the replica, so serving it costs no cold load: 1 or 0 (1 for a
/// request on the base model, and on a replica whose adapters are all preloaded). Unlike every
/// other signal, the `lora.*` figures are about the request being routed as well as the replica
/// (0 in the dispatch world).
pub const LORA_RESIDENT: &str = "lora.resident";
/// Requests of the routed request's adapter running on the replica (vLLM's
/// `running_lora_adapters` lists the adapter when > 0; 0 for a base-model request).
pub const LORA_RUNNING: &str = "lora.running";
/// Requests of the routed request's adapter waiting on the replica (`waiting_lora_adapters`).
pub const LORA_WAITING: &str = "lora.waiting";
/// Distinct adapters among the replica's running requests (the length of vLLM's
/// `running_lora_adapters`).
pub const LORA_RUNNING_ADAPTERS: &str = "lora.running_adapters";
/// Distinct adapters among the replica's waiting requests (`waiting_lora_adapters`).
pub const LORA_WAITING_ADAPTERS: &str = "lora.waiting_adapters";
/// Most distinct adapters one batch of the replica may use (vLLM's `max_loras`; infinity when
/// the workload sets no limit).
pub const LORA_MAX_ADAPTERS: &str = "lora.max_adapters";
// } since 0.5.5

// since 0.5.6 {
/// KV tiers (0.5.6): tokens of the routed request's prompt that continue the replica's GPU
/// prefix match (the match [`crate::ReplicaView::matched_tokens`] counts: cached or pending,
/// whether or not the router asked for it) from the replica's own CPU tier — what admitting the
/// request there now would load over PCIe instead of computing. The match continues segment by
/// segment: a segment the CPU tier holds counts here, else one the remote tier holds counts in
/// [`TIER_REMOTE_MATCHED_TOKENS`], and the first segment neither holds ends it (a partly evicted
/// GPU segment continues with its evicted tail). Like Dynamo's host-pinned "extension" blocks
/// and the CPU medium of llm-d's KV-block index: a router weighs them below GPU hits. 0 without
/// KV tiers, and in the dispatch world.
pub const TIER_CPU_MATCHED_TOKENS: &str = "tier.cpu.matched_tokens";
/// KV tiers (0.5.6): the tokens of the same continued match that the remote tier every replica
/// shares holds (Dynamo's disk/external tiers): see [`TIER_CPU_MATCHED_TOKENS`]. 0 without a
/// remote tier.
pub const TIER_REMOTE_MATCHED_TOKENS: &str = "tier.remote.matched_tokens";
// } since 0.5.6

/// Every signal name this version of the crate defines, with one line each. A host provides a
/// subset (routelab provides all of these); a later minor appends names.
pub const CATALOGUE: &[(&str, &str)] = &[
    (KV_UTILISATION, "fraction of the KV cache in use"),
    (SCRAPED_WAITING, "waiting at the last metrics scrape"),
    (SCRAPED_RUNNING, "running at the last metrics scrape"),
    (SCRAPED_KV_UTILISATION, "kv_utilisation at the last metrics scrape"),
    (SCRAPED_AGE_S, "seconds since the last metrics scrape"),
    (BUSY_UNTIL, "when the queued work ends (dispatch world; 0 in the cluster world)"),
    (PREFILLING, "requests admitted, first token not yet out (cluster world)"),
    // since 0.5.5 {
    (LORA_RESIDENT, "1 if the routed request's LoRA adapter is loaded here, else 0 (cluster world)"),
    (LORA_RUNNING, "requests of the routed request's adapter running here (cluster world)"),
    (LORA_WAITING, "requests of the routed request's adapter waiting here (cluster world)"),
    (LORA_RUNNING_ADAPTERS, "distinct adapters among the running requests (cluster world)"),
    (LORA_WAITING_ADAPTERS, "distinct adapters among the waiting requests (cluster world)"),
    (LORA_MAX_ADAPTERS, "most distinct adapters in one batch, infinity for no limit (cluster world)"),
    // } since 0.5.5
    // since 0.5.6 {
    (TIER_CPU_MATCHED_TOKENS, "the routed request's prefix match continued in this replica's CPU KV tier, tokens"),
    (TIER_REMOTE_MATCHED_TOKENS, "the routed request's prefix match continued in the shared remote KV tier, tokens"),
    // } since 0.5.6
];
