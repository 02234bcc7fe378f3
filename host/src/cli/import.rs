//! `routelab import LOG.jsonl --out TRACE.jsonl`: OpenAI-style request logs → a Mooncake-format
//! trace the simulator replays (`arrivals: {trace: {path: TRACE.jsonl, format: mooncake}}`).
//!
//! A log line is a JSON object with
//! - `timestamp`: when the request arrived, in seconds (any origin: Unix time or from the start);
//! - the request body, either under `request` or inline: `messages` (chat) or `prompt`
//!   (completions), as the gateway parses them;
//! - the output length in tokens: `output_tokens`, or `usage.completion_tokens`, or
//!   `response.usage.completion_tokens` (what an OpenAI-compatible server returns).
//!
//! - optionally the trace's extensions, copied as they are: an agent session's `session_id`,
//!   `call_index` (its turn: 0, 1, 2, … in time order), `parents` and `wait_s` (think or tool
//!   time after the parents complete), and the request's LoRA `adapter` (an index into the
//!   replaying workload's `cluster.lora` adapters, `null` for the base model) — checked as the
//!   replay checks them (`routelab_core::workload::mooncake`), line numbers those of the log.
//! - optionally the request's `class` and `tenant`: a name (a string), mapped to its index in
//!   the `cluster.classes` / `cluster.tenants` of the workload given with `--workload` (the
//!   indices the trace's rows carry), or an index (an integer), copied as it is and checked
//!   against that workload when one is given. A name without `--workload`, or one the workload
//!   does not list, stops the import naming the log's line and the field.
//! - the request's `model` (the OpenAI request's own field: `model` inline, or `request.model`),
//!   a name. When `--workload` serves several models (`cluster.models`), every line must name
//!   one of them and the trace's rows carry it (`"model"`, which the replay keeps: see
//!   `routelab_core::workload::mooncake::check_models`). Otherwise the trace carries no model:
//!   one model serves every request, and a log naming two or more stops the import (at the
//!   first line naming another), since replaying it on one model would merge them.
//!
//! Other fields are ignored. The prompt becomes tokens and prefix blocks exactly as the gateway
//! counts them (the byte-level fallback of `routelab_serve::text`: 4 bytes a token, blocks chained
//! so equal leading text gives equal blocks), then 512-token `hash_ids` as `export-trace` writes
//! them (`routelab_core::workload::export`). Lines out of time order (logs of several servers
//! concatenated) are sorted, stably, and the count is reported; times are written in
//! milliseconds from the first request.

use std::io::Write;
use std::path::Path;

use anyhow::Result;
use serde_json::Value;

use routelab_core::time::ticks;
use routelab_core::workload::InputError;
use routelab_core::workload::export::BlockIds;
use routelab_core::workload::mooncake::{SessionReader, read_adapter, read_label, read_model};
use routelab_policy_api::Segment;
use routelab_serve::text;

const FIX: &str = "each line must be a JSON object with `timestamp` (seconds), the request body (`messages` or \
`prompt`, inline or under `request`) and `output_tokens` (or `usage.completion_tokens`)";

/// The trace extensions a log line may carry (written in the order of their names).
const EXTENSIONS: [&str; 5] = ["session_id", "call_index", "parents", "wait_s", "adapter"];

/// The names a log's `class` and `tenant` may use: the replaying workload's `cluster.classes`
/// and `cluster.tenants`, in order (an index is a name's place).
#[derive(Default)]
pub struct Labels {
    /// The workload file they come from (named in errors).
    pub workload: std::path::PathBuf,
    pub classes: Vec<String>,
    pub tenants: Vec<String>,
    /// Its `cluster.models` names (empty: one model).
    pub models: Vec<String>,
}

/// One imported request.
struct Row {
    at_s: f64,
    output_tokens: u32,
    prompt: Vec<Segment>,
    /// Its line in the log, and the extensions it carries.
    line: usize,
    extensions: serde_json::Map<String, Value>,
    /// The request's model and the field it came from (`model` or `request.model`).
    model: Option<(String, String)>,
}

fn bad(file: &Path, line: usize, field: &str, message: String) -> InputError {
    InputError::new(file, message, FIX).in_field(field).at_line(line)
}

/// The line's `class` or `tenant` (`field`) as an index: a name looked up in `names` (the
/// workload's list; `None`: no `--workload`), or an index checked against it.
fn label_index(file: &Path, line: usize, field: &str, v: &Value, labels: Option<&Labels>) -> Result<u64, InputError> {
    let list = if field == "class" { "classes" } else { "tenants" };
    let names = labels.map(|l| if field == "class" { &l.classes } else { &l.tenants });
    let err = |message: String, fix: String| InputError::new(file, message, fix).in_field(field).at_line(line);
    let known = |names: &[String]| {
        if names.is_empty() {
            format!("it has no `cluster.{list}`")
        } else {
            format!("its {list} are {}", names.join(", "))
        }
    };
    match (v, names, labels) {
        (Value::String(name), Some(names), Some(l)) => {
            names.iter().position(|n| n == name).map(|i| i as u64).ok_or_else(|| {
                err(
                    format!("the {field} `{name}` is not in {}: {}", l.workload.display(), known(names)),
                    format!("name one of the workload's `cluster.{list}`, or add `{name}` to them"),
                )
            })
        }
        (Value::String(name), _, _) => Err(err(
            format!("the {field} `{name}` is a name, and no workload says which index it is"),
            format!(
                "pass `--workload W.yaml`, the workload that replays the trace: its `cluster.{list}` number the names"
            ),
        )),
        (v, names, labels) => {
            let i = v.as_u64().ok_or_else(|| {
                err(
                    format!("must be a {field} name or index (got {v})"),
                    format!("give e.g. \"{field}\": \"batch\" or 0"),
                )
            })?;
            match (names, labels) {
                (Some(names), Some(l)) if i as usize >= names.len().max(1) => Err(err(
                    format!("{field} {i} is past {}: {}", l.workload.display(), known(names)),
                    format!("use an index into the workload's `cluster.{list}` (0 = the first) or its name"),
                )),
                _ => Ok(i),
            }
        }
    }
}

/// Parses one log line (`n` is 1-based).
fn row(file: &Path, n: usize, text: &str, labels: Option<&Labels>) -> Result<Row, InputError> {
    let v: Value = serde_json::from_str(text).map_err(|e| bad(file, n, "", format!("is not JSON: {e}")))?;
    let obj = v.as_object().ok_or_else(|| bad(file, n, "", "is not a JSON object".into()))?;
    let at_s = match obj.get("timestamp") {
        // Up to the year 2286 in Unix seconds: a millisecond timestamp is refused, not read as
        // a time 1,000× later.
        Some(Value::Number(t)) => t.as_f64().filter(|t| (0.0..1e10).contains(t)),
        None => return Err(bad(file, n, "timestamp", "the field `timestamp` is missing".into())),
        Some(_) => None,
    }
    .ok_or_else(|| {
        bad(
            file,
            n,
            "timestamp",
            format!("`timestamp` must be seconds from 0 to 1e10, not milliseconds (got {})", obj["timestamp"]),
        )
    })?;
    let (body, at) = match obj.get("request") {
        Some(r @ Value::Object(_)) => (r, "request."),
        Some(_) => return Err(bad(file, n, "request", "`request` must be the request body, an object".into())),
        None => (&v, ""),
    };
    let chat = body.get("messages").is_some();
    let parsed = text::parse_request(body.to_string().as_bytes(), chat).map_err(|text::InvalidRequest(m)| {
        let field = if chat { "messages" } else { "prompt" };
        bad(file, n, &format!("{at}{field}"), m)
    })?;
    let usage = |u: Option<&Value>| u.and_then(|u| u.get("usage")).and_then(|u| u.get("completion_tokens")).cloned();
    let (field, out) = match obj.get("output_tokens") {
        Some(o) => ("output_tokens", Some(o.clone())),
        None => match usage(Some(&v)) {
            Some(o) => ("usage.completion_tokens", Some(o)),
            None => ("response.usage.completion_tokens", usage(obj.get("response"))),
        },
    };
    let Some(out) = out else {
        return Err(bad(
            file,
            n,
            "output_tokens",
            "no output length: `output_tokens` or `usage.completion_tokens` is missing".into(),
        ));
    };
    let output_tokens = out
        .as_u64()
        .filter(|&o| (1..=u32::MAX as u64).contains(&o))
        .ok_or_else(|| bad(file, n, field, format!("`{field}` must be a whole number of tokens ≥ 1 (got {out})")))?
        as u32;
    let mut prompt = Vec::new();
    text::segments(&parsed.prompt, &mut prompt);
    let mut extensions: serde_json::Map<String, Value> =
        EXTENSIONS.iter().filter_map(|&k| obj.get(k).map(|v| (k.to_string(), v.clone()))).collect();
    for field in ["class", "tenant"] {
        if let Some(v) = obj.get(field) {
            extensions.insert(field.into(), label_index(file, n, field, v, labels)?.into());
        }
    }
    // The body's `model` (inline, the line's own), or a line's `model` beside its `request`.
    let (model_field, holder) = match (obj.get("model"), at) {
        (None, "request.") => ("request.model", body.as_object().expect("checked above")),
        _ => ("model", obj),
    };
    let model = read_model(holder, file, n)
        .map_err(|e| InputError { path: model_field.into(), ..e })?
        .map(|m| (m, model_field.to_string()));
    Ok(Row { at_s, output_tokens, prompt, line: n, extensions, model })
}

/// Gives each row its `"model"` when `labels` serve several models (every row must name one of
/// them); with one model, checks the log names at most one (the trace then carries none).
fn models(file: &Path, rows: &mut [Row], labels: Option<&Labels>) -> Result<(), InputError> {
    let err = |r: &Row, field: &str, message: String, fix: String| {
        InputError::new(file, message, fix).in_field(field).at_line(r.line)
    };
    match labels.filter(|l| !l.models.is_empty()) {
        Some(l) => {
            let names = l.models.join(", ");
            for r in rows.iter_mut() {
                let Some((m, field)) = &r.model else {
                    return Err(err(
                        r,
                        "model",
                        format!(
                            "names no model, and {} serves several ({names}): every line must name its request's",
                            l.workload.display()
                        ),
                        format!("give the line a \"model\" (inline or in `request`), one of: {names}"),
                    ));
                };
                if !l.models.contains(m) {
                    return Err(err(
                        r,
                        field,
                        format!("the model `{m}` is not one of {}'s models ({names})", l.workload.display()),
                        format!("add `{m}` to the workload's `cluster.models`, or fix the line"),
                    ));
                }
                r.extensions.insert("model".into(), m.clone().into());
            }
        }
        None => {
            let mut first: Option<(&str, usize)> = None;
            for r in rows.iter() {
                let Some((m, field)) = &r.model else { continue };
                match first {
                    None => first = Some((m.as_str(), r.line)),
                    Some((f, line)) if f != m.as_str() => {
                        let (message, fix) = match labels {
                            None => (
                                "no workload says which of its models they are".to_string(),
                                "pass `--workload W.yaml`, a workload whose `cluster.models` names them".to_string(),
                            ),
                            Some(l) => (
                                format!("{} serves one model (it has no `cluster.models`)", l.workload.display()),
                                format!("add `models:` naming `{f}`, `{m}`, … under the workload's `cluster:`"),
                            ),
                        };
                        return Err(err(
                            r,
                            field,
                            format!("the log names several models (`{f}` on line {line}, `{m}` here), and {message}"),
                            fix,
                        ));
                    }
                    Some(_) => {}
                }
            }
        }
    }
    Ok(())
}

/// What an import read and wrote.
pub struct Imported {
    pub requests: usize,
    pub reordered: usize,
    pub distinct_blocks: usize,
}

/// Reads the log at `file`, writes the trace to `out`. Every line is checked before anything is
/// written; `labels` names the classes and tenants a line may give by name.
pub fn import(file: &Path, out: &mut impl Write, labels: Option<&Labels>) -> Result<Imported> {
    let content = std::fs::read_to_string(file)
        .map_err(|e| InputError::new(file, format!("cannot be read: {e}"), "give a JSON Lines file of requests"))?;
    let mut rows = Vec::new();
    for (i, line) in content.lines().enumerate() {
        if !line.trim().is_empty() {
            rows.push(row(file, i + 1, line, labels)?);
        }
    }
    if rows.is_empty() {
        return Err(bad(file, 1, "", "holds no request".into()).into());
    }
    models(file, &mut rows, labels)?;
    let reordered = rows.windows(2).filter(|w| w[1].at_s < w[0].at_s).count();
    rows.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    // Sessions in time order, as the trace will hold them.
    let mut sessions = SessionReader::default();
    for r in &rows {
        sessions.read(&r.extensions, file, r.line)?;
        read_adapter(&r.extensions, file, r.line)?;
        read_label(&r.extensions, file, r.line)?;
    }
    let start = ticks(rows[0].at_s);
    let mut ids = BlockIds::default();
    let mut hash_ids = Vec::new();
    for r in &rows {
        ids.of(&r.prompt, &mut hash_ids);
        let ms = ((ticks(r.at_s) - start).as_nanos() as f64 / 1e6).round() as u64;
        let input: u32 = text::tokens_of(&r.prompt);
        let ids: Vec<String> = hash_ids.iter().map(u64::to_string).collect();
        let extensions: String = r.extensions.iter().map(|(k, v)| format!(", \"{k}\": {v}")).collect();
        writeln!(
            out,
            "{{\"timestamp\": {ms}, \"input_length\": {input}, \"output_length\": {}, \"hash_ids\": [{}]{extensions}}}",
            r.output_tokens,
            ids.join(", ")
        )?;
    }
    Ok(Imported { requests: rows.len(), reordered, distinct_blocks: ids.distinct() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn import_text(log: &str) -> Result<(String, Imported)> {
        import_with(log, None)
    }

    fn import_with(log: &str, labels: Option<&Labels>) -> Result<(String, Imported)> {
        let dir = std::env::temp_dir().join(format!("routelab-import-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // One file per call: tests run in parallel threads of one process.
        static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let k = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let f = dir.join(format!("log-{k}.jsonl"));
        std::fs::write(&f, log).unwrap();
        let mut out = Vec::new();
        let got = import(&f, &mut out, labels)?;
        Ok((String::from_utf8(out).unwrap(), got))
    }

    #[test]
    fn shared_leading_text_gives_shared_blocks_and_times_are_sorted_from_the_first() {
        // 4 bytes a token: 2,048 + 16 bytes of shared text is 516 tokens, one full shared block.
        let shared = "a".repeat(2048 + 16);
        let log = format!(
            "{{\"timestamp\": 1700000010.5, \"request\": {{\"prompt\": \"{shared}xyz\"}}, \"output_tokens\": 7}}\n\
             {{\"timestamp\": 1700000010.0, \"messages\": [{{\"role\": \"user\", \"content\": \"hi\"}}], \"usage\": {{\"completion_tokens\": 3}}}}\n\
             {{\"timestamp\": 1700000011.25, \"prompt\": \"{shared}other\", \"response\": {{\"usage\": {{\"completion_tokens\": 9}}}}}}\n"
        );
        let (trace, got) = import_text(&log).unwrap();
        assert_eq!((got.requests, got.reordered), (3, 1));
        let rows: Vec<Value> = trace.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        let field = |r: &Value, k: &str| r[k].clone();
        // Sorted: the chat request (at .0) first; times in ms from it.
        assert_eq!(rows.iter().map(|r| field(r, "timestamp")).collect::<Vec<_>>(), [0, 500, 1250]);
        // "user: hi\n" is 9 bytes → 3 tokens; 2,067 bytes → 517 tokens; 2,069 → 518.
        assert_eq!(rows.iter().map(|r| field(r, "input_length")).collect::<Vec<_>>(), [3, 517, 518]);
        assert_eq!(rows.iter().map(|r| field(r, "output_length")).collect::<Vec<_>>(), [3, 7, 9]);
        let ids: Vec<Vec<u64>> = rows
            .iter()
            .map(|r| r["hash_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect())
            .collect();
        // The two long prompts share their first 512-token block, and differ in the partial one.
        assert_eq!(ids[1].len(), 2);
        assert_eq!(ids[2].len(), 2);
        assert_eq!(ids[1][0], ids[2][0]);
        assert_ne!(ids[1][1], ids[2][1]);
        assert_eq!(got.distinct_blocks, 4);
    }

    #[test]
    fn a_bad_line_names_its_line_and_field() {
        let cases = [
            ("{\"prompt\": \"x\", \"output_tokens\": 1}", "timestamp"),
            ("{\"timestamp\": -1, \"prompt\": \"x\", \"output_tokens\": 1}", "timestamp"),
            ("{\"timestamp\": 1700000000000, \"prompt\": \"x\", \"output_tokens\": 1}", "timestamp"),
            ("{\"timestamp\": 1, \"prompt\": \"x\"}", "output_tokens"),
            ("{\"timestamp\": 1, \"prompt\": \"x\", \"output_tokens\": 0}", "output_tokens"),
            ("{\"timestamp\": 1, \"request\": {\"prompt\": \"\"}, \"output_tokens\": 2}", "request.prompt"),
            ("{\"timestamp\": 1, \"messages\": [1], \"output_tokens\": 2}", "messages"),
            ("not json", ""),
        ];
        for (line, field) in cases {
            let log = format!("{{\"timestamp\": 0, \"prompt\": \"ok\", \"output_tokens\": 1}}\n{line}\n");
            let e = import_text(&log).err().unwrap();
            let e = e.downcast_ref::<InputError>().unwrap();
            assert_eq!((e.line, e.path.as_str()), (Some(2), field), "{line}: {e:?}");
        }
    }

    /// A log's session and adapter fields reach the trace (sorted by time like the rest), and
    /// the trace replays them; a session out of order names the log's line.
    #[test]
    fn session_and_adapter_fields_are_carried_and_checked() {
        let log = "{\"timestamp\": 12.5, \"prompt\": \"call one, after the tool\", \"output_tokens\": 4, \"session_id\": \"s\", \"call_index\": 1, \"wait_s\": 2.5, \"adapter\": 2}\n\
                   {\"timestamp\": 10, \"prompt\": \"call zero\", \"output_tokens\": 3, \"session_id\": \"s\", \"call_index\": 0, \"adapter\": 2}\n\
                   {\"timestamp\": 11, \"prompt\": \"no session\", \"output_tokens\": 5, \"adapter\": null}\n";
        let (trace, got) = import_text(log).unwrap();
        assert_eq!((got.requests, got.reordered), (3, 1));
        let rows = routelab_core::workload::mooncake::parse(&trace, Path::new("t.jsonl")).unwrap();
        let calls: Vec<_> =
            rows.iter().map(|r| (r.session.map(|s| (s.session, s.call, s.wait_s)), r.adapter)).collect();
        let base = routelab_core::workload::mooncake::NO_ADAPTER;
        assert_eq!(calls, [(Some((0, 0, 0.0)), Some(2)), (None, Some(base)), (Some((0, 1, 2.5)), Some(2))]);

        let swapped = "{\"timestamp\": 1, \"prompt\": \"a\", \"output_tokens\": 1, \"session_id\": 7, \"call_index\": 1}\n\
                       {\"timestamp\": 2, \"prompt\": \"b\", \"output_tokens\": 1, \"session_id\": 7, \"call_index\": 0}\n";
        let e = import_text(swapped).err().unwrap();
        let e = e.downcast_ref::<InputError>().unwrap();
        assert_eq!((e.line, e.path.as_str()), (Some(1), "call_index"), "{e:?}");
        let bad = "{\"timestamp\": 1, \"prompt\": \"a\", \"output_tokens\": 1, \"adapter\": \"lora-a\"}\n";
        let e = import_text(bad).err().unwrap();
        assert_eq!(e.downcast_ref::<InputError>().unwrap().path, "adapter");
    }
}
