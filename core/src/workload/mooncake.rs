//! Trace files in the Mooncake (FAST'25) format: JSON Lines, one request a line,
//! `{"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, ...]}` —
//! `timestamp` in milliseconds from the start of the trace (non-decreasing), lengths in tokens,
//! and `hash_ids` the prompt cut into 512-token blocks, each replaced by an id that is equal for
//! equal prefixes (README of `workloads/traces/mooncake-fast25/`).
//!
//! Each id becomes one prompt segment of 512 tokens, the last one partial
//! (`input_length − 512·(n−1)`); a row whose ids cover fewer tokens than `input_length` gets the
//! rest as a unique suffix (the shipped traces always cover the prompt exactly). A row whose ids
//! need more tokens than it has (`ceil(input_length / 512) < n`) is bad input, as is an id whose
//! block length differs between rows (equal segment ids must mean equal tokens). Malformed rows
//! are errors naming the line and the field.
//!
//! Agent sessions (routelab's extension; every field optional, the shipped traces have none):
//! `"session_id"` (a string or an integer) groups rows into a session, `"call_index"` numbers
//! its calls 0, 1, 2, … in file order, `"parents"` lists the earlier calls of the session a call
//! waits for (by call index; `[k − 1]` when absent: a chain), and `"wait_s"` is the time call k
//! waits after the last of its parents completes (a tool's run, a user's think time; 0 when
//! absent). The first call of a session arrives at its `timestamp`; every later call is sent when
//! its parents complete, plus its `wait_s` (its own `timestamp` only orders the file), so a
//! recorded agent trace replays closed-loop: a slower router delays the rest of the session. A
//! sub-agent burst is calls whose parents are the one call that spawned them; the call that reads
//! their results lists all of them.
//!
//! LoRA adapters (routelab's extension): `"adapter"` is the row's adapter, an index into the
//! workload's `cluster.lora` adapters, or `null` for the base model. A trace that gives it on any
//! row gives every request's adapter (a row without it is on the base model); without it anywhere
//! the replay draws adapters per session as for generated streams (`generate/lora.rs`).
//!
//! Models (routelab's extension): `"model"` is the row's model, a name in the workload's
//! `cluster.models` (as an OpenAI request names its model); a trace that gives it on any row
//! gives every row's, and the replay keeps them instead of drawing ([`check_models`]).
//!
//! Request classes and tenants (routelab's extension, as the Azure CSV's optional columns:
//! [`super::trace`]): `"class"` is the row's class, an index into the workload's
//! `cluster.classes`, and `"tenant"` its tenant, an index into `cluster.tenants` (0-based, in the
//! order they are written; absent = 0). The replay labels its requests with them when the
//! workload has `classes:` or `tenants:`; an index the workload lacks is bad input
//! ([`check_labels`]).

use std::collections::HashMap;
use std::path::Path;

use super::InputError;
use super::limits;
use super::trace::{MAX_ROWS, MAX_TRACE_BYTES};

/// Tokens per hash id.
pub const BLOCK_TOKENS: u32 = 512;
/// Hash ids map to segment ids `HASH_ID_BASE + id`, above every other segment id the generator
/// hands out (system prompt 1, contexts from 2, unique segments from 2^32 and never near 2^48).
pub const HASH_ID_BASE: u64 = 1 << 48;
/// Largest hash id accepted (so segment ids stay distinct from every other kind).
pub const MAX_HASH_ID: u64 = (1 << 48) - 1;

const FIX: &str = "each line must be a JSON object {\"timestamp\": ms, \"input_length\": tokens, \"output_length\": tokens, \
\"hash_ids\": [ids of 512-token blocks]} with timestamps non-decreasing";

/// One trace row.
#[derive(Clone, Debug, PartialEq)]
pub struct MooncakeRow {
    /// Seconds since the first row.
    pub at_s: f64,
    pub input_length: u32,
    pub output_length: u32,
    pub hash_ids: Vec<u64>,
    /// Line in the file (1-based), for errors about the row.
    pub line: usize,
    /// The row's place in an agent session, when it has one.
    pub session: Option<SessionCall>,
    /// The calls of its session the row waits for, by call index, when the trace lists them
    /// (empty: the previous call; call 0 waits for none).
    pub parents: Vec<u32>,
    /// The row's LoRA adapter when the trace gives one ([`NO_ADAPTER`] for `null`: the base
    /// model); `None`: not given.
    pub adapter: Option<u32>,
    /// The row's class (an index into `cluster.classes`) when the trace gives one.
    pub class: Option<u16>,
    /// The row's tenant (an index into `cluster.tenants`) when the trace gives one.
    pub tenant: Option<u32>,
    /// The row's model (a name in `cluster.models`) when the trace gives one (`models.rs`).
    pub model: Option<String>,
}

/// `"adapter": null` — the base model (also the stream's mark for a request without an
/// adapter: `generate::NO_ADAPTER`).
pub const NO_ADAPTER: u32 = u32::MAX;

/// A trace row's place in an agent session (the optional session fields).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SessionCall {
    /// The session, numbered 0, 1, … in order of first appearance in the file.
    pub session: u32,
    /// The call's index in its session (0 = the session's first call).
    pub call: u32,
    /// Seconds between the last parent's completion and this call's send (0 for call 0).
    pub wait_s: f64,
}

const SESSION_FIX: &str = "a session's rows carry \"session_id\" (a string or an integer) and \"call_index\" \
(0, 1, 2, … in file order), and optionally \"parents\" (call indexes of earlier calls; the previous call when absent) \
and \"wait_s\" (seconds after the last parent completes); call 0 has neither";

/// Reads rows' optional session fields, numbering sessions in order of first appearance
/// (`routelab import` reads a request log's with it too).
#[derive(Default)]
pub struct SessionReader {
    /// Per session id: its number, the last call index seen, the line of that call.
    sessions: HashMap<String, (u32, u32, usize)>,
}

impl SessionReader {
    /// The row's place in its session and the parents it lists (empty: the default, the
    /// previous call), from `obj` on line `line` of `file`.
    pub fn read(
        &mut self,
        obj: &serde_json::Map<String, serde_json::Value>,
        file: &Path,
        line: usize,
    ) -> Result<(Option<SessionCall>, Vec<u32>), InputError> {
        let err =
            |field: &str, message: String| InputError::new(file, message, SESSION_FIX).in_field(field).at_line(line);
        let Some(id) = obj.get("session_id") else {
            for field in ["call_index", "parents", "wait_s"] {
                if obj.contains_key(field) {
                    return Err(err(field, format!("`{field}` needs a `session_id` on the same row")));
                }
            }
            return Ok((None, Vec::new()));
        };
        let key = match id {
            serde_json::Value::String(s) if !s.is_empty() => s.clone(),
            serde_json::Value::Number(n) if n.is_u64() => n.to_string(),
            v => {
                return Err(err(
                    "session_id",
                    format!("must be a non-empty string or a non-negative integer (got {v})"),
                ));
            }
        };
        let call = match obj.get("call_index") {
            None => {
                return Err(err("call_index", "the field `call_index` is missing (a session's rows need it)".into()));
            }
            Some(v) => v
                .as_u64()
                .and_then(|c| u32::try_from(c).ok())
                .ok_or_else(|| err("call_index", format!("must be a non-negative integer (got {v})")))?,
        };
        let wait_s = match obj.get("wait_s") {
            None => 0.0,
            Some(v) => match v.as_f64() {
                Some(w) if (0.0..=limits::MAX_HORIZON).contains(&w) => w,
                _ => {
                    return Err(err(
                        "wait_s",
                        format!("must be seconds in [0, {:.0e}] (got {v})", limits::MAX_HORIZON),
                    ));
                }
            },
        };
        let next = self.sessions.len() as u32;
        let expected = match self.sessions.get(&key) {
            Some(&(_, last, _)) => last + 1,
            None => 0,
        };
        if call != expected {
            let before = match self.sessions.get(&key) {
                Some(&(_, last, at)) => format!("call {last} on line {at}"),
                None => "no call before it".into(),
            };
            return Err(err(
                "call_index",
                format!("session `{key}`: call {call} follows {before}; expected call_index {expected}"),
            ));
        }
        for field in ["wait_s", "parents"] {
            if call == 0 && obj.contains_key(field) {
                return Err(err(
                    field,
                    format!("call 0 of session `{key}` arrives at its timestamp; `{field}` is for its later calls"),
                ));
            }
        }
        let parents = match obj.get("parents") {
            None => Vec::new(),
            Some(v) => {
                let list = v.as_array().filter(|l| !l.is_empty()).ok_or_else(|| {
                    err("parents", format!("must be a non-empty list of earlier call indexes (got {v})"))
                })?;
                let mut parents = Vec::with_capacity(list.len());
                for (k, p) in list.iter().enumerate() {
                    let p = p.as_u64().filter(|&p| p < call as u64).ok_or_else(|| {
                        err(
                            &format!("parents[{k}]"),
                            format!("must be the index of an earlier call, 0..{call} (got {p})"),
                        )
                    })? as u32;
                    if parents.contains(&p) {
                        return Err(err(&format!("parents[{k}]"), format!("lists call {p} twice")));
                    }
                    parents.push(p);
                }
                parents
            }
        };
        let entry = self.sessions.entry(key).or_insert((next, 0, line));
        (entry.1, entry.2) = (call, line);
        Ok((Some(SessionCall { session: entry.0, call, wait_s }), parents))
    }
}

/// The row's optional `"adapter"`: an adapter index, `null` ([`NO_ADAPTER`]), or absent (`None`).
pub fn read_adapter(
    obj: &serde_json::Map<String, serde_json::Value>,
    file: &Path,
    line: usize,
) -> Result<Option<u32>, InputError> {
    match obj.get("adapter") {
        None => Ok(None),
        Some(serde_json::Value::Null) => Ok(Some(NO_ADAPTER)),
        Some(v) => v.as_u64().filter(|&a| a < NO_ADAPTER as u64).map(|a| Some(a as u32)).ok_or_else(|| {
            InputError::new(
                file,
                format!("must be a LoRA adapter index (an integer ≥ 0) or null for the base model (got {v})"),
                "give the index of the request's adapter in the workload's `cluster.lora` adapters",
            )
            .in_field("adapter")
            .at_line(line)
        }),
    }
}

/// Checks the rows' adapters against the workload's `cluster.lora` (`None`: no `lora:`): every
/// index names one of its adapters, and a trace that gives adapters needs the section.
pub fn check_adapters(
    rows: &[MooncakeRow],
    lora: Option<&super::cluster::lora::Lora>,
    file: &Path,
) -> Result<(), InputError> {
    let Some(first) = rows.iter().find(|r| r.adapter.is_some()) else { return Ok(()) };
    let bad = |line: usize, message: String, fix: String| {
        InputError::new(file, message, fix).in_field("adapter").at_line(line)
    };
    let Some(l) = lora else {
        return Err(bad(
            first.line,
            "the trace gives LoRA adapters, but the workload has no `cluster.lora` section".into(),
            "add `lora: {adapters: N, max_loras: 4}` under `cluster:` (N above every adapter index), or drop \"adapter\" from the rows".into(),
        ));
    };
    match rows.iter().find(|r| r.adapter.is_some_and(|a| a != NO_ADAPTER && a >= l.adapters)) {
        Some(r) => Err(bad(
            r.line,
            format!(
                "adapter {} is not one of the workload's {} adapters (0..{})",
                r.adapter.unwrap(),
                l.adapters,
                l.adapters
            ),
            format!("raise `cluster.lora.adapters` above {}, or fix the row", r.adapter.unwrap()),
        )),
        None => Ok(()),
    }
}

/// The row's optional `"class"` and `"tenant"`: indices (`None`: absent).
pub fn read_label(
    obj: &serde_json::Map<String, serde_json::Value>,
    file: &Path,
    line: usize,
) -> Result<(Option<u16>, Option<u32>), InputError> {
    let index = |field: &str, list: &str, max: u64| -> Result<Option<u64>, InputError> {
        let Some(v) = obj.get(field) else { return Ok(None) };
        v.as_u64().filter(|&i| i <= max).map(Some).ok_or_else(|| {
            InputError::new(
                file,
                format!("must be a {field} index, an integer in [0, {max}] (got {v})"),
                format!("give the index of the request's {field} in the workload's `cluster.{list}` (0 = the first)"),
            )
            .in_field(field)
            .at_line(line)
        })
    };
    let class = index("class", "classes", u16::MAX as u64)?.map(|c| c as u16);
    let tenant = index("tenant", "tenants", u32::MAX as u64)?.map(|t| t as u32);
    Ok((class, tenant))
}

/// Checks the rows' classes and tenants against the workload's `cluster.classes` and
/// `cluster.tenants`, as [`super::trace::check_cluster_rows`] checks the CSV's columns: without
/// them only index 0 (every request's class and tenant then) is valid.
pub fn check_labels(rows: &[MooncakeRow], spec: &super::cluster::ClusterSpec, file: &Path) -> Result<(), InputError> {
    let (classes, tenants) = (spec.classes.len(), spec.tenants.len());
    for r in rows {
        let bad = |field: &str, v: usize, n: usize, list: &str| {
            let message = if n == 0 {
                format!("{field} {v}, but the workload has no `cluster.{list}` (every request is {field} 0)")
            } else {
                format!("{field} {v} is not one of the workload's {n} {list} (valid: 0..{})", n - 1)
            };
            let fix = format!(
                "use an index into the workload's `cluster.{list}`, in the order written (0 = the first), or fix the row"
            );
            InputError::new(file, message, fix).in_field(field).at_line(r.line)
        };
        if let Some(c) = r.class.filter(|&c| c as usize >= classes.max(1)) {
            return Err(bad("class", c as usize, classes, "classes"));
        }
        if let Some(t) = r.tenant.filter(|&t| t as usize >= tenants.max(1)) {
            return Err(bad("tenant", t as usize, tenants, "tenants"));
        }
    }
    Ok(())
}

impl MooncakeRow {
    /// Tokens of block `i` of the row's prompt (only the last block may be short).
    pub fn block_tokens(&self, i: usize) -> u32 {
        self.block_tokens_of(i, BLOCK_TOKENS)
    }

    /// Prompt tokens the hash ids do not cover (a unique suffix; 0 in the shipped traces).
    pub fn uncovered_tokens(&self) -> u32 {
        self.uncovered_tokens_of(BLOCK_TOKENS)
    }

    /// [`Self::block_tokens`] for blocks of `block` tokens.
    pub fn block_tokens_of(&self, i: usize, block: u32) -> u32 {
        (self.input_length - block * i as u32).min(block)
    }

    /// [`Self::uncovered_tokens`] for blocks of `block` tokens.
    pub fn uncovered_tokens_of(&self, block: u32) -> u32 {
        self.input_length.saturating_sub(block.saturating_mul(self.hash_ids.len() as u32))
    }
}

fn field_error(file: &Path, line: usize, field: &str, message: String) -> InputError {
    InputError::new(file, message, FIX).in_field(field).at_line(line)
}

fn count(
    obj: &serde_json::Map<String, serde_json::Value>,
    key: &str,
    file: &Path,
    line: usize,
) -> Result<u64, InputError> {
    match obj.get(key) {
        None => Err(field_error(file, line, key, format!("the field `{key}` is missing"))),
        Some(v) => v
            .as_u64()
            .ok_or_else(|| field_error(file, line, key, format!("`{key}` must be a non-negative integer (got {v})"))),
    }
}

/// Parses trace text; `file` names it in errors.
pub fn parse(text: &str, file: &Path) -> Result<Vec<MooncakeRow>, InputError> {
    let mut rows = Rows::new(file);
    for (i, line) in text.lines().enumerate() {
        rows.line(i + 1, line)?;
    }
    rows.finish()
}

/// Reads and parses a Mooncake trace file (capped at [`MAX_TRACE_BYTES`]) one line at a time, so
/// that its text is never whole in memory (as the Azure trace's: [`limits::read_lines_capped`]).
pub fn load(path: &Path) -> Result<Vec<MooncakeRow>, InputError> {
    let hint = "routelab ships the Mooncake FAST'25 traces in workloads/traces/mooncake-fast25/; pass the path of a \
                JSONL file in that format";
    let mut rows = Rows::new(path);
    limits::read_lines_capped(path, MAX_TRACE_BYTES, "trace", hint, |n, line| rows.line(n, line))?;
    rows.finish()
}

/// The rows read so far and what checking the next one needs.
struct Rows<'f> {
    file: &'f Path,
    rows: Vec<MooncakeRow>,
    first_ms: Option<u64>,
    last_ms: u64,
    /// Block length of every id seen, and the line that first gave it.
    block_len: HashMap<u64, (u32, usize)>,
    sessions: SessionReader,
}

impl<'f> Rows<'f> {
    fn new(file: &'f Path) -> Self {
        Self {
            file,
            rows: Vec::new(),
            first_ms: None,
            last_ms: 0,
            block_len: HashMap::new(),
            sessions: SessionReader::default(),
        }
    }

    /// Line `n` (from 1) of the trace.
    fn line(&mut self, n: usize, line: &str) -> Result<(), InputError> {
        let file = self.file;
        let line = line.trim();
        if line.is_empty() {
            return Ok(());
        }
        let value: serde_json::Value =
            serde_json::from_str(line).map_err(|e| field_error(file, n, "", format!("not valid JSON: {e}")))?;
        let obj = value.as_object().ok_or_else(|| field_error(file, n, "", "expected a JSON object".into()))?;
        let ts = count(obj, "timestamp", file, n)?;
        let input = count(obj, "input_length", file, n)?;
        let output = count(obj, "output_length", file, n)?;
        let too_big = |key: &str, v: u64| {
            field_error(file, n, key, format!("`{key}` = {v} is beyond the 2^32 − 1 tokens a request may have"))
        };
        let input_length = u32::try_from(input).map_err(|_| too_big("input_length", input))?;
        let output_length = u32::try_from(output).map_err(|_| too_big("output_length", output))?;
        if input_length == 0 {
            return Err(field_error(file, n, "input_length", "must be at least 1 (got 0)".into()));
        }
        let ids = match obj.get("hash_ids") {
            None => return Err(field_error(file, n, "hash_ids", "the field `hash_ids` is missing".into())),
            Some(v) => v.as_array().ok_or_else(|| {
                field_error(file, n, "hash_ids", format!("`hash_ids` must be a list of integers (got {v})"))
            })?,
        };
        let mut hash_ids = Vec::with_capacity(ids.len());
        for (k, id) in ids.iter().enumerate() {
            match id.as_u64().filter(|&v| v <= MAX_HASH_ID) {
                Some(v) => hash_ids.push(v),
                None => {
                    return Err(field_error(
                        file,
                        n,
                        &format!("hash_ids[{k}]"),
                        format!("must be an integer in [0, 2^48) (got {id})"),
                    ));
                }
            }
        }
        let needed = input_length.div_ceil(BLOCK_TOKENS) as usize;
        if hash_ids.len() > needed {
            return Err(field_error(
                file,
                n,
                "hash_ids",
                format!(
                    "has {} ids, but input_length = {input_length} tokens fills only {needed} blocks of {BLOCK_TOKENS}",
                    hash_ids.len()
                ),
            ));
        }
        if ts < self.last_ms {
            return Err(field_error(
                file,
                n,
                "timestamp",
                format!("goes back in time ({ts} ms after {} ms)", self.last_ms),
            ));
        }
        self.last_ms = ts;
        let t0 = *self.first_ms.get_or_insert(ts);
        let at_s = (ts - t0) as f64 / 1000.0;
        if !(at_s <= limits::MAX_HORIZON) {
            return Err(field_error(
                file,
                n,
                "timestamp",
                format!("is {at_s:.3e} s after the first row, beyond the clock's {:.1e} s", limits::MAX_HORIZON),
            ));
        }
        if self.rows.len() >= MAX_ROWS {
            return Err(field_error(file, n, "", format!("the trace has more than {MAX_ROWS} rows")));
        }
        let (session, parents) = self.sessions.read(obj, file, n)?;
        let adapter = read_adapter(obj, file, n)?;
        let (class, tenant) = read_label(obj, file, n)?;
        let model = read_model(obj, file, n)?;
        let row = MooncakeRow {
            at_s,
            input_length,
            output_length,
            hash_ids,
            line: n,
            session,
            parents,
            adapter,
            class,
            tenant,
            model,
        };
        for (k, &id) in row.hash_ids.iter().enumerate() {
            let tokens = row.block_tokens(k);
            let (seen, seen_line) = *self.block_len.entry(id).or_insert((tokens, n));
            if seen != tokens {
                return Err(field_error(
                    file,
                    n,
                    &format!("hash_ids[{k}]"),
                    format!(
                        "block {id} is {tokens} tokens here but {seen} tokens on line {seen_line}: equal ids must be equal blocks"
                    ),
                ));
            }
        }
        self.rows.push(row);
        Ok(())
    }

    fn finish(self) -> Result<Vec<MooncakeRow>, InputError> {
        if self.rows.is_empty() {
            return Err(InputError::new(self.file, "the trace has no rows", "give a JSONL file with at least one row"));
        }
        Ok(self.rows)
    }
}

mod models;
pub use models::{check_models, read_model};
#[cfg(test)]
mod tests;
