//! The workloads built into the binary (`workloads/` at build time, traces included), so an
//! installed `routelab` runs `routelab compare cache_vs_balance` from any directory.
//!
//! A workload argument that is an existing file is used as it is. Otherwise it names a built-in:
//! its path under `workloads/` with or without the `workloads/` prefix and the `.yaml` suffix
//! (`cluster/long_doc_qa`), or just its file name when that is unambiguous (`cache_vs_balance`;
//! for a name found at several depths the shallowest wins: `long_doc_qa` is
//! `cluster/long_doc_qa`). Built-ins are written out once per build to a folder under the system's
//! temporary directory and read from there, so `base:` and trace paths inside them resolve as they
//! do in the repository.

use std::path::{Path, PathBuf};

use crate::input::InputError;

include!(concat!(env!("OUT_DIR"), "/builtin_files.rs"));

/// A built-in workload: the name to type, its path under `workloads/`, what it shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Builtin {
    pub name: String,
    pub path: &'static str,
    pub summary: String,
}

/// A workload file: YAML outside the data folders (`profiles/` holds step-model profiles and
/// their measurements, `ground-truth/` measured runs).
fn is_workload(path: &str) -> bool {
    path.ends_with(".yaml") && !path.starts_with("profiles/") && !path.starts_with("ground-truth/")
}

fn yaml_files() -> impl Iterator<Item = &'static str> {
    FILES.iter().map(|(p, _)| *p).filter(|p| is_workload(p))
}

fn stem(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path).trim_end_matches(".yaml")
}

fn depth(path: &str) -> usize {
    path.matches('/').count()
}

/// The built-in `key` names (`cluster/long_doc_qa`, `long_doc_qa`, `workloads/x.yaml`), if any.
fn find(key: &str) -> Result<Option<&'static str>, Vec<&'static str>> {
    let key = key.trim_start_matches("./");
    let key = key.strip_prefix("workloads/").unwrap_or(key);
    let key = key.strip_suffix(".yaml").or_else(|| key.strip_suffix(".yml")).unwrap_or(key);
    if let Some(p) = yaml_files().find(|p| p.trim_end_matches(".yaml") == key) {
        return Ok(Some(p));
    }
    if key.contains('/') {
        return Ok(None);
    }
    let by_stem: Vec<&str> = yaml_files().filter(|p| stem(p) == key).collect();
    let Some(shallowest) = by_stem.iter().map(|p| depth(p)).min() else { return Ok(None) };
    let top: Vec<&str> = by_stem.into_iter().filter(|p| depth(p) == shallowest).collect();
    if top.len() == 1 { Ok(Some(top[0])) } else { Err(top) }
}

/// The shortest name that finds `path`.
fn short_name(path: &'static str) -> String {
    let s = stem(path);
    if find(s) == Ok(Some(path)) { s.to_string() } else { path.trim_end_matches(".yaml").to_string() }
}

/// The first sentence of a workload's opening comment, cut to one terminal line.
fn summary(text: &str) -> String {
    let comment: Vec<&str> =
        text.lines().take_while(|l| l.starts_with('#')).map(|l| l.trim_start_matches('#').trim()).collect();
    let joined = comment.join(" ");
    // A sentence ends at ". " or "? ", not after an abbreviation such as "et al.".
    let end = joined
        .match_indices(". ")
        .chain(joined.match_indices("? "))
        .map(|(i, _)| i)
        .filter(|&i| !joined[..i].ends_with(" al") && !joined[..i].ends_with("e.g"))
        .min()
        .map_or(joined.len(), |i| i + 1);
    let first = joined[..end].trim();
    const WIDTH: usize = 100;
    if first.chars().count() <= WIDTH {
        return first.to_string();
    }
    let cut: String = first.chars().take(WIDTH).collect();
    format!("{}…", cut.rsplit_once(' ').map_or(cut.as_str(), |(head, _)| head))
}

/// Every built-in workload, in path order.
pub fn list() -> Vec<Builtin> {
    FILES
        .iter()
        .filter(|(p, _)| is_workload(p))
        .map(|(p, bytes)| Builtin { name: short_name(p), path: p, summary: summary(&String::from_utf8_lossy(bytes)) })
        .collect()
}

/// The file a workload argument stands for: the argument itself when it exists, else the
/// built-in it names (written out on first use).
pub fn resolve(arg: &Path) -> Result<PathBuf, InputError> {
    if arg.exists() {
        return Ok(arg.to_path_buf());
    }
    named(arg)
}

/// The built-in workload `arg` names (written out on first use), whether or not a file of that
/// name exists: what a workload's `base:` falls back to when no file beside it has the name.
pub fn named(arg: &Path) -> Result<PathBuf, InputError> {
    let key = arg.to_string_lossy();
    let missing = |message: String, fix: String| InputError::new(arg, message, fix);
    match find(&key) {
        Ok(Some(rel)) => {
            let root = extracted().map_err(|e| {
                missing(
                    format!("cannot write the built-in workloads out: {e}"),
                    "set TMPDIR to a writable folder".into(),
                )
            })?;
            Ok(root.join(rel))
        }
        Ok(None) => {
            let names: Vec<String> = list().into_iter().map(|b| b.name).collect();
            let hint = crate::suggest::did_you_mean(&key, names.iter().map(String::as_str));
            Err(missing(
                format!("no such file, and no built-in workload of that name{hint}"),
                "check the path; `routelab workloads` lists the built-in workloads".into(),
            ))
        }
        Err(several) => Err(missing(
            format!("names several built-in workloads: {}", several.join(", ")),
            "give the path under workloads/, e.g. `cluster/long_doc_qa`".into(),
        )),
    }
}

/// Every workload argument expanded: a folder — on disk, or a built-in one named like a
/// built-in workload (`preble_grid`, `cluster/experiments/preble_grid`) — stands for the workload
/// files directly inside it, in name order; anything else goes through [`resolve`].
pub fn resolve_all(args: &[PathBuf]) -> Result<Vec<PathBuf>, InputError> {
    let mut out = Vec::new();
    for arg in args {
        if arg.is_dir() {
            let mut files: Vec<PathBuf> = std::fs::read_dir(arg)
                .map_err(|e| folder_error(arg, format!("cannot read the folder: {e}")))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
                .collect();
            if files.is_empty() {
                return Err(folder_error(arg, "the folder holds no .yaml workload".into()));
            }
            files.sort();
            out.extend(files);
        } else if let (false, Ok(None), Some(folder)) = (arg.exists(), find(&arg.to_string_lossy()), folder(arg)) {
            let root = extracted().map_err(|e| folder_error(arg, format!("cannot write the built-ins out: {e}")))?;
            out.extend(
                yaml_files().filter(|p| p.rsplit_once('/').map(|(d, _)| d) == Some(folder)).map(|p| root.join(p)),
            );
        } else {
            out.push(resolve(arg)?);
        }
    }
    Ok(out)
}

/// The built-in folder of workloads `arg` names: its path under `workloads/`, or its last part
/// when only one folder has that name.
fn folder(arg: &Path) -> Option<&'static str> {
    let key = arg.to_string_lossy();
    let key = key.trim_start_matches("./").trim_end_matches('/');
    let key = key.strip_prefix("workloads/").unwrap_or(key);
    let mut folders: Vec<&'static str> = yaml_files().filter_map(|p| p.rsplit_once('/').map(|(d, _)| d)).collect();
    folders.sort_unstable();
    folders.dedup();
    let hits: Vec<&'static str> =
        folders.into_iter().filter(|d| *d == key || d.rsplit('/').next() == Some(key)).collect();
    match hits.as_slice() {
        [one] => Some(one),
        _ => None,
    }
}

fn folder_error(arg: &Path, message: String) -> InputError {
    InputError::new(
        arg,
        message,
        "give a folder of workload files, a workload file or a built-in name (`routelab workloads`)",
    )
}

/// Why a `--trace` argument names no one trace.
#[derive(Debug)]
pub enum TraceArgError {
    /// The built-in traces could not be written out to be read.
    Unwritable(std::io::Error),
    /// The argument names several built-in traces.
    Several(Vec<&'static str>),
}

impl std::fmt::Display for TraceArgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TraceArgError::Unwritable(e) => write!(f, "cannot write the built-in traces out: {e}"),
            TraceArgError::Several(hits) => {
                write!(f, "names several built-in traces: {}; give more of the path", hits.join(", "))
            }
        }
    }
}

impl std::error::Error for TraceArgError {}

/// A trace file argument (`--trace`): the file itself when it exists, else the built-in trace it
/// names — its path under `workloads/`, or any tail of that path, with or without its extension
/// (`conversation_trace`, `mooncake-fast25/conversation_trace.jsonl`, `AzureLLMInferenceTrace_code`)
/// — else the argument unchanged, for the trace reader's own error (which says where traces
/// live). Naming several built-ins is an error.
pub fn resolve_trace(arg: &Path) -> Result<PathBuf, TraceArgError> {
    if arg.exists() {
        return Ok(arg.to_path_buf());
    }
    let key = arg.to_string_lossy();
    let key = key.trim_start_matches("./");
    let key = key.strip_prefix("workloads/").unwrap_or(key);
    let names = |p: &'static str| {
        let bare = p.rsplit_once('.').map_or(p, |(b, _)| b);
        [p, bare].into_iter().any(|n| n == key || n.ends_with(&format!("/{key}")))
    };
    let trace = |p: &&'static str| p.starts_with("traces/") && (p.ends_with(".csv") || p.ends_with(".jsonl"));
    let hits: Vec<&'static str> = FILES.iter().map(|(p, _)| *p).filter(trace).filter(|p| names(p)).collect();
    match hits.as_slice() {
        [one] => Ok(extracted().map_err(TraceArgError::Unwritable)?.join(one)),
        [] => Ok(arg.to_path_buf()),
        several => Err(TraceArgError::Several(several.to_vec())),
    }
}

/// A data path as the repository names it (`workloads/profiles/measured/…`, a file or a folder
/// of the shipped data): the path itself when it exists, else the built-in copy when the binary
/// carries one, so the README's commands run from any directory. Otherwise the path unchanged
/// (the caller's own error names it).
pub fn resolve_data(arg: &Path) -> PathBuf {
    if arg.exists() {
        return arg.to_path_buf();
    }
    let key = arg.to_string_lossy();
    let key = key.trim_start_matches("./").trim_end_matches('/');
    let Some(rel) = key.strip_prefix("workloads/") else { return arg.to_path_buf() };
    let carried = FILES.iter().any(|(p, _)| *p == rel || p.strip_prefix(rel).is_some_and(|t| t.starts_with('/')));
    match (carried, extracted()) {
        (true, Ok(root)) => root.join(rel),
        _ => arg.to_path_buf(),
    }
}

/// The folder built-ins are written out to (whether or not they have been yet).
fn root() -> PathBuf {
    std::env::temp_dir().join(format!("routelab-{}-{FILES_HASH:016x}", env!("CARGO_PKG_VERSION")))
}

/// `text` with every path inside the written-out built-ins named as the repository names it
/// (`/tmp/routelab-0.1.0-…/cluster/tool_use.yaml` → `workloads/cluster/tool_use.yaml`): what an
/// error about a built-in shows, instead of a temporary path the user never gave.
pub fn shown(text: &str) -> std::borrow::Cow<'_, str> {
    static PREFIX: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let prefix = PREFIX.get_or_init(|| format!("{}{}", root().display(), std::path::MAIN_SEPARATOR));
    if text.contains(prefix.as_str()) { text.replace(prefix.as_str(), "workloads/").into() } else { text.into() }
}

/// The folder holding this build's embedded files, written on first use. The folder's name
/// carries the build's hash, so a newer build never reads an older build's files; it is written
/// under a private name and renamed into place, so concurrent runs never see half of it.
pub fn extracted() -> std::io::Result<PathBuf> {
    let root = root();
    let marker = root.join(".complete");
    if marker.exists() {
        return Ok(root);
    }
    // One writer per process: threads of one process share its staging name (tests running in
    // parallel each removed the other's half-written copy).
    static WRITING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = WRITING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if marker.exists() {
        return Ok(root);
    }
    let staging = root.with_extension(format!("staging-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    for (rel, bytes) in FILES {
        let p = staging.join(rel);
        std::fs::create_dir_all(p.parent().expect("a file has a folder"))?;
        std::fs::write(&p, bytes)?;
    }
    std::fs::write(staging.join(".complete"), "")?;
    if std::fs::rename(&staging, &root).is_err() {
        // Another run got there first (or a stale incomplete copy is in the way).
        let _ = std::fs::remove_dir_all(&staging);
        if !marker.exists() {
            let _ = std::fs::remove_dir_all(&root);
            drop(_one);
            return extracted();
        }
    }
    Ok(root)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_find_built_ins_and_every_built_in_has_a_unique_name_and_a_summary() {
        assert_eq!(find("cache_vs_balance"), Ok(Some("cluster/experiments/cache_vs_balance.yaml")));
        assert_eq!(find("long_doc_qa"), Ok(Some("cluster/long_doc_qa.yaml")));
        assert_eq!(find("workloads/dispatch/exp_rho09.yaml"), Ok(Some("dispatch/exp_rho09.yaml")));
        assert_eq!(
            find("cluster/experiments/preble_grid/agent"),
            Ok(Some("cluster/experiments/preble_grid/agent.yaml"))
        );
        assert_eq!(find("nonesuch"), Ok(None));
        let all = list();
        assert!(all.len() > 20);
        for b in &all {
            assert_eq!(find(&b.name), Ok(Some(b.path)), "{b:?}");
            assert!(!b.summary.is_empty() && b.summary.chars().count() <= 101, "{b:?}");
        }
        // The traces built-ins replay travel with them, with their licence.
        for p in ["traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv", "traces/azure-llm-2023/README.md"] {
            assert!(FILES.iter().any(|(f, _)| *f == p), "{p} is not embedded");
        }
    }

    /// Issue 32: an installed binary finds built-in folders, traces and data by the names the
    /// README uses, from any directory.
    #[test]
    fn folders_traces_and_data_resolve_to_the_built_in_copies() {
        let grid = resolve_all(&[PathBuf::from("preble_grid")]).unwrap();
        let names: Vec<String> = grid.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
        assert_eq!(names, ["agent.yaml", "long_doc_qa.yaml", "programming.yaml", "tool_use.yaml", "video_qa.yaml"]);
        assert!(grid.iter().all(|p| p.exists()));
        assert_eq!(resolve_all(&[PathBuf::from("workloads/cluster/experiments/preble_grid/")]).unwrap(), grid);
        let e = resolve_all(&[PathBuf::from("nonesuch_folder")]).unwrap_err();
        assert!(e.message.contains("no built-in workload"), "{e:?}");

        let conv = resolve_trace(Path::new("conversation_trace")).unwrap();
        assert!(conv.ends_with("traces/mooncake-fast25/conversation_trace.jsonl") && conv.exists(), "{conv:?}");
        for same in ["mooncake-fast25/conversation_trace.jsonl", "workloads/traces/mooncake-fast25/conversation_trace"]
        {
            assert_eq!(resolve_trace(Path::new(same)).unwrap(), conv);
        }
        assert!(resolve_trace(Path::new("trace")).unwrap().ends_with("example-requests/trace.jsonl"));
        let unknown = Path::new("AzureLLMInferenceTrace.csv");
        assert_eq!(resolve_trace(unknown).unwrap(), unknown);

        let profile = resolve_data(Path::new("workloads/profiles/measured/RTXPRO6000_Llama-3.1-8B_bf16_tp1"));
        assert!(profile.join("meta.yaml").exists(), "{profile:?}");
        assert_eq!(resolve_data(Path::new("workloads/nonesuch")), Path::new("workloads/nonesuch"));
    }

    /// Issue 26: errors about a built-in showed the temporary folder it is read from.
    #[test]
    fn paths_inside_the_written_out_built_ins_are_shown_as_the_repository_names_them() {
        let file = resolve(Path::new("tool_use")).unwrap();
        assert!(file.starts_with(std::env::temp_dir()), "{}", file.display());
        let message = format!("{}:3: field `cluster.requests`: bad (see {})", file.display(), file.display());
        assert_eq!(
            shown(&message),
            "workloads/cluster/tool_use.yaml:3: field `cluster.requests`: bad (see workloads/cluster/tool_use.yaml)"
        );
        let elsewhere = "/home/me/tool_use.yaml: bad";
        assert_eq!(shown(elsewhere), elsewhere);
    }
}
