//! Policies by name: the built-in registry and libraries loaded by path. The one module that
//! knows abi_stable's loading API.
//!
//! A policy argument is `name`, `path/to/libfoo.so:name` or `path/to/libfoo.so` (when the library
//! exports one policy of the needed kind), optionally followed by its config as a YAML flow
//! mapping: `power_of_two{d: 3}`. In the cluster world a router may name the local scheduler its
//! replicas run after `@` (`preble@priority_groups`, `round_robin@lpm{...}`), overriding the
//! workload's `cluster.scheduler`.
//!
//! Libraries are loaded with `lib_header_from_path(..).init_root_module()`, never
//! `RootModule::load_from_file`, which caches one module per type and would silently hand back the
//! first library for every later path. Paths are canonicalised (dlopen does not search the current
//! directory). Libraries are never unloaded.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use abi_stable::library::{LibraryError, lib_header_from_path};
use abi_stable::std_types::RStr;
use routelab_policy_api::{
    Entry, Maker, PolicyKind, PolicyLibRef, RouterBox, RouterContext, SchedulerBox, SchedulerContext,
    SelectorBox, SelectorContext,
};

/// A policy as the user named it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicySpec {
    /// The argument as typed, used as the policy's label in reports.
    pub label: String,
    /// The library, when not built in.
    pub library: Option<PathBuf>,
    /// The policy's name; `None` when a library exports exactly one of the needed kind.
    pub name: Option<String>,
    /// Config as YAML text (a flow mapping), empty for defaults.
    pub config: String,
    /// The local scheduler to pair with this router (cluster world), as a policy argument.
    pub scheduler: Option<String>,
}

impl PolicySpec {
    /// Parses `name`, `name{k: v}`, `lib.so`, `lib.so:name`, `lib.so:name{k: v}`, each
    /// optionally followed by `@scheduler`.
    pub fn parse(arg: &str) -> Result<Self, LoadError> {
        let label = arg.trim();
        let (arg, scheduler) = match top_level_at(label) {
            Some(i) => (&label[..i], Some(label[i + 1..].trim().to_string())),
            None => (label, None),
        };
        let mut spec = Self::parse_one(arg)?;
        spec.label = label.to_string();
        spec.scheduler = scheduler;
        Ok(spec)
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
                (&arg[..i], arg[i..].to_string())
            }
            None => (arg, String::new()),
        };
        if head.is_empty() {
            return Err(LoadError::new(LoadErrorKind::UnknownPolicy, "empty policy name", "name a policy; `routelab policies` lists them"));
        }
        let is_lib = |s: &str| s.contains('/') || s.ends_with(".so") || s.ends_with(".dylib") || s.ends_with(".dll");
        let (library, name) = if is_lib(head) {
            match head.rsplit_once(':') {
                Some((lib, name)) if !name.is_empty() && !name.contains('/') && !is_lib(name) => {
                    (Some(PathBuf::from(lib)), Some(name.to_string()))
                }
                _ => (Some(PathBuf::from(head)), None),
            }
        } else {
            (None, Some(head.to_string()))
        };
        Ok(Self { label: arg.to_string(), library, name, config, scheduler: None })
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

/// Why a policy could not be had. Every kind but `Panicked` is bad input (exit code 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadErrorKind {
    MissingFile,
    NotAPlugin,
    VersionMismatch,
    UnknownPolicy,
    BadConfig,
    Panicked,
    Other,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadError {
    pub kind: LoadErrorKind,
    pub message: String,
    /// What to do about it.
    pub fix: String,
}

impl LoadError {
    pub fn new(kind: LoadErrorKind, message: impl Into<String>, fix: impl Into<String>) -> Self {
        Self { kind, message: message.into(), fix: fix.into() }
    }

    /// True for errors in what the user gave (exit code 2), false for a failing policy (1).
    pub fn is_input_error(&self) -> bool {
        self.kind != LoadErrorKind::Panicked
    }
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.message)?;
        if !self.fix.is_empty() {
            write!(f, "\n  fix: {}", self.fix)?;
        }
        Ok(())
    }
}

impl std::error::Error for LoadError {}

/// A policy a source offers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listing {
    pub name: String,
    pub kind: PolicyKind,
    pub description: String,
    pub default_config: String,
}

/// Hands out policy objects from the built-ins and from any number of libraries.
pub struct Loader {
    builtins: Vec<Entry>,
    libraries: HashMap<PathBuf, PolicyLibRef>,
}

impl Default for Loader {
    fn default() -> Self {
        Self::new()
    }
}

/// The last `n` non-empty lines of a long message (abi_stable's layout dumps run to 1,000+ lines).
fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().map(str::trim_end).filter(|l| !l.trim().is_empty()).collect();
    let start = lines.len().saturating_sub(n);
    lines[start..].join("\n    ")
}

impl Loader {
    pub fn new() -> Self {
        Self { builtins: routelab_policies::registry(), libraries: HashMap::new() }
    }

    /// Loads (once) the library at `path`.
    pub fn library(&mut self, path: &Path) -> Result<PolicyLibRef, LoadError> {
        let canon = path.canonicalize().map_err(|e| {
            LoadError::new(
                LoadErrorKind::MissingFile,
                format!("plugin library {}: {e}", path.display()),
                "check the path; build the plugin crate with `cargo build --release` (the library is target/release/lib<crate>.so)",
            )
        })?;
        if let Some(lib) = self.libraries.get(&canon) {
            return Ok(*lib);
        }
        let lib = lib_header_from_path(&canon)
            .and_then(|h| h.init_root_module::<PolicyLibRef>())
            .map_err(|e| translate(&canon, e))?;
        self.libraries.insert(canon, lib);
        Ok(lib)
    }

    /// What the built-ins (`None`) or a library offer.
    pub fn list(&mut self, library: Option<&Path>) -> Result<Vec<Listing>, LoadError> {
        Ok(match library {
            None => self
                .builtins
                .iter()
                .map(|e| Listing {
                    name: e.name.into(),
                    kind: e.kind(),
                    description: e.description.into(),
                    default_config: (e.default_config)(),
                })
                .collect(),
            Some(p) => {
                let lib = self.library(p)?;
                let f = lib.policies();
                f().into_iter()
                    .map(|i| Listing {
                        name: i.name.into(),
                        kind: i.kind,
                        description: i.description.into(),
                        default_config: i.default_config.into(),
                    })
                    .collect()
            }
        })
    }

    /// Names and kinds of what the built-ins (`None`) or a library offer (without serialising
    /// default configs, which [`Loader::list`] does).
    fn offers(&mut self, library: Option<&Path>) -> Result<Vec<(String, PolicyKind)>, LoadError> {
        Ok(match library {
            None => self.builtins.iter().map(|e| (e.name.to_string(), e.kind())).collect(),
            Some(p) => {
                let lib = self.library(p)?;
                let f = lib.policies();
                f().into_iter().map(|i| (i.name.to_string(), i.kind)).collect()
            }
        })
    }

    /// The policy's name: as given, or the only one of `kind` its library exports.
    fn resolve_name(&mut self, spec: &PolicySpec, kind: PolicyKind) -> Result<String, LoadError> {
        let listing = self.offers(spec.library.as_deref())?;
        let names: Vec<&str> = listing.iter().filter(|l| l.1 == kind).map(|l| l.0.as_str()).collect();
        let where_ = match &spec.library {
            Some(p) => format!("library {}", p.display()),
            None => "the built-ins".to_string(),
        };
        match &spec.name {
            Some(n) if names.contains(&n.as_str()) => Ok(n.clone()),
            Some(n) => {
                let other = listing.iter().find(|l| &l.0 == n).map(|l| l.1);
                let msg = match other {
                    Some(k) => format!("'{n}' in {where_} is a {}, not a {}", k.as_str(), kind.as_str()),
                    None => format!("no {} named '{n}' in {where_}", kind.as_str()),
                };
                Err(LoadError::new(LoadErrorKind::UnknownPolicy, msg, format!("use one of: {}", names.join(", "))))
            }
            None if names.len() == 1 => Ok(names[0].to_string()),
            None => Err(LoadError::new(
                LoadErrorKind::UnknownPolicy,
                format!("{where_} exports {} {}s", names.len(), kind.as_str()),
                format!("name one as LIB:NAME, one of: {}", names.join(", ")),
            )),
        }
    }

    /// Settles `spec`'s name, kind and source once (loading its library if needed); the result
    /// makes instances without the loader.
    pub fn resolve(&mut self, spec: &PolicySpec, kind: PolicyKind) -> Result<Factory, LoadError> {
        let name = self.resolve_name(spec, kind)?;
        let source = match &spec.library {
            None => {
                let entry = self.builtins.iter().find(|e| e.name == name && e.kind() == kind).expect("resolved name exists");
                Source::Builtin(entry.make)
            }
            Some(p) => Source::Library(self.library(p)?, name),
        };
        Ok(Factory { spec: spec.clone(), kind, source })
    }

    pub fn router(&mut self, spec: &PolicySpec, ctx: &RouterContext) -> Result<RouterBox, LoadError> {
        self.resolve(spec, PolicyKind::Router)?.router(ctx)
    }

    pub fn scheduler(&mut self, spec: &PolicySpec, ctx: &SchedulerContext) -> Result<SchedulerBox, LoadError> {
        self.resolve(spec, PolicyKind::Scheduler)?.scheduler(ctx)
    }

    pub fn selector(&mut self, spec: &PolicySpec, ctx: &SelectorContext) -> Result<SelectorBox, LoadError> {
        self.resolve(spec, PolicyKind::Selector)?.selector(ctx)
    }
}

/// A policy whose name, kind and source are settled: it makes instances as often as needed,
/// through `&self` and without the [`Loader`] (what a pure, parallel run needs).
#[derive(Clone)]
pub struct Factory {
    pub spec: PolicySpec,
    pub kind: PolicyKind,
    source: Source,
}

#[derive(Clone)]
enum Source {
    Builtin(Maker),
    Library(PolicyLibRef, String),
}

impl std::fmt::Debug for Factory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Factory({:?}, {})", self.spec.label, self.kind.as_str())
    }
}

impl Factory {
    fn wrong_kind(&self, wanted: PolicyKind) -> LoadError {
        LoadError::new(
            LoadErrorKind::UnknownPolicy,
            format!("policy '{}' is a {}, not a {}", self.spec.label, self.kind.as_str(), wanted.as_str()),
            "name a policy of the kind this world needs",
        )
    }

    pub fn router(&self, ctx: &RouterContext) -> Result<RouterBox, LoadError> {
        let config = RStr::from_str(&self.spec.config);
        let made = match &self.source {
            Source::Builtin(Maker::Router(make)) => make(&self.spec.config, ctx),
            Source::Library(lib, name) if self.kind == PolicyKind::Router => {
                lib.new_router()(RStr::from_str(name), config, ctx).into_result().map_err(String::from)
            }
            _ => return Err(self.wrong_kind(PolicyKind::Router)),
        };
        made.map_err(|e| constructor_error(&self.spec, e))
    }

    pub fn scheduler(&self, ctx: &SchedulerContext) -> Result<SchedulerBox, LoadError> {
        let config = RStr::from_str(&self.spec.config);
        let made = match &self.source {
            Source::Builtin(Maker::Scheduler(make)) => make(&self.spec.config, ctx),
            Source::Library(lib, name) if self.kind == PolicyKind::Scheduler => {
                lib.new_scheduler()(RStr::from_str(name), config, ctx).into_result().map_err(String::from)
            }
            _ => return Err(self.wrong_kind(PolicyKind::Scheduler)),
        };
        made.map_err(|e| constructor_error(&self.spec, e))
    }

    pub fn selector(&self, ctx: &SelectorContext) -> Result<SelectorBox, LoadError> {
        let config = RStr::from_str(&self.spec.config);
        let made = match &self.source {
            Source::Builtin(Maker::Selector(make)) => make(&self.spec.config, ctx),
            Source::Library(lib, name) if self.kind == PolicyKind::Selector => {
                lib.new_selector()(RStr::from_str(name), config, ctx).into_result().map_err(String::from)
            }
            _ => return Err(self.wrong_kind(PolicyKind::Selector)),
        };
        made.map_err(|e| constructor_error(&self.spec, e))
    }
}

fn constructor_error(spec: &PolicySpec, e: String) -> LoadError {
    if e.contains("panicked") {
        LoadError::new(LoadErrorKind::Panicked, format!("policy '{}': {e}", spec.label), "report it to the policy's author")
    } else {
        LoadError::new(
            LoadErrorKind::BadConfig,
            format!("policy '{}': {e}", spec.label),
            "fix the config; `routelab policies` shows each policy's keys and defaults",
        )
    }
}

/// abi_stable's loading errors in the user's terms.
fn translate(path: &Path, e: LibraryError) -> LoadError {
    let shown = path.display();
    match &e {
        LibraryError::GetSymbolError { .. } => LoadError::new(
            LoadErrorKind::NotAPlugin,
            format!("{shown} is not a routelab plugin (it exports no abi_stable root module)"),
            "build a crate that calls routelab_policy_api::export_policies! (see `routelab new-policy`)",
        ),
        LibraryError::OpenError { .. } => LoadError::new(
            LoadErrorKind::NotAPlugin,
            format!("{shown} could not be opened as a shared library: {}", last_lines(&e.to_string(), 2)),
            "pass a .so built by `cargo build --release` for this machine",
        ),
        LibraryError::IncompatibleVersionNumber { expected_version, actual_version, .. } => LoadError::new(
            LoadErrorKind::VersionMismatch,
            format!(
                "{shown} was built against routelab-policy-api {actual_version}; this routelab uses {expected_version}"
            ),
            format!("rebuild the plugin against routelab-policy-api {expected_version}"),
        ),
        LibraryError::AbiInstability(_) => {
            let text = e.to_string();
            let detail = last_lines(&text, 4);
            let incompatible = text.contains("incompatible package versions") || text.contains("package version");
            LoadError::new(
                LoadErrorKind::VersionMismatch,
                format!(
                    "{shown} was built against {} routelab-policy-api (its types' layout differs from this routelab's):\n    {detail}",
                    if incompatible { "another version of" } else { "an incompatible" }
                ),
                format!("rebuild the plugin against routelab-policy-api {}", routelab_policy_api::API_VERSION),
            )
        }
        LibraryError::RootModule { .. } => LoadError::new(
            LoadErrorKind::Panicked,
            format!("{shown}: its root module failed to initialise: {}", last_lines(&e.to_string(), 3)),
            "report it to the plugin's author",
        ),
        _ => LoadError::new(
            LoadErrorKind::Other,
            format!("{shown}: {}", last_lines(&e.to_string(), 4)),
            "rebuild the plugin against this routelab's routelab-policy-api",
        ),
    }
}
