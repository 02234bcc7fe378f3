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

use abi_stable::library::lib_header_from_path;
use abi_stable::std_types::RStr;
use routelab_policy_api::{
    Entry, ErrorKind, Maker, PolicyError, PolicyKind, PolicyLibRef, RouterBox, RouterContext, SchedulerBox,
    SchedulerContext, SelectorBox, SelectorContext,
};

mod extra;
mod library;
mod spec;

pub use self::extra::{AdmissionFactory, ExtraFactory, ExtraKind, ScalerFactory};
use self::library::{Refused, check_elf, init_checked, translate};
pub use self::spec::PolicySpec;

/// Why a policy could not be had. Every kind but `Panicked` and `Failed` is bad input (exit
/// code 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadErrorKind {
    MissingFile,
    NotAPlugin,
    VersionMismatch,
    UnknownPolicy,
    BadConfig,
    /// The policy's code panicked (caught at the boundary).
    Panicked,
    /// The policy failed for a reason of its own (`ErrorKind::FAILED`, or a kind this host does
    /// not know).
    Failed,
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
        !matches!(self.kind, LoadErrorKind::Panicked | LoadErrorKind::Failed)
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
    /// The default config as YAML, or why the policy could not produce it (its config's
    /// `Default` or `Serialize` panicked).
    pub default_config: Result<String, String>,
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

/// Where a policy of `kind` is asked for.
fn needs(kind: PolicyKind) -> &'static str {
    match kind {
        PolicyKind::Router => "a router is what dispatch and cluster workloads name in `--policies` and `policies:`",
        PolicyKind::Scheduler => "a scheduler is what `ROUTER@SCHEDULER` and `cluster.scheduler` name",
        PolicyKind::Selector => "a selector is what compound workloads name in `--policies` and `policies:`",
    }
}

/// Where the other kinds are asked for.
fn needs_others(kind: PolicyKind) -> String {
    let others: Vec<&str> = [PolicyKind::Router, PolicyKind::Scheduler, PolicyKind::Selector]
        .into_iter()
        .filter(|k| *k != kind)
        .map(needs)
        .collect();
    others.join("; ")
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
        check_elf(&canon)?;
        let header = lib_header_from_path(&canon).map_err(|e| translate(&canon, e))?;
        let lib = init_checked(header).map_err(|e| match e {
            Refused::Library(e) => translate(&canon, e),
            Refused::Version { found } => LoadError::new(
                LoadErrorKind::VersionMismatch,
                format!(
                    "{} was built against routelab-policy-api {found}; this routelab uses {}",
                    canon.display(),
                    routelab_policy_api::API_VERSION
                ),
                format!("rebuild the plugin against routelab-policy-api {}", routelab_policy_api::API_VERSION),
            ),
        })?;
        self.libraries.insert(canon, lib);
        Ok(lib)
    }

    /// What the built-ins (`None`) or a library offer.
    pub fn list(&mut self, library: Option<&Path>) -> Result<Vec<Listing>, LoadError> {
        Ok(match library {
            None => self
                .builtins
                .iter()
                .filter_map(|e| Some((e, e.kind_of()?)))
                .map(|(e, kind)| Listing {
                    name: e.name.into(),
                    kind,
                    description: e.description.into(),
                    default_config: e.default_config_checked().map_err(String::from),
                })
                .collect(),
            Some(p) => {
                let lib = self.library(p)?;
                let f = lib.policies();
                f().into_result()
                    .map_err(|e| policy_error(&p.display().to_string(), e))?
                    .into_iter()
                    .map(|i| Listing {
                        name: i.name.into(),
                        kind: i.kind,
                        description: i.description.into(),
                        default_config: i.default_config.into_result().map(String::from).map_err(String::from),
                    })
                    .collect()
            }
        })
    }

    /// Checks that `spec` names a policy of `kind` (and its `@scheduler` a scheduler) without
    /// building it: what `validate` and the checks before a run use.
    pub fn check(&mut self, spec: &PolicySpec, kind: PolicyKind) -> Result<(), LoadError> {
        self.resolve_name(spec, kind)?;
        if let Some(s) = &spec.scheduler {
            self.resolve_name(&PolicySpec::parse(s)?, PolicyKind::Scheduler)?;
        }
        Ok(())
    }

    /// Names and kinds of what the built-ins (`None`) or a library offer (without serialising
    /// default configs, which [`Loader::list`] does).
    fn offers(&mut self, library: Option<&Path>) -> Result<Vec<(String, PolicyKind)>, LoadError> {
        Ok(match library {
            None => self.builtins.iter().filter_map(|e| Some((e.name.to_string(), e.kind_of()?))).collect(),
            Some(p) => {
                let lib = self.library(p)?;
                let f = lib.policies();
                f().into_result()
                    .map_err(|e| policy_error(&p.display().to_string(), e))?
                    .into_iter()
                    .map(|i| (i.name.to_string(), i.kind))
                    .collect()
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
                    None => format!(
                        "no {} named '{n}' in {where_}{}",
                        kind.as_str(),
                        crate::suggest::did_you_mean(n, names.iter().copied())
                    ),
                };
                let fix = if names.is_empty() {
                    format!("{where_} has no {}: {}; {}", kind.as_str(), needs(kind), needs_others(kind))
                } else {
                    format!("use one of: {}", names.join(", "))
                };
                Err(LoadError::new(LoadErrorKind::UnknownPolicy, msg, fix))
            }
            None if names.len() == 1 => Ok(names[0].to_string()),
            // None of the kind asked for: say what there is, and where each kind is used.
            _ if names.is_empty() => {
                let offered: Vec<String> = listing.iter().map(|(n, k)| format!("{n} ({})", k.as_str())).collect();
                let offered = if offered.is_empty() { "nothing".to_string() } else { offered.join(", ") };
                Err(LoadError::new(
                    LoadErrorKind::UnknownPolicy,
                    format!("{where_} exports no {}: it exports {offered}", kind.as_str()),
                    format!("{}; {}", needs(kind), needs_others(kind)),
                ))
            }
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
                let entry = self
                    .builtins
                    .iter()
                    .find(|e| e.name == name && e.kind_of() == Some(kind))
                    .expect("resolved name exists");
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
                lib.new_router()(RStr::from_str(name), config, ctx).into_result()
            }
            _ => return Err(self.wrong_kind(PolicyKind::Router)),
        };
        let router = made.map_err(|e| policy_error(&self.spec.label, e))?;
        // What it asks of the host, checked once here: a panic or an unknown signal name is a
        // clear error before any run.
        router.capabilities().into_result().map_err(|e| policy_error(&self.spec.label, e))?;
        crate::signals::SignalTable::negotiate(&router).map_err(|e| {
            LoadError::new(
                LoadErrorKind::BadConfig,
                format!("policy '{}' {e}", self.spec.label),
                "ask only for the signals listed (routelab_policy_api::signals), or upgrade routelab",
            )
        })?;
        crate::facts::negotiate_facts(&router, ctx.world).map_err(|e| {
            LoadError::new(
                LoadErrorKind::BadConfig,
                format!("policy '{}' {e}", self.spec.label),
                "ask only for the request facts this world provides (routelab_policy_api::facts::request)",
            )
        })?;
        Ok(router)
    }

    pub fn scheduler(&self, ctx: &SchedulerContext) -> Result<SchedulerBox, LoadError> {
        let config = RStr::from_str(&self.spec.config);
        let made = match &self.source {
            Source::Builtin(Maker::Scheduler(make)) => make(&self.spec.config, ctx),
            Source::Library(lib, name) if self.kind == PolicyKind::Scheduler => {
                lib.new_scheduler()(RStr::from_str(name), config, ctx).into_result()
            }
            _ => return Err(self.wrong_kind(PolicyKind::Scheduler)),
        };
        let scheduler = made.map_err(|e| policy_error(&self.spec.label, e))?;
        crate::facts::negotiate_scheduler_facts(&scheduler).map_err(|e| {
            LoadError::new(
                LoadErrorKind::BadConfig,
                format!("policy '{}' {e}", self.spec.label),
                "ask only for the request facts this world provides (routelab_policy_api::facts::request)",
            )
        })?;
        Ok(scheduler)
    }

    pub fn selector(&self, ctx: &SelectorContext) -> Result<SelectorBox, LoadError> {
        let config = RStr::from_str(&self.spec.config);
        let made = match &self.source {
            Source::Builtin(Maker::Selector(make)) => make(&self.spec.config, ctx),
            Source::Library(lib, name) if self.kind == PolicyKind::Selector => {
                lib.new_selector()(RStr::from_str(name), config, ctx).into_result()
            }
            _ => return Err(self.wrong_kind(PolicyKind::Selector)),
        };
        made.map_err(|e| policy_error(&self.spec.label, e))
    }
}

/// A policy's typed error as a load error: its kind, not its wording, decides the exit code.
fn policy_error(label: &str, e: PolicyError) -> LoadError {
    let message = format!("policy '{label}': {}", e.message);
    match e.kind.known() {
        ErrorKind::BAD_CONFIG => LoadError::new(
            LoadErrorKind::BadConfig,
            message,
            "fix the config; `routelab policies` shows each policy's keys and defaults",
        ),
        ErrorKind::PANICKED => LoadError::new(LoadErrorKind::Panicked, message, "report it to the policy's author"),
        _ => LoadError::new(LoadErrorKind::Failed, message, "report it to the policy's author"),
    }
}
