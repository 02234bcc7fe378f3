//! KV tiers under each replica (`cluster.kv_tiers`): GPU memory (the prefix cache) → a CPU tier
//! per replica → optionally a remote tier every replica shares (aggregated clusters; a
//! disaggregated one has `shared_kv` for that). On a disaggregated cluster the CPU tiers sit
//! under the instances that prefill (Mooncake's DRAM cache on every prefill node), and a prefix
//! migration copies what the source holds in GPU memory and continued in its CPU tier. Each
//! tier is a [`KvTier`] (the store a disaggregated cluster's `shared_kv` uses).
//!
//! - **Eviction cascades down.** A prompt segment the GPU cache cuts for the first time is
//!   written whole to the replica's CPU tier (write-back on eviction, as vLLM's CPU offloading
//!   and SGLang's HiCache do for evicted blocks); what the CPU tier evicts goes to the remote
//!   tier; what the remote tier evicts is gone. Tiers are inclusive: a block loaded back up
//!   stays below.
//! - **Tier-resolved match.** When a request is admitted, its prompt is matched segment by
//!   segment past what the GPU holds: a segment continues the match if the CPU tier holds it,
//!   else the remote tier (a partially evicted GPU segment continues with its evicted tail). The
//!   matched tokens are allocated in GPU memory like uncached ones (the admission check is
//!   unchanged) and count as computed: the request prefills only the rest. Routers that ask for
//!   the engine signals `tier.cpu.matched_tokens` / `tier.remote.matched_tokens` (policy-api
//!   0.5.6) get, per replica, the same walk past its GPU match (cached or pending) without
//!   refreshing anything; local schedulers still see GPU matches only.
//! - **Loads are on the step's critical path.** The step that admits the request waits for its
//!   KV: a step's loads from one tier are one transfer, `base + tokens × kv_bytes / (bandwidth /
//!   concurrent)` ([`KvTier::load_time_s`]; `concurrent` counts the replicas loading from the
//!   shared remote tier when the step starts, and is 1 on a replica's own CPU tier), and the CPU
//!   and remote loads run one after the other (both cross the GPU's one PCIe link). With
//!   `layerwise: true` (the default) the load overlaps the forward pass layer by layer, as
//!   LMCache's layer-wise retrieval and Dynamo KVBM's layer-gated onboarding do: layer i's KV
//!   must be in before layer i is computed, so a two-stage pipeline over L layers takes
//!   `max(compute + load / L, load + compute / L)`. Without it the step takes `compute + load`.
//!   (vLLM's offloading connector instead loads before scheduling the request, so other
//!   requests' steps do not wait; modelled here, the load delays the whole batch, an upper
//!   bound on what it costs the others.)
//!
//! Metrics (only with tiers, `summary::push_tier_metrics`; `<t>` is `cpu` or `remote`): `tier.<t>.hit_rate` (prompt tokens
//! loaded from the tier at each request's first admission ÷ prompt tokens, the denominator of
//! `hit_rate`, which stays the GPU's), `tier.<t>.tokens_loaded` (every load, readmissions
//! included), `tier.<t>.load_time_s` (seconds the tier's link spent loading, summed over
//! replicas), `tier.<t>.offloaded_tokens` (tokens written into the tier), `tier.hit_rate_all`
//! (GPU + tiers) and `tier.load_stall_s` (seconds loading added to steps after the overlap,
//! summed over replicas).

use routelab_policy_api::Segment;

use super::kv_tier::KvTier;
use super::prefix_cache::{PrefixCache, extend_path_hash};
use crate::ids::RequestId;
use crate::workload::cluster::kv_tiers::KvTiers;

/// A block going down a tier: (path hash, depth, tokens).
type Block = (u64, u32, u32);

/// One replica's tiers below its GPU cache (the remote tier, shared, is the cluster's and passed in).
pub struct ReplicaTiers {
    pub(super) cpu: KvTier,
    layerwise: bool,
    layers: u32,
    /// This step's loads so far: tokens from [cpu, remote].
    step_tokens: [u64; 2],
    /// The running step loads from the remote tier (it counts in that tier's `loading`).
    pub(super) loading_remote: bool,
    /// Tokens loaded, per tier [cpu, remote].
    pub loaded_tokens: [u64; 2],
    /// Seconds each tier's link spent loading for this replica.
    pub load_s: [f64; 2],
    /// Seconds loading added to this replica's steps, after the overlap.
    pub stall_s: f64,
    /// Scratch for the cascade.
    offloaded: Vec<Block>,
    spilled: Vec<Block>,
    dropped: Vec<Block>,
}

impl ReplicaTiers {
    pub fn new(spec: &KvTiers, kv_bytes_per_token: f64, layers: u32) -> Self {
        Self {
            cpu: KvTier::new(&spec.cpu, kv_bytes_per_token),
            layerwise: spec.layerwise,
            layers,
            step_tokens: [0; 2],
            loading_remote: false,
            loaded_tokens: [0; 2],
            load_s: [0.0; 2],
            stall_s: 0.0,
            offloaded: Vec::new(),
            spilled: Vec::new(),
            dropped: Vec::new(),
        }
    }

    /// The tokens of `prompt` past its first `gpu_cached` (the GPU's match) that the tiers
    /// hold, as [from cpu, from remote]; the blocks used are refreshed.
    pub(super) fn lookup(&mut self, prompt: &[Segment], gpu_cached: u32, mut remote: Option<&mut KvTier>) -> [u32; 2] {
        let cpu = &mut self.cpu;
        continued(prompt, gpu_cached, |h| cpu.hit(h), |h| remote.as_deref_mut().is_some_and(|r| r.hit(h)))
    }

    /// What [`Self::lookup`] would find past `gpu_matched`, changing nothing (the routers'
    /// `tier.*.matched_tokens` signals).
    pub(super) fn peek(&self, prompt: &[Segment], gpu_matched: u32, remote: Option<&KvTier>) -> [u32; 2] {
        continued(prompt, gpu_matched, |h| self.cpu.holds(h), |h| remote.is_some_and(|r| r.holds(h)))
    }

    /// A request admitted in the step being formed loads `tokens` [from cpu, from remote].
    pub fn add_load(&mut self, tokens: [u32; 2]) {
        self.step_tokens[0] += tokens[0] as u64;
        self.step_tokens[1] += tokens[1] as u64;
    }

    /// Moves what the GPU cache evicted down: into the CPU tier, and what that evicts into the
    /// remote tier (if any).
    pub(super) fn cascade(&mut self, cache: &mut PrefixCache, remote: Option<&mut KvTier>) {
        cache.take_offloaded(&mut self.offloaded);
        self.spilled.clear();
        for &(hash, depth, tokens) in &self.offloaded {
            self.cpu.offload(hash, depth, tokens, &mut self.spilled);
        }
        if let Some(r) = remote {
            for &(hash, depth, tokens) in &self.spilled {
                r.offload(hash, depth, tokens, &mut self.dropped);
            }
            self.dropped.clear();
        }
    }

    /// The time of a step whose computation takes `compute_s`, with the loads added since the
    /// last call (which it clears).
    pub(super) fn step_time_s(&mut self, compute_s: f64, remote: Option<&mut KvTier>) -> f64 {
        let [cpu, rem] = std::mem::take(&mut self.step_tokens);
        if cpu + rem == 0 {
            return compute_s;
        }
        let mut load = 0.0;
        if cpu > 0 {
            let s = self.cpu.load_time_s(cpu);
            self.cpu.loads += 1;
            self.cpu.loaded_tokens += cpu;
            self.load_s[0] += s;
            self.loaded_tokens[0] += cpu;
            load += s;
        }
        if rem > 0 {
            let r = remote.expect("remote loads only with a remote tier");
            let s = r.load_time_s(rem);
            r.loading += 1;
            r.loads += 1;
            r.loaded_tokens += rem;
            self.loading_remote = true;
            self.load_s[1] += s;
            self.loaded_tokens[1] += rem;
            load += s;
        }
        let t = overlapped_s(compute_s, load, self.layers, self.layerwise);
        self.stall_s += t - compute_s;
        t
    }

    /// The running step ended: its remote load (if any) is no longer in flight.
    pub(super) fn step_ended(&mut self, remote: Option<&mut KvTier>) {
        if std::mem::take(&mut self.loading_remote) {
            remote.expect("remote loads only with a remote tier").loading -= 1;
        }
    }
}

/// The GPU's match of `prompt`, its first `gpu` tokens, continued segment by segment: a
/// segment the CPU tier holds (`in_cpu` of its path hash) counts as [cpu], else one the remote
/// tier holds as [remote]; the first segment neither holds ends it. A segment the GPU holds in
/// part continues with its tail.
fn continued(
    prompt: &[Segment],
    gpu: u32,
    mut in_cpu: impl FnMut(u64) -> bool,
    mut in_remote: impl FnMut(u64) -> bool,
) -> [u32; 2] {
    let mut found = [0u32; 2];
    let (mut hash, mut start) = (0, 0u32);
    for s in prompt {
        hash = extend_path_hash(hash, s.id);
        let end = start + s.tokens;
        if end > gpu {
            let need = end - start.max(gpu);
            if in_cpu(hash) {
                found[0] += need;
            } else if in_remote(hash) {
                found[1] += need;
            } else {
                break;
            }
        }
        start = end;
    }
    found
}

impl super::ClusterSim<'_> {
    /// The `tier.*.matched_tokens` signals of every routable replica for request `id` (when the
    /// router reads them and the replicas have tiers): its GPU match — cached or pending, as
    /// `matched_tokens` counts it — continued in the replica's CPU tier and the remote tier.
    pub(super) fn refresh_tier_matches(&mut self, id: RequestId) {
        if !self.router.reads_tiers() {
            return;
        }
        let prompt = self.stream.prompt(id.index());
        for (k, &slot) in self.routable.iter().enumerate() {
            let Some(m) = self.replicas[slot].tier_matches(prompt, self.remote_tier.as_ref()) else {
                continue;
            };
            self.router.set_tier_matches(k, m);
        }
    }
}

/// A step of `compute_s` seconds of computation that first needs `load_s` seconds of loads:
/// `compute + load` serially; layer-wise over `layers` layers, the two-stage pipeline
/// `max(compute + load / L, load + compute / L)` (the first layer's load before any compute,
/// the last layer's compute after every load).
pub fn overlapped_s(compute_s: f64, load_s: f64, layers: u32, layerwise: bool) -> f64 {
    if !layerwise {
        return compute_s + load_s;
    }
    let l = layers.max(1) as f64;
    (compute_s + load_s / l).max(load_s + compute_s / l)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::cluster::kv_tiers::KvTierSpec;

    fn seg(id: u64, tokens: u32) -> Segment {
        Segment { id, tokens }
    }

    /// A tier of `capacity` tokens at 1 byte per token, 8 Gbit/s (1e9 tokens/s), 1 ms base.
    fn spec(capacity: u64) -> KvTierSpec {
        KvTierSpec { capacity_gb: capacity as f64 / 1e9, bandwidth_gbps: 8.0, base_latency_s: 0.001 }
    }

    fn tiers(cpu: u64, layerwise: bool) -> ReplicaTiers {
        let spec = KvTiers { cpu: spec(cpu), remote: None, layerwise };
        ReplicaTiers::new(&spec, 1.0, 4)
    }

    /// Admits, computes and releases `prompt` (a finished request).
    fn serve(cache: &mut PrefixCache, prompt: &[Segment]) {
        let mut path = Vec::new();
        cache.admit(prompt, &mut path, 0, None);
        for (&n, s) in path.iter().zip(prompt) {
            cache.mark_computed(n, s.tokens);
        }
        cache.release(&path);
    }

    /// GPU → CPU (300 tokens) → remote (1000 tokens), by hand:
    /// the GPU holds sys(100)·a(200) and sys·b(200); evicting 250 tokens cuts `a` whole (LRU)
    /// and 50 of `b`, so both go to the CPU whole (400 > 300: `a`, older, spills to remote).
    #[test]
    fn evictions_cascade_down_and_a_match_resolves_through_the_tiers() {
        let (sys, a, b) = (seg(1, 100), seg(2, 200), seg(3, 200));
        let mut cache = PrefixCache::with_offload();
        let mut remote = KvTier::new(&spec(1000), 1.0);
        let mut t = tiers(300, true);
        serve(&mut cache, &[sys, a]);
        serve(&mut cache, &[sys, b]);
        assert_eq!(cache.evict(250, None), 250);
        t.cascade(&mut cache, Some(&mut remote));
        assert_eq!(t.cpu.offloaded_tokens, 400, "a and b went down whole");
        assert_eq!(remote.offloaded_tokens, 200, "the CPU tier's overflow (a) went on to remote");
        // b: 150 tokens left on the GPU, its 50-token tail in the CPU tier.
        assert_eq!(cache.cached_prefix(&[sys, b]), 250);
        assert_eq!(t.lookup(&[sys, b, seg(9, 10)], 250, Some(&mut remote)), [50, 0]);
        // a: only the system prompt on the GPU, a itself in remote.
        assert_eq!(cache.cached_prefix(&[sys, a]), 100);
        assert_eq!(t.lookup(&[sys, a], 100, Some(&mut remote)), [0, 200]);
        // The same segment under another path is other content: no match.
        assert_eq!(t.lookup(&[a], 0, Some(&mut remote)), [0, 0]);
        // Evicting the rest cascades sys (first cut) and nothing of b again (already down).
        assert_eq!(cache.evict(1000, None), 250);
        t.cascade(&mut cache, Some(&mut remote));
        assert_eq!(t.cpu.offloaded_tokens, 500);
        // CPU now holds b, sys (300): the match runs sys (cpu) → a (remote).
        assert_eq!(t.lookup(&[sys, a, b], 0, Some(&mut remote)), [100, 200]);
        // Without the remote tier, a is out of reach.
        assert_eq!(t.lookup(&[sys, a], 0, None), [100, 0]);
        cache.check();
    }

    /// Load-back time by hand: 1e9 tokens/s, 1 ms base, compute 10 ms, L = 4.
    #[test]
    fn a_load_lengthens_the_step_serially_or_layer_by_layer() {
        // 2e6 CPU tokens: 1 ms + 2 ms = 3 ms; serial step 13 ms.
        let mut t = tiers(10_000_000, false);
        t.add_load([1_500_000, 0]);
        t.add_load([500_000, 0]);
        assert!((t.step_time_s(0.010, None) - 0.013).abs() < 1e-12);
        assert!((t.load_s[0] - 0.003).abs() < 1e-12 && t.loaded_tokens == [2_000_000, 0]);
        assert!((t.stall_s - 0.003).abs() < 1e-12);
        assert_eq!(t.step_time_s(0.010, None), 0.010, "no load, no change; the loads were cleared");
        // Layer-wise, compute-bound: max(10 + 3/4, 3 + 10/4) = 10.75 ms.
        let mut t = tiers(10_000_000, true);
        t.add_load([2_000_000, 0]);
        assert!((t.step_time_s(0.010, None) - 0.010_75).abs() < 1e-12);
        // Layer-wise, load-bound: 1 ms + 39 ms = 40 ms; max(10 + 10, 40 + 2.5) = 42.5 ms.
        t.add_load([39_000_000, 0]);
        assert!((t.step_time_s(0.010, None) - 0.042_5).abs() < 1e-12);
        // The remote tier's link is shared by the replicas loading from it when a step starts:
        // a second replica's load of 1e6 tokens takes 1 ms + 2 × 1 ms; CPU and remote add up.
        let mut remote = KvTier::new(&spec(10_000_000), 1.0);
        let mut other = tiers(10, false);
        other.add_load([0, 1_000_000]);
        assert!((other.step_time_s(0.0, Some(&mut remote)) - 0.002).abs() < 1e-12);
        let mut t = tiers(10_000_000, false);
        t.add_load([1_000_000, 1_000_000]);
        assert!((t.step_time_s(0.010, Some(&mut remote)) - (0.010 + 0.002 + 0.003)).abs() < 1e-12);
        assert_eq!(remote.loading, 2);
        other.step_ended(Some(&mut remote));
        t.step_ended(Some(&mut remote));
        assert_eq!(remote.loading, 0);
    }
}
