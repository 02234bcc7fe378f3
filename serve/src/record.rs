//! `routelab serve --record F.jsonl`: every request the gateway completes, appended to `F` as a
//! line of the request log `routelab import` reads — `{"timestamp": s, "request": BODY, "usage":
//! {"completion_tokens": N}}` — so traffic routed live replays in the simulator (import, then
//! `compare`/`capacity`; docs/your-traffic.md).
//!
//! `timestamp` is when the gateway received the request (Unix seconds); BODY is the client's
//! request (re-serialised on one line; a stream's with the `stream_options.include_usage` the
//! gateway asks engines for); N is the engine's `usage.completion_tokens` (what
//! the gateway also reports to the policy). Lines are written when requests complete, so they are
//! not in arrival order; `import` sorts them. Requests that failed on every backend, or whose
//! client left, are not recorded. The file holds the prompts, like any access log.

use std::io::Write;
use std::path::Path;
use std::sync::Mutex;

use serde_json::Value;

use routelab_core::workload::InputError;

pub struct Recorder {
    file: Mutex<std::fs::File>,
}

impl Recorder {
    /// Opens `path` for appending (created if absent).
    pub fn open(path: &Path) -> Result<Self, InputError> {
        let file = std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(|e| {
            InputError::command_line(
                "--record",
                format!("{}: cannot be written: {e}", path.display()),
                "give a file in a writable folder",
            )
        })?;
        Ok(Self { file: Mutex::new(file) })
    }

    /// Appends one completed request: received at `unix_s`, `body` the client's request (already
    /// parsed as JSON once), `output_tokens` of its answer. A failed write is reported, not fatal:
    /// the gateway goes on serving.
    pub fn write(&self, unix_s: f64, body: &[u8], output_tokens: u32) {
        let Ok(request) = serde_json::from_slice::<Value>(body) else { return };
        let line = serde_json::json!({
            "timestamp": (unix_s * 1e3).round() / 1e3,
            "request": request,
            "usage": {"completion_tokens": output_tokens},
        });
        let mut text = line.to_string();
        text.push('\n');
        // One write of the whole line: concurrent completions never interleave within a line.
        if let Ok(mut f) = self.file.lock() {
            if let Err(e) = f.write_all(text.as_bytes()) {
                eprintln!("serve: --record: {e}");
            }
        }
    }
}
