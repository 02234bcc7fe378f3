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
    InputError { file: file.into(), path: field.into(), line: Some(line), message, fix: FIX.into() }
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
    let mut rows = Vec::new();
    let mut first_ms: Option<u64> = None;
    let mut last_ms = 0u64;
    // Block length of every id seen, and the line that first gave it.
    let mut block_len: HashMap<u64, (u32, usize)> = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let line = line.trim();
        if line.is_empty() {
            continue;
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
        if ts < last_ms {
            return Err(field_error(file, n, "timestamp", format!("goes back in time ({ts} ms after {last_ms} ms)")));
        }
        last_ms = ts;
        let t0 = *first_ms.get_or_insert(ts);
        let at_s = (ts - t0) as f64 / 1000.0;
        if !(at_s <= limits::MAX_HORIZON) {
            return Err(field_error(
                file,
                n,
                "timestamp",
                format!("is {at_s:.3e} s after the first row, beyond the clock's {:.1e} s", limits::MAX_HORIZON),
            ));
        }
        if rows.len() >= MAX_ROWS {
            return Err(field_error(file, n, "", format!("the trace has more than {MAX_ROWS} rows")));
        }
        let row = MooncakeRow { at_s, input_length, output_length, hash_ids, line: n };
        for (k, &id) in row.hash_ids.iter().enumerate() {
            let tokens = row.block_tokens(k);
            let (seen, seen_line) = *block_len.entry(id).or_insert((tokens, n));
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
        rows.push(row);
    }
    if rows.is_empty() {
        return Err(InputError {
            file: file.into(),
            path: String::new(),
            line: None,
            message: "the trace has no rows".into(),
            fix: "give a JSONL file with at least one row".into(),
        });
    }
    Ok(rows)
}

/// Reads and parses a Mooncake trace file (capped at [`MAX_TRACE_BYTES`]).
pub fn load(path: &Path) -> Result<Vec<MooncakeRow>, InputError> {
    let hint = "routelab ships the Mooncake FAST'25 traces in workloads/traces/mooncake-fast25/; pass the path of a \
                JSONL file in that format";
    let text = limits::read_capped(path, MAX_TRACE_BYTES, "trace", hint)?;
    parse(&text, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> InputError {
        parse(text, Path::new("m.jsonl")).unwrap_err()
    }

    #[test]
    fn rows_parse_with_seconds_from_the_first() {
        let text = "{\"timestamp\": 1000, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [3, 4]}\n\n\
                    {\"timestamp\": 3500, \"input_length\": 512, \"output_length\": 0, \"hash_ids\": [3]}\n";
        let rows = parse(text, Path::new("m.jsonl")).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].at_s, rows[1].at_s), (0.0, 2.5));
        assert_eq!((rows[0].block_tokens(0), rows[0].block_tokens(1)), (512, 88));
        assert_eq!(rows[1].line, 3);
    }

    #[test]
    fn malformed_rows_name_line_and_field() {
        let ok = "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [0]}\n";
        let e = err(&format!("{ok}{{\"timestamp\": 5, \"input_length\": 10\n"));
        assert_eq!(e.line, Some(2));
        assert!(e.message.contains("not valid JSON"), "{}", e.message);
        assert!(e.to_string().starts_with("m.jsonl:2"), "{e}");
        let e = err(&format!("{ok}{{\"timestamp\": 5, \"input_length\": 10, \"hash_ids\": [1]}}\n"));
        assert_eq!((e.line, e.path.as_str()), (Some(2), "output_length"));
        let e = err(&format!("{ok}{{\"timestamp\": 5, \"input_length\": 10, \"output_length\": 1}}\n"));
        assert_eq!((e.line, e.path.as_str()), (Some(2), "hash_ids"));
        let e = err(&format!(
            "{ok}{{\"timestamp\": \"soon\", \"input_length\": 10, \"output_length\": 1, \"hash_ids\": []}}\n"
        ));
        assert_eq!((e.line, e.path.as_str()), (Some(2), "timestamp"));
        let e = err(&format!(
            "{ok}{{\"timestamp\": 5, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1, -2]}}\n"
        ));
        assert_eq!((e.line, e.path.as_str()), (Some(2), "hash_ids[1]"));
        let e =
            err(&format!("{{\"timestamp\": 9, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [0]}}\n{ok}"));
        assert_eq!((e.line, e.path.as_str()), (Some(2), "timestamp"));
    }

    #[test]
    fn more_hash_ids_than_the_prompt_fills_is_refused() {
        // 1025 tokens fill 3 blocks (512 + 512 + 1): 3 ids are fine, 4 are not.
        assert!(
            parse(
                "{\"timestamp\": 0, \"input_length\": 1025, \"output_length\": 1, \"hash_ids\": [0, 1, 2]}",
                Path::new("m")
            )
            .is_ok()
        );
        let e = err("{\"timestamp\": 0, \"input_length\": 1025, \"output_length\": 1, \"hash_ids\": [0, 1, 2, 3]}");
        assert_eq!((e.line, e.path.as_str()), (Some(1), "hash_ids"));
        assert!(e.message.contains("fills only 3 blocks"), "{}", e.message);
    }

    #[test]
    fn an_id_with_two_block_lengths_is_refused() {
        let e = err("{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 1, \"hash_ids\": [0, 1]}\n\
                     {\"timestamp\": 0, \"input_length\": 700, \"output_length\": 1, \"hash_ids\": [0, 1]}\n");
        assert_eq!((e.line, e.path.as_str()), (Some(2), "hash_ids[1]"));
        assert!(e.message.contains("line 1"), "{}", e.message);
    }
}
