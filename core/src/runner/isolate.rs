//! `--isolate`: each policy's runs on a workload in a child process of the host, so that what no
//! panic handler can catch — `abort`, `process::exit`, a stack overflow, running out of memory,
//! SIGSEGV, an endless loop — fails that policy's row and nothing else.
//!
//! The child is this executable re-run as `routelab __isolated-run REQUEST RESULT`. The parent
//! writes REQUEST (the prepared workload as YAML, the workload file it came from, the policy)
//! into a fresh temporary folder; the child prepares the workload again, runs the policy on every
//! seed with the same [`runner::run_policy`] as an unisolated run, and writes RESULT (each seed's
//! figures as f64 bit patterns, so they cross exactly) by renaming a finished file into place.
//! The child's stdout goes to /dev/null (a plugin's prints never reach the tables) and its stderr
//! to a pipe the parent reads, keeping only the first and the last [`KEPT`] bytes (a plugin may
//! write gigabytes): their last line explains an abnormal end ("memory allocation of … failed"),
//! with how much was dropped between them.
//!
//! Limits: `--policy-timeout` seconds of wall-clock time per child (then SIGKILL), and on Unix
//! `--policy-memory` MiB of address space (RLIMIT_AS) set in the child before it runs any code.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::metrics::{Metrics, over_seeds};
use crate::plugin::{Loader, PolicySpec};
use crate::runner::{self, PolicyResult, Prepared};
use crate::workload::Workload;

/// How a child may run.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Wall-clock time for one policy's runs on one workload (every seed).
    pub timeout: Duration,
    /// Address-space limit in MiB (0: none).
    pub memory_mib: u64,
}

/// What the parent tells the child.
#[derive(Serialize, Deserialize)]
struct Request {
    /// The workload as the parent prepared it (overrides and `--set`s applied), as YAML.
    workload: String,
    /// The file it came from: relative trace paths are read from its folder. Paths are as the
    /// parent has them (the child runs in the parent's working directory), so errors read alike.
    file: PathBuf,
    spec: SpecWire,
}

/// Why an isolated run gave no reply to use; shown as the policy's error row.
#[derive(Debug)]
enum ChildFailed {
    /// The host could not run the child or read its reply (`--isolate: …`).
    Host(String),
    /// The child outlived `--policy-timeout` (seconds) and was killed.
    TimedOut(u64),
    /// The child was killed by `signal`; `last_words` is what its stderr said last.
    Killed { signal: i32, last_words: String },
    /// The child exited with `code` (`None`: unknown) without writing a result.
    Exited { code: Option<i32>, last_words: String },
}

impl std::fmt::Display for ChildFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChildFailed::Host(what) => write!(f, "--isolate: {what}"),
            ChildFailed::TimedOut(secs) => write!(f, "exceeded --policy-timeout {secs} s"),
            ChildFailed::Killed { signal, last_words } => {
                write!(f, "killed by signal {signal} ({}){last_words}", signal_name(*signal))
            }
            ChildFailed::Exited { code, last_words } => {
                let code = code.map_or_else(|| "unknown".to_string(), |c| c.to_string());
                write!(f, "exited with status {code} without a result{last_words}")
            }
        }
    }
}

/// A [`PolicySpec`], field by field.
#[derive(Serialize, Deserialize)]
struct SpecWire {
    label: String,
    arg: String,
    library: Option<PathBuf>,
    name: Option<String>,
    config: String,
    scheduler: Option<String>,
}

/// What the child answers: everything of a [`PolicyResult`] the parent cannot recompute.
#[derive(Serialize, Deserialize)]
struct Reply {
    /// Each seed's figures, values as `f64::to_bits` (JSON has no NaN, and exact either way).
    per_seed: Vec<Vec<(String, u64)>>,
    allocation: Vec<Vec<String>>,
    error: Option<String>,
    input_error: bool,
    /// The first seed's chart detail (latency CDF, replica timeline).
    #[serde(default)]
    detail: Option<crate::metrics::Detail>,
}

/// Runs `spec` on every seed of `prepared` in a child process; whatever becomes of the child,
/// the answer is a result (its error row when the child crashed, exited, or ran out of time).
/// `progress` is called once per seed when the child is done.
pub fn run_policy(prepared: &Prepared, spec: &PolicySpec, limits: &Limits, progress: &dyn Fn(&str)) -> PolicyResult {
    let mut result = runner::empty_result(spec);
    match run_child(prepared, spec, limits).and_then(|r| checked(r, prepared.workload.seeds)) {
        Ok(reply) => {
            result.per_seed = reply
                .per_seed
                .into_iter()
                .map(|m| Metrics(m.into_iter().map(|(k, bits)| (k, f64::from_bits(bits))).collect()))
                .collect();
            result.allocation = reply.allocation;
            result.input_error = reply.input_error;
            result.error = reply.error.map(|e| crate::builtin::shown(&e).into_owned());
            result.detail = reply.detail.map(Box::new);
            if result.error.is_none() {
                result.metrics = over_seeds(&result.per_seed);
            }
        }
        Err(failed) => result.error = Some(crate::builtin::shown(&failed.to_string()).into_owned()),
    }
    for _ in 0..prepared.workload.seeds {
        progress(&spec.label);
    }
    result
}

/// A reply that claims success must hold every seed's figures: the file is written by a child
/// that runs plugin code, so an empty or truncated one (forged, or cut short) is an error row,
/// never a successful row without figures.
fn checked(reply: Reply, seeds: u32) -> Result<Reply, ChildFailed> {
    if reply.error.is_some() {
        return Ok(reply);
    }
    if reply.per_seed.len() != seeds as usize || reply.per_seed.iter().any(|m| m.is_empty()) {
        return Err(ChildFailed::Host(format!(
            "the child's result claims success but holds figures for {} of {seeds} seeds",
            reply.per_seed.iter().filter(|m| !m.is_empty()).count()
        )));
    }
    Ok(reply)
}

/// A fresh, empty folder for one child's files: a leftover of an earlier process with the same
/// id is removed first (its `result.json` must never pass for this child's), and the folder is
/// created with `create_dir`, which fails rather than reuse anything that appeared meanwhile.
fn scratch_dir() -> std::io::Result<PathBuf> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "routelab-isolate-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir(&dir)?;
    Ok(dir)
}

fn run_child(prepared: &Prepared, spec: &PolicySpec, limits: &Limits) -> Result<Reply, ChildFailed> {
    let dir = scratch_dir().map_err(|e| {
        ChildFailed::Host(format!("cannot create a temporary folder: {e} (set TMPDIR to a writable folder)"))
    })?;
    let out = run_child_in(&dir, prepared, spec, limits);
    std::fs::remove_dir_all(&dir).ok();
    out
}

fn run_child_in(dir: &Path, prepared: &Prepared, spec: &PolicySpec, limits: &Limits) -> Result<Reply, ChildFailed> {
    let host = ChildFailed::Host;
    let workload =
        serde_norway::to_string(&prepared.workload).map_err(|e| host(format!("cannot write the workload: {e}")))?;
    // The child must run exactly this workload: a field that does not survive the trip (a
    // `serde(skip)` added later, say) would change results silently.
    if serde_norway::from_str::<Workload>(&workload).ok().as_ref() != Some(&prepared.workload) {
        return Err(host(
            "the workload does not cross to the child process unchanged (a bug: please report it; run without --isolate)"
                .into(),
        ));
    }
    let request = Request {
        workload,
        file: prepared.file.clone(),
        spec: SpecWire {
            label: spec.label.clone(),
            arg: spec.arg.clone(),
            library: spec.library.clone(),
            name: spec.name.clone(),
            config: spec.config.clone(),
            scheduler: spec.scheduler.clone(),
        },
    };
    let (request_path, result_path) = (dir.join("request.json"), dir.join("result.json"));
    let text = serde_json::to_string(&request).map_err(|e| host(format!("cannot write the request: {e}")))?;
    std::fs::write(&request_path, text).map_err(|e| host(format!("cannot write {}: {e}", request_path.display())))?;
    let exe = std::env::current_exe().map_err(|e| host(format!("cannot find this executable: {e}")))?;
    let mut command = Command::new(exe);
    command
        .arg("__isolated-run")
        .arg(&request_path)
        .arg(&result_path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    limit_memory(&mut command, limits.memory_mib);
    let mut child = command.spawn().map_err(|e| host(format!("cannot start a child process: {e}")))?;
    let stderr = StderrReader::start(child.stderr.take().expect("piped"));
    let status = wait_with_timeout(&mut child, limits.timeout)?;
    let Some(status) = status else {
        return Err(ChildFailed::TimedOut(limits.timeout.as_secs()));
    };
    if let Some(signal) = signal_of(&status) {
        return Err(ChildFailed::Killed { signal, last_words: stderr.finish().last_words() });
    }
    match std::fs::read_to_string(&result_path) {
        Ok(text) => serde_json::from_str(&text).map_err(|e| host(format!("the child's result is unreadable: {e}"))),
        Err(_) => Err(ChildFailed::Exited { code: status.code(), last_words: stderr.finish().last_words() }),
    }
}

/// Bytes of a child's stderr kept at its start, and again at its end.
const KEPT: usize = 64 << 10;

/// What the parent keeps of a child's stderr: the first [`KEPT`] bytes, the last [`KEPT`], and
/// the count of those dropped in between — memory and disk bounded whatever the child writes.
#[derive(Default)]
struct Capture {
    head: Vec<u8>,
    tail: std::collections::VecDeque<u8>,
    total: u64,
}

impl Capture {
    fn push(&mut self, mut data: &[u8]) {
        self.total += data.len() as u64;
        let room = KEPT - self.head.len();
        if room > 0 {
            let n = room.min(data.len());
            self.head.extend_from_slice(&data[..n]);
            data = &data[n..];
        }
        if data.len() >= KEPT {
            self.tail.clear();
            data = &data[data.len() - KEPT..];
        }
        let over = (self.tail.len() + data.len()).saturating_sub(KEPT);
        self.tail.drain(..over);
        self.tail.extend(data);
    }

    /// Bytes written but not kept.
    fn dropped(&self) -> u64 {
        self.total - (self.head.len() + self.tail.len()) as u64
    }

    /// [`last_words`] of what was kept, and how much was not.
    fn last_words(&self) -> String {
        let mut text = self.head.clone();
        if self.dropped() > 0 {
            text.push(b'\n');
        }
        text.extend(self.tail.iter());
        let said = last_words(&String::from_utf8_lossy(&text));
        match self.dropped() {
            0 => said,
            n => format!(
                "{said} (its stderr: {} bytes; {n} between the first and the last {} KiB not kept)",
                self.total,
                KEPT >> 10
            ),
        }
    }
}

/// Reads a child's stderr on a thread into a [`Capture`].
struct StderrReader {
    capture: std::sync::Arc<std::sync::Mutex<Capture>>,
    done: std::sync::mpsc::Receiver<()>,
}

impl StderrReader {
    fn start(mut pipe: std::process::ChildStderr) -> Self {
        use std::io::Read;
        let capture = std::sync::Arc::new(std::sync::Mutex::new(Capture::default()));
        let (tx, done) = std::sync::mpsc::channel();
        let shared = capture.clone();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 << 10];
            loop {
                match pipe.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => shared.lock().unwrap_or_else(|e| e.into_inner()).push(&buf[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
            tx.send(()).ok();
        });
        Self { capture, done }
    }

    /// What was kept once the child has ended. The pipe closes with it, unless a process it
    /// started holds it open: then what has arrived within a second is all there is (the thread
    /// ends when that process does).
    fn finish(self) -> Capture {
        self.done.recv_timeout(Duration::from_secs(1)).ok();
        std::mem::take(&mut *self.capture.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Waits for `child` at most `timeout`; `None` when it ran out of time (it is then killed and
/// reaped). Polls, starting at 1 ms, so that short children cost little.
fn wait_with_timeout(child: &mut std::process::Child, timeout: Duration) -> Result<Option<ExitStatus>, ChildFailed> {
    let start = Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        if let Some(status) = child.try_wait().map_err(|e| ChildFailed::Host(format!("waiting for the child: {e}")))? {
            return Ok(Some(status));
        }
        if start.elapsed() >= timeout {
            child.kill().ok();
            child.wait().ok();
            return Ok(None);
        }
        std::thread::sleep(pause.min(timeout.saturating_sub(start.elapsed())));
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

/// What the child said on stderr about its end, as `: line` (at most 300 characters): the
/// runtime's own fatal message ("memory allocation of … failed", "fatal runtime error: stack
/// overflow") if there is one, else its last line that is not part of a backtrace.
fn last_words(text: &str) -> String {
    let fatal = ["memory allocation of", "fatal runtime error", "has overflowed its stack"];
    let said = |l: &&str| {
        !l.trim().is_empty() && !l.starts_with([' ', '\t']) && !l.starts_with("note:") && !l.contains("backtrace")
    };
    let line = text.lines().find(|l| fatal.iter().any(|f| l.contains(f))).or_else(|| text.lines().rev().find(said));
    line.map_or_else(String::new, |l| format!(": {}", l.trim().chars().take(300).collect::<String>()))
}

#[cfg(unix)]
fn limit_memory(command: &mut Command, memory_mib: u64) {
    use std::os::unix::process::CommandExt;
    if memory_mib == 0 {
        return;
    }
    let bytes = memory_mib.saturating_mul(1 << 20) as libc::rlim_t;
    // SAFETY: setrlimit is async-signal-safe and touches no memory of the parent.
    unsafe {
        command.pre_exec(move || {
            let limit = libc::rlimit { rlim_cur: bytes, rlim_max: bytes };
            if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[cfg(not(unix))]
fn limit_memory(_: &mut Command, _: u64) {}

#[cfg(unix)]
fn signal_of(status: &ExitStatus) -> Option<i32> {
    std::os::unix::process::ExitStatusExt::signal(status)
}

#[cfg(not(unix))]
fn signal_of(_: &ExitStatus) -> Option<i32> {
    None
}

fn signal_name(signal: i32) -> &'static str {
    match signal {
        1 => "SIGHUP",
        2 => "SIGINT",
        4 => "SIGILL",
        5 => "SIGTRAP",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        15 => "SIGTERM",
        24 => "SIGXCPU",
        25 => "SIGXFSZ",
        _ => "see `kill -l`",
    }
}

/// The child's side (`routelab __isolated-run REQUEST RESULT`): runs the request's policy on
/// every seed and writes the result; the exit code is 0 once the result is in place.
pub fn child_main(request_path: &Path, result_path: &Path) -> anyhow::Result<i32> {
    use anyhow::Context;
    let request: Request = serde_json::from_str(&std::fs::read_to_string(request_path).context("reading the request")?)
        .context("parsing the request")?;
    let workload: Workload = serde_norway::from_str(&request.workload).context("parsing the workload")?;
    let s = request.spec;
    let spec = PolicySpec {
        label: s.label,
        arg: s.arg,
        library: s.library,
        name: s.name,
        config: s.config,
        scheduler: s.scheduler,
    };
    let result = match runner::prepare(workload, &request.file) {
        Ok(prepared) => {
            let inputs = prepared.run_inputs().map_err(crate::error::Error::from);
            runner::run_policy(&mut Loader::new(), &prepared, &spec, &inputs, &|_| {})
        }
        Err(e) => PolicyResult { error: Some(e.to_string()), input_error: true, ..runner::empty_result(&spec) },
    };
    let reply = Reply {
        per_seed: result.per_seed.iter().map(|m| m.0.iter().map(|(k, v)| (k.clone(), v.to_bits())).collect()).collect(),
        allocation: result.allocation,
        error: result.error,
        input_error: result.input_error,
        detail: result.detail.map(|d| *d),
    };
    // Written whole, then renamed: the parent sees a complete result or none.
    let partial = result_path.with_extension("partial");
    std::fs::write(&partial, serde_json::to_string(&reply)?)
        .with_context(|| format!("writing {}", partial.display()))?;
    std::fs::rename(&partial, result_path).with_context(|| format!("writing {}", result_path.display()))?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 26: an empty reply written by the child (a plugin can write it) was a successful
    /// row without figures.
    #[test]
    fn a_successful_reply_must_hold_every_seeds_figures() {
        let reply = |per_seed: Vec<Vec<(String, u64)>>, error: Option<String>| Reply {
            per_seed,
            allocation: Vec::new(),
            error,
            input_error: false,
            detail: None,
        };
        let e = checked(reply(Vec::new(), None), 2).err().expect("an empty reply passed").to_string();
        assert!(e.starts_with("--isolate: ") && e.contains("0 of 2 seeds"), "{e}");
        let seed = || vec![("completed".to_string(), 1f64.to_bits())];
        assert!(checked(reply(vec![seed(), Vec::new()], None), 2).is_err());
        assert!(checked(reply(vec![seed()], None), 2).is_err());
        assert!(checked(reply(vec![seed(), seed()], None), 2).is_ok());
        assert!(checked(reply(Vec::new(), Some("failed".into())), 2).is_ok(), "an error row stands as it is");
    }

    /// The runtime's fatal message is chosen over the backtrace and notes that follow it.
    #[test]
    fn last_words_prefer_the_fatal_message_to_the_backtrace() {
        let words = |text: &str| {
            let mut c = Capture::default();
            c.push(text.as_bytes());
            c.last_words()
        };
        assert_eq!(
            words(
                "memory allocation of 64 bytes failed\nstack backtrace:\n   0: x\n             at y\nskipping backtrace printing\n"
            ),
            ": memory allocation of 64 bytes failed"
        );
        assert_eq!(words("warming up\nerror: reading the request\n\n"), ": error: reading the request");
        assert_eq!(words(""), "");
    }

    /// Issue 26: a child's stderr went to a file without bound (a 1 GiB flood made a 1 GB file).
    /// The parent keeps its first and last 64 KiB, whatever the sizes of the reads, and says how
    /// much it dropped.
    #[test]
    fn a_flood_on_stderr_keeps_a_bounded_head_and_tail_and_counts_the_rest() {
        let line = |i: u64| format!("line {i:08}\n").into_bytes();
        let mut all = Vec::new();
        for i in 0..200_000 {
            all.extend(line(i));
        }
        all.extend(b"the last words\n");
        // Reads of every size, from a byte to more than what is kept.
        for chunk in [1, 7, 4096, 65_537, 300_000] {
            let mut c = Capture::default();
            for piece in all.chunks(chunk) {
                c.push(piece);
                assert!(c.head.len() <= KEPT && c.tail.len() <= KEPT);
            }
            assert_eq!(c.total, all.len() as u64);
            assert_eq!(c.head, all[..KEPT], "chunk {chunk}");
            assert!(c.tail.iter().eq(all[all.len() - KEPT..].iter()), "chunk {chunk}");
            assert_eq!(c.dropped(), (all.len() - 2 * KEPT) as u64);
            let w = c.last_words();
            let said = format!(": the last words (its stderr: {} bytes; {} between", all.len(), all.len() - 2 * KEPT);
            assert!(w.starts_with(&said), "{w}");
        }
        // Little output is kept whole, and nothing is said to be dropped.
        let mut c = Capture::default();
        c.push(&all[..KEPT + 10]);
        assert_eq!((c.dropped(), c.head.len() + c.tail.len()), (0, KEPT + 10));
        assert!(!c.last_words().contains("not kept"));
    }
}
