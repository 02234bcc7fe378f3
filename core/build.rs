//! Embeds `workloads/` (the YAML files and the traces they replay, with their licences) into the
//! binary, so an installed `routelab` finds its built-in workloads from any directory.
//! Writes `$OUT_DIR/builtin_files.rs`: `FILES` (path under workloads/, bytes) and `FILES_HASH`.

use std::path::{Path, PathBuf};

/// Files shipped in workloads/ that the simulator reads (YAML, CSV and JSONL traces, measured runs) or
/// that must travel with them (licence and attribution).
fn embedded(path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    name.ends_with(".yaml")
        || name.ends_with(".csv")
        || name.ends_with(".jsonl")
        || name.ends_with(".json")
        || name.ends_with(".txt")
        || name == "README.md"
        || name == "LICENSE"
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> =
        std::fs::read_dir(dir).expect("workloads/ is readable").map(|e| e.expect("entry").path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            println!("cargo:rerun-if-changed={}", p.display());
            walk(&p, out);
        } else if embedded(&p) {
            out.push(p);
        }
    }
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../workloads");
    let root = root.canonicalize().expect("the workloads/ folder beside core/");
    println!("cargo:rerun-if-changed={}", root.display());
    let mut files = Vec::new();
    walk(&root, &mut files);
    // FNV-1a over names and contents: the extraction folder changes whenever a file does.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut fnv = |bytes: &[u8]| {
        for b in bytes {
            hash ^= u64::from(*b);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    };
    let mut code = String::from(
        "/// Every embedded file: (path under workloads/, with `/` separators; contents).\npub static FILES: &[(&str, &[u8])] = &[\n",
    );
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
        let rel = f
            .strip_prefix(&root)
            .expect("under root")
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join("/");
        fnv(rel.as_bytes());
        fnv(&std::fs::read(f).expect("readable"));
        code.push_str(&format!("    ({rel:?}, include_bytes!({:?})),\n", f.display().to_string()));
    }
    code.push_str("];\n");
    code.push_str(&format!(
        "/// A hash of the embedded files' names and contents.\npub const FILES_HASH: u64 = {hash:#x};\n"
    ));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("builtin_files.rs");
    std::fs::write(out, code).expect("OUT_DIR is writable");
}
