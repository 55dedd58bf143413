//! `cargo xtask demo`: the main job, end to end, in private network namespaces.
//!
//! The lab (all of it in namespaces this command creates, removed on exit,
//! on failure and on Ctrl-C):
//!
//! ```text
//!   xdemo-<pid>-dhcp          xdemo-<pid>-node                 xdemo-<pid>-pod1 / pod2
//!   dnsmasq on dhcp0  <veth>  uplink ─ br-phys (the "physical  eth0 (created by the
//!   192.0.2.1/24              network" bridge)  ─ veth ─────── Debian bridge CNI plugin)
//! ```
//!
//! The agent runs in embedded mode (`--kube=off`); the Debian `bridge` CNI
//! plugin runs inside the node namespace with `ipam.type = xdhcp`, so the
//! xdhcp plugin talks to the agent exactly as it would on a node.

use std::{
    fs,
    io::{IsTerminal as _, Write as _},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        Arc,
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
}

const PODS: [&str; 2] = ["pod1", "pod2"];

/// Everything the demo created; dropping it tears the lab down.
struct Lab {
    prefix: String,
    dir: PathBuf,
    children: Vec<Child>,
}

impl Lab {
    fn ns(&self, role: &str) -> String {
        format!("{}-{role}", self.prefix)
    }

    fn teardown(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.children.clear();
        for role in ["dhcp", "node", "pod1", "pod2"] {
            let _ = cmd::program("ip")
                .args(["netns", "del", &self.ns(role)])
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

fn step(n: u32, text: &str) {
    println!("\n\x1b[1;36m[{n}] {text}\x1b[0m");
}

fn ip(args: &[&str]) -> Result<()> {
    cmd::output(cmd::program("ip").args(args)).map(|_| ())
}

/// `ip netns exec <ns> <exe>`: the one place the demo runs a program inside
/// a namespace. `exe` is a table program or the xdhcp binary.
fn netns_exec(ns: &str, exe: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = cmd::program("ip");
    c.args(["netns", "exec", ns]).arg(exe);
    c
}

/// Runs the table program `args[0]` with `args[1..]` inside `ns`.
fn in_ns(ns: &str, args: &[&str]) -> Result<String> {
    let (program, rest) = args.split_first().context("in_ns needs a program")?;
    let out = cmd::output(netns_exec(ns, cmd::executable(program)).args(rest))?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub fn run(args: &Args) -> Result<()> {
    if !args.no_setup {
        setup::run()?;
    }
    let xdhcp = build::release_binary()?;

    let pid = std::process::id();
    let dir = std::env::temp_dir().join(format!("xdhcp-demo-{pid}"));
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let lab = Arc::new(std::sync::Mutex::new(Lab {
        prefix: format!("xdemo-{pid}"),
        dir: dir.clone(),
        children: Vec::new(),
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

    let result = run_lab(args, &lab, &xdhcp);
    let mut guard = lab
        .lock()
        .map_err(|_| anyhow::anyhow!("lab lock poisoned"))?;
    if result.is_err() {
        eprintln!("\ndemo failed; logs are in {}", guard.dir.display());
        for log in ["agent.log", "dnsmasq.log"] {
            let path = guard.dir.join(log);
            if let Ok(text) = fs::read_to_string(&path) {
                eprintln!("--- last lines of {log} ---");
                for line in text
                    .lines()
                    .rev()
                    .take(15)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                {
                    eprintln!("{line}");
                }
            }
        }
    }
    step(9, "tearing the lab down");
    guard.teardown();
    println!("removed namespaces {}-*", guard.prefix);
    if result.is_ok() {
        let _ = fs::remove_dir_all(&guard.dir);
    }
    result
}

#[expect(
    clippy::too_many_lines,
    reason = "the demo reads top to bottom as the steps it prints"
)]
fn run_lab(args: &Args, lab: &Arc<std::sync::Mutex<Lab>>, xdhcp: &Path) -> Result<()> {
    let (prefix, dir) = {
        let l = lab
            .lock()
            .map_err(|_| anyhow::anyhow!("lab lock poisoned"))?;
        (l.prefix.clone(), l.dir.clone())
    };
    let ns = |role: &str| format!("{prefix}-{role}");
    let spawn = |cmd: &mut Command| -> Result<()> {
        let child = cmd.spawn().context("spawning")?;
        lab.lock()
            .map_err(|_| anyhow::anyhow!("lab lock poisoned"))?
            .children
            .push(child);
        Ok(())
    };

    step(
        1,
        "creating the lab: a DHCP server, a node with a \"physical network\" bridge, two pods",
    );
    for role in ["dhcp", "node", "pod1", "pod2"] {
        ip(&["netns", "add", &ns(role)])?;
        in_ns(&ns(role), &["ip", "link", "set", "lo", "up"])?;
    }
    in_ns(
        &ns("node"),
        &["ip", "link", "add", "br-phys", "type", "bridge"],
    )?;
    in_ns(&ns("node"), &["ip", "link", "set", "br-phys", "up"])?;
    in_ns(
        &ns("node"),
        &[
            "ip",
            "link",
            "add",
            "uplink",
            "type",
            "veth",
            "peer",
            "name",
            "dhcp0",
            "netns",
            &ns("dhcp"),
        ],
    )?;
    in_ns(
        &ns("node"),
        &["ip", "link", "set", "uplink", "master", "br-phys", "up"],
    )?;
    in_ns(
        &ns("dhcp"),
        &["ip", "addr", "add", "192.0.2.1/24", "dev", "dhcp0"],
    )?;
    in_ns(&ns("dhcp"), &["ip", "link", "set", "dhcp0", "up"])?;
    println!("  namespaces {prefix}-{{dhcp,node,pod1,pod2}}, bridge br-phys, server 192.0.2.1/24");

    step(
        2,
        "starting dnsmasq (range 192.0.2.100-150, lease 2 min, T1 10 s, T2 20 s)",
    );
    let leases = dir.join("dnsmasq.leases");
    let dns_log = dir.join("dnsmasq.log");
    spawn(
        netns_exec(&ns("dhcp"), cmd::executable("dnsmasq"))
            .args(["--no-daemon", "--conf-file=/dev/null"])
            .args([
                "--port=0",
                "--interface=dhcp0",
                "--bind-interfaces",
                "--no-ping",
            ])
            .args([
                "--dhcp-range=192.0.2.100,192.0.2.150,255.255.255.0,2m",
                "--dhcp-authoritative",
            ])
            .args([
                "--dhcp-option=option:router,192.0.2.1",
                "--dhcp-option=option:dns-server,192.0.2.53",
            ])
            .args([
                "--dhcp-option=option:T1,10",
                "--dhcp-option=option:T2,20",
                "--log-dhcp",
            ])
            .arg(format!("--dhcp-leasefile={}", leases.display()))
            .arg(format!("--log-facility={}", dns_log.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )?;

    step(
        3,
        "starting the xdhcp agent in embedded mode (no Kubernetes)",
    );
    let sock = dir.join("xdhcp.sock");
    let state = dir.join("state");
    let agent_log = fs::File::create(dir.join("agent.log")).context("creating agent.log")?;
    spawn(
        Command::new(xdhcp)
            .args(["agent", "--kube", "off", "--socket"])
            .arg(&sock)
            .arg("--state-dir")
            .arg(&state)
            // The demo's own directory, not a bpffs: nothing is pinned and
            // the host's /sys/fs/bpf is left alone.
            .arg("--bpffs-dir")
            .arg(dir.join("bpffs"))
            .stdout(agent_log.try_clone().context("agent log")?)
            .stderr(agent_log),
    )?;
    wait_for("the agent socket", Duration::from_secs(20), || {
        Ok(sock.exists())
    })?;
    println!("  agent listening on {}", sock.display());

    // CNI_PATH holds the Debian bridge plugin and xdhcp installed as `xdhcp`.
    let cni_bin = dir.join("cni-bin");
    fs::create_dir_all(&cni_bin)?;
    let _ = fs::remove_file(cni_bin.join("xdhcp"));
    std::os::unix::fs::symlink(xdhcp, cni_bin.join("xdhcp")).context("installing the plugin")?;
    let path = format!(
        "{}:{}",
        cni_bin.display(),
        xdhcp_testbed::programs::CNI_PLUGIN_DIR
    );
    let conf = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "physnet",
        "type": "bridge",
        "bridge": "br-phys",
        "isGateway": false,
        "ipMasq": false,
        "ipam": { "type": "xdhcp", "socketPath": sock, "hostname": "demo" }
    })
    .to_string();

    step(
        4,
        "CNI ADD for both pods through the Debian bridge plugin (ipam.type = xdhcp)",
    );
    for pod in PODS {
        let started = Instant::now();
        let out = cni(&ns("node"), "ADD", pod, &ns(pod), &path, &conf)?;
        let result: serde_json::Value =
            serde_json::from_str(&out).with_context(|| format!("bridge plugin printed: {out}"))?;
        let addr = result["ips"][0]["address"].as_str().unwrap_or("?");
        let gw = result["ips"][0]["gateway"].as_str().unwrap_or("-");
        println!(
            "  {pod}: eth0 {addr} gateway {gw}  ({} ms)",
            started.elapsed().as_millis()
        );
    }
    for pod in PODS {
        let out = in_ns(&ns(pod), &["ip", "-4", "-br", "addr", "show", "eth0"])?;
        print!("  in {pod}: {out}");
    }

    step(5, "the lease table (`xdhcp leases`)");
    show_leases(xdhcp, &sock)?;
    println!("  dnsmasq's lease file:");
    print_leasefile(&leases);

    step(6, "waiting for a renewal (T1 = 10 s)");
    let renewed = wait_for(
        "a DHCPREQUEST renewal in dnsmasq's log",
        Duration::from_secs(args.renewal_wait_secs),
        || {
            let log = fs::read_to_string(&dns_log).unwrap_or_default();
            // Every pod renewed: a second REQUEST/ACK per pod for the address
            // it already holds (the first ACK per pod was the ADD).
            Ok(log.matches("DHCPACK(dhcp0)").count() >= 2 * PODS.len())
        },
    );
    renewed?;
    let log = fs::read_to_string(&dns_log).unwrap_or_default();
    for line in log
        .lines()
        .filter(|l| l.contains("DHCPREQUEST") || l.contains("DHCPACK"))
        .skip(2 * PODS.len())
        .take(4)
    {
        println!(
            "  dnsmasq: {}",
            line.split_once("dnsmasq-dhcp")
                .map_or(line, |(_, r)| r)
                .trim_start_matches(|c: char| c == '['
                    || c.is_ascii_digit()
                    || c == ']'
                    || c == ':'
                    || c == ' ')
        );
    }
    show_leases(xdhcp, &sock)?;

    step(
        7,
        "CNI DEL in ovnkube-node's order: IPAM DEL (unicast DHCPRELEASE from the leased address), then the bridge plugin",
    );
    println!(
        "  (the bridge plugin removes the veth before it calls IPAM DEL, so the RELEASE must go first;"
    );
    println!(
        "   its own IPAM DEL then finds the lease gone, which DEL's idempotence makes harmless)"
    );
    for pod in PODS {
        cni_exec(&ns("node"), xdhcp, "DEL", pod, &ns(pod), &path, &conf)?;
        cni(&ns("node"), "DEL", pod, &ns(pod), &path, &conf)?;
        println!("  {pod}: released and deleted");
    }
    wait_for(
        "dnsmasq to drop the released leases",
        Duration::from_secs(10),
        || {
            Ok(fs::read_to_string(&leases)
                .unwrap_or_default()
                .trim()
                .is_empty())
        },
    )?;

    step(
        8,
        "dnsmasq's lease file after DEL (the released leases are gone)",
    );
    print_leasefile(&leases);
    let log = fs::read_to_string(&dns_log).unwrap_or_default();
    for line in log.lines().filter(|l| l.contains("DHCPRELEASE")) {
        println!(
            "  dnsmasq: DHCPRELEASE{}",
            line.split_once("DHCPRELEASE")
                .map_or(line, |(_, r)| r)
                .trim()
        );
    }
    show_leases(xdhcp, &sock)?;
    Ok(())
}

/// Runs the Debian bridge plugin in `node_ns` the way a runtime does.
fn cni(
    node_ns: &str,
    command: &str,
    pod: &str,
    pod_ns: &str,
    path: &str,
    conf: &str,
) -> Result<String> {
    cni_exec(
        node_ns,
        Path::new(cmd::executable("cni/bridge")),
        command,
        pod,
        pod_ns,
        path,
        conf,
    )
}

/// Runs CNI plugin `plugin` in `node_ns` with the CNI environment and `conf` on stdin.
fn cni_exec(
    node_ns: &str,
    plugin: &Path,
    command: &str,
    pod: &str,
    pod_ns: &str,
    path: &str,
    conf: &str,
) -> Result<String> {
    let mut child = netns_exec(node_ns, plugin)
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", format!("demo-{pod}"))
        .env("CNI_NETNS", format!("/var/run/netns/{pod_ns}"))
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", path)
        .env(
            "CNI_ARGS",
            format!(
                "IgnoreUnknown=1;K8S_POD_NAMESPACE=demo;K8S_POD_NAME={pod};K8S_POD_UID=uid-{pod}"
            ),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {}", plugin.display()))?;
    child
        .stdin
        .take()
        .context("plugin stdin")?
        .write_all(conf.as_bytes())
        .context("writing the network config")?;
    let out = child
        .wait_with_output()
        .with_context(|| format!("waiting for {}", plugin.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!(
            "CNI {command} for {pod} failed: {}{}",
            stdout.trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(stdout)
}

fn show_leases(xdhcp: &Path, sock: &Path) -> Result<()> {
    let out = cmd::output(Command::new(xdhcp).args(["leases", "--socket"]).arg(sock))?;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        println!("  {line}");
    }
    Ok(())
}

fn print_leasefile(path: &Path) {
    let text = fs::read_to_string(path).unwrap_or_default();
    if text.trim().is_empty() {
        println!("    (empty)");
    }
    for line in text.lines() {
        println!("    {line}");
    }
}

/// Poll `check` until it is true, with a progress line; fail after `timeout`.
fn wait_for(what: &str, timeout: Duration, mut check: impl FnMut() -> Result<bool>) -> Result<()> {
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
        std::thread::sleep(Duration::from_millis(250));
    }
}
