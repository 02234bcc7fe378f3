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

use crate::workload::InputError;

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
    let key = arg.to_string_lossy();
    let missing = |message: String, fix: String| InputError {
        file: arg.to_path_buf(),
        path: String::new(),
        line: None,
        message,
        fix,
    };
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
