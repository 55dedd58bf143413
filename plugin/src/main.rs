//! `xdhcp-plugin`, installed as `dhcp` and `xdhcp` in the CNI bin
//! directory: the CNI plugin when `CNI_COMMAND` is set, the upstream
//! plugin's about text for a bare `dhcp`; everything else (`daemon`,
//! `agent`, `leases`, `status`, `--help`, …) is handed over to the agent
//! binary `xdhcp-agent` beside it, with the same arguments.

use std::process::ExitCode;

use xdhcp_plugin::invocation::{self, Invocation};

#[expect(
    clippy::print_stderr,
    reason = "the binary's edge reports what it could not run"
)]
fn main() -> ExitCode {
    let args: Vec<_> = std::env::args_os().collect();
    let cni_command = std::env::var_os("CNI_COMMAND");
    match invocation::classify(&args, cni_command.as_deref()) {
        Invocation::Plugin => xdhcp_plugin::run::main(),
        Invocation::About => {
            eprint!("{}", invocation::about());
            ExitCode::SUCCESS
        }
        Invocation::Daemon(_) | Invocation::Cli => {
            let e = invocation::exec_agent(&args);
            eprintln!("xdhcp: {e}");
            ExitCode::from(127)
        }
    }
}
