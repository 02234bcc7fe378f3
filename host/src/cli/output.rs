//! Where results go besides the terminal: `--json`, `--csv`, `--plot`, `--report`. Their paths are checked
//! before any run, so a typo costs a second, not a finished comparison.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::args::Common;
use crate::report;
use routelab_core::runner::WorkloadResult;
use routelab_core::workload::InputError;

fn bad(flag: &str, path: &Path, message: String, fix: &str) -> InputError {
    InputError::new(flag, format!("{}: {message}", path.display()), fix)
}

/// Checks that every output path can be written, that no two flags name the same file, and
/// that `--shard` has what it needs.
pub fn check(common: &Common) -> Result<(), InputError> {
    super::merge::check(common)?;
    let files = [("--json", &common.json), ("--csv", &common.csv), ("--report", &common.report)];
    for (i, (flag, path)) in files.iter().enumerate() {
        for (other, earlier) in &files[..i] {
            if let (Some(p), Some(e)) = (path, earlier) {
                if std::path::absolute(p).ok() == std::path::absolute(e).ok() {
                    let fix = format!("give {other} and {flag} different files");
                    return Err(bad(flag, p, format!("is also the {other} file"), &fix));
                }
            }
        }
    }
    if let (Some(r), true) = (&common.report, common.all_starts) {
        return Err(bad("--report", r, "--all-starts prints its own table, not a report".into(), "drop --report"));
    }
    for (flag, path) in files {
        let Some(path) = path else { continue };
        if path.is_dir() {
            return Err(bad(flag, path, "is a folder".into(), "give a file name, e.g. out.json"));
        }
        let Destination::Replace(target) = destination(path) else {
            // A FIFO, a device, /dev/stdout: written in place, never replaced. (Opening a FIFO
            // to probe it would wait for a reader, so it is not probed.)
            continue;
        };
        // Results are written through `<file>.<pid>.partial` then renamed: try exactly that.
        let probe = partial(&target);
        std::fs::write(&probe, "").map_err(|e| {
            bad(flag, path, format!("cannot be written: {e}"), "check that the folder exists and is writable")
        })?;
        let _ = std::fs::remove_file(&probe);
    }
    if let Some(dir) = &common.plot {
        std::fs::create_dir_all(dir)
            .map_err(|e| bad("--plot", dir, format!("cannot create the folder: {e}"), "give a writable folder"))?;
        let probe = dir.join(".routelab-probe");
        std::fs::write(&probe, "")
            .map_err(|e| bad("--plot", dir, format!("cannot write into the folder: {e}"), "give a writable folder"))?;
        let _ = std::fs::remove_file(&probe);
    }
    Ok(())
}

/// Checks that `path` can be written (for outputs written directly, not through a `.partial` file),
/// without truncating what is there; FIFOs and devices are not probed.
pub fn check_writable(flag: &str, path: &Path) -> Result<(), InputError> {
    let fail = |e: std::io::Error| {
        bad(flag, path, format!("cannot be written: {e}"), "check that the folder exists and is writable")
    };
    if path.is_dir() {
        return Err(bad(flag, path, "is a folder".into(), "give a file name"));
    }
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => std::fs::OpenOptions::new().append(true).open(path).map(|_| ()).map_err(fail),
        Ok(_) => Ok(()),
        Err(_) => std::fs::File::create(path).and_then(|_| std::fs::remove_file(path)).map_err(fail),
    }
}

/// `<file>.<pid>.partial`: this process's own, so two runs writing the same file at once never
/// rename (or probe and delete) each other's half-written copy; the last rename wins.
fn partial(path: &Path) -> PathBuf {
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(format!(".{}.partial", std::process::id()));
    path.with_file_name(name)
}

/// Writes the JSON and CSV documents for `results`.
pub fn write(common: &Common, command: &str, results: &[WorkloadResult]) -> Result<()> {
    write_with(common, command, results, write_atomically)
}

/// Writes the results so far (after each policy), into regular files only: a FIFO or a device
/// gets one document, the final one.
pub fn write_interim(common: &Common, command: &str, results: &[WorkloadResult]) -> Result<()> {
    write_with(common, command, results, write_progress)
}

fn write_with(
    common: &Common,
    command: &str,
    results: &[WorkloadResult],
    put: fn(&Path, &str) -> Result<()>,
) -> Result<()> {
    if let Some(p) = &common.json {
        put(p, &report::json::render(command, results))?;
    }
    if let Some(p) = &common.csv {
        put(p, &report::csv::render(results))?;
    }
    Ok(())
}

/// [`write_atomically`] for a document still growing: nothing unless the path is a regular file.
pub fn write_progress(path: &Path, text: &str) -> Result<()> {
    match destination(path) {
        Destination::Replace(_) => write_atomically(path, text),
        Destination::InPlace => Ok(()),
    }
}

/// Writes the `--report` page of a finished command (`sweep`: what it moved).
pub fn report(
    common: &Common,
    command: &str,
    results: &[WorkloadResult],
    sweep: Option<report::html::Sweep>,
) -> Result<()> {
    let Some(path) = &common.report else { return Ok(()) };
    let argv: Vec<String> = std::env::args().collect();
    let page = report::html::Page { command, argv: &argv, results, sweep };
    write_atomically(path, &report::html::render(&page)?)
}

/// How an output path is written.
enum Destination {
    /// A regular file, or nothing yet: through `<file>.<pid>.partial`, renamed onto this path (a
    /// symlink's target, so the link stays a link).
    Replace(PathBuf),
    /// Anything else at the path (a FIFO, a device such as /dev/stdout or /dev/null): written in
    /// place. Renaming onto it would replace the node itself (as root, /dev/full was clobbered).
    InPlace,
}

fn destination(path: &Path) -> Destination {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => Destination::Replace(std::fs::canonicalize(path).unwrap_or_else(|_| path.into())),
        Ok(_) => Destination::InPlace,
        // Nothing there; or a dangling symlink, which writing in place follows.
        Err(_) if std::fs::symlink_metadata(path).is_ok() => Destination::InPlace,
        Err(_) => Destination::Replace(path.into()),
    }
}

/// Writes a regular file through a temporary file so a reader never sees half a document;
/// anything else (a FIFO, a device) in place.
pub fn write_atomically(path: &Path, text: &str) -> Result<()> {
    let Destination::Replace(target) = destination(path) else {
        return std::fs::write(path, text).with_context(|| format!("writing {}", path.display()));
    };
    let tmp = partial(&target);
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &target).with_context(|| format!("writing {}", path.display()))
}

/// Refuses an output path that names one of the command's `inputs` (the same file, by any name).
pub fn not_an_input(flag: &str, out: &Path, inputs: &[PathBuf]) -> Result<(), InputError> {
    let Ok(o) = std::fs::metadata(out) else { return Ok(()) };
    for i in inputs {
        let Ok(m) = std::fs::metadata(i) else { continue };
        #[cfg(unix)]
        let same = {
            use std::os::unix::fs::MetadataExt;
            (o.dev(), o.ino()) == (m.dev(), m.ino())
        };
        #[cfg(not(unix))]
        let same = o.is_file() && m.is_file() && std::fs::canonicalize(out).ok() == std::fs::canonicalize(i).ok();
        if same && o.is_file() {
            let fix = format!("give {flag} a new file; {} is read by this command", i.display());
            return Err(bad(flag, out, "is one of this command's inputs: writing it would overwrite it".into(), &fix));
        }
    }
    Ok(())
}

/// Lets a closed pipe end the process quietly, as other command-line tools do (`routelab demo |
/// head`): Rust ignores SIGPIPE, which turns the next print into a panic.
pub fn quiet_broken_pipes() {
    #[cfg(unix)]
    // SAFETY: restoring a signal's default action at start-up, before any thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
