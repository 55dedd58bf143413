//! Uplinks and workload ports read from Open vSwitch, in the OVS + OVN node lab
//! (`xdhcp_tests::OvnLab`: userspace datapath, a localnet logical switch,
//! provider bridge `br-phys` whose port `eth1` is a veth to the server's
//! namespace, pods wired as OVN-Kubernetes wires them).
//!
//! The `xdhcp agent` binary runs inside the lab's node namespace (`ip netns
//! exec`), where `ovs-vswitchd` runs and `eth1` is, with `--ovsdb` on the
//! lab's own database socket and no `--uplink`. Shown:
//!
//! - it finds `eth1` from `ovn-bridge-mappings` and attaches there with
//!   XDP (the bridge is on the userspace datapath), status and metrics
//!   naming the uplink's physical network, bridge and source;
//! - a pod's OFFER and ACK are taken at that uplink (the lease's path is
//!   `uplink:eth1`), nothing is attached in the pod's namespace, and the
//!   pod's own stack never sees a reply: consumed by XDP, it never reached
//!   `ovs-vswitchd`'s packet socket. With the program at TC instead (an
//!   explicit `--uplink … --attach tc`, which also shows the flag winning
//!   over OVS), OVS still forwards every reply to the pod: under the
//!   userspace datapath TC ingress runs after the packet taps;
//! - a bridge mapping added at run time is attached within a second of
//!   the database transaction (measured and printed), and detached when
//!   the mapping goes;
//! - with no database at `--ovsdb`, or one that never answers, the agent
//!   runs without uplinks (a pod leases on its own path) and says why;
//! - a DEL after the pod's port is gone (out of OVS, its veth deleted)
//!   releases the lease through the uplink, and the server honours it;
//! - the same with Kea behind the provider bridge instead of dnsmasq: the
//!   lease is taken at the uplink, renews there, and is released through it
//!   once the port is gone (Kea's lease file and log show it);
//! - `ovs-vswitchd` and `ovsdb-server` killed under live leases and started
//!   again: every lease renews while they are down and after they are
//!   back, the uplink stays attached throughout, and discovery recovers (a
//!   new pod binds at the uplink, a mapping added after the restart is
//!   attached);
//! - a pod's port of a DHCP network is guarded as soon as it is on `br-int`,
//!   before any ADD (the ADD then finds the guard on: one attachment, its
//!   identity from both OVS and the CNI), and the guard comes off a port
//!   no ADD holds when the port leaves `br-int`; a network becomes a DHCP
//!   network by `--dhcp-network`, or by the agent's first lease on it;
//! - with no uplink (no bridge mapping, the server a workload on the
//!   logical switch), such a port's replies are captured on its host side
//!   (TC egress) from the moment it is on `br-int`: its ADD's first OFFER
//!   and ACK are taken there with nothing attached on or after the ADD,
//!   and the program goes when the port leaves `br-int`.
//!   (What is asserted is the attachment; what the guard stops on a
//!   userspace-datapath port, where it sits at XDP, is `ovs_guard.rs`'s.)
//!
//! Checksum offload is off on every lab veth (`OvnLab`, and
//! `OvnLab::add_provider_bridge` for the added one). Needs root; fails,
//! never skips, without it.

mod agent_support;

use std::path::Path;
use std::time::{Duration, Instant};

use agent_support::{CniPath, NodeAgent, ovnk_call};
use xdhcp_tests::bench::metric_count;
use xdhcp_tests::nft;
use xdhcp_tests::{
    Dnsmasq, DnsmasqConfig, Kea, KeaConfig, NetNs, OvnLab, OvnPod, PluginOutput, parse_mac,
    wait_until,
};

/// Where the agent serves its metrics, inside the lab's node namespace.
const METRICS: &str = "127.0.0.1:9464";

/// The lab with dnsmasq behind the provider bridge and one pod.
fn lab_with_pod() -> (OvnLab, Dnsmasq) {
    let mut lab = OvnLab::start();
    let dnsmasq = Dnsmasq::start(
        &lab.server,
        DnsmasqConfig {
            interface: OvnLab::SERVER_IF.to_owned(),
            ..DnsmasqConfig::default()
        },
    );
    lab.add_pod("pod1", parse_mac("0a:58:c0:00:02:05").unwrap());
    (lab, dnsmasq)
}

/// The agent in `node` (the lab's node namespace), reading OVS at `ovsdb`.
fn agent(node: &NetNs, ovsdb: &Path, extra: &[&str]) -> NodeAgent {
    let ovsdb = ovsdb.to_str().expect("a UTF-8 path");
    let args = [&["--ovsdb", ovsdb, "--metrics-addr", METRICS], extra].concat();
    NodeAgent::start(node, &args)
}

/// ADD `pod` as ovnkube-node does for a localnet network in DHCP mode:
/// the `dhcp` plugin, the config OVN-Kubernetes writes (with the agent's
/// socket as `daemonSocketPath`), an empty `CNI_ARGS`.
fn ovnk_add(cni: &CniPath, agent: &NodeAgent, pod: &OvnPod) -> PluginOutput {
    ovnk_call(cni, agent, pod, "ADD")
}

#[track_caller]
fn add_ok(cni: &CniPath, agent: &NodeAgent, lab: &OvnLab, dnsmasq: &Dnsmasq) {
    let r = ovnk_add(cni, agent, &lab.pods()[0]);
    assert!(
        r.ok,
        "ADD: {} {}\n{}\n{}\novs-vswitchd:\n{}",
        r.stdout,
        r.stderr,
        agent.log(),
        dnsmasq.log(),
        lab.log("ovs-vswitchd")
    );
}

/// Count the DHCP replies the pod's own IP stack receives (an nftables
/// counter at prerouting in its namespace).
fn count_replies_in(ns: &NetNs) {
    nft::add_counter(
        ns,
        "inet xdt_seen",
        "prerouting priority -400",
        &["udp", "sport", "67", "udp", "dport", "68"],
    );
}

fn replies_seen_in(ns: &NetNs) -> u64 {
    nft::counted(ns, "inet xdt_seen")
}

fn attached_xdp(ns: &NetNs, ifname: &str) -> bool {
    ns.ip(&["-d", "link", "show", "dev", ifname])
        .contains("prog/xdp")
}

fn live_uplink(agent: &NodeAgent, ifname: &str) -> Option<xdhcp::rpc::UplinkStatus> {
    agent.live_uplink(ifname)
}

#[track_caller]
fn wait_live(agent: &NodeAgent, ifname: &str, within: Duration) -> xdhcp::rpc::UplinkStatus {
    agent.wait_live_uplink(ifname, within)
}

fn scrape(node: &NetNs) -> String {
    let addr: std::net::SocketAddr = METRICS.parse().expect("an address");
    let mut text = None;
    wait_until(Duration::from_secs(5), || {
        text = node.run_in(move || xdhcp_tests::bench::http_get(addr, "/metrics"));
        text.is_some()
    });
    text.expect("the agent's metrics server answers")
}

#[test]
fn without_uplink_flags_the_agent_captures_at_the_provider_port_ovs_names() {
    let cni = CniPath::new();
    let (lab, dnsmasq) = lab_with_pod();
    let agent = agent(&lab.node, &lab.db_socket(), &[]);

    // (a) Found from ovn-bridge-mappings, attached with XDP: the bridge is
    // on the userspace datapath (a veth has native XDP).
    let up = wait_live(&agent, OvnLab::UPLINK, Duration::from_secs(10));
    assert_eq!(up.physnet.as_deref(), Some(OvnLab::PHYSNET), "{up:?}");
    assert_eq!(
        up.bridge.as_deref(),
        Some(OvnLab::PROVIDER_BRIDGE),
        "{up:?}"
    );
    assert_eq!(up.source, "ovs", "{up:?}");
    assert_eq!(up.mode.as_deref(), Some("xdp-native"), "{up:?}");
    assert!(up.bpf_link.is_some(), "{up:?}");
    assert!(attached_xdp(&lab.node, OvnLab::UPLINK));
    let s = agent.status();
    assert_eq!(s.uplinks.len(), 1, "{:?}", s.uplinks);
    assert_eq!(s.uplink_source.kind, "ovs", "{:?}", s.uplink_source);
    assert_eq!(
        s.uplink_source.state.as_deref(),
        Some("connected"),
        "{:?}",
        s.uplink_source
    );
    assert_eq!(s.uplink_source.ovsdb.as_deref(), Some(&*lab.db_socket()));
    let m = scrape(&lab.node);
    assert_eq!(
        metric_count(
            &m,
            "xdhcp_uplink_attached",
            r#"uplink="eth1",mode="xdp-native",physnet="physnet1",source="ovs""#
        ),
        1,
        "{m}"
    );

    // (b) The pod's OFFER and ACK are taken at the uplink.
    let pod = &lab.pods()[0];
    count_replies_in(&pod.ns);
    add_ok(&cni, &agent, &lab, &dnsmasq);
    assert!(dnsmasq.lease_for(pod.mac).is_some(), "{}", dnsmasq.log());
    let leases = agent.leases();
    assert_eq!(leases.len(), 1, "{leases:?}");
    assert_eq!(leases[0].path, "uplink:eth1", "{leases:?}\n{}", agent.log());
    let s = agent.status();
    assert!(s.uplinks[0].replies >= 2, "{:?}", s.uplinks);
    assert!(s.counters["kernel.dropped_owned"] >= 2, "{:?}", s.counters);
    // Nothing attached in the pod's namespace.
    assert!(
        s.interfaces.iter().all(|i| i.bpf_link.is_none()),
        "{:?}",
        s.interfaces
    );
    assert!(!attached_xdp(&pod.ns, &pod.ifname));
    assert!(
        pod.ns
            .exec(&["tc", "filter", "show", "dev", &pod.ifname, "ingress"])
            .trim()
            .is_empty()
    );
    // Consumed at XDP, the replies never reached ovs-vswitchd's packet
    // socket, so OVS never forwarded them to the pod.
    assert_eq!(replies_seen_in(&pod.ns), 0);
}

/// The evidence for XDP under the userspace datapath: at TC, a reply the
/// program consumes has already been read by `ovs-vswitchd`, which
/// forwards it to the pod. Also: `--uplink` wins, OVS is not read.
#[test]
fn at_tc_a_userspace_datapath_uplink_still_hands_the_reply_to_ovs() {
    let cni = CniPath::new();
    let (lab, dnsmasq) = lab_with_pod();
    let agent = agent(
        &lab.node,
        &lab.db_socket(),
        &["--uplink", "physnet1=eth1", "--attach", "tc"],
    );
    let up = wait_live(&agent, OvnLab::UPLINK, Duration::from_secs(10));
    assert_eq!(up.mode.as_deref(), Some("tc"), "{up:?}");
    assert_eq!(up.source, "flag", "{up:?}");
    let s = agent.status();
    assert_eq!(s.uplink_source.kind, "flag", "{:?}", s.uplink_source);
    assert_eq!(s.uplink_source.ovsdb, None, "{:?}", s.uplink_source);

    let pod = &lab.pods()[0];
    count_replies_in(&pod.ns);
    add_ok(&cni, &agent, &lab, &dnsmasq);
    assert!(
        replies_seen_in(&pod.ns) >= 1,
        "the pod saw no reply with TC at the uplink"
    );
}

/// The measured time, in the test's output (`--nocapture`).
fn report(what: &str, took: Duration) {
    #[expect(clippy::print_stderr, reason = "the figure is useful in test logs")]
    {
        eprintln!("{what} in {took:?}");
    }
}

#[test]
fn a_bridge_mapping_added_at_run_time_is_attached_while_the_agent_runs() {
    let mut lab = OvnLab::start();
    let agent = agent(&lab.node, &lab.db_socket(), &[]);
    wait_live(&agent, OvnLab::UPLINK, Duration::from_secs(10));

    let (added, removed) = agent.check_mapping_added_at_run_time(&mut lab);
    report("mapping added -> eth2 attached", added);
    report("mapping removed -> eth2 detached", removed);
}

#[test]
fn with_no_ovs_database_the_agent_runs_on_the_per_interface_path_and_says_why() {
    let cni = CniPath::new();
    let (lab, dnsmasq) = lab_with_pod();
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("db.sock");
    let agent = agent(&lab.node, &missing, &[]);
    let mut status = None;
    wait_until(Duration::from_secs(5), || {
        status = agent.try_status();
        status
            .as_ref()
            .is_some_and(|s| s.uplink_source.state.as_deref() == Some("unavailable"))
    });
    let s = status.expect("a status");
    assert_eq!(s.uplink_source.kind, "ovs", "{:?}", s.uplink_source);
    assert_eq!(
        s.uplink_source.state.as_deref(),
        Some("unavailable"),
        "{:?}",
        s.uplink_source
    );
    assert!(s.uplink_source.reason.is_some(), "{:?}", s.uplink_source);
    assert!(s.uplinks.is_empty(), "{:?}", s.uplinks);
    assert!(s.ready, "{s:?}");

    // Served on the pod's own path.
    let pod = &lab.pods()[0];
    count_replies_in(&pod.ns);
    add_ok(&cni, &agent, &lab, &dnsmasq);
    let path = agent.leases()[0].path.clone();
    assert!(!path.starts_with("uplink"), "{path}");
    assert!(replies_seen_in(&pod.ns) >= 2);

    // Said once, though the watcher keeps trying.
    let said = |log: &str| log.matches("no Open vSwitch database").count();
    assert!(
        wait_until(Duration::from_secs(3), || said(&agent.log()) == 1),
        "{}",
        agent.log()
    );
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(said(&agent.log()), 1, "{}", agent.log());
}

/// A socket that accepts and never answers: the agent says so too.
#[test]
fn an_ovs_database_that_never_answers_is_reported_unavailable() {
    let node = NetNs::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let mute = dir.path().join("db.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&mute).expect("bind");
    let agent = agent(&node, &mute, &[]);
    assert!(
        wait_until(Duration::from_secs(10), || agent.try_status().is_some_and(
            |s| s.uplink_source.state.as_deref() == Some("unavailable")
        )),
        "{:?}\n{}",
        agent.try_status(),
        agent.log()
    );
    let s = agent.status();
    let reason = s.uplink_source.reason.clone().unwrap_or_default();
    assert!(reason.contains("did not answer"), "{reason}");
    assert!(s.uplinks.is_empty(), "{:?}", s.uplinks);
}

/// A lease on an uplink whose mapping goes falls back to its own receiver
/// (as after a capture loss, without the agent counting itself degraded),
/// and returns to the uplink when the mapping is back.
#[test]
fn a_lease_on_an_uplink_that_is_unmapped_falls_back_and_returns() {
    let cni = CniPath::new();
    let (lab, dnsmasq) = lab_with_pod();
    let agent = agent(&lab.node, &lab.db_socket(), &[]);
    wait_live(&agent, OvnLab::UPLINK, Duration::from_secs(10));
    add_ok(&cni, &agent, &lab, &dnsmasq);
    assert_eq!(agent.leases()[0].path, "uplink:eth1", "{}", agent.log());

    let mappings = lab.bridge_mappings();
    lab.set_bridge_mappings("");
    assert!(
        wait_until(Duration::from_secs(5), || agent.leases()[0].path
            == "af-packet (ebpf lost)"),
        "{:?}\n{}",
        agent.leases(),
        agent.log()
    );
    let s = agent.status();
    assert!(s.uplinks.is_empty(), "{:?}", s.uplinks);
    assert!(!attached_xdp(&lab.node, OvnLab::UPLINK));
    assert_eq!(s.degraded, None);

    lab.set_bridge_mappings(&mappings);
    wait_live(&agent, OvnLab::UPLINK, Duration::from_secs(5));
    assert!(
        wait_until(Duration::from_secs(5), || agent.leases()[0].path
            == "uplink:eth1"),
        "{:?}\n{}",
        agent.leases(),
        agent.log()
    );
}

/// What the guard has on `ifname` (in `ns`), at TC ingress or XDP: empty
/// when nothing.
fn guard_programs(ns: &NetNs, ifname: &str) -> String {
    let mut out = ns.exec(&["tc", "filter", "show", "dev", ifname, "ingress"]);
    if attached_xdp(ns, ifname) {
        out.push_str("xdp");
    }
    out.trim().to_owned()
}

/// The guarded port `port` as `xdhcp status` shows it.
fn guarded(agent: &NodeAgent, port: &str) -> Option<xdhcp::rpc::GuardedPortStatus> {
    agent
        .try_status()?
        .guarded_ports
        .into_iter()
        .find(|p| p.port == port)
}

/// Waits until `port` is guarded with identity `identity`.
#[track_caller]
fn wait_guarded(
    agent: &NodeAgent,
    port: &str,
    identity: &str,
    within: Duration,
) -> xdhcp::rpc::GuardedPortStatus {
    let mut found = None;
    wait_until(within, || {
        found = guarded(agent, port).filter(|p| p.identity == identity);
        found.is_some()
    });
    found.unwrap_or_else(|| {
        panic!(
            "{port} not guarded ({identity}) in {within:?}: {:?}\n{}",
            agent.try_status().map(|s| s.guarded_ports),
            agent.log()
        )
    })
}

/// `xdhcp bindings --json`, as JSON values (with the identity column).
fn bindings(agent: &NodeAgent) -> Vec<serde_json::Value> {
    serde_json::from_str(&agent.cli("bindings").expect("xdhcp bindings")).expect("bindings JSON")
}

#[test]
fn a_port_appearing_in_ovs_is_guarded_before_its_add() {
    let cni = CniPath::new();
    let mut lab = OvnLab::start();
    let dnsmasq = Dnsmasq::start(
        &lab.server,
        DnsmasqConfig {
            interface: OvnLab::SERVER_IF.to_owned(),
            ..DnsmasqConfig::default()
        },
    );
    let agent = agent(
        &lab.node,
        &lab.db_socket(),
        &["--dhcp-network", OvnLab::NETWORK],
    );
    wait_live(&agent, OvnLab::UPLINK, Duration::from_secs(10));
    assert!(agent.status().guarded_ports.is_empty());

    // (a) The pod's port appears on br-int (add_pod returns once
    // ovn-controller has wired it): guarded, its identity from OVS, before
    // any ADD.
    let t0 = Instant::now();
    let pod = lab.add_pod("pod1", parse_mac("0a:58:c0:00:02:05").unwrap());
    let (host, mac, uid, sandbox) = (
        pod.host_ifname.clone(),
        pod.mac,
        pod.uid.clone(),
        pod.sandbox.clone(),
    );
    let p = wait_guarded(&agent, &host, "ovs", Duration::from_secs(5));
    report(
        "port on br-int -> guarded (includes ovn-controller's wiring)",
        t0.elapsed(),
    );
    assert_eq!(p.network.as_deref(), Some(OvnLab::NETWORK), "{p:?}");
    assert_eq!(p.nad.as_deref(), Some(OvnLab::NAD), "{p:?}");
    assert_eq!(p.pod_uid.as_deref(), Some(uid.as_str()), "{p:?}");
    assert_eq!(p.mac, Some(xdhcp_tests::format_mac(mac)), "{p:?}");
    assert_eq!(
        (p.container_id.as_str(), p.ifname.as_str()),
        (sandbox.as_str(), "eth0")
    );
    let before_add = guard_programs(&lab.node, &host);
    assert!(!before_add.is_empty(), "nothing attached on {host}");
    assert!(agent.leases().is_empty());

    // (b) The ADD finds the guard on: the same attachment, now held by the
    // CNI too; one guarded port.
    add_ok(&cni, &agent, &lab, &dnsmasq);
    let p = wait_guarded(&agent, &host, "both", Duration::from_secs(2));
    assert_eq!(p.container_id, sandbox, "{p:?}");
    assert_eq!(agent.status().guarded_ports.len(), 1);
    assert_eq!(
        guard_programs(&lab.node, &host),
        before_add,
        "attached again"
    );
    assert!(
        !agent.log().contains("could not put the DHCP guard"),
        "{}",
        agent.log()
    );
    let rows = bindings(&agent);
    let row = rows
        .iter()
        .find(|r| r["mac"] == xdhcp_tests::format_mac(mac))
        .unwrap_or_else(|| panic!("{rows:?}"));
    assert_eq!(row["port"], host.as_str(), "{row}");
    assert_eq!(row["identity"], "both", "{row}");
    let table = agent_table(&agent, "bindings");
    assert!(
        table.contains("IDENTITY") && table.contains(" both "),
        "{table}"
    );

    // (c) The port leaves br-int while the ADD holds it: still guarded (its
    // DEL lets go), its identity now the CNI's alone.
    lab.remove_pod_port(0);
    wait_guarded(&agent, &host, "cni", Duration::from_secs(2));
    // Off the userspace-datapath bridge nothing reads the port through a
    // packet tap: the guard may move from XDP back to TC ingress, but it
    // stays on.
    assert!(
        !guard_programs(&lab.node, &host).is_empty(),
        "the port lost its guard when it left br-int"
    );

    // (d) A port no ADD ever names: guarded while it is on br-int, and
    // unguarded when it leaves (its veth stays).
    let pod2 = lab.add_pod("pod2", parse_mac("0a:58:c0:00:02:06").unwrap());
    let host2 = pod2.host_ifname.clone();
    wait_guarded(&agent, &host2, "ovs", Duration::from_secs(5));
    assert!(!guard_programs(&lab.node, &host2).is_empty());
    let t0 = Instant::now();
    lab.remove_pod_port(1);
    assert!(
        wait_until(Duration::from_secs(3), || guarded(&agent, &host2).is_none()
            && guard_programs(&lab.node, &host2).is_empty()),
        "{:?}\n{}",
        agent.try_status().map(|s| s.guarded_ports),
        agent.log()
    );
    report("port removed from br-int -> guard detached", t0.elapsed());
    let status_text = agent_table(&agent, "status");
    assert!(status_text.contains("guarded ports"), "{status_text}");
    assert!(status_text.contains(&host), "{status_text}");
}

/// The program on a found port's host side, as the kernel has it: the name
/// of the program behind BPF link `link` (a tcx link, kernels 6.6 and
/// later; `bpftool` 7.1 lists no tcx attachment by device), or, without a
/// link (a clsact filter before tcx), what `tc` lists at the egress of
/// `host` in `node`. Empty when there is none.
fn egress_program(node: &NetNs, host: &str, link: Option<u32>) -> String {
    let Some(link) = link else {
        return node
            .exec(&["tc", "filter", "show", "dev", host, "egress"])
            .trim()
            .to_owned();
    };
    let bpftool = |args: &[&str]| -> Option<serde_json::Value> {
        let out = std::process::Command::new(xdhcp_tests::program("bpftool"))
            .arg("-j")
            .args(args)
            .output()
            .expect("run bpftool");
        out.status
            .success()
            .then(|| serde_json::from_slice(&out.stdout).expect("bpftool JSON"))
    };
    let Some(l) = bpftool(&["link", "show", "id", &link.to_string()]) else {
        return String::new();
    };
    let prog = l["prog_id"]
        .as_u64()
        .expect("the link's program")
        .to_string();
    bpftool(&["prog", "show", "id", &prog])
        .and_then(|p| p["name"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// `host` as `xdhcp status` lists it among the ports captured on their
/// host side.
fn port_capture(agent: &NodeAgent, host: &str) -> Option<xdhcp::rpc::PortCaptureStatus> {
    agent
        .try_status()?
        .port_captures
        .into_iter()
        .find(|p| p.port == host)
}

/// With no uplink, the replies of a port found in OVS are captured on its
/// host side (TC egress in the node's namespace, where `ovs-vswitchd`'s
/// packet socket hands them to the veth) from before its ADD: the ADD's
/// first OFFER and ACK are taken there, the pod's own stack sees none,
/// nothing is attached on or after the ADD, and the program goes when the
/// port leaves `br-int`. The DHCP server is a workload on the logical
/// switch itself (no bridge mapping: no uplink to take the replies).
#[test]
fn with_no_uplink_a_port_found_in_ovs_is_captured_on_its_host_side_before_its_add() {
    let cni = CniPath::new();
    let mut lab = OvnLab::start();
    lab.set_bridge_mappings("");
    let server = lab.add_server_port(parse_mac("0a:58:c0:00:02:01").unwrap());
    let dnsmasq = Dnsmasq::start(
        &server.ns,
        DnsmasqConfig {
            interface: OvnLab::SERVER_IF.to_owned(),
            ..DnsmasqConfig::default()
        },
    );
    let server_host = server.host_ifname.clone();
    let agent = agent(
        &lab.node,
        &lab.db_socket(),
        &["--dhcp-network", OvnLab::NETWORK],
    );
    agent.wait_ovs_source("connected", Duration::from_secs(10));
    let s = agent.status();
    assert!(s.uplinks.is_empty(), "{:?}", s.uplinks);
    assert!(s.port_captures.is_empty(), "{:?}", s.port_captures);

    // (a) The pod's port appears on br-int: its host side is captured
    // before any ADD. The server's port names no network: not captured.
    let t0 = Instant::now();
    let pod = lab.add_pod("pod1", parse_mac("0a:58:c0:00:02:05").unwrap());
    let (host, mac) = (pod.host_ifname.clone(), pod.mac);
    let mut live = None;
    wait_until(Duration::from_secs(5), || {
        live = port_capture(&agent, &host).filter(|p| p.state == "live");
        live.is_some()
    });
    let live = live.unwrap_or_else(|| {
        panic!(
            "{host} not captured in 5 s: {:?}\n{}",
            agent.try_status().map(|s| s.port_captures),
            agent.log()
        )
    });
    report(
        "port on br-int -> captured on its host side (includes ovn-controller's wiring)",
        t0.elapsed(),
    );
    assert_eq!(live.hook.as_deref(), Some("tc-egress"), "{live:?}");
    assert_eq!(live.mac, xdhcp_tests::format_mac(mac), "{live:?}");
    assert_eq!(live.network.as_deref(), Some(OvnLab::NETWORK), "{live:?}");
    let on_port = egress_program(&lab.node, &host, live.bpf_link);
    assert!(on_port.contains("xdhcp_tc"), "{on_port:?} {live:?}");
    assert!(port_capture(&agent, &server_host).is_none());
    assert!(agent.leases().is_empty());
    let table = agent_table(&agent, "status");
    assert!(
        table.contains("captured on their host side") && table.contains(&host),
        "{table}"
    );

    // (b) The ADD: its first OFFER and ACK are taken by that capture (the
    // lease's path names the port from the start, the replies are counted
    // there, the pod's own stack saw none of them) and nothing is attached
    // for it, then or after (past the held lease's move to the ring).
    let pod = &lab.pods()[0];
    count_replies_in(&pod.ns);
    let attaches_before = agent.log().matches(" attached ").count();
    add_ok(&cni, &agent, &lab, &dnsmasq);
    assert!(dnsmasq.lease_for(mac).is_some(), "{}", dnsmasq.log());
    let leases = agent.leases();
    assert_eq!(leases.len(), 1, "{leases:?}");
    assert_eq!(
        leases[0].path,
        format!("port:{host}"),
        "{leases:?}\n{}",
        agent.log()
    );
    let p = port_capture(&agent, &host).expect("still captured");
    assert!(p.replies >= 2, "{p:?}");
    assert_eq!(replies_seen_in(&pod.ns), 0);
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(agent.leases()[0].path, format!("port:{host}"));
    assert_eq!(
        agent.log().matches(" attached ").count(),
        attaches_before,
        "something was attached on or after the ADD\n{}",
        agent.log()
    );
    assert!(
        pod.ns
            .exec(&["tc", "filter", "show", "dev", &pod.ifname, "ingress"])
            .trim()
            .is_empty()
    );
    assert!(!attached_xdp(&pod.ns, &pod.ifname));
    let s = agent.status();
    assert!(s.counters["kernel.dropped_owned"] >= 2, "{:?}", s.counters);

    // (c) DEL, then the port leaves br-int: the program goes.
    let r = ovnk_call(&cni, &agent, pod, "DEL");
    assert!(r.ok, "DEL: {} {}", r.stdout, r.stderr);
    let t0 = Instant::now();
    lab.remove_pod_port(0);
    assert!(
        wait_until(Duration::from_secs(3), || port_capture(&agent, &host)
            .is_none()
            && egress_program(&lab.node, &host, live.bpf_link).is_empty()),
        "{:?}\n{}",
        agent.try_status().map(|s| s.port_captures),
        agent.log()
    );
    report("port removed from br-int -> capture detached", t0.elapsed());
}

#[test]
fn a_network_is_a_dhcp_network_once_the_agent_leases_on_it() {
    let cni = CniPath::new();
    let (mut lab, dnsmasq) = lab_with_pod();
    let agent = agent(&lab.node, &lab.db_socket(), &[]);
    wait_live(&agent, OvnLab::UPLINK, Duration::from_secs(10));
    let host = lab.pods()[0].host_ifname.clone();
    // No --dhcp-network and no lease yet: the port is nobody's business.
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        guarded(&agent, &host).is_none(),
        "{:?}",
        agent.status().guarded_ports
    );
    assert!(guard_programs(&lab.node, &host).is_empty());

    // The first ADD guards its own port, and makes the network a DHCP
    // network: the next port of it is guarded before any ADD.
    add_ok(&cni, &agent, &lab, &dnsmasq);
    wait_guarded(&agent, &host, "both", Duration::from_secs(3));
    let pod2 = lab.add_pod("pod2", parse_mac("0a:58:c0:00:02:06").unwrap());
    let host2 = pod2.host_ifname.clone();
    let p = wait_guarded(&agent, &host2, "ovs", Duration::from_secs(5));
    assert_eq!(p.network.as_deref(), Some(OvnLab::NETWORK), "{p:?}");
    assert!(!guard_programs(&lab.node, &host2).is_empty());

    // The DEL of the first lets its port go back to OVS's identity alone:
    // still on br-int, still guarded.
    let r = ovnk_call(&cni, &agent, &lab.pods()[0], "DEL");
    assert!(r.ok, "DEL: {} {}\n{}", r.stdout, r.stderr, agent.log());
    wait_guarded(&agent, &host, "ovs", Duration::from_secs(2));
}

/// `xdhcp CMD` as an operator reads it (the table, not JSON).
fn agent_table(agent: &NodeAgent, cmd: &str) -> String {
    let out = std::process::Command::new(agent_support::xdhcp_bin())
        .args([cmd, "--socket"])
        .arg(&agent.socket)
        .env_remove("CNI_COMMAND")
        .output()
        .expect("run the xdhcp cli");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// ADD `pod` and put the address on its interface.
#[track_caller]
fn add_and_apply(cni: &CniPath, agent: &NodeAgent, pod: &OvnPod) {
    let r = ovnk_add(cni, agent, pod);
    assert!(r.ok, "ADD: {} {}\n{}", r.stdout, r.stderr, agent.log());
    agent_support::apply_address(pod, &r);
}

#[test]
fn ovs_killed_and_restarted_under_live_leases_every_lease_renews_and_discovery_recovers() {
    let cni = CniPath::new();
    let mut lab = OvnLab::start();
    // T1 at 3 s: a renewal every 3 s.
    let dnsmasq = Dnsmasq::start(
        &lab.server,
        DnsmasqConfig {
            interface: OvnLab::SERVER_IF.to_owned(),
            t1_secs: Some(3),
            t2_secs: Some(100),
            ..DnsmasqConfig::default()
        },
    );
    for i in 0..3u8 {
        lab.add_pod(&format!("pod{i}"), [0x0a, 0x58, 0xc0, 0x00, 0x02, 0x20 + i]);
    }
    let agent = agent(&lab.node, &lab.db_socket(), &[]);
    wait_live(&agent, OvnLab::UPLINK, Duration::from_secs(10));
    for pod in lab.pods() {
        add_and_apply(&cni, &agent, pod);
    }
    let leases = agent.leases();
    assert_eq!(leases.len(), 3, "{leases:?}");
    assert!(
        leases.iter().all(|l| l.path == "uplink:eth1"),
        "{leases:?}\n{}",
        agent.log()
    );

    // OVS dies: the agent says so, keeps the uplink it read, and every
    // lease renews through it (the uplink's own socket, no OVS on the way).
    let replies = |agent: &NodeAgent| live_uplink(agent, OvnLab::UPLINK).map(|u| u.replies);
    let before = replies(&agent);
    lab.kill_ovs();
    agent.wait_ovs_source("unavailable", Duration::from_secs(15));
    assert!(live_uplink(&agent, OvnLab::UPLINK).is_some());
    assert!(attached_xdp(&lab.node, OvnLab::UPLINK));
    agent.wait_every_lease_renewed(
        &agent.expiries(),
        Duration::from_secs(15),
        "while OVS was down",
    );
    // On the kernel path: the renewals' ACKs were taken at the uplink.
    assert!(replies(&agent) >= before.map(|r| r + 3), "{before:?}");
    assert!(
        agent.leases().iter().all(|l| l.path == "uplink:eth1"),
        "{:?}",
        agent.leases()
    );

    // OVS is back on the same database: the agent reads it again, and
    // every lease renews again.
    lab.start_ovs();
    agent.wait_ovs_source("connected", Duration::from_secs(15));
    assert!(live_uplink(&agent, OvnLab::UPLINK).is_some());
    agent.wait_every_lease_renewed(
        &agent.expiries(),
        Duration::from_secs(15),
        "after OVS came back",
    );
    assert_eq!(agent.status().degraded, None);

    // Discovery recovers: a pod wired after the restart binds at the
    // uplink...
    let pod = lab.add_pod("pod-after", [0x0a, 0x58, 0xc0, 0x00, 0x02, 0x2f]);
    add_and_apply(&cni, &agent, pod);
    let mac = xdhcp_tests::format_mac(pod.mac);
    assert!(dnsmasq.lease_for(pod.mac).is_some(), "{}", dnsmasq.log());
    let leases = agent.leases();
    let new = leases.iter().find(|l| l.mac == mac).expect("the new lease");
    assert_eq!(new.path, "uplink:eth1", "{leases:?}");
    // ...and a mapping added after the restart is attached.
    lab.add_provider_bridge("br-phys2", "eth2", "s1");
    let before = lab.bridge_mappings();
    lab.set_bridge_mappings(&format!("{before},physnet2:br-phys2"));
    let up = wait_live(&agent, "eth2", Duration::from_secs(5));
    assert_eq!(up.physnet.as_deref(), Some("physnet2"), "{up:?}");
}

#[test]
fn a_del_after_the_port_is_gone_releases_through_the_uplink() {
    let cni = CniPath::new();
    let (lab, dnsmasq) = lab_with_pod();
    let agent = agent(&lab.node, &lab.db_socket(), &[]);
    wait_live(&agent, OvnLab::UPLINK, Duration::from_secs(10));
    let pod = &lab.pods()[0];
    add_and_apply(&cni, &agent, pod);
    assert_eq!(agent.leases()[0].path, "uplink:eth1", "{}", agent.log());
    assert!(dnsmasq.lease_for(pod.mac).is_some(), "{}", dnsmasq.log());

    del_after_the_port_is_gone(&lab, &cni, &agent, pod, "dnsmasq", || {
        dnsmasq.lease_for(pod.mac).is_none()
    });
    assert!(dnsmasq.log().contains("DHCPRELEASE"), "{}", dnsmasq.log());
}

/// The port goes before IPAM DEL (out of `br-int`, its veth deleted); the
/// DEL then releases through the uplink: the agent holds nothing and says
/// so, and `released` (the server's lease table) comes true within 5 s.
#[track_caller]
fn del_after_the_port_is_gone(
    lab: &OvnLab,
    cni: &CniPath,
    agent: &NodeAgent,
    pod: &OvnPod,
    server: &str,
    released: impl FnMut() -> bool,
) {
    lab.vsctl(&["del-port", OvnLab::INTEGRATION_BRIDGE, &pod.host_ifname]);
    lab.node.ip(&["link", "del", &pod.host_ifname]);
    assert!(!pod.ns.ip(&["link", "show"]).contains(&pod.ifname));

    let r = ovnk_call(cni, agent, pod, "DEL");
    assert!(r.ok, "DEL: {} {}\n{}", r.stdout, r.stderr, agent.log());
    assert!(
        wait_until(Duration::from_secs(5), released),
        "{server} still holds the lease:\n{}",
        agent.log()
    );
    assert!(agent.leases().is_empty(), "{:?}", agent.leases());
    assert!(
        agent.log().contains("released through the uplink"),
        "{}",
        agent.log()
    );
}

/// Kea, not dnsmasq, behind the provider bridge: what the uplink does is not
/// one server's habit. Kea answers a client's DISCOVER and REQUEST on its raw
/// socket; the OFFER, the ACK and every renewal's ACK are taken at the uplink,
/// and the DEL after the port is gone releases through it.
#[test]
fn kea_behind_the_provider_bridge_leases_renews_and_releases_through_the_uplink() {
    let cni = CniPath::new();
    let mut lab = OvnLab::start();
    let kea = Kea::start(
        &lab.server,
        KeaConfig {
            interface: OvnLab::SERVER_IF.to_owned(),
            valid_lifetime: 60,
            renew_timer: 3,
            rebind_timer: 50,
            ..KeaConfig::default()
        },
    );
    lab.add_pod("pod-kea", parse_mac("0a:58:c0:00:02:41").unwrap());
    let agent = agent(&lab.node, &lab.db_socket(), &[]);
    wait_live(&agent, OvnLab::UPLINK, Duration::from_secs(10));
    let pod = &lab.pods()[0];
    let r = ovnk_add(&cni, &agent, pod);
    assert!(
        r.ok,
        "ADD: {} {}\n{}\n{}",
        r.stdout,
        r.stderr,
        agent.log(),
        kea.log()
    );
    agent_support::apply_address(pod, &r);
    let leases = agent.leases();
    assert_eq!(leases.len(), 1, "{leases:?}");
    assert_eq!(leases[0].path, "uplink:eth1", "{}", agent.log());
    let held = kea.lease_for(pod.mac).expect("Kea holds the pod's lease");
    assert_eq!(
        leases[0].address.map(|a| a.addr),
        Some(held.ip),
        "{leases:?}"
    );

    // Renewals (T1 3 s) are answered by Kea and taken at the uplink.
    let replies = |agent: &NodeAgent| live_uplink(agent, OvnLab::UPLINK).map_or(0, |u| u.replies);
    let before = replies(&agent);
    for round in ["first", "second"] {
        agent.wait_every_lease_renewed(
            &agent.expiries(),
            Duration::from_secs(10),
            &format!("{round} renewal against Kea"),
        );
    }
    assert!(replies(&agent) >= before + 2, "{before}\n{}", agent.log());
    assert_eq!(agent.leases()[0].path, "uplink:eth1");

    // The port goes before IPAM DEL; the RELEASE goes out at the uplink and
    // Kea lets the address go.
    del_after_the_port_is_gone(&lab, &cni, &agent, pod, "Kea", || {
        kea.lease_for(pod.mac).is_none()
    });
    assert!(kea.log().contains("DHCP4_RELEASE"), "{}", kea.log());
}
