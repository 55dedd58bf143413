//! `xdhcp`: the CNI plugin when `CNI_COMMAND` is set, else the agent and the
//! operator commands.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use xdhcp::cli::{Cli, Command};

#[expect(
    clippy::print_stderr,
    reason = "the binary's edge reports the error chain"
)]
fn main() -> ExitCode {
    if std::env::var_os("CNI_COMMAND").is_some() {
        return xdhcp::cni::main();
    }
    if let Err(e) = run(Cli::parse()) {
        eprintln!("xdhcp: {e:#}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let text = match cli.command {
        Command::Agent(args) => {
            xdhcp::telemetry::init(args.log_format).context("setting up logging")?;
            let rt = xdhcp::cli::agent_runtime().context("starting the runtime")?;
            let agent = xdhcp::daemon::run_until_signal(*args);
            return rt.block_on(agent).context("xdhcp agent");
        }
        Command::Leases(a) => xdhcp::cli::leases_text(&a).context("xdhcp leases")?,
        Command::Bindings(a) => xdhcp::cli::bindings_text(&a).context("xdhcp bindings")?,
        Command::Status(a) => xdhcp::cli::status_text(&a).context("xdhcp status")?,
    };
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes()).context("writing to stdout")
}
