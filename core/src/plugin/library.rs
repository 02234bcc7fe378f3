//! Opening a policy library safely: its ELF structure checked against its size before `dlopen`,
//! its policy-api version and layout checked before its root module runs, and abi_stable's
//! refusals translated into [`LoadError`]s that say what to do.

use std::path::Path;

use abi_stable::library::LibraryError;
use routelab_policy_api::PolicyLibRef;

use super::{LoadError, LoadErrorKind};

/// Why [`init_checked`] refused a library.
pub(super) enum Refused {
    /// Another 0.x minor of policy-api (or an unparsable version).
    Version { found: String },
    /// abi_stable's own refusal (layout, root module initialisation).
    Library(LibraryError),
}

/// The library's root module, with its version and layout checked.
///
/// The minor must be the host's. Within it, abi_stable's checker accepts a library whose prefix
/// types (root module, trait vtables) have *at least* the host's fields: a library built against
/// the same or a later patch. A library built against an earlier patch has fewer fields (methods
/// appended since, a root-module field appended since), which that check refuses although it is
/// exactly the compatible case the API promises. For it, the same checker runs with the roles
/// swapped: every type the library knows must match the host's, field by field, and the host may
/// have more. Accessors of fields the library lacks then return `None` (`missing_field(option)`),
/// and trait methods it lacks run their default bodies.
/// `plugin_built_against_an_earlier_patch_loads_and_matches` (host/tests/integration/compat.rs) runs it.
pub(super) fn init_checked(header: &'static abi_stable::library::LibHeader) -> Result<PolicyLibRef, Refused> {
    use abi_stable::abi_stability::abi_checking::{CheckingGlobals, check_layout_compatibility_with_globals};
    use abi_stable::library::RootModule;
    use abi_stable::sabi_types::VersionNumber;
    let host = VersionNumber::new(PolicyLibRef::VERSION_STRINGS).map_err(|e| Refused::Library(e.into()))?;
    let found = VersionNumber::new(header.version_strings())
        .map_err(|_| Refused::Version { found: header.version_strings().version.to_string() })?;
    if (found.major, found.minor) != (host.major, host.minor) {
        return Err(Refused::Version { found: found.to_string() });
    }
    if found.patch >= host.patch {
        return header.init_root_module::<PolicyLibRef>().map_err(Refused::Library);
    }
    let Some(library_layout) = header.layout() else {
        return Err(Refused::Version { found: format!("{found} (without a layout to check)") });
    };
    // A checker state of its own: abi_stable's global one records every prefix type it has seen
    // under the roles of the standard check, and would then refuse the next library built against
    // the host's own patch. Objects of one library never reach another here, so nothing needs the
    // global view across libraries.
    let globals = CheckingGlobals::new();
    check_layout_compatibility_with_globals(library_layout, <PolicyLibRef as abi_stable::StableAbi>::LAYOUT, &globals)
        .map_err(|e| Refused::Library(LibraryError::AbiInstability(abi_stable::std_types::RBoxError::new(e))))?;
    // SAFETY: the library's root module layout was checked just above against the host's, with
    // the library as the interface: every field and method it has matches the host's in name,
    // type and position, and the fields the host has beyond them are only ever reached through
    // accessors that check the library's own field count (prefix types).
    unsafe { header.init_root_module_with_unchecked_layout::<PolicyLibRef>() }.map_err(Refused::Library)
}

/// Checks an ELF file's structure against its size before `dlopen` maps it: a truncated library
/// (one cargo is still writing) passes dlopen's own checks and then dies with SIGBUS when the
/// loader touches a page past the end of the file. Checked: the ELF header, the program and section
/// header tables, and every loadable segment's file range lie within the file. Files that are not
/// ELF are left to dlopen, which refuses them cleanly.
pub(super) fn check_elf(path: &Path) -> Result<(), LoadError> {
    use std::io::{Read, Seek, SeekFrom};
    let bad = |why: String| {
        LoadError::new(
            LoadErrorKind::NotAPlugin,
            format!("{} is not a complete shared library: {why}", path.display()),
            "rebuild it (`cargo build --release`) and wait for the build to finish before loading it",
        )
    };
    let mut f = std::fs::File::open(path).map_err(|e| bad(e.to_string()))?;
    let size = f.metadata().map_err(|e| bad(e.to_string()))?.len();
    let mut ident = [0u8; 64];
    let n = f.read(&mut ident).map_err(|e| bad(e.to_string()))?;
    if n < 4 || &ident[..4] != b"\x7fELF" {
        return Ok(());
    }
    let wide = match ident.get(4) {
        Some(1) => false,
        Some(2) => true,
        _ => return Err(bad("unknown ELF class".into())),
    };
    let header_len = if wide { 64 } else { 52 };
    if n < header_len {
        return Err(bad(format!("the file ends inside the ELF header ({size} bytes)")));
    }
    let little = match ident[5] {
        1 => true,
        2 => false,
        _ => return Err(bad("unknown ELF byte order".into())),
    };
    let uint = |b: &[u8]| -> u64 {
        let mut v = 0u64;
        for (i, &x) in b.iter().enumerate() {
            let shift = 8 * if little { i } else { b.len() - 1 - i };
            v |= u64::from(x) << shift;
        }
        v
    };
    // (offset, entry size, count) of the program and the section header tables.
    let (ph, sh) = if wide {
        (
            (uint(&ident[32..40]), uint(&ident[54..56]), uint(&ident[56..58])),
            (uint(&ident[40..48]), uint(&ident[58..60]), uint(&ident[60..62])),
        )
    } else {
        (
            (uint(&ident[28..32]), uint(&ident[42..44]), uint(&ident[44..46])),
            (uint(&ident[32..36]), uint(&ident[46..48]), uint(&ident[48..50])),
        )
    };
    let within = |what: &str, offset: u64, len: u64| -> Result<(), LoadError> {
        match offset.checked_add(len) {
            Some(end) if end <= size => Ok(()),
            _ => Err(bad(format!(
                "its {what} (bytes {offset}..{}) lies past the end of the file ({size} bytes)",
                offset.saturating_add(len)
            ))),
        }
    };
    within("program header table", ph.0, ph.1.saturating_mul(ph.2))?;
    within("section header table", sh.0, sh.1.saturating_mul(sh.2))?;
    // Loadable segments: the ranges dlopen maps from the file.
    // Both fit in usize: the table lies within the file, checked above.
    let entry = usize::try_from(ph.1).map_err(|_| bad("program header entries are too large".into()))?;
    if ph.2 > 0 && entry < if wide { 56 } else { 32 } {
        return Err(bad("program header entries are too small".into()));
    }
    let mut table = vec![0u8; usize::try_from(ph.1 * ph.2).map_err(|_| bad("program header table too large".into()))?];
    f.seek(SeekFrom::Start(ph.0)).and_then(|_| f.read_exact(&mut table)).map_err(|e| bad(e.to_string()))?;
    for (i, e) in table.chunks_exact(entry).enumerate() {
        const PT_LOAD: u64 = 1;
        if uint(&e[0..4]) != PT_LOAD {
            continue;
        }
        let (offset, filesz) =
            if wide { (uint(&e[8..16]), uint(&e[32..40])) } else { (uint(&e[4..8]), uint(&e[16..20])) };
        within(&format!("loadable segment {i}"), offset, filesz)?;
    }
    Ok(())
}

/// abi_stable's loading errors in the user's terms.
pub(super) fn translate(path: &Path, e: LibraryError) -> LoadError {
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

/// The last `n` non-empty lines of a long message (abi_stable's layout dumps run to 1,000+ lines).
fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().map(str::trim_end).filter(|l| !l.trim().is_empty()).collect();
    let start = lines.len().saturating_sub(n);
    lines[start..].join("\n    ")
}
