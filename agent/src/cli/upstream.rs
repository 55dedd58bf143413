//! The upstream `dhcp` plugin's process interface, so the binary installed
//! as `/opt/cni/bin/dhcp` is a drop-in for it:
//!
//! - `dhcp daemon [flags]` runs the agent. The upstream daemon's flags are
//!   accepted with their upstream meanings and Go's spelling (one or two
//!   dashes, `-flag value` or `-flag=value`, a bare boolean): `-socketpath`,
//!   `-hostprefix`, `-pidfile`, `-broadcast`, `-timeout`, `-resendmax`,
//!   `-resendtimeout`. Every `xdhcp agent` flag is accepted as well
//!   (`--state-dir`, `--kube`, …). Anything else is an error naming it.
//! - `dhcp` with no arguments and no `CNI_COMMAND` prints what the plugin
//!   is and the CNI versions it speaks, and exits 0, as the upstream plugin
//!   does.
//! - With `CNI_COMMAND` set it is the plugin ([`crate::cni::main`]).
//!
//! Like upstream, `daemon` as the first argument wins over `CNI_COMMAND`.
//! Pure argument handling; `main` does the I/O.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, FromArgMatches};

use crate::cni::config::{UPSTREAM_SOCKET, parse_go_duration};
use crate::settings::AgentArgs;

pub use xdhcp_plugin::invocation::{Invocation, UPSTREAM_NAME, about, classify};

/// The kind of value an upstream flag takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Bool,
    Path,
    Duration,
}

/// The upstream daemon's flags, in the order its usage lists them.
const UPSTREAM_FLAGS: &[(&str, Kind, &str)] = &[
    (
        "broadcast",
        Kind::Bool,
        "set the BROADCAST flag in DISCOVER and REQUEST so servers broadcast their replies",
    ),
    (
        "hostprefix",
        Kind::Path,
        "the host's root as the daemon sees it: put before the socket path and every CNI_NETNS",
    ),
    (
        "pidfile",
        Kind::Path,
        "write the daemon's process id to this absolute path (removed on exit)",
    ),
    (
        "resendmax",
        Kind::Duration,
        "cap on the doubling retransmission delay (xdhcp's default 1m4s)",
    ),
    (
        "resendtimeout",
        Kind::Duration,
        "give up acquiring a lease after this long (xdhcp's default 30s)",
    ),
    (
        "socketpath",
        Kind::Path,
        "the socket to serve (default /run/cni/dhcp.sock)",
    ),
    (
        "timeout",
        Kind::Duration,
        "wait this long for a reply before the first retransmission (xdhcp's default 4s)",
    ),
];

/// The usage text of `dhcp daemon -h`.
pub fn daemon_usage() -> String {
    let mut out = String::from(
        "Usage of dhcp daemon (the xdhcp agent under the upstream daemon's command line):\n",
    );
    for (name, kind, help) in UPSTREAM_FLAGS {
        let ty = match kind {
            Kind::Bool => "",
            Kind::Path => " string",
            Kind::Duration => " duration",
        };
        let _ = write!(out, "  -{name}{ty}\n    \t{help}\n");
    }
    out.push_str(
        "Every `xdhcp agent` flag is accepted too (see `xdhcp agent --help`), e.g. --state-dir, --kube, --metrics-addr.\n",
    );
    out
}

/// What `dhcp daemon …` asks for.
#[derive(Debug, Clone)]
pub enum DaemonCommand {
    /// Run the agent with these flags.
    Run(Box<AgentArgs>),
    /// `-h` / `-help`: print the usage and exit 0.
    Help,
}

/// Why `dhcp daemon`'s command line is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DaemonFlagError {
    /// Neither an upstream flag nor an `xdhcp agent` flag.
    #[error(
        "flag provided but not defined: {flag} (upstream flags: {}; and every `xdhcp agent` flag)",
        upstream_names()
    )]
    Unknown {
        /// The flag as given.
        flag: String,
    },
    /// A flag that takes a value came last.
    #[error("flag needs an argument: {flag}")]
    MissingValue {
        /// The flag as given.
        flag: String,
    },
    /// A value the flag cannot take.
    #[error("invalid value {value:?} for flag -{flag}: {why}")]
    BadValue {
        /// The flag's name.
        flag: String,
        /// The refused value.
        value: String,
        /// What it must be.
        why: &'static str,
    },
    /// An argument that is not a flag.
    #[error("unexpected argument {arg:?}: `dhcp daemon` takes only flags")]
    Positional {
        /// The argument.
        arg: String,
    },
    /// `--socket` (xdhcp's spelling) where the upstream one is meant.
    #[error(
        "`dhcp daemon` serves the socket named by -socketpath; --socket is `xdhcp agent`'s flag"
    )]
    SocketFlag,
    /// An `xdhcp agent` flag with a bad value (clap's own message).
    #[error("{0}")]
    Agent(String),
}

fn upstream_names() -> String {
    UPSTREAM_FLAGS
        .iter()
        .map(|(n, _, _)| format!("-{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Go's `strconv.ParseBool`, which its `flag` package uses for `-b=value`.
fn go_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// The upstream flags as given.
#[derive(Debug, Default)]
struct Upstream {
    broadcast: Option<bool>,
    hostprefix: Option<String>,
    pidfile: Option<String>,
    resendmax: Option<Duration>,
    resendtimeout: Option<Duration>,
    socketpath: Option<String>,
    timeout: Option<Duration>,
}

impl Upstream {
    fn set(&mut self, name: &str, kind: Kind, value: &str) -> Result<(), DaemonFlagError> {
        let bad = |why| DaemonFlagError::BadValue {
            flag: name.to_owned(),
            value: value.to_owned(),
            why,
        };
        match kind {
            Kind::Bool => {
                self.broadcast = Some(go_bool(value).ok_or_else(|| bad("must be true or false"))?);
            }
            Kind::Duration => {
                let d = parse_go_duration(value)
                    .filter(|d| !d.is_zero())
                    .ok_or_else(|| bad("must be a positive duration like 10s, 1m2s or 500ms"))?;
                match name {
                    "resendmax" => self.resendmax = Some(d),
                    "resendtimeout" => self.resendtimeout = Some(d),
                    _ => self.timeout = Some(d),
                }
            }
            Kind::Path => {
                let v = Some(value.to_owned());
                match name {
                    "hostprefix" => self.hostprefix = v,
                    "pidfile" => {
                        if !value.starts_with('/') {
                            return Err(bad("must be an absolute path"));
                        }
                        self.pidfile = v;
                    }
                    _ => {
                        if value.is_empty() {
                            return Err(bad("must not be empty"));
                        }
                        self.socketpath = v;
                    }
                }
            }
        }
        Ok(())
    }
}

/// Parse the arguments after `daemon`.
///
/// # Errors
/// An unknown flag, a missing or bad value, a positional argument, or a bad
/// `xdhcp agent` flag.
pub fn parse_daemon(args: &[OsString]) -> Result<DaemonCommand, DaemonFlagError> {
    let agent_cmd = AgentArgs::augment_args(clap::Command::new("dhcp daemon"));
    let mut upstream = Upstream::default();
    let mut pass: Vec<String> = vec!["dhcp daemon".to_owned()];
    let mut args = args.iter().map(|a| {
        a.to_str()
            .map(str::to_owned)
            .ok_or_else(|| DaemonFlagError::Positional {
                arg: a.to_string_lossy().into_owned(),
            })
    });
    while let Some(arg) = args.next() {
        let arg = arg?;
        if arg == "--" {
            // Go's flag package stops here; the upstream daemon has no
            // positional arguments, so anything after is a mistake.
            return match args.next() {
                Some(next) => Err(DaemonFlagError::Positional { arg: next? }),
                None => break,
            };
        }
        let body = arg
            .strip_prefix("--")
            .or_else(|| arg.strip_prefix('-'))
            .filter(|b| !b.is_empty() && !b.starts_with('-') && !b.starts_with('='));
        let Some(body) = body else {
            return Err(DaemonFlagError::Positional { arg });
        };
        let (name, inline) = match body.split_once('=') {
            Some((n, v)) => (n, Some(v.to_owned())),
            None => (body, None),
        };
        if name == "h" || name == "help" {
            return Ok(DaemonCommand::Help);
        }
        let mut value = |inline: Option<String>| -> Result<String, DaemonFlagError> {
            match inline {
                Some(v) => Ok(v),
                None => args
                    .next()
                    .transpose()?
                    .ok_or_else(|| DaemonFlagError::MissingValue { flag: arg.clone() }),
            }
        };
        if let Some((_, kind, _)) = UPSTREAM_FLAGS.iter().find(|(n, _, _)| *n == name) {
            let v = match (kind, inline) {
                (Kind::Bool, None) => "true".to_owned(),
                (_, inline) => value(inline)?,
            };
            upstream.set(name, *kind, &v)?;
            continue;
        }
        if name == "socket" {
            return Err(DaemonFlagError::SocketFlag);
        }
        let Some(known) = agent_cmd
            .get_arguments()
            .find(|a| a.get_long() == Some(name))
        else {
            return Err(DaemonFlagError::Unknown { flag: arg });
        };
        if known.get_action().takes_values() {
            let v = value(inline)?;
            pass.push(format!("--{name}={v}"));
        } else {
            pass.push(match inline {
                Some(v) => format!("--{name}={v}"),
                None => format!("--{name}"),
            });
        }
    }
    let matches = agent_cmd
        .try_get_matches_from(pass)
        .map_err(|e| DaemonFlagError::Agent(e.render().to_string().trim_end().to_owned()))?;
    let mut agent = AgentArgs::from_arg_matches(&matches)
        .map_err(|e| DaemonFlagError::Agent(e.render().to_string().trim_end().to_owned()))?;
    apply(&mut agent, upstream);
    Ok(DaemonCommand::Run(Box::new(agent)))
}

/// Put the upstream flags' meanings onto the agent's flags.
fn apply(agent: &mut AgentArgs, up: Upstream) {
    let prefix = up.hostprefix.unwrap_or_default();
    let socket = up.socketpath.unwrap_or_else(|| UPSTREAM_SOCKET.to_owned());
    // The upstream daemon joins by concatenation: `-hostprefix /host`
    // serves `/host/run/cni/dhcp.sock` and opens `/host/var/run/netns/…`.
    agent.socket = PathBuf::from(format!("{prefix}{socket}"));
    if !prefix.is_empty() {
        agent.host_prefix = Some(PathBuf::from(prefix));
    }
    if let Some(p) = up.pidfile {
        agent.pidfile = Some(PathBuf::from(p));
    }
    if let Some(b) = up.broadcast {
        agent.broadcast_flag = b;
    }
    if let Some(d) = up.timeout {
        agent.retransmit_initial = d;
    }
    if let Some(d) = up.resendmax {
        agent.retransmit_max = d;
    }
    if let Some(d) = up.resendtimeout {
        agent.acquire_timeout = d;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    fn run(v: &[&str]) -> AgentArgs {
        match parse_daemon(&os(v)) {
            Ok(DaemonCommand::Run(a)) => *a,
            other => panic!("{v:?}: {other:?}"),
        }
    }

    fn refused(v: &[&str]) -> DaemonFlagError {
        parse_daemon(&os(v)).expect_err("must be refused")
    }

    #[test]
    fn bare_daemon_serves_the_upstream_socket_with_xdhcp_defaults() {
        let a = run(&[]);
        let defaults = AgentArgs::with_defaults(a.socket.clone(), a.state_dir.clone());
        assert_eq!(a.socket, PathBuf::from("/run/cni/dhcp.sock"));
        assert_eq!(a.host_prefix, None);
        assert_eq!(a.pidfile, None);
        assert!(!a.broadcast_flag);
        assert_eq!(a.retransmit_initial, defaults.retransmit_initial);
        assert_eq!(a.retransmit_max, defaults.retransmit_max);
        assert_eq!(a.acquire_timeout, defaults.acquire_timeout);
        assert_eq!(a.state_dir, PathBuf::from("/var/lib/xdhcp"));
    }

    #[test]
    fn upstream_flags_in_every_go_spelling() {
        let a = run(&[
            "-socketpath",
            "/tmp/d.sock",
            "--hostprefix=/host",
            "-pidfile=/run/dhcp.pid",
            "-broadcast",
            "-timeout",
            "2s",
            "--resendmax",
            "1m2s",
            "-resendtimeout=3m28s",
        ]);
        assert_eq!(a.socket, PathBuf::from("/host/tmp/d.sock"));
        assert_eq!(a.host_prefix, Some(PathBuf::from("/host")));
        assert_eq!(a.pidfile, Some(PathBuf::from("/run/dhcp.pid")));
        assert!(a.broadcast_flag);
        assert_eq!(a.retransmit_initial, Duration::from_secs(2));
        assert_eq!(a.retransmit_max, Duration::from_secs(62));
        assert_eq!(a.acquire_timeout, Duration::from_secs(208));

        assert!(!run(&["-broadcast=false"]).broadcast_flag);
        assert!(run(&["-broadcast=T"]).broadcast_flag);
        assert_eq!(
            run(&["-hostprefix", "/host"]).socket,
            PathBuf::from("/host/run/cni/dhcp.sock")
        );
    }

    #[test]
    fn agent_flags_pass_through() {
        let a = run(&[
            "-socketpath=/tmp/x.sock",
            "--state-dir",
            "/tmp/state",
            "--kube=off",
            "-datapath",
            "afpacket",
            "--extra-socket",
            "/run/xdhcp/xdhcp.sock",
            "--broadcast-flag",
        ]);
        assert_eq!(a.state_dir, PathBuf::from("/tmp/state"));
        assert_eq!(a.kube, crate::settings::KubeMode::Off);
        assert_eq!(a.datapath, crate::settings::DatapathChoice::Afpacket);
        assert_eq!(a.extra_socket, vec![PathBuf::from("/run/xdhcp/xdhcp.sock")]);
        assert!(a.broadcast_flag);
        assert_eq!(a.socket, PathBuf::from("/tmp/x.sock"));
    }

    #[test]
    fn help() {
        assert!(matches!(
            parse_daemon(&os(&["-h"])),
            Ok(DaemonCommand::Help)
        ));
        assert!(matches!(
            parse_daemon(&os(&["-socketpath", "/x", "--help"])),
            Ok(DaemonCommand::Help)
        ));
        let u = daemon_usage();
        for (n, _, _) in UPSTREAM_FLAGS {
            assert!(u.contains(&format!("  -{n}")), "{u}");
        }
    }

    #[test]
    fn bad_command_lines_are_named() {
        assert_eq!(
            refused(&["-bogus"]),
            DaemonFlagError::Unknown {
                flag: "-bogus".into()
            }
        );
        let msg = refused(&["--bogus=1"]).to_string();
        assert!(
            msg.starts_with("flag provided but not defined: --bogus=1"),
            "{msg}"
        );
        assert!(msg.contains("-socketpath"), "{msg}");
        assert_eq!(
            refused(&["-socketpath"]),
            DaemonFlagError::MissingValue {
                flag: "-socketpath".into()
            }
        );
        assert_eq!(
            refused(&["-timeout", "10"]),
            DaemonFlagError::BadValue {
                flag: "timeout".into(),
                value: "10".into(),
                why: "must be a positive duration like 10s, 1m2s or 500ms"
            }
        );
        assert!(matches!(
            refused(&["-timeout=0s"]),
            DaemonFlagError::BadValue { .. }
        ));
        assert!(matches!(
            refused(&["-broadcast=maybe"]),
            DaemonFlagError::BadValue { .. }
        ));
        assert!(matches!(
            refused(&["-pidfile", "dhcp.pid"]),
            DaemonFlagError::BadValue { .. }
        ));
        assert_eq!(
            refused(&["-broadcast", "extra"]),
            DaemonFlagError::Positional {
                arg: "extra".into()
            }
        );
        assert_eq!(
            refused(&["--", "x"]),
            DaemonFlagError::Positional { arg: "x".into() }
        );
        assert_eq!(refused(&["--socket", "/x"]), DaemonFlagError::SocketFlag);
        let DaemonFlagError::Agent(msg) = refused(&["--kube", "sometimes"]) else {
            panic!("clap error expected")
        };
        assert!(msg.contains("sometimes"), "{msg}");
        // `--` alone ends the flags, as in Go.
        assert_eq!(
            run(&["-broadcast", "--"]).socket,
            PathBuf::from(UPSTREAM_SOCKET)
        );
    }

    #[test]
    fn about_names_the_versions() {
        let a = about();
        assert!(a.starts_with("CNI dhcp plugin"), "{a}");
        assert!(a.contains("1.1.0"), "{a}");
    }
}
