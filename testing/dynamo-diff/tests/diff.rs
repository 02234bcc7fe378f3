//! Differential test: routelab's `dynamo_kv` against NVIDIA Dynamo's router crate
//! (`dynamo-kv-router` =1.6.1) on identical states.
//!
//! Upstream's state cannot be injected, so both routers are driven through their public APIs
//! with the same event sequence, seeded: requests (random prefixes: shared system prompts,
//! documents, conversations that extend an earlier prompt, unique tails, block-unaligned
//! lengths, now and then a prompt shorter than a block or empty), dispatches, first tokens,
//! completions and evictions, on 1–16 workers, block sizes 4/16/32, credits, load scales,
//! both cost formulas (aggregated/prefill with prefill tracking, decode without), the
//! active-request weight (`decode_active_request_weight`, 0 to upstream's agentic 64) and
//! temperatures 0 and > 0. Upstream's side is the real thing end to end: its XXH3 block hashing
//! over token ids, its `RadixTree` fed KV `Stored`/`Removed` events, its
//! `ActiveSequencesMultiWorker` for active blocks and prefill tokens (a request's prefill
//! released by `mark_prefill_completed`, as at its first token), and its reference
//! `DefaultWorkerSelector` (the `bench` feature) for the costs and the pick.
//!
//! Per decision it asserts: every worker's cost equal (upstream's costs are read from the debug
//! line `worker_logit` writes, printed to 3 decimals; every cost here is a multiple of 1/64, so
//! 3 decimals tell them apart), the cheapest-worker sets equal at temperature 0 (and upstream's
//! pick among them), and at temperature > 0 the same pick from the same draw (upstream's
//! seeded selector draws one `fastrand` f64; routelab's `softmax_sample_index` gets that f64).
//! Both routers are then told the same dispatch: upstream's pick.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt::Write;
use std::sync::{Arc, Mutex};
use tokio::time::Instant;

use abi_stable::std_types::{RNone, RSlice};
use dynamo_kv_router::indexer::TieredMatchDetails;
use dynamo_kv_router::protocols::{
    BlockHashOptions, ExternalSequenceBlockHash, KvCacheEvent, KvCacheEventData, KvCacheRemoveData, KvCacheStoreData,
    KvCacheStoredBlockData, PrefillLoadHint, RoutingConstraints, WorkerWithDpRank, compute_block_hash_for_seq,
    compute_seq_hash_for_block,
};
use dynamo_kv_router::scheduling::{OverlapAnalysis, ScheduleMode};
use dynamo_kv_router::test_utils::SimpleWorkerConfig;
use dynamo_kv_router::{
    ActiveSequencesMultiWorker, DefaultWorkerSelector, KvRouterConfig, NoopSequencePublisher, RadixTree, RouterEvent,
    SchedulingRequest, SequenceRequest, WorkerSelectionInput, WorkerSelector,
};
use routelab_policies::dynamo_kv::{self, DynamoKv, Role};
use routelab_policy_api::*;
use tracing_subscriber::layer::{Context, SubscriberExt};

/// Collects upstream's per-worker cost lines ("Formula for worker_id=… cached blocks: 12.250 = …").
struct Logits(Arc<Mutex<Vec<(u64, String)>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Logits {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        if *event.metadata().level() != tracing::Level::DEBUG {
            return;
        }
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                if f.name() == "message" {
                    let _ = write!(self.0, "{v:?}");
                }
            }
        }
        let mut m = Message(String::new());
        event.record(&mut m);
        let Some(rest) = m.0.strip_prefix("Formula for worker_id=") else { return };
        let worker = rest[..rest.find(' ').unwrap()].parse().unwrap();
        let at = rest.find("cached blocks: ").expect("a cost line") + "cached blocks: ".len();
        let cost = rest[at..].split(' ').next().unwrap().to_string();
        self.0.lock().unwrap().push((worker, cost));
    }
}

/// One scenario's configuration, drawn from the seed.
#[derive(Clone, Copy, Debug)]
struct Scenario {
    workers: u32,
    block: u32,
    credit: f64,
    scale: f64,
    temperature: f64,
    /// `decode_active_request_weight`: block-equivalents per request in flight on the worker.
    active_weight: f64,
    role: Role,
    /// Upstream's worker label for the aggregated formula ("prefill" or "decode": the label
    /// Dynamo gives aggregated workers; only `decode` without prefill tracking changes the formula).
    label: &'static str,
}

fn pick<T: Copy>(rng: &mut fastrand::Rng, xs: &[T]) -> T {
    xs[rng.usize(0..xs.len())]
}

impl Scenario {
    fn draw(rng: &mut fastrand::Rng) -> Self {
        let role = pick(rng, &[Role::Aggregated, Role::Aggregated, Role::Decode]);
        Self {
            workers: rng.u32(1..=16),
            block: pick(rng, &[4, 16, 16, 32]),
            credit: pick(rng, &[0.0, 0.5, 1.0, 1.0, 2.0]),
            scale: pick(rng, &[0.0, 0.5, 1.0, 1.0, 2.0]),
            temperature: pick(rng, &[0.0, 0.0, 0.5, 1.0]),
            active_weight: pick(rng, &[0.0, 0.0, 0.5, 1.0, 64.0]),
            role,
            label: if role == Role::Decode { "decode" } else { pick(rng, &["prefill", "decode"]) },
        }
    }
    fn tracks_prefill(&self) -> bool {
        self.role == Role::Aggregated
    }
}

/// The token ids of a segment: a function of its id, so equal ids mean equal tokens.
fn tokens_of(prompt: &[Segment]) -> Vec<u32> {
    let mut out = Vec::new();
    for s in prompt {
        out.extend((0..s.tokens).map(|i| (mix64(s.id ^ ((i as u64) << 40)) >> 32) as u32));
    }
    out
}

/// Upstream's block hashes of a prompt: (local, sequence) per full block.
fn hashes(prompt: &[Segment], block: u32) -> (Vec<dynamo_kv_router::LocalBlockHash>, Vec<u64>) {
    let local = compute_block_hash_for_seq(&tokens_of(prompt), block, BlockHashOptions::default());
    let seq = compute_seq_hash_for_block(&local);
    (local, seq)
}

/// Prompts with shared prefixes: a system prompt, maybe documents, maybe an earlier prompt it
/// continues, and a tail of its own; segment lengths are not block multiples.
struct Prompts {
    systems: Vec<Segment>,
    docs: Vec<Segment>,
    earlier: Vec<Vec<Segment>>,
    next_id: u64,
}

impl Prompts {
    fn new(rng: &mut fastrand::Rng) -> Self {
        let systems = (0..rng.u64(1..6)).map(|i| Segment { id: 1 + i, tokens: rng.u32(1..400) }).collect();
        let docs = (0..rng.u64(1..10)).map(|i| Segment { id: 100 + i, tokens: rng.u32(1..600) }).collect();
        Self { systems, docs, earlier: Vec::new(), next_id: 1_000 }
    }
    fn next(&mut self, rng: &mut fastrand::Rng) -> Vec<Segment> {
        self.next_id += 1;
        let tail = Segment { id: self.next_id, tokens: rng.u32(1..300) };
        let p = match rng.u32(0..100) {
            0 => Vec::new(),
            1..=3 => vec![Segment { id: self.next_id, tokens: rng.u32(1..16) }],
            4..=30 if !self.earlier.is_empty() => {
                let mut p = self.earlier[rng.usize(0..self.earlier.len())].clone();
                p.push(tail);
                p
            }
            _ => {
                let mut p = vec![pick(rng, &self.systems)];
                for _ in 0..rng.usize(0..3) {
                    p.push(pick(rng, &self.docs));
                }
                p.push(tail);
                p
            }
        };
        if !p.is_empty() && p.len() < 12 {
            self.earlier.push(p.clone());
        }
        p
    }
}

/// Counts over the run.
#[derive(Default, Debug)]
struct Counts {
    scenarios: u64,
    decisions: u64,
    argmin_decisions: u64,
    ties: u64,
    softmax_decisions: u64,
    /// Decisions with a positive active-request weight while some worker had requests in flight.
    active_weighted: u64,
    costs_compared: u64,
    first_tokens: u64,
    completions: u64,
    evicted_paths: u64,
}

struct Upstream {
    tree: RadixTree,
    seqs: ActiveSequencesMultiWorker<NoopSequencePublisher>,
    workers: HashMap<u64, SimpleWorkerConfig>,
    config: KvRouterConfig,
    event_id: u64,
}

impl Upstream {
    fn new(s: &Scenario) -> Self {
        let ranges = (0..s.workers as u64).map(|w| (w, (0, 1))).collect();
        let seqs = ActiveSequencesMultiWorker::new_without_expiry(
            NoopSequencePublisher,
            s.block as usize,
            ranges,
            false,
            0,
            s.label,
        );
        let config = KvRouterConfig {
            overlap_score_credit: s.credit,
            prefill_load_scale: s.scale,
            router_temperature: s.temperature,
            decode_active_request_weight: s.active_weight,
            ..Default::default()
        };
        let workers = (0..s.workers as u64).map(|w| (w, SimpleWorkerConfig::default())).collect();
        Self { tree: RadixTree::new(), seqs, workers, config, event_id: 0 }
    }

    fn event(&mut self, worker: u64, data: KvCacheEventData) {
        self.event_id += 1;
        let e = KvCacheEvent { event_id: self.event_id, data, dp_rank: 0 };
        // A removal may name a block an earlier truncation already dropped: upstream skips it.
        let _ = self.tree.apply_event(RouterEvent::new(worker, e));
    }
}

fn worker(w: u64) -> WorkerWithDpRank {
    WorkerWithDpRank::new(w, 0)
}

fn request_for(
    s: &Scenario,
    up: &Upstream,
    isl: usize,
    local: &[dynamo_kv_router::LocalBlockHash],
    seq: &[u64],
    now: Instant,
) -> SchedulingRequest {
    let tiered =
        TieredMatchDetails { device: up.tree.find_match_details(local.to_vec(), false), lower_tier: HashMap::new() };
    let overlap = OverlapAnalysis::new(&up.config, s.block, &tiered).signals();
    SchedulingRequest {
        mode: ScheduleMode::QueryOnly { request_id: None },
        token_seq: Some(seq.to_vec()),
        isl_tokens: isl,
        lora_name: None,
        expected_output_tokens: None,
        affinity_target: None,
        pinned_worker: None,
        allowed_worker_ids: None,
        routing_constraints: RoutingConstraints::default(),
        router_config_override: None,
        track_prefill_tokens: s.tracks_prefill(),
        priority_jump: 0.0,
        strict_priority: 0,
        policy_class: None,
        session_context: None,
        overlap,
        kv_transfer_candidates: None,
        retain_kv_transfer_chain: false,
        shared_cache_hits: None,
        worker_loads: up.seqs.project_worker_loads(Some(seq), now),
        resp_tx: None,
    }
}

/// Blocks (indices) a path's last segment completes.
fn last_segment_blocks(path: &[Segment], block: u32) -> std::ops::Range<usize> {
    let end: u32 = path.iter().map(|s| s.tokens).sum();
    let start = end - path.last().map_or(0, |s| s.tokens);
    (start / block) as usize..(end / block) as usize
}

fn run_scenario(seed: u64, decisions: u64, logits: &Arc<Mutex<Vec<(u64, String)>>>, counts: &mut Counts) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let s = Scenario::draw(&mut rng);
    let n = s.workers as usize;
    let ctx = RouterContext {
        world: World::Cluster,
        replicas: s.workers,
        seed,
        kv_capacity_tokens: 0,
        cost: RNone,
        disaggregation: RNone, facts: Default::default(),
    };
    let cfg = dynamo_kv::Config {
        block_tokens: s.block,
        overlap_score_credit: s.credit,
        prefill_load_scale: s.scale,
        temperature: s.temperature,
        decode_active_request_weight: s.active_weight,
        role: s.role,
        ..Default::default()
    };
    let mut ours = DynamoKv::new(cfg, &ctx).unwrap();
    let mut up = Upstream::new(&s);
    let mut prompts = Prompts::new(&mut rng);
    let now = Instant::now();
    // Per worker: requests whose first token is not out (oldest first), requests decoding, and
    // the prompt paths (every prefix of every prompt dispatched there) its cache holds.
    let mut prefilling: Vec<VecDeque<u64>> = vec![VecDeque::new(); n];
    let mut decoding: Vec<Vec<u64>> = vec![Vec::new(); n];
    let mut cached: Vec<HashSet<Vec<Segment>>> = vec![HashSet::new(); n];
    let mut probabilities = Vec::new();
    counts.scenarios += 1;
    for id in 0..decisions {
        // Events since the last decision.
        for _ in 0..rng.usize(0..4) {
            let w = rng.usize(0..n);
            match rng.u32(0..10) {
                0..=3 => {
                    if let Some(r) = prefilling[w].pop_front() {
                        up.seqs.mark_prefill_completed(&format!("r{r}"), now).unwrap();
                        decoding[w].push(r);
                        counts.first_tokens += 1;
                    }
                }
                4..=7 => {
                    if !decoding[w].is_empty() {
                        let at = rng.usize(0..decoding[w].len());
                        let r = decoding[w].swap_remove(at);
                        up.seqs.free(&format!("r{r}"), now).unwrap();
                        ours.on_complete(&Completion {
                            request_id: r,
                            replica: w as u32,
                            arrived_at: 0.0,
                            completed_at: 0.0,
                            ttft: 0.0,
                            prompt_tokens: 0,
                            cached_tokens: 0,
                            output_tokens: 1,
                        });
                        counts.completions += 1;
                    }
                }
                _ => {
                    // Evict a cached path and everything cached below it, deepest first (a
                    // radix cache evicts leaves), as both routers' KV events.
                    let paths: Vec<&Vec<Segment>> = cached[w].iter().collect();
                    if paths.is_empty() {
                        continue;
                    }
                    let root = paths[rng.usize(0..paths.len())].clone();
                    let mut gone: Vec<Vec<Segment>> =
                        cached[w].iter().filter(|p| p.starts_with(&root)).cloned().collect();
                    gone.sort_by_key(|p| std::cmp::Reverse(p.len()));
                    let mut removed = Vec::new();
                    for p in &gone {
                        cached[w].remove(p);
                        ours.on_evict(&Eviction {
                            replica: w as u32,
                            evicted_at: id as f64,
                            path: RSlice::from_slice(p),
                            remaining_tokens: 0,
                        });
                        let (_, seq) = hashes(p, s.block);
                        removed.extend(last_segment_blocks(p, s.block).map(|b| ExternalSequenceBlockHash(seq[b])));
                        counts.evicted_paths += 1;
                    }
                    if !removed.is_empty() {
                        up.event(w as u64, KvCacheEventData::Removed(KvCacheRemoveData { block_hashes: removed }));
                    }
                }
            }
        }

        // The decision.
        let prompt = prompts.next(&mut rng);
        let isl: u32 = prompt.iter().map(|s| s.tokens).sum();
        let req = Request::new(id, id as f64 * 0.01, isl).with_segments(&prompt);
        // What routelab sees: each prefilling request is either still queued or admitted.
        let mut views = vec![ReplicaView::default(); n];
        let mut signal = vec![0.0; n];
        for w in 0..n {
            let owed = prefilling[w].len() as u32;
            let waiting = rng.u32(0..=owed);
            views[w] = ReplicaView { waiting, running: owed - waiting, ..Default::default() };
            signal[w] = (owed - waiting) as f64;
        }
        let replicas = Replicas::with_signals(&views, &signal, 1);
        let ours_costs = ours.costs(&req, &replicas).to_vec();

        let (local, seq) = hashes(&prompt, s.block);
        let sreq = request_for(&s, &up, isl as usize, &local, &seq, now);
        let draw_seed = rng.u64(..);
        logits.lock().unwrap().clear();
        let selector = DefaultWorkerSelector::new_seeded(Some(up.config.clone()), s.label, draw_seed);
        let chosen = selector
            .select_worker(WorkerSelectionInput::configured(&up.workers, &sreq, sreq.eligibility(), s.block))
            .unwrap();
        let chosen_w = chosen.worker.worker_id as usize;
        let mut theirs = vec![String::new(); n];
        for (w, c) in logits.lock().unwrap().drain(..) {
            theirs[w as usize] = c;
        }
        let ctx_msg = || format!("seed {seed} decision {id} {s:?} prompt {prompt:?}");
        for w in 0..n {
            assert_eq!(format!("{:.3}", ours_costs[w]), theirs[w], "worker {w}'s cost; {}", ctx_msg());
        }
        counts.costs_compared += n as u64;
        if s.temperature == 0.0 {
            let min = ours_costs.iter().copied().fold(f64::INFINITY, f64::min);
            let ours_set: Vec<usize> = (0..n).filter(|&w| ours_costs[w] == min).collect();
            let up_costs: Vec<f64> = theirs.iter().map(|c| c.parse().unwrap()).collect();
            let up_min = up_costs.iter().copied().fold(f64::INFINITY, f64::min);
            let up_set: Vec<usize> = (0..n).filter(|&w| up_costs[w] == up_min).collect();
            assert_eq!(ours_set, up_set, "cheapest workers; {}", ctx_msg());
            assert!(up_set.contains(&chosen_w), "upstream picks among its cheapest; {}", ctx_msg());
            counts.argmin_decisions += 1;
            counts.ties += u64::from(ours_set.len() > 1);
        } else {
            let u = fastrand::Rng::with_seed(draw_seed).f64();
            let ours_pick = dynamo_kv::softmax_sample_index(&ours_costs, s.temperature, u, &mut probabilities);
            assert_eq!(ours_pick, chosen_w, "softmax pick at draw {u}; costs {ours_costs:?}; {}", ctx_msg());
            counts.softmax_decisions += 1;
        }
        counts.decisions += 1;
        let in_flight = (0..n).any(|w| !prefilling[w].is_empty() || !decoding[w].is_empty());
        counts.active_weighted += u64::from(s.active_weight > 0.0 && in_flight);

        // Both are told the dispatch: upstream's pick.
        let cached_blocks = sreq.overlap.effective_overlap_blocks.get(&worker(chosen_w as u64)).copied().unwrap_or(0.0);
        let hint = s.tracks_prefill().then(|| PrefillLoadHint {
            initial_effective_prefill_tokens: (isl as usize).saturating_sub(cached_blocks as usize * s.block as usize),
            expected_prefill_duration: None,
        });
        up.seqs
            .add_request(
                SequenceRequest {
                    request_id: format!("r{id}"),
                    token_sequence: Some(seq.clone()),
                    track_prefill_tokens: s.tracks_prefill(),
                    expected_output_tokens: None,
                    prefill_load_hint: hint,
                    worker: worker(chosen_w as u64),
                    lora_name: None,
                },
                now,
            )
            .unwrap();
        // KV events: the blocks beyond the cached prefix are stored under their parent.
        let k = cached_blocks as usize;
        if k < seq.len() {
            let blocks = (k..seq.len())
                .map(|b| KvCacheStoredBlockData {
                    block_hash: ExternalSequenceBlockHash(seq[b]),
                    tokens_hash: local[b],
                    mm_extra_info: None,
                })
                .collect();
            let parent_hash = (k > 0).then(|| ExternalSequenceBlockHash(seq[k - 1]));
            up.event(
                chosen_w as u64,
                KvCacheEventData::Stored(KvCacheStoreData { parent_hash, start_position: None, blocks }),
            );
        }
        ours.on_dispatch(&req, chosen_w);
        for len in 1..=prompt.len() {
            cached[chosen_w].insert(prompt[..len].to_vec());
        }
        prefilling[chosen_w].push_back(id);
    }
}

/// 800 scenarios of 400 decisions: 320,000 decisions (`DYNAMO_DIFF_SCENARIOS`,
/// `DYNAMO_DIFF_DECISIONS` change them).
#[test]
fn dynamo_kv_matches_dynamo_kv_router_1_6_1() {
    let scenarios: u64 = std::env::var("DYNAMO_DIFF_SCENARIOS").ok().and_then(|v| v.parse().ok()).unwrap_or(800);
    let decisions: u64 = std::env::var("DYNAMO_DIFF_DECISIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(400);
    let logits = Arc::new(Mutex::new(Vec::new()));
    let _guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(Logits(logits.clone())));
    let mut counts = Counts::default();
    for seed in 0..scenarios {
        run_scenario(seed, decisions, &logits, &mut counts);
    }
    println!("{counts:#?}");
    assert_eq!(counts.decisions, scenarios * decisions);
    assert!(counts.ties > 0 && counts.softmax_decisions > 0 && counts.evicted_paths > 0 && counts.first_tokens > 0);
    assert!(counts.active_weighted > 0, "no decision weighed requests in flight: {counts:?}");
}

/// `pd_dynamo`'s bypass rule against upstream's `IslBoundingPolicy` (`src/conditional_disagg.rs`)
/// on random prompts, decode-side hits and thresholds, edges included (empty prompts, hits
/// longer than the prompt, thresholds 0 and 1).
#[test]
fn isl_bounding_matches_upstreams_policy() {
    use dynamo_kv_router::conditional_disagg::{
        ConditionalDisaggDecisionInput, ConditionalDisaggPolicy, IslBoundingPolicy,
    };
    use routelab_policies::pd::pd_dynamo::isl_bounding;
    use std::task::{Context, Poll, Waker};

    let mut rng = fastrand::Rng::with_seed(7);
    let (mut bypassed, mut cases) = (0, 0);
    for _ in 0..200_000 {
        let prompt = if rng.bool() { pick(&mut rng, &[0, 1, 511, 512, 2048, 4000, 30_000]) } else { rng.u32(0..8_000) };
        let cached = match rng.u32(0..4) {
            0 => prompt,
            1 => prompt + rng.u32(0..100),
            _ => rng.u32(0..=prompt),
        };
        let threshold = pick(&mut rng, &[0, 1, 2048, 2048, 10_000]);
        let ratio = pick(&mut rng, &[0.0, 0.3, 0.7, 0.7, 1.0]);
        let policy = IslBoundingPolicy::new(true, threshold as usize, ratio);
        let input = ConditionalDisaggDecisionInput::new(prompt as usize, cached as usize);
        let mut future = policy.should_bypass_remote_prefill(input);
        let Poll::Ready(theirs) = future.as_mut().poll(&mut Context::from_waker(Waker::noop())) else {
            panic!("upstream's rule is synchronous")
        };
        assert_eq!(isl_bounding(prompt, cached, threshold, ratio), theirs, "{prompt} {cached} {threshold} {ratio}");
        bypassed += u32::from(theirs);
        cases += 1;
    }
    assert!(bypassed > 1_000 && bypassed < cases - 1_000, "both outcomes occur: {bypassed} of {cases}");
}
