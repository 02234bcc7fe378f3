use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use rmpv::Value;
use routelab_policy_api::Segment;
use zeromq::{Socket as _, SocketRecv as _, SocketSend as _};

use super::index::{Applied, KvIndex};
use super::wire::{self, KvEvent};
use super::*;
use crate::gateway::{Gateway, ServeArgs};

/// A `KVEventBatch` as vLLM @0181ea31 sends it, written byte by byte from
/// `vllm/distributed/kv_events.py`: msgspec encodes a struct as a map of its fields in
/// declaration order, a `tag=True` struct with `"type": <class name>` first, leaves out fields
/// equal to their defaults (`omit_defaults`), floats as float64, bytes as bin, ints in their
/// shortest form. `ZmqEventPublisher.publish` fills `data_parallel_rank` (0 here).
const HAND_WRITTEN: &[u8] = &[
    0x83, // KVEventBatch: map of 3
    0xa2, b't', b's', 0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0, // "ts": 1.5
    0xa6, b'e', b'v', b'e', b'n', b't', b's', 0x92, // "events": array of 2
    0x88, // BlockStored: map of 8 (extra_keys, group_idx, kv_cache_spec_* omitted as None)
    0xa4, b't', b'y', b'p', b'e', 0xab, b'B', b'l', b'o', b'c', b'k', b'S', b't', b'o', b'r', b'e', b'd', 0xac, b'b',
    b'l', b'o', b'c', b'k', b'_', b'h', b'a', b's', b'h', b'e', b's', 0x91, 0xc4, 0x20, // [bin 32]
    0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, //
    0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, //
    0xb1, b'p', b'a', b'r', b'e', b'n', b't', b'_', b'b', b'l', b'o', b'c', b'k', b'_', b'h', b'a', b's', b'h', 0xc0,
    0xa9, b't', b'o', b'k', b'e', b'n', b'_', b'i', b'd', b's', 0xdc, 0x00, 0x10, // array16 of 16
    0xcd, 0x01, 0x2c, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, // 300 (uint16), 1..15
    0xaa, b'b', b'l', b'o', b'c', b'k', b'_', b's', b'i', b'z', b'e', 0x10, // 16
    0xa7, b'l', b'o', b'r', b'a', b'_', b'i', b'd', 0xc0, // None
    0xa6, b'm', b'e', b'd', b'i', b'u', b'm', 0xa3, b'G', b'P', b'U', // "GPU"
    0xa9, b'l', b'o', b'r', b'a', b'_', b'n', b'a', b'm', b'e', 0xc0, // None
    0x83, // BlockRemoved: map of 3 (group_idx omitted)
    0xa4, b't', b'y', b'p', b'e', 0xac, b'B', b'l', b'o', b'c', b'k', b'R', b'e', b'm', b'o', b'v', b'e', b'd', 0xac,
    b'b', b'l', b'o', b'c', b'k', b'_', b'h', b'a', b's', b'h', b'e', b's', 0x91, 0xcf, // [uint64]
    0x80, 0, 0, 0, 0, 0, 0, 1, //
    0xa6, b'm', b'e', b'd', b'i', b'u', b'm', 0xc0, // None
    0xb2, b'd', b'a', b't', b'a', b'_', b'p', b'a', b'r', b'a', b'l', b'l', b'e', b'l', b'_', b'r', b'a', b'n', b'k',
    0x00,
];

fn hand_ids() -> Vec<u32> {
    std::iter::once(300).chain(1..16).collect()
}

/// Encodes as msgspec does (map form; see [`HAND_WRITTEN`]).
fn batch(events: Vec<Value>) -> Vec<u8> {
    let v = Value::Map(vec![
        ("ts".into(), Value::F64(1.5)),
        ("events".into(), Value::Array(events)),
        ("data_parallel_rank".into(), 0.into()),
    ]);
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &v).unwrap();
    out
}

fn stored(hashes: &[Value], parent: Option<Value>, ids: &[u32], medium: Option<&str>) -> Value {
    Value::Map(vec![
        ("type".into(), "BlockStored".into()),
        ("block_hashes".into(), Value::Array(hashes.to_vec())),
        ("parent_block_hash".into(), parent.unwrap_or(Value::Nil)),
        ("token_ids".into(), Value::Array(ids.iter().map(|&t| t.into()).collect())),
        ("block_size".into(), 16.into()),
        ("lora_id".into(), Value::Nil),
        ("medium".into(), medium.map_or(Value::Nil, Into::into)),
        ("lora_name".into(), Value::Nil),
    ])
}

fn removed(hashes: &[Value]) -> Value {
    Value::Map(vec![
        ("type".into(), "BlockRemoved".into()),
        ("block_hashes".into(), Value::Array(hashes.to_vec())),
        ("medium".into(), Value::Nil),
    ])
}

fn cleared() -> Value {
    Value::Map(vec![("type".into(), "AllBlocksCleared".into())])
}

fn h(n: u8) -> Value {
    Value::Binary(vec![n; 32])
}

fn key(v: &Value) -> u64 {
    match wire::decode(&batch(vec![removed(std::slice::from_ref(v))])).unwrap().events[0].clone() {
        KvEvent::Removed { hashes, .. } => hashes[0],
        e => panic!("{e:?}"),
    }
}

#[test]
fn a_batch_written_byte_by_byte_from_vllms_structs_decodes() {
    let b = wire::decode(HAND_WRITTEN).expect("decodes");
    assert_eq!((b.ts, b.data_parallel_rank, b.events.len()), (1.5, Some(0), 2));
    let KvEvent::Stored { hashes, parent, token_ids, block_size, medium } = &b.events[0] else { panic!("{b:?}") };
    assert_eq!((hashes[0], *parent, token_ids, *block_size), (key(&h(0xaa)), None, &hand_ids(), 16));
    assert_eq!(medium.as_deref(), Some("GPU"));
    assert_eq!(b.events[1], KvEvent::Removed { hashes: vec![0x8000_0000_0000_0001], medium: None });
    // The test encoder below writes the same bytes for the same batch.
    let mine = batch(vec![
        stored(&[h(0xaa)], None, &hand_ids(), Some("GPU")),
        removed(&[Value::from(0x8000_0000_0000_0001u64)]),
    ]);
    assert_eq!(mine, HAND_WRITTEN);
}

#[test]
fn the_older_array_like_form_decodes_too() {
    // `examples/online_serving/kv_events_subscriber.py`: array_like batch and tagged arrays.
    let ev = Value::Array(vec![
        "BlockStored".into(),
        Value::Array(vec![7.into()]),
        Value::Nil,
        Value::Array(hand_ids().into_iter().map(Into::into).collect()),
        16.into(),
        Value::Nil,
        Value::Nil,
    ]);
    let v = Value::Array(vec![Value::F64(2.0), Value::Array(vec![ev, Value::Array(vec!["AllBlocksCleared".into()])])]);
    let mut bytes = Vec::new();
    rmpv::encode::write_value(&mut bytes, &v).unwrap();
    let b = wire::decode(&bytes).expect("decodes");
    assert_eq!(b.data_parallel_rank, None);
    assert_eq!(
        b.events,
        [
            KvEvent::Stored { hashes: vec![7], parent: None, token_ids: hand_ids(), block_size: 16, medium: None },
            KvEvent::Cleared
        ]
    );
}

#[test]
fn malformed_payloads_are_errors_not_panics() {
    for bad in [&b""[..], b"\xc1", b"\x93\x01", &HAND_WRITTEN[..HAND_WRITTEN.len() - 1], b"\xdd\xff\xff\xff\xff"] {
        assert!(wire::decode(bad).is_err(), "{bad:?}");
    }
    let mut trailing = HAND_WRITTEN.to_vec();
    trailing.push(0);
    assert!(wire::decode(&trailing).unwrap_err().contains("after the batch"));
    let no_ids = batch(vec![Value::Map(vec![
        ("type".into(), "BlockStored".into()),
        ("block_hashes".into(), Value::Array(vec![])),
    ])]);
    assert!(wire::decode(&no_ids).unwrap_err().contains("token_ids"));
    // A later release's event type is skipped, not an error.
    let later = batch(vec![Value::Map(vec![("type".into(), "BlockMoved".into())])]);
    assert_eq!(wire::decode(&later).unwrap().events, [KvEvent::Other]);
}

/// The gateway's segments for token ids (as `--tokenizer` gives them).
fn segments(ids: &[u32]) -> Vec<Segment> {
    let mut id = 0;
    ids.chunks(crate::text::BLOCK_TOKENS)
        .map(|c| {
            id = crate::text::segment_id(id, c);
            Segment { id, tokens: c.len() as u32 }
        })
        .collect()
}

fn path_of(segs: &[Segment]) -> u64 {
    segs.iter().fold(0, |p, s| routelab_core::sim::cluster::prefix_cache::extend_path_hash(p, s.id))
}

#[test]
fn the_index_places_blocks_under_their_parents_and_stays_bounded() {
    let ids: Vec<u32> = (0..64).collect();
    let segs = segments(&ids);
    let mut ix = KvIndex::new(4);
    // Two blocks of 32 tokens (two gateway segments each), then their child.
    ix.stored(&[1, 2], None, &ids[..40], 32);
    assert_eq!((ix.len(), ix.unplaced), (0, 2), "token ids that do not fill the blocks are refused");
    ix.stored(&[1], None, &ids[..32], 32);
    ix.stored(&[2], Some(1), &ids[32..], 32);
    assert_eq!(ix.len(), 2);
    for n in 1..=4 {
        assert!(ix.holds(path_of(&segs[..n])), "prefix of {n} segments");
    }
    assert!(!ix.holds(path_of(&segments(&[9; 16]))));
    // A child of an unknown parent cannot be placed.
    ix.stored(&[3], Some(99), &ids[..16], 16);
    assert_eq!((ix.len(), ix.unplaced), (2, 3));
    // Removing block 2 reports its prefix, root first.
    let Applied::Removed(gone) = ix.removed(&[2, 42]) else { panic!() };
    assert_eq!(gone, std::slice::from_ref(&segs));
    assert!(ix.holds(path_of(&segs[..2])) && !ix.holds(path_of(&segs[..3])));
    // Bounded: a fifth block drops the whole view.
    let mut ix = KvIndex::new(4);
    for k in 0..4u32 {
        ix.stored(&[k as u64], None, &[k; 16], 16);
    }
    assert!(matches!(ix.stored(&[4], None, &[4; 16], 16), Applied::Overflow));
    assert!(ix.is_empty());
}

#[test]
fn kv_events_flags_are_checked() {
    let two = |v: &[&str]| parse(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>(), 2);
    let ok = two(&["none", "tcp://127.0.0.1:5557,replay=tcp://127.0.0.1:5558,topic=kv"]).unwrap();
    assert_eq!(
        ok[1],
        Some(Spec {
            endpoint: "tcp://127.0.0.1:5557".into(),
            replay: Some("tcp://127.0.0.1:5558".into()),
            topic: "kv".into()
        })
    );
    for bad in [&["tcp://a:1"][..], &["tcp://a:1", "a:1"], &["tcp://a:x", "none"], &["none", "tcp://a:1,replay=b"]] {
        let e = two(bad).unwrap_err().to_string();
        assert!(e.contains("--kv-events") && e.contains("none"), "{e}");
    }
    // Without --tokenizer the events' token ids match nothing: refused.
    let mut args = ServeArgs::with_backends(&["http://127.0.0.1:9".into()]);
    args.kv_events = vec!["tcp://127.0.0.1:5557".into()];
    let e = Gateway::new(args).err().expect("refused").to_string();
    assert!(e.contains("--tokenizer"), "{e}");
}

/// Batches a publisher keeps for replays, by sequence number.
type Buffer = Arc<Mutex<Vec<(i64, Vec<u8>)>>>;

/// A vLLM-like publisher on loopback: PUB for batches, ROUTER for replays of its buffer.
struct Publisher {
    pub_socket: zeromq::PubSocket,
    buffer: Buffer,
    seq: i64,
}

impl Publisher {
    /// Sends the next batch (and keeps it for replays).
    async fn send(&mut self, payload: Vec<u8>) {
        self.buffer.lock().unwrap().push((self.seq, payload.clone()));
        self.send_raw(vec![Bytes::new(), Bytes::copy_from_slice(&self.seq.to_be_bytes()), payload.into()]).await;
        self.seq += 1;
    }
    async fn send_raw(&mut self, frames: Vec<Bytes>) {
        self.pub_socket.send(zeromq::ZmqMessage::try_from(frames).unwrap()).await.unwrap();
    }
    /// Skips a sequence number: the batch is lost on the PUB socket, kept for replay or not.
    fn lose(&mut self, payload: Vec<u8>, replayable: bool) {
        if replayable {
            self.buffer.lock().unwrap().push((self.seq, payload));
        }
        self.seq += 1;
    }
}

async fn until(what: &str, cond: impl Fn() -> bool) {
    for _ in 0..1000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("not within 10 s: {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_on_loopback_flip_the_routers_choice_and_losses_degrade_it() {
    let mut pub_socket = zeromq::PubSocket::new();
    let pub_at = pub_socket.bind("tcp://127.0.0.1:0").await.unwrap();
    let mut router = zeromq::RouterSocket::new();
    let replay_at = router.bind("tcp://127.0.0.1:0").await.unwrap();
    let buffer: Buffer = Arc::default();
    let buf = buffer.clone();
    // vLLM's `_service_replay`: [identity, "", start] → every buffered batch ≥ start, then -1.
    let replays = tokio::spawn(async move {
        while let Ok(msg) = router.recv().await {
            let frames = msg.into_vec();
            let start = i64::from_be_bytes(frames[2][..].try_into().unwrap());
            let held: Vec<_> = buf.lock().unwrap().iter().filter(|(s, _)| *s >= start).cloned().collect();
            for (s, p) in held.into_iter().chain([(-1, Vec::new())]) {
                let reply = vec![frames[0].clone(), Bytes::new(), Bytes::copy_from_slice(&s.to_be_bytes()), p.into()];
                router.send(zeromq::ZmqMessage::try_from(reply).unwrap()).await.unwrap();
            }
        }
    });
    let words: Vec<String> = (0..64).map(|i| format!("w{i}")).collect();
    let refs: Vec<&str> = words.iter().map(String::as_str).collect();
    let tok = std::env::temp_dir().join(format!("routelab-kv-events-tokenizer-{}.json", std::process::id()));
    std::fs::write(&tok, crate::text::tests::word_level(&refs)).unwrap();
    let mut args = ServeArgs::with_backends(&["http://127.0.0.1:9".into(), "http://127.0.0.1:9".into()]);
    args.policy = "max_affinity".into();
    args.tokenizer = Some(tok.clone());
    args.kv_events = vec!["tcp://127.0.0.1:1".into(), format!("{pub_at},replay={replay_at}")];
    let gw = Arc::new(Gateway::new(args).expect("starts"));
    let _ = std::fs::remove_file(&tok);
    let spec = gw.kv_specs[1].clone().unwrap();
    let task = tokio::spawn(gw.clone().kv_events_loop(1, spec));
    let mut p = Publisher { pub_socket, buffer, seq: 0 };
    // PUB drops batches until the subscription arrives: empty batches until one is applied.
    let stats = |o| gw.kv_stats[1].count(o);
    for _ in 0..500 {
        p.send(batch(vec![])).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        if stats(Outcome::Applied) > 0 {
            break;
        }
    }
    assert!(stats(Outcome::Applied) > 0, "the subscriber never received a batch");
    let applied = |n: u64| move || stats(Outcome::Applied) >= n;

    // Prompts as token ids: P = ids 0..32 (two blocks), Q = ids 32..48.
    let pid: Vec<u32> = (1..33).collect();
    let qid: Vec<u32> = (33..49).collect();
    let (ps, qs) = (segments(&pid), segments(&qid));
    let (pt, qt) = (32, 16);
    let route = |s: &[Segment], t| gw.route(s, t, 1, &[false, false]).expect("routed").backend;
    assert_eq!(route(&ps, pt), 0, "no match anywhere: ties go to backend 0");

    // BlockStored on backend 1: the same prompt now goes there.
    let mut n = stats(Outcome::Applied);
    p.send(batch(vec![stored(&[h(1), h(2)], None, &pid, Some("GPU"))])).await;
    n += 1;
    until("stored", applied(n)).await;
    assert_eq!(route(&ps, pt), 1, "backend 1's engine holds P");
    // A CPU-tier copy does not count.
    p.send(batch(vec![stored(&[h(3)], None, &qid, Some("CPU"))])).await;
    n += 1;
    until("cpu", applied(n)).await;
    assert_eq!(route(&qs, qt), 0);

    // BlockRemoved of P's first block: the match is gone, back to 0.
    p.send(batch(vec![removed(&[h(1)])])).await;
    n += 1;
    until("removed", applied(n)).await;
    assert_eq!(route(&ps, pt), 0, "backend 1 evicted P's first block");

    // A gap the replay socket fills: the lost batch (P stored again) is applied.
    p.lose(batch(vec![stored(&[h(1), h(2)], None, &pid, None)]), true);
    p.send(batch(vec![stored(&[h(4)], None, &qid, None)])).await;
    n += 2;
    until("gap filled", applied(n)).await;
    assert_eq!((stats(Outcome::GapFilled), stats(Outcome::GapLost)), (1, 0));
    assert_eq!(route(&ps, pt), 1, "the replayed batch stored P");

    // A batch that does not decode: the view degrades to the guess (P was routed to 1; Q, held
    // only by the events, was not).
    p.send_raw(vec![Bytes::new(), Bytes::copy_from_slice(&p.seq.to_be_bytes()), Bytes::from_static(b"\xc1garbage")])
        .await;
    p.seq += 1;
    // And messages that are not [topic, seq, payload]: dropped.
    p.send_raw(vec![Bytes::from_static(b"only a topic")]).await;
    p.send_raw(vec![Bytes::new(), Bytes::from_static(b"short"), Bytes::new()]).await;
    until("malformed", || stats(Outcome::Malformed) >= 3).await;
    assert!(!gw.routing.lock().unwrap().kv[1].as_ref().unwrap().live);
    assert_eq!(route(&qs, qt), 0, "degraded: Q's events were dropped");
    assert_eq!(route(&ps, pt), 1, "degraded: the gateway's guess still sends P to 1");

    // AllBlocksCleared: live again, empty.
    p.send(batch(vec![cleared(), stored(&[h(5)], None, &qid, None)])).await;
    n += 1;
    until("cleared", applied(n)).await;
    assert!(gw.routing.lock().unwrap().kv[1].as_ref().unwrap().live);
    assert_eq!(route(&qs, qt), 1, "live again: Q stored after the clear");

    // A gap the replay cannot fill: counted, degraded.
    p.lose(batch(vec![removed(&[h(5)])]), false);
    p.send(batch(vec![])).await;
    n += 1;
    until("gap lost", applied(n)).await;
    assert_eq!(stats(Outcome::GapLost), 1);
    assert!(!gw.routing.lock().unwrap().kv[1].as_ref().unwrap().live);

    // The engine restarts: its sequence starts again at 0, its cache empty, the view live.
    p.seq = 0;
    p.send(batch(vec![])).await;
    n += 1;
    until("restart", applied(n)).await;
    assert_eq!(stats(Outcome::Restart), 1);
    assert!(gw.routing.lock().unwrap().kv[1].as_ref().unwrap().live);
    let text = gw.metrics_text();
    assert!(
        text.contains("routelab_gateway_kv_events_total{backend=\"http://127.0.0.1:9\",outcome=\"gap_filled\"} 1"),
        "{text}"
    );
    assert!(text.contains("routelab_gateway_kv_events_connected{backend=\"http://127.0.0.1:9\"} 1"), "{text}");
    task.abort();
    replays.abort();
}

#[test]
fn removed_blocks_reach_a_router_that_wants_evictions() {
    let tok = std::env::temp_dir().join(format!("routelab-kv-evict-tokenizer-{}.json", std::process::id()));
    std::fs::write(&tok, crate::text::tests::word_level(&["a", "b"])).unwrap();
    let mut args = ServeArgs::with_backends(&["http://127.0.0.1:9".into(), "http://127.0.0.1:9".into()]);
    args.policy = "dynamo_kv{prefix_state: events}".into();
    args.tokenizer = Some(tok.clone());
    args.kv_events = vec!["tcp://127.0.0.1:1".into(), "tcp://127.0.0.1:2".into()];
    let gw = Gateway::new(args).expect("starts");
    let _ = std::fs::remove_file(&tok);
    let gw = Arc::new(gw);
    let held = || {
        let r = gw.routing.lock().unwrap();
        let stats = r.router.report().unwrap();
        stats
            .iter()
            .find(|(k, _)| k == "router.router_cached_blocks_mean" || k == "router_cached_blocks_mean")
            .unwrap()
            .1
    };
    let pid: Vec<u32> = (1..49).collect();
    let b = gw.route(&segments(&pid), 48, 1, &[false, false]).expect("routed").backend;
    let before = held();
    assert!(before > 0.0, "the router learnt the prompt's blocks from its dispatch");
    let apply = |events| gw.apply(b, &wire::decode(&batch(events)).unwrap());
    apply(vec![stored(&[h(1), h(2), h(3)], None, &pid, None)]);
    assert_eq!(held(), before, "a store changes nothing the router did not already know");
    // The engine evicts the prompt's last block: the router hears it.
    apply(vec![removed(&[h(3)])]);
    let after = held();
    assert!(after < before, "{before} → {after}");
    // A clear evicts every chain.
    apply(vec![cleared()]);
    assert_eq!(held(), 0.0);
}
