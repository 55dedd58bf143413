//! Modules import only downward: in every crate of the workspace, the graph
//! of `crate::`, `super::` and `self::` paths between its modules (test code
//! left out) has no cycle.
//!
//! Two views of each crate, as a layering review reads it:
//!
//! - file level: one node per module file; a strongly connected component of
//!   more than one module is a cycle;
//! - sibling level: under every parent module (and the crate root), each
//!   module is collapsed into its ancestor just below that parent, so
//!   `a::x` importing `b` while `b` imports `a::y` is a cycle between the
//!   siblings `a` and `b` even though no file imports its own importer.
//!
//! A module's imports of its own ancestors and descendants are not edges
//! (`super::*` in a child, `mod` declarations in a parent). Test code is left
//! out: files and directories named `tests` (and the fuzz entry points,
//! `fuzzing`), `#[cfg(test)] mod … { … }` blocks, and `src/bin/`. Paths are
//! read after comments and literals are removed: `crate::a::b`,
//! `super::super::x`, `self::x`, `$crate::x`, and use groups such as
//! `crate::{a, b::{c, d}}` or `crate::a::{b, c}`.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// One crate's modules: path (`""` for the crate root, `a::b`) → tokens of
/// its non-test code.
type Modules = BTreeMap<String, Vec<Tok>>;
/// Module → the modules it imports.
type Graph = BTreeMap<String, BTreeSet<String>>;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Ident(String),
    /// `::`
    Sep,
    Punct(char),
    /// A string, character or number literal (its text does not matter).
    Lit,
}

fn is_ident_start(c: char) -> bool {
    c.is_alphabetic() || c == '_'
}

fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Rust source as tokens, without comments; literals are [`Tok::Lit`].
fn lex(src: &str) -> Vec<Tok> {
    let s: Vec<char> = src.chars().collect();
    let at = |i: usize| s.get(i).copied().unwrap_or('\0');
    let mut out = Vec::new();
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '/' && at(i + 1) == '/' {
            while i < s.len() && s[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < s.len() {
                if s[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if s[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if is_ident_start(c) {
            let start = i;
            while i < s.len() && is_ident_char(s[i]) {
                i += 1;
            }
            let word: String = s[start..i].iter().collect();
            let hashes = s[i..].iter().take_while(|&&h| h == '#').count();
            if matches!(word.as_str(), "r" | "br" | "cr") && at(i + hashes) == '"' {
                // Raw string: up to `"` followed by as many `#`.
                i += hashes + 1;
                while i < s.len() && !(s[i] == '"' && (1..=hashes).all(|k| at(i + k) == '#')) {
                    i += 1;
                }
                i += hashes + 1;
                out.push(Tok::Lit);
            } else if word == "r" && hashes == 1 && is_ident_start(at(i + 1)) {
                // Raw identifier `r#name`.
                let start = i + 1;
                i = start;
                while i < s.len() && is_ident_char(s[i]) {
                    i += 1;
                }
                out.push(Tok::Ident(s[start..i].iter().collect()));
            } else if matches!(word.as_str(), "b" | "c") && at(i) == '"' {
                i = skip_quoted(&s, i, '"');
                out.push(Tok::Lit);
            } else if word == "b" && at(i) == '\'' {
                i = skip_quoted(&s, i, '\'');
                out.push(Tok::Lit);
            } else {
                out.push(Tok::Ident(word));
            }
        } else if c.is_ascii_digit() {
            while i < s.len() && is_ident_char(s[i]) {
                i += 1;
            }
            out.push(Tok::Lit);
        } else if c == '"' {
            i = skip_quoted(&s, i, '"');
            out.push(Tok::Lit);
        } else if c == '\'' && (at(i + 1) == '\\' || (at(i + 1) != '\'' && at(i + 2) == '\'')) {
            i = skip_quoted(&s, i, '\'');
            out.push(Tok::Lit);
        } else if c == ':' && at(i + 1) == ':' {
            i += 2;
            out.push(Tok::Sep);
        } else {
            // Punctuation, and the `'` of a lifetime or label.
            i += 1;
            out.push(Tok::Punct(c));
        }
    }
    out
}

/// The index after the literal that opens with `quote` at `i`.
fn skip_quoted(s: &[char], mut i: usize, quote: char) -> usize {
    i += 1;
    while i < s.len() && s[i] != quote {
        i += if s[i] == '\\' { 2 } else { 1 };
    }
    i + 1
}

/// The index after the bracket that closes the one opening at `i`.
fn skip_group(toks: &[Tok], i: usize) -> usize {
    let (open, close) = match toks[i] {
        Tok::Punct('{') => ('{', '}'),
        Tok::Punct('(') => ('(', ')'),
        Tok::Punct('[') => ('[', ']'),
        _ => return i + 1,
    };
    let mut depth = 0usize;
    let mut j = i;
    while j < toks.len() {
        if toks[j] == Tok::Punct(open) {
            depth += 1;
        } else if toks[j] == Tok::Punct(close) {
            depth -= 1;
            if depth == 0 {
                return j + 1;
            }
        }
        j += 1;
    }
    j
}

fn is_punct(toks: &[Tok], i: usize, c: char) -> bool {
    toks.get(i) == Some(&Tok::Punct(c))
}

fn is_ident(toks: &[Tok], i: usize, word: &str) -> bool {
    matches!(toks.get(i), Some(Tok::Ident(w)) if w == word)
}

/// `#[cfg(test)]` (other attributes may follow), `pub`/`pub(…)`, `mod name {`:
/// the index after the module's closing brace, if one starts at `i`.
fn test_module_end(toks: &[Tok], i: usize) -> Option<usize> {
    let attr = [
        Tok::Punct('#'),
        Tok::Punct('['),
        Tok::Ident("cfg".into()),
        Tok::Punct('('),
        Tok::Ident("test".into()),
        Tok::Punct(')'),
        Tok::Punct(']'),
    ];
    if !toks[i..].starts_with(&attr) {
        return None;
    }
    let mut j = i + attr.len();
    while is_punct(toks, j, '#') && is_punct(toks, j + 1, '[') {
        j = skip_group(toks, j + 1);
    }
    if is_ident(toks, j, "pub") {
        j += 1;
        if is_punct(toks, j, '(') {
            j = skip_group(toks, j);
        }
    }
    let named = matches!(toks.get(j + 1), Some(Tok::Ident(_)));
    (is_ident(toks, j, "mod") && named && is_punct(toks, j + 2, '{'))
        .then(|| skip_group(toks, j + 2))
}

fn strip_test_modules(toks: &[Tok]) -> Vec<Tok> {
    let mut out = Vec::with_capacity(toks.len());
    let mut i = 0;
    while i < toks.len() {
        if let Some(end) = test_module_end(toks, i) {
            i = end;
        } else {
            out.push(toks[i].clone());
            i += 1;
        }
    }
    out
}

/// A crate's non-test module files under `src`, by module path.
fn modules(src: &Path) -> Modules {
    let mut files = Vec::new();
    collect_rs(src, &mut files);
    let mut mods = Modules::new();
    for file in files {
        let rel = file.strip_prefix(src).expect("walked under src");
        let mut parts: Vec<String> = rel
            .with_extension("")
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if parts
            .last()
            .is_some_and(|p| matches!(p.as_str(), "mod" | "lib" | "main"))
        {
            parts.pop();
        }
        if parts.first().is_some_and(|p| p == "bin")
            || parts.iter().any(|p| p == "tests" || p == "fuzzing")
        {
            continue;
        }
        let text =
            fs::read_to_string(&file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
        // `lib.rs` and `main.rs` are both the root: one node.
        mods.entry(parts.join("::"))
            .or_default()
            .extend(strip_test_modules(&lex(&text)));
    }
    mods
}

fn collect_rs(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            collect_rs(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The index after the use tree starting at `i`; its paths appended to
/// `out`, each prefixed with `prefix` (segments as written, `self` and
/// `super` included).
fn use_tree(toks: &[Tok], mut i: usize, prefix: &[String], out: &mut Vec<Vec<String>>) -> usize {
    let mut path = prefix.to_vec();
    loop {
        match toks.get(i) {
            Some(Tok::Ident(w)) => {
                path.push(w.clone());
                i += 1;
            }
            Some(Tok::Punct('{')) => {
                let end = skip_group(toks, i);
                i += 1;
                while i < end - 1 {
                    if is_punct(toks, i, ',') {
                        i += 1;
                    } else {
                        // A token that starts no tree (`*`) is passed over.
                        i = use_tree(toks, i, &path, out).max(i + 1);
                    }
                }
                return end;
            }
            _ => break,
        }
        if toks.get(i) == Some(&Tok::Sep) {
            i += 1;
        } else {
            break;
        }
    }
    if is_ident(toks, i, "as") {
        i += 2;
    }
    out.push(path);
    i
}

/// Every `crate::`/`super::`/`self::` path in a module's tokens.
fn paths(toks: &[Tok]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let starts = matches!(&toks[i], Tok::Ident(w) if matches!(w.as_str(), "crate" | "super" | "self"))
            && toks.get(i + 1) == Some(&Tok::Sep)
            && (i == 0 || toks[i - 1] != Tok::Sep);
        if starts {
            i = use_tree(toks, i, &[], &mut out);
        } else {
            i += 1;
        }
    }
    out
}

/// The module a path written in module `name` names, as a full path.
fn absolute(name: &str, path: &[String]) -> Vec<String> {
    let mut full: Vec<String> = if name.is_empty() {
        Vec::new()
    } else {
        name.split("::").map(str::to_owned).collect()
    };
    let mut segments = path.iter().peekable();
    if segments.peek().is_some_and(|s| *s == "crate") {
        full.clear();
        segments.next();
    }
    for s in segments {
        match s.as_str() {
            "self" => {}
            "super" => {
                full.pop();
            }
            _ => full.push(s.clone()),
        }
    }
    full
}

fn is_within(inner: &str, outer: &str) -> bool {
    outer.is_empty() || inner.starts_with(&format!("{outer}::"))
}

/// The modules `name` imports: for each path, the longest prefix that is a
/// module, unless that is `name`, an ancestor or a descendant.
fn edges(name: &str, mods: &Modules) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for path in paths(&mods[name]) {
        let full = absolute(name, &path);
        for k in (1..=full.len()).rev() {
            let target = full[..k].join("::");
            if mods.contains_key(&target) {
                if target != name && !is_within(name, &target) && !is_within(&target, name) {
                    out.insert(target);
                }
                break;
            }
        }
    }
    out
}

/// Strongly connected components (Tarjan), each sorted.
fn components(g: &Graph) -> Vec<Vec<String>> {
    struct State<'a> {
        g: &'a Graph,
        next: usize,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(st: &mut State<'a>, n: &'a str) {
        st.index.insert(n, st.next);
        st.low.insert(n, st.next);
        st.next += 1;
        st.stack.push(n);
        st.on_stack.insert(n);
        let g = st.g;
        for w in g.get(n).into_iter().flatten() {
            let w = w.as_str();
            if !st.index.contains_key(w) {
                visit(st, w);
                let low = st.low[n].min(st.low[w]);
                st.low.insert(n, low);
            } else if st.on_stack.contains(w) {
                let low = st.low[n].min(st.index[w]);
                st.low.insert(n, low);
            }
        }
        if st.low[n] == st.index[n] {
            let mut comp = Vec::new();
            while let Some(w) = st.stack.pop() {
                st.on_stack.remove(w);
                comp.push(w.to_owned());
                if w == n {
                    break;
                }
            }
            comp.sort();
            st.out.push(comp);
        }
    }
    let mut st = State {
        g,
        next: 0,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for n in g.keys() {
        if !st.index.contains_key(n.as_str()) {
            visit(&mut st, n);
        }
    }
    st.out
}

/// Every cycle of one crate, one line each.
fn cycles(krate: &str, mods: &Modules) -> Vec<String> {
    let g: Graph = mods.keys().map(|n| (n.clone(), edges(n, mods))).collect();
    let mut found = Vec::new();
    for comp in components(&g) {
        if comp.len() > 1 {
            found.push(format!(
                "{krate}: cycle of {}: {}",
                comp.len(),
                comp.join(" ")
            ));
        }
    }
    // Sibling level: under each parent, every module collapsed to its
    // ancestor just below the parent.
    let mut parents = BTreeSet::new();
    for n in mods.keys() {
        let parts: Vec<&str> = n.split("::").collect();
        for k in 0..parts.len() {
            parents.insert(parts[..k].join("::"));
        }
    }
    let mut seen = BTreeSet::new();
    for parent in &parents {
        let depth = if parent.is_empty() {
            0
        } else {
            parent.split("::").count()
        };
        let up = |n: &str| -> Option<String> {
            if !parent.is_empty() && !is_within(n, parent) {
                return None;
            }
            let parts: Vec<&str> = n.split("::").collect();
            (parts.len() > depth).then(|| parts[..=depth].join("::"))
        };
        let mut sg = Graph::new();
        for (a, outs) in &g {
            let Some(ua) = up(a) else { continue };
            for b in outs {
                match up(b) {
                    Some(ub) if ub != ua => {
                        sg.entry(ub.clone()).or_default();
                        sg.entry(ua.clone()).or_default().insert(ub);
                    }
                    _ => {}
                }
            }
        }
        for comp in components(&sg) {
            if comp.len() > 1 && seen.insert(comp.clone()) {
                let under = if parent.is_empty() {
                    "crate root"
                } else {
                    parent.as_str()
                };
                found.push(format!(
                    "{krate}: sibling modules under '{under}' import each other: {}",
                    comp.join(" ")
                ));
            }
        }
    }
    found
}

/// Every cycle of every crate of the workspace (each directory at the root
/// with a `Cargo.toml` and a `src`).
fn workspace_cycles() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root");
    let mut dirs: Vec<PathBuf> = fs::read_dir(root)
        .expect("reading the workspace root")
        .map(|e| e.expect("directory entry").path())
        .filter(|d| d.join("Cargo.toml").is_file() && d.join("src").is_dir())
        .collect();
    dirs.sort();
    assert!(
        dirs.iter().any(|d| d.ends_with("agent")) && dirs.iter().any(|d| d.ends_with("plugin")),
        "no crates found under {}",
        root.display()
    );
    let mut found = Vec::new();
    for dir in dirs {
        let krate = dir
            .file_name()
            .expect("a crate directory")
            .to_string_lossy();
        found.extend(cycles(&krate, &modules(&dir.join("src"))));
    }
    found
}

#[test]
fn no_crate_has_a_module_cycle() {
    let found = workspace_cycles();
    assert!(
        found.is_empty(),
        "modules must import only downward; cycles:\n{}",
        found.join("\n")
    );
}

/// The agent's layers, bottom up, by top-level module (`""` is the crate
/// root: `lib.rs` and `main.rs`), as `docs/architecture.md` draws them. A
/// module imports its own layer and those below, never one above.
const AGENT_LAYERS: &[(&str, &[&str])] = &[
    ("pure", &["cni", "rpc", "model", "workload"]),
    (
        "adapters",
        &[
            "sys",
            "datapath",
            "store",
            "kube",
            "netlink",
            "vfio",
            "bindings",
            "metrics",
            "telemetry",
            "settings",
        ],
    ),
    ("leases", &["lease", "guard"]),
    ("operations", &["ops"]),
    ("process", &["daemon", "cli", ""]),
];

/// The layer of an agent module (by its top-level module), or `None` when
/// the table does not place it.
fn agent_layer(module: &str) -> Option<usize> {
    let top = module.split("::").next().unwrap_or_default();
    AGENT_LAYERS
        .iter()
        .position(|(_, mods)| mods.contains(&top))
}

/// Every import of an agent module that runs up a layer, and every module
/// the layer table does not place.
fn agent_layer_violations(mods: &Modules) -> Vec<String> {
    let mut found = Vec::new();
    for name in mods.keys() {
        let Some(from) = agent_layer(name) else {
            found.push(format!(
                "agent: module `{name}` is in no layer: place it in AGENT_LAYERS (and docs/architecture.md)"
            ));
            continue;
        };
        for target in edges(name, mods) {
            if let Some(to) = agent_layer(&target)
                && to > from
            {
                found.push(format!(
                    "agent: `{name}` ({}) imports `{target}` ({}), a layer above it",
                    AGENT_LAYERS[from].0, AGENT_LAYERS[to].0
                ));
            }
        }
    }
    found
}

#[test]
fn no_agent_module_imports_a_layer_above_its_own() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root");
    let found = agent_layer_violations(&modules(&root.join("agent/src")));
    assert!(
        found.is_empty(),
        "the agent's layers:\n{}",
        found.join("\n")
    );
}

#[test]
fn an_import_up_a_layer_is_found() {
    let mods = fixture(&[
        ("", ""),
        ("ops", ""),
        ("ops::add", "fn f() { crate::lease::run(); }"),
        ("lease", "use crate::ops::add::Request;"),
        ("daemon", "use crate::ops;"),
    ]);
    assert_eq!(
        agent_layer_violations(&mods),
        ["agent: `lease` (leases) imports `ops::add` (operations), a layer above it"]
    );
    let unplaced = fixture(&[("", ""), ("helpers", "")]);
    assert!(agent_layer_violations(&unplaced)[0].contains("`helpers` is in no layer"));
}

/// Modules from `(path, source)` pairs, as [`modules`] reads files.
fn fixture(files: &[(&str, &str)]) -> Modules {
    files
        .iter()
        .map(|(name, src)| ((*name).to_owned(), strip_test_modules(&lex(src))))
        .collect()
}

fn targets(name: &str, mods: &Modules) -> Vec<String> {
    edges(name, mods).into_iter().collect()
}

#[test]
fn paths_of_every_form_are_edges() {
    let mods = fixture(&[
        ("", "mod a; mod b; mod c; mod d; mod e;"),
        ("a", "use crate::{b, c::{x, y as z}};"),
        ("b", "fn f() { crate::d::run(); }"),
        ("c", "use super::e::Thing; use self::inner::Q;"),
        ("c::inner", "use super::super::d::{self, More};"),
        ("d", "macro_rules! m { () => { $crate::e::f() } }"),
        ("e", "use crate::d::{self as dd};"),
    ]);
    assert_eq!(targets("a", &mods), ["b", "c"]);
    assert_eq!(targets("b", &mods), ["d"]);
    // `self::inner` is a descendant: not an edge.
    assert_eq!(targets("c", &mods), ["e"]);
    assert_eq!(targets("c::inner", &mods), ["d"]);
    assert_eq!(targets("d", &mods), ["e"]);
    assert_eq!(targets("e", &mods), ["d"]);
    assert_eq!(
        cycles("k", &mods),
        [
            "k: cycle of 2: d e",
            "k: sibling modules under 'crate root' import each other: d e"
        ]
    );
}

#[test]
fn a_group_after_a_path_names_the_modules_in_it() {
    let mods = fixture(&[
        ("", ""),
        ("a", ""),
        ("a::x", ""),
        ("a::y", ""),
        ("b", "use crate::a::{x::One, y};"),
    ]);
    assert_eq!(targets("b", &mods), ["a::x", "a::y"]);
}

#[test]
fn comments_literals_and_test_modules_are_not_imports() {
    let mods = fixture(&[
        ("", ""),
        ("a", ""),
        (
            "b",
            r##"
            // use crate::a;
            /* crate::a::x /* nested */ crate::a */
            const S: &str = "crate::a::{";
            const R: &str = r#"crate::a "quoted" }"#;
            const C: char = '{';
            fn f<'a>(x: &'a str) -> &'a str { x }
            #[cfg(test)]
            #[expect(clippy::unwrap_used, reason = "test")]
            pub(crate) mod tests { use crate::a; fn g() { let _ = "}"; } }
            "##,
        ),
    ]);
    assert_eq!(targets("b", &mods), Vec::<String>::new());
    let mut with_use = mods.clone();
    with_use
        .get_mut("b")
        .expect("fixture module b")
        .extend(lex("use crate::a;"));
    assert_eq!(targets("b", &with_use), ["a"]);
}

#[test]
fn a_cycle_through_children_is_one_between_siblings() {
    // No file imports its importer, but `a` and `b` import each other.
    let mods = fixture(&[
        ("", ""),
        ("a", ""),
        ("a::x", "use crate::b::B;"),
        ("a::y", ""),
        ("b", "use crate::a::y::Y;"),
    ]);
    assert_eq!(
        cycles("k", &mods),
        ["k: sibling modules under 'crate root' import each other: a b"]
    );
}

#[test]
fn a_layered_crate_has_no_cycle() {
    let mods = fixture(&[
        ("", "pub mod low; pub mod mid; pub mod top;"),
        ("low", ""),
        ("mid", "use crate::low::L; use super::low;"),
        ("top", "use crate::{low, mid::M};"),
    ]);
    assert_eq!(cycles("k", &mods), Vec::<String>::new());
}
