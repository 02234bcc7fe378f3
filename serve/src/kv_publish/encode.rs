//! The payloads: one batch of KV-cache events as vLLM or SGLang encode it (msgpack).
//!
//! - **vLLM** (`vllm/distributed/kv_events.py` @0181ea3173e53eea8cf04a86891488e3dc89bb34):
//!   msgspec structs as maps, fields in declaration order, defaults left out. The batch is
//!   `{ts, events, data_parallel_rank}`; `{type: "BlockStored", block_hashes, parent_block_hash,
//!   token_ids, block_size, lora_id, medium, lora_name}` for a chain of new blocks (block hashes
//!   32-byte bins, as vLLM's default sha256 hashes), `{type: "BlockRemoved", block_hashes,
//!   medium}`, `{type: "AllBlocksCleared"}`; medium `"GPU"`.
//! - **SGLang** (`python/sglang/srt/disaggregation/kv_events.py`
//!   @006d053f182f9b488d2bd841afa06d5f9120a258, events from `mem_cache/radix_cache.py`
//!   @006b0e3d317f1cd4a7300e919a4eaa878b1947e7): `array_like` structs, so the batch is
//!   `[ts, events]` and each event a tagged array: `["BlockStored", block_hashes,
//!   parent_block_hash, token_ids, block_size, lora_id]`, `["BlockRemoved", block_hashes]`,
//!   `["AllBlocksCleared"]`. Hashes are int64 (`hash_str_to_int64` of a chained sha256). The
//!   radix cache emits one `BlockStored` per page (`--page-size`, 1 by default: one event per
//!   token), chained by `parent_block_hash`, and on eviction one `BlockRemoved` per page, first
//!   page first. The emulator's pages split its 16-token blocks (`page=`).
//!
//! The emulator's block hashes derive from its cache's path hashes (distinct per prefix);
//! consumers only compare them for equality.

use rmpv::Value;
use routelab_core::seeds::mix;

use crate::text::BLOCK_TOKENS;

/// Which engine's wire format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Vllm,
    /// `page`: tokens per SGLang page (a divisor of 16).
    Sglang {
        page: u32,
    },
}

/// What changed in the cache, in the emulator's terms: 16-token blocks named by path hash.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A chain of blocks, each the child of the one before, the first under `parent` (`None`:
    /// the root); `ids` their token ids, 16 per block.
    Stored {
        keys: Vec<u64>,
        parent: Option<u64>,
        ids: Vec<u32>,
    },
    Removed(Vec<u64>),
    Cleared,
}

fn text(s: &str) -> Value {
    Value::from(s)
}

/// A 32-byte block hash for vLLM's form.
fn bin32(key: u64) -> Value {
    let words = [key, mix(key), mix(key ^ 0x9e37_79b9_7f4a_7c15), mix(!key)];
    Value::Binary(words.iter().flat_map(|w| w.to_be_bytes()).collect())
}

/// SGLang's int64 hash of page `k` of the block `key` (the last page is the block's own key,
/// so a child's first page names it as parent).
fn page_key(key: u64, k: u32, pages: u32) -> Value {
    let h = if k + 1 == pages { key } else { mix(key.wrapping_add(k as u64 + 1)) };
    Value::from(h as i64)
}

fn ids_value(ids: &[u32]) -> Value {
    Value::Array(ids.iter().map(|&t| Value::from(t)).collect())
}

/// One payload: the batch's msgpack.
pub fn batch(format: Format, ts: f64, events: &[Event]) -> Vec<u8> {
    let v = match format {
        Format::Vllm => Value::Map(vec![
            (text("ts"), Value::F64(ts)),
            (text("events"), Value::Array(events.iter().map(vllm).collect())),
            (text("data_parallel_rank"), Value::from(0)),
        ]),
        Format::Sglang { page } => {
            let mut out = Vec::new();
            events.iter().for_each(|e| sglang(e, page, &mut out));
            Value::Array(vec![Value::F64(ts), Value::Array(out)])
        }
    };
    let mut bytes = Vec::new();
    rmpv::encode::write_value(&mut bytes, &v).expect("writing to a Vec");
    bytes
}

fn vllm(e: &Event) -> Value {
    match e {
        Event::Stored { keys, parent, ids } => Value::Map(vec![
            (text("type"), text("BlockStored")),
            (text("block_hashes"), Value::Array(keys.iter().map(|&k| bin32(k)).collect())),
            (text("parent_block_hash"), parent.map_or(Value::Nil, bin32)),
            (text("token_ids"), ids_value(ids)),
            (text("block_size"), Value::from(BLOCK_TOKENS as u32)),
            (text("lora_id"), Value::Nil),
            (text("medium"), text("GPU")),
            (text("lora_name"), Value::Nil),
        ]),
        Event::Removed(keys) => Value::Map(vec![
            (text("type"), text("BlockRemoved")),
            (text("block_hashes"), Value::Array(keys.iter().map(|&k| bin32(k)).collect())),
            (text("medium"), text("GPU")),
        ]),
        Event::Cleared => Value::Map(vec![(text("type"), text("AllBlocksCleared"))]),
    }
}

fn sglang(e: &Event, page: u32, out: &mut Vec<Value>) {
    let pages = BLOCK_TOKENS as u32 / page;
    match e {
        Event::Stored { keys, parent, ids } => {
            let mut parent = parent.map_or(Value::Nil, |p| page_key(p, pages - 1, pages));
            for (&key, block) in keys.iter().zip(ids.chunks(BLOCK_TOKENS)) {
                for (k, tokens) in block.chunks(page as usize).enumerate() {
                    let h = page_key(key, k as u32, pages);
                    out.push(Value::Array(vec![
                        text("BlockStored"),
                        Value::Array(vec![h.clone()]),
                        parent,
                        ids_value(tokens),
                        Value::from(tokens.len() as u32),
                        Value::Nil,
                    ]));
                    parent = h;
                }
            }
        }
        Event::Removed(keys) => {
            for &key in keys {
                for k in 0..pages {
                    out.push(Value::Array(vec![text("BlockRemoved"), Value::Array(vec![page_key(key, k, pages)])]));
                }
            }
        }
        Event::Cleared => out.push(Value::Array(vec![text("AllBlocksCleared")])),
    }
}
