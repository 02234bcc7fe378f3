//! Trace files in the Azure LLM inference trace format: a header, then
//! `TIMESTAMP,ContextTokens,GeneratedTokens` rows, TIMESTAMP either `2023-11-16 18:15:46.6805900`
//! or a plain number of seconds. Two optional columns follow: the request's class and tenant, as
//! 0-based indices into the workload's `cluster.classes` and `cluster.tenants` (in the order they
//! are written; absent = 0). Malformed rows are errors naming the line.

use std::path::Path;

use super::InputError;
use super::limits;

/// One trace row.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TraceRow {
    /// Seconds since the first row.
    pub at_s: f64,
    pub context_tokens: u32,
    pub generated_tokens: u32,
    /// The optional fourth column: an index into `cluster.classes` (0 when absent).
    pub class: u16,
    /// The optional fifth column: an index into `cluster.tenants` (0 when absent).
    pub tenant: u32,
    /// Line in the file (1-based), for errors about the row.
    pub line: usize,
}

/// Where the public dataset lives, for messages about a missing trace.
pub const AZURE_TRACE_HINT: &str = "routelab ships the Azure LLM inference trace 2023 in \
workloads/traces/azure-llm-2023/ (it is also public in Azure's \"AzurePublicDataset\" repository \
on GitHub); pass the path of a file in that format, or a built-in trace by name \
(`AzureLLMInferenceTrace_conv`, `AzureLLMInferenceTrace_code`)";

/// Seconds since midnight from `YYYY-MM-DD HH:MM:SS.fffffff`, or a plain number of seconds.
/// Days are counted from the date, so traces may cross midnight.
fn parse_timestamp(s: &str) -> Option<f64> {
    let s = s.trim();
    if let Ok(v) = s.parse::<f64>() {
        return v.is_finite().then_some(v);
    }
    let (date, time) = s.split_once(' ')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>().ok());
    let (y, mo, da) = (d.next()??, d.next()??, d.next()??);
    let mut t = time.split(':');
    let h: f64 = t.next()?.parse().ok()?;
    let mi: f64 = t.next()?.parse().ok()?;
    let sec: f64 = t.next()?.parse().ok()?;
    if t.next().is_some() || !(1..=12).contains(&mo) || !(1..=31).contains(&da) {
        return None;
    }
    // Days since 1970-01-01 (civil calendar, Howard Hinnant's algorithm).
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + da - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days as f64 * 86_400.0 + h * 3600.0 + mi * 60.0 + sec)
}

/// Parses trace text; `file` names it in errors. Rows must be in time order.
pub fn parse(text: &str, file: &Path) -> Result<Vec<TraceRow>, InputError> {
    let mut rows = Rows::new(file);
    for (i, line) in text.lines().enumerate() {
        rows.line(i + 1, line)?;
    }
    rows.finish()
}

/// The rows parsed so far, one line at a time (from text, or streamed from a file by [`load`]).
struct Rows<'f> {
    file: &'f Path,
    rows: Vec<TraceRow>,
    first: Option<f64>,
    last: f64,
}

impl<'f> Rows<'f> {
    fn new(file: &'f Path) -> Self {
        Self { file, rows: Vec::new(), first: None, last: f64::NEG_INFINITY }
    }

    /// Parses line `n` (1-based).
    fn line(&mut self, n: usize, line: &str) -> Result<(), InputError> {
        let err = |line: usize, message: String| {
            InputError::new(
                self.file,
                message,
                "each row must be TIMESTAMP,ContextTokens,GeneratedTokens[,Class[,Tenant]] with rows in time order",
            )
            .at_line(line)
        };
        let line = line.trim();
        if line.is_empty() || (n == 1 && line.starts_with(|c: char| c.is_ascii_alphabetic())) {
            return Ok(());
        }
        let cols: Vec<&str> = line.split(',').collect();
        if !(3..=5).contains(&cols.len()) {
            return Err(err(n, format!("expected 3 to 5 columns, found {}: `{line}`", cols.len())));
        }
        let class: u16 = match cols.get(3) {
            Some(c) => c.trim().parse().map_err(|_| err(n, format!("bad Class `{c}` (a 0-based class index)")))?,
            None => 0,
        };
        let tenant: u32 = match cols.get(4) {
            Some(c) => c.trim().parse().map_err(|_| err(n, format!("bad Tenant `{c}` (a 0-based tenant index)")))?,
            None => 0,
        };
        let t = parse_timestamp(cols[0]).ok_or_else(|| err(n, format!("bad TIMESTAMP `{}`", cols[0])))?;
        let ctx: u32 = cols[1].trim().parse().map_err(|_| err(n, format!("bad ContextTokens `{}`", cols[1])))?;
        let gen_: u32 = cols[2].trim().parse().map_err(|_| err(n, format!("bad GeneratedTokens `{}`", cols[2])))?;
        if t < self.last {
            return Err(err(n, format!("TIMESTAMP goes back in time (`{}`)", cols[0])));
        }
        self.last = t;
        let t0 = *self.first.get_or_insert(t);
        let at_s = t - t0;
        if !(at_s <= limits::MAX_HORIZON) {
            return Err(err(
                n,
                format!(
                    "TIMESTAMP is {at_s:.3e} s after the first row, beyond the clock's {:.1e} s",
                    limits::MAX_HORIZON
                ),
            ));
        }
        if self.rows.len() >= MAX_ROWS {
            return Err(err(n, format!("the trace has more than {MAX_ROWS} rows")));
        }
        self.rows.push(TraceRow { at_s, context_tokens: ctx, generated_tokens: gen_, class, tenant, line: n });
        Ok(())
    }

    fn finish(self) -> Result<Vec<TraceRow>, InputError> {
        if self.rows.is_empty() {
            return Err(InputError::new(
                self.file,
                "the trace has no rows",
                "give a CSV with a header and at least one row",
            ));
        }
        Ok(self.rows)
    }
}

/// Largest trace file read, in bytes (the Azure conversation trace is 1 MB, the week-long code
/// trace a few hundred MB).
pub const MAX_TRACE_BYTES: u64 = 1 << 30;
/// Most rows of a trace (16 bytes each in memory).
pub const MAX_ROWS: usize = 50_000_000;

/// Spreads rows that share one timestamp (a trace binned to whole seconds or coarser): the k
/// rows at instant t arrive at t + room·n/k, n = 0..k in row order, where room is `spread_s`, or
/// the gap to the next instant when that is shorter, so the order of arrivals never changes.
/// `times` must be non-decreasing; `spread_s` 0 leaves them as they are. Deterministic: no draw.
pub fn spread_instants(mut times: Vec<&mut f64>, spread_s: f64) {
    if spread_s <= 0.0 {
        return;
    }
    let mut i = 0;
    while i < times.len() {
        let t = *times[i];
        let j = i + times[i..].iter().take_while(|x| ***x == t).count();
        let room = times.get(j).map_or(spread_s, |next| (**next - t).min(spread_s));
        let k = (j - i) as f64;
        for (n, x) in times[i..j].iter_mut().enumerate() {
            **x = t + room * n as f64 / k;
        }
        i = j;
    }
}

/// Reads and parses a trace file; a missing file says where the public dataset lives.
/// The file streams (read a line at a time): only its rows are kept, not its text.
pub fn load(path: &Path) -> Result<Vec<TraceRow>, InputError> {
    let mut rows = Rows::new(path);
    limits::read_lines_capped(path, MAX_TRACE_BYTES, "trace", AZURE_TRACE_HINT, |n, line| rows.line(n, line))?;
    rows.finish()
}

/// Refuses, before a cluster run, trace rows that no replica could hold (their prompt plus
/// output exceeds the KV capacity, or, unchunked, the prompt exceeds one step) and a replay
/// longer than the clock.
pub fn check_cluster_rows(
    rows: &[TraceRow],
    spec: &super::cluster::ClusterSpec,
    models: &super::cluster::StepModels,
    file: &Path,
) -> Result<(), InputError> {
    let (classes, tenants) = (spec.classes.len().max(1), spec.tenants.len().max(1));
    for r in rows {
        let bad = |what: &str, v: usize, n: usize, field: &str| {
            InputError::new(
                file,
                format!("{what} {v}, but the workload has {n} (valid: 0..{})", n - 1),
                format!("use an index into the workload's `cluster.{field}`, in the order written (0 = the first)"),
            )
            .at_line(r.line)
        };
        if r.class as usize >= classes {
            return Err(bad("Class", r.class as usize, classes, "classes"));
        }
        if r.tenant as usize >= tenants {
            return Err(bad("Tenant", r.tenant as usize, tenants, "tenants"));
        }
    }
    check_cluster_sizes(
        rows.iter().map(|r| RowSize {
            line: r.line,
            prompt: r.context_tokens,
            output: r.generated_tokens,
            at_s: r.at_s,
        }),
        spec,
        models,
        file,
    )
}

/// A trace row's sizes and time, whatever its format.
pub struct RowSize {
    pub line: usize,
    pub prompt: u32,
    pub output: u32,
    pub at_s: f64,
}

/// [`check_cluster_rows`] for rows of any format.
pub fn check_cluster_sizes(
    rows: impl Iterator<Item = RowSize>,
    spec: &super::cluster::ClusterSpec,
    models: &super::cluster::StepModels,
    file: &Path,
) -> Result<(), InputError> {
    let sm = models.row_fit();
    let row_error = |row: &RowSize, message: String, fix: &str| InputError::new(file, message, fix).at_line(row.line);
    let mut last = None;
    for row in rows {
        let (prompt, output) = (row.prompt.max(1) as u64, row.output.max(1) as u64);
        if prompt + output > sm.kv_capacity_tokens {
            return Err(row_error(
                &row,
                format!(
                    "the row needs {prompt} prompt + {output} output tokens of KV, more than a replica's capacity ({} tokens on {}, tp {})",
                    sm.kv_capacity_tokens, sm.gpu.name, sm.tp
                ),
                "drop or fix the row, raise tp, or use a GPU with more memory",
            ));
        }
        if spec.chunk_tokens == 0 && prompt > spec.max_step_tokens as u64 {
            return Err(row_error(
                &row,
                format!(
                    "the row's prompt ({prompt} tokens) exceeds max_step_tokens = {} with unchunked prefill",
                    spec.max_step_tokens
                ),
                "use chunked prefill (`chunk_tokens: 512`) or raise `max_step_tokens`",
            ));
        }
        last = Some(row);
    }
    if let (Some(last), super::cluster::Arrivals::Trace { time_scale, .. }) = (last, &spec.arrivals) {
        limits::fits_clock("cluster.arrivals.trace.time_scale", last.at_s * time_scale, "use a smaller time_scale")
            .map_err(|e| InputError::from_field(file, e).at_line(last.line))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn azure_timestamps_parse_to_relative_seconds() {
        let text = "TIMESTAMP,ContextTokens,GeneratedTokens\n\
                    2023-11-16 18:15:46.6805900,374,44\n\
                    2023-11-16 18:15:50.9951690,396,109\n\
                    2023-11-17 00:00:00.0000000,1,1\n";
        let rows = parse(text, Path::new("t.csv")).unwrap();
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[0].at_s, 0.0);
        assert!((rows[1].at_s - 4.314579).abs() < 1e-6, "{}", rows[1].at_s);
        assert!((rows[2].at_s - (5.0 * 3600.0 + 44.0 * 60.0 + 13.31941)).abs() < 1e-4);
        assert_eq!((rows[1].context_tokens, rows[1].generated_tokens), (396, 109));
    }

    /// Rows at one instant spread evenly in row order, up to the next instant when that is
    /// sooner than the spread; a lone row and spread 0 leave times alone.
    #[test]
    fn rows_at_one_instant_spread_within_their_bin() {
        let spread = |times: &[f64], s: f64| {
            let mut v = times.to_vec();
            spread_instants(v.iter_mut().collect(), s);
            v
        };
        let binned = [0.0, 0.0, 0.0, 3.0, 3.0, 4.0, 10.0, 10.0];
        assert_eq!(spread(&binned, 3.0), [0.0, 1.0, 2.0, 3.0, 3.5, 4.0, 10.0, 11.5]);
        assert_eq!(spread(&binned, 0.0), binned);
        let spread_far = spread(&binned, 100.0);
        assert!(spread_far.windows(2).all(|w| w[0] < w[1]), "order kept, instants apart: {spread_far:?}");
    }

    #[test]
    fn malformed_row_names_its_line() {
        let text = "TIMESTAMP,ContextTokens,GeneratedTokens\n1.0,10,5\n2.0,ten,5\n";
        let e = parse(text, Path::new("bad.csv")).unwrap_err();
        assert_eq!(e.line, Some(3));
        assert!(e.message.contains("ContextTokens"), "{}", e.message);
        assert!(e.to_string().starts_with("bad.csv:3:"), "{e}");
    }

    /// A file read a line at a time gives the rows its whole text gives (CRLF endings, a
    /// blank line, no final newline), and a line that is not UTF-8 is named.
    #[test]
    fn streamed_file_reads_like_its_text() {
        let dir = std::env::temp_dir().join(format!("routelab-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.csv");
        let text = "TIMESTAMP,ContextTokens,GeneratedTokens\r\n1.0,10,5\r\n\r\n2.5,20,7,1\n3.0,30,9";
        std::fs::write(&path, text).unwrap();
        let rows = load(&path).unwrap();
        assert_eq!(rows, parse(text, &path).unwrap());
        assert_eq!(rows.iter().map(|r| r.line).collect::<Vec<_>>(), [2, 4, 5]);
        std::fs::write(&path, b"TIMESTAMP,ContextTokens,GeneratedTokens\n1.0,10,5\n2.0,\xff,5\n").unwrap();
        let e = load(&path).unwrap_err();
        assert_eq!(e.line, Some(3), "{e}");
        assert!(e.message.contains("not UTF-8"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
