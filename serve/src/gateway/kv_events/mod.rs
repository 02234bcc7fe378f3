//! `--kv-events`: the backends' own KV-cache events, in vLLM's or SGLang's wire format
//! ([`wire`]: the two are told apart by their shape, no flag needed), feed the policy's view of
//! each backend's cache.
//!
//! Per backend with events, a task subscribes (ZMQ SUB) to the engine's publisher. Each batch's
//! `BlockStored` / `BlockRemoved` / `AllBlocksCleared` updates that backend's [`KvIndex`] (which
//! prefixes it holds, as the gateway's segment paths: needs `--tokenizer`, since the events carry
//! token ids), under the routing lock:
//! - routers that ask for exact matches (`max_affinity`, `vllm_loadaware`, …) are shown, as
//!   `matched_tokens`, the longest prefix the engine holds or that requests in flight there are
//!   computing (the simulator's definition), instead of the gateway's guess from what it routed;
//! - routers that want evictions (`dynamo_kv{prefix_state: events}`, `llm_d{prefix_state:
//!   precise}`, `preble`) hear `on_evict` for each removed prefix (and every root on a clear).
//!
//! Sequence numbers: the first batch received starts the count (the gateway does not know what
//! the engine cached before it listened: those blocks' children cannot be placed, and are
//! counted as `unplaced`). A batch whose number is past the next expected one is a **gap**: the
//! task asks the replay socket (`replay=`, vLLM's `replay_endpoint`, a ROUTER) for the missing
//! batches (a DEALER sends `["", start_seq]`, reads `["", seq, payload]` until seq −1), 1 s per
//! answer. Filled: nothing is lost. Not filled (no replay socket, no answer, or the engine's
//! buffer no longer holds them), or a batch that cannot be decoded: the backend's event view is
//! **degraded** — its index is dropped (a lost `BlockRemoved` would otherwise leave a phantom
//! match forever) and its matches are the gateway's own guess (what it routed there, as without
//! events) united with what events arrive after, until the engine sends `AllBlocksCleared` or
//! restarts (a sequence number below the expected one: its cache is empty again), which makes it
//! live again. An index past its bound (`max_tokens`, twice the KV capacity) is
//! degraded the same way. Messages that are not `[topic, 8-byte seq, payload]`, or a payload
//! over [`MAX_PAYLOAD_BYTES`], are counted and dropped. All of it is on `/metrics`
//! (`routelab_gateway_kv_events_total{backend,outcome}`, `routelab_gateway_kv_blocks`,
//! `routelab_gateway_kv_events_live`, `routelab_gateway_kv_events_connected`, and
//! `routelab_gateway_kv_events_next_seq`: the sequence number expected next, every batch below it
//! applied — the gateway has caught up with an engine when it equals the number of batches the
//! engine published, which the engine's replay socket tells).
//!
//! Only GPU blocks (`medium` absent or `"GPU"`) count; a data-parallel engine publishes one
//! stream per rank (port + rank): give the backend the rank it serves.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use abi_stable::std_types::RSlice;
use bytes::Bytes;
use routelab_core::workload::InputError;
use routelab_policy_api::{Eviction, Segment};
use zeromq::{Socket as _, SocketRecv as _, SocketSend as _};

use super::Gateway;

pub mod index;
pub mod wire;

#[cfg(test)]
mod tests;

pub use index::KvIndex;

/// Largest payload decoded; a bigger one is dropped as malformed (vLLM's batches are a step's
/// events: a few hundred KB for a 100k-token prompt).
pub const MAX_PAYLOAD_BYTES: usize = 16 << 20;
/// Most batches read from one replay (vLLM keeps 10,000 by default).
const MAX_REPLAY: i64 = 100_000;
const REPLAY_WAIT: Duration = Duration::from_secs(1);

/// One backend's `--kv-events`.
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    /// The publisher's PUB socket, `tcp://host:port`.
    pub endpoint: String,
    /// Its replay ROUTER socket, if any.
    pub replay: Option<String>,
    /// The topic subscribed to (vLLM's default: every topic, "").
    pub topic: String,
}

/// `--kv-events` values, one per backend in `--backend` order (`none` for a backend without).
pub fn parse(raw: &[String], backends: usize) -> Result<Vec<Option<Spec>>, InputError> {
    const FIX: &str = "give one --kv-events per --backend, in the same order: tcp://HOST:PORT[,replay=tcp://HOST:PORT]\
                       [,topic=T] (vLLM's --kv-events-config endpoint and replay_endpoint), or none";
    if raw.is_empty() {
        return Ok(vec![None; backends]);
    }
    if raw.len() != backends {
        return Err(InputError::command_line(
            "--kv-events",
            format!("{} given for {backends} backends", raw.len()),
            FIX,
        ));
    }
    let tcp = |s: &str| -> Result<String, InputError> {
        let rest = s
            .strip_prefix("tcp://")
            .ok_or_else(|| InputError::command_line("--kv-events", format!("'{s}' is not tcp://"), FIX))?;
        match rest.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0) => Ok(s.to_string()),
            _ => Err(InputError::command_line("--kv-events", format!("'{s}' has no host:port"), FIX)),
        }
    };
    raw.iter()
        .map(|r| {
            if r == "none" {
                return Ok(None);
            }
            let mut parts = r.split(',');
            let endpoint = tcp(parts.next().unwrap_or_default())?;
            let mut spec = Spec { endpoint, replay: None, topic: String::new() };
            for p in parts {
                match p.split_once('=') {
                    Some(("replay", v)) => spec.replay = Some(tcp(v)?),
                    Some(("topic", v)) => spec.topic = v.to_string(),
                    _ => {
                        return Err(InputError::command_line(
                            "--kv-events",
                            format!("'{p}' in '{r}' is not replay= or topic="),
                            FIX,
                        ));
                    }
                }
            }
            Ok(Some(spec))
        })
        .collect()
}

/// One backend's event view (inside the routing lock).
#[derive(Debug)]
pub struct View {
    pub index: KvIndex,
    /// False after a loss (gap, undecodable batch, overflow) until a clear or a restart.
    pub live: bool,
    /// Path hashes of requests in flight to this backend, with counts (their blocks are being
    /// computed and will be stored).
    pub pending: HashMap<u64, u32>,
}

impl View {
    pub fn new(max_tokens: usize) -> Self {
        Self { index: KvIndex::new(max_tokens), live: true, pending: HashMap::new() }
    }
}

/// What happened to one backend's events, for `/metrics` and tests.
#[derive(Debug)]
pub struct Stats {
    pub outcomes: [AtomicU64; Outcome::ALL.len()],
    pub connected: AtomicBool,
    /// The sequence number expected next once the batches before it are applied (or found lost);
    /// −1 before the first batch.
    pub next_seq: AtomicI64,
}

impl Default for Stats {
    fn default() -> Self {
        Self { outcomes: Default::default(), connected: AtomicBool::new(false), next_seq: AtomicI64::new(-1) }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A batch applied.
    Applied,
    /// A gap filled from the replay socket.
    GapFilled,
    /// A gap not filled: the view degraded.
    GapLost,
    /// A message that was not `[topic, seq, payload]`, or a payload that did not decode.
    Malformed,
    /// The sequence went back: the engine restarted.
    Restart,
    /// The index outgrew its bound.
    Overflow,
}

impl Outcome {
    pub const ALL: [Outcome; 6] = [
        Outcome::Applied,
        Outcome::GapFilled,
        Outcome::GapLost,
        Outcome::Malformed,
        Outcome::Restart,
        Outcome::Overflow,
    ];
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Applied => "applied",
            Outcome::GapFilled => "gap_filled",
            Outcome::GapLost => "gap_lost",
            Outcome::Malformed => "malformed",
            Outcome::Restart => "restart",
            Outcome::Overflow => "overflow",
        }
    }
}

impl Stats {
    pub fn count(&self, o: Outcome) -> u64 {
        self.outcomes[o as usize].load(Ordering::Relaxed)
    }
    fn add(&self, o: Outcome) {
        self.outcomes[o as usize].fetch_add(1, Ordering::Relaxed);
    }
}

impl Gateway {
    /// Subscribes to backend `i`'s events until the task is aborted; reconnects after a second
    /// when the publisher is not there.
    pub async fn kv_events_loop(self: Arc<Self>, i: usize, spec: Spec) {
        let mut said = false;
        loop {
            let mut sub = zeromq::SubSocket::new();
            let connected = match sub.connect(&spec.endpoint).await {
                Ok(()) => sub.subscribe(&spec.topic).await,
                Err(e) => Err(e),
            };
            if let Err(e) = connected {
                if !said {
                    eprintln!(
                        "serve: KV events of {}: {}: {e}; retrying every second",
                        self.backends[i].url, spec.endpoint
                    );
                    said = true;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            eprintln!("serve: KV events of {} from {}", self.backends[i].url, spec.endpoint);
            self.kv_stats[i].connected.store(true, Ordering::Relaxed);
            // The SUB socket reconnects by itself; a receive error means it is closed.
            let mut expected = None;
            while let Ok(msg) = sub.recv().await {
                let frames = msg.into_vec();
                self.on_message(i, &spec, &frames, &mut expected).await;
            }
            self.kv_stats[i].connected.store(false, Ordering::Relaxed);
        }
    }

    async fn on_message(&self, i: usize, spec: &Spec, frames: &[Bytes], expected: &mut Option<i64>) {
        let stats = &self.kv_stats[i];
        let seq = match frames {
            [_topic, seq, payload] if payload.len() <= MAX_PAYLOAD_BYTES => wire::seq(seq).ok().filter(|&s| s >= 0),
            _ => None,
        };
        let Some(seq) = seq else { return stats.add(Outcome::Malformed) };
        match *expected {
            Some(e) if seq < e => {
                stats.add(Outcome::Restart);
                self.kv_clear(i);
            }
            Some(e) if seq > e => {
                let filled = match &spec.replay {
                    Some(r) => replay(r, e, seq).await.ok(),
                    None => None,
                };
                match filled {
                    Some(batches) => {
                        stats.add(Outcome::GapFilled);
                        for payload in batches {
                            self.apply_payload(i, &payload);
                        }
                    }
                    None => {
                        stats.add(Outcome::GapLost);
                        self.kv_degrade(i);
                    }
                }
            }
            _ => {}
        }
        *expected = Some(seq + 1);
        self.apply_payload(i, &frames[2]);
        stats.next_seq.store(seq + 1, Ordering::Relaxed);
    }

    fn apply_payload(&self, i: usize, payload: &[u8]) {
        match wire::decode(payload) {
            Ok(batch) => {
                self.apply(i, &batch);
                self.kv_stats[i].add(Outcome::Applied);
            }
            Err(e) => {
                self.kv_stats[i].add(Outcome::Malformed);
                eprintln!("serve: KV events of {}: a batch lost: {e}", self.backends[i].url);
                self.kv_degrade(i);
            }
        }
    }

    /// Applies one batch to backend `i`'s view; removed prefixes reach the router.
    pub fn apply(&self, i: usize, batch: &wire::Batch) {
        let now = self.now_s();
        let mut guard = self.routing.lock().expect("routing lock");
        let super::Routing { kv, router, wants_evictions, .. } = &mut *guard;
        let Some(view) = kv.get_mut(i).and_then(Option::as_mut) else { return };
        let mut evict = |path: &[Segment]| {
            if !*wants_evictions {
                return;
            }
            let e =
                Eviction { replica: i as u32, evicted_at: now, path: RSlice::from_slice(path), remaining_tokens: 0 };
            if let Err(e) = router.evicted(&e) {
                self.policy_errors.fetch_add(1, Ordering::Relaxed);
                eprintln!("serve: {e}");
            }
        };
        // Removals in a row are applied together (SGLang removes a node's pages first page
        // first, one event each: their prefixes are read before any goes).
        let mut removals: Vec<wire::BlockKey> = Vec::new();
        fn remove(view: &mut View, removals: &mut Vec<wire::BlockKey>, evict: &mut dyn FnMut(&[Segment])) {
            if let index::Applied::Removed(paths) = view.index.removed(removals) {
                paths.iter().for_each(|p| evict(p));
            }
            removals.clear();
        }
        for ev in &batch.events {
            if let wire::KvEvent::Removed { hashes, medium } = ev {
                if gpu(medium) {
                    removals.extend_from_slice(hashes);
                }
                continue;
            }
            remove(view, &mut removals, &mut evict);
            match ev {
                wire::KvEvent::Stored { hashes, parent, token_ids, block_size, medium } if gpu(medium) => {
                    if let index::Applied::Overflow = view.index.stored(hashes, *parent, token_ids, *block_size) {
                        self.kv_stats[i].add(Outcome::Overflow);
                        view.live = false;
                    }
                }
                wire::KvEvent::Cleared => {
                    view.index.for_each_prefix_leaf_first(&mut evict);
                    view.index.clear();
                    view.live = true;
                }
                _ => {}
            }
        }
        remove(view, &mut removals, &mut evict);
    }

    /// The engine restarted: its cache is empty, the view live.
    fn kv_clear(&self, i: usize) {
        let cleared = wire::Batch { ts: 0.0, events: vec![wire::KvEvent::Cleared], data_parallel_rank: None };
        self.apply(i, &cleared);
    }

    /// Events were lost: drop the index, fall back to the gateway's guess.
    fn kv_degrade(&self, i: usize) {
        let mut r = self.routing.lock().expect("routing lock");
        if let Some(view) = r.kv.get_mut(i).and_then(Option::as_mut) {
            view.index.clear();
            view.live = false;
        }
    }
}

fn gpu(medium: &Option<String>) -> bool {
    medium.as_deref().is_none_or(|m| m.eq_ignore_ascii_case("GPU"))
}

/// Batches `from..to` from a replay socket, or an error when it does not hold them all.
async fn replay(endpoint: &str, from: i64, to: i64) -> Result<Vec<Bytes>, String> {
    if to - from > MAX_REPLAY {
        return Err(format!("{} batches missed", to - from));
    }
    let mut dealer = zeromq::DealerSocket::new();
    let wait = |what: &'static str| move |_| format!("{what}: no answer in {REPLAY_WAIT:?}");
    tokio::time::timeout(REPLAY_WAIT, dealer.connect(endpoint))
        .await
        .map_err(wait("connect"))?
        .map_err(|e| e.to_string())?;
    let ask = zeromq::ZmqMessage::try_from(vec![Bytes::new(), Bytes::copy_from_slice(&from.to_be_bytes())])
        .map_err(|e| e.to_string())?;
    dealer.send(ask).await.map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let mut next = from;
    for _ in 0..=MAX_REPLAY {
        let msg = tokio::time::timeout(REPLAY_WAIT, dealer.recv())
            .await
            .map_err(wait("replay"))?
            .map_err(|e| e.to_string())?;
        let frames = msg.into_vec();
        let [_, seq, payload] = frames.as_slice() else {
            return Err("a replay answer that is not [\"\", seq, payload]".into());
        };
        let seq = wire::seq(seq).map_err(|e| e.to_string())?;
        if seq == -1 {
            break;
        }
        if seq == next && seq < to {
            out.push(payload.clone());
            next += 1;
        }
    }
    if next == to { Ok(out) } else { Err(format!("the replay held {from}..{next} of {from}..{to}")) }
}
