//! The shape of the host's code, checked: the module graph of `host/src`
//! has no cycles, and `docs/architecture.md` draws it as it is.
//!
//! Every file is parsed with `syn`; every path it names (`use` trees,
//! qualified paths, paths inside macro calls; `crate::`, `super::`,
//! `self::` and a child module's bare name alike) is resolved to the module
//! that defines the item, following `pub use` re-exports. So is every
//! method call on `self`, on a field of `self` and through `Self::`: to the
//! module whose `impl` block defines that method, so that the `impl Guard`
//! blocks of different files depend on each other as their calls do. A
//! reference from anywhere inside module `a` to anything inside its sibling
//! `b` is an edge `a → b` among the children of their common parent; at
//! every level of the tree those edges must form no cycle. A module using
//! its parent or its own children is not an edge (that is how a module and
//! its parts speak). Test-only code (`#[cfg(test)]`) is left out: it is
//! not architecture. Method calls on other receivers (a local, a
//! parameter) are not resolved: the checker has no types.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use syn::visit::Visit;

/// One module of the crate: its path from the root, and what it declares.
#[derive(Default)]
struct Module {
    file: PathBuf,
    children: BTreeSet<String>,
    /// `pub use` names: exported name → the absolute path it stands for.
    reexports: BTreeMap<String, Vec<String>>,
    /// Absolute paths named by the module's code, with how they were written.
    references: Vec<(Vec<String>, String)>,
    /// Methods its inherent `impl` blocks define, as (type, method).
    methods: BTreeSet<(String, String)>,
    /// Methods its code calls on a type it knows (`self`, a field of
    /// `self`, `Self::`), as (type, method, as written).
    calls: Vec<(String, String, String)>,
    /// Its structs' fields: (struct, field) → the type they hold.
    fields: BTreeMap<(String, String), String>,
}

type Tree = BTreeMap<Vec<String>, Module>;

fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| a.path().is_ident("cfg") && a.meta.require_list().is_ok_and(|l| l.tokens.to_string() == "test"))
}

/// Loads the module at `path` from `file`, then its children.
fn load(tree: &mut Tree, path: Vec<String>, file: &Path) {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let parsed = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    // Where this file's children live: beside lib.rs/mod.rs, or in a folder named after it.
    let own_dir = match file.file_name().and_then(|n| n.to_str()) {
        Some("lib.rs" | "mod.rs") => file.parent().unwrap().to_path_buf(),
        _ => file.with_extension(""),
    };
    let mut module = Module { file: file.to_path_buf(), ..Module::default() };
    let mut inline = Vec::new();
    // Its child modules first: a path may start with one's bare name.
    let declared: BTreeSet<String> = parsed
        .items
        .iter()
        .filter_map(|i| match i {
            syn::Item::Mod(m) if !is_test(&m.attrs) => Some(m.ident.to_string()),
            _ => None,
        })
        .collect();
    let mut visitor = Collector { at: &path, children: &declared, impl_ty: None, out: &mut module.references, calls: Vec::new() };
    for item in &parsed.items {
        if item_is_test(item) {
            continue;
        }
        match item {
            syn::Item::Mod(m) if m.content.is_none() => {
                module.children.insert(m.ident.to_string());
            }
            syn::Item::Mod(m) => inline.push(m),
            syn::Item::Use(u) => {
                let mut leaves = Vec::new();
                use_leaves(&u.tree, Vec::new(), &mut leaves);
                for (segments, name) in leaves {
                    let absolute = absolute(&path, &declared, &segments);
                    let public = !matches!(u.vis, syn::Visibility::Inherited);
                    match (&absolute, name) {
                        (Some(abs), Some(name)) if public => {
                            module.reexports.insert(name, abs.clone());
                        }
                        // `pub use other_crate as name;`: a module of its own here (another
                        // crate cannot name this one, so it has no edges back).
                        (None, Some(name)) if public && segments.len() == 1 => {
                            module.children.insert(name.clone());
                            tree.insert([path.clone(), vec![name]].concat(), Module { file: file.to_path_buf(), ..Module::default() });
                        }
                        _ => {}
                    }
                    if let Some(abs) = absolute {
                        visitor.out.push((abs, segments.join("::")));
                    }
                }
            }
            syn::Item::Impl(i) if i.trait_.is_none() => {
                if let Some(ty) = type_name(&i.self_ty) {
                    for f in &i.items {
                        if let syn::ImplItem::Fn(f) = f
                            && !is_test(&f.attrs)
                        {
                            module.methods.insert((ty.clone(), f.sig.ident.to_string()));
                        }
                    }
                }
                visitor.visit_item(item);
            }
            syn::Item::Struct(st) => {
                for field in &st.fields {
                    if let (Some(name), Some(ty)) = (&field.ident, type_name(&field.ty)) {
                        module.fields.insert((st.ident.to_string(), name.to_string()), ty);
                    }
                }
            }
            other => visitor.visit_item(other),
        }
    }
    module.calls = std::mem::take(&mut visitor.calls);
    for m in inline {
        // An inline module (rare outside tests) counts as part of this one.
        module.children.insert(m.ident.to_string());
        let mut child = path.clone();
        child.push(m.ident.to_string());
        let mut sub = Module { file: file.to_path_buf(), ..Module::default() };
        let none = BTreeSet::new();
        let mut v = Collector { at: &child, children: &none, impl_ty: None, out: &mut sub.references, calls: Vec::new() };
        for item in m.content.iter().flat_map(|(_, items)| items) {
            v.visit_item(item);
        }
        sub.calls = v.calls;
        tree.insert(child, sub);
    }
    let children: Vec<String> = module.children.iter().filter(|c| !tree.contains_key(&[path.clone(), vec![(*c).clone()]].concat())).cloned().collect();
    tree.insert(path.clone(), module);
    for child in children {
        let (flat, nested) = (own_dir.join(format!("{child}.rs")), own_dir.join(&child).join("mod.rs"));
        let child_file = if flat.exists() { flat } else { nested };
        let mut child_path = path.clone();
        child_path.push(child);
        load(tree, child_path, &child_file);
    }
}

fn item_is_test(item: &syn::Item) -> bool {
    match item {
        syn::Item::Mod(m) => is_test(&m.attrs),
        syn::Item::Use(u) => is_test(&u.attrs),
        syn::Item::Fn(f) => is_test(&f.attrs),
        syn::Item::Impl(i) => is_test(&i.attrs),
        syn::Item::Struct(s) => is_test(&s.attrs),
        syn::Item::Enum(e) => is_test(&e.attrs),
        syn::Item::Const(c) => is_test(&c.attrs),
        syn::Item::Static(s) => is_test(&s.attrs),
        syn::Item::Trait(t) => is_test(&t.attrs),
        syn::Item::Macro(m) => is_test(&m.attrs),
        _ => false,
    }
}

/// The leaves of a `use` tree: each full path, and the name it binds (if any).
fn use_leaves(tree: &syn::UseTree, prefix: Vec<String>, out: &mut Vec<(Vec<String>, Option<String>)>) {
    let with = |s: String| [prefix.clone(), vec![s]].concat();
    match tree {
        syn::UseTree::Path(p) => use_leaves(&p.tree, with(p.ident.to_string()), out),
        syn::UseTree::Name(n) if n.ident == "self" => out.push((prefix.clone(), prefix.last().cloned())),
        syn::UseTree::Name(n) => out.push((with(n.ident.to_string()), Some(n.ident.to_string()))),
        syn::UseTree::Rename(r) => out.push((with(r.ident.to_string()), Some(r.rename.to_string()))),
        syn::UseTree::Glob(_) => out.push((prefix, None)),
        syn::UseTree::Group(g) => g.items.iter().for_each(|t| use_leaves(t, prefix.clone(), out)),
    }
}

/// `segments` as written in module `at` (whose child modules are
/// `children`), made absolute, if it names something of this crate
/// (`crate::`, `super::`, `self::`, or a child module by its bare name).
fn absolute(at: &[String], children: &BTreeSet<String>, segments: &[String]) -> Option<Vec<String>> {
    let mut base = at.to_vec();
    let mut rest = segments;
    match rest.first().map(String::as_str) {
        Some("crate") => {
            base.clear();
            rest = &rest[1..];
        }
        Some("self") => rest = &rest[1..],
        Some("super") => {
            while rest.first().map(String::as_str) == Some("super") {
                base.pop()?;
                rest = &rest[1..];
            }
        }
        Some(child) if children.contains(child) => {}
        _ => return None,
    }
    Some([base, rest.to_vec()].concat())
}

/// The name of the type `ty` holds, looking through references, smart
/// pointers and `Option` (`&Arc<Guard>` → `Guard`).
fn type_name(ty: &syn::Type) -> Option<String> {
    match ty {
        syn::Type::Reference(r) => type_name(&r.elem),
        syn::Type::Paren(p) => type_name(&p.elem),
        syn::Type::Path(p) => {
            let last = p.path.segments.last()?;
            let wrapper = matches!(last.ident.to_string().as_str(), "Arc" | "Rc" | "Box" | "Option" | "Mutex" | "RwLock" | "OnceLock" | "OnceCell");
            match (&last.arguments, wrapper) {
                (syn::PathArguments::AngleBracketed(args), true) => args.args.iter().find_map(|a| match a {
                    syn::GenericArgument::Type(t) => type_name(t),
                    _ => None,
                }),
                _ => Some(last.ident.to_string()),
            }
        }
        _ => None,
    }
}

/// Collects the crate paths a module's items name, and the methods its
/// code calls on a receiver whose type it knows.
struct Collector<'a> {
    at: &'a [String],
    children: &'a BTreeSet<String>,
    /// The type of the `impl` block being read, if any.
    impl_ty: Option<String>,
    out: &'a mut Vec<(Vec<String>, String)>,
    /// (type, method, as written) for `self.m()`, `Self::m()`;
    /// (`field@Type`, method, as written) for `self.field.m()`, resolved
    /// once every struct is known.
    calls: Vec<(String, String, String)>,
}

/// Whether `e` is the path `self`.
fn is_self(e: &syn::Expr) -> bool {
    matches!(e, syn::Expr::Path(p) if p.path.is_ident("self"))
}

impl<'ast> Visit<'ast> for Collector<'_> {
    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segments: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        if let Some(abs) = absolute(self.at, self.children, &segments) {
            self.out.push((abs, segments.join("::")));
        }
        if let (Some(ty), [first, method]) = (&self.impl_ty, segments.as_slice())
            && first == "Self"
        {
            self.calls.push((ty.clone(), method.clone(), format!("Self::{method}")));
        }
        syn::visit::visit_path(self, p);
    }

    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        if is_test(&i.attrs) {
            return;
        }
        let outer = std::mem::replace(&mut self.impl_ty, type_name(&i.self_ty));
        syn::visit::visit_item_impl(self, i);
        self.impl_ty = outer;
    }

    fn visit_expr_method_call(&mut self, call: &'ast syn::ExprMethodCall) {
        if let Some(ty) = &self.impl_ty {
            let method = call.method.to_string();
            match &*call.receiver {
                r if is_self(r) => self.calls.push((ty.clone(), method.clone(), format!("self.{method}()"))),
                syn::Expr::Field(f) if is_self(&f.base) => {
                    if let syn::Member::Named(field) = &f.member {
                        self.calls.push((format!("{field}@{ty}"), method.clone(), format!("self.{field}.{method}()")));
                    }
                }
                _ => {}
            }
        }
        syn::visit::visit_expr_method_call(self, call);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        // Paths inside a macro call (`json!`, `format!`) are tokens, not syntax.
        let tokens: Vec<proc_macro2::TokenTree> = flatten(m.tokens.clone());
        for (i, t) in tokens.iter().enumerate() {
            let proc_macro2::TokenTree::Ident(start) = t else { continue };
            if !matches!(start.to_string().as_str(), "crate" | "super") {
                continue;
            }
            let mut segments = vec![start.to_string()];
            let mut j = i + 1;
            while let (Some(proc_macro2::TokenTree::Punct(a)), Some(proc_macro2::TokenTree::Punct(b)), Some(proc_macro2::TokenTree::Ident(next))) =
                (tokens.get(j), tokens.get(j + 1), tokens.get(j + 2))
            {
                if a.as_char() != ':' || b.as_char() != ':' {
                    break;
                }
                segments.push(next.to_string());
                j += 3;
            }
            if let Some(abs) = absolute(self.at, self.children, &segments) {
                self.out.push((abs, segments.join("::")));
            }
        }
        syn::visit::visit_macro(self, m);
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if !is_test(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if !is_test(&f.attrs) {
            syn::visit::visit_impl_item_fn(self, f);
        }
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if !is_test(&f.attrs) {
            syn::visit::visit_item_fn(self, f);
        }
    }
}

fn flatten(stream: proc_macro2::TokenStream) -> Vec<proc_macro2::TokenTree> {
    let mut out = Vec::new();
    for t in stream {
        match t {
            proc_macro2::TokenTree::Group(g) => out.extend(flatten(g.stream())),
            other => out.push(other),
        }
    }
    out
}

/// The module that defines what `path` names: down the tree through child
/// modules, through `pub use` re-exports, stopping at the first item.
fn resolve(tree: &Tree, path: &[String], depth: u32) -> Vec<String> {
    let mut at: Vec<String> = Vec::new();
    for (i, segment) in path.iter().enumerate() {
        let Some(module) = tree.get(&at) else { return at };
        if module.children.contains(segment) {
            at.push(segment.clone());
        } else if let Some(target) = module.reexports.get(segment).filter(|_| depth < 8) {
            let rest = &path[i + 1..];
            return resolve(tree, &[target.clone(), rest.to_vec()].concat(), depth + 1);
        } else {
            return at;
        }
    }
    at
}

/// The modules that define method `method` of type `ty` in an inherent
/// `impl` block; for `field@Type`, of the type that field of `Type` holds.
fn method_homes(tree: &Tree, ty: &str, method: &str) -> Vec<Vec<String>> {
    let ty = match ty.split_once('@') {
        Some((field, owner)) => match tree.values().find_map(|m| m.fields.get(&(owner.to_string(), field.to_string()))) {
            Some(held) => held.clone(),
            None => return Vec::new(),
        },
        None => ty.to_string(),
    };
    let key = (ty, method.to_string());
    tree.iter().filter(|(_, m)| m.methods.contains(&key)).map(|(path, _)| path.clone()).collect()
}

/// The edges among siblings: (parent, from, to) → examples of references.
fn edges(tree: &Tree) -> BTreeMap<(Vec<String>, String, String), Vec<String>> {
    let mut edges: BTreeMap<(Vec<String>, String, String), Vec<String>> = BTreeMap::new();
    for (from, module) in tree {
        let paths = module.references.iter().map(|(path, written)| (resolve(tree, path, 0), written.clone()));
        let calls = module.calls.iter().flat_map(|(ty, method, written)| method_homes(tree, ty, method).into_iter().map(move |home| (home, written.clone())));
        for (to, written) in paths.chain(calls) {
            let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
            if common < from.len() && common < to.len() {
                let key = (from[..common].to_vec(), from[common].clone(), to[common].clone());
                let example = format!("{}: {written}", module.file.display());
                let examples = edges.entry(key).or_default();
                if examples.len() < 3 && !examples.contains(&example) {
                    examples.push(example);
                }
            }
        }
    }
    edges
}

/// A cycle among `nodes` under `next`, if there is one.
fn find_cycle(nodes: &BTreeSet<String>, next: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(n: &str, next: &BTreeMap<String, BTreeSet<String>>, state: &mut BTreeMap<String, u8>, stack: &mut Vec<String>) -> Option<Vec<String>> {
        state.insert(n.to_string(), 1);
        stack.push(n.to_string());
        for m in next.get(n).into_iter().flatten() {
            match state.get(m).copied().unwrap_or(0) {
                1 => {
                    let start = stack.iter().position(|s| s == m).unwrap();
                    return Some([&stack[start..], std::slice::from_ref(m)].concat());
                }
                0 => {
                    if let Some(c) = visit(m, next, state, stack) {
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
    nodes.iter().find_map(|n| if state.contains_key(n) { None } else { visit(n, next, &mut state, &mut Vec::new()) })
}

fn host_tree() -> Tree {
    crate_tree(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
}

/// The ledger's own crate (`host/ledger`).
fn ledger_tree() -> Tree {
    crate_tree(&Path::new(env!("CARGO_MANIFEST_DIR")).join("ledger/src"))
}

fn crate_tree(src: &Path) -> Tree {
    let mut tree = Tree::new();
    load(&mut tree, Vec::new(), &src.join("lib.rs"));
    tree
}

/// Every cycle among sibling modules, each with the references that make it.
fn cycles(tree: &Tree) -> Vec<String> {
    let edges = edges(tree);
    let mut by_parent: BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (parent, from, to) in edges.keys() {
        by_parent.entry(parent.clone()).or_default().entry(from.clone()).or_default().insert(to.clone());
    }
    let mut found = Vec::new();
    for (parent, mut next) in by_parent {
        // Report every cycle: remove one edge of each found and look again.
        loop {
            let nodes: BTreeSet<String> = next.keys().cloned().collect();
            let Some(cycle) = find_cycle(&nodes, &next) else { break };
            let at = if parent.is_empty() { "crate".to_string() } else { format!("crate::{}", parent.join("::")) };
            let mut text = format!("in {at}: {}", cycle.join(" → "));
            for pair in cycle.windows(2) {
                for e in &edges[&(parent.clone(), pair[0].clone(), pair[1].clone())] {
                    text.push_str(&format!("\n    {} → {}: {e}", pair[0], pair[1]));
                }
            }
            found.push(text);
            next.get_mut(&cycle[0]).unwrap().remove(&cycle[1]);
        }
    }
    found
}

#[test]
fn the_host_modules_form_no_cycle() {
    let tree = host_tree();
    assert!(tree.len() > 40, "the module tree was not read: {} modules", tree.len());
    let found = cycles(&tree);
    assert!(found.is_empty(), "{} module cycle(s) in host/src:\n{}", found.len(), found.join("\n"));
    let ledger = ledger_tree();
    assert!(ledger.len() > 15, "the ledger's module tree was not read: {} modules", ledger.len());
    let found = cycles(&ledger);
    assert!(found.is_empty(), "{} module cycle(s) in host/ledger/src:\n{}", found.len(), found.join("\n"));
}

/// The top-level modules `module` names, and for each one reference that does.
fn uses_of(tree: &Tree, module: &str) -> BTreeMap<String, String> {
    edges(tree)
        .into_iter()
        .filter(|((parent, from, _), _)| parent.is_empty() && from == module)
        .map(|((_, _, to), examples)| (to, examples[0].clone()))
        .collect()
}

#[test]
fn the_guard_needs_only_the_ledger_the_policy_the_network_and_leaves_and_only_the_runtime_sees_the_wit() {
    let tree = host_tree();
    let allowed = ["ledger", "policy", "net", "keys", "error", "metrics", "phases"];
    let guard = uses_of(&tree, "guard");
    let beyond: Vec<_> = guard.iter().filter(|(to, _)| !allowed.contains(&to.as_str())).collect();
    assert!(beyond.is_empty(), "the guard reaches beyond {allowed:?}: {beyond:?}");
    assert!(guard.contains_key("ledger") && guard.contains_key("policy"), "{guard:?}");
    // The generated bindings of wit/plugin.wit are used inside `runtime` only.
    for (path, module) in &tree {
        if path.first().map(String::as_str) == Some("runtime") {
            continue;
        }
        let wit: Vec<_> = module.references.iter().filter(|(p, _)| resolve(&tree, p, 0).starts_with(&["runtime".into(), "bindings".into()])).collect();
        assert!(wit.is_empty(), "{} uses the plugin contract's bindings: {wit:?}", module.file.display());
    }
}

#[test]
fn the_checker_sees_a_cycle_through_a_reexport() {
    // Two siblings under `a`: `x` names `y` directly, `y` names `x` through
    // `a`'s re-export; and a third sibling only used. One cycle, x ⇄ y.
    let module = |file: &str, children: &[&str], reexports: &[(&str, &[&str])], refs: &[&[&str]]| Module {
        file: file.into(),
        children: children.iter().map(|c| c.to_string()).collect(),
        reexports: reexports.iter().map(|(n, p)| (n.to_string(), p.iter().map(|s| s.to_string()).collect())).collect(),
        references: refs.iter().map(|r| (r.iter().map(|s| s.to_string()).collect(), r.join("::"))).collect(),
        ..Module::default()
    };
    let mut tree = Tree::new();
    tree.insert(vec![], module("lib.rs", &["a"], &[], &[]));
    tree.insert(vec!["a".into()], module("a/mod.rs", &["x", "y", "z"], &[("X", &["a", "x", "X"])], &[]));
    tree.insert(vec!["a".into(), "x".into()], module("a/x.rs", &[], &[], &[&["a", "y", "f"], &["a", "z", "g"]]));
    tree.insert(vec!["a".into(), "y".into()], module("a/y.rs", &[], &[], &[&["a", "X"]]));
    tree.insert(vec!["a".into(), "z".into()], module("a/z.rs", &[], &[], &[&["a", "h"]]));
    let found = cycles(&tree);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].starts_with("in crate::a: x → y → x"), "{}", found[0]);
}

#[test]
fn the_checker_sees_a_cycle_through_method_calls_across_impl_blocks() {
    // `impl G` in two sibling files, each calling a method the other defines
    // (one on `self`, one through a field holding a `G`), and a third
    // calling a method of its own: one cycle, x ⇄ y.
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::write(src.join("lib.rs"), "mod a;\n").unwrap();
    std::fs::create_dir(src.join("a")).unwrap();
    std::fs::write(src.join("a/mod.rs"), "mod x;\nmod y;\nmod z;\npub struct G;\npub struct H { g: std::sync::Arc<G> }\n").unwrap();
    std::fs::write(src.join("a/x.rs"), "impl super::G { fn f(&self) { self.g() } }\n").unwrap();
    std::fs::write(src.join("a/y.rs"), "impl super::G { fn g(&self) {} }\nimpl super::H { fn h(&self) { self.g.f() } }\n").unwrap();
    std::fs::write(src.join("a/z.rs"), "impl super::G { fn k(&self) { Self::l(); self.k() } fn l() {} }\n").unwrap();
    let found = cycles(&crate_tree(src));
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].starts_with("in crate::a: x → y → x"), "{}", found[0]);
    assert!(found[0].contains("self.g()") && found[0].contains("self.g.f()"), "the calls are named: {}", found[0]);
}

#[test]
fn the_checker_follows_a_bare_reexport_of_a_child_module() {
    // `pub use x::X;` (no `self::`) in `a`, and `y` naming `super::X`: y → x.
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::write(src.join("lib.rs"), "mod a;\n").unwrap();
    std::fs::create_dir(src.join("a")).unwrap();
    std::fs::write(src.join("a/mod.rs"), "mod x;\nmod y;\npub use x::X;\n").unwrap();
    std::fs::write(src.join("a/x.rs"), "pub struct X;\nfn f() { let _ = super::y::Y; }\n").unwrap();
    std::fs::write(src.join("a/y.rs"), "pub struct Y;\nfn g() -> super::X { super::X }\n").unwrap();
    let found = cycles(&crate_tree(src));
    assert_eq!(found.len(), 1, "{found:?}");
}

/// Every `fn` in the files under `dir` with more than `max` parameters
/// (`self` included), as `file: name (n)`. Methods of trait impls are left
/// out: the trait sets their signature.
fn long_signatures(dir: &Path, max: usize) -> Vec<String> {
    struct Fns<'a>(&'a mut Vec<(String, usize)>);
    impl<'ast> Visit<'ast> for Fns<'_> {
        fn visit_signature(&mut self, s: &'ast syn::Signature) {
            self.0.push((s.ident.to_string(), s.inputs.len()));
        }

        fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
            if i.trait_.is_none() {
                syn::visit::visit_item_impl(self, i);
            }
        }
    }
    let mut found = Vec::new();
    for file in rust_files(dir) {
        let parsed = syn::parse_file(&std::fs::read_to_string(&file).unwrap()).unwrap();
        let mut fns = Vec::new();
        Fns(&mut fns).visit_file(&parsed);
        found.extend(fns.into_iter().filter(|(_, n)| *n > max).map(|(name, n)| format!("{}: {name} ({n})", file.display())));
    }
    found
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files.sort();
    files
}

#[test]
fn no_function_of_the_host_takes_more_than_five_parameters() {
    let host = Path::new(env!("CARGO_MANIFEST_DIR"));
    let wide = [long_signatures(&host.join("src"), 5), long_signatures(&host.join("ledger/src"), 5)].concat();
    assert!(wide.is_empty(), "functions with more than 5 parameters (use a struct):\n{}", wide.join("\n"));
}

#[test]
fn every_file_of_the_host_the_ledger_and_the_bench_is_short() {
    let host = Path::new(env!("CARGO_MANIFEST_DIR"));
    let long: Vec<String> = ["src", "ledger/src", "bench/src"]
        .iter()
        .flat_map(|dir| rust_files(&host.join(dir)))
        .filter_map(|f| {
            let lines = std::fs::read_to_string(&f).unwrap().lines().count();
            let cap = if f.ends_with(Path::new("guard").join(ONE_CONCEPT.0)) { ONE_CONCEPT.1 } else { 400 };
            (lines > cap).then(|| format!("{}: {lines} lines", f.display()))
        })
        .collect();
    assert!(long.is_empty(), "files over 400 lines (split them by concept, as the guard is):\n{}", long.join("\n"));
}

/// The one guard file allowed past the guard's 300 lines: a call in
/// progress is one concept (its state and every step that changes it), so
/// its file grows rather than split its state across files again.
const ONE_CONCEPT: (&str, usize) = ("call.rs", 460);

#[test]
fn the_guard_reads_by_protocol_step_in_short_files() {
    let guard = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/guard");
    let long: Vec<String> = rust_files(&guard)
        .into_iter()
        .filter_map(|f| {
            let lines = std::fs::read_to_string(&f).unwrap().lines().count();
            let cap = if f.ends_with(Path::new("guard").join(ONE_CONCEPT.0)) { ONE_CONCEPT.1 } else { 300 };
            (lines > cap).then(|| format!("{}: {lines} lines", f.display()))
        })
        .collect();
    assert!(long.is_empty(), "guard files over their cap:\n{}", long.join("\n"));
    // The protocol's steps, each in its own file, in the order docs/guard.md tells them.
    for step in ["admit.rs", "hold/mod.rs", "start.rs", "claim.rs", "call.rs", "drive.rs", "attempt.rs", "reconcile.rs", "finish.rs", "recover.rs"] {
        assert!(guard.join(step).exists(), "src/guard/{step} is missing");
    }
}

/// The files that name `impl CallGuard`, and the fields of `CallGuard` that
/// are not private, file by file.
fn call_guard_reach(src: &Path) -> (Vec<String>, Vec<String>) {
    let (mut impls, mut open_fields) = (Vec::new(), Vec::new());
    for f in rust_files(src) {
        let file = syn::parse_file(&std::fs::read_to_string(&f).unwrap()).unwrap();
        let name = f.strip_prefix(src).unwrap().display().to_string();
        for item in &file.items {
            match item {
                syn::Item::Impl(i) if matches!(&*i.self_ty, syn::Type::Path(p) if p.path.is_ident("CallGuard")) && i.trait_.is_none() => {
                    impls.push(name.clone())
                }
                syn::Item::Struct(st) if st.ident == "CallGuard" => {
                    for field in &st.fields {
                        if !matches!(field.vis, syn::Visibility::Inherited) {
                            open_fields.push(format!("{name}: {}", field.ident.as_ref().map_or("?".into(), ToString::to_string)));
                        }
                    }
                }
                _ => {}
            }
        }
    }
    (impls, open_fields)
}

#[test]
fn a_calls_state_is_private_to_one_file_and_its_path_is_at_most_twelve_files() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let (mut impls, open_fields) = call_guard_reach(&src.join("guard"));
    impls.dedup();
    assert_eq!(impls, ["call.rs"], "only guard/call.rs may implement CallGuard (its state is read and written there alone)");
    assert!(open_fields.is_empty(), "CallGuard's fields must be private to guard/call.rs: {open_fields:?}");
    // docs/architecture.md names the files of one guarded call; a newcomer opens at most twelve.
    let doc = std::fs::read_to_string(src.join("../../docs/architecture.md")).unwrap();
    let list = doc.split("**The files of one guarded call**").nth(1).expect("docs/architecture.md names the files of one guarded call");
    let list = list.split("\n\n").next().unwrap();
    let files: Vec<&str> = list.split('`').skip(1).step_by(2).filter(|f| f.ends_with(".rs")).collect();
    assert!((5..=12).contains(&files.len()), "the path of one guarded call names {} files (at most 12): {files:?}", files.len());
    for f in &files {
        assert!(src.join(f).exists(), "docs/architecture.md's path of a guarded call names {f}, which host/src does not have");
    }
    for step in ["guard/call.rs", "keys.rs", "guard/drive.rs", "guard/reconcile.rs"] {
        assert!(files.contains(&step), "the path of one guarded call leaves out {step}");
    }
}

/// The Rust files under `src` (relative) that contain `needle`.
fn files_containing(src: &Path, needle: &str) -> Vec<String> {
    rust_files(src)
        .into_iter()
        .filter(|f| std::fs::read_to_string(f).unwrap().contains(needle))
        .map(|f| f.strip_prefix(src).unwrap().display().to_string())
        .collect()
}

#[test]
fn every_http_client_and_its_deadlines_come_from_the_network_layer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    // One builder: TLS, proxy, redirects and every deadline set in one place.
    for (needle, home) in
        [("Client::builder", "net/http.rs"), ("tls_backend_preconfigured", "net/http.rs"), ("default_provider().install_default()", "net/tls.rs")]
    {
        assert_eq!(files_containing(&src, needle), [home], "`{needle}` belongs in {home} alone (the network layer)");
    }
    // Every deadline net/deadlines.rs names is in docs/network.md's table, and no other.
    let deadlines = std::fs::read_to_string(src.join("net/deadlines.rs")).unwrap();
    let named: BTreeSet<String> =
        deadlines.lines().filter_map(|l| l.strip_prefix("pub const ")).map(|l| l.split(':').next().unwrap().trim().to_string()).collect();
    assert!(named.len() >= 5, "{named:?}");
    let doc = std::fs::read_to_string(src.join("../../docs/network.md")).unwrap();
    let tabled: BTreeSet<String> = doc
        .lines()
        .filter(|l| l.starts_with("| "))
        .filter_map(|l| l.split('`').nth(1))
        .filter(|n| n.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
        .map(String::from)
        .collect();
    assert_eq!(named, tabled, "docs/network.md's table and net/deadlines.rs name different deadlines");
}

/// The layers of the picture in `docs/architecture.md`, top to bottom: the
/// top-level modules each line of its drawing names.
fn drawn_layers() -> Vec<Vec<String>> {
    let doc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/architecture.md")).unwrap();
    let drawing = doc.split("```").nth(1).expect("docs/architecture.md draws the modules in its first code block");
    drawing
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('│') && !l.starts_with('├'))
        .map(|l| l.split("  ").next().unwrap().split(['─', '·']).map(|m| m.trim().to_string()).filter(|m| !m.is_empty()).collect())
        .collect()
}

#[test]
fn the_architecture_picture_draws_the_module_graph() {
    let tree = host_tree();
    let layers = drawn_layers();
    let layer_of = |m: &str| layers.iter().position(|l| l.iter().any(|n| n == m));
    let top: Vec<String> = tree[&Vec::new()].children.iter().cloned().collect();
    let undrawn: Vec<&String> = top.iter().filter(|m| layer_of(m).is_none()).collect();
    assert!(undrawn.is_empty(), "modules of host/src the picture in docs/architecture.md leaves out: {undrawn:?}");
    let drawn_only: Vec<&String> = layers.iter().flatten().filter(|m| !top.contains(m)).collect();
    assert!(drawn_only.is_empty(), "the picture in docs/architecture.md draws modules host/src does not have: {drawn_only:?}");
    let upward: Vec<String> = edges(&tree)
        .into_iter()
        .filter(|((parent, from, to), _)| parent.is_empty() && layer_of(to) <= layer_of(from))
        .map(|((_, from, to), examples)| format!("{from} → {to} ({})", examples[0]))
        .collect();
    assert!(upward.is_empty(), "docs/architecture.md draws these below what they use, or beside it:\n{}", upward.join("\n"));
}

/// The files `docs/architecture.md`'s "Every file" tables list under the
/// heading of `crate_src` (`host/src`, `host/ledger/src`).
fn listed_files(crate_src: &str) -> BTreeSet<String> {
    let doc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/architecture.md")).unwrap();
    let every = doc.split("## Every file").nth(1).expect("docs/architecture.md has an \"Every file\" section");
    let table = every.split(&format!("### `{crate_src}`")).nth(1).unwrap_or_else(|| panic!("no \"### `{crate_src}`\" table in \"Every file\""));
    let table = table.split("\n### ").next().unwrap();
    table.lines().filter_map(|l| l.strip_prefix("| `")).filter_map(|l| l.split_once('`')).map(|(file, _)| file.to_string()).collect()
}

/// The Rust files under `src`, relative to it.
fn files_under(src: &Path) -> BTreeSet<String> {
    rust_files(src).iter().map(|f| f.strip_prefix(src).unwrap().to_string_lossy().replace('\\', "/")).collect()
}

#[test]
fn the_architecture_document_names_every_file_and_no_other() {
    let host = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (crate_src, dir) in [("host/src", host.join("src")), ("host/ledger/src", host.join("ledger/src"))] {
        let (listed, actual) = (listed_files(crate_src), files_under(&dir));
        let unnamed: Vec<&String> = actual.difference(&listed).collect();
        let gone: Vec<&String> = listed.difference(&actual).collect();
        assert!(unnamed.is_empty(), "files of {crate_src} docs/architecture.md's \"Every file\" does not list: {unnamed:?}");
        assert!(gone.is_empty(), "docs/architecture.md lists files {crate_src} no longer has: {gone:?}");
    }
}

/// The edges "`a` → `b`" the module picture's prose states between the
/// guard's steps (a parenthesis may stand between the two).
fn stated_guard_edges() -> Vec<(String, String)> {
    let doc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/architecture.md")).unwrap();
    let modules = doc.split("## The modules").nth(1).unwrap().split("\n## ").next().unwrap();
    let prose = modules.split("Inside the guard").nth(1).expect("the picture's prose states the guard's steps (\"Inside the guard …\")");
    let prose = prose.split("\n\n").next().unwrap().replace('\n', " ");
    // Drop parentheses (their contents are explanations, not steps), then read `x` → `y` pairs.
    let mut flat = String::new();
    let mut depth = 0;
    for c in prose.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            _ if depth == 0 => flat.push(c),
            _ => {}
        }
    }
    let mut edges = Vec::new();
    for chain in flat.split([';', ',']) {
        let names: Vec<&str> = chain.split('→').map(|p| p.trim().trim_matches('`')).collect();
        for pair in names.windows(2) {
            if pair.iter().all(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_lowercase() || c == '_')) {
                edges.push((pair[0].to_string(), pair[1].to_string()));
            }
        }
    }
    edges
}

#[test]
fn every_edge_the_architecture_document_states_between_the_guards_steps_exists() {
    let stated = stated_guard_edges();
    assert!(stated.len() >= 4, "the guard's chains were not read: {stated:?}");
    let edges = edges(&host_tree());
    let missing: Vec<String> = stated
        .iter()
        .filter(|(from, to)| !edges.contains_key(&(vec!["guard".to_string()], from.clone(), to.clone())))
        .map(|(from, to)| format!("{from} → {to}"))
        .collect();
    assert!(missing.is_empty(), "docs/architecture.md states guard edges the code does not have: {missing:?}");
}
