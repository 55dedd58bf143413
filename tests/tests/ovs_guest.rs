//! The OVS + OVN node lab on the kernel datapath, in the VM tier's guest
//! (`cargo xtask vmtest`: Debian 12's 6.1 kernel, which has the openvswitch
//! module this machine's kernel lacks).
//!
//! The lab (`xdhcp_tests::OvnLab::start_with`) runs its bridges with
//! `datapath_type=system`, and its provider bridge's port `eth1` is the
//! guest's first virtio-net NIC (moved into the node namespace); the second
//! one, on the same qemu hub, is the server's `s0` with dnsmasq. The agent
//! runs in the node namespace with `--ovsdb` on the lab's database and no
//! `--uplink`. Shown:
//!
//! - the uplink is found in OVS (physical network, bridge, source `ovs`) and
//!   attached with native XDP on the virtio NIC (the kernel agrees: driver
//!   mode), the NIC being a port of the kernel datapath (`ovs-system`);
//! - a pod's OFFER and ACK, and its renewal's ACK, are taken at that
//!   uplink, with nothing attached in the pod: consumed by XDP before the
//!   kernel datapath's receive handler, no reply reaches the pod's stack;
//! - a DEL after the pod's port left `br-int` releases through the uplink;
//! - with `--dhcp-network`, a port appearing on `br-int` is guarded before
//!   its ADD; a rogue dnsmasq in a port no ADD ever named, whose OFFERs
//!   reach other pods before the agent runs, reaches none of the next pods
//!   once it does (TC ingress on the host-side veth runs before the kernel
//!   datapath's handler), and every one of them binds to the real server;
//! - a DISCOVER flood from a served pod under its own MAC reaches the real
//!   server at no more than the port's burst and rate (the guard at TC
//!   ingress on the host-side veth);
//! - ovs-vswitchd and the node's ovsdb-server killed (SIGKILL) under live
//!   leases: the agent reports OVS unavailable and keeps its uplink, every
//!   lease renews at the uplink (its ACK taken at XDP, not through OVS),
//!   again after OVS is back, and a pod wired after that binds at the
//!   uplink;
//! - a bridge mapping added at run time is attached within 1 s of its
//!   database transaction, and detached within 2 s when it goes (the
//!   second provider bridge's port is a veth: both of the guest's NICs are
//!   the lab's already).
//!
//! Every test here needs the guest's devices and module, so they are
//! `#[ignore]`d: on the host they are listed as ignored, and they fail (never
//! skip) when run where the devices are missing. Needs root.

mod agent_support;

use std::net::Ipv4Addr;
use std::time::Duration;

use agent_support::{CniPath, NodeAgent, ovnk_call};
use xdhcp_tests::nft;
use xdhcp_tests::ovs_lab::flood;
use xdhcp_tests::servers::ROGUE_IP;
use xdhcp_tests::{
    Dnsmasq, DnsmasqConfig, LabDatapath, LabLink, NetNs, OvnLab, OvnLabOptions, OvnPod,
    PluginOutput, parse_mac, wait_until,
};

/// The virtio-net NIC that becomes the provider bridge's port (set by
/// `cargo xtask vmtest`, as in `vm_guest.rs`).
const VIRTIO_UPLINK_MAC: &str = "52:54:00:78:64:01";
/// The virtio-net NIC dnsmasq serves on, on the same qemu hub.
const VIRTIO_SERVER_MAC: &str = "52:54:00:78:64:02";
/// Where the agent serves its metrics, inside the lab's node namespace.
const METRICS: &str = "127.0.0.1:9464";
/// Under software emulation everything is slow: generous waits.
const WAIT: Duration = Duration::from_mins(1);

/// The lab on the kernel datapath with the virtio NICs as its wire.
fn kernel_lab() -> OvnLab {
    // Nothing loads NIC drivers in the guest by itself.
    xdhcp_tests::netns::run(
        std::process::Command::new(xdhcp_tests::program("modprobe")).arg("virtio_net"),
    );
    let mac = |m: &str| parse_mac(m).expect("valid MAC");
    OvnLab::start_with(OvnLabOptions {
        datapath: LabDatapath::System,
        link: LabLink::Nics {
            uplink: mac(VIRTIO_UPLINK_MAC),
            server: mac(VIRTIO_SERVER_MAC),
        },
    })
}

fn dnsmasq(lab: &OvnLab, t1_secs: Option<u32>) -> Dnsmasq {
    Dnsmasq::start(
        &lab.server,
        DnsmasqConfig {
            interface: OvnLab::SERVER_IF.to_owned(),
            t1_secs,
            t2_secs: t1_secs.map(|_| 100),
            ..DnsmasqConfig::default()
        },
    )
}

/// The agent in the lab's node namespace, reading OVS at the lab's socket.
fn agent(lab: &OvnLab, extra: &[&str]) -> NodeAgent {
    let ovsdb = lab.db_socket();
    let ovsdb = ovsdb.to_str().expect("a UTF-8 path");
    let args = [&["--ovsdb", ovsdb, "--metrics-addr", METRICS], extra].concat();
    NodeAgent::start(&lab.node, &args)
}

#[track_caller]
fn add_ok(
    cni: &CniPath,
    agent: &NodeAgent,
    lab: &OvnLab,
    pod: &OvnPod,
    dnsmasq: &Dnsmasq,
) -> PluginOutput {
    let r = ovnk_call(cni, agent, pod, "ADD");
    assert!(
        r.ok,
        "ADD: {} {}\n{}\n{}\novs-vswitchd:\n{}",
        r.stdout,
        r.stderr,
        agent.log(),
        dnsmasq.log(),
        lab.log("ovs-vswitchd")
    );
    r
}

/// Counts, in `ns`'s own IP stack (an nftables counter at prerouting), the
/// DHCP server messages from `from` (any source when `None`).
fn count_replies_in(ns: &NetNs, from: Option<Ipv4Addr>) {
    let from = from.map(|ip| ip.to_string());
    let mut rule = match &from {
        Some(ip) => vec!["ip", "saddr", ip],
        None => vec![],
    };
    rule.extend(["udp", "sport", "67", "udp", "dport", "68"]);
    nft::add_counter(ns, "inet xdt_seen", "prerouting priority -400", &rule);
}

fn replies_seen_in(ns: &NetNs) -> u64 {
    nft::counted(ns, "inet xdt_seen")
}

fn attached_xdp(ns: &NetNs, ifname: &str) -> bool {
    ns.ip(&["-d", "link", "show", "dev", ifname])
        .contains("prog/xdp")
}

/// The uplink `ifname` as `xdhcp status` shows it, once live.
#[track_caller]
fn wait_live(agent: &NodeAgent, ifname: &str) -> xdhcp::rpc::UplinkStatus {
    let mut found = None;
    wait_until(WAIT, || {
        found = agent
            .try_status()
            .and_then(|s| s.uplinks.into_iter().find(|u| u.ifname == ifname))
            .filter(|u| u.state == "live");
        found.is_some()
    });
    found.unwrap_or_else(|| {
        panic!(
            "{ifname} not live in {WAIT:?}: {:?}\n{}",
            agent.try_status(),
            agent.log()
        )
    })
}

fn scrape(node: &NetNs) -> String {
    let addr: std::net::SocketAddr = METRICS.parse().expect("an address");
    let mut text = None;
    wait_until(Duration::from_secs(10), || {
        text = node.run_in(move || xdhcp_tests::bench::http_get(addr, "/metrics"));
        text.is_some()
    });
    text.expect("the agent's metrics server answers")
}

/// The DHCPACKs dnsmasq logged for `mac`.
fn acks_for(dnsmasq: &Dnsmasq, mac: [u8; 6]) -> usize {
    let mac = xdhcp_tests::format_mac(mac);
    dnsmasq
        .log()
        .lines()
        .filter(|l| l.contains("DHCPACK(") && l.contains(&mac))
        .count()
}

#[test]
#[ignore = "needs the VM tier's devices: run `cargo xtask vmtest`"]
fn on_the_kernel_datapath_a_virtio_uplink_found_in_ovs_carries_a_pods_dora_renewal_and_release() {
    let cni = CniPath::new();
    let mut lab = kernel_lab();
    let dnsmasq = dnsmasq(&lab, Some(5));
    lab.add_pod("pod1", parse_mac("0a:58:c0:00:02:05").unwrap());
    let agent = agent(&lab, &[]);

    // (a) The uplink, found from ovn-bridge-mappings without a flag: the
    // virtio NIC, a port of the kernel datapath, with native XDP.
    let up = wait_live(&agent, OvnLab::UPLINK);
    assert_eq!(up.physnet.as_deref(), Some(OvnLab::PHYSNET), "{up:?}");
    assert_eq!(
        up.bridge.as_deref(),
        Some(OvnLab::PROVIDER_BRIDGE),
        "{up:?}"
    );
    assert_eq!(up.source, "ovs", "{up:?}");
    assert_eq!(
        up.mode.as_deref(),
        Some("xdp-native"),
        "{up:?}\n{}",
        agent.log()
    );
    let link = lab.node.ip(&["-d", "link", "show", "dev", OvnLab::UPLINK]);
    assert!(link.contains("master ovs-system"), "{link}");
    assert!(link.contains("openvswitch_slave"), "{link}");
    assert!(link.contains("prog/xdp"), "{link}");
    assert!(!link.contains("xdpgeneric"), "{link}");
    let dp_type = lab.vsctl(&["get", "bridge", OvnLab::PROVIDER_BRIDGE, "datapath_type"]);
    assert_eq!(dp_type.trim(), "system");
    let m = scrape(&lab.node);
    assert!(
        xdhcp_tests::bench::metric(
            &m,
            "xdhcp_uplink_attached",
            r#"uplink="eth1",mode="xdp-native",physnet="physnet1",source="ovs""#
        ) >= 1.0,
        "{m}"
    );

    // The pod's OFFER and ACK are taken at the uplink, nothing attached in
    // the pod, and none reaches the pod's stack.
    let pod = &lab.pods()[0];
    count_replies_in(&pod.ns, None);
    let _ = add_ok(&cni, &agent, &lab, pod, &dnsmasq);
    let held = dnsmasq.lease_for(pod.mac).map(|l| l.ip);
    assert!(held.is_some(), "{}", dnsmasq.log());
    let leases = agent.leases();
    assert_eq!(leases.len(), 1, "{leases:?}");
    assert_eq!(leases[0].path, "uplink:eth1", "{leases:?}\n{}", agent.log());
    let s = agent.status();
    assert!(s.uplinks[0].replies >= 2, "{:?}", s.uplinks);
    assert!(s.counters["kernel.dropped_owned"] >= 2, "{:?}", s.counters);
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
    assert_eq!(replies_seen_in(&pod.ns), 0);

    // (e) A renewal at T1 (5 s), its ACK taken at the uplink too.
    let (acks, replies) = (acks_for(&dnsmasq, pod.mac), s.uplinks[0].replies);
    assert!(
        wait_until(WAIT, || acks_for(&dnsmasq, pod.mac) > acks),
        "no renewal at T1:\n{}\n{}",
        dnsmasq.log(),
        agent.log()
    );
    assert!(
        wait_until(Duration::from_secs(10), || agent.status().uplinks[0]
            .replies
            > replies),
        "the renewal's ACK was not taken at the uplink: {:?}\n{}",
        agent.status().uplinks,
        agent.log()
    );
    assert_eq!(agent.leases()[0].path, "uplink:eth1");
    assert_eq!(replies_seen_in(&pod.ns), 0);

    // (c) The pod's port leaves br-int (and its veth goes), then the DEL:
    // the RELEASE leaves through the uplink and the server honours it.
    lab.remove_pod_port(0);
    let pod = &lab.pods()[0];
    lab.node.link_del(&pod.host_ifname);
    let r = ovnk_call(&cni, &agent, pod, "DEL");
    assert!(r.ok, "DEL: {} {}\n{}", r.stdout, r.stderr, agent.log());
    assert!(
        wait_until(Duration::from_secs(20), || dnsmasq
            .lease_for(pod.mac)
            .is_none()),
        "dnsmasq still holds {held:?}:\n{}\n{}",
        dnsmasq.log(),
        agent.log()
    );
    assert!(dnsmasq.log().contains("DHCPRELEASE"), "{}", dnsmasq.log());
    assert!(
        agent.log().contains("released through the uplink"),
        "{}",
        agent.log()
    );
}

/// The guard's attachment on `ifname` (TC ingress, or XDP): empty when none.
fn guard_programs(ns: &NetNs, ifname: &str) -> String {
    let mut out = ns.exec(&["tc", "filter", "show", "dev", ifname, "ingress"]);
    if attached_xdp(ns, ifname) {
        out.push_str("xdp");
    }
    out.trim().to_owned()
}

#[track_caller]
fn wait_guarded(agent: &NodeAgent, port: &str, identity: &str) {
    assert!(
        wait_until(WAIT, || agent.try_status().is_some_and(|s| s
            .guarded_ports
            .iter()
            .any(|p| p.port == port && p.identity == identity))),
        "{port} not guarded ({identity}) in {WAIT:?}: {:?}\n{}",
        agent.try_status().map(|s| s.guarded_ports),
        agent.log()
    );
}

/// A real dnsmasq in `pod`, serving a range of its own on the pod's
/// interface.
fn rogue(pod: &OvnPod) -> Dnsmasq {
    Dnsmasq::rogue(&pod.ns, &pod.ifname, Some(ROGUE_IP))
}

/// New pods after the rogue: each must bind to the real server.
const NEW_PODS: usize = 5;

#[test]
#[ignore = "needs the VM tier's devices: run `cargo xtask vmtest`"]
fn on_the_kernel_datapath_ports_are_guarded_before_their_add_and_a_rogue_reaches_no_new_pod() {
    let cni = CniPath::new();
    let mut lab = kernel_lab();
    let dnsmasq = dnsmasq(&lab, None);
    let rogue_mac = parse_mac("0a:58:c0:00:02:10").unwrap();
    lab.add_pod("rogue", rogue_mac);
    let rogue = rogue(&lab.pods()[0]);

    // Before the agent runs, the rogue's OFFERs reach another pod on the
    // kernel datapath (so the test can see a rogue at all).
    lab.add_pod("probe", parse_mac("0a:58:c0:00:02:11").unwrap());
    let probe = &lab.pods()[1];
    count_replies_in(&probe.ns, Some(ROGUE_IP));
    let _ = xdhcp_tests::udhcpc_once(&probe.ns, &probe.ifname);
    let heard_before = replies_seen_in(&probe.ns);
    assert!(
        heard_before > 0,
        "the rogue's OFFERs did not reach the probe pod without the guard:\n{}",
        std::fs::read_to_string(rogue.log_file()).unwrap_or_default()
    );

    let agent = agent(&lab, &["--dhcp-network", OvnLab::NETWORK]);
    wait_live(&agent, OvnLab::UPLINK);
    // The ports already on br-int are guarded from OVS (no ADD names them).
    let rogue_port = lab.pods()[0].host_ifname.clone();
    wait_guarded(&agent, &rogue_port, "ovs");
    assert!(!guard_programs(&lab.node, &rogue_port).is_empty());

    let mut new_macs = Vec::new();
    for n in 0..NEW_PODS {
        let mac = [
            0x0a,
            0x58,
            0xc0,
            0x00,
            0x02,
            0x20 + u8::try_from(n).unwrap(),
        ];
        new_macs.push(xdhcp_tests::format_mac(mac));
        let i = lab.pods().len();
        lab.add_pod(&format!("pod{n}"), mac);
        let pod = &lab.pods()[i];
        // (d) Guarded as soon as it is on br-int, before its ADD.
        wait_guarded(&agent, &pod.host_ifname, "ovs");
        assert!(
            !guard_programs(&lab.node, &pod.host_ifname).is_empty(),
            "nothing attached on {}",
            pod.host_ifname
        );
        assert!(
            agent
                .leases()
                .iter()
                .all(|l| l.mac != xdhcp_tests::format_mac(mac))
        );
        // (b) Its ADD binds to the real server; the rogue reaches it not.
        count_replies_in(&pod.ns, Some(ROGUE_IP));
        let _ = add_ok(&cni, &agent, &lab, pod, &dnsmasq);
        let lease = agent
            .leases()
            .into_iter()
            .find(|l| l.mac == xdhcp_tests::format_mac(mac))
            .expect("the new pod's lease");
        assert_eq!(lease.server, Some(OvnLab::SERVER_IP), "{lease:?}");
        assert!(dnsmasq.lease_for(mac).is_some(), "{}", dnsmasq.log());
        assert_eq!(
            replies_seen_in(&pod.ns),
            0,
            "pod {n} heard the rogue through the guard"
        );
        wait_guarded(&agent, &pod.host_ifname, "both");
    }
    // The rogue did answer the new pods, and the guard dropped what it sent.
    let log = std::fs::read_to_string(rogue.log_file()).unwrap_or_default();
    let offers = log
        .lines()
        .filter(|l| l.contains("DHCPOFFER(") && new_macs.iter().any(|m| l.contains(m)))
        .count();
    assert!(offers >= 1, "the rogue never answered a new pod:\n{log}");
    let offers = f64::from(u32::try_from(offers).expect("a few OFFERs"));
    let series = format!("port=\"{rogue_port}\",reason=\"server\"");
    let mut dropped = 0.0;
    wait_until(Duration::from_secs(10), || {
        dropped =
            xdhcp_tests::bench::metric(&scrape(&lab.node), "xdhcp_guard_dropped_frames", &series);
        dropped >= offers
    });
    assert!(
        dropped >= offers,
        "the guard dropped {dropped} of the rogue's {offers} OFFERs to new pods\n{log}\n{}",
        scrape(&lab.node)
    );
}

#[test]
#[ignore = "needs the VM tier's devices: run `cargo xtask vmtest`"]
fn on_the_kernel_datapath_a_discover_flood_from_a_served_pod_reaches_the_server_at_the_ports_rate()
{
    let cni = CniPath::new();
    let mut lab = kernel_lab();
    let dnsmasq = dnsmasq(&lab, None);
    lab.add_pod("pod1", parse_mac("0a:58:c0:00:02:30").unwrap());
    let agent = agent(&lab, &[]);
    wait_live(&agent, OvnLab::UPLINK);
    let pod = &lab.pods()[0];
    let _ = add_ok(&cni, &agent, &lab, pod, &dnsmasq);
    // Served, so guarded: at TC ingress on the host-side veth, which runs
    // before the kernel datapath's receive handler (no XDP needed there).
    assert!(
        wait_until(WAIT, || guard_programs(&lab.node, &pod.host_ifname)
            .contains("xdhcp_guard")),
        "{} not guarded: {}\n{}",
        pod.host_ifname,
        guard_programs(&lab.node, &pod.host_ifname),
        agent.log()
    );
    assert!(!attached_xdp(&lab.node, &pod.host_ifname));

    let metrics = METRICS.parse().expect("an address");
    flood::assert_flood_held_to_rate(&lab, pod, &dnsmasq, metrics, Duration::from_secs(2));
}

/// The measured figure or observation, in the test's output.
fn report(what: &str) {
    #[expect(clippy::print_stderr, reason = "the figure is useful in test logs")]
    {
        eprintln!("{what}");
    }
}

#[test]
#[ignore = "needs the VM tier's devices: run `cargo xtask vmtest`"]
fn on_the_kernel_datapath_ovs_killed_and_restarted_under_live_leases_every_lease_renews_and_a_new_pod_binds()
 {
    let cni = CniPath::new();
    let mut lab = kernel_lab();
    // T1 at 3 s: a renewal every 3 s.
    let dnsmasq = dnsmasq(&lab, Some(3));
    for i in 0..2u8 {
        lab.add_pod(&format!("pod{i}"), [0x0a, 0x58, 0xc0, 0x00, 0x02, 0x40 + i]);
    }
    let agent = agent(&lab, &[]);
    wait_live(&agent, OvnLab::UPLINK);
    for pod in lab.pods() {
        let r = add_ok(&cni, &agent, &lab, pod, &dnsmasq);
        agent_support::apply_address(pod, &r);
    }
    let leases = agent.leases();
    assert_eq!(leases.len(), 2, "{leases:?}");
    assert!(
        leases.iter().all(|l| l.path == "uplink:eth1"),
        "{leases:?}\n{}",
        agent.log()
    );

    // ovs-vswitchd and ovsdb-server die (SIGKILL). The agent says OVS is
    // gone, keeps the uplink it read, and every lease renews through the
    // uplink's own socket: its ACK is taken at XDP on the NIC, before the
    // datapath.
    let replies = |agent: &NodeAgent| agent.live_uplink(OvnLab::UPLINK).map(|u| u.replies);
    let before = replies(&agent);
    lab.kill_ovs();
    agent.wait_ovs_source("unavailable", WAIT);
    assert!(agent.live_uplink(OvnLab::UPLINK).is_some());
    assert!(attached_xdp(&lab.node, OvnLab::UPLINK));
    agent.wait_every_lease_renewed(&agent.expiries(), WAIT, "while OVS was down");
    // The renewals' ACKs were taken at the uplink.
    assert!(
        replies(&agent) >= before.map(|r| r + 2),
        "{before:?} -> {:?}",
        replies(&agent)
    );
    assert!(
        agent.leases().iter().all(|l| l.path == "uplink:eth1"),
        "{:?}",
        agent.leases()
    );

    // OVS is back on the same database (ovs-vswitchd takes the kernel
    // datapath over again): the agent reads it again, and every lease
    // renews again.
    lab.start_ovs();
    agent.wait_ovs_source("connected", WAIT);
    assert!(agent.live_uplink(OvnLab::UPLINK).is_some());
    agent.wait_every_lease_renewed(&agent.expiries(), WAIT, "after OVS came back");
    assert_eq!(agent.status().degraded, None);

    // A pod wired after the restart binds at the uplink.
    let i = lab.pods().len();
    lab.add_pod("pod-after", parse_mac("0a:58:c0:00:02:4f").unwrap());
    let pod = &lab.pods()[i];
    let _ = add_ok(&cni, &agent, &lab, pod, &dnsmasq);
    assert!(dnsmasq.lease_for(pod.mac).is_some(), "{}", dnsmasq.log());
    let mac = xdhcp_tests::format_mac(pod.mac);
    let leases = agent.leases();
    let new = leases.iter().find(|l| l.mac == mac).expect("the new lease");
    assert_eq!(new.path, "uplink:eth1", "{leases:?}");
}

/// The guest has two NICs, both the lab's (the first provider bridge's
/// port and the server's): the second provider bridge's port is a veth to
/// the server's namespace, where the agent attaches at TC ingress (the
/// per-device default on a veth of the kernel datapath).
///
/// Attached and detached while the agent runs, each time printed (0.3 s
/// to attach in a quiet run under emulation; 2.1 s once with the host
/// loaded by three builds beside the guest). What the attach used to take
/// here: the agent loads the kernel's TC modules (`sch_ingress`,
/// `cls_bpf`) at start, in a namespace of its own; the first TC attach
/// used to wait for both `modprobe`s (1.3 s of a 1.4 s attach under
/// emulation). The detach is looked at with `ip` and `tc` (about 0.7 s a
/// look under emulation).
#[test]
#[ignore = "needs the VM tier's devices: run `cargo xtask vmtest`"]
fn on_the_kernel_datapath_a_bridge_mapping_added_at_run_time_is_attached_while_the_agent_runs() {
    let mut lab = kernel_lab();
    let agent = agent(&lab, &[]);
    wait_live(&agent, OvnLab::UPLINK);
    let (added, removed) = agent.check_mapping_added_at_run_time(&mut lab);
    report(&format!(
        "mapping added -> eth2 attached in {added:?}; removed -> detached in {removed:?}"
    ));
    let dp = lab.vsctl(&["get", "bridge", "br-phys2", "datapath_type"]);
    assert_eq!(dp.trim(), "system");
}
