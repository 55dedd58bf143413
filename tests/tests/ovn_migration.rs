//! A KubeVirt VM live-migrated between two OVN-Kubernetes nodes, on
//! OVN-Kubernetes' own VM path (no CNI ADD reaches the agents: ovnkube-node
//! runs its own one-shot and writes the `pod-networks` entry), in the
//! two-chassis lab (`xdhcp_tests::TwoNodes`: one OVN central, per node its
//! own `ovsdb-server`, `ovs-vswitchd` on the userspace datapath and
//! `ovn-controller`, Geneve between the chassis, both provider bridges on
//! one segment where dnsmasq serves) with the **in-process fake API
//! server** (`xdhcp_tests::fake_apiserver`, on node A's management address;
//! it is not a cluster). One agent per node, each reading its own node's
//! Open vSwitch database and watching its own node's pods.
//!
//! As OVN-Kubernetes does it, each launcher pod has a logical switch port
//! of its own (named after the pod, its UID in `options:iface-id-ver`,
//! bound to the pod's node by `options:requested-chassis`), both with the
//! VM's MAC. A stand-in for ovnkube-controller copies each launcher pod's
//! entry into its logical port's `addresses` and `port_security` whenever
//! the entry's address changes.
//!
//! Needs root; fails, never skips, without it.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use xdhcp::cli::KubeMode;
use xdhcp_tests::agent::ThreadAgent;
use xdhcp_tests::fake_apiserver::{FakeApiServer, LauncherPod, Op};
use xdhcp_tests::guest::GuestFs;
use xdhcp_tests::{
    Dnsmasq, DnsmasqConfig, NetNs, OvnLab, TwoNodes, Veth, format_mac, parse_mac, wait_until,
};

const NS: &str = "lab-ns";
const VM_MAC: &str = "02:00:00:00:31:01";
/// The launcher pods: the source on node A, the migration's target on B.
const SOURCE_POD: &str = "virt-launcher-vm1-src";
const TARGET_POD: &str = "virt-launcher-vm1-dst";
const SOURCE_UID: &str = "6d1c0de0-0000-4000-8000-0000000000a1";
const TARGET_UID: &str = "6d1c0de0-0000-4000-8000-0000000000b1";
const MIGRATION: &str = "vm1-migration";
const MIGRATION_UID: &str = "6d1c0de0-0000-4000-8000-0000000000c1";
const POD_NETWORKS: &str = "k8s.ovn.org/pod-networks";
/// Where each agent serves its metrics, inside its node's namespace.
const METRICS: std::net::SocketAddr =
    std::net::SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 9563);

fn vm_mac() -> [u8; 6] {
    parse_mac(VM_MAC).unwrap()
}

/// The fake API server on node A's management address (node B's agent
/// reaches it over `mgmt0`), and a kubeconfig for it.
struct Api {
    server: FakeApiServer,
    _rt: tokio::runtime::Runtime,
    kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
}

impl Api {
    fn start(lab: &TwoNodes) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let at = std::net::SocketAddr::new(lab.nodes[0].mgmt_ip.into(), 0);
        let listener = xdhcp::sys::netns::run_in_netns(lab.nodes[0].ns.path(), || {
            std::net::TcpListener::bind(at)
        })
        .expect("enter node A's namespace")
        .expect("bind the fake API server on node A's management address");
        let server = rt.block_on(async { FakeApiServer::start_on(listener) });
        let dir = tempfile::Builder::new()
            .prefix("xdt-kubeconfig-")
            .tempdir()
            .unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
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
            kubeconfig,
            _dir: dir,
        }
    }

    /// Pod `pod`'s entry for the lab's network.
    fn entry(&self, pod: &str) -> Value {
        let text = self.server.annotation(NS, pod, POD_NETWORKS);
        let doc: Value = text
            .as_deref()
            .and_then(|t| serde_json::from_str(t).ok())
            .unwrap_or_default();
        doc[OvnLab::NAD].clone()
    }

    /// The address pod `pod`'s entry reports for the lab's network.
    fn reported(&self, pod: &str) -> Option<Ipv4Addr> {
        self.server
            .annotation(NS, pod, POD_NETWORKS)
            .as_deref()
            .and_then(entry_address)
    }
}

fn entry_address(text: &str) -> Option<Ipv4Addr> {
    let doc: Value = serde_json::from_str(text).ok()?;
    let cidr = doc[OvnLab::NAD]["ip_addresses"][0].as_str()?;
    cidr.split_once('/')?.0.parse().ok()
}

/// `ovn-nbctl` on the lab's northbound database (from any thread).
fn nbctl(central: &Path, args: &[&str]) -> String {
    let mut cmd = Command::new(xdhcp_tests::program("ovn-nbctl"));
    for var in xdhcp_testbed::ovn::DIR_VARS {
        cmd.env(var, central);
    }
    let out = cmd
        .arg(format!(
            "--db=unix:{}",
            central.join("ovnnb.sock").display()
        ))
        .args(args)
        .output()
        .expect("run ovn-nbctl");
    assert!(
        out.status.success(),
        "ovn-nbctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The stand-in for ovnkube-controller: follows each launcher pod's entry
/// on the fake API server (a poll every 20 ms) and, whenever its address
/// changes, writes `MAC IP` into that pod's logical port's `addresses` and
/// `port_security` (a plain database write, as ovnkube-controller's: both
/// ports carry the VM's address during the migration).
struct StandIn {
    stop: Arc<AtomicBool>,
    ports: Arc<Mutex<Vec<(String, String)>>>,
    pins: Arc<Mutex<Vec<(String, Ipv4Addr)>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StandIn {
    fn start(api: &Arc<Api>, central: &Path) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let ports: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
        let pins: Arc<Mutex<Vec<(String, Ipv4Addr)>>> = Arc::default();
        let (api, central) = (api.clone(), central.to_path_buf());
        let (s, ps, p) = (stop.clone(), ports.clone(), pins.clone());
        let thread = std::thread::spawn(move || {
            let mut pinned = std::collections::HashMap::new();
            while !s.load(Ordering::Relaxed) {
                let follow = ps.lock().unwrap().clone();
                for (pod, lsp) in follow {
                    let Some(ip) = api.reported(&pod) else {
                        continue;
                    };
                    if pinned.get(&pod) == Some(&ip) {
                        continue;
                    }
                    let value = format!("addresses=\"{VM_MAC} {ip}\"");
                    let security = format!("port_security=\"{VM_MAC} {ip}\"");
                    nbctl(
                        &central,
                        &["set", "logical_switch_port", &lsp, &value, &security],
                    );
                    p.lock().unwrap().push((pod.clone(), ip));
                    pinned.insert(pod, ip);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Self {
            stop,
            ports,
            pins,
            thread: Some(thread),
        }
    }

    fn follow(&self, pod: &str, lsp: &str) {
        self.ports
            .lock()
            .unwrap()
            .push((pod.to_owned(), lsp.to_owned()));
    }

    /// The last address pod `pod`'s port was pinned to.
    fn last(&self, pod: &str) -> Option<Ipv4Addr> {
        self.pins
            .lock()
            .unwrap()
            .iter()
            .rev()
            .find(|(p, _)| p == pod)
            .map(|(_, ip)| *ip)
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// An in-process agent on its own thread inside node `node`'s namespace,
/// reading that node's Open vSwitch database and watching that node's
/// pods; stopped on drop.
struct NodeAgent(ThreadAgent);

impl NodeAgent {
    fn start(lab: &TwoNodes, node: usize, kubeconfig: &Path) -> Self {
        let at = &lab.nodes[node];
        let agent = ThreadAgent::start(Some(at.ns.path()), "xdt-ovn2-agent-", |args| {
            args.metrics_addr = Some(METRICS);
            args.kube = KubeMode::On;
            args.kubeconfig = Some(kubeconfig.to_path_buf());
            args.ovsdb = at.db_socket();
            args.node_name = Some(at.chassis.clone());
            args.dhcp_networks = vec![OvnLab::NAD.to_owned()];
        });
        agent.wait_uplinks_live(Duration::from_secs(15), &format!("{}'s", at.chassis));
        Self(agent)
    }

    /// Whether the agent guards `port` as pod `uid`'s.
    fn guards(&self, port: &str, uid: &str) -> bool {
        self.status()
            .guarded_ports
            .iter()
            .any(|p| p.port == port && p.pod_uid.as_deref() == Some(uid))
    }
}

impl std::ops::Deref for NodeAgent {
    type Target = ThreadAgent;

    fn deref(&self) -> &ThreadAgent {
        &self.0
    }
}

/// The exposition lines of the agent's `/metrics` in namespace `node`
/// starting with `prefix`.
fn metric_lines(node: &Path, prefix: &str) -> Vec<String> {
    xdhcp_tests::agent::metric_lines(node, METRICS, prefix)
}

/// The launcher pod `name` on `node` (controlled by VMI `vm1`); with
/// `migration`, the target of [`MIGRATION`] (its label and annotation, as
/// virt-controller sets them).
fn launcher_pod(
    api: &Api,
    name: &str,
    uid: &str,
    node: &str,
    annotations: &Value,
    migration: bool,
) -> Value {
    let pod = LauncherPod {
        namespace: NS,
        name,
        uid,
        node,
        vmi: "vm1",
        migration: migration.then_some((MIGRATION, MIGRATION_UID)),
    };
    api.server.launcher_pod(&pod, annotations)
}

/// The entry ovnkube-node writes after its one-shot leased `ip`.
fn one_shot_entry(ip: Ipv4Addr) -> Value {
    let ours = format!(
        r#"{{"ip_addresses":["{ip}/24"],"mac_address":"{VM_MAC}","role":"secondary","ipam_mode":"dhcp"}}"#
    );
    json!({ POD_NETWORKS: format!(r#"{{"{}":{ours}}}"#, OvnLab::NAD) })
}

/// The launcher pod's side: its namespace's `eth0` (the pod's port) is a
/// port of bridge `k6t-eth0`, as KubeVirt's bridge binding makes it, with
/// the launcher's own MAC; the VM's MAC is behind the bridge.
fn bridge_binding(launcher: &NetNs, launcher_mac: [u8; 6]) {
    launcher.ip(&["link", "set", "eth0", "address", &format_mac(launcher_mac)]);
    launcher.ip(&["link", "add", "k6t-eth0", "type", "bridge"]);
    launcher.ip(&["link", "set", "eth0", "master", "k6t-eth0"]);
    launcher.link_up("k6t-eth0");
    launcher.link_up("eth0");
}

/// Plugs `tap` (in `launcher`) into its bridge, up, with tx checksum
/// offload off (the userspace datapath does not fill in checksums).
fn plug(launcher: &NetNs, tap: &str) {
    launcher.ip(&["link", "set", tap, "master", "k6t-eth0"]);
    launcher.link_up(tap);
    launcher.exec(&["ethtool", "-K", tap, "tx", "off"]);
}

/// The guest: its namespace (eth0, the VM's MAC) and the directories its
/// clients keep their state in.
struct Guest {
    ns: NetNs,
    _link: Veth,
    fs: GuestFs,
}

impl Guest {
    fn new(launcher: &NetNs) -> Self {
        let ns = NetNs::new();
        let link = Veth::with_mac(launcher, "tapg", &ns, "eth0", vm_mac());
        plug(launcher, "tapg");
        ns.link_up("eth0");
        ns.exec(&["ethtool", "-K", "eth0", "tx", "off"]);
        let fs = GuestFs::new();
        Self {
            ns,
            _link: link,
            fs,
        }
    }

    /// Runs `dhcpcd` once (a DUID client id, a lease database kept across
    /// runs, no hooks) in a private mount namespace whose `/var/lib/dhcpcd`
    /// and `/run` are the guest's; the address it bound, if any.
    fn dhcpcd(&self, secs: u32) -> Option<Ipv4Addr> {
        self.fs.dhcpcd_once(&self.ns, secs)
    }

    fn pings_server(&self) -> bool {
        self.ns
            .command("busybox")
            .args(["ping", "-c", "3", "-W", "2"])
            .arg(OvnLab::SERVER_IP.to_string())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }
}

/// The VM live-migrates from node A to node B, its guest keeping its
/// lease:
///
/// 1. On A, the source launcher's port is guarded by A's agent; the
///    one-shot (busybox `udhcpc`, client id `01:<MAC>`) leases A1, the
///    test writes the entry as ovnkube-node does, the stand-in pins; the
///    guest's dhcpcd (a DUID) gets B1 through the pinned port, and A's
///    agent moves the source's entry to B1 (the stand-in re-pins).
/// 2. The migration: its object and the target launcher pod (node B) in
///    the API, the target's port on B's `br-int`; B's agent guards it as
///    the pod's; the one-shot on B leases again and the test writes the
///    target's entry; B's agent has it take the source's B1 (the stand-in
///    re-pins the target's port to B1). The source's entry and A's binding
///    are untouched meanwhile.
/// 3. The switch-over: the guest's link moves from the source launcher's
///    bridge to the target's (its address kept); the source's port leaves
///    A's OVS: A's agent drops its learned binding and writes nothing.
///    Then the source pod and its logical port go (ovnkube-controller
///    deletes a deleted pod's port).
/// 4. The guest's first exchange on B (dhcpcd again: an INIT-REBOOT for
///    B1) is learned by B's agent for the target pod; the target's entry
///    stays B1, and the guest reaches the server through B's port.
///
/// Throughout: no RELEASE for the VM reaches the server (dnsmasq's log).
/// The lab's Geneve tunnel is shown to carry traffic first (an overlay
/// switch's ping between the chassis).
#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one migration, its steps in their order"
)]
fn a_vm_migrated_between_two_chassis_keeps_both_entries_right_ovn_two_nodes_fake_apiserver() {
    let mut lab = TwoNodes::start();
    assert!(
        lab.overlay_ping(),
        "no ping across the Geneve tunnel: A {:?}, B {:?}\n{}",
        lab.nodes[0].geneve_remotes(),
        lab.nodes[1].geneve_remotes(),
        lab.nodes[0].appctl(&["ovs/route/show"])
    );
    let dnsmasq = Dnsmasq::start(
        &lab.segment,
        DnsmasqConfig {
            interface: OvnLab::SERVER_IF.to_owned(),
            ..DnsmasqConfig::default()
        },
    );
    let releases = || {
        dnsmasq
            .log()
            .lines()
            .filter(|l| l.contains("DHCPRELEASE"))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let api = Arc::new(Api::start(&lab));
    api.server.put_vmi(xdhcp_tests::fake_apiserver::vmi(
        (NS, "vm1"),
        false,
        ("localnet1", OvnLab::NAD, VM_MAC),
    ));
    let [node_a, node_b] = TwoNodes::NODES;
    let stand_in = StandIn::start(&api, &lab.central_dir());

    // 1. The VM on node A.
    api.server.put_pod(launcher_pod(
        &api,
        SOURCE_POD,
        SOURCE_UID,
        node_a,
        &json!({}),
        false,
    ));
    let source = lab.add_pod(0, SOURCE_POD, SOURCE_UID, vm_mac());
    let (source_port, source_lsp) = (source.host_ifname.clone(), source.iface_id.clone());
    bridge_binding(&source.ns, [0x02, 0, 0, 0, 0x31, 0xa9]);
    let guest = Guest::new(&lab.nodes[0].pods()[0].ns);
    stand_in.follow(SOURCE_POD, &source_lsp);
    let agent_a = NodeAgent::start(&lab, 0, &api.kubeconfig);
    let agent_b = NodeAgent::start(&lab, 1, &api.kubeconfig);
    assert!(
        wait_until(Duration::from_secs(10), || agent_a
            .guards(&source_port, SOURCE_UID)),
        "node A's agent does not guard the source's port"
    );
    // The follower looks again every second: the pod is a VM's by then.
    std::thread::sleep(Duration::from_secs(2));
    let (a1, _) = xdhcp_tests::udhcpc_once(&guest.ns, "eth0").expect("the one-shot on A leases");
    api.server.put_pod(launcher_pod(
        &api,
        SOURCE_POD,
        SOURCE_UID,
        node_a,
        &one_shot_entry(a1),
        false,
    ));
    assert!(
        wait_until(Duration::from_secs(2), || stand_in.last(SOURCE_POD)
            == Some(a1)),
        "the stand-in did not pin the source's port"
    );
    let b1 = guest
        .dhcpcd(20)
        .expect("the guest gets its own address on A");
    assert_ne!(b1, a1, "the DUID client gets another address");
    assert!(
        wait_until(Duration::from_secs(2), || api.reported(SOURCE_POD)
            == Some(b1)),
        "the source's entry reports {:?}, the guest holds {b1}",
        api.reported(SOURCE_POD)
    );
    assert!(wait_until(Duration::from_secs(2), || stand_in
        .last(SOURCE_POD)
        == Some(b1)));
    let learned = agent_a.learned();
    assert_eq!(learned.len(), 1, "{learned:?}");
    assert_eq!(
        (learned[0].mac.as_str(), learned[0].ip),
        (VM_MAC, b1.into())
    );

    // 2. The migration: the target launcher pod on B.
    api.server.put_vmim(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
        "metadata": {"name": MIGRATION, "namespace": NS, "uid": MIGRATION_UID},
        "spec": {"vmiName": "vm1"},
        "status": {"migrationState": {"sourcePod": SOURCE_POD, "targetPod": TARGET_POD,
                                      "sourceNode": node_a, "targetNode": node_b}}
    }));
    api.server.put_pod(launcher_pod(
        &api,
        TARGET_POD,
        TARGET_UID,
        node_b,
        &json!({}),
        true,
    ));
    let target = lab.add_pod(1, TARGET_POD, TARGET_UID, vm_mac());
    let (target_port, target_lsp) = (target.host_ifname.clone(), target.iface_id.clone());
    bridge_binding(&target.ns, [0x02, 0, 0, 0, 0x31, 0xb9]);
    let target_ns = lab.nodes[1].pods()[0].ns.name().to_owned();
    stand_in.follow(TARGET_POD, &target_lsp);
    assert!(
        wait_until(Duration::from_secs(10), || agent_b
            .guards(&target_port, TARGET_UID)),
        "node B's agent does not guard the target's port"
    );
    std::thread::sleep(Duration::from_secs(2));
    // ovnkube-node's one-shot on B, from the target launcher (the VM's MAC
    // behind its bridge), then its entry.
    let a2 = {
        let launcher = &lab.nodes[1].pods()[0].ns;
        let one_shot = NetNs::new();
        let _link = Veth::with_mac(launcher, "tapo", &one_shot, "eth0", vm_mac());
        plug(launcher, "tapo");
        one_shot.exec(&["ethtool", "-K", "eth0", "tx", "off"]);
        let (ip, _) =
            xdhcp_tests::udhcpc_once(&one_shot, "eth0").expect("the one-shot on B leases");
        ip
    };
    // ovnkube-node's side: what its one-shot reports is not the guest's.
    assert_ne!(a2, b1, "the one-shot on B leased the guest's own address");
    api.server.put_pod(launcher_pod(
        &api,
        TARGET_POD,
        TARGET_UID,
        node_b,
        &one_shot_entry(a2),
        true,
    ));
    assert!(
        wait_until(Duration::from_secs(10), || api.reported(TARGET_POD)
            == Some(b1)),
        "the target's entry reports {:?}, the source's {b1}",
        api.reported(TARGET_POD)
    );
    assert!(
        wait_until(Duration::from_secs(2), || stand_in.last(TARGET_POD)
            == Some(b1)),
        "the stand-in did not re-pin the target's port"
    );
    assert_eq!(
        api.reported(SOURCE_POD),
        Some(b1),
        "the source's entry moved"
    );
    // The copy: the source's address, prefix and gateway (the router the
    // guest's ACK on A named); the target's other fields kept.
    let (src, dst) = (api.entry(SOURCE_POD), api.entry(TARGET_POD));
    assert_eq!(src["gateway_ips"], json!([OvnLab::SERVER_IP.to_string()]));
    assert_eq!(
        (&dst["ip_addresses"], &dst["gateway_ips"]),
        (&src["ip_addresses"], &src["gateway_ips"])
    );
    assert_eq!(
        (&dst["mac_address"], &dst["role"], &dst["ipam_mode"]),
        (&json!(VM_MAC), &json!("secondary"), &json!("dhcp"))
    );
    assert_eq!(agent_a.learned().len(), 1, "{:?}", agent_a.learned());
    assert!(agent_b.learned().is_empty(), "{:?}", agent_b.learned());

    // 3. The switch-over: the guest's link moves to the target's bridge;
    // the source's port leaves node A.
    let patches = api.server.count(Op::PatchPod);
    lab.nodes[0].pods()[0]
        .ns
        .ip(&["link", "set", "tapg", "netns", &target_ns]);
    plug(&lab.nodes[1].pods()[0].ns, "tapg");
    lab.remove_pod_port(0, 0);
    assert!(
        wait_until(Duration::from_secs(8), || agent_a.learned().is_empty()),
        "node A's agent keeps the binding of the gone port: {:?}",
        agent_a.learned()
    );
    assert!(
        wait_until(Duration::from_secs(8), || !agent_a
            .guards(&source_port, SOURCE_UID)),
        "node A's agent still guards the gone port"
    );
    assert_eq!(
        (api.reported(SOURCE_POD), api.reported(TARGET_POD)),
        (Some(b1), Some(b1))
    );
    assert_eq!(api.server.count(Op::PatchPod), patches, "a pod was written");
    // The migration is over: the source pod goes, and with it its logical
    // port (ovnkube-controller deletes a deleted pod's; until then two
    // ports of the switch carry the VM's MAC).
    lab.nbctl(&["lsp-del", &source_lsp]);
    api.server.delete_pod(NS, SOURCE_POD);

    // 4. The guest's first exchange on B.
    assert_eq!(
        guest.dhcpcd(20),
        Some(b1),
        "the guest asks for its address again on B"
    );
    assert!(
        wait_until(Duration::from_secs(2), || agent_b
            .learned()
            .iter()
            .any(|b| b.ip == b1)),
        "node B's agent did not learn the guest's exchange: {:?}\n{:?}",
        agent_b.learned(),
        metric_lines(lab.nodes[1].ns.path(), "xdhcp_learn")
    );
    let learned = agent_b.learned();
    assert_eq!(learned.len(), 1, "{learned:?}");
    let target_name = format!("{NS}/{TARGET_POD}");
    assert_eq!(
        (
            learned[0].mac.as_str(),
            learned[0].port.as_deref(),
            learned[0].pod.as_deref()
        ),
        (
            VM_MAC,
            Some(target_port.as_str()),
            Some(target_name.as_str())
        )
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(api.reported(TARGET_POD), Some(b1));
    assert_eq!(
        api.server.count(Op::PatchPod),
        patches,
        "an entry already right was written"
    );
    assert!(
        guest.pings_server(),
        "the guest does not reach the server from {b1} through node B"
    );
    assert!(agent_a.learned().is_empty(), "{:?}", agent_a.learned());
    assert_eq!(releases(), Vec::<String>::new(), "a RELEASE was sent");
}
