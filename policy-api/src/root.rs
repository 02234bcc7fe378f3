//! The root module every policy library exports, and the registry behind it.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;

use abi_stable::{
    StableAbi, declare_root_module_statics,
    library::RootModule,
    package_version_strings,
    sabi_types::VersionStrings,
    std_types::{RErr, RResult, RStr, RString, RVec},
};

use crate::error::PolicyError;
use crate::policy::{Entry, Maker, panic_message};
use crate::traits::*;
use crate::types::*;

/// The kind of a policy.
#[repr(u8)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PolicyKind {
    /// Picks a replica per request ([`crate::RouterPolicy`]).
    Router,
    /// Orders one replica's waiting queue ([`crate::SchedulerPolicy`]).
    Scheduler,
    /// Picks a model per module of a compound system ([`crate::SelectorPolicy`]).
    Selector,
}

impl PolicyKind {
    /// `router`, `scheduler` or `selector`.
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyKind::Router => "router",
            PolicyKind::Scheduler => "scheduler",
            PolicyKind::Selector => "selector",
        }
    }
}

impl Entry {
    /// The kind of policy the entry makes. Panics for an admission entry (0.5.2) or a scaler
    /// entry (0.5.4), each of no
    /// [`PolicyKind`] (that enum crosses the boundary and cannot grow within 0.5): see
    /// [`Entry::kind_of`].
    pub fn kind(&self) -> PolicyKind {
        self.kind_of().expect("an admission entry has no PolicyKind; use Entry::kind_of")
    }

    /// The kind of policy the entry makes; `None` for an admission or a scaler entry.
    pub fn kind_of(&self) -> Option<PolicyKind> {
        match self.make {
            Maker::Router(_) => Some(PolicyKind::Router),
            Maker::Scheduler(_) => Some(PolicyKind::Scheduler),
            Maker::Selector(_) => Some(PolicyKind::Selector),
            // since 0.5.2 {
            Maker::Admission(_) => None,
            // } since 0.5.2
            // since 0.5.4 {
            Maker::Scaler(_) => None,
            // } since 0.5.4
        }
    }
}

/// One exported policy, as `routelab policies --plugin LIB` lists it.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub struct PolicyInfo {
    /// [`crate::Policy::NAME`].
    pub name: RString,
    /// Router, scheduler or selector.
    pub kind: PolicyKind,
    /// [`crate::Policy::DESCRIPTION`].
    pub description: RString,
    /// The default configuration as YAML text, or why it could not be had (the config's
    /// `Default` or `Serialize` panicked): one broken entry does not hide the others.
    pub default_config: RResult<RString, PolicyError>,
}

/// The root module of a policy library. Constructors take the policy's name and its config as
/// YAML text (empty: defaults) and return the object or a typed error.
///
/// A prefix type: the fields up to `new_selector` (`last_prefix_field`) are fixed for 0.2; a later
/// minor appends fields after it, and their accessors return `None` when the library was built
/// before they existed (`missing_field(option)`), so the host can fall back instead of panicking.
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = PolicyLibRef)))]
#[sabi(missing_field(option))]
pub struct PolicyLib {
    /// Every policy the library exports.
    pub policies: extern "C" fn() -> RResult<RVec<PolicyInfo>, PolicyError>,
    /// A router by name, from config text and context.
    pub new_router: extern "C" fn(RStr<'_>, RStr<'_>, &RouterContext) -> RResult<RouterBox, PolicyError>,
    /// A scheduler by name, from config text and context.
    pub new_scheduler: extern "C" fn(RStr<'_>, RStr<'_>, &SchedulerContext) -> RResult<SchedulerBox, PolicyError>,
    /// A selector by name, from config text and context.
    #[sabi(last_prefix_field)]
    pub new_selector: extern "C" fn(RStr<'_>, RStr<'_>, &SelectorContext) -> RResult<SelectorBox, PolicyError>,
    // since 0.5.2 {
    /// Every admission policy the library exports (0.5.2; `None` from an older library).
    pub admission_policies: extern "C" fn() -> RResult<RVec<crate::admission::AdmissionInfo>, PolicyError>,
    /// An admission policy by name, from config text and context (0.5.2; `None` from an older
    /// library).
    pub new_admission: extern "C" fn(
        RStr<'_>,
        RStr<'_>,
        &crate::admission::AdmissionContext,
    ) -> RResult<crate::admission::AdmissionBox, PolicyError>,
    // } since 0.5.2
    // since 0.5.4 {
    /// Every scaler the library exports (0.5.4; `None` from an older library).
    pub scaler_policies: extern "C" fn() -> RResult<RVec<crate::scaler::ScalerInfo>, PolicyError>,
    /// A scaler by name, from config text and context (0.5.4; `None` from an older library).
    pub new_scaler: extern "C" fn(
        RStr<'_>,
        RStr<'_>,
        &crate::scaler::ScalerContext,
    ) -> RResult<crate::scaler::ScalerBox, PolicyError>,
    // } since 0.5.4
}

impl RootModule for PolicyLibRef {
    declare_root_module_statics! {PolicyLibRef}
    const BASE_NAME: &'static str = "routelab_policies";
    const NAME: &'static str = "routelab_policies";
    const VERSION_STRINGS: VersionStrings = package_version_strings!();
}

/// This library's registry (each plugin has its own copy of this static), or why the registry
/// function failed.
static REGISTRY: OnceLock<Result<Vec<Entry>, PolicyError>> = OnceLock::new();

fn registry() -> Result<&'static [Entry], PolicyError> {
    match REGISTRY.get() {
        Some(Ok(v)) => Ok(v),
        Some(Err(e)) => Err(e.clone()),
        None => Ok(&[]),
    }
}

/// Runs `f` with panics caught; every extern "C" function of the root module goes through here,
/// since a panic unwinding out of one would abort the host.
fn catching<T>(what: &str, f: impl FnOnce() -> Result<T, PolicyError>) -> RResult<T, PolicyError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r.into(),
        Err(payload) => RErr(PolicyError::panicked(format!("{what} panicked: {}", panic_message(&*payload)))),
    }
}

fn find(name: &str, kind: PolicyKind) -> Result<&'static Entry, PolicyError> {
    let registry = registry()?;
    registry.iter().find(|e| e.name == name && e.kind_of() == Some(kind)).ok_or_else(|| {
        let names: Vec<_> = registry.iter().filter(|e| e.kind_of() == Some(kind)).map(|e| e.name).collect();
        PolicyError::bad_config(format!(
            "no {} named '{name}' in this library (it has: {})",
            kind.as_str(),
            names.join(", ")
        ))
    })
}

extern "C" fn policies() -> RResult<RVec<PolicyInfo>, PolicyError> {
    catching("listing the library's policies", || {
        registry()?
            .iter()
            .filter_map(|e| Some((e, e.kind_of()?)))
            .map(|(e, kind)| {
                Ok(PolicyInfo {
                    name: e.name.into(),
                    kind,
                    description: e.description.into(),
                    default_config: e.default_config_checked().map(RString::from).into(),
                })
            })
            .collect()
    })
}

extern "C" fn new_router(name: RStr<'_>, config: RStr<'_>, ctx: &RouterContext) -> RResult<RouterBox, PolicyError> {
    catching(&format!("constructor of '{name}'"), || match find(name.as_str(), PolicyKind::Router)?.make {
        Maker::Router(make) => make(config.as_str(), ctx),
        _ => unreachable!("find checked the kind"),
    })
}

extern "C" fn new_scheduler(
    name: RStr<'_>,
    config: RStr<'_>,
    ctx: &SchedulerContext,
) -> RResult<SchedulerBox, PolicyError> {
    catching(&format!("constructor of '{name}'"), || match find(name.as_str(), PolicyKind::Scheduler)?.make {
        Maker::Scheduler(make) => make(config.as_str(), ctx),
        _ => unreachable!("find checked the kind"),
    })
}

extern "C" fn new_selector(
    name: RStr<'_>,
    config: RStr<'_>,
    ctx: &SelectorContext,
) -> RResult<SelectorBox, PolicyError> {
    catching(&format!("constructor of '{name}'"), || match find(name.as_str(), PolicyKind::Selector)?.make {
        Maker::Selector(make) => make(config.as_str(), ctx),
        _ => unreachable!("find checked the kind"),
    })
}

// since 0.5.2 {
extern "C" fn admission_policies() -> RResult<RVec<crate::admission::AdmissionInfo>, PolicyError> {
    catching("listing the library's admission policies", || {
        Ok(registry()?
            .iter()
            .filter(|e| matches!(e.make, Maker::Admission(_)))
            .map(|e| crate::admission::AdmissionInfo {
                name: e.name.into(),
                description: e.description.into(),
                default_config: e.default_config_checked().map(RString::from).into(),
            })
            .collect())
    })
}

extern "C" fn new_admission(
    name: RStr<'_>,
    config: RStr<'_>,
    ctx: &crate::admission::AdmissionContext,
) -> RResult<crate::admission::AdmissionBox, PolicyError> {
    catching(&format!("constructor of '{name}'"), || {
        let registry = registry()?;
        let admissions = || registry.iter().filter(|e| matches!(e.make, Maker::Admission(_)));
        match admissions().find(|e| e.name == name.as_str()).map(|e| e.make) {
            Some(Maker::Admission(make)) => make(config.as_str(), ctx),
            _ => Err(PolicyError::bad_config(format!(
                "no admission policy named '{name}' in this library (it has: {})",
                admissions().map(|e| e.name).collect::<Vec<_>>().join(", ")
            ))),
        }
    })
}
// } since 0.5.2

// since 0.5.4 {
extern "C" fn scaler_policies() -> RResult<RVec<crate::scaler::ScalerInfo>, PolicyError> {
    catching("listing the library's scalers", || {
        Ok(registry()?
            .iter()
            .filter(|e| matches!(e.make, Maker::Scaler(_)))
            .map(|e| crate::scaler::ScalerInfo {
                name: e.name.into(),
                description: e.description.into(),
                default_config: e.default_config_checked().map(RString::from).into(),
            })
            .collect())
    })
}

extern "C" fn new_scaler(
    name: RStr<'_>,
    config: RStr<'_>,
    ctx: &crate::scaler::ScalerContext,
) -> RResult<crate::scaler::ScalerBox, PolicyError> {
    catching(&format!("constructor of '{name}'"), || {
        let registry = registry()?;
        let scalers = || registry.iter().filter(|e| matches!(e.make, Maker::Scaler(_)));
        match scalers().find(|e| e.name == name.as_str()).map(|e| e.make) {
            Some(Maker::Scaler(make)) => make(config.as_str(), ctx),
            _ => Err(PolicyError::bad_config(format!(
                "no scaler named '{name}' in this library (it has: {})",
                scalers().map(|e| e.name).collect::<Vec<_>>().join(", ")
            ))),
        }
    })
}
// } since 0.5.4

/// Builds the root module over `entries`. Called once, by [`crate::export_policies!`]'s loader.
/// A panic in `entries` is kept as the library's error: every call of the module then fails with
/// a message that says the registry function panicked, and why.
pub fn library(entries: impl FnOnce() -> Vec<Entry>) -> PolicyLibRef {
    REGISTRY.get_or_init(|| {
        catch_unwind(AssertUnwindSafe(entries)).map_err(|payload| {
            PolicyError::panicked(format!("the library's registry function panicked: {}", panic_message(&*payload)))
        })
    });
    use abi_stable::prefix_type::PrefixTypeTrait;
    PolicyLib {
        policies,
        new_router,
        new_scheduler,
        new_selector,
        // since 0.5.2 {
        admission_policies,
        new_admission,
        // } since 0.5.2
        // since 0.5.4 {
        scaler_policies,
        new_scaler,
        // } since 0.5.4
    }
    .leak_into_prefix()
}

/// Exports a registry as this library's root module. Use once per `cdylib` crate:
///
/// ```ignore
/// fn registry() -> Vec<routelab_policy_api::Entry> {
///     vec![routelab_policy_api::router::<MyRouter>()]
/// }
/// routelab_policy_api::export_policies!(registry);
/// ```
///
/// It expands to what `#[abi_stable::export_root_module]` generates, spelled with paths through
/// this crate, so a plugin needs no direct dependency on abi_stable. The static's name is the
/// symbol abi_stable looks up (a test pins it to `abi_stable::library::ROOT_MODULE_LOADER_NAME`).
#[macro_export]
macro_rules! export_policies {
    ($registry:path) => {
        #[doc(hidden)]
        #[allow(non_upper_case_globals)]
        // SAFETY: the one symbol of this name in the library (one `export_policies!` per
        // crate); its type is the `LibHeader` abi_stable's loader expects under that name.
        #[unsafe(no_mangle)]
        pub static _1as_0lib_1header_0root_bmodule_bloader: $crate::abi_stable::library::LibHeader = {
            fn routelab_root_module() -> $crate::PolicyLibRef {
                $crate::root::library($registry)
            }
            extern "C" fn erased_root_module() -> $crate::abi_stable::library::RootModuleResult {
                $crate::abi_stable::library::__call_root_module_loader(routelab_root_module)
            }
            // SAFETY: what `#[export_root_module]` emits: the constructor returns this crate's
            // root module type, and `CheckTypeLayout::Yes` makes the loader check its layout.
            unsafe {
                $crate::abi_stable::library::LibHeader::from_constructor::<$crate::PolicyLibRef>(
                    erased_root_module,
                    $crate::abi_stable::library::CheckTypeLayout::Yes,
                )
            }
        };
    };
}

#[cfg(test)]
mod tests {
    #[test]
    fn exported_symbol_is_the_one_abi_stable_looks_up() {
        assert_eq!(abi_stable::library::ROOT_MODULE_LOADER_NAME, "_1as_0lib_1header_0root_bmodule_bloader");
    }
}
