//! `xdhcp`: the CNI plugin when `CNI_COMMAND` is set, else the agent and the
//! operator commands.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use xdhcp::cli::{Cli, Command};

fn main() -> ExitCode {
    if std::env::var_os("CNI_COMMAND").is_some() {
        return xdhcp::cni::main();
    }
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            #[expect(
                clippy::print_stderr,
                reason = "the binary's edge reports the error chain"
            )]
            {
                eprintln!("xdhcp: {e:#}");
            }
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let text = match cli.command {
        Command::Agent(args) => {
            xdhcp::telemetry::init(args.log_format).context("setting up logging")?;
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            return rt
                .block_on(xdhcp::daemon::run_until_signal(*args))
                .context("xdhcp agent");
        }
        Command::Leases(a) => xdhcp::daemon::leases_text(&a).context("xdhcp leases")?,
        Command::Status(a) => xdhcp::daemon::status_text(&a).context("xdhcp status")?,
    };
    std::io::stdout()
        .lock()
        .write_all(text.as_bytes())
        .context("writing to stdout")
}
