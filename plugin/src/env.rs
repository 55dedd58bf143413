//! The CNI environment (`CNI_COMMAND`, `CNI_CONTAINERID`, `CNI_NETNS`,
//! `CNI_IFNAME`, `CNI_ARGS`, `CNI_PATH`), validated.
//!
//! One thing: the CNI environment variables, each validated where read.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::types::{CniError, code};
use crate::error_chain::format_chain;

/// The CNI operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Command {
    Add,
    Del,
    Check,
    Version,
    Status,
    Gc,
}

impl Command {
    /// Parse the value of `CNI_COMMAND`.
    pub fn parse(s: &str) -> Result<Self, CniError> {
        Ok(match s {
            "ADD" => Self::Add,
            "DEL" => Self::Del,
            "CHECK" => Self::Check,
            "VERSION" => Self::Version,
            "STATUS" => Self::Status,
            "GC" => Self::Gc,
            other => {
                return Err(CniError::env(
                    "CNI_COMMAND",
                    format!("{other:?} is not one of ADD, DEL, CHECK, VERSION, STATUS, GC"),
                ));
            }
        })
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Add => "ADD",
            Self::Del => "DEL",
            Self::Check => "CHECK",
            Self::Version => "VERSION",
            Self::Status => "STATUS",
            Self::Gc => "GC",
        })
    }
}

/// The validated CNI environment of one invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniEnv {
    pub command: Command,
    /// Present for ADD, DEL, CHECK.
    pub container_id: Option<String>,
    /// Present for ADD and CHECK; for DEL only when it still exists.
    pub netns: Option<PathBuf>,
    /// Present for ADD, DEL, CHECK.
    pub ifname: Option<String>,
    /// `CNI_ARGS` as key/value pairs.
    pub args: BTreeMap<String, String>,
    /// `CNI_PATH` entries (xdhcp delegates to nothing; kept for completeness).
    pub path: Vec<PathBuf>,
}

impl CniEnv {
    /// Read and validate the environment through `lookup` (normally
    /// `std::env::var`).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, CniError> {
        let get = |k: &str| lookup(k).filter(|v| !v.is_empty());
        let command = Command::parse(
            &get("CNI_COMMAND").ok_or_else(|| CniError::env("CNI_COMMAND", "not set"))?,
        )?;
        let needs_attachment = matches!(command, Command::Add | Command::Del | Command::Check);
        let needs_netns = matches!(command, Command::Add | Command::Check);

        let container_id = match get("CNI_CONTAINERID") {
            Some(id) => {
                validate_container_id(&id).map_err(|p| CniError::env("CNI_CONTAINERID", p))?;
                Some(id)
            }
            None if needs_attachment => {
                return Err(CniError::env("CNI_CONTAINERID", "not set"));
            }
            None => None,
        };
        let ifname = match get("CNI_IFNAME") {
            Some(n) => {
                validate_ifname(&n).map_err(|p| CniError::env("CNI_IFNAME", p))?;
                Some(n)
            }
            None if needs_attachment => return Err(CniError::env("CNI_IFNAME", "not set")),
            None => None,
        };
        let netns = match get("CNI_NETNS") {
            Some(p) => {
                let p = PathBuf::from(p);
                match validate_netns_path(&p) {
                    Ok(()) => Some(p),
                    // DEL must succeed after the sandbox is gone (CNI spec:
                    // "plugins should generally complete a DEL without error").
                    Err(_) if command == Command::Del => None,
                    Err(problem) => return Err(CniError::env("CNI_NETNS", format_chain(&problem))),
                }
            }
            None if needs_netns => return Err(CniError::env("CNI_NETNS", "not set")),
            None => None,
        };
        let args = match get("CNI_ARGS") {
            Some(a) => parse_cni_args(&a)?,
            None => BTreeMap::new(),
        };
        let path = get("CNI_PATH")
            .map(|p| {
                p.split(':')
                    .filter(|s| !s.is_empty())
                    .map(PathBuf::from)
                    .collect()
            })
            .unwrap_or_default();
        Ok(Self {
            command,
            container_id,
            netns,
            ifname,
            args,
            path,
        })
    }
}

/// Parse `CNI_ARGS` (`K=V;K2=V2`).
pub fn parse_cni_args(s: &str) -> Result<BTreeMap<String, String>, CniError> {
    let mut out = BTreeMap::new();
    for part in s.split(';').filter(|p| !p.is_empty()) {
        let (k, v) = part.split_once('=').ok_or_else(|| {
            CniError::env(
                "CNI_ARGS",
                format!("{part:?} is not KEY=VALUE (pairs separated by ';')"),
            )
        })?;
        if k.is_empty() {
            return Err(CniError::env(
                "CNI_ARGS",
                format!("{part:?} has an empty key"),
            ));
        }
        out.insert(k.to_owned(), v.to_owned());
    }
    Ok(out)
}

/// What a valid container id looks like, for messages.
const CONTAINER_ID_RULE: &str = "1-128 of [A-Za-z0-9_.-], starting with a letter or digit";
/// What a valid interface name looks like, for messages.
const IFNAME_RULE: &str = "1-15 printable characters, no '/', ':' or spaces";
/// The accepted network namespace paths, for messages.
const NETNS_SHAPES: &str = "/var/run/netns/<name>, /run/netns/<name> or /proc/<pid>/ns/net";

/// Why a container id is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ContainerIdError {
    /// Empty or longer than 128 bytes.
    #[error(
        "{id:?} is not a valid container id: {len} bytes long ({CONTAINER_ID_RULE})",
        CONTAINER_ID_RULE = CONTAINER_ID_RULE
    )]
    Length {
        /// The refused id.
        id: String,
        /// Its length in bytes.
        len: usize,
    },
    /// A character outside `[A-Za-z0-9_.-]`, or a first one that is not a
    /// letter or digit.
    #[error(
        "{id:?} is not a valid container id: {ch:?} at byte {at} ({CONTAINER_ID_RULE})",
        CONTAINER_ID_RULE = CONTAINER_ID_RULE
    )]
    Character {
        /// The refused id.
        id: String,
        /// The first offending character.
        ch: char,
        /// Its byte offset.
        at: usize,
    },
}

/// Why an interface name is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IfNameError {
    /// Empty or longer than 15 bytes.
    #[error(
        "{name:?} is not a valid Linux interface name: {len} bytes long ({IFNAME_RULE})",
        IFNAME_RULE = IFNAME_RULE
    )]
    Length {
        /// The refused name.
        name: String,
        /// Its length in bytes.
        len: usize,
    },
    /// `.` or `..`.
    #[error(
        "{name:?} is not a valid Linux interface name: reserved ({IFNAME_RULE})",
        IFNAME_RULE = IFNAME_RULE
    )]
    Reserved {
        /// The refused name.
        name: String,
    },
    /// `/`, `:`, whitespace or a non-printable character.
    #[error(
        "{name:?} is not a valid Linux interface name: {ch:?} at byte {at} ({IFNAME_RULE})",
        IFNAME_RULE = IFNAME_RULE
    )]
    Character {
        /// The refused name.
        name: String,
        /// The first offending character.
        ch: char,
        /// Its byte offset.
        at: usize,
    },
}

/// Why `CNI_NETNS` does not name a usable network namespace.
#[derive(Debug, thiserror::Error)]
pub enum NetnsPathError {
    /// Not one of the accepted path shapes.
    #[error(
        "{} is not a network namespace path (expected {NETNS_SHAPES})",
        path.display(), NETNS_SHAPES = NETNS_SHAPES
    )]
    Shape {
        /// The refused path.
        path: PathBuf,
    },
    /// Nothing at the path.
    #[error("{}: the network namespace does not exist (was the sandbox deleted?)", path.display())]
    Missing {
        /// The path.
        path: PathBuf,
        /// What `statfs` said.
        #[source]
        source: nix::Error,
    },
    /// `statfs` failed for another reason than a missing file.
    #[error("{}: cannot check the network namespace", path.display())]
    Stat {
        /// The path.
        path: PathBuf,
        /// What `statfs` said.
        #[source]
        source: nix::Error,
    },
    /// Something other than an nsfs mount.
    #[error("{} exists but is not a network namespace (not an nsfs mount)", path.display())]
    NotNsfs {
        /// The path.
        path: PathBuf,
    },
}

/// A container id is used as a file-name component of the lease store, so it
/// must be `[A-Za-z0-9][A-Za-z0-9_.-]{0,127}`.
pub fn validate_container_id(id: &str) -> Result<(), ContainerIdError> {
    if id.is_empty() || id.len() > 128 {
        return Err(ContainerIdError::Length {
            id: id.to_owned(),
            len: id.len(),
        });
    }
    let bad = id.char_indices().find(|&(at, c)| {
        let allowed = if at == 0 {
            c.is_ascii_alphanumeric()
        } else {
            c.is_ascii_alphanumeric() || "_.-".contains(c)
        };
        !allowed
    });
    match bad {
        None => Ok(()),
        Some((at, ch)) => Err(ContainerIdError::Character {
            id: id.to_owned(),
            ch,
            at,
        }),
    }
}

/// Linux `dev_valid_name`: 1–15 bytes, not `.`/`..`, no `/`, `:` or whitespace.
pub fn validate_ifname(name: &str) -> Result<(), IfNameError> {
    if name.is_empty() || name.len() >= 16 {
        return Err(IfNameError::Length {
            name: name.to_owned(),
            len: name.len(),
        });
    }
    if name == "." || name == ".." {
        return Err(IfNameError::Reserved {
            name: name.to_owned(),
        });
    }
    match name
        .char_indices()
        .find(|&(_, c)| !c.is_ascii_graphic() || c == '/' || c == ':')
    {
        None => Ok(()),
        Some((at, ch)) => Err(IfNameError::Character {
            name: name.to_owned(),
            ch,
            at,
        }),
    }
}

/// Check that `p` names a network namespace: `/var/run/netns/<name>`,
/// `/run/netns/<name>`, `/proc/<pid>/ns/net` or `/proc/<pid>/task/<tid>/ns/net`,
/// existing, and on nsfs.
pub fn validate_netns_path(p: &Path) -> Result<(), NetnsPathError> {
    check_netns_shape(p)?;
    check_nsfs(p)
}

/// Check that `p` exists and is on nsfs (a namespace file), whatever its
/// shape: the agent checks the shape of the path it was sent, then this on
/// the path it opens (the same path behind `--host-prefix`).
pub fn check_nsfs(p: &Path) -> Result<(), NetnsPathError> {
    let st = nix::sys::statfs::statfs(p).map_err(|source| {
        let path = p.to_path_buf();
        if source == nix::errno::Errno::ENOENT {
            NetnsPathError::Missing { path, source }
        } else {
            NetnsPathError::Stat { path, source }
        }
    })?;
    if st.filesystem_type() != nix::sys::statfs::NSFS_MAGIC {
        return Err(NetnsPathError::NotNsfs {
            path: p.to_path_buf(),
        });
    }
    Ok(())
}

/// Check that `p` has one of the accepted shapes of a network namespace
/// path (see [`validate_netns_path`]), without touching the filesystem.
pub fn check_netns_shape(p: &Path) -> Result<(), NetnsPathError> {
    let s = p.to_str().unwrap_or("");
    let name_ok =
        |n: &str| !n.is_empty() && n != "." && n != ".." && !n.contains('/') && !n.contains('\0');
    let numeric = |n: &str| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit());
    let ok = if let Some(n) = s
        .strip_prefix("/var/run/netns/")
        .or_else(|| s.strip_prefix("/run/netns/"))
    {
        name_ok(n)
    } else if let Some(rest) = s.strip_prefix("/proc/") {
        let parts: Vec<&str> = rest.split('/').collect();
        match parts.as_slice() {
            [pid, "ns", "net"] => numeric(pid),
            [pid, "task", tid, "ns", "net"] => numeric(pid) && numeric(tid),
            _ => false,
        }
    } else {
        false
    };
    if ok {
        Ok(())
    } else {
        Err(NetnsPathError::Shape {
            path: p.to_path_buf(),
        })
    }
}

/// Error for an invocation whose command does not exist in the config's
/// cniVersion (CHECK before 0.4.0, STATUS/GC before 1.1.0).
pub fn check_command_version(cmd: Command, cni_version: &str) -> Result<(), CniError> {
    use super::types::version_lt;
    let min = match cmd {
        Command::Check => "0.4.0",
        Command::Status | Command::Gc => "1.1.0",
        _ => return Ok(()),
    };
    if version_lt(cni_version, min) {
        return Err(CniError::new(
            code::INCOMPATIBLE_VERSION,
            format!("{cmd} needs cniVersion {min} or later; the config says {cni_version}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Result<CniEnv, CniError> {
        let m: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        CniEnv::from_lookup(|k| m.get(k).cloned())
    }

    #[test]
    fn add_with_proc_netns() {
        let e = env(&[
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "abc123"),
            ("CNI_NETNS", "/proc/self/ns/net"),
            ("CNI_IFNAME", "eth0"),
            (
                "CNI_ARGS",
                "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=web",
            ),
            ("CNI_PATH", "/opt/cni/bin:/usr/lib/cni"),
        ]);
        // `/proc/self` is not numeric: rejected by shape.
        let err = e.unwrap_err();
        assert_eq!(err.code, code::INVALID_ENV);
        assert!(err.msg.starts_with("CNI_NETNS:"), "{err}");

        let pid = std::process::id().to_string();
        let netns = format!("/proc/{pid}/ns/net");
        let e = env(&[
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "abc123"),
            ("CNI_NETNS", &netns),
            ("CNI_IFNAME", "eth0"),
            (
                "CNI_ARGS",
                "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=web",
            ),
            ("CNI_PATH", "/opt/cni/bin:/usr/lib/cni"),
        ])
        .unwrap();
        assert_eq!(e.command, Command::Add);
        assert_eq!(e.netns, Some(PathBuf::from(netns)));
        assert_eq!(e.args["K8S_POD_NAME"], "web");
        assert_eq!(e.path.len(), 2);
    }

    #[test]
    fn missing_and_invalid_vars_are_named() {
        let e = env(&[]).unwrap_err();
        assert_eq!((e.code, e.msg.as_str()), (4, "CNI_COMMAND: not set"));
        let e = env(&[("CNI_COMMAND", "FROB")]).unwrap_err();
        assert!(e.msg.starts_with("CNI_COMMAND:"));
        let e = env(&[("CNI_COMMAND", "ADD"), ("CNI_IFNAME", "eth0")]).unwrap_err();
        assert_eq!(e.msg, "CNI_CONTAINERID: not set");
        let e = env(&[
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "../../etc"),
            ("CNI_IFNAME", "eth0"),
        ])
        .unwrap_err();
        assert!(e.msg.starts_with("CNI_CONTAINERID:"), "{e}");
        let e = env(&[
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "abc"),
            ("CNI_IFNAME", "this-name-is-too-long"),
        ])
        .unwrap_err();
        assert!(e.msg.starts_with("CNI_IFNAME:"), "{e}");
        let e = env(&[
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "abc"),
            ("CNI_IFNAME", "eth0"),
        ])
        .unwrap_err();
        assert_eq!(e.msg, "CNI_NETNS: not set");
        let e = env(&[
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "abc"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_NETNS", "/run/netns/xdt-does-not-exist-ever"),
        ])
        .unwrap_err();
        assert!(e.msg.contains("does not exist"), "{e}");
        let e = env(&[
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "abc"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_NETNS", "/tmp"),
        ])
        .unwrap_err();
        assert!(e.msg.contains("is not a network namespace path"), "{e}");
    }

    #[test]
    fn del_tolerates_a_vanished_netns() {
        let e = env(&[
            ("CNI_COMMAND", "DEL"),
            ("CNI_CONTAINERID", "abc"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_NETNS", "/run/netns/xdt-gone"),
        ])
        .unwrap();
        assert_eq!(e.netns, None);
    }

    #[test]
    fn version_status_gc_need_no_attachment() {
        for c in ["VERSION", "STATUS", "GC"] {
            let e = env(&[("CNI_COMMAND", c)]).unwrap();
            assert_eq!(e.command.to_string(), c);
            assert!(e.container_id.is_none());
        }
    }

    #[test]
    fn ifname_rules() {
        for ok in ["eth0", "net1", "a", "veth-123_x.y", "123456789012345"] {
            assert!(validate_ifname(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "a:b",
            "a b",
            "1234567890123456",
            "tab\t",
        ] {
            assert!(validate_ifname(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn ifname_errors_say_what_is_wrong() {
        assert_eq!(
            validate_ifname("1234567890123456"),
            Err(IfNameError::Length {
                name: "1234567890123456".into(),
                len: 16
            })
        );
        assert_eq!(
            validate_ifname(".."),
            Err(IfNameError::Reserved { name: "..".into() })
        );
        assert_eq!(
            validate_ifname("a:b"),
            Err(IfNameError::Character {
                name: "a:b".into(),
                ch: ':',
                at: 1
            })
        );
        let msg = validate_ifname("a b").unwrap_err().to_string();
        assert!(
            msg.starts_with("\"a b\" is not a valid Linux interface name"),
            "{msg}"
        );
    }

    #[test]
    fn container_id_rules() {
        assert!(validate_container_id(&"a".repeat(128)).is_ok());
        assert!(validate_container_id("a_b.c-1").is_ok());
        assert!(validate_container_id(&"a".repeat(129)).is_err());
        for bad in ["", ".x", "-x", "a/b", "a b", "a\0"] {
            assert!(validate_container_id(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            validate_container_id(".x"),
            Err(ContainerIdError::Character {
                id: ".x".into(),
                ch: '.',
                at: 0
            })
        );
        assert_eq!(
            validate_container_id(""),
            Err(ContainerIdError::Length {
                id: String::new(),
                len: 0
            })
        );
    }

    #[test]
    fn a_missing_netns_keeps_its_errno_in_the_chain() {
        let err = validate_netns_path(Path::new("/run/netns/xdt-does-not-exist-ever")).unwrap_err();
        assert!(matches!(err, NetnsPathError::Missing { .. }), "{err:?}");
        let chain = format_chain(&err);
        assert!(chain.contains("does not exist"), "{chain}");
        assert!(chain.contains("ENOENT"), "{chain}");
    }

    #[test]
    fn netns_shapes() {
        for ok in [
            "/var/run/netns/cni-1234",
            "/run/netns/x",
            "/proc/1/ns/net",
            "/proc/12/task/13/ns/net",
        ] {
            assert!(check_netns_shape(Path::new(ok)).is_ok(), "{ok}");
        }
        for bad in [
            "/run/netns/",
            "/run/netns/../../etc/passwd",
            "/proc/self/ns/net",
            "/proc/1/ns/mnt",
            "relative/netns",
            "/etc/passwd",
        ] {
            assert!(check_netns_shape(Path::new(bad)).is_err(), "{bad}");
        }
        // A real netns on nsfs passes the full check.
        let me = format!("/proc/{}/ns/net", std::process::id());
        assert!(validate_netns_path(Path::new(&me)).is_ok());
    }

    #[test]
    fn cni_args() {
        let a = parse_cni_args("A=1;;B=x=y").unwrap();
        assert_eq!(a["A"], "1");
        assert_eq!(a["B"], "x=y");
        assert!(parse_cni_args("novalue").is_err());
        assert!(parse_cni_args("=v").is_err());
    }

    #[test]
    fn command_versions() {
        assert!(check_command_version(Command::Check, "0.3.1").is_err());
        assert!(check_command_version(Command::Check, "0.4.0").is_ok());
        assert!(check_command_version(Command::Gc, "1.0.0").is_err());
        assert!(check_command_version(Command::Status, "1.1.0").is_ok());
        assert!(check_command_version(Command::Add, "0.3.0").is_ok());
    }
}
