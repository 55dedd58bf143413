//! The Linux-bridge demo: what `cargo xtask demo` shows where Open vSwitch
//! cannot run, or with `--bridge`.
//!
//! ```text
//!   xdemo-<pid>-dhcp          xdemo-<pid>-node                 xdemo-<pid>-pod1 / pod2
//!   dnsmasq on dhcp0  <veth>  uplink ─ br-phys (the "physical  eth0 (created by the
//!   192.0.2.1/24              network" bridge)  ─ veth ─────── Debian bridge CNI plugin)
//! ```
//!
//! The Debian `bridge` CNI plugin runs inside the node namespace with
//! `ipam.type = xdhcp`, so the xdhcp plugin talks to the agent exactly as it
//! would on a node.

use std::{
    fs,
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};

use super::{
    Args, CniCall, Shared, add_ns, dnsmasq_line, in_ns, locked, netns_exec, print_leasefile, show,
    spawn, step, wait_for,
};
use crate::cmd;

const PODS: [&str; 2] = ["pod1", "pod2"];

#[expect(
    clippy::too_many_lines,
    reason = "the demo reads top to bottom as the steps it prints"
)]
pub(super) fn run(args: &Args, lab: &Shared, xdhcp: &Path) -> Result<()> {
    let (prefix, dir) = {
        let l = locked(lab)?;
        (l.prefix.clone(), l.dir.clone())
    };
    let ns = |role: &str| format!("{prefix}-{role}");

    step(
        1,
        "creating the lab: a DHCP server, a node with a \"physical network\" bridge, two pods",
    );
    for role in ["dhcp", "node", "pod1", "pod2"] {
        add_ns(lab, role)?;
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
        lab,
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
        lab,
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
    show(xdhcp, "leases", &sock)?;
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
        println!("  dnsmasq: {}", dnsmasq_line(line));
    }
    show(xdhcp, "leases", &sock)?;

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
    show(xdhcp, "leases", &sock)?;
    Ok(())
}

/// Runs CNI plugin `plugin` in `node_ns` the way a runtime does, for `pod`.
fn cni_exec(
    node_ns: &str,
    plugin: &Path,
    command: &str,
    pod: &str,
    pod_ns: &str,
    path: &str,
    conf: &str,
) -> Result<String> {
    CniCall {
        node_ns: Some(node_ns),
        plugin,
        command,
        container_id: &format!("demo-{pod}"),
        netns: &format!("/var/run/netns/{pod_ns}"),
        ifname: "eth0",
        cni_path: path,
        cni_args: &format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=demo;K8S_POD_NAME={pod};K8S_POD_UID=uid-{pod}"
        ),
        conf,
    }
    .run()
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
