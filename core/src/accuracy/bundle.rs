//! Reading a run bundle, every field checked: a bad file is bad input naming the file, the line
//! and the field (exit 2), found before anything runs.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::workload::InputError;
use crate::workload::limits::read_capped;
use crate::workload::mooncake::MooncakeRow;
use crate::workload::trace::MAX_TRACE_BYTES;

/// What the engine measured for one request (engine clock, seconds).
#[derive(Clone, Debug, PartialEq)]
pub struct Measured {
    /// When the client sent it (client clock, s).
    pub arrival_time: f64,
    pub input_toks: u32,
    pub output_toks: u32,
    pub queued_ts: f64,
    pub first_token_ts: f64,
    pub last_token_ts: f64,
}

impl Measured {
    /// (TTFT, TPOT when 2+ tokens, latency), LLMServingSim's definitions.
    pub fn figures(&self) -> (f64, Option<f64>, f64) {
        let tpot =
            (self.output_toks > 1).then(|| (self.last_token_ts - self.first_token_ts) / (self.output_toks - 1) as f64);
        (self.first_token_ts - self.queued_ts, tpot, self.last_token_ts - self.queued_ts)
    }
}

/// The engine and hardware of a run, as `meta.json` gives them.
#[derive(Clone, Debug, PartialEq)]
pub struct Meta {
    /// The engine's model name (`meta-llama/Llama-3.1-8B`).
    pub model: String,
    /// The device, if the bundle names it (`RTXPRO6000`, `NVIDIA GeForce RTX 4090`).
    pub device: Option<String>,
    pub tp: u32,
    pub dp: u32,
    /// `enable_expert_parallel`: a mixture of experts' experts split across the `dp` engines.
    pub expert_parallel: bool,
    /// `None`: the run left it to vLLM's default for its GPU (`workload/cluster/vllm.rs`).
    pub max_num_seqs: Option<u32>,
    /// `None`: the run left it to vLLM's default for its GPU.
    pub max_num_batched_tokens: Option<u32>,
    /// `kv_cache_dtype` as the engine was given it (`auto`, `fp8`, `fp8_e4m3`, …).
    pub kv_cache_dtype: String,
    /// `async_scheduling` when the run set it; `None`: vLLM's default (on since vLLM PR #27614
    /// unless a feature is incompatible; the shipped 0.19.0 runs leave it out).
    pub async_scheduling: Option<bool>,
}

/// A measured run: its engine, its requests as measured, and its request stream.
#[derive(Clone, Debug, PartialEq)]
pub struct Bundle {
    pub dir: PathBuf,
    pub name: String,
    pub meta: Meta,
    pub measured: Vec<Measured>,
    /// The stream at the times the requests reached the engine's process, in arrival order (see
    /// [`load`]); `order[k]` is the request (line of `requests.jsonl`, 0-based) of row `k`.
    pub rows: Vec<MooncakeRow>,
    pub order: Vec<usize>,
}

fn err(file: &Path, line: Option<usize>, field: &str, message: String, fix: &str) -> InputError {
    InputError::new(file, message, fix).in_field(field).at_line(line)
}

fn object(text: &str, file: &Path, line: usize, fix: &str) -> Result<Map<String, Value>, InputError> {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(err(file, Some(line), "", "not a JSON object".into(), fix)),
        Err(e) => Err(err(file, Some(line), "", format!("not JSON: {e}"), fix)),
    }
}

fn number(m: &Map<String, Value>, key: &str, file: &Path, line: usize, fix: &str) -> Result<f64, InputError> {
    match m.get(key) {
        None => Err(err(file, Some(line), key, format!("the field `{key}` is missing"), fix)),
        Some(v) => v
            .as_f64()
            .filter(|x| x.is_finite())
            .ok_or_else(|| err(file, Some(line), key, format!("`{key}` must be a number (got {v})"), fix)),
    }
}

fn count(m: &Map<String, Value>, key: &str, file: &Path, line: usize, fix: &str) -> Result<u32, InputError> {
    match m.get(key) {
        None => Err(err(file, Some(line), key, format!("the field `{key}` is missing"), fix)),
        Some(v) => v.as_u64().and_then(|x| u32::try_from(x).ok()).ok_or_else(|| {
            err(file, Some(line), key, format!("`{key}` must be a non-negative integer below 2^32 (got {v})"), fix)
        }),
    }
}

const REQUESTS_FIX: &str = "each line of requests.jsonl: {\"request_id\", \"input_toks\", \"output_toks\", \"arrival_time\", \
\"queued_ts\", \"first_token_ts\", \"last_token_ts\"}, arrival times non-decreasing, first token after queueing, last \
token after the first";
const STREAM_FIX: &str = "each line of stream.jsonl: {\"arrival_time_ns\", \"input_toks\", \"output_toks\", \
\"hash_ids\": [ids of full 16-token blocks]}, line i for request i of requests.jsonl";
const META_FIX: &str = "meta.json: {\"model\": \"org/Name\", \"engine_kwargs\": {\"tensor_parallel_size\", \
\"max_num_seqs\", \"max_num_batched_tokens\", ...}}";

/// Tokens per hash id in `stream.jsonl`.
pub const STREAM_BLOCK_TOKENS: u32 = 16;

fn read_meta(dir: &Path) -> Result<Meta, InputError> {
    let file = dir.join("meta.json");
    let text = read_capped(&file, 1 << 20, "meta.json", META_FIX)?;
    let m = object(&text, &file, 1, META_FIX)?;
    let model = m
        .get("model")
        .and_then(Value::as_str)
        .ok_or_else(|| err(&file, None, "model", "the field `model` (a string) is missing".into(), META_FIX))?
        .to_string();
    let kw = m
        .get("engine_kwargs")
        .and_then(Value::as_object)
        .ok_or_else(|| err(&file, None, "engine_kwargs", "the object `engine_kwargs` is missing".into(), META_FIX))?;
    let given = |k: &str| -> Result<Option<u32>, InputError> {
        match kw.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v.as_u64().and_then(|x| u32::try_from(x).ok()).filter(|&x| x > 0).map(Some).ok_or_else(|| {
                err(
                    &file,
                    None,
                    &format!("engine_kwargs.{k}"),
                    format!("must be a positive integer (got {v})"),
                    META_FIX,
                )
            }),
        }
    };
    let knob = |k: &str, default: u32| given(k).map(|v| v.unwrap_or(default));
    let flag = |k: &str| match kw.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_bool().map(Some).ok_or_else(|| {
            err(&file, None, &format!("engine_kwargs.{k}"), format!("must be true or false (got {v})"), META_FIX)
        }),
    };
    // vLLM's defaults where the run left a knob out.
    let meta = Meta {
        device: m.get("device").and_then(Value::as_str).map(str::to_string).or_else(|| device_beside(dir)),
        tp: knob("tensor_parallel_size", 1)?,
        dp: knob("data_parallel_size", 1)?,
        max_num_seqs: given("max_num_seqs")?,
        max_num_batched_tokens: given("max_num_batched_tokens")?,
        kv_cache_dtype: kw.get("kv_cache_dtype").and_then(Value::as_str).unwrap_or("auto").to_string(),
        expert_parallel: flag("enable_expert_parallel")?.unwrap_or(false),
        async_scheduling: flag("async_scheduling")?,
        model,
    };
    Ok(meta)
}

/// The `hardware` of LLMServingSim's cluster config beside the run, if present.
fn device_beside(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join("llmservingsim_cluster_config.json")).ok()?;
    let v: Value = serde_json::from_str(&text).ok()?;
    v.pointer("/nodes/0/instances/0/hardware").and_then(Value::as_str).map(str::to_string)
}

fn read_requests(dir: &Path) -> Result<Vec<Measured>, InputError> {
    let file = dir.join("requests.jsonl");
    let text = read_capped(&file, MAX_TRACE_BYTES, "requests.jsonl", REQUESTS_FIX)?;
    let mut out = Vec::new();
    let mut last_arrival = f64::NEG_INFINITY;
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let n = i + 1;
        let m = object(line, &file, n, REQUESTS_FIX)?;
        let arrival = number(&m, "arrival_time", &file, n, REQUESTS_FIX)?;
        if arrival < last_arrival {
            return Err(err(
                &file,
                Some(n),
                "arrival_time",
                format!("{arrival} is before the line above's {last_arrival}: requests must be in arrival order"),
                REQUESTS_FIX,
            ));
        }
        last_arrival = arrival;
        let r = Measured {
            arrival_time: arrival,
            input_toks: count(&m, "input_toks", &file, n, REQUESTS_FIX)?,
            output_toks: count(&m, "output_toks", &file, n, REQUESTS_FIX)?,
            queued_ts: number(&m, "queued_ts", &file, n, REQUESTS_FIX)?,
            first_token_ts: number(&m, "first_token_ts", &file, n, REQUESTS_FIX)?,
            last_token_ts: number(&m, "last_token_ts", &file, n, REQUESTS_FIX)?,
        };
        if r.first_token_ts < r.queued_ts {
            let msg =
                format!("the first token ({}) comes before the request was queued ({})", r.first_token_ts, r.queued_ts);
            return Err(err(&file, Some(n), "first_token_ts", msg, REQUESTS_FIX));
        }
        if r.last_token_ts < r.first_token_ts {
            let msg = format!("the last token ({}) comes before the first ({})", r.last_token_ts, r.first_token_ts);
            return Err(err(&file, Some(n), "last_token_ts", msg, REQUESTS_FIX));
        }
        if r.output_toks == 0 {
            return Err(err(&file, Some(n), "output_toks", "must be at least 1".into(), REQUESTS_FIX));
        }
        out.push(r);
    }
    if out.is_empty() {
        return Err(err(&file, None, "", "no requests".into(), REQUESTS_FIX));
    }
    Ok(out)
}

/// Each stream line's (input, output, hash ids), checked against the measured requests.
fn read_stream(file: &Path, measured: &[Measured]) -> Result<Vec<(u32, u32, Vec<u64>)>, InputError> {
    let text = read_capped(file, MAX_TRACE_BYTES, "the request stream", STREAM_FIX)?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let n = i + 1;
        let m = object(line, file, n, STREAM_FIX)?;
        let input = count(&m, "input_toks", file, n, STREAM_FIX)?;
        let output = count(&m, "output_toks", file, n, STREAM_FIX)?;
        let ids = m
            .get("hash_ids")
            .and_then(Value::as_array)
            .ok_or_else(|| err(file, Some(n), "hash_ids", "the list `hash_ids` is missing".into(), STREAM_FIX))?;
        let ids: Vec<u64> = ids
            .iter()
            .map(|v| {
                v.as_u64().filter(|&h| h <= crate::workload::mooncake::MAX_HASH_ID).ok_or_else(|| {
                    err(
                        file,
                        Some(n),
                        "hash_ids",
                        format!("hash ids must be integers below 2^48 (got {v})"),
                        STREAM_FIX,
                    )
                })
            })
            .collect::<Result<_, _>>()?;
        if ids.len() as u64 * STREAM_BLOCK_TOKENS as u64 > input as u64 {
            let msg =
                format!("{} blocks of {STREAM_BLOCK_TOKENS} tokens are more than the {input} input tokens", ids.len());
            return Err(err(file, Some(n), "hash_ids", msg, STREAM_FIX));
        }
        if let Some(r) = measured.get(out.len())
            && (r.input_toks, r.output_toks) != (input, output)
        {
            let msg = format!(
                "request {} measured {} input and {} output tokens, the stream says {input} and {output}",
                out.len(),
                r.input_toks,
                r.output_toks
            );
            return Err(err(file, Some(n), "input_toks", msg, STREAM_FIX));
        }
        out.push((input, output, ids));
    }
    if out.len() != measured.len() {
        let msg = format!("{} requests in the stream, {} measured", out.len(), measured.len());
        return Err(err(file, None, "", msg, STREAM_FIX));
    }
    Ok(out)
}

/// Reads the bundle in `dir` (the stream from `stream`, else `dir/stream.jsonl`).
pub fn load(dir: &Path, stream: Option<&Path>) -> Result<Bundle, InputError> {
    if !dir.is_dir() {
        return Err(err(
            dir,
            None,
            "",
            "no such folder".into(),
            "give a run folder with requests.jsonl, meta.json and stream.jsonl (workloads/ground-truth/ has three)",
        ));
    }
    let meta = read_meta(dir)?;
    let measured = read_requests(dir)?;
    let stream_file = stream.map_or_else(|| dir.join("stream.jsonl"), Path::to_path_buf);
    let lines = read_stream(&stream_file, &measured)?;
    // When each request reached the engine: its client send time on the engine's clock. vLLM
    // stamps `queued_ts` when its busy loop takes a request in, between steps, so a request
    // sent mid-step is stamped at that step's end (in the shipped runs, 0–108 ms after it was
    // sent on the 8B and the MoE, up to 374 ms on Qwen3-32B's longer steps); the replay's
    // engine does the same (`sim/cluster/replica/async_sched.rs`). The clocks' offset is the one that
    // makes the quickest request's wait zero.
    let offset = measured.iter().map(|m| m.arrival_time - m.queued_ts).fold(f64::NEG_INFINITY, f64::max);
    let engine_arrival = |m: &Measured| m.arrival_time - offset;
    let mut order: Vec<usize> = (0..measured.len()).collect();
    order.sort_by(|&a, &b| engine_arrival(&measured[a]).total_cmp(&engine_arrival(&measured[b])).then(a.cmp(&b)));
    let t0 = engine_arrival(&measured[order[0]]);
    let rows = order
        .iter()
        .map(|&i| {
            let (input, output, ids) = &lines[i];
            MooncakeRow {
                at_s: engine_arrival(&measured[i]) - t0,
                input_length: *input,
                output_length: *output,
                hash_ids: ids.clone(),
                line: i + 1,
                session: None,
                parents: Vec::new(),
                adapter: None,
                class: None,
                tenant: None,
                model: None,
            }
        })
        .collect();
    let name = dir.file_name().map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into_owned());
    Ok(Bundle { dir: dir.into(), name, meta, measured, rows, order })
}
