use rmpv::Value;
use routelab_policy_api::Segment;

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

#[cfg(feature = "tokenizer")]
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
    assert!(wire::decode(&trailing).unwrap_err().to_string().contains("after the batch"));
    let no_ids = batch(vec![Value::Map(vec![
        ("type".into(), "BlockStored".into()),
        ("block_hashes".into(), Value::Array(vec![])),
    ])]);
    assert!(wire::decode(&no_ids).unwrap_err().to_string().contains("token_ids"));
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
    let mut ix = KvIndex::new(64);
    // Two blocks of 32 tokens (two gateway segments each), then their child.
    ix.stored(&[1, 2], None, &ids[..24], 32);
    assert_eq!((ix.len(), ix.unplaced), (0, 2), "token ids that do not reach the last block are refused");
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
    // Bounded: a fifth block of 16 tokens past 64 drops the whole view.
    let mut ix = KvIndex::new(64);
    for k in 0..4u32 {
        ix.stored(&[k as u64], None, &[k; 16], 16);
    }
    assert!(matches!(ix.stored(&[4], None, &[4; 16], 16), Applied::Overflow));
    assert!(ix.is_empty());
}

#[test]
fn blocks_of_any_size_fill_the_gateways_16_token_segments() {
    // SGLang's 1-token pages and 5-token blocks (a block spans a segment boundary): the same
    // paths as 16-token blocks, each held by the block that completes it.
    let ids: Vec<u32> = (0..40).collect();
    let segs = segments(&ids[..32]);
    for bs in [1usize, 5, 16] {
        let mut ix = KvIndex::new(1 << 10);
        let n = 32usize.div_ceil(bs);
        let keys: Vec<u64> = (1..=n as u64).collect();
        // One event per block, each naming its parent (as SGLang sends them).
        for (k, c) in ids[..32].chunks(bs).enumerate() {
            ix.stored(&keys[k..=k], k.checked_sub(1).map(|p| keys[p]), c, bs as u32);
        }
        assert_eq!(ix.unplaced, 0, "block size {bs}");
        assert!(ix.holds(path_of(&segs[..1])) && ix.holds(path_of(&segs)), "block size {bs}");
        // Removing the chain first block first, in one call (a batch's removals): the
        // prefixes are named though their parents went before them.
        let Applied::Removed(gone) = ix.removed(&keys) else { panic!("block size {bs}") };
        assert_eq!(gone, [segs[..1].to_vec(), segs.clone()], "block size {bs}");
        assert!(ix.is_empty() && !ix.holds(path_of(&segs[..1])));
    }
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

/// The tests that load a tokenizer.json (the `tokenizer` feature; `.ci/run` runs them).
#[cfg(feature = "tokenizer")]
mod live;

/// Two emulated engines publishing events, a gateway following them (the `tokenizer` feature).
#[cfg(feature = "tokenizer")]
mod emulated;

/// Precise `dynamo_kv` behind the gateway against the simulator, decision for decision (the
/// `tokenizer` feature).
#[cfg(feature = "tokenizer")]
mod simulator_parity;
