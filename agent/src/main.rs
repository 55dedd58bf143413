//! `xdhcp`, also installed as `dhcp`: the CNI plugin when `CNI_COMMAND` is
//! set, the agent under the upstream daemon's command line for `daemon`,
//! else the agent and the operator commands.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use xdhcp::cli::upstream::{self, DaemonCommand, Invocation};
use xdhcp::cli::{AgentArgs, Cli, Command};

#[expect(
    clippy::print_stderr,
    reason = "the binary's edge reports the error chain"
)]
fn main() -> ExitCode {
    let args: Vec<_> = std::env::args_os().collect();
    let cni_command = std::env::var_os("CNI_COMMAND");
    match upstream::classify(&args, cni_command.as_deref()) {
        Invocation::Plugin => xdhcp::cni::main(),
        Invocation::About => {
            eprint!("{}", upstream::about());
            ExitCode::SUCCESS
        }
        Invocation::Daemon(flags) => match upstream::parse_daemon(&flags) {
            Ok(DaemonCommand::Help) => {
                eprint!("{}", upstream::daemon_usage());
                ExitCode::SUCCESS
            }
            Ok(DaemonCommand::Run(agent)) => report(run_agent(*agent)),
            Err(e) => {
                eprintln!("dhcp daemon: {e}\nrun `dhcp daemon -h` for the flags");
                ExitCode::from(2)
            }
        },
        Invocation::Cli => report(run(Cli::parse_from(args))),
    }
}

#[expect(
    clippy::print_stderr,
    reason = "the binary's edge reports the error chain"
)]
fn report(r: anyhow::Result<()>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xdhcp: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run_agent(args: AgentArgs) -> anyhow::Result<()> {
    xdhcp::telemetry::init(args.log_format).context("setting up logging")?;
    let rt = xdhcp::cli::agent_runtime().context("starting the runtime")?;
    let agent = xdhcp::daemon::run_until_signal(args);
    rt.block_on(agent).context("xdhcp agent")
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let text = match cli.command {
        Command::Agent(args) => return run_agent(*args),
        Command::Leases(a) => xdhcp::cli::leases_text(&a).context("xdhcp leases")?,
        Command::Bindings(a) => xdhcp::cli::bindings_text(&a).context("xdhcp bindings")?,
        Command::Status(a) => xdhcp::cli::status_text(&a).context("xdhcp status")?,
        Command::Unpin(a) => xdhcp::cli::unpin_text(&a).context("xdhcp unpin")?,
    };
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes()).context("writing to stdout")
}
