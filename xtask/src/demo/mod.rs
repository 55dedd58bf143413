//! `cargo xtask demo`: the main job, end to end, in private network
//! namespaces, on a node built as OVN-Kubernetes builds one.
//!
//! - [`ovn`]: Open vSwitch (userspace datapath) and OVN started in
//!   namespaces and directories of the demo's own, a localnet network, pods
//!   and a KubeVirt VM wired as OVN-Kubernetes wires them, the agent finding
//!   its uplink in OVS. The default.
//! - [`bridge`]: the same job on a Linux bridge with Debian's `bridge` CNI
//!   plugin. What the demo shows where OVS cannot run (the reason is
//!   printed), or with `--bridge`.
//!
//! Both run the agent in embedded mode (`--kube=off`: the `pod-networks`
//! annotations go to the agent's own store) and remove every namespace,
//! process and file they made on exit, on failure and on Ctrl-C.

mod bridge;
mod ovn;

use std::{
    fs,
    io::{IsTerminal as _, Write as _},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::{build, cmd, setup};

#[derive(clap::Args)]
pub struct Args {
    /// How long to wait for the first renewal to show (dnsmasq is told T1 = 10 s).
    #[arg(long, default_value_t = 40)]
    renewal_wait_secs: u64,
    /// Skip `cargo xtask setup`.
    #[arg(long)]
    no_setup: bool,
    /// Show the Linux-bridge demo even where Open vSwitch runs.
    #[arg(long)]
    bridge: bool,
}

/// Everything a demo created; tearing it down kills the processes (newest
/// first: the agent and ovn-controller before the databases they use) and
/// removes the namespaces.
pub(crate) struct Lab {
    prefix: String,
    dir: PathBuf,
    children: Vec<Child>,
    namespaces: Vec<String>,
}

impl Lab {
    pub(crate) fn teardown(&mut self) {
        while let Some(mut child) = self.children.pop() {
            let _ = child.kill();
            let _ = child.wait();
        }
        while let Some(ns) = self.namespaces.pop() {
            let _ = cmd::program("ip")
                .args(["netns", "del", &ns])
                .stderr(Stdio::null())
                .status();
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.teardown();
    }
}

/// The lab, shared with the Ctrl-C handler.
pub(crate) type Shared = Arc<Mutex<Lab>>;

fn locked(lab: &Shared) -> Result<std::sync::MutexGuard<'_, Lab>> {
    lab.lock().map_err(|_| anyhow::anyhow!("lab lock poisoned"))
}

/// The namespace `xdemo-<pid>-<role>`, created (loopback up) and recorded
/// for teardown.
pub(crate) fn add_ns(lab: &Shared, role: &str) -> Result<String> {
    let name = {
        let mut l = locked(lab)?;
        let name = format!("{}-{role}", l.prefix);
        l.namespaces.push(name.clone());
        name
    };
    ip(&["netns", "add", &name])?;
    in_ns(&name, &["ip", "link", "set", "lo", "up"])?;
    Ok(name)
}

/// Removes namespace `ns` now (its links go with it).
pub(crate) fn del_ns(lab: &Shared, ns: &str) -> Result<()> {
    locked(lab)?.namespaces.retain(|n| n != ns);
    ip(&["netns", "del", ns])
}

/// Starts `cmd` and keeps it for teardown.
pub(crate) fn spawn(lab: &Shared, cmd: &mut Command) -> Result<u32> {
    let child = cmd
        .spawn()
        .with_context(|| format!("starting {}", cmd.get_program().to_string_lossy()))?;
    let pid = child.id();
    locked(lab)?.children.push(child);
    Ok(pid)
}

/// Stops the process `pid` started with [`spawn`].
pub(crate) fn stop(lab: &Shared, pid: u32) -> Result<()> {
    let mut l = locked(lab)?;
    if let Some(i) = l.children.iter().position(|c| c.id() == pid) {
        let mut child = l.children.remove(i);
        let _ = child.kill();
        let _ = child.wait();
    }
    Ok(())
}

/// Whether the process `pid` started with [`spawn`] still runs.
pub(crate) fn running(lab: &Shared, pid: u32) -> Result<bool> {
    let mut l = locked(lab)?;
    Ok(l.children
        .iter_mut()
        .find(|c| c.id() == pid)
        .is_some_and(|c| matches!(c.try_wait(), Ok(None))))
}

pub(crate) fn step(n: u32, text: &str) {
    println!("\n\x1b[1;36m[{n}] {text}\x1b[0m");
}

pub(crate) fn ip(args: &[&str]) -> Result<()> {
    cmd::output(cmd::program("ip").args(args)).map(|_| ())
}

/// `ip netns exec <ns> <exe>`: the one place the demo runs a program inside
/// a namespace. `exe` is a table program or the xdhcp binary.
pub(crate) fn netns_exec(ns: &str, exe: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = cmd::program("ip");
    c.args(["netns", "exec", ns]).arg(exe);
    c
}

/// Runs the table program `args[0]` with `args[1..]` inside `ns`.
pub(crate) fn in_ns(ns: &str, args: &[&str]) -> Result<String> {
    let (program, rest) = args.split_first().context("in_ns needs a program")?;
    let out = cmd::output(netns_exec(ns, cmd::executable(program)).args(rest))?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs CNI plugin `plugin` (in `node_ns`, or where xtask runs) with the
/// CNI environment and `conf` on stdin; its stdout.
pub(crate) struct CniCall<'a> {
    pub node_ns: Option<&'a str>,
    pub plugin: &'a Path,
    pub command: &'a str,
    pub container_id: &'a str,
    /// The pod's namespace path (it may be gone, for a DEL).
    pub netns: &'a str,
    pub ifname: &'a str,
    pub cni_path: &'a str,
    pub cni_args: &'a str,
    pub conf: &'a str,
}

impl CniCall<'_> {
    pub(crate) fn run(&self) -> Result<String> {
        let mut c = match self.node_ns {
            Some(ns) => netns_exec(ns, self.plugin),
            None => Command::new(self.plugin),
        };
        let mut child = c
            .env("CNI_COMMAND", self.command)
            .env("CNI_CONTAINERID", self.container_id)
            .env("CNI_NETNS", self.netns)
            .env("CNI_IFNAME", self.ifname)
            .env("CNI_PATH", self.cni_path)
            .env("CNI_ARGS", self.cni_args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("running {}", self.plugin.display()))?;
        child
            .stdin
            .take()
            .context("plugin stdin")?
            .write_all(self.conf.as_bytes())
            .context("writing the network config")?;
        let out = child
            .wait_with_output()
            .with_context(|| format!("waiting for {}", self.plugin.display()))?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            bail!(
                "CNI {} for {} failed: {}{}",
                self.command,
                self.container_id,
                stdout.trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(stdout)
    }
}

/// `xdhcp <what> --socket <sock>` (`leases`, `status`, `bindings`), indented.
pub(crate) fn show(xdhcp: &Path, what: &str, sock: &Path) -> Result<()> {
    let out = cmd::output(Command::new(xdhcp).args([what, "--socket"]).arg(sock))?;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        println!("  {line}");
    }
    Ok(())
}

/// The lines of `xdhcp status` from `uplinks from:` to the counters: where
/// the uplinks come from and each uplink.
pub(crate) fn show_uplinks(xdhcp: &Path, sock: &Path) -> Result<()> {
    let out = cmd::output(Command::new(xdhcp).args(["status", "--socket"]).arg(sock))?;
    let text = String::from_utf8_lossy(&out.stdout);
    for line in text
        .lines()
        .skip_while(|l| !l.starts_with("uplinks from:"))
        .take_while(|l| !l.starts_with("counters:"))
    {
        println!("  {line}");
    }
    Ok(())
}

/// `xdhcp <what> --json`, parsed.
pub(crate) fn query(xdhcp: &Path, what: &str, sock: &Path) -> Result<serde_json::Value> {
    let out = cmd::output(
        Command::new(xdhcp)
            .args([what, "--json", "--socket"])
            .arg(sock),
    )?;
    serde_json::from_slice(&out.stdout).with_context(|| format!("`xdhcp {what} --json`"))
}

pub(crate) fn print_leasefile(path: &Path) {
    let text = fs::read_to_string(path).unwrap_or_default();
    if text.trim().is_empty() {
        println!("    (empty)");
    }
    for line in text.lines() {
        println!("    {line}");
    }
}

/// A dnsmasq log line without its syslog prefix.
pub(crate) fn dnsmasq_line(line: &str) -> &str {
    line.split_once("dnsmasq-dhcp")
        .map_or(line, |(_, r)| r)
        .trim_start_matches(|c: char| {
            c == '[' || c.is_ascii_digit() || c == ']' || c == ':' || c == ' '
        })
}

/// Poll `check` until it is true, with a progress line; fail after `timeout`.
pub(crate) fn wait_for(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> Result<bool>,
) -> Result<()> {
    let start = Instant::now();
    let spinner = ['|', '/', '-', '\\'];
    let tty = std::io::stdout().is_terminal();
    let mut i = 0;
    loop {
        if check()? {
            if tty {
                print!("\r\x1b[2K");
            }
            println!("  {what}: done in {:.1} s", start.elapsed().as_secs_f64());
            return Ok(());
        }
        if start.elapsed() > timeout {
            println!();
            bail!("timed out after {} s waiting for {what}", timeout.as_secs());
        }
        if tty {
            print!(
                "\r  waiting for {what} {} {:>4.1} s",
                spinner[i % 4],
                start.elapsed().as_secs_f64()
            );
            let _ = std::io::stdout().flush();
        }
        i += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// What each step showed: a step whose outcome is not the product's is
/// marked and the demo fails at the end, after every other step ran.
#[derive(Default)]
pub(crate) struct Checks(Vec<String>);

impl Checks {
    /// Records `what`; prints it, marked, when it does not hold.
    pub(crate) fn expect(&mut self, holds: bool, what: &str) {
        if holds {
            println!("  \x1b[32mok\x1b[0m  {what}");
        } else {
            println!("  \x1b[1;31mNOT AS IT SHOULD BE\x1b[0m  {what}");
            self.0.push(what.to_owned());
        }
    }

    fn finish(self) -> Result<()> {
        if self.0.is_empty() {
            return Ok(());
        }
        bail!(
            "{} step outcome(s) were not as they should be:\n  - {}",
            self.0.len(),
            self.0.join("\n  - ")
        )
    }
}

pub fn run(args: &Args) -> Result<()> {
    if !args.no_setup {
        setup::run()?;
    }
    let started = Instant::now();
    let xdhcp = build::release_binary()?;
    let plugin = build::plugin_binary()?;

    let pid = std::process::id();
    let dir = std::env::temp_dir().join(format!("xdhcp-demo-{pid}"));
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let lab: Shared = Arc::new(Mutex::new(Lab {
        prefix: format!("xdemo-{pid}"),
        dir: dir.clone(),
        children: Vec::new(),
        namespaces: Vec::new(),
    }));

    // Ctrl-C: tear down, then exit non-zero.
    let interrupted = Arc::new(AtomicBool::new(false));
    {
        let lab = Arc::clone(&lab);
        let interrupted = Arc::clone(&interrupted);
        ctrlc::set_handler(move || {
            interrupted.store(true, Ordering::SeqCst);
            eprintln!("\ninterrupted: tearing the lab down");
            if let Ok(mut lab) = lab.lock() {
                lab.teardown();
            }
            std::process::exit(130);
        })
        .context("installing the Ctrl-C handler")?;
    }

    let demo_start = Instant::now();
    let mut checks = Checks::default();
    let result = if args.bridge {
        println!("the Linux-bridge demo (--bridge)");
        bridge::run(args, &lab, &xdhcp)
    } else {
        match ovn::why_not() {
            Some(why) => {
                println!(
                    "\x1b[1;33mOpen vSwitch cannot run here ({why}): showing the Linux-bridge demo instead\x1b[0m"
                );
                bridge::run(args, &lab, &xdhcp)
            }
            None => match ovn::run(args, &lab, &xdhcp, &plugin, &mut checks) {
                Err(e) if e.downcast_ref::<ovn::NoOvs>().is_some() => {
                    println!(
                        "\x1b[1;33mOpen vSwitch could not run here ({e:#}): showing the Linux-bridge demo instead\x1b[0m"
                    );
                    locked(&lab)?.teardown();
                    bridge::run(args, &lab, &xdhcp)
                }
                other => other,
            },
        }
    };
    let mut guard = locked(&lab)?;
    if result.is_err() {
        eprintln!("\ndemo failed; logs are in {}", guard.dir.display());
        for log in [
            "agent.log",
            "dnsmasq.log",
            "ovs-vswitchd.log",
            "ovn-controller.log",
        ] {
            let path = guard.dir.join(log);
            if let Ok(text) = fs::read_to_string(&path) {
                eprintln!("--- last lines of {log} ---");
                let lines: Vec<&str> = text.lines().rev().take(15).collect();
                for line in lines.into_iter().rev() {
                    eprintln!("{line}");
                }
            }
        }
    }
    println!("\n\x1b[1;36m[-] tearing the lab down\x1b[0m");
    guard.teardown();
    println!("removed namespaces {}-*", guard.prefix);
    if result.is_ok() {
        let _ = fs::remove_dir_all(&guard.dir);
    }
    println!(
        "the demo took {:.1} s (set-up and build before it: {:.1} s)",
        demo_start.elapsed().as_secs_f64(),
        (demo_start - started).as_secs_f64()
    );
    result?;
    checks.finish()
}
