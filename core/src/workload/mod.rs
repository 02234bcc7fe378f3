//! Workload files: one YAML schema for every world, validation that names file, field and fix.
//!
//! A workload names itself, its seeds, optionally the policies to compare, and exactly one world
//! section (`dispatch:`, `cluster:` or `compound:`). Unknown fields are errors everywhere.

pub mod cluster;
pub mod compound;
pub mod dispatch;
pub mod estimate;
pub mod export;
pub mod generate;
pub mod limits;
pub mod mooncake;
pub mod slo;
pub mod trace;

use std::path::{Path, PathBuf};

pub use crate::input::{FieldError, InputError};

use serde::{Deserialize, Serialize};

/// A parsed, validated workload.
#[derive(Deserialize, Serialize, schemars::JsonSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    /// Defaults to the file's stem.
    #[serde(default)]
    pub name: String,
    /// First seed; seed `k` of a multi-seed run is derived from it (see [`crate::seeds::seed_for`]).
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// How many seeds to run; mean and 95% interval are reported over them.
    #[serde(default = "one")]
    pub seeds: u32,
    /// Policies to compare when the command line names none: `name`, `name{key: value}` (quote
    /// it in YAML) or `path/to/lib.so:name`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policies: Vec<String>,
    /// The classic load-balancing world: FCFS servers (routers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dispatch: Option<dispatch::DispatchSpec>,
    /// The LLM world: replicas with prefix caches (routers and schedulers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<cluster::ClusterSpec>,
    /// Model selection for a compound AI system (selectors).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compound: Option<compound::CompoundSpec>,
}

fn default_seed() -> u64 {
    1
}
fn one() -> u32 {
    1
}

/// The world a workload runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorldKind {
    Dispatch,
    Cluster,
    Compound,
}

impl WorldKind {
    pub fn as_str(self) -> &'static str {
        match self {
            WorldKind::Dispatch => "dispatch",
            WorldKind::Cluster => "cluster",
            WorldKind::Compound => "compound",
        }
    }
}

impl Workload {
    pub fn world(&self) -> WorldKind {
        if self.dispatch.is_some() {
            WorldKind::Dispatch
        } else if self.cluster.is_some() {
            WorldKind::Cluster
        } else {
            WorldKind::Compound
        }
    }

    /// Checks values serde cannot: ranges, consistency. Paths are relative to the file's root.
    pub fn validate(&self) -> Result<(), FieldError> {
        let sections = [self.dispatch.is_some(), self.cluster.is_some(), self.compound.is_some()];
        match sections.iter().filter(|s| **s).count() {
            1 => {}
            0 => {
                return Err(FieldError::new(
                    "",
                    "no world section",
                    "add exactly one of `dispatch:`, `cluster:` or `compound:`",
                ));
            }
            _ => {
                return Err(FieldError::new(
                    "",
                    "more than one world section",
                    "keep exactly one of `dispatch:`, `cluster:` or `compound:`",
                ));
            }
        }
        if self.seeds == 0 {
            return Err(FieldError::new("seeds", "must be at least 1", "set `seeds: 1` or more"));
        }
        limits::at_most(
            "seeds",
            self.seeds,
            limits::MAX_SEEDS,
            "use e.g. 10 seeds; the 95% interval narrows slowly beyond",
        )?;
        if let Some(d) = &self.dispatch {
            d.validate().map_err(|e| e.under("dispatch"))?;
        }
        if let Some(c) = &self.cluster {
            c.validate().map_err(|e| e.under("cluster"))?;
        }
        if let Some(c) = &self.compound {
            c.validate().map_err(|e| e.under("compound"))?;
        }
        estimate::check_base_memory(self)
    }
}

/// Parses and validates workload YAML text; `file` names it in errors.
pub fn parse(text: &str, file: &Path) -> Result<Workload, InputError> {
    limits::check_nesting(text, file)?;
    let de = serde_norway::Deserializer::from_str(text);
    let mut w: Workload = serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let line = inner.location().map(|l| l.line());
        let msg = inner.to_string();
        // serde_norway appends " at line L column C"; we print the line ourselves.
        let msg = match msg.find(" at line ") {
            Some(i) => msg[..i].to_string(),
            None => msg,
        };
        // ... and may start with the field path, which we print ourselves too.
        let parts: Vec<&str> = path.split('.').collect();
        let msg = (1..=parts.len())
            .rev()
            .find_map(|k| msg.strip_prefix(&format!("{}: ", parts[..k].join("."))))
            .map(str::to_string)
            .unwrap_or(msg);
        let fix = if msg.contains("unknown field") {
            "remove or rename the field (the message lists the expected ones)".to_string()
        } else if msg.contains("invalid type") {
            "give the field a value of the expected type".to_string()
        } else if msg.contains("unknown variant") {
            "use one of the listed variants".to_string()
        } else {
            "see the workload format: `routelab docs workloads`".to_string()
        };
        InputError::new(file, msg, fix).in_field(if path == "." { String::new() } else { path }).at_line(line)
    })?;
    if let Some(c) = w.cluster.as_mut() {
        // A calibrated cluster runs vLLM's engine rules where the text leaves them out.
        let given = cluster_keys(text);
        c.engine_defaults(|field| given.iter().any(|k| k == field));
    }
    if w.name.is_empty() {
        w.name = file.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "workload".into());
    }
    w.validate().map_err(|e| {
        let line = field_line(text, &e.path);
        InputError::from_field(file, e).at_line(line)
    })?;
    Ok(w)
}

/// The keys `text` (a workload that parsed) writes out in its `cluster:` section.
fn cluster_keys(text: &str) -> Vec<String> {
    let doc: serde_norway::Value = serde_norway::from_str(text).unwrap_or(serde_norway::Value::Null);
    match doc.get("cluster") {
        Some(serde_norway::Value::Mapping(m)) => m.keys().filter_map(|k| k.as_str().map(str::to_string)).collect(),
        _ => Vec::new(),
    }
}

/// The line of the field at dotted `path` (`cluster.generator.fanout`, `models[2].price`) in
/// YAML `text`: each key is looked for after the previous one, so the answer is the line of the
/// deepest key the text spells out (flow mappings keep a parent's line). `None` if none is found.
pub fn field_line(text: &str, path: &str) -> Option<usize> {
    let mut at = 0;
    let mut line = None;
    for part in path.split('.') {
        let key = part.split('[').next().unwrap_or(part);
        if key.is_empty() {
            continue;
        }
        let found = text[at..].match_indices(key).map(|(i, _)| at + i).find(|&i| {
            let before = text[..i].chars().next_back();
            let after = text[i + key.len()..].trim_start_matches([' ', '"', '\'']);
            !before.is_some_and(|c| c.is_alphanumeric() || c == '_') && after.starts_with(':')
        });
        let Some(i) = found else { break };
        at = i + key.len();
        line = Some(1 + text[..i].matches('\n').count());
        // `key[N]` in a block sequence: the (N+1)-th `- ` item after the key.
        let index = part.split_once('[').and_then(|(_, r)| r.strip_suffix(']')).and_then(|n| n.parse::<usize>().ok());
        if let Some(n) = index {
            // Items are the lines starting `- ` below the key; the sequence ends at the first
            // other line indented no deeper than the key.
            let line_start = text[..i].rfind('\n').map_or(0, |j| j + 1);
            let key_indent = text[line_start..i].len() - text[line_start..i].trim_start_matches(' ').len();
            let (mut k, mut item_indent) = (0, None);
            let mut j = text[at..].find('\n').map(|d| at + d + 1);
            while let Some(start) = j {
                let rest = &text[start..];
                let body = rest.trim_start_matches(' ');
                let indent = rest.len() - body.len();
                let blank = body.is_empty() || body.starts_with('\n') || body.starts_with('#');
                if !blank {
                    if body.starts_with("- ") && *item_indent.get_or_insert(indent) == indent {
                        if k == n {
                            at = start;
                            line = Some(1 + text[..start].matches('\n').count());
                            break;
                        }
                        k += 1;
                    } else if indent <= key_indent {
                        break;
                    }
                }
                j = rest.find('\n').map(|d| start + d + 1);
            }
        }
    }
    line
}

/// Reads, parses and validates a workload file.
pub fn load(path: &Path) -> Result<Workload, InputError> {
    let text = load_text(path)?;
    parse(&text, path).map_err(|mut e| {
        // Lines of a merged (`base:`) text are not the file's: look the field up in the file.
        if e.line.is_some() && !e.path.is_empty() {
            if let Ok(own) = limits::read_capped(path, limits::MAX_WORKLOAD_BYTES, "workload", "") {
                if own != text {
                    e.line = field_line(&own, &e.path);
                }
            }
        }
        e
    })
}

/// The workload file's YAML text with its `base:` (if any) merged in: a workload may start from
/// another file (`base: ../tool_use.yaml`, relative to itself) or a built-in workload (`base:
/// tool_use`, when no file beside it has that name) and override any of its fields;
/// mappings merge key by key, anything else is replaced. Paths inside the result (a trace) are
/// read relative to the file that is run. A chain of bases that returns to a file is an error.
pub fn load_text(path: &Path) -> Result<String, InputError> {
    load_text_from(path, &mut Vec::new())
}

/// `load_text` for `path`, reached through the files in `chain` (outermost first).
fn load_text_from(path: &Path, chain: &mut Vec<PathBuf>) -> Result<String, InputError> {
    let text = limits::read_capped(path, limits::MAX_WORKLOAD_BYTES, "workload", "check the path")?;
    limits::check_nesting(&text, path)?;
    let doc: serde_norway::Value = match serde_norway::from_str(&text) {
        Ok(v) => v,
        Err(_) => return Ok(text), // parse() reports it with its line
    };
    let Some(base) = doc.get("base").and_then(|b| b.as_str()) else { return Ok(text) };
    let here = path.canonicalize().unwrap_or_else(|_| path.into());
    let line = text.lines().position(|l| l.trim_start().starts_with("base:")).map(|i| i + 1);
    let base_error = |message: String, fix: &str| InputError::new(path, message, fix).in_field("base").at_line(line);
    // A file beside this one, else a built-in workload's name (`base: tool_use`).
    let mut base_path = path.parent().unwrap_or(Path::new(".")).join(base);
    if !base_path.exists() {
        base_path = crate::builtin::named(Path::new(base))
            .map_err(|e| base_error(format!("`{base}` is no file ({}), {}", base_path.display(), e.message), &e.fix))?;
    }
    chain.push(here);
    let there = base_path.canonicalize().unwrap_or_else(|_| base_path.clone());
    if let Some(k) = chain.iter().position(|p| *p == there) {
        if k + 1 == chain.len() {
            return Err(base_error("names the file itself".into(), "name another workload"));
        }
        let cycle: Vec<String> = chain[k..].iter().chain([&there]).map(|p| p.display().to_string()).collect();
        return Err(base_error(
            format!("makes a cycle of bases: {}", cycle.join(" → ")),
            "let one file of the cycle start from no base (or from a file outside the cycle)",
        ));
    }
    if chain.len() >= limits::MAX_BASE_CHAIN {
        return Err(base_error(
            format!("the chain of bases is longer than {} files", limits::MAX_BASE_CHAIN),
            "start from a file nearer the root workload",
        ));
    }
    let base_text = load_text_from(&base_path, chain)?;
    let mut merged: serde_norway::Value = serde_norway::from_str(&base_text).map_err(|e| {
        InputError::new(&base_path, e.to_string(), "fix the base workload").at_line(e.location().map(|l| l.line()))
    })?;
    let mut overrides = doc;
    if let Some(m) = overrides.as_mapping_mut() {
        m.remove("base");
        // The derived file names itself unless it says otherwise.
        if !m.contains_key("name") {
            let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
            m.insert("name".into(), stem.into());
        }
    }
    merge(&mut merged, overrides);
    Ok(serde_norway::to_string(&merged).expect("a YAML value serialises"))
}

fn merge(into: &mut serde_norway::Value, from: serde_norway::Value) {
    match (into, from) {
        (serde_norway::Value::Mapping(a), serde_norway::Value::Mapping(b)) => {
            for (k, v) in b {
                match a.get_mut(&k) {
                    Some(slot) => merge(slot, v),
                    None => {
                        a.insert(k, v);
                    }
                }
            }
        }
        (slot, v) => *slot = v,
    }
}
