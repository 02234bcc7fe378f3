use routelab_core::sim::cluster::prefix_cache::{PrefixCache, extend_path_hash};
use routelab_policy_api::Segment;

use super::mirror::Tracker;
use super::*;
use crate::gateway::kv_events::index::{Applied, KvIndex};
use crate::gateway::kv_events::wire::{self, KvEvent};
use crate::text::{BLOCK_TOKENS, segment_id};

/// A prompt of token ids as the emulator's tokenizer gives it: segments and ids.
fn prompt(ids: &[u32]) -> Vec<Segment> {
    let mut id = 0;
    ids.chunks(BLOCK_TOKENS)
        .map(|c| {
            id = segment_id(id, c);
            Segment { id, tokens: c.len() as u32 }
        })
        .collect()
}

fn path_of(segs: &[Segment]) -> u64 {
    segs.iter().fold(0, |p, s| extend_path_hash(p, s.id))
}

/// Applies a payload to an index as the gateway does (removals in a row together).
fn apply(ix: &mut KvIndex, payload: &[u8]) -> Vec<Vec<Segment>> {
    let batch = wire::decode(payload).expect("the gateway decodes what the emulator publishes");
    let mut gone = Vec::new();
    let mut removals = Vec::new();
    for ev in batch.events.iter().chain([&KvEvent::Other]) {
        if let KvEvent::Removed { hashes, .. } = ev {
            removals.extend_from_slice(hashes);
            continue;
        }
        if let Applied::Removed(p) = ix.removed(&removals) {
            gone.extend(p);
        }
        removals.clear();
        match ev {
            KvEvent::Stored { hashes, parent, token_ids, block_size, .. } => {
                assert!(matches!(ix.stored(hashes, *parent, token_ids, *block_size), Applied::Nothing));
            }
            KvEvent::Cleared => ix.clear(),
            _ => {}
        }
    }
    gone
}

#[test]
fn emulate_kv_events_flags_are_checked() {
    let s = parse("tcp://*:5557,replay=tcp://127.0.0.1:5558,topic=kv,format=sglang,page=4,buffer=7").unwrap();
    assert_eq!(
        s,
        Spec {
            endpoint: "tcp://0.0.0.0:5557".into(),
            replay: Some("tcp://127.0.0.1:5558".into()),
            topic: "kv".into(),
            format: Format::Sglang { page: 4 },
            buffer: 7
        }
    );
    assert_eq!(parse("tcp://127.0.0.1:0").unwrap().format, Format::Vllm);
    for bad in [
        "127.0.0.1:5557",
        "tcp://127.0.0.1",
        "tcp://127.0.0.1:1,format=trt",
        "tcp://127.0.0.1:1,page=3,format=sglang",
        "tcp://127.0.0.1:1,page=2",
        "tcp://127.0.0.1:1,buffer=0",
        "tcp://127.0.0.1:1,replay=x",
        "tcp://127.0.0.1:1,hwm=3",
    ] {
        let e = parse(bad).err().unwrap_or_else(|| panic!("{bad}: accepted")).to_string();
        assert!(e.contains("--kv-events") && e.contains("format=vllm|sglang"), "{bad}: {e}");
    }
}

/// Both formats, encoded here and decoded by the gateway, place the same gateway blocks; a
/// removal names the prefixes that went.
#[test]
fn both_formats_round_trip_through_the_gateways_reader() {
    let ids: Vec<u32> = (100..164).collect();
    let segs = prompt(&ids);
    let keys: Vec<u64> = (1..=segs.len()).map(|k| path_of(&segs[..k])).collect();
    for format in [Format::Vllm, Format::Sglang { page: 1 }, Format::Sglang { page: 4 }, Format::Sglang { page: 16 }] {
        let mut ix = KvIndex::new(1 << 16);
        // The first two blocks, then their two children in a later batch.
        let first = Event::Stored { keys: keys[..2].to_vec(), parent: None, ids: ids[..32].to_vec() };
        let second = Event::Stored { keys: keys[2..].to_vec(), parent: Some(keys[1]), ids: ids[32..].to_vec() };
        apply(&mut ix, &encode::batch(format, 1.0, &[first]));
        apply(&mut ix, &encode::batch(format, 2.0, &[second]));
        assert_eq!(ix.unplaced, 0, "{format:?}");
        for k in 1..=4 {
            assert!(ix.holds(path_of(&segs[..k])), "{format:?}: {k} blocks");
        }
        let gone = apply(&mut ix, &encode::batch(format, 3.0, &[Event::Removed(vec![keys[3], keys[2]])]));
        assert_eq!(gone.len(), 2, "{format:?}");
        assert!(gone.contains(&segs.clone()), "{format:?}: the removed leaf's whole prefix");
        assert!(ix.holds(path_of(&segs[..2])) && !ix.holds(path_of(&segs[..3])), "{format:?}");
        apply(&mut ix, &encode::batch(format, 4.0, &[Event::Cleared]));
        assert!(ix.is_empty() && !ix.holds(path_of(&segs[..1])), "{format:?}");
    }
    // The payload shapes: vLLM's map with a 32-byte bin hash, SGLang's arrays with int hashes.
    let ev = [Event::Stored { keys: vec![7], parent: None, ids: ids[..16].to_vec() }];
    let v = rmpv::decode::read_value(&mut &encode::batch(Format::Vllm, 1.0, &ev)[..]).unwrap();
    let stored = &v.as_map().unwrap()[1].1.as_array().unwrap()[0];
    let hashes = &stored.as_map().unwrap()[1].1;
    assert_eq!(hashes.as_array().unwrap()[0].as_slice().map(<[u8]>::len), Some(32));
    let v = rmpv::decode::read_value(&mut &encode::batch(Format::Sglang { page: 1 }, 1.0, &ev)[..]).unwrap();
    let events = v.as_array().unwrap()[1].as_array().unwrap();
    assert_eq!(events.len(), 16, "one BlockStored per 1-token page");
    assert_eq!(events[15].as_array().unwrap()[1].as_array().unwrap()[0].as_i64(), Some(7));
    assert_eq!(events[1].as_array().unwrap()[4].as_u64(), Some(1), "block_size 1");
}

/// The tracker follows a prefix cache: blocks computed are stored (parents first, the partial
/// last block never), evicted ones removed; token ids kept are bounded.
#[test]
fn the_tracker_publishes_the_caches_full_blocks_as_they_come_and_go() {
    let a_ids: Vec<u32> = (0..40).collect(); // two full blocks and 8 tokens
    let b_ids: Vec<u32> = (0..32).chain(500..532).collect(); // shares A's two blocks
    let (a, b) = (prompt(&a_ids), prompt(&b_ids));
    let mut cache = PrefixCache::new();
    let mut t = Tracker::default();
    let mut ix = KvIndex::new(1 << 16);
    let publish = |t: &mut Tracker, cache: &PrefixCache, ix: &mut KvIndex| {
        let events = t.changes(cache);
        if events.is_empty() { None } else { Some(apply(ix, &encode::batch(Format::Vllm, 0.0, &events))) }
    };
    t.hold(&a, &a_ids);
    let mut path_a = Vec::new();
    cache.admit(&a, &mut path_a, 0, None);
    assert_eq!(publish(&mut t, &cache, &mut ix), None, "admitted, nothing computed yet");
    cache.mark_computed(path_a[0], 16);
    assert!(publish(&mut t, &cache, &mut ix).is_some());
    assert!(ix.holds(path_of(&a[..1])) && !ix.holds(path_of(&a[..2])));
    cache.mark_computed(path_a[1], 16);
    cache.mark_computed(path_a[2], 8);
    publish(&mut t, &cache, &mut ix);
    assert!(ix.holds(path_of(&a[..2])));
    assert_eq!(ix.len(), 2, "the 8-token tail is not a block");
    cache.release(&path_a);
    t.release(&a);
    assert_eq!(publish(&mut t, &cache, &mut ix), None);
    // B shares A's blocks and adds two, computed in one step: one chain under A's second block.
    t.hold(&b, &b_ids);
    let mut path_b = Vec::new();
    cache.admit(&b, &mut path_b, 0, None);
    path_b.iter().zip(&b).for_each(|(&n, s)| cache.mark_computed(n, s.tokens));
    let events = t.changes(&cache);
    assert_eq!(events.len(), 1, "{events:?}");
    let Event::Stored { keys, parent, ids } = &events[0] else { panic!("{events:?}") };
    assert_eq!((keys.len(), *parent, &ids[..]), (2, Some(path_of(&b[..2])), &b_ids[32..]));
    apply(&mut ix, &encode::batch(Format::Vllm, 0.0, &events));
    assert!(ix.holds(path_of(&b)));
    cache.release(&path_b);
    t.release(&b);
    // Evicting B's leaf (16 tokens) and A's tail: B's last block goes.
    cache.evict(24, None);
    let gone = publish(&mut t, &cache, &mut ix).expect("a removal");
    assert_eq!(gone, std::slice::from_ref(&b));
    assert!(ix.holds(path_of(&b[..3])) && !ix.holds(path_of(&b)));
    // Only published blocks keep their ids once no request holds them.
    assert_eq!(t.kept(), 3);
    assert_eq!(t.cleared(), [Event::Cleared]);
    assert_eq!(t.kept(), 0);
}
