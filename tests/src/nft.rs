//! nftables packet counters in a test namespace: what a namespace's own
//! stack (or bridge, or device) received, counted by the kernel.

use crate::NetNs;

/// An nftables table `table` ("FAMILY NAME") in `ns` with one chain on
/// `hook` ("HOOK priority N") holding one rule: `rule` and a counter.
///
/// # Panics
/// If `nft` refuses any of it.
#[track_caller]
pub fn add_counter(ns: &NetNs, table: &str, hook: &str, rule: &[&str]) {
    let nft = |args: &[&str]| {
        let out = ns.exec_output(&[&["nft"], args].concat());
        assert!(
            out.status.success(),
            "nft {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let (family, name) = table.split_once(' ').expect("FAMILY NAME");
    nft(&["add", "table", family, name]);
    let chain = format!("{{ type filter hook {hook}; }}");
    nft(&["add", "chain", family, name, "c", &chain]);
    nft(&[&["add", "rule", family, name, "c"], rule, &["counter"]].concat());
}

/// The packets [`add_counter`]'s rule in `table` counted.
///
/// # Panics
/// If the table has no counter.
#[track_caller]
pub fn counted(ns: &NetNs, table: &str) -> u64 {
    let (family, name) = table.split_once(' ').expect("FAMILY NAME");
    let out = ns.exec(&["nft", "list", "table", family, name]);
    out.split_whitespace()
        .skip_while(|w| *w != "packets")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .expect("the counter's packets")
}
