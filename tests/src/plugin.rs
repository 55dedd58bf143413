//! Running a CNI plugin the way a container runtime does: the `CNI_*`
//! environment, the network configuration on stdin, the result on stdout.

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

/// One plugin invocation.
#[derive(Debug, Clone, Copy)]
pub struct PluginCall<'a> {
    pub plugin: &'a Path,
    /// Run the plugin inside this named network namespace (`ip netns exec`),
    /// so main plugins that create bridges and veths do it there, never on
    /// the host.
    pub node_ns: Option<&'a str>,
    pub command: &'a str,
    pub container_id: &'a str,
    /// `CNI_NETNS`; `None` leaves it unset (as for DEL after the namespace is gone).
    pub netns: Option<&'a Path>,
    pub ifname: &'a str,
    pub cni_path: &'a Path,
    pub cni_args: &'a str,
    pub config: &'a str,
}

/// What the plugin answered.
#[derive(Debug, Clone)]
pub struct PluginOutput {
    /// Exit status 0.
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
    /// `stdout` parsed as JSON (`Null` when it is not JSON).
    pub json: serde_json::Value,
}

impl PluginOutput {
    /// `stdout` and `stderr` on one line, for error messages.
    pub fn text(&self) -> String {
        format!("{}{}", self.stdout.trim(), self.stderr.trim())
    }
}

impl PluginCall<'_> {
    /// Runs the plugin and waits for it. Only failing to start it (or to
    /// collect its output) is an error; a plugin that fails says so in
    /// [`PluginOutput::ok`].
    ///
    /// # Errors
    /// The plugin (or `ip`) cannot be started, or its output cannot be read.
    pub fn run(&self) -> std::io::Result<PluginOutput> {
        let mut cmd = match self.node_ns {
            Some(ns) => crate::netns_exec(ns, self.plugin),
            None => Command::new(self.plugin),
        };
        cmd.env("CNI_COMMAND", self.command)
            .env("CNI_CONTAINERID", self.container_id)
            .env("CNI_IFNAME", self.ifname)
            .env("CNI_PATH", self.cni_path)
            .env("CNI_ARGS", self.cni_args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        match self.netns {
            Some(p) => cmd.env("CNI_NETNS", p),
            None => cmd.env_remove("CNI_NETNS"),
        };
        let mut child = cmd.spawn()?;
        // A plugin may exit without reading its config (the upstream one
        // does for VERSION): a broken pipe is its answer, not a failure.
        if let Some(mut stdin) = child.stdin.take() {
            match stdin.write_all(self.config.as_bytes()) {
                Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(e);
                }
                _ => {}
            }
        }
        let out = child.wait_with_output()?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        Ok(PluginOutput {
            ok: out.status.success(),
            json: serde_json::from_str(&stdout).unwrap_or(serde_json::Value::Null),
            stdout,
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }
}
