//! Where results go besides the terminal: `--json`, `--csv`, `--plot`. Their paths are checked
//! before any run, so a typo costs a second, not a finished comparison.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::args::Common;
use crate::report;
use crate::runner::WorkloadResult;
use crate::workload::InputError;

fn bad(flag: &str, path: &Path, message: String, fix: &str) -> InputError {
    InputError {
        file: PathBuf::from(flag),
        path: String::new(),
        line: None,
        message: format!("{}: {message}", path.display()),
        fix: fix.into(),
    }
}

/// Checks that every output path can be written, that no two flags name the same file, and
/// that `--shard` has what it needs.
pub fn check(common: &Common) -> Result<(), InputError> {
    super::merge::check(common)?;
    let files = [("--json", &common.json), ("--csv", &common.csv)];
    if let (Some(j), Some(c)) = (&common.json, &common.csv) {
        if std::path::absolute(j).ok() == std::path::absolute(c).ok() {
            return Err(bad("--csv", c, "is also the --json file".into(), "give --json and --csv different files"));
        }
    }
    for (flag, path) in files {
        let Some(path) = path else { continue };
        if path.is_dir() {
            return Err(bad(flag, path, "is a folder".into(), "give a file name, e.g. out.json"));
        }
        // Results are written through `<file>.partial` then renamed: try exactly that.
        let probe = partial(path);
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

fn partial(path: &Path) -> PathBuf {
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".partial");
    path.with_file_name(name)
}

/// Writes the JSON and CSV documents for `results`.
pub fn write(common: &Common, command: &str, results: &[WorkloadResult]) -> Result<()> {
    if let Some(p) = &common.json {
        write_atomically(p, &report::json::render(command, results))?;
    }
    if let Some(p) = &common.csv {
        write_atomically(p, &report::csv::render(results))?;
    }
    Ok(())
}

/// Writes through a temporary file so a reader never sees half a document.
pub fn write_atomically(path: &Path, text: &str) -> Result<()> {
    let tmp = partial(path);
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
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
