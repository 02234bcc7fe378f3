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

use crate::policy::{Entry, Maker};
use crate::traits::*;
use crate::types::*;

/// The kind of a policy.
#[repr(u8)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PolicyKind {
    Router,
    Scheduler,
    Selector,
}

impl PolicyKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyKind::Router => "router",
            PolicyKind::Scheduler => "scheduler",
            PolicyKind::Selector => "selector",
        }
    }
}

/// One exported policy, as `routelab policies --plugin LIB` lists it.
#[repr(C)]
#[derive(StableAbi, Clone, Debug, PartialEq)]
pub struct PolicyInfo {
    pub name: RString,
    pub kind: PolicyKind,
    pub description: RString,
    /// The default configuration as YAML text.
    pub default_config: RString,
}

/// The root module of a policy library. Constructors take the policy's name and its config as
/// YAML text (empty: defaults) and return the object or an error message.
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = PolicyLibRef)))]
#[sabi(missing_field(panic))]
pub struct PolicyLib {
    pub policies: extern "C" fn() -> RVec<PolicyInfo>,
    pub new_router: extern "C" fn(RStr<'_>, RStr<'_>, &RouterContext) -> RResult<RouterBox, RString>,
    pub new_scheduler: extern "C" fn(RStr<'_>, RStr<'_>, &SchedulerContext) -> RResult<SchedulerBox, RString>,
    #[sabi(last_prefix_field)]
    pub new_selector: extern "C" fn(RStr<'_>, RStr<'_>, &SelectorContext) -> RResult<SelectorBox, RString>,
}

impl RootModule for PolicyLibRef {
    declare_root_module_statics! {PolicyLibRef}
    const BASE_NAME: &'static str = "routelab_policies";
    const NAME: &'static str = "routelab_policies";
    const VERSION_STRINGS: VersionStrings = package_version_strings!();
}

/// This library's registry (each plugin has its own copy of this static).
static REGISTRY: OnceLock<Vec<Entry>> = OnceLock::new();

fn registry() -> &'static [Entry] {
    REGISTRY.get().map(Vec::as_slice).unwrap_or(&[])
}

fn catching<T>(what: &str, f: impl FnOnce() -> Result<T, String>) -> RResult<T, RString> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r.map_err(RString::from).into(),
        Err(_) => RErr(format!("{what} panicked").into()),
    }
}

fn find(name: &str, kind: PolicyKind) -> Result<&'static Entry, String> {
    registry().iter().find(|e| e.name == name && e.kind() == kind).ok_or_else(|| {
        let names: Vec<_> =
            registry().iter().filter(|e| e.kind() == kind).map(|e| e.name).collect();
        format!("no {} named '{name}' in this library (it has: {})", kind.as_str(), names.join(", "))
    })
}

extern "C" fn policies() -> RVec<PolicyInfo> {
    registry()
        .iter()
        .map(|e| PolicyInfo {
            name: e.name.into(),
            kind: e.kind(),
            description: e.description.into(),
            default_config: (e.default_config)().into(),
        })
        .collect()
}

extern "C" fn new_router(name: RStr<'_>, config: RStr<'_>, ctx: &RouterContext) -> RResult<RouterBox, RString> {
    catching(&format!("constructor of '{name}'"), || match find(name.as_str(), PolicyKind::Router)?.make {
        Maker::Router(make) => make(config.as_str(), ctx),
        _ => unreachable!(),
    })
}

extern "C" fn new_scheduler(
    name: RStr<'_>,
    config: RStr<'_>,
    ctx: &SchedulerContext,
) -> RResult<SchedulerBox, RString> {
    catching(&format!("constructor of '{name}'"), || match find(name.as_str(), PolicyKind::Scheduler)?.make {
        Maker::Scheduler(make) => make(config.as_str(), ctx),
        _ => unreachable!(),
    })
}

extern "C" fn new_selector(
    name: RStr<'_>,
    config: RStr<'_>,
    ctx: &SelectorContext,
) -> RResult<SelectorBox, RString> {
    catching(&format!("constructor of '{name}'"), || match find(name.as_str(), PolicyKind::Selector)?.make {
        Maker::Selector(make) => make(config.as_str(), ctx),
        _ => unreachable!(),
    })
}

/// Builds the root module over `entries`. Called once, by [`crate::export_policies!`]'s loader.
pub fn library(entries: impl FnOnce() -> Vec<Entry>) -> PolicyLibRef {
    REGISTRY.get_or_init(entries);
    use abi_stable::prefix_type::PrefixTypeTrait;
    PolicyLib { policies, new_router, new_scheduler, new_selector }.leak_into_prefix()
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
        #[unsafe(no_mangle)]
        pub static _1as_0lib_1header_0root_bmodule_bloader: $crate::abi_stable::library::LibHeader = {
            fn routelab_root_module() -> $crate::PolicyLibRef {
                $crate::root::library($registry)
            }
            extern "C" fn erased_root_module() -> $crate::abi_stable::library::RootModuleResult {
                $crate::abi_stable::library::__call_root_module_loader(routelab_root_module)
            }
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
        assert_eq!(
            abi_stable::library::ROOT_MODULE_LOADER_NAME,
            "_1as_0lib_1header_0root_bmodule_bloader"
        );
    }
}
