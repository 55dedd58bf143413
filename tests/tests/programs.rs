//! Every external program the tests, the benchmarks and `cargo xtask` run
//! comes from the one program table (`xdhcp_testbed::programs`), which
//! `cargo xtask setup` installs from, so a fresh machine that ran `setup`
//! has all of them.
//!
//! Three checks make that hold by construction:
//! * the harness's lookup (`xdhcp_tests::program`) panics on a name outside
//!   the table;
//! * a scan of the non-comment source of `tests/`, `xtask/` and `ovsdb/tests/` fails on a
//!   `Command::new("literal")`, an absolute program path, an `ip netns exec`
//!   spelled outside the one helper per crate, or a lookup of a name the
//!   table lacks;
//! * the table is true: each Debian program is at its path, and `dpkg`
//!   says that path belongs to the package `setup` installs for it.

use std::path::{Path, PathBuf};
use std::process::Command;

use xdhcp_testbed::programs::{self, PROGRAMS, Source};

#[test]
#[should_panic(expected = "not in the program table")]
fn a_program_outside_the_table_cannot_be_run() {
    let _ = xdhcp_tests::program("nc");
}

#[test]
fn every_debian_program_is_installed_from_the_package_the_table_names() {
    let mut wrong = Vec::new();
    for p in PROGRAMS {
        let Source::Debian { package, path } = p.source else {
            continue;
        };
        if !Path::new(path).exists() {
            wrong.push(format!(
                "{path} ({}) is missing: run `cargo xtask setup`",
                p.name
            ));
            continue;
        }
        let out = Command::new(xdhcp_tests::program("dpkg-query"))
            .args(["-S", path])
            .output()
            .expect("run dpkg-query");
        let text = String::from_utf8_lossy(&out.stdout);
        // `pkg1, pkg2: /path`
        let owners: Vec<&str> = text
            .lines()
            .filter_map(|l| l.split_once(": "))
            .flat_map(|(pkgs, _)| pkgs.split(", "))
            .map(|p| p.split(':').next().unwrap_or(p))
            .collect();
        if !owners.contains(&package) {
            wrong.push(format!(
                "{path} ({}) belongs to {owners:?}, not to {package}",
                p.name
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "the program table is wrong:\n{}",
        wrong.join("\n")
    );
}

/// Source text split into code (comments removed, every string literal
/// replaced by `""`) and the string literals, in order.
#[derive(Debug, Default)]
struct Lexed {
    code: String,
    literals: Vec<(usize, String)>,
}

/// A small Rust lexer: enough to tell comments, string literals (plain, byte,
/// raw), character literals and lifetimes apart.
fn lex(src: &str) -> Lexed {
    let mut l = Lexer {
        chars: src.chars().collect(),
        i: 0,
        line: 1,
        out: Lexed::default(),
    };
    while l.i < l.chars.len() {
        l.step();
    }
    l.out
}

struct Lexer {
    chars: Vec<char>,
    i: usize,
    line: usize,
    out: Lexed,
}

impl Lexer {
    fn at(&self, k: usize) -> Option<char> {
        self.chars.get(k).copied()
    }

    fn step(&mut self) {
        let c = self.chars[self.i];
        let next = self.at(self.i + 1);
        let ident = |c: char| c.is_alphanumeric() || c == '_';
        let prev = self.i.checked_sub(1).and_then(|k| self.at(k));
        if c == 'r'
            && matches!(next, Some('"' | '#'))
            && prev.is_none_or(|p| !ident(p) || p == 'b')
            && self.raw_string()
        {
            return;
        }
        if c == '/' && next == Some('/') {
            while self.at(self.i).is_some_and(|c| c != '\n') {
                self.i += 1;
            }
        } else if c == '/' && next == Some('*') {
            self.block_comment();
        } else if c == '"' {
            self.string();
        } else if c == '\'' {
            self.char_or_lifetime(next);
        } else {
            self.code(c);
            self.i += 1;
        }
    }

    fn code(&mut self, c: char) {
        if c == '\n' {
            self.line += 1;
        }
        self.out.code.push(c);
    }

    /// `/* … */`, nested; keeps its line breaks in the code.
    fn block_comment(&mut self) {
        let mut depth = 0;
        while let Some(c) = self.at(self.i) {
            let next = self.at(self.i + 1);
            if c == '/' && next == Some('*') {
                depth += 1;
                self.i += 2;
            } else if c == '*' && next == Some('/') {
                depth -= 1;
                self.i += 2;
                if depth == 0 {
                    return;
                }
            } else {
                if c == '\n' {
                    self.code(c);
                }
                self.i += 1;
            }
        }
    }

    fn literal(&mut self, text: String) {
        self.out.code.push_str("\"\"");
        let breaks = text.matches('\n').count();
        self.out.literals.push((self.line, text));
        for _ in 0..breaks {
            self.code('\n');
        }
    }

    /// `r"…"`, `r#"…"#` (after an optional `b`). False when the `r` starts
    /// something else (a raw identifier such as `r#type`).
    fn raw_string(&mut self) -> bool {
        let mut j = self.i + 1;
        let mut hashes = 0;
        while self.at(j) == Some('#') {
            hashes += 1;
            j += 1;
        }
        if self.at(j) != Some('"') {
            return false;
        }
        j += 1;
        let mut text = String::new();
        while let Some(d) = self.at(j) {
            if d == '"' && (0..hashes).all(|k| self.at(j + 1 + k) == Some('#')) {
                j += 1 + hashes;
                break;
            }
            text.push(d);
            j += 1;
        }
        self.literal(text);
        self.i = j;
        true
    }

    /// `"…"` with escapes.
    fn string(&mut self) {
        let mut text = String::new();
        let mut j = self.i + 1;
        while let Some(d) = self.at(j) {
            if d == '\\' {
                text.push(d);
                text.extend(self.at(j + 1));
                j += 2;
                continue;
            }
            j += 1;
            if d == '"' {
                break;
            }
            text.push(d);
        }
        self.literal(text);
        self.i = j;
    }

    /// A character literal (`'x'`, `'\n'`, `'\''`) becomes `' '`; a lifetime
    /// stays code.
    fn char_or_lifetime(&mut self, next: Option<char>) {
        if next == Some('\\') {
            let mut j = self.i + 3;
            while self.at(j).is_some_and(|c| c != '\'') {
                j += 1;
            }
            self.out.code.push_str("' '");
            self.i = j + 1;
        } else if self.at(self.i + 2) == Some('\'') {
            self.out.code.push_str("' '");
            self.i += 3;
        } else {
            self.code('\'');
            self.i += 1;
        }
    }
}

/// Where a check found a problem.
#[derive(Debug, PartialEq, Eq)]
struct Finding {
    file: String,
    what: String,
}

/// The string literal passed as the first argument right after each
/// occurrence of `call` (such as `program(`) in `lexed.code`.
fn literal_args<'a>(lexed: &'a Lexed, call: &str) -> Vec<&'a str> {
    let mut found = Vec::new();
    let mut literal_positions = Vec::new();
    let mut at = 0;
    while let Some(p) = lexed.code[at..].find("\"\"") {
        literal_positions.push(at + p);
        at += p + 2;
    }
    let mut from = 0;
    while let Some(p) = lexed.code[from..].find(call) {
        let after = from + p + call.len();
        let rest = lexed.code[after..].trim_start();
        let rest = rest.strip_prefix("&[").map_or(rest, str::trim_start);
        if rest.starts_with("\"\"") {
            let pos = lexed.code.len() - rest.len();
            if let Some(idx) = literal_positions.iter().position(|q| *q == pos) {
                found.push(lexed.literals[idx].1.as_str());
            }
        }
        from = after;
    }
    found
}

/// Files allowed to spell `ip netns exec` (once each): the harness's and the
/// demo's one helper, which take a program from the table.
const NETNS_EXEC_HELPERS: [&str; 2] = ["tests/src/netns.rs", "xtask/src/demo/mod.rs"];

fn check_source(file: &str, src: &str) -> Vec<Finding> {
    let lexed = lex(src);
    let mut findings = Vec::new();
    let mut found = |what: String| {
        findings.push(Finding {
            file: file.to_owned(),
            what,
        });
    };
    // 1. A program named by a literal, bypassing the table.
    let mut from = 0;
    while let Some(p) = lexed.code[from..].find("Command::new(") {
        let after = from + p + "Command::new(".len();
        if lexed.code[after..].trim_start().starts_with("\"\"") {
            let line = lexed.code[..after].lines().count();
            found(format!(
                "line {line}: Command::new with a literal: use program(\"…\") from the table"
            ));
        }
        from = after;
    }
    // 2. Absolute program paths live only in the table.
    let dirs: Vec<String> = ["bin", "sbin", "libexec", "lib/cni"]
        .iter()
        .flat_map(|d| [format!("/{d}/"), format!("/usr/{d}/"), format!("/usr/{d}")])
        .collect();
    for (line, lit) in &lexed.literals {
        if dirs
            .iter()
            .any(|d| lit.starts_with(d.as_str()) && (d.ends_with('/') || lit.len() == d.len()))
        {
            found(format!(
                "line {line}: absolute program path {lit:?}: take it from the program table"
            ));
        }
    }
    // 3. `ip netns exec` only in the one helper per crate.
    let execs = lexed.literals.iter().filter(|(_, l)| l == "exec").count();
    let allowed = usize::from(NETNS_EXEC_HELPERS.contains(&file));
    if execs > allowed {
        found(format!(
            "{execs} `netns exec` spelled here ({allowed} allowed): use the netns_exec helper"
        ));
    }
    // 4. Lookups name programs the table has.
    for call in [
        "program(",
        "executable(",
        ".command(",
        "tokio_command(",
        ".exec(",
        ".exec_output(",
    ] {
        for name in literal_args(&lexed, call) {
            if programs::find(name).is_none() {
                found(format!("`{name}` is not in the program table"));
            }
        }
    }
    findings
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn nothing_in_tests_or_xtask_runs_a_program_outside_the_table() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root");
    let mut files = Vec::new();
    for dir in [
        "tests/src",
        "tests/tests",
        "xtask/src",
        "xtask/tests",
        "ovsdb/tests",
    ] {
        rust_files(&root.join(dir), &mut files);
    }
    let mut findings = Vec::new();
    let mut scanned = 0;
    for path in &files {
        let rel = path
            .strip_prefix(root)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        // This file spells the patterns it looks for.
        if rel.ends_with(file!()) {
            continue;
        }
        scanned += 1;
        findings.extend(check_source(&rel, &std::fs::read_to_string(path).unwrap()));
    }
    assert!(
        scanned > 20,
        "only {scanned} files scanned under {}",
        root.display()
    );
    assert!(
        findings.is_empty(),
        "programs run outside the table (testbed/src/programs.rs):\n{}",
        findings
            .iter()
            .map(|f| format!("{}: {}", f.file, f.what))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn the_scan_finds_what_it_must_and_ignores_comments() {
    let bad = r##"
        fn f() {
            let a = Command::new("nc");
            let b = std::process::Command::new( "nc" );
            let c = tokio::process::Command::new(r#"nc"#);
            let d = Command::new(NAME); const NAME: &str = "/usr/bin/nc";
            let e = Command::new(program("ip")).args(["netns", "exec", ns, "nc"]);
            let f = program("nc");
            let g = ns.command("socat");
            let h = ns.exec(&["ping", "-c1"]);
        }
    "##;
    let what: Vec<String> = check_source("tests/tests/x.rs", bad)
        .into_iter()
        .map(|f| f.what)
        .collect();
    let has = |s: &str| what.iter().filter(|w| w.contains(s)).count();
    assert_eq!(has("Command::new with a literal"), 3, "{what:#?}");
    assert_eq!(has("absolute program path"), 1, "{what:#?}");
    assert_eq!(has("netns exec"), 1, "{what:#?}");
    assert_eq!(has("`nc` is not in"), 1, "{what:#?}");
    assert_eq!(has("`socat` is not in"), 1, "{what:#?}");
    assert_eq!(has("`ping` is not in"), 1, "{what:#?}");
    assert_eq!(what.len(), 8, "{what:#?}");

    let fine = r#"
        // Command::new("nc") in a comment, "/usr/bin/nc" too.
        /* Command::new("nc") /* nested */ and "exec" */
        fn f<'a>(x: &'a str) -> char {
            let url = "http://example//not-a-comment";
            let a = Command::new(program("nft"));
            let b = Command::new(xdhcp_bin());
            let c = ns.command("tcpdump");
            let q = '"';
            let s = b"Command::new(\"nc\")";
            '\''
        }
    "#;
    assert_eq!(check_source("tests/tests/x.rs", fine), vec![]);
    // The helper files may spell `netns exec` once.
    let helper = r#"fn netns_exec() { ip(&["netns", "exec", ns]) }"#;
    assert_eq!(check_source("tests/src/netns.rs", helper), vec![]);
    assert_eq!(check_source("tests/tests/x.rs", helper).len(), 1);
}
