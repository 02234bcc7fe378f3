//! Precise prefix routing behind the gateway decides as the simulator does, request for request.
//!
//! Two `routelab emulate` engines publish their caches as KV events (one in vLLM's format, one in
//! SGLang's with 1-token pages); a gateway runs `dynamo_kv{prefix_state: events}` in front of
//! them, subscribed to both. A request stream with shared prefixes (six "system prompts", unique
//! suffixes, KV room for only part of it, so that the engines evict) goes through the gateway,
//! and the backend it chose for each request is compared with the simulator's choice for the same
//! stream: `run_cluster` on the same prompts (the gateway tokenizer's segments), two replicas of
//! the same GPU, model and memory fraction (so the same KV capacity, asserted), the same engine
//! knobs (`emulate`'s defaults are the cluster's), eviction notices delivered at once
//! (`eviction_delay_s: 0`), and the same seed (the gateway's `--seed` is the run's seed: both
//! hand their router `stream_seed(seed, "policy.router")`).
//!
//! What makes equality the right expectation: with the previous request finished, the router's
//! cost is its prefix overlap and the prompt's blocks (no load, no prefill queue on either side),
//! so the decision depends on the blocks it learnt at dispatch, the evictions it heard, and its
//! tie-breaking draws — each the same in both worlds only if the gateway heard every eviction the
//! engine made, in order, before the next request. The engines' caches are the simulator's replica
//! cache (`emulate` steps the same [`Replica`](routelab_core::sim::cluster::replica::Replica)),
//! fed the same prompts one at a time; their LRU order follows the cache's own counter, not time.
//! A control run of the simulator without eviction notices decides differently: the evictions
//! reach the decisions, so matching them shows that the events did.
//!
//! Timing is kept out: requests go one at a time, each sent only after the previous one completed
//! and the gateway applied every KV-event batch its engine had published by then (the gateway's
//! next expected sequence number against the engine's replay socket, which answers with the
//! batches from that number on: none once caught up). Under concurrency the two would differ by
//! design (event delivery lags the engine; the simulator's notices take `eviction_delay_s`).
//!
//! Warm-up: a PUB socket drops what it sends before a subscription arrives, so each engine is
//! first sent one-block prompts of words the stream never uses, directly, until the gateway has
//! applied one of its batches. They stay in the engine's cache and the simulator never sees them,
//! yet evict alike: they are the least recently used leaves, so an engine evicts them first and
//! then exactly as much of the stream's content as the simulator's replica does (a replica evicts
//! what it lacks room for, no more). The router hears those removals for prompts it never routed,
//! which change nothing.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use routelab_core::plugin::{Loader, PolicySpec};
use routelab_core::seeds::mix;
use routelab_core::workload::cluster::ClusterSpec;
use routelab_core::workload::generate::{GeneratedRequest, RequestStream};
use routelab_policy_api::PolicyKind;
use tokio::net::TcpListener;
use zeromq::{Socket as _, SocketRecv as _, SocketSend as _};

use super::emulated::{emulate_args, post};
use super::*;
use crate::emulate::Prepared;

const POLICY: &str = "dynamo_kv{prefix_state: events}";
const RUN_SEED: u64 = 7;
const REQUESTS: usize = 48;
/// An A6000 with Mistral-7B's weights and room for 461 tokens of KV: the engines evict prefixes
/// (with more room, few evictions reach a decision, and the control below would not tell).
const MEMORY_FRACTION: &str = "0.303";

/// Shared prefixes (word counts; not all whole blocks) and the stream's words.
const PREFIXES: [usize; 6] = [48, 88, 120, 64, 100, 136];

fn prefix_words(g: usize) -> impl Iterator<Item = String> {
    let from: usize = PREFIXES[..g].iter().sum();
    (from..from + PREFIXES[g]).map(|i| format!("w{i}"))
}

/// The stream: (prompt, max_tokens) per request, from a fixed seed. Groups are drawn skewed (the
/// first ones more often); each suffix opens with a word of its own, so no two prompts share a
/// block past their prefix.
fn requests() -> Vec<(String, u32)> {
    requests_with(&POPULARITY)
}

/// Groups by draw (a uniform draw of 10).
const POPULARITY: [usize; 10] = [0, 0, 0, 1, 1, 2, 2, 3, 4, 5];

fn requests_with(popularity: &[usize; 10]) -> Vec<(String, u32)> {
    (0..REQUESTS)
        .map(|i| {
            let r = mix(0x5eed ^ i as u64);
            let g = popularity[(r % 10) as usize];
            let suffix = 4 + (r >> 8) % 40;
            let words: Vec<String> = prefix_words(g)
                .chain(std::iter::once(format!("s{i}")))
                .chain((0..suffix).map(|k| format!("t{}", (k + (r >> 20)) % 64)))
                .collect();
            (words.join(" "), 2 + ((r >> 32) % 5) as u32)
        })
        .collect()
}

/// Every word the stream and the warm-up use.
fn vocabulary() -> Vec<String> {
    let prefixes = (0..PREFIXES.iter().sum()).map(|i| format!("w{i}"));
    let suffixes = (0..REQUESTS).map(|i| format!("s{i}")).chain((0..64).map(|k| format!("t{k}")));
    let warm = (0..64).map(|k| format!("x{k}"));
    prefixes.chain(suffixes).chain(warm).collect()
}

/// Warm-up prompt `k` of engine `e`: one block of words the stream never uses.
fn warm_up(e: usize, k: usize) -> String {
    let mut words = vec![format!("x{}", 32 * e + k % 32), format!("x{}", k / 32)];
    words.extend((0..14).map(|j| format!("x{}", 40 + j)));
    words.join(" ")
}

/// The cluster the engines emulate: two replicas as `routelab emulate`'s defaults describe one.
fn cluster(eviction_delay_s: f64, memory_fraction: &str) -> ClusterSpec {
    let yaml = format!(
        "{{replicas: 2, gpu: a6000, model: mistral-7b, tp: 1, memory_fraction: {memory_fraction}, \
         eviction_delay_s: {eviction_delay_s}, summary: exact, \
         generator: {{suffix_tokens: 1, output_tokens: 1}}, arrivals: {{poisson: {{rate: 1}}}}, requests: {REQUESTS}}}"
    );
    let spec: ClusterSpec = serde_norway::from_str(&yaml).expect("a cluster");
    spec.validate().expect("valid");
    spec
}

/// The simulator's backend per request: the same prompts (as the gateway segments them), 100 s
/// apart (each done long before the next).
fn simulate(tok: &crate::text::Tokenizer, policy: &str, eviction_delay_s: f64) -> (Vec<u32>, u64) {
    simulate_with(tok, policy, eviction_delay_s, MEMORY_FRACTION, &requests())
}

fn simulate_with(
    tok: &crate::text::Tokenizer,
    policy: &str,
    eviction_delay_s: f64,
    memory_fraction: &str,
    requests: &[(String, u32)],
) -> (Vec<u32>, u64) {
    let mut stream = RequestStream::default();
    let mut segs = Vec::new();
    for (i, (prompt, max_tokens)) in requests.iter().enumerate() {
        tok.segments(prompt, &mut segs);
        let from = stream.segments.len() as u32;
        stream.segments.extend_from_slice(&segs);
        stream.requests.push(GeneratedRequest {
            arrived_at: routelab_core::time::ticks(100.0 * i as f64),
            prompt_tokens: crate::text::tokens_of(&segs),
            output_tokens: *max_tokens,
            segments: from..stream.segments.len() as u32,
            output_segment: None,
        });
    }
    let spec = cluster(eviction_delay_s, memory_fraction);
    let models = routelab_core::workload::cluster::StepModels::resolve(&spec).expect("the step models");
    let ctx = routelab_core::sim::cluster::router_context_for(&spec, &models, RUN_SEED);
    let spec_p = PolicySpec::parse(policy).unwrap();
    let router = Loader::new().resolve(&spec_p, PolicyKind::Router).unwrap().router(&ctx).unwrap();
    let out = routelab_core::runner::run_cluster(&spec, &stream, router, policy, RUN_SEED).expect("runs");
    assert_eq!(out.metrics.get("completed"), Some(REQUESTS as f64));
    (out.records.iter().map(|r| r.replica).collect(), models.main.kv_capacity_tokens)
}

/// Batches an engine's replay socket holds from `from` on (vLLM's protocol: `["", from]`, answers
/// `["", seq, payload]` until seq −1).
async fn published_from(dealer: &mut zeromq::DealerSocket, from: i64) -> usize {
    let ask = zeromq::ZmqMessage::try_from(vec![Bytes::new(), Bytes::copy_from_slice(&from.to_be_bytes())]).unwrap();
    dealer.send(ask).await.unwrap();
    let mut n = 0;
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(5), dealer.recv()).await.expect("a replay answer").unwrap();
        let frames = msg.into_vec();
        if wire::seq(&frames[1]).unwrap() == -1 {
            return n;
        }
        n += 1;
    }
}

/// Waits until the gateway has applied every batch engine `e` published.
async fn caught_up(gw: &Gateway, e: usize, dealer: &mut zeromq::DealerSocket) {
    for _ in 0..2000 {
        let next = gw.kv_stats[e].next_seq.load(Ordering::Relaxed);
        if next >= 0 && published_from(dealer, next).await == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("the gateway never caught up with engine {e}'s KV events");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn precise_dynamo_kv_behind_the_gateway_decides_as_the_simulator() {
    let words = vocabulary();
    let refs: Vec<&str> = words.iter().map(String::as_str).collect();
    let path = std::env::temp_dir().join(format!("routelab-kv-parity-tokenizer-{}.json", std::process::id()));
    std::fs::write(&path, crate::text::tests::word_level(&refs)).unwrap();

    let mut engines: Vec<SocketAddr> = Vec::new();
    let mut subscriptions = Vec::new();
    let mut dealers = Vec::new();
    let mut capacity = 0;
    for format in ["format=vllm", "format=sglang,page=1"] {
        let args = emulate_args(&[
            "--memory-fraction".into(),
            MEMORY_FRACTION.into(),
            "--time-scale".into(),
            "0.01".into(),
            "--tokenizer".into(),
            path.display().to_string(),
            "--kv-events".into(),
            format!("tcp://127.0.0.1:0,replay=tcp://127.0.0.1:0,{format}"),
        ]);
        let mut prepared = Prepared::new(&args).expect("starts");
        let bound = prepared.bind_kv_events().await.unwrap().expect("bound");
        let replay = bound.replay.unwrap();
        let mut dealer = zeromq::DealerSocket::new();
        dealer.connect(&replay).await.unwrap();
        dealers.push(dealer);
        subscriptions.push(format!("{},replay={replay}", bound.endpoint));
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        engines.push(l.local_addr().unwrap());
        capacity = args.hardware.step_model().unwrap().kv_capacity_tokens;
        tokio::spawn(prepared.run(l, std::future::pending()));
    }
    let urls: Vec<String> = engines.iter().map(|a| format!("http://{a}")).collect();
    let mut args = ServeArgs::with_backends(&urls);
    args.policy = POLICY.into();
    args.seed = RUN_SEED;
    args.hardware.memory_fraction = MEMORY_FRACTION.parse().unwrap();
    args.tokenizer = Some(path.clone());
    args.kv_events = subscriptions;
    let gw = Arc::new(Gateway::new(args).expect("starts"));
    let _ = std::fs::remove_file(&path);
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gateway = l.local_addr().unwrap();
    tokio::spawn(crate::proxy::run(gw.clone(), l, std::future::pending()));

    // The simulator first (it needs no network): its decisions, and the control's.
    let (expected, sim_capacity) = simulate(&gw.tokenizer, POLICY, 0.0);
    let (deaf, _) = simulate(&gw.tokenizer, POLICY, 1e6);
    assert_eq!(sim_capacity, capacity, "the simulator's replicas have the engines' KV capacity");

    for (e, &engine) in engines.iter().enumerate() {
        let mut k = 0;
        while gw.kv_stats[e].count(Outcome::Applied) == 0 {
            assert!(k < 500, "engine {e}'s events never reached the gateway");
            post(engine, "/v1/completions", &format!(r#"{{"prompt": "{}", "max_tokens": 1}}"#, warm_up(e, k))).await;
            tokio::time::sleep(Duration::from_millis(20)).await;
            k += 1;
        }
        caught_up(&gw, e, &mut dealers[e]).await;
    }

    let mut chosen = Vec::new();
    for (i, (prompt, max_tokens)) in requests().iter().enumerate() {
        let before: Vec<u64> = gw.backends.iter().map(|b| b.dispatched.load(Ordering::Relaxed)).collect();
        post(gateway, "/v1/completions", &format!(r#"{{"prompt": "{prompt}", "max_tokens": {max_tokens}}}"#)).await;
        let went: Vec<usize> =
            (0..2).filter(|&b| gw.backends[b].dispatched.load(Ordering::Relaxed) > before[b]).collect();
        assert_eq!(went.len(), 1, "request {i} was dispatched once: {went:?}");
        chosen.push(went[0] as u32);
        // Its end reached the router, and every KV event either engine published reached the gateway.
        for _ in 0..2000 {
            if gw.backends.iter().all(|b| b.in_flight.load(Ordering::Relaxed) == 0) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(gw.backends.iter().all(|b| b.in_flight.load(Ordering::Relaxed) == 0), "request {i} never ended");
        for (e, dealer) in dealers.iter_mut().enumerate() {
            caught_up(&gw, e, dealer).await;
        }
    }

    for (e, stats) in gw.kv_stats.iter().enumerate() {
        assert_eq!(
            (stats.count(Outcome::Malformed), stats.count(Outcome::GapLost), stats.count(Outcome::Overflow)),
            (0, 0, 0),
            "engine {e}: every batch read"
        );
    }
    let errors = gw.policy_errors.load(Ordering::Relaxed);
    assert_eq!(errors, 0, "the policy never failed (no request went by the fallback)");
    assert_eq!(chosen, expected, "the gateway's backend per request against the simulator's");
    assert_ne!(deaf, expected, "the evictions change decisions: without their notices the simulator decides otherwise");
    for b in 0..2 {
        assert!(expected.contains(&b), "both backends serve: {expected:?}");
    }
}
