//! A network becomes a DHCP network with its first ADD, on the real OVS +
//! OVN node lab (userspace datapath), the agent run without
//! `--dhcp-network`: the first pod's ADD and its DEL, milliseconds apart
//! (a lease the agent's once-a-second look at its leases would miss),
//! leave the first pod's port guarded while Open vSwitch holds it, and a
//! second pod's port that appears in OVS afterwards is guarded from OVS
//! before any ADD names it.
//!
//! Needs root and the OVS/OVN packages; fails, never skips, without them.

mod agent_support;

use std::time::Duration;

use agent_support::{CniPath, NodeAgent, ovnk_call};
use xdhcp_tests::{Dnsmasq, DnsmasqConfig, OvnLab, parse_mac, wait_until};

/// The identity `port` is guarded under (`ovs`, `cni`, `both`), if it is.
fn identity(agent: &NodeAgent, port: &str) -> Option<String> {
    agent
        .try_status()?
        .guarded_ports
        .into_iter()
        .find(|p| p.port == port)
        .map(|p| p.identity)
}

#[test]
fn a_network_s_first_add_makes_its_next_port_guarded_before_its_add() {
    let cni = CniPath::new();
    let mut lab = OvnLab::start();
    let dnsmasq = Dnsmasq::start(
        &lab.server,
        DnsmasqConfig {
            interface: OvnLab::SERVER_IF.to_owned(),
            ..DnsmasqConfig::default()
        },
    );
    let first = lab
        .add_pod("pod1", parse_mac("0a:58:c0:00:02:05").expect("a MAC"))
        .host_ifname
        .clone();
    let ovsdb = lab.db_socket();
    let agent = NodeAgent::start(&lab.node, &["--ovsdb", ovsdb.to_str().expect("UTF-8")]);
    assert!(
        wait_until(Duration::from_secs(10), || agent
            .try_status()
            .is_some_and(|s| s.uplinks.iter().any(|u| u.state == "live"))),
        "no uplink found in OVS: {}",
        agent.log()
    );
    // No network named: the pod's port is nobody's yet.
    assert_eq!(identity(&agent, &first), None);

    // The first ADD, and its DEL at once.
    let pod = &lab.pods()[0];
    let r = ovnk_call(&cni, &agent, pod, "ADD");
    assert!(
        r.ok,
        "ADD: {} {}\n{}\n{}",
        r.stdout,
        r.stderr,
        agent.log(),
        dnsmasq.log()
    );
    let r = ovnk_call(&cni, &agent, pod, "DEL");
    assert!(r.ok, "DEL: {} {}\n{}", r.stdout, r.stderr, agent.log());
    // The port stays guarded for OVS after its DEL.
    assert!(
        wait_until(Duration::from_secs(3), || identity(&agent, &first)
            .as_deref()
            == Some("ovs")),
        "{} not guarded from OVS after its DEL: {:?}\n{}",
        first,
        identity(&agent, &first),
        agent.log()
    );

    // The second pod's port appears: guarded from OVS, no ADD.
    let second = lab
        .add_pod("pod2", parse_mac("0a:58:c0:00:02:06").expect("a MAC"))
        .host_ifname
        .clone();
    assert!(
        wait_until(Duration::from_secs(3), || identity(&agent, &second)
            .as_deref()
            == Some("ovs")),
        "{second} not guarded from OVS before its ADD: {:?}\n{}",
        agent.try_status().map(|s| s.guarded_ports),
        agent.log()
    );
    let link = lab.node.ip(&["-d", "link", "show", "dev", &second]);
    assert!(link.contains("xdhcp_guard_xdp"), "{link}");
}
