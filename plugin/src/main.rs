//! `xdhcp-plugin`, installed as `dhcp` and `xdhcp` in the CNI bin
//! directory: the CNI plugin when `CNI_COMMAND` is set, the upstream
//! plugin's about text for a bare `dhcp`; everything else (`daemon`,
//! `agent`, `leases`, `status`, `--help`, …) is handed over to the agent
//! binary `xdhcp-agent` beside it, with the same arguments
//! ([`xdhcp_plugin::invocation::main`]).

fn main() -> std::process::ExitCode {
    xdhcp_plugin::invocation::main()
}
