//! The DHCP guard on the workload ports of an Open vSwitch bridge on the
//! userspace datapath, in the OVS + OVN node lab (`xdhcp_tests::OvnLab`:
//! `datapath_type=netdev`, pods wired as OVN-Kubernetes wires them, dnsmasq
//! behind the provider bridge).
//!
//! `ovs-vswitchd` reads the host end of every pod's veth through a packet
//! socket, which the kernel feeds after XDP and before TC ingress: a frame
//! the guard drops at TC ingress has already been copied to OVS, which
//! forwards it. The agent reads the bridge's datapath from the OVS database
//! and polices those ports at XDP. Shown, with the agent in the lab's node
//! namespace reading the lab's database (no `--uplink`):
//!
//! - a rogue dnsmasq in a pod the agent serves: five new pods, each running
//!   its own DHCP client on the segment, hear none of its OFFERs (an
//!   nftables counter in each pod's namespace) and all bind to the real
//!   server; the rogue did answer, and the guard counted its OFFERs;
//! - a DISCOVER flood from a served pod (a made-up MAC per DISCOVER): the
//!   real server behind the provider bridge sees at most the port's burst
//!   and rate, and the guard counts every DISCOVER it let through or
//!   dropped.
//!
//! Checksum offload is off on every lab veth (`OvnLab`). Needs root;
//! fails, never skips, without it.

mod agent_support;

use std::time::Duration;

use agent_support::{CniPath, NodeAgent, ovnk_call};
use xdhcp_tests::ovs_lab::flood;
use xdhcp_tests::servers::ROGUE_IP;
use xdhcp_tests::{Dnsmasq, DnsmasqConfig, NetNs, OvnLab, OvnPod, PluginOutput, wait_until};

/// Where the agent serves its metrics, inside the lab's node namespace.
const METRICS: &str = "127.0.0.1:9464";

/// The lab, dnsmasq behind the provider bridge, `pods` pods (MACs
/// `0a:58:c0:00:02:1x`), and the agent reading the lab's database.
fn lab(pods: u8) -> (OvnLab, Dnsmasq, NodeAgent) {
    let mut lab = OvnLab::start();
    let dnsmasq = Dnsmasq::start(
        &lab.server,
        DnsmasqConfig {
            interface: OvnLab::SERVER_IF.to_owned(),
            ..DnsmasqConfig::default()
        },
    );
    for i in 0..pods {
        lab.add_pod(&format!("pod{i}"), [0x0a, 0x58, 0xc0, 0x00, 0x02, 0x10 + i]);
    }
    let ovsdb = lab.db_socket();
    let ovsdb = ovsdb.to_str().expect("a UTF-8 path");
    let agent = NodeAgent::start(&lab.node, &["--ovsdb", ovsdb, "--metrics-addr", METRICS]);
    (lab, dnsmasq, agent)
}

/// ADD `pod` as ovnkube-node does for a localnet network in DHCP mode:
/// the `dhcp` plugin, the config OVN-Kubernetes writes (with the agent's
/// socket as `daemonSocketPath`), an empty `CNI_ARGS`, and the pod's
/// sandbox id (the one on its `br-int` port) as the container id.
fn ovnk_add(cni: &CniPath, agent: &NodeAgent, pod: &OvnPod) -> PluginOutput {
    ovnk_call(cni, agent, pod, "ADD")
}

/// Serves `pod` through the agent; its port is guarded once the ADD
/// answers.
#[track_caller]
fn serve(cni: &CniPath, agent: &NodeAgent, lab: &OvnLab, pod: &OvnPod, dnsmasq: &Dnsmasq) {
    let r = ovnk_add(cni, agent, pod);
    assert!(
        r.ok,
        "ADD: {} {}\n{}\n{}",
        r.stdout,
        r.stderr,
        agent.log(),
        dnsmasq.log()
    );
    let link = lab
        .node
        .ip(&["-d", "link", "show", "dev", &pod.host_ifname]);
    let tc = lab
        .node
        .exec(&["tc", "filter", "show", "dev", &pod.host_ifname, "ingress"]);
    assert!(
        link.contains("xdhcp_guard") || tc.contains("xdhcp_guard"),
        "{} not guarded: {link}\n{tc}\n{}",
        pod.host_ifname,
        agent.log()
    );
}

/// Where the guard is: its XDP program on the port (the agent read the
/// bridge's datapath from OVS), and no guard filter at TC ingress (each
/// would take a token per DHCP message).
#[track_caller]
fn assert_guarded_at_xdp(lab: &OvnLab, port: &str) {
    let link = lab.node.ip(&["-d", "link", "show", "dev", port]);
    let tc = lab
        .node
        .exec(&["tc", "filter", "show", "dev", port, "ingress"]);
    assert!(
        link.contains("prog/xdp")
            && link.contains("xdhcp_guard_xdp")
            && !tc.contains("xdhcp_guard"),
        "{port} is not guarded at XDP alone: {link}\n{tc}"
    );
}

/// `(passed client messages, dropped for reason)` of guarded port `port`.
fn guard_figures(node: &NetNs, port: &str, reason: &str) -> (u64, u64) {
    flood::guard_figures(node, METRICS.parse().expect("an address"), port, reason)
}

#[test]
fn a_rogue_server_in_a_served_pod_gets_none_of_five_new_pods() {
    let cni = CniPath::new();
    let (lab, dnsmasq, agent) = lab(6);
    let pods = lab.pods();
    let served = &pods[0];
    serve(&cni, &agent, &lab, served, &dnsmasq);

    // A real dnsmasq inside the served pod, on its own range.
    let rogue = Dnsmasq::rogue(&served.ns, &served.ifname, Some(ROGUE_IP));

    // Five new pods, each with its own DHCP client on the segment (as a
    // VM's guest has): every DISCOVER reaches the rogue too.
    let mut bound = Vec::new();
    for pod in &pods[1..] {
        flood::count_server_messages(&pod.ns, ROGUE_IP);
        bound.push(xdhcp_tests::udhcpc_once(&pod.ns, &pod.ifname));
    }
    let heard: Vec<u64> = pods[1..]
        .iter()
        .map(|p| flood::server_messages_seen(&p.ns))
        .collect();
    assert_eq!(
        heard,
        [0; 5],
        "rogue OFFERs reached the new pods; bound: {bound:?}\n{}",
        rogue.log()
    );
    for (i, b) in bound.iter().enumerate() {
        assert!(
            b.is_some_and(|(ip, server)| server == OvnLab::SERVER_IP
                && ip.octets()[..3] == OvnLab::SERVER_IP.octets()[..3]),
            "pod{} bound {b:?}, not to the real server",
            i + 1
        );
    }
    // The rogue did answer, and the guard dropped what it sent.
    assert!(
        rogue.count_in_log("DHCPOFFER") >= 5,
        "the rogue never answered:\n{}",
        rogue.log()
    );
    let mut dropped = 0;
    assert!(
        wait_until(Duration::from_secs(5), || {
            dropped = guard_figures(&lab.node, &served.host_ifname, "server").1;
            dropped >= 5
        }),
        "the guard counted {dropped} dropped server messages\n{}",
        agent.log()
    );
    assert_guarded_at_xdp(&lab, &served.host_ifname);
}

#[test]
fn a_discover_flood_from_a_served_pod_reaches_the_server_at_the_ports_rate() {
    let cni = CniPath::new();
    let (lab, dnsmasq, agent) = lab(1);
    let pod = &lab.pods()[0];
    serve(&cni, &agent, &lab, pod, &dnsmasq);

    let metrics = METRICS.parse().expect("an address");
    flood::assert_flood_held_to_rate(&lab, pod, &dnsmasq, metrics, Duration::from_secs(3));
    assert_guarded_at_xdp(&lab, &pod.host_ifname);
}
