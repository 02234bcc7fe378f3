//! A policy argument as the user wrote it: `[label=]POLICY[@SCHEDULER]`, parsed and checked.

use std::path::PathBuf;

use super::{LoadError, LoadErrorKind};

/// A policy as the user named it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicySpec {
    /// The policy's name in reports: the `label=` given, else the argument with a library path
    /// replaced by the policy's name.
    pub label: String,
    /// The argument as typed (kept in the JSON as `spec`).
    pub arg: String,
    /// The library, when not built in.
    pub library: Option<PathBuf>,
    /// The policy's name; `None` when a library exports exactly one of the needed kind.
    pub name: Option<String>,
    /// Config as YAML text (a flow mapping), empty for defaults.
    pub config: String,
    /// The local scheduler to pair with this router (cluster world), as a policy argument
    /// (already checked to parse).
    pub scheduler: Option<String>,
}

fn bad_spec(message: String, fix: &str) -> LoadError {
    LoadError::new(LoadErrorKind::UnknownPolicy, message, fix)
}

/// `mine` of `mine=spec`: letters, digits, `_`, `-` and `.` before the first `=`, which must
/// come before any brace, `@`, `/` or `:`.
fn label_prefix(arg: &str) -> Option<(&str, &str)> {
    let (label, rest) = arg.split_once('=')?;
    let ok = !label.is_empty() && label.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c));
    ok.then(|| (label.trim(), rest.trim()))
}

impl PolicySpec {
    /// Parses `[label=]policy[@scheduler]`, a policy being `name`, `name{k: v}`, `lib.so`,
    /// `lib.so:name` or `lib.so:name{k: v}` (the full syntax is in `routelab compare --help`).
    pub fn parse(arg: &str) -> Result<Self, LoadError> {
        let typed = arg.trim();
        let (label, rest) = match label_prefix(typed) {
            Some((l, r)) => (Some(l.to_string()), r),
            None => (None, typed),
        };
        let (policy, scheduler) = match top_level_at(rest) {
            Some(i) => (&rest[..i], Some(rest[i + 1..].trim())),
            None => (rest, None),
        };
        let mut spec = Self::parse_one(policy)?;
        let mut shown = spec.short();
        if let Some(s) = scheduler {
            if top_level_at(s).is_some() {
                return Err(bad_spec(
                    format!("policy '{typed}': more than one `@`"),
                    "pair a router with one scheduler: router@scheduler",
                ));
            }
            if s.is_empty() {
                return Err(bad_spec(
                    format!("policy '{typed}': no scheduler after `@`"),
                    "write router@scheduler, e.g. preble@lpm",
                ));
            }
            let sched = Self::parse_one(s)?;
            shown = format!("{shown}@{}", sched.short());
            spec.scheduler = Some(s.to_string());
        }
        spec.label = label.unwrap_or(shown);
        spec.arg = typed.to_string();
        Ok(spec)
    }

    /// How a policy without a label is shown: as typed, a library path replaced by the policy's
    /// name (or the library's file name when it exports one policy of the kind).
    fn short(&self) -> String {
        let head = match (&self.library, &self.name) {
            (_, Some(n)) => n.clone(),
            (Some(lib), None) => {
                let stem = lib.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
                stem.strip_prefix(std::env::consts::DLL_PREFIX).filter(|s| !s.is_empty()).unwrap_or(&stem).to_string()
            }
            (None, None) => String::new(),
        };
        format!("{head}{}", self.config)
    }

    fn parse_one(arg: &str) -> Result<Self, LoadError> {
        let arg = arg.trim();
        let (head, config) = match arg.find('{') {
            Some(i) => {
                if !arg.ends_with('}') {
                    return Err(LoadError::new(
                        LoadErrorKind::BadConfig,
                        format!("policy '{arg}': config must be a YAML mapping in braces at the end"),
                        "write it as name{key: value}",
                    ));
                }
                (arg[..i].trim(), arg[i..].to_string())
            }
            None => (arg, String::new()),
        };
        if head.is_empty() {
            return Err(bad_spec(
                format!("policy '{arg}': empty policy name"),
                "name a policy; `routelab policies` lists them",
            ));
        }
        let is_lib =
            |s: &str| s.contains('/') || s.contains('\\') || [".so", ".dylib", ".dll"].iter().any(|x| s.ends_with(x));
        let (library, name) = if is_lib(head) {
            match head.rsplit_once(':') {
                Some((lib, "")) => {
                    return Err(bad_spec(
                        format!("policy '{arg}': no policy name after `{lib}:`"),
                        "write lib.so:name, or just lib.so when the library exports one policy of the kind",
                    ));
                }
                Some((lib, name)) if !name.contains('/') && !is_lib(name) => {
                    (Some(PathBuf::from(lib)), Some(name.to_string()))
                }
                _ => (Some(PathBuf::from(head)), None),
            }
        } else {
            if let Some(bad) = head.chars().find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-')) {
                return Err(bad_spec(
                    format!("policy '{arg}': `{bad}` cannot be part of a policy name"),
                    "give a built-in name (`routelab policies`), path/to/lib.so:name, or label=policy",
                ));
            }
            (None, Some(head.to_string()))
        };
        Ok(Self { label: arg.to_string(), arg: arg.to_string(), library, name, config, scheduler: None })
    }
}

/// Index of the first `@` outside braces.
fn top_level_at(s: &str) -> Option<usize> {
    let mut depth = 0i32;
    for (i, c) in s.char_indices() {
        match c {
            '{' | '[' => depth += 1,
            '}' | ']' => depth -= 1,
            '@' if depth == 0 => return Some(i),
            _ => {}
        }
    }
    None
}
