//! vLLM's and SGLang's KV-cache event batches, decoded from msgpack.
//!
//! Source: vllm `vllm/distributed/kv_events.py` @0181ea3173e53eea8cf04a86891488e3dc89bb34. A
//! publisher sends multipart ZMQ messages `[topic, seq, payload]`: `seq` an 8-byte big-endian
//! counter from 0, `payload` a msgspec-msgpack `KVEventBatch{ts: float, events: [...],
//! data_parallel_rank: int | None}`. Events are msgspec structs with `tag=True`: encoded as maps
//! whose first key is `"type"` (the class name) followed by the fields in declaration order,
//! fields equal to their defaults left out (`omit_defaults=True`):
//! - `BlockStored{block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
//!   lora_name, extra_keys?, group_idx?, kv_cache_spec_kind?, kv_cache_spec_sliding_window?}`
//! - `BlockRemoved{block_hashes, medium, group_idx?}`
//! - `AllBlocksCleared{}`
//!
//! A block hash (`ExternalBlockHash = bytes | int`) is a msgpack bin (sha256 bytes, the current
//! default) or an int (older releases). Older releases also encoded the batch and the events
//! `array_like` (`[ts, events, rank]`, `["BlockStored", hashes, parent, ids, size, ...]`, as in
//! vLLM's `examples/online_serving/kv_events_subscriber.py`); both forms are read. Keys this
//! reader does not know are ignored; an event of an unknown type is skipped.
//!
//! SGLang publishes the same sockets and event names in the array form
//! (`python/sglang/srt/disaggregation/kv_events.py` @006d053f182f9b488d2bd841afa06d5f9120a258:
//! `array_like=True`, a batch `[ts, events]`, `["BlockStored", hashes, parent, ids, size,
//! lora_id]`, `["BlockRemoved", hashes]`), with int64 hashes and one event per page of its radix
//! cache (`mem_cache/radix_cache.py` @006b0e3d317f1cd4a7300e919a4eaa878b1947e7; `--page-size`
//! 1 by default, so blocks of one token): this reader takes it as it is (a map or an array tells
//! the forms apart), and the index ([`super::index`]) takes blocks of any size.

use rmpv::Value;

/// A block hash, whatever its wire form, folded to 64 bits (bytes through FNV-1a; ints as they
/// are). Collisions among a cache's blocks are ~n²/2⁶⁵: none in practice.
pub type BlockKey = u64;

#[derive(Debug, Clone, PartialEq)]
pub enum KvEvent {
    Stored {
        hashes: Vec<BlockKey>,
        parent: Option<BlockKey>,
        token_ids: Vec<u32>,
        block_size: u32,
        medium: Option<String>,
    },
    Removed {
        hashes: Vec<BlockKey>,
        medium: Option<String>,
    },
    Cleared,
    /// A tag this reader does not know (a later release's event).
    Other,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub ts: f64,
    pub events: Vec<KvEvent>,
    pub data_parallel_rank: Option<i64>,
}

/// Why a frame is not a KV event batch (the gateway counts and logs it).
#[derive(Debug, Clone, PartialEq)]
pub enum WireError {
    /// The payload is not msgpack (the decoder's message).
    NotMsgpack(String),
    /// This many bytes follow the batch.
    Trailing(usize),
    /// Msgpack, but not the shape of a batch: what is missing or wrong.
    Malformed(&'static str),
    /// A sequence-number frame of this many bytes (not 8).
    SeqFrame(usize),
}

impl From<&'static str> for WireError {
    fn from(what: &'static str) -> Self {
        WireError::Malformed(what)
    }
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireError::NotMsgpack(e) => write!(f, "not msgpack: {e}"),
            WireError::Trailing(n) => write!(f, "{n} bytes after the batch"),
            WireError::Malformed(what) => f.write_str(what),
            WireError::SeqFrame(n) => write!(f, "a {n}-byte sequence frame"),
        }
    }
}

impl std::error::Error for WireError {}

/// Decodes one payload. Errors say what was wrong (the gateway counts and logs them).
pub fn decode(payload: &[u8]) -> Result<Batch, WireError> {
    let mut rd = payload;
    let v = rmpv::decode::read_value_with_max_depth(&mut rd, 16).map_err(|e| WireError::NotMsgpack(e.to_string()))?;
    if !rd.is_empty() {
        return Err(WireError::Trailing(rd.len()));
    }
    let (ts, events, rank) = match &v {
        Value::Map(m) => (field(m, "ts"), field(m, "events"), field(m, "data_parallel_rank")),
        Value::Array(a) => (a.first(), a.get(1), a.get(2)),
        _ => return Err("the batch is neither a map nor an array".into()),
    };
    let ts = ts.and_then(Value::as_f64).ok_or("the batch has no numeric `ts`")?;
    let events = events.and_then(Value::as_array).ok_or("the batch has no `events` list")?;
    let data_parallel_rank = rank.and_then(Value::as_i64);
    let events = events.iter().map(event).collect::<Result<_, _>>()?;
    Ok(Batch { ts, events, data_parallel_rank })
}

fn field<'a>(m: &'a [(Value, Value)], key: &str) -> Option<&'a Value> {
    m.iter().find(|(k, _)| k.as_str() == Some(key)).map(|(_, v)| v)
}

fn event(v: &Value) -> Result<KvEvent, WireError> {
    // Positional fields after the tag, in declaration order, for the array form.
    let get = |name: &str, pos: usize| -> Option<&Value> {
        match v {
            Value::Map(m) => field(m, name),
            Value::Array(a) => a.get(pos + 1),
            _ => None,
        }
    };
    let tag = match v {
        Value::Map(m) => field(m, "type"),
        Value::Array(a) => a.first(),
        _ => return Err("an event is neither a map nor an array".into()),
    };
    let tag = tag.and_then(Value::as_str).ok_or("an event has no type tag")?;
    let medium = |pos| get("medium", pos).and_then(Value::as_str).map(str::to_string);
    Ok(match tag {
        "BlockStored" => {
            let hashes = hashes(get("block_hashes", 0))?;
            let parent = match get("parent_block_hash", 1) {
                None | Some(Value::Nil) => None,
                Some(h) => Some(hash(h)?),
            };
            let ids = get("token_ids", 2).and_then(Value::as_array).ok_or("BlockStored has no `token_ids` list")?;
            let token_ids = ids
                .iter()
                .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()).ok_or("a token id is not a u32"))
                .collect::<Result<Vec<_>, _>>()?;
            let block_size = get("block_size", 3)
                .and_then(Value::as_u64)
                .and_then(|b| u32::try_from(b).ok())
                .filter(|&b| b > 0)
                .ok_or("BlockStored has no positive `block_size`")?;
            KvEvent::Stored { hashes, parent, token_ids, block_size, medium: medium(5) }
        }
        "BlockRemoved" => KvEvent::Removed { hashes: hashes(get("block_hashes", 0))?, medium: medium(1) },
        "AllBlocksCleared" => KvEvent::Cleared,
        _ => KvEvent::Other,
    })
}

fn hashes(v: Option<&Value>) -> Result<Vec<BlockKey>, WireError> {
    v.and_then(Value::as_array).ok_or("an event has no `block_hashes` list")?.iter().map(hash).collect()
}

fn hash(v: &Value) -> Result<BlockKey, WireError> {
    match v {
        Value::Binary(b) => Ok(fnv1a(b)),
        Value::Integer(i) => {
            i.as_u64().or_else(|| i.as_i64().map(|i| i as u64)).ok_or(WireError::Malformed("a bad int hash"))
        }
        _ => Err("a block hash is neither bytes nor an int".into()),
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &b in bytes {
        h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// The sequence number frame: 8 bytes big-endian (`-1`, all ones, ends a replay).
pub fn seq(frame: &[u8]) -> Result<i64, WireError> {
    <[u8; 8]>::try_from(frame).map(i64::from_be_bytes).map_err(|_| WireError::SeqFrame(frame.len()))
}
