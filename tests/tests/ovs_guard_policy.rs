//! Per-network DHCP guard settings from the cluster: a `DhcpGuardPolicy`
//! (cluster-scoped, `xdhcp.io/v1alpha1`) served by the in-process stand-in
//! API server (`xdhcp_tests::fake_apiserver`: **not a cluster**, an HTTP
//! server speaking the few endpoints the agent calls, here the list and
//! watch of those objects), and the agent in the OVS + OVN node lab
//! (`xdhcp_tests::OvnLab`, userspace datapath: ports policed at XDP)
//! guarding the lab network's ports from Open vSwitch (`--dhcp-network`).
//!
//! Shown by behaviour, each step within a bound of the object's change:
//!
//! 1. an object for the network with a rate of 1 per second, a burst of 2
//!    and rogue-server drop: a served pod's DISCOVER flood reaches the real
//!    server at that rate, not the default's (10 back to back, then 20 a
//!    second), and the guard counts what it dropped for the rate; a rogue
//!    DHCP server in that pod reaches no other pod;
//! 2. the object changed to pass server messages and lift the limit: the
//!    rogue's OFFERs reach the other pod;
//! 3. the object changed to an invalid one (a burst of 0, drop back on):
//!    the agent says why in its log, and the previous settings stay (the
//!    rogue still gets through).
//!
//! Without the watch, step 1 fails (the defaults hold); applying an invalid
//! object, or dropping back to the defaults on one, fails step 3. Needs
//! root; fails, never skips, without it.

mod agent_support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use agent_support::NodeAgent;
use serde_json::json;
use xdhcp_tests::fake_apiserver::{FakeApiServer, NODE, Op};
use xdhcp_tests::ovs_lab::flood;
use xdhcp_tests::servers::ROGUE_IP;
use xdhcp_tests::{Dnsmasq, DnsmasqConfig, NetNs, OvnLab, OvnPod, wait_until};

/// Where the agent serves its metrics, inside the lab's node namespace.
const METRICS: &str = "127.0.0.1:9466";

/// How long a change of the object may take to reach the ports.
const BOUND: Duration = Duration::from_secs(5);

/// The policy object's name.
const POLICY: &str = "lab-localnet1";

/// The stand-in API server, listening in `node` (on its own runtime), and
/// a kubeconfig naming it.
struct Api {
    server: FakeApiServer,
    _rt: tokio::runtime::Runtime,
    dir: tempfile::TempDir,
}

impl Api {
    fn start_in(node: &NetNs) -> Self {
        let listener = node.run_in(|| {
            std::net::TcpListener::bind("127.0.0.1:0").expect("bind in the node namespace")
        });
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let server = rt.block_on(async { FakeApiServer::start_on(listener) });
        let dir = tempfile::Builder::new()
            .prefix("xdt-kubeconfig-")
            .tempdir()
            .unwrap();
        std::fs::write(
            dir.path().join("kubeconfig"),
            format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: fake\n\
                 clusters:\n- name: fake\n  cluster:\n    server: {}\n\
                 contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: nobody\n\
                 users:\n- name: nobody\n  user: {{}}\n",
                server.url()
            ),
        )
        .unwrap();
        Api {
            server,
            _rt: rt,
            dir,
        }
    }

    fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }
}

/// Whether `port` carries a guard program (XDP or TC).
fn guarded(node: &NetNs, port: &str) -> bool {
    let link = node.ip(&["-d", "link", "show", "dev", port]);
    let tc = node.exec(&["tc", "filter", "show", "dev", port, "ingress"]);
    link.contains("xdhcp_guard") || tc.contains("xdhcp_guard")
}

/// Runs one DHCP client exchange in `pod` (it asks the whole segment, the
/// rogue too) until the rogue's messages reach it, for at most `within`;
/// whether they did.
fn rogue_reaches(pod: &OvnPod, within: Duration) -> bool {
    let start = Instant::now();
    let before = flood::server_messages_seen(&pod.ns);
    while start.elapsed() < within {
        let _ = xdhcp_tests::udhcpc_once(&pod.ns, &pod.ifname);
        if flood::server_messages_seen(&pod.ns) > before {
            return true;
        }
    }
    false
}

/// The lab with two pods on its network (MACs `0a:58:c0:00:02:3x`), dnsmasq
/// behind the provider bridge, the stand-in API server, and the agent
/// reading both, guarding the network's ports from Open vSwitch.
fn lab() -> (OvnLab, Dnsmasq, Api, NodeAgent) {
    let mut lab = OvnLab::start();
    let dnsmasq = Dnsmasq::start(
        &lab.server,
        DnsmasqConfig {
            interface: OvnLab::SERVER_IF.to_owned(),
            ..DnsmasqConfig::default()
        },
    );
    lab.add_pod("pod0", [0x0a, 0x58, 0xc0, 0x00, 0x02, 0x30]);
    lab.add_pod("pod1", [0x0a, 0x58, 0xc0, 0x00, 0x02, 0x31]);
    let api = Api::start_in(&lab.node);
    let db = lab.db_socket();
    let kubeconfig = api.kubeconfig();
    let agent = NodeAgent::start(
        &lab.node,
        &[
            "--ovsdb",
            db.to_str().unwrap(),
            "--kube",
            "on",
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--node-name",
            NODE,
            "--metrics-addr",
            METRICS,
            "--dhcp-network",
            OvnLab::NAD,
        ],
    );
    (lab, dnsmasq, api, agent)
}

/// Floods DISCOVERs from `pod` until the real server sees no more than
/// `burst` and `rate` allow, for at most [`BOUND`] from now; asserts that
/// it came to that, that the defaults would have let the flood through,
/// and that the guard counted what it dropped for the rate.
#[track_caller]
fn assert_flood_held_within_bound(
    lab: &OvnLab,
    dnsmasq: &Dnsmasq,
    agent: &NodeAgent,
    pod: &OvnPod,
    (burst, rate): (u64, u64),
) {
    let put = Instant::now();
    let (held, (seen, sent, took)) = loop {
        let last = flood::flood_seen(dnsmasq, pod, Duration::from_millis(500));
        if last.0 <= flood::allowance(burst, rate, last.2) {
            break (true, last);
        }
        if put.elapsed() > BOUND {
            break (false, last);
        }
    };
    assert!(
        held,
        "the server still saw {seen} of {sent} DISCOVERs in {took:?} {:?} after the object \
         (at most {} at burst {burst}, rate {rate}; the defaults allow {})\n{}",
        put.elapsed(),
        flood::allowance(burst, rate, took),
        flood::allowance(flood::BURST, flood::RATE, took),
        agent.log()
    );
    // The defaults would have let this flood through: the object did it.
    assert!(
        flood::allowance(burst, rate, took) < flood::allowance(flood::BURST, flood::RATE, took) / 2
            && sent >= 4 * flood::allowance(flood::BURST, flood::RATE, took),
        "the flood shows nothing: {sent} sent in {took:?}"
    );
    let metrics = METRICS.parse().expect("an address");
    let mut dropped = 0;
    assert!(
        wait_until(Duration::from_secs(5), || {
            dropped = flood::guard_figures(&lab.node, metrics, &pod.host_ifname, "rate").1;
            dropped >= sent - flood::allowance(burst, rate, took)
        }),
        "the guard counted {dropped} dropped for the rate of {sent}\n{}",
        agent.log()
    );
}

/// A real dnsmasq in `pod`, on a range of its own: a rogue server.
fn start_rogue(pod: &OvnPod) -> Dnsmasq {
    Dnsmasq::rogue(&pod.ns, &pod.ifname, Some(ROGUE_IP))
}

#[test]
fn a_networks_guard_policy_object_sets_its_ports_kernel_settings_and_a_bad_one_keeps_the_last() {
    let (lab, dnsmasq, api, agent) = lab();
    let pods = lab.pods();
    let (rogue_pod, client) = (&pods[0], &pods[1]);
    assert!(
        wait_until(Duration::from_secs(10), || pods
            .iter()
            .all(|p| guarded(&lab.node, &p.host_ifname))),
        "the network's ports are not guarded from Open vSwitch:\n{}",
        agent.log()
    );
    assert!(
        wait_until(Duration::from_secs(10), || api
            .server
            .count(Op::WatchGuardPolicies)
            > 0),
        "the agent does not watch DhcpGuardPolicy objects:\n{}",
        agent.log()
    );

    // 1. A lower rate, and rogue-server drop.
    let (burst, rate) = (2, 1);
    api.server.put_guard_policy(
        POLICY,
        &json!({"network": OvnLab::NAD, "rate": rate, "burst": burst, "dropServerMessages": true}),
    );
    assert_flood_held_within_bound(&lab, &dnsmasq, &agent, rogue_pod, (burst, rate));

    // A rogue server in pod0 (drop on): pod1 hears none of it.
    let rogue = start_rogue(rogue_pod);
    flood::count_server_messages(&client.ns, ROGUE_IP);
    let bound = xdhcp_tests::udhcpc_once(&client.ns, &client.ifname);
    assert!(
        wait_until(Duration::from_secs(3), || rogue.count_in_log("DHCPOFFER")
            >= 1),
        "the rogue never answered:\n{}",
        rogue.log()
    );
    assert_eq!(
        flood::server_messages_seen(&client.ns),
        0,
        "rogue OFFERs reached pod1 (bound {bound:?})\n{}",
        rogue.log()
    );

    // 2. Server messages pass, no limit: the rogue gets through.
    api.server.put_guard_policy(
        POLICY,
        &json!({"network": OvnLab::NAD, "rate": 0, "dropServerMessages": false}),
    );
    assert!(
        rogue_reaches(client, BOUND),
        "with server messages passed, no rogue message reached pod1 within {BOUND:?}\n{}\n{}",
        rogue.log(),
        agent.log()
    );

    // 3. An invalid version (burst 0, drop back on): said in the log, and
    // the settings of the version before stay.
    api.server.put_guard_policy(
        POLICY,
        &json!({"network": OvnLab::NAD, "burst": 0, "dropServerMessages": true}),
    );
    assert!(
        wait_until(BOUND, || {
            let log = agent.log();
            log.contains("DhcpGuardPolicy refused") && log.contains("spec.burst 0")
        }),
        "the invalid object is not reported:\n{}",
        agent.log()
    );
    assert!(
        rogue_reaches(client, BOUND),
        "the invalid object changed the ports: the rogue no longer reaches pod1\n{}",
        agent.log()
    );
    assert!(guarded(&lab.node, &rogue_pod.host_ifname));
}
