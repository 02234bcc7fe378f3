//! The layers hold: no module circles in any crate of the workspace, and a simulator core that
//! builds without async, HTTP, plotting or a CLI.
//!
//! A module circle is two sibling modules (children of one parent, at any depth) that reach each
//! other through their `use` lines and paths (`crate::…`, `super::…`, `self::…`, also inside
//! macro calls), directly or round a longer loop. A module's use of its own parent or child does
//! not count: the parent holds the child. Test code (`#[cfg(test)]` items and modules) is left
//! out: a lower layer's tests may drive it through a higher one.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use syn::visit::Visit;

use crate::common::workspace as repo_root;

/// Every library crate's source root, relative to the repository.
const CRATES: &[&str] = &["policy-api/src", "policies/src", "core/src", "serve/src", "host/src"];

type ModPath = Vec<String>;

/// A reference from one module to another: where it was written and the path as written.
#[derive(Clone, Debug)]
struct Edge {
    from: ModPath,
    file: PathBuf,
    written: String,
}

fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.meta.require_list().is_ok_and(|l| l.tokens.to_string().split_whitespace().any(|t| t == "test"))
    })
}

/// Paths (as segment lists, first segment `crate`, `super` or `self`) written in one module.
#[derive(Default)]
struct Refs {
    paths: Vec<Vec<String>>,
}

impl Refs {
    fn push(&mut self, segs: Vec<String>) {
        if matches!(segs.first().map(String::as_str), Some("crate" | "super" | "self")) {
            self.paths.push(segs);
        }
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => self.push(prefix.iter().cloned().chain([n.ident.to_string()]).collect()),
            syn::UseTree::Rename(r) => self.push(prefix.iter().cloned().chain([r.ident.to_string()]).collect()),
            syn::UseTree::Glob(_) => self.push(prefix.clone()),
            syn::UseTree::Group(g) => g.items.iter().for_each(|t| self.use_tree(prefix, t)),
        }
    }

    /// `crate :: a :: b` runs inside a macro call's tokens.
    fn tokens(&mut self, tokens: proc_macro2::TokenStream) {
        let toks: Vec<proc_macro2::TokenTree> = tokens.into_iter().collect();
        let ident = |t: &proc_macro2::TokenTree| match t {
            proc_macro2::TokenTree::Ident(i) => Some(i.to_string()),
            _ => None,
        };
        let colon = |t: Option<&proc_macro2::TokenTree>| matches!(t, Some(proc_macro2::TokenTree::Punct(p)) if p.as_char() == ':');
        let mut i = 0;
        while i < toks.len() {
            if let proc_macro2::TokenTree::Group(g) = &toks[i] {
                self.tokens(g.stream());
            }
            if let Some(first) = ident(&toks[i]).filter(|s| matches!(s.as_str(), "crate" | "super" | "self")) {
                let mut segs = vec![first];
                let mut j = i + 1;
                while colon(toks.get(j)) && colon(toks.get(j + 1)) {
                    match toks.get(j + 2).and_then(ident) {
                        Some(s) => segs.push(s),
                        None => break,
                    }
                    j += 3;
                }
                if segs.len() > 1 {
                    self.push(segs);
                }
                i = j.max(i + 1);
                continue;
            }
            i += 1;
        }
    }
}

impl<'ast> Visit<'ast> for Refs {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs: &[syn::Attribute] = match item {
            syn::Item::Fn(i) => &i.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Use(i) => &i.attrs,
            syn::Item::Const(i) => &i.attrs,
            syn::Item::Static(i) => &i.attrs,
            syn::Item::Struct(i) => &i.attrs,
            syn::Item::Enum(i) => &i.attrs,
            syn::Item::Trait(i) => &i.attrs,
            syn::Item::Macro(i) => &i.attrs,
            _ => &[],
        };
        if is_cfg_test(attrs) {
            return;
        }
        match item {
            // Nested modules are walked as modules of their own.
            syn::Item::Mod(_) => {}
            syn::Item::Use(u) => self.use_tree(&mut Vec::new(), &u.tree),
            _ => syn::visit::visit_item(self, item),
        }
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if !is_cfg_test(&f.attrs) {
            syn::visit::visit_impl_item_fn(self, f);
        }
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        self.push(p.segments.iter().map(|s| s.ident.to_string()).collect());
        syn::visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.tokens(m.tokens.clone());
        syn::visit::visit_macro(self, m);
    }
}

/// One crate's modules: path → (file, the paths written in it).
struct Crate {
    modules: BTreeMap<ModPath, (PathBuf, Vec<Vec<String>>)>,
}

fn walk_items(krate: &mut Crate, module: ModPath, file: &Path, dir: &Path, items: &[syn::Item]) {
    let mut refs = Refs::default();
    for item in items {
        refs.visit_item(item);
    }
    krate.modules.insert(module.clone(), (file.to_path_buf(), refs.paths));
    for item in items {
        let syn::Item::Mod(m) = item else { continue };
        if is_cfg_test(&m.attrs) {
            continue;
        }
        let name = m.ident.to_string();
        let child: ModPath = module.iter().cloned().chain([name.clone()]).collect();
        match &m.content {
            Some((_, inner)) => walk_items(krate, child, file, &dir.join(&name), inner),
            None => {
                let (f, d) = if dir.join(format!("{name}.rs")).exists() {
                    (dir.join(format!("{name}.rs")), dir.join(&name))
                } else {
                    (dir.join(&name).join("mod.rs"), dir.join(&name))
                };
                walk_file(krate, child, &f, &d);
            }
        }
    }
}

fn walk_file(krate: &mut Crate, module: ModPath, file: &Path, dir: &Path) {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    walk_items(krate, module, file, dir, &ast.items);
}

fn read_crate(src: &Path) -> Crate {
    let mut krate = Crate { modules: BTreeMap::new() };
    walk_file(&mut krate, Vec::new(), &src.join("lib.rs"), src);
    krate
}

/// The module a written path lands in (its longest known module prefix), if any.
fn resolve(krate: &Crate, at: &ModPath, segs: &[String]) -> Option<ModPath> {
    let mut base: ModPath = if segs[0] == "crate" { Vec::new() } else { at.clone() };
    let mut rest = &segs[1..];
    if segs[0] == "super" {
        base.pop()?;
        while rest.first().is_some_and(|s| s == "super") {
            base.pop()?;
            rest = &rest[1..];
        }
    }
    for s in rest {
        let mut next = base.clone();
        next.push(s.clone());
        if !krate.modules.contains_key(&next) {
            break;
        }
        base = next;
    }
    Some(base)
}

/// Edges between siblings: for `from` → `to`, the children of their common parent they sit in.
fn sibling_edges(krate: &Crate, src: &Path) -> BTreeMap<ModPath, Vec<(String, String, Edge)>> {
    let mut out: BTreeMap<ModPath, Vec<(String, String, Edge)>> = BTreeMap::new();
    for (module, (file, paths)) in &krate.modules {
        for segs in paths {
            let Some(to) = resolve(krate, module, segs) else { continue };
            let common = module.iter().zip(&to).take_while(|(a, b)| a == b).count();
            if common == module.len() || common == to.len() {
                continue; // the same module, its parent or its child
            }
            let edge = Edge {
                from: module.clone(),
                file: file.strip_prefix(src).unwrap_or(file).to_path_buf(),
                written: segs.join("::"),
            };
            out.entry(module[..common].to_vec()).or_default().push((module[common].clone(), to[common].clone(), edge));
        }
    }
    out
}

/// A cycle in a directed graph, as its nodes in order, if there is one.
fn find_cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn dfs(
        n: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(n.to_string(), 1);
        stack.push(n.to_string());
        for m in edges.get(n).into_iter().flatten() {
            match state.get(m.as_str()).copied().unwrap_or(0) {
                1 => {
                    let at = stack.iter().position(|s| s == m).expect("on the stack");
                    return Some(stack[at..].to_vec());
                }
                0 => {
                    if let Some(c) = dfs(m, edges, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(n.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in edges.keys() {
        if state.get(n.as_str()).copied().unwrap_or(0) == 0
            && let Some(c) = dfs(n, edges, &mut state, &mut Vec::new())
        {
            return Some(c);
        }
    }
    None
}

/// Every circle among sibling modules of the crate at `src`, described for a reader.
fn circles(src: &Path) -> Vec<String> {
    let krate = read_crate(src);
    let mut found = Vec::new();
    for (parent, edges) in sibling_edges(&krate, src) {
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b, _) in &edges {
            graph.entry(a.clone()).or_default().insert(b.clone());
        }
        if let Some(cycle) = find_cycle(&graph) {
            let mut text = format!(
                "{}: modules under `{}` form a circle:",
                src.display(),
                if parent.is_empty() { "crate".into() } else { parent.join("::") }
            );
            for (i, a) in cycle.iter().enumerate() {
                let b = &cycle[(i + 1) % cycle.len()];
                let e = &edges.iter().find(|(x, y, _)| x == a && y == b).expect("an edge of the cycle").2;
                text.push_str(&format!(
                    "\n  {a} → {b}: `{}` in {} (module {})",
                    e.written,
                    e.file.display(),
                    e.from.join("::")
                ));
            }
            found.push(text);
        }
    }
    found
}

#[test]
fn no_crate_has_module_circles() {
    let root = repo_root();
    let all: Vec<String> = CRATES.iter().flat_map(|c| circles(&root.join(c))).collect();
    assert!(all.is_empty(), "module circles (break each by moving the shared piece down a layer):\n{}", all.join("\n"));
}

/// The checker finds a circle where there is one: two sibling modules that use each other,
/// through a `use` line on one side and a path inside a macro call on the other.
#[test]
fn the_circle_check_sees_a_circle() {
    let dir = crate::common::fixture("layers", "circle");
    let _ = std::fs::remove_dir_all(&dir);
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("b")).unwrap();
    std::fs::write(src.join("lib.rs"), "pub mod a;\npub mod b;\n#[cfg(test)]\nmod tests;\n").unwrap();
    std::fs::write(src.join("a.rs"), "use crate::b::inner::Thing;\npub struct A;\n").unwrap();
    std::fs::write(src.join("b/mod.rs"), "pub mod inner;\n").unwrap();
    std::fs::write(src.join("b/inner.rs"), "pub struct Thing;\nfn f() { let _ = vec![crate::a::A]; }\n").unwrap();
    let found = circles(&src);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("a → b") && found[0].contains("b → a"), "{}", found[0]);
    // Test code does not count, and neither does a child using its parent.
    std::fs::write(
        src.join("b/inner.rs"),
        "pub struct Thing;\nuse super::super::b as _;\n#[cfg(test)]\nfn f() { let _ = crate::a::A; }\n",
    )
    .unwrap();
    assert!(circles(&src).is_empty());
}

/// `cargo tree` of the core crate names none of the server, plotting or CLI crates.
#[test]
fn the_core_builds_without_async_http_plots_or_cli() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(repo_root())
        .args(["tree", "-p", "routelab-core", "-e", "normal,build", "--prefix", "none", "--format", "{p}"])
        .output()
        .expect("cargo tree runs");
    assert!(out.status.success(), "cargo tree: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let names: BTreeSet<&str> = text.lines().filter_map(|l| l.split_whitespace().next()).collect();
    assert!(names.contains("routelab-policy-api"), "the tree was read: {names:?}");
    for banned in ["tokio", "hyper", "hyper-util", "plotters", "clap", "comfy-table", "indicatif"] {
        assert!(!names.contains(banned), "routelab-core depends on {banned}:\n{text}");
    }
}
