//! Node-level capture on a localnet uplink, in namespaces with a real bridge
//! topology:
//!
//! ```text
//!  [pod ns: eth0] ──veth (bridge plugin)── xbr0 ┐
//!                                               ├─ [node ns]  xdhcp agent --uplink physnet1=up0
//!                                        up0 ───┘
//!                                         │ veth
//!  [wire ns: w0 ── wbr ── w1] ──veth── s0 [server ns: dnsmasq 192.0.2.1/24]
//! ```
//!
//! The `xdhcp agent` binary runs inside the node namespace (`ip netns
//! exec`), so the uplink it attaches to is the test's `up0`, never one of
//! this machine's interfaces; pods are added and deleted through Debian's
//! real `bridge` plugin. The wire namespace lets a test delete and
//! re-create `up0` without touching the server's interface.
//!
//! Shown: a fresh pod's OFFER and ACK come through the ring buffer at the
//! uplink (the agent and the kernel count them), nothing is attached in the
//! pod's namespace, the pod's own stack never sees its replies (an nftables
//! counter in the pod namespace stays at zero — and does count them when no
//! uplink is configured, or when the server sits on the node's bridge and
//! the uplink carries nothing: the fallback), the metrics agree, the
//! lease's REQUEST and its renewal leave through the uplink too (the
//! bridge forwards the DISCOVER alone), and so does the network's next
//! pod's DISCOVER (unless the uplink no longer answers: then the
//! retransmission crosses the bridge), a renewal stays on the uplink, the
//! `bridge` plugin's DEL (veth first, IPAM DEL after) releases the lease at
//! dnsmasq, Kea and ISC dhcpd through the uplink, and an uplink that goes
//! away and comes back is attached again (a lease held across it renews
//! through the new one). A restarted agent resumes its leases on the uplink
//! and sends a fresh pod's DISCOVER there at once.

mod agent_support;

use std::time::Duration;

use agent_support::{CniPath, NodeAgent, PluginOutput, bridge_plugin};
use xdhcp_tests::bench::metric_count;
use xdhcp_tests::nft::{add_counter, counted};
use xdhcp_tests::{
    Bridge, Dhcpd, DhcpdConfig, Dnsmasq, DnsmasqConfig, Kea, KeaConfig, NetNs, Veth, wait_until,
};

/// The DHCP server behind the uplink.
enum Server {
    Dnsmasq(Dnsmasq),
    Kea(Kea),
    Dhcpd(Dhcpd),
}

impl Server {
    fn log(&self) -> String {
        match self {
            Self::Dnsmasq(d) => d.log(),
            Self::Kea(k) => k.log(),
            Self::Dhcpd(d) => d.log(),
        }
    }

    /// Whether the server's lease database holds a live lease for `mac`.
    fn holds(&self, mac: [u8; 6]) -> bool {
        match self {
            Self::Dnsmasq(d) => d.lease_for(mac).is_some(),
            Self::Kea(k) => k.lease_for(mac).is_some(),
            Self::Dhcpd(d) => d.leases().iter().any(|l| l.mac == mac),
        }
    }
}

/// The topology of the module docs.
struct Topology {
    pod: NetNs,
    _xbr0: Bridge,
    _wbr: Bridge,
    _s: Veth,
    node: NetNs,
    wire: NetNs,
    server: Server,
    _server_ns: NetNs,
}

impl Topology {
    /// dnsmasq behind the uplink, T1 = `t1_secs` when given.
    fn new(t1_secs: Option<u32>) -> Self {
        Self::with_server(|ns| {
            Server::Dnsmasq(Dnsmasq::start(
                ns,
                DnsmasqConfig {
                    interface: "s0".into(),
                    t1_secs,
                    t2_secs: t1_secs.map(|_| 100),
                    ..DnsmasqConfig::default()
                },
            ))
        })
    }

    fn with_server(start: impl FnOnce(&NetNs) -> Server) -> Self {
        let server = NetNs::new();
        let wire = NetNs::new();
        let node = NetNs::new();
        let s = Veth::new(&wire, "w1", &server, "s0");
        server.add_addr("s0", "192.0.2.1".parse().unwrap(), 24);
        let wbr = Bridge::new(&wire, "wbr");
        wbr.attach("w1");
        let xbr0 = Bridge::new(&node, "xbr0");
        let me = Self {
            pod: NetNs::new(),
            _xbr0: xbr0,
            _wbr: wbr,
            _s: s,
            server: start(&server),
            node,
            wire,
            _server_ns: server,
        };
        me.plug_uplink();
        me
    }

    /// Create `up0` (node) ↔ `w0` (wire) and put each end on its bridge.
    fn plug_uplink(&self) {
        // Deleted with the namespaces, or by `unplug_uplink`.
        let wire = self.wire.name();
        self.node.ip(&[
            "link", "add", "up0", "type", "veth", "peer", "name", "w0", "netns", wire,
        ]);
        self.node.link_up("up0");
        self.wire.link_up("w0");
        self.node.ip(&["link", "set", "up0", "master", "xbr0"]);
        self.wire.ip(&["link", "set", "w0", "master", "wbr"]);
    }

    fn unplug_uplink(&self) {
        self.node.link_del("up0");
    }

    /// Packets the pod's own IP stack received from UDP port 67 to 68 (an
    /// nftables counter at prerouting in the pod namespace).
    fn count_replies_in_pod(&self) {
        add_counter(
            &self.pod,
            "inet xdt_seen",
            "prerouting priority -400",
            &["udp", "sport", "67", "udp", "dport", "68"],
        );
    }

    fn replies_seen_by_pod(&self) -> u64 {
        counted(&self.pod, "inet xdt_seen")
    }

    /// Count the DHCP client frames the node's bridge forwards (from the
    /// pod's port to the uplink: there is one pod).
    fn count_client_frames_on_bridge(&self) {
        add_counter(
            &self.node,
            "bridge xdt_fwd",
            "forward priority 0",
            &["udp", "dport", "67"],
        );
    }

    fn client_frames_on_bridge(&self) -> u64 {
        counted(&self.node, "bridge xdt_fwd")
    }

    /// Count the DHCP client frames that reach the wire (`w0`'s ingress)
    /// and those of them the node's bridge forwarded to `up0`: the rest
    /// left straight through the agent's packet socket on the uplink.
    fn count_client_frames_to_wire(&self) {
        add_counter(
            &self.wire,
            "netdev xdt_w0",
            "ingress device w0 priority 0",
            &["udp", "dport", "67"],
        );
        add_counter(
            &self.node,
            "bridge xdt_up0",
            "forward priority 0",
            &["oifname", "up0", "udp", "dport", "67"],
        );
    }

    /// DHCP client frames sent straight out of the uplink, not through
    /// the bridge (see [`Topology::count_client_frames_to_wire`]).
    fn client_frames_sent_on_uplink(&self) -> u64 {
        counted(&self.wire, "netdev xdt_w0") - counted(&self.node, "bridge xdt_up0")
    }

    /// A dnsmasq on the node's own bridge (port `ls0`), with the wire
    /// behind the uplink cut off from the server there.
    fn move_server_onto_the_node(&self) -> (NetNs, Veth, Dnsmasq) {
        self.wire.ip(&["link", "set", "w1", "nomaster"]);
        let local_ns = NetNs::new();
        let port = Veth::new(&self.node, "ls0", &local_ns, "s0");
        self.node.ip(&["link", "set", "ls0", "master", "xbr0"]);
        local_ns.add_addr("s0", "192.0.2.1".parse().unwrap(), 24);
        let local = Dnsmasq::start(
            &local_ns,
            DnsmasqConfig {
                interface: "s0".into(),
                ..DnsmasqConfig::default()
            },
        );
        (local_ns, port, local)
    }

    fn pod_mac(&self) -> [u8; 6] {
        self.pod.mac("eth0")
    }
}

/// The pod's one lease was bound through its own packet socket (its
/// replies reached the pod's namespace; the metrics say `af_packet`, not
/// `uplink`), and the held lease moves to the per-interface program.
fn assert_own_path(t: &Topology, agent: &NodeAgent) {
    let path = agent.leases()[0].path.clone();
    assert!(path.starts_with("af-packet") || path == "tc", "{path}");
    assert!(t.replies_seen_by_pod() >= 2, "{}", t.replies_seen_by_pod());
    let m = scrape(t);
    for (label, n) in [(r#"path="af_packet""#, 1), (r#"path="uplink""#, 0)] {
        assert_eq!(
            metric_count(&m, "xdhcp_bound_by_path_total", label),
            n,
            "{m}"
        );
    }
    assert!(
        wait_until(Duration::from_secs(10), || agent.leases()[0].path == "tc"),
        "{:?}\n{}",
        agent.leases(),
        agent.log()
    );
}

fn bridge(cni: &CniPath, t: &Topology, agent: &NodeAgent, cmd: &str, id: &str) -> PluginOutput {
    bridge_plugin(cni, &t.node, &t.pod, "xbr0", &agent.socket, cmd, id)
}

fn add(cni: &CniPath, t: &Topology, agent: &NodeAgent, id: &str) {
    add_in(cni, t, agent, &t.pod, id);
}

/// ADD a pod in `pod` (its own namespace) on the node's bridge.
fn add_in(cni: &CniPath, t: &Topology, agent: &NodeAgent, pod: &NetNs, id: &str) {
    let r = bridge_plugin(cni, &t.node, pod, "xbr0", &agent.socket, "ADD", id);
    assert!(
        r.ok,
        "ADD {id}: {} {}\n{}\n{}",
        r.stdout,
        r.stderr,
        agent.log(),
        t.server.log()
    );
}

fn attached_xdp(ns: &NetNs, ifname: &str) -> bool {
    ns.ip(&["-d", "link", "show", "dev", ifname])
        .contains("prog/xdp")
}

/// Where the agent serves its metrics: inside the node namespace, which
/// is the test's own, so a fixed port cannot collide.
const METRICS: &str = "127.0.0.1:9464";

/// The agent's Prometheus exposition, scraped from inside the node
/// namespace.
fn scrape(t: &Topology) -> String {
    let addr: std::net::SocketAddr = METRICS.parse().expect("an address");
    let mut text = None;
    wait_until(Duration::from_secs(5), || {
        text = t
            .node
            .run_in(move || xdhcp_tests::bench::http_get(addr, "/metrics"));
        text.is_some()
    });
    text.expect("the agent's metrics server answers")
}

#[test]
fn replies_come_through_the_uplink_from_the_first_offer_and_del_releases_there() {
    let cni = CniPath::new();
    let t = Topology::new(Some(3));
    let agent = NodeAgent::start(
        &t.node,
        &["--uplink", "physnet1=up0", "--metrics-addr", METRICS],
    );
    agent.wait_uplink_live(Duration::from_secs(10), "the uplink was not attached");
    let up = agent.status().uplinks[0].clone();
    assert_eq!(up.ifname, "up0");
    assert_eq!(up.physnet.as_deref(), Some("physnet1"));
    assert_eq!(up.mode.as_deref(), Some("tc"), "a veth uplink gets TC");
    assert!(up.bpf_link.is_some(), "{up:?}");
    assert_eq!(up.replies, 0);
    t.count_replies_in_pod();
    t.count_client_frames_on_bridge();

    add(&cni, &t, &agent, "pod-up");
    let mac = t.pod_mac();
    assert!(t.server.holds(mac), "{}", t.server.log());

    // The OFFER and the ACK: captured at the uplink, consumed there, handed
    // to the lease through the ring buffer.
    let s = agent.status();
    assert!(s.uplinks[0].replies >= 2, "{:?}", s.uplinks);
    assert!(s.counters["kernel.dropped_owned"] >= 2, "{:?}", s.counters);
    let leases = agent.leases();
    assert_eq!(leases.len(), 1, "{leases:?}");
    assert_eq!(leases[0].path, "uplink:up0", "{leases:?}");
    // Nothing attached in the pod namespace, and it stays that way.
    assert!(s.interfaces[0].bpf_link.is_none(), "{:?}", s.interfaces);
    assert!(!attached_xdp(&t.pod, "eth0"));
    // The pod's own stack never saw a DHCP reply.
    assert_eq!(t.replies_seen_by_pod(), 0);
    // Once the OFFER came through the uplink, the REQUEST left there too:
    // the bridge forwarded the DISCOVER alone.
    assert_eq!(t.client_frames_on_bridge(), 1);
    // The metrics say the same: the uplink's mode, its replies, the path
    // the lease was bound through.
    let m = scrape(&t);
    assert_eq!(
        metric_count(&m, "xdhcp_uplink_attached", r#"uplink="up0",mode="tc""#),
        1,
        "{m}"
    );
    assert!(
        metric_count(&m, "xdhcp_uplink_replies_total", r#"uplink="up0""#) >= 2,
        "{m}"
    );
    assert_eq!(
        metric_count(&m, "xdhcp_bound_by_path_total", r#"path="uplink""#),
        1,
        "{m}"
    );
    assert_eq!(
        metric_count(&m, "xdhcp_bound_by_path_total", r#"path="af_packet""#),
        0,
        "{m}"
    );

    // A renewal (T1 = 3 s) also comes through the uplink.
    let before = agent.status().uplinks[0].replies;
    let expiry = leases[0].expires_unix_ms;
    agent.wait_renewed(expiry, Duration::from_secs(12), "no renewal");
    let s = agent.status();
    assert!(s.uplinks[0].replies > before, "{:?}", s.uplinks);
    assert_eq!(agent.leases()[0].path, "uplink:up0");
    // So did the renewal's REQUEST: still the DISCOVER alone.
    assert_eq!(t.client_frames_on_bridge(), 1);
    assert!(s.interfaces[0].bpf_link.is_none(), "{:?}", s.interfaces);
    assert_eq!(t.replies_seen_by_pod(), 0);

    // The bridge plugin's DEL: the veth goes first, then IPAM DEL; the
    // RELEASE leaves through the uplink, from the pod's MAC and address.
    let r = bridge(&cni, &t, &agent, "DEL", "pod-up");
    assert!(r.ok, "DEL: {} {}\n{}", r.stdout, r.stderr, agent.log());
    assert!(!t.pod.has_link("eth0"));
    assert!(
        wait_until(Duration::from_secs(5), || !t.server.holds(mac)),
        "dnsmasq still holds the lease:\n{}\n{}",
        t.server.log(),
        agent.log()
    );
    assert!(t.server.log().contains("DHCPRELEASE"), "{}", t.server.log());
    assert!(agent.leases().is_empty(), "{:?}", agent.leases());
    assert!(
        agent.log().contains("released through the uplink"),
        "{}",
        agent.log()
    );
}

/// A restarted agent resumes its leases on the uplink their record names:
/// nothing is attached in the pod's namespace after the restart either,
/// and the next renewal comes through the uplink.
#[test]
fn a_restarted_agent_keeps_its_leases_on_the_uplink() {
    let cni = CniPath::new();
    // T1 8 s: the renewal comes after the check below, which waits out
    // the delay a per-interface attach would be made after.
    let t = Topology::new(Some(8));
    let args = ["--uplink", "physnet1=up0"];
    let agent = NodeAgent::start(&t.node, &args);
    agent.wait_uplink_live(Duration::from_secs(10), "the uplink was not attached");
    t.count_replies_in_pod();
    add(&cni, &t, &agent, "pod-re");
    assert_eq!(agent.leases()[0].path, "uplink:up0");

    let agent = agent.restart(&t.node, &args);
    agent.wait_uplink_live(Duration::from_secs(10), "the uplink was not attached again");
    let leases = agent.leases();
    assert_eq!(leases.len(), 1, "{leases:?}");
    let expiry = leases[0].expires_unix_ms;
    // Resumed on its uplink, not pending on a receiver of its own: no
    // packet socket in the pod (each would cost its close a grace period,
    // a thousand of them seconds when the agent is killed).
    assert_eq!(leases[0].path, "uplink:up0", "{leases:?}");
    assert_eq!(agent_packet_sockets(&t.pod), 0, "{}", agent.log());
    // A lease held but not yet on the ring buffer asks for its interface's
    // capture, attached 0.5–2 s later; a resumed uplink lease must not.
    std::thread::sleep(Duration::from_secs(3));
    let s = agent.status();
    assert!(
        s.interfaces.iter().all(|i| i.bpf_link.is_none()),
        "a per-interface program was attached after the restart: {:?}\n{}",
        s.interfaces,
        agent.log()
    );
    assert!(
        agent.leases()[0].expires_unix_ms == expiry,
        "renewed before the check: raise T1"
    );
    agent.wait_renewed(
        expiry,
        Duration::from_secs(15),
        "no renewal after the restart",
    );
    assert_eq!(agent.leases()[0].path, "uplink:up0", "{}", agent.log());
    let s = agent.status();
    assert!(
        s.interfaces.iter().all(|i| i.bpf_link.is_none()),
        "a per-interface program was attached after the restart: {:?}",
        s.interfaces
    );
    assert!(!attached_xdp(&t.pod, "eth0"));
    assert_eq!(t.replies_seen_by_pod(), 0);

    // The resumed lease says where its network's server is: a fresh pod's
    // DISCOVER leaves through the uplink, the bridge forwards none of it.
    t.count_client_frames_on_bridge();
    let second = NetNs::new();
    add_in(&cni, &t, &agent, &second, "pod-after");
    assert!(t.server.holds(second.mac("eth0")), "{}", t.server.log());
    assert_eq!(t.client_frames_on_bridge(), 0, "{}", agent.log());
}

/// A `bridge`-plugin DEL (the pod's veth gone before IPAM DEL) releases
/// the lease through the uplink, and `server`'s lease database no longer
/// holds it.
fn release_through_the_uplink_is_honoured(server: impl FnOnce(&NetNs) -> Server, id: &str) {
    let cni = CniPath::new();
    let t = Topology::with_server(server);
    let agent = NodeAgent::start(&t.node, &["--uplink", "up0"]);
    agent.wait_uplink_live(Duration::from_secs(10), "the uplink was not attached");
    add(&cni, &t, &agent, id);
    let mac = t.pod_mac();
    assert!(t.server.holds(mac), "{}", t.server.log());
    assert_eq!(agent.leases()[0].path, "uplink:up0", "{:?}", agent.leases());
    let r = bridge(&cni, &t, &agent, "DEL", id);
    assert!(r.ok, "DEL: {} {}\n{}", r.stdout, r.stderr, agent.log());
    assert!(
        wait_until(Duration::from_secs(5), || !t.server.holds(mac)),
        "the server still holds the lease:\n{}\n{}",
        t.server.log(),
        agent.log()
    );
    assert!(
        agent.log().contains("released through the uplink"),
        "{}",
        agent.log()
    );
}

/// Kea honours the RELEASE sent through the uplink too.
#[test]
fn kea_honours_the_release_sent_through_the_uplink() {
    release_through_the_uplink_is_honoured(
        |ns| {
            Server::Kea(Kea::start(
                ns,
                KeaConfig {
                    interface: "s0".into(),
                    ..KeaConfig::default()
                },
            ))
        },
        "pod-kea",
    );
}

/// ISC dhcpd honours the RELEASE sent through the uplink too (the binding
/// is no longer active in its lease file).
#[test]
fn dhcpd_honours_the_release_sent_through_the_uplink() {
    release_through_the_uplink_is_honoured(
        |ns| {
            Server::Dhcpd(Dhcpd::start(
                ns,
                &DhcpdConfig {
                    interface: "s0".into(),
                    extra: "ping-check false;".into(),
                    ..DhcpdConfig::default()
                },
            ))
        },
        "pod-dhcpd",
    );
}

#[test]
fn without_an_uplink_the_pod_keeps_its_own_path() {
    let cni = CniPath::new();
    let t = Topology::new(None);
    let agent = NodeAgent::start(&t.node, &["--metrics-addr", METRICS]);
    assert!(agent.status().uplinks.is_empty());
    t.count_replies_in_pod();
    add(&cni, &t, &agent, "pod-fb");
    // The replies reached the pod's namespace (the counter works).
    assert_own_path(&t, &agent);
    assert_eq!(metric_count(&scrape(&t), "xdhcp_uplink_attached", ""), 0);
    assert!(agent.status().interfaces[0].bpf_link.is_some());
    assert_eq!(agent.counter("kernel.dropped_owned"), 0);
    let r = bridge(&cni, &t, &agent, "DEL", "pod-fb");
    assert!(r.ok, "DEL: {} {}", r.stdout, r.stderr);
}

/// A server on the node itself (on the localnet bridge, not behind the
/// uplink) while the uplink is live: the pod's replies never cross the
/// uplink, so its first reply comes to the pod's own `AF_PACKET` receiver
/// and the lease keeps the per-interface path, as with no uplink at all.
#[test]
fn a_server_on_the_node_keeps_the_per_interface_path_while_an_uplink_is_live() {
    let cni = CniPath::new();
    let t = Topology::new(None);
    // The server behind the uplink is cut off: the wire leads nowhere.
    let (_local_ns, _local_port, local) = t.move_server_onto_the_node();
    let agent = NodeAgent::start(
        &t.node,
        &["--uplink", "physnet1=up0", "--metrics-addr", METRICS],
    );
    agent.wait_uplink_live(Duration::from_secs(10), "the uplink was not attached");
    t.count_replies_in_pod();

    add(&cni, &t, &agent, "pod-local");
    let mac = t.pod_mac();
    assert!(local.lease_for(mac).is_some(), "{}", local.log());
    assert!(!t.server.holds(mac), "the cut-off server answered");
    assert_eq!(agent.status().uplinks[0].replies, 0);
    assert_own_path(&t, &agent);
    let r = bridge(&cni, &t, &agent, "DEL", "pod-local");
    assert!(r.ok, "DEL: {} {}", r.stdout, r.stderr);
}

#[test]
fn an_uplink_that_goes_away_and_comes_back_is_attached_again() {
    let cni = CniPath::new();
    let t = Topology::new(None);
    let agent = NodeAgent::start(&t.node, &["--uplink", "up0"]);
    agent.wait_uplink_live(Duration::from_secs(10), "the uplink was not attached");
    let first = agent.status().uplinks[0].clone();

    t.unplug_uplink();
    assert!(
        wait_until(Duration::from_secs(3), || agent.uplink_state() == "lost"),
        "{:?}",
        agent.status()
    );
    assert!(agent.status().degraded.is_some());

    t.plug_uplink();
    agent.wait_uplink_live(Duration::from_secs(5), "the uplink was not attached again");
    let again = agent.status().uplinks[0].clone();
    assert_ne!(again.ifindex, first.ifindex, "a new interface");
    assert!(again.bpf_link.is_some() && again.bpf_link != first.bpf_link);
    assert!(agent.status().degraded.is_none(), "{:?}", agent.status());

    // A pod added now is served through it.
    add(&cni, &t, &agent, "pod-back");
    assert_eq!(agent.leases()[0].path, "uplink:up0", "{:?}", agent.leases());
    let r = bridge(&cni, &t, &agent, "DEL", "pod-back");
    assert!(r.ok, "DEL: {} {}", r.stdout, r.stderr);
}

/// A lease held while its uplink goes away and comes back under another
/// index: its next renewal leaves through the re-created uplink (the
/// agent opens its socket there again), never through the bridge.
#[test]
fn a_lease_held_across_an_uplink_replug_renews_through_the_new_uplink() {
    let cni = CniPath::new();
    // T1 8 s: room for the replug between two renewals.
    let t = Topology::new(Some(8));
    let agent = NodeAgent::start(&t.node, &["--uplink", "up0"]);
    agent.wait_uplink_live(Duration::from_secs(10), "the uplink was not attached");
    t.count_client_frames_on_bridge();
    add(&cni, &t, &agent, "pod-held");
    assert_eq!(agent.leases()[0].path, "uplink:up0", "{:?}", agent.leases());
    let first = agent.status().uplinks[0].ifindex;
    // Just after a renewal, so that the next one comes after the replug.
    let expiry = agent.leases()[0].expires_unix_ms;
    agent.wait_renewed(expiry, Duration::from_secs(20), "no renewal");

    t.unplug_uplink();
    assert!(
        wait_until(Duration::from_secs(3), || agent.uplink_state() == "lost"),
        "{:?}",
        agent.status()
    );
    t.plug_uplink();
    agent.wait_uplink_live(Duration::from_secs(5), "the uplink was not attached again");
    assert_ne!(agent.status().uplinks[0].ifindex, first, "a new interface");

    let expiry = agent.leases()[0].expires_unix_ms;
    agent.wait_renewed(
        expiry,
        Duration::from_secs(20),
        "no renewal after the replug",
    );
    assert_eq!(agent.leases()[0].path, "uplink:up0", "{:?}", agent.leases());
    // The DISCOVER alone crossed the bridge: both renewals left by the
    // uplink, the second through a socket on the new interface.
    assert_eq!(t.client_frames_on_bridge(), 1, "{}", agent.log());
    let r = bridge(&cni, &t, &agent, "DEL", "pod-held");
    assert!(r.ok, "DEL: {} {}", r.stdout, r.stderr);
}

/// Once a network's server has answered through the uplink, a fresh pod's
/// first DISCOVER leaves straight through that uplink: the node's bridge
/// floods nothing to the network's other pods.
#[test]
fn a_fresh_pods_discover_leaves_through_the_uplink_that_served_its_network() {
    let cni = CniPath::new();
    let t = Topology::new(None);
    let agent = NodeAgent::start(&t.node, &["--uplink", "physnet1=up0"]);
    agent.wait_uplink_live(Duration::from_secs(10), "the uplink was not attached");
    t.count_client_frames_on_bridge();

    // The network's first lease: its DISCOVER crosses the bridge to find
    // a server wherever it is.
    add(&cni, &t, &agent, "pod-first");
    assert_eq!(t.client_frames_on_bridge(), 1);

    let second = NetNs::new();
    add_in(&cni, &t, &agent, &second, "pod-second");
    assert!(t.server.holds(second.mac("eth0")), "{}", t.server.log());
    // Its DISCOVER went out of the uplink; flooded, it would have been
    // counted twice more (to `up0` and to the first pod's port).
    assert_eq!(t.client_frames_on_bridge(), 1, "{}", agent.log());
    let leases = agent.leases();
    assert_eq!(leases.len(), 2, "{leases:?}");
    assert!(leases.iter().all(|l| l.path == "uplink:up0"), "{leases:?}");
    for (pod, id) in [(&t.pod, "pod-first"), (&second, "pod-second")] {
        let r = bridge_plugin(&cni, &t.node, pod, "xbr0", &agent.socket, "DEL", id);
        assert!(r.ok, "DEL {id}: {} {}", r.stdout, r.stderr);
    }
}

/// When the uplink that served a network no longer leads to its server (it
/// moved onto the node's bridge), a fresh pod's first DISCOVER is lost
/// there, its retransmission crosses the bridge and finds the server, and
/// the network's next pod sends through the bridge from the start.
#[test]
fn a_discover_the_uplink_no_longer_answers_is_retransmitted_through_the_bridge() {
    let cni = CniPath::new();
    let t = Topology::new(None);
    let agent = NodeAgent::start(
        &t.node,
        &["--uplink", "physnet1=up0", "--retransmit-initial", "1s"],
    );
    agent.wait_uplink_live(Duration::from_secs(10), "the uplink was not attached");
    add(&cni, &t, &agent, "pod-first");
    assert_eq!(agent.leases()[0].path, "uplink:up0", "{:?}", agent.leases());

    let (_local_ns, _local_port, local) = t.move_server_onto_the_node();
    t.count_client_frames_to_wire();
    let second = NetNs::new();
    add_in(&cni, &t, &agent, &second, "pod-second");
    let mac = second.mac("eth0");
    assert!(local.lease_for(mac).is_some(), "{}", local.log());
    // One frame went straight out of the uplink: the first DISCOVER.
    assert_eq!(t.client_frames_sent_on_uplink(), 1, "{}", agent.log());
    let lease = agent
        .leases()
        .into_iter()
        .find(|l| l.container_id == "pod-second");
    let path = lease.map(|l| l.path).unwrap_or_default();
    assert!(path.starts_with("af-packet") || path == "tc", "{path}");

    // The network's server answered on the node: the next pod's DISCOVER
    // goes through the bridge at once.
    let third = NetNs::new();
    add_in(&cni, &t, &agent, &third, "pod-third");
    assert!(
        local.lease_for(third.mac("eth0")).is_some(),
        "{}",
        local.log()
    );
    assert_eq!(t.client_frames_sent_on_uplink(), 1, "{}", agent.log());
}

/// The agent's packet sockets open in `ns` (`ss -0 -p`).
fn agent_packet_sockets(ns: &NetNs) -> usize {
    ns.exec(&["ss", "-0", "-a", "-p", "-H"])
        .lines()
        .filter(|l| l.contains("\"xdhcp\""))
        .count()
}
