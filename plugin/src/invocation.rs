//! What one execution of `dhcp`/`xdhcp` is, from its arguments and
//! `CNI_COMMAND`, and how the plugin binary hands everything that is not
//! the plugin over to the agent binary.
//!
//! The upstream `dhcp` plugin's process interface: `dhcp daemon [flags]`
//! runs the daemon; `dhcp` with no arguments and no `CNI_COMMAND` prints
//! what the plugin is and the CNI versions it speaks, and exits 0; with
//! `CNI_COMMAND` set it is the plugin. Like upstream, `daemon` as the first
//! argument wins over `CNI_COMMAND`. Pure argument handling, except
//! [`main`], [`agent_binary`] and [`exec_agent`].

use std::ffi::{OsStr, OsString};
use std::io;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::types::SUPPORTED_VERSIONS;

/// The name the upstream plugin is installed under.
pub const UPSTREAM_NAME: &str = "dhcp";

/// The agent binary's file name: installed beside the plugin binary (which
/// is installed as `dhcp` and `xdhcp`), it runs `dhcp daemon`, `xdhcp agent`
/// and the operator commands the plugin hands over to it.
pub const AGENT_NAME: &str = "xdhcp-agent";

/// What one execution of the binary is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invocation {
    /// `<any name> daemon …`: the agent with the upstream daemon's flags
    /// (the arguments after `daemon`).
    Daemon(Vec<OsString>),
    /// `CNI_COMMAND` is set: the CNI plugin.
    Plugin,
    /// `dhcp` with no arguments and no `CNI_COMMAND`: the about text.
    About,
    /// Everything else: `xdhcp agent|leases|bindings|status`.
    Cli,
}

/// The plugin binary's `main`: run what this execution is — the plugin
/// ([`crate::run::main`]), the about text, or the agent binary.
#[expect(
    clippy::print_stderr,
    reason = "the binary's edge reports what it could not run"
)]
pub fn main() -> ExitCode {
    let args: Vec<_> = std::env::args_os().collect();
    let cni_command = std::env::var_os("CNI_COMMAND");
    match classify(&args, cni_command.as_deref()) {
        Invocation::Plugin => crate::run::main(),
        Invocation::About => {
            eprint!("{}", about());
            ExitCode::SUCCESS
        }
        Invocation::Daemon(_) | Invocation::Cli => {
            let e = exec_agent(&args);
            eprintln!("xdhcp: {e}");
            ExitCode::from(127)
        }
    }
}

/// Classify an execution by its arguments (`args[0]` included) and the
/// value of `CNI_COMMAND`.
pub fn classify(args: &[OsString], cni_command: Option<&OsStr>) -> Invocation {
    if args.get(1).is_some_and(|a| a == "daemon") {
        return Invocation::Daemon(args[2..].to_vec());
    }
    let as_dhcp = args
        .first()
        .and_then(|a| Path::new(a).file_name())
        .is_some_and(|n| n == UPSTREAM_NAME);
    match cni_command {
        // The upstream plugin treats an empty CNI_COMMAND as unset.
        Some(c) if !(as_dhcp && c.is_empty()) => Invocation::Plugin,
        _ if as_dhcp && args.len() <= 1 => Invocation::About,
        _ => Invocation::Cli,
    }
}

/// What `dhcp` prints on stderr when run with nothing to do.
pub fn about() -> String {
    format!(
        "CNI dhcp plugin (xdhcp {}): run `dhcp daemon` for the daemon\nCNI protocol versions supported: {}\n",
        env!("CARGO_PKG_VERSION"),
        SUPPORTED_VERSIONS.join(", ")
    )
}

/// Where the agent binary is for a plugin invoked as `arg0` whose own
/// file is `exe` (`/proc/self/exe`, symbolic links resolved): [`AGENT_NAME`]
/// in the directory the plugin was invoked from (a runtime execs plugins by
/// their path in `CNI_PATH`), else beside the plugin's own file.
pub fn agent_binary(arg0: Option<&Path>, exe: Option<&Path>) -> Option<PathBuf> {
    let invoked = arg0
        .filter(|a| a.parent().is_some_and(|d| !d.as_os_str().is_empty()))
        .map(|a| a.with_file_name(AGENT_NAME));
    match invoked {
        Some(p) if p.exists() || exe.is_none() => Some(p),
        _ => exe.map(|e| e.with_file_name(AGENT_NAME)).or(invoked),
    }
}

/// Replace this process with the agent binary, keeping `args` (`args[0]`
/// too, so the agent sees the name it was invoked as, `dhcp` or `xdhcp`).
/// Returns only on failure, with what was tried.
pub fn exec_agent(args: &[OsString]) -> io::Error {
    use std::os::unix::process::CommandExt as _;
    let exe = std::env::current_exe().ok();
    let Some(agent) = agent_binary(args.first().map(Path::new), exe.as_deref()) else {
        return io::Error::new(
            io::ErrorKind::NotFound,
            format!("cannot find the plugin's own path to locate {AGENT_NAME} beside it"),
        );
    };
    let mut cmd = std::process::Command::new(&agent);
    if let Some(arg0) = args.first() {
        cmd.arg0(arg0);
    }
    let e = cmd.args(args.iter().skip(1)).exec();
    io::Error::new(
        e.kind(),
        format!(
            "cannot run the xdhcp agent binary {} (installed beside the plugin as {AGENT_NAME}): {e}",
            agent.display()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    #[test]
    fn classify_by_name_arguments_and_cni_command() {
        let add = Some(OsStr::new("ADD"));
        let empty = Some(OsStr::new(""));
        assert_eq!(
            classify(&os(&["/opt/cni/bin/dhcp", "daemon", "-broadcast"]), add),
            Invocation::Daemon(os(&["-broadcast"]))
        );
        assert_eq!(
            classify(&os(&["xdhcp", "daemon"]), None),
            Invocation::Daemon(vec![])
        );
        assert_eq!(
            classify(&os(&["/opt/cni/bin/dhcp"]), add),
            Invocation::Plugin
        );
        assert_eq!(classify(&os(&["xdhcp"]), add), Invocation::Plugin);
        assert_eq!(
            classify(&os(&["/opt/cni/bin/dhcp"]), None),
            Invocation::About
        );
        assert_eq!(classify(&os(&["dhcp"]), empty), Invocation::About);
        assert_eq!(classify(&os(&["xdhcp"]), empty), Invocation::Plugin);
        assert_eq!(classify(&os(&["xdhcp"]), None), Invocation::Cli);
        assert_eq!(classify(&os(&["dhcp", "leases"]), None), Invocation::Cli);
        assert_eq!(classify(&[], None), Invocation::Cli);
    }

    #[test]
    fn the_agent_is_beside_the_plugin() {
        let dir = tempfile::tempdir().unwrap();
        let invoked = dir.path().join("dhcp");
        let exe = Path::new("/usr/libexec/xdhcp/xdhcp-plugin");
        // Nothing where it was invoked from: beside its own file.
        assert_eq!(
            agent_binary(Some(&invoked), Some(exe)),
            Some(PathBuf::from("/usr/libexec/xdhcp/xdhcp-agent"))
        );
        // Installed beside the name it was invoked by (a link farm): that one.
        std::fs::write(dir.path().join(AGENT_NAME), b"").unwrap();
        assert_eq!(
            agent_binary(Some(&invoked), Some(exe)),
            Some(dir.path().join(AGENT_NAME))
        );
        // Run from $PATH (no directory in argv[0]): beside its own file.
        assert_eq!(
            agent_binary(Some(Path::new("dhcp")), Some(exe)),
            Some(PathBuf::from("/usr/libexec/xdhcp/xdhcp-agent"))
        );
        assert_eq!(agent_binary(Some(Path::new("dhcp")), None), None);
    }

    #[test]
    fn about_lists_the_versions() {
        let a = about();
        assert!(a.contains("dhcp daemon"), "{a}");
        assert!(a.contains("0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0"), "{a}");
    }
}
