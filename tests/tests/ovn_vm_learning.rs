//! A KubeVirt VM on an OVN localnet network whose logical port security is
//! pinned to the one-shot's address, as under OVN-Kubernetes, in the OVS +
//! OVN node lab (`xdhcp_tests::OvnLab`: real northbound and southbound
//! databases, `ovn-northd`, `ovn-controller`, `ovs-vswitchd` on the
//! userspace datapath, dnsmasq behind the provider bridge) with the
//! **in-process fake API server** (`xdhcp_tests::fake_apiserver`, driven by
//! the agent's real `kube::Client`; it is not a cluster).
//!
//! The launcher pod `virt-launcher-vm1` (controlled by its VMI) is a `br-int`
//! port whose logical port has the VM's MAC; its interface is a port of the
//! bridge `k6t-eth0`, as KubeVirt's bridge binding makes it, with the
//! guest's namespace behind it (`eth0`, the VM's MAC). The one-shot leases
//! address A with client id `01:<MAC>` (the agent's own VM ADD here, or
//! busybox `udhcpc` in the baseline: both what ovnkube-node's one-shot
//! sends) and the entry reports A. A stand-in for ovnkube-controller polls
//! the pod's `pod-networks` entry on the fake API server every 20 ms and,
//! whenever its address changes, copies it into the logical port's
//! `addresses` and `port_security` with `ovn-nbctl` on the real northbound
//! database, as the real controller does on every change of the entry.
//!
//! Shown:
//! - without xdhcp, the guest's own `dhcpcd` (a DUID client id) is offered
//!   another address B by unicast, which OVN drops at the pinned port: the
//!   guest ends without an address (the baseline the rest fixes);
//! - with the agent, the guard on the VM's port sets the BOOTP broadcast
//!   flag on the guest's DISCOVER and REQUEST: the guest gets B, the entry
//!   moves to B within 2 s, the stand-in re-pins, and the guest pings the
//!   DHCP server's host through OVN from B; a repeated ADD that puts the
//!   entry back to A is followed (the agent writes nothing until the guest's
//!   next exchange), and that exchange moves it to B again;
//! - the same guest with `udhcpc` (client id `01:<MAC>`) gets A: nothing is
//!   written;
//! - a forged broadcast ACK from a host on the physical segment is refused
//!   as answering no REQUEST of the guest, and an ACK the guest sends to
//!   itself is dropped by the guard at the port: nothing learned, each
//!   counted by its reason.
//!
//! - OVN-Kubernetes' own VM path: no ADD reaches the agent at all; the
//!   launcher's port is found in OVS and its pod (by `iface-id-ver`) in the
//!   node's pod watch; the one-shot (`udhcpc`, client id `01:<MAC>`) leases
//!   A through the guarded port and the test writes the entry as
//!   ovnkube-node does; the guest's dhcpcd gets B, the entry moves to B
//!   (every other field and network kept), the stand-in re-pins, the guest
//!   pings from B.
//! - The same path on IPv6: the network's DHCPv6 server and prefix are
//!   vouched for by a plain pod's DHCPv6 lease through the agent (there is
//!   no DHCPv6 one-shot to anchor one); a REPLY from a server no lease of
//!   the network was served by is refused and counted, the guest's own
//!   `dhcpcd -6` moves the entry's IPv6 address with its IPv4 one kept,
//!   and its static address is listed, the pod's refused.
//!
//! Every guest client runs in a private mount namespace whose
//! `/var/lib/dhcpcd` and `/run` are the test's own directories. Needs root;
//! fails, never skips, without it.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use xdhcp::bindings::{BindingSource, PATH_BINDINGS};
use xdhcp::cli::{AgentArgs, KubeMode};
use xdhcp::cni::config;
use xdhcp::rpc::{self, Client, CniRequest};
use xdhcp_tests::agent::ThreadAgent;
use xdhcp_tests::fake_apiserver::{LauncherPod, Op};
use xdhcp_tests::guest::GuestFs;
use xdhcp_tests::{Dnsmasq, DnsmasqConfig, NetNs, OvnLab, StandInApi, Veth, parse_mac, wait_until};

/// The launcher pod's namespace and name (the lab's NAD lives in `lab-ns`).
const NS: &str = "lab-ns";
const POD: &str = "virt-launcher-vm1";
const VM_MAC: &str = "02:00:00:00:30:01";
/// The launcher's own interface MAC (bridge binding gives the VM the MAC
/// the port is known by).
const LAUNCHER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x30, 0x99];
const POD_NETWORKS: &str = "k8s.ovn.org/pod-networks";
/// Where the agent serves its metrics, inside the lab's node namespace.
const METRICS: std::net::SocketAddr =
    std::net::SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 9563);

fn vm_mac() -> [u8; 6] {
    parse_mac(VM_MAC).unwrap()
}

/// The fake API server in the lab's node namespace, and a kubeconfig.
struct Api(StandInApi);

impl std::ops::Deref for Api {
    type Target = StandInApi;

    fn deref(&self) -> &StandInApi {
        &self.0
    }
}

impl Api {
    fn start_in(node: &Path) -> Self {
        Self(StandInApi::start_in(node))
    }

    fn patches(&self) -> usize {
        self.server.count(Op::PatchPod)
    }
}

/// The address (and prefix length) the `pod-networks` annotation `text`
/// reports for the lab's network.
fn entry_address(text: &str) -> Option<(Ipv4Addr, u8)> {
    let doc: Value = serde_json::from_str(text).ok()?;
    let cidr = doc[OvnLab::NAD]["ip_addresses"][0].as_str()?;
    let (ip, len) = cidr.split_once('/')?;
    Some((ip.parse().ok()?, len.parse().ok()?))
}

/// `ovn-nbctl` on the lab's northbound database (from any thread).
fn nbctl(dir: &Path, args: &[&str]) -> String {
    let mut cmd = Command::new(xdhcp_tests::program("ovn-nbctl"));
    for var in xdhcp_testbed::ovn::DIR_VARS {
        cmd.env(var, dir);
    }
    let out = cmd
        .arg(format!("--db=unix:{}", dir.join("ovnnb.sock").display()))
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

/// Pins logical port `lsp` to `mac ip`, as ovnkube-controller does from a
/// `pod-networks` entry (`addresses` and `port_security`).
fn pin(dir: &Path, lsp: &str, ip: Ipv4Addr) {
    let value = format!("{VM_MAC} {ip}");
    nbctl(dir, &["lsp-set-addresses", lsp, &value]);
    nbctl(dir, &["lsp-set-port-security", lsp, &value]);
}

/// What the logical port's `port_security` says now.
fn port_security(dir: &Path, lsp: &str) -> String {
    nbctl(dir, &["lsp-get-port-security", lsp])
}

/// The stand-in for ovnkube-controller: follows the pod's entry on the fake
/// API server (a poll every 20 ms) and pins the logical port to its
/// address at once whenever the address changes.
struct StandIn {
    stop: Arc<AtomicBool>,
    pins: Arc<Mutex<Vec<Ipv4Addr>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StandIn {
    /// Following the launcher pod's entry in the stand-in API server.
    fn start(api: &Arc<Api>, dir: &Path, lsp: &str) -> Self {
        let api = api.clone();
        Self::following(dir, lsp, move || {
            api.server.annotation(NS, POD, POD_NETWORKS)
        })
    }

    /// Following the entry `annotation` reads (the launcher pod's
    /// `pod-networks` annotation, wherever the pod is kept).
    fn following(
        dir: &Path,
        lsp: &str,
        annotation: impl Fn() -> Option<String> + Send + 'static,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let pins = Arc::new(Mutex::new(Vec::new()));
        let (dir, lsp) = (dir.to_path_buf(), lsp.to_owned());
        let (s, p) = (stop.clone(), pins.clone());
        let thread = std::thread::spawn(move || {
            let mut pinned = None;
            while !s.load(Ordering::Relaxed) {
                let now = annotation()
                    .as_deref()
                    .and_then(entry_address)
                    .map(|(ip, _)| ip);
                if let Some(ip) = now
                    && now != pinned
                {
                    pin(&dir, &lsp, ip);
                    p.lock().unwrap().push(ip);
                    pinned = now;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Self {
            stop,
            pins,
            thread: Some(thread),
        }
    }

    fn pins(&self) -> Vec<Ipv4Addr> {
        self.pins.lock().unwrap().clone()
    }

    fn last(&self) -> Option<Ipv4Addr> {
        self.pins().last().copied()
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

/// An in-process agent on its own thread inside the lab's node namespace,
/// reading the lab's Open vSwitch database; stopped on drop.
struct NodeAgent(ThreadAgent);

impl NodeAgent {
    fn start(lab: &OvnLab, kubeconfig: &Path) -> Self {
        Self::start_with(lab, kubeconfig, |_| {})
    }

    fn start_with(lab: &OvnLab, kubeconfig: &Path, more: impl FnOnce(&mut AgentArgs)) -> Self {
        let agent = ThreadAgent::start(Some(lab.node.path()), "xdt-ovnvm-agent-", |args| {
            args.metrics_addr = Some(METRICS);
            args.kube = KubeMode::On;
            args.kubeconfig = Some(kubeconfig.to_path_buf());
            args.ovsdb = lab.db_socket();
            more(args);
        });
        // The uplink comes from OVS: the one-shot's replies are taken there.
        agent.wait_uplinks_live(Duration::from_secs(15), "the OVS");
        Self(agent)
    }

    /// On OVN-Kubernetes' own VM path: the node's pods watched (the
    /// fake API server's node) and the lab's network served by DHCP.
    fn start_own_path(lab: &OvnLab, kubeconfig: &Path) -> Self {
        Self::start_with(lab, kubeconfig, |args| {
            args.node_name = Some(xdhcp_tests::fake_apiserver::NODE.to_owned());
            args.dhcp_networks = vec![OvnLab::NAD.to_owned()];
        })
    }

    fn add(&self, req: &CniRequest) -> rpc::CniResult {
        self.0.add(req).expect("VM ADD succeeds")
    }

    /// Waits up to `within` for the host port `port` to get the VM policy
    /// (learning), as the agent's status shows it.
    #[track_caller]
    fn wait_vm_policy(&self, port: &str, within: Duration) {
        assert!(
            wait_until(within, || {
                let s: rpc::AgentStatus = self.client().get(rpc::PATH_STATUS).expect("status");
                s.guarded_ports.iter().any(|p| p.port == port && p.learning)
            }),
            "the VM's port {port} did not get the VM policy"
        );
    }
}

/// The VMI `vm1` with one interface, on the lab's localnet network, with
/// the VM's MAC.
fn put_localnet_vmi(api: &Api) {
    api.server.put_vmi(xdhcp_tests::fake_apiserver::vmi(
        (NS, "vm1"),
        false,
        ("localnet1", OvnLab::NAD, VM_MAC),
    ));
}

impl std::ops::Deref for NodeAgent {
    type Target = ThreadAgent;

    fn deref(&self) -> &ThreadAgent {
        &self.0
    }
}

/// The exposition lines of the agent's `/metrics` starting with `prefix`.
fn metric_lines(node: &Path, prefix: &str) -> Vec<String> {
    xdhcp_tests::agent::metric_lines(node, METRICS, prefix)
}

/// The sum of the metric lines starting with `prefix` and holding
/// `label` (a label set may match several series, one per family).
fn metric(node: &Path, prefix: &str, label: &str) -> u64 {
    metric_lines(node, prefix)
        .iter()
        .filter(|l| l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// The lab with dnsmasq, the launcher pod's port on `br-int` (the VM's MAC
/// on its logical port) and the guest behind the launcher's bridge.
struct Vm {
    guest: NetNs,
    _guest_link: Veth,
    dnsmasq: Dnsmasq,
    lsp: String,
    launcher_ns: PathBuf,
    /// The guest clients' own `/var/lib/dhcpcd` (`db/`) and `/run` (`run/`).
    guest_fs: GuestFs,
    lab: OvnLab,
}

impl Vm {
    fn start() -> Self {
        let mut lab = OvnLab::start();
        let dnsmasq = Dnsmasq::start(
            &lab.server,
            DnsmasqConfig {
                interface: OvnLab::SERVER_IF.to_owned(),
                ..DnsmasqConfig::default()
            },
        );
        lab.add_pod(POD, vm_mac());
        let launcher = &lab.pods()[0];
        let lsp = launcher.iface_id.clone();
        let lns = &launcher.ns;
        lns.ip(&[
            "link",
            "set",
            "eth0",
            "address",
            &xdhcp_tests::format_mac(LAUNCHER_MAC),
        ]);
        let guest = NetNs::new();
        let link = Veth::with_mac(lns, "tapg", &guest, "eth0", vm_mac());
        lns.ip(&["link", "add", "k6t-eth0", "type", "bridge"]);
        lns.ip(&["link", "set", "eth0", "master", "k6t-eth0"]);
        lns.ip(&["link", "set", "tapg", "master", "k6t-eth0"]);
        for i in ["k6t-eth0", "tapg", "eth0"] {
            lns.link_up(i);
        }
        guest.link_up("eth0");
        // The userspace datapath does not fill in checksums a sender left
        // to offload.
        for (ns, i) in [(lns, "tapg"), (&guest, "eth0")] {
            ns.exec(&["ethtool", "-K", i, "tx", "off"]);
        }
        let guest_fs = GuestFs::new();
        let launcher_ns = lns.path().to_path_buf();
        Self {
            guest,
            _guest_link: link,
            dnsmasq,
            lsp,
            launcher_ns,
            guest_fs,
            lab,
        }
    }

    /// Runs `dhcpcd` once in the guest; the address it bound, if any
    /// within `secs`.
    fn dhcpcd(&self, secs: u32) -> Option<Ipv4Addr> {
        self.guest_fs.dhcpcd_once(&self.guest, secs)
    }

    /// The IPv4 addresses on the guest's `eth0`.
    fn guest_addrs(&self) -> Vec<Ipv4Addr> {
        self.guest
            .ipv4_addrs("eth0")
            .into_iter()
            .map(|(a, _)| a)
            .collect()
    }

    /// Whether the guest reaches the DHCP server's host (ping).
    fn pings_server(&self) -> bool {
        self.guest
            .command("busybox")
            .args(["ping", "-c", "3", "-W", "2"])
            .arg(OvnLab::SERVER_IP.to_string())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// What dnsmasq offered the VM's MAC (its log), for failure messages.
    fn offers(&self) -> Vec<String> {
        self.dnsmasq
            .log()
            .lines()
            .filter(|l| l.contains("DHCPOFFER") && l.contains(VM_MAC))
            .map(str::to_owned)
            .collect()
    }
}

/// The VM with the agent: the fake API server holds the launcher pod
/// (controlled by its VMI) and the VMI; the VM's ADD leased the one-shot
/// address, the entry reports it and the stand-in pinned the port to it.
struct Served {
    agent: NodeAgent,
    stand_in: StandIn,
    api: Arc<Api>,
    req: CniRequest,
    one_shot: Ipv4Addr,
    vm: Vm,
}

impl Served {
    fn start() -> Self {
        let vm = Vm::start();
        let api = Arc::new(Api::start_in(vm.lab.node.path()));
        let uid = api.server.add_pod(
            NS,
            POD,
            &[
                ("kubevirt.io", "virt-launcher"),
                ("vm.kubevirt.io/name", "vm1"),
            ],
            &[],
        );
        api.server.put_vmi(xdhcp_tests::fake_apiserver::vmi(
            (NS, "vm1"),
            true,
            ("localnet1", OvnLab::NAD, VM_MAC),
        ));
        let stand_in = StandIn::start(&api, vm.lab.dir(), &vm.lsp);
        let agent = NodeAgent::start(&vm.lab, &api.kubeconfig);
        let conf = json!({
            "cniVersion": "1.0.0", "name": OvnLab::NETWORK, "type": "ovn-k8s-cni-overlay",
            "topology": "localnet", "netAttachDefName": OvnLab::NAD, "ipam": {"type": "dhcp"}
        });
        let req = CniRequest {
            container_id: vm.lab.pods()[0].sandbox.clone(),
            ifname: "eth0".to_owned(),
            netns: Some(vm.launcher_ns.clone()),
            args: [
                ("K8S_POD_NAMESPACE".to_owned(), NS.to_owned()),
                ("K8S_POD_NAME".to_owned(), POD.to_owned()),
                ("K8S_POD_UID".to_owned(), uid),
            ]
            .into(),
            config: config::parse(conf.to_string().as_bytes()).unwrap(),
        };
        let r = agent.add(&req);
        let one_shot = r.ips[0].address.addr;
        let me = Self {
            agent,
            stand_in,
            api,
            req,
            one_shot,
            vm,
        };
        assert_eq!(me.reported(), Some(one_shot), "the ADD reported A");
        assert!(
            wait_until(Duration::from_secs(2), || me.stand_in.last()
                == Some(one_shot)),
            "the stand-in did not pin A: {:?}",
            me.stand_in.pins()
        );
        assert!(
            port_security(me.vm.lab.dir(), &me.vm.lsp).contains(&one_shot.to_string()),
            "{}",
            port_security(me.vm.lab.dir(), &me.vm.lsp)
        );
        me
    }

    fn reported(&self) -> Option<Ipv4Addr> {
        self.api
            .server
            .annotation(NS, POD, POD_NETWORKS)
            .as_deref()
            .and_then(entry_address)
            .map(|(ip, _)| ip)
    }

    /// Waits up to `within` for the entry to report `ip`; how long it took.
    fn reported_within(&self, ip: Ipv4Addr, within: Duration) -> Option<Duration> {
        let t0 = Instant::now();
        while t0.elapsed() < within {
            if self.reported() == Some(ip) {
                return Some(t0.elapsed());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }
}

/// The problem, without xdhcp: the one-shot (busybox `udhcpc`, client id
/// `01:<MAC>`, as ovnkube-node's) leases A, the port is pinned to A, and
/// the guest's own dhcpcd (a DUID) is offered B by unicast, which OVN drops
/// at the port: the guest has no address. dnsmasq did offer (its log),
/// so the drop is the port's.
#[test]
fn without_xdhcp_a_pinned_vm_port_leaves_a_duid_guest_without_an_address_ovn_lab() {
    let vm = Vm::start();
    let (a, _) = xdhcp_tests::udhcpc_once(&vm.guest, "eth0").expect("the one-shot leases A");
    pin(vm.lab.dir(), &vm.lsp, a);
    let got = vm.dhcpcd(10);
    let offers = vm.offers();
    assert_eq!(
        got, None,
        "the guest got an address through the pinned port; offers: {offers:?}"
    );
    assert!(
        vm.guest_addrs().is_empty(),
        "the guest has {:?}",
        vm.guest_addrs()
    );
    assert!(
        offers.iter().any(|l| !l.contains(&format!(" {a} "))),
        "dnsmasq offered the DUID client nothing but A: {offers:?}"
    );
}

/// The fix: the guard on the VM's port (XDP here: the port's bridge is on
/// the userspace datapath) has the guest's DISCOVER and REQUEST ask for
/// broadcast replies, which pass the pinned port; the guest gets B, the
/// entry moves to B within 2 s of the guest's ACK, the stand-in re-pins,
/// and the guest pings the server's host through OVN from B. Then a
/// repeated ADD puts the entry back to A: the agent leaves it (nothing
/// written for 2 s), and the guest's next exchange (dhcpcd again: an
/// INIT-REBOOT REQUEST for B) moves it to B again.
#[test]
fn a_duid_guest_behind_a_pinned_vm_port_gets_its_own_address_and_the_entry_follows_ovn_lab_fake_apiserver()
 {
    let s = Served::start();
    let t0 = Instant::now();
    let b = s.vm.dhcpcd(20).unwrap_or_else(|| {
        panic!(
            "the guest got no address; offers: {:?}\nport security: {}",
            s.vm.offers(),
            port_security(s.vm.lab.dir(), &s.vm.lsp)
        )
    });
    assert_ne!(b, s.one_shot, "the DUID client gets another address");
    let took = s.reported_within(b, Duration::from_secs(2));
    assert!(
        took.is_some(),
        "the entry reports {:?}, the guest holds {b}",
        s.reported()
    );
    #[expect(clippy::print_stderr, reason = "the figure is useful in test logs")]
    {
        eprintln!(
            "the entry reported {b} {took:?} after dhcpcd returned, {:?} after it started",
            t0.elapsed()
        );
    }
    assert!(
        wait_until(Duration::from_secs(2), || s.stand_in.last() == Some(b)),
        "the stand-in did not re-pin: {:?}",
        s.stand_in.pins()
    );
    // The guest got B through the port pinned to A: the replies it needed
    // (broadcast, as its DISCOVER and REQUEST asked) passed port security.
    assert_eq!(s.stand_in.pins(), vec![s.one_shot, b]);
    // ovn-controller applies the new port security.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(s.vm.guest_addrs(), vec![b]);
    assert!(
        s.vm.pings_server(),
        "the guest does not reach the server from {b}"
    );
    let learned = s.agent.learned();
    assert_eq!(learned.len(), 1, "{learned:?}");
    assert_eq!((learned[0].mac.as_str(), learned[0].ip), (VM_MAC, b.into()));

    // A repeated ADD reports A again: followed, not undone.
    s.agent.add(&s.req);
    assert_eq!(
        s.reported(),
        Some(s.one_shot),
        "the repeated ADD reported A"
    );
    let patches = s.api.patches();
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        (s.reported(), s.api.patches()),
        (Some(s.one_shot), patches),
        "the agent undid the ADD's report"
    );
    // The guest's next exchange moves it back.
    assert_eq!(s.vm.dhcpcd(20), Some(b), "the guest asks for B again");
    assert!(
        s.reported_within(b, Duration::from_secs(2)).is_some(),
        "the guest's exchange did not move the entry: {:?}",
        s.reported()
    );
}

/// While a repeated ADD of the VM is in flight (its read of the pod held by
/// the fake API server), the guest completes an exchange for B with the
/// entry at A: the agent writes nothing, then or after the ADD (the ADD's
/// report stands until the guest's next exchange).
#[test]
fn nothing_is_written_while_the_vms_add_is_in_flight_ovn_lab_fake_apiserver() {
    let s = Served::start();
    let b = s.vm.dhcpcd(20).expect("the guest gets its own address");
    assert!(s.reported_within(b, Duration::from_secs(2)).is_some());
    // A repeated ADD puts A back; followed.
    s.agent.add(&s.req);
    assert_eq!(s.reported(), Some(s.one_shot));
    let held = s.api.server.hold(Op::GetPod, 0);
    let (agent_socket, req) = (s.agent.socket.clone(), s.req.clone());
    let add = std::thread::spawn(move || {
        Client::new(&agent_socket, Duration::from_mins(1))
            .post::<_, Value>(rpc::PATH_ADD, &req)
            .is_ok()
    });
    assert!(
        held.wait(Duration::from_secs(5)),
        "the ADD did not read the pod"
    );
    let patches = s.api.patches();
    assert_eq!(s.vm.dhcpcd(20), Some(b), "the guest asks for B again");
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        (s.reported(), s.api.patches()),
        (Some(s.one_shot), patches),
        "the agent wrote while the ADD was in flight"
    );
    held.release();
    assert!(add.join().unwrap(), "the repeated ADD failed");
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        (s.reported(), s.api.patches()),
        (Some(s.one_shot), patches),
        "the agent undid the ADD's report"
    );
}

/// The same guest with busybox `udhcpc` (client id `01:<MAC>`, as the
/// one-shot's) gets A: the entry already reports it, nothing is written.
#[test]
fn a_guest_with_the_one_shots_client_id_gets_the_same_address_and_nothing_is_written_ovn_lab_fake_apiserver()
 {
    let s = Served::start();
    let patches = s.api.patches();
    let (ip, server) = xdhcp_tests::udhcpc_once(&s.vm.guest, "eth0").expect("udhcpc leases");
    assert_eq!((ip, server), (s.one_shot, OvnLab::SERVER_IP));
    assert!(
        wait_until(Duration::from_secs(2), || s
            .agent
            .learned()
            .iter()
            .any(|b| b.ip == ip)),
        "the guest's lease was not learned: {:?}",
        s.agent.learned()
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(s.reported(), Some(s.one_shot));
    assert_eq!(s.api.patches(), patches, "the pod was written");
    assert_eq!(s.stand_in.pins(), vec![s.one_shot]);
}

/// A host on the physical segment (the server's namespace) forges a
/// broadcast ACK for the VM's MAC naming an address of its choosing, from
/// the real server's address (the broadcast passes the pinned port like a
/// real reply): it answers no REQUEST of the guest and is refused
/// (`unsolicited`). The guest sends itself an ACK: the guard drops it at
/// the port as a server message from a workload (`server`). Nothing is
/// learned or written.
#[test]
fn forged_acks_from_the_segment_and_from_the_guest_learn_nothing_and_are_counted_ovn_lab_fake_apiserver()
 {
    let s = Served::start();
    let patches = s.api.patches();
    let node = s.vm.lab.node.path();
    let wanted = Ipv4Addr::new(192, 0, 2, 66);
    // The guest's link has been up since the start: OVN knows the port.
    for xid in 0..3 {
        send_ack(
            &s.vm.lab.server,
            OvnLab::SERVER_IF,
            s.vm.lab.server.mac(OvnLab::SERVER_IF),
            OvnLab::SERVER_IP,
            0x0bad_0000 + xid,
            wanted,
        );
    }
    assert!(
        wait_until(Duration::from_secs(3), || metric(
            node,
            "xdhcp_learn_refused_total",
            r#"reason="unsolicited""#
        ) >= 3),
        "the forgeries were not seen and refused: {:?}",
        metric_lines(node, "xdhcp_learn")
    );
    // From the guest, to itself.
    for xid in 0..2 {
        send_ack(
            &s.vm.guest,
            "eth0",
            vm_mac(),
            OvnLab::SERVER_IP,
            0x0bad_0100 + xid,
            wanted,
        );
    }
    assert!(
        wait_until(Duration::from_secs(3), || metric(
            node,
            "xdhcp_guard_dropped_frames",
            r#"reason="server",family="ipv4""#
        ) >= 2),
        "the guest's ACKs were not dropped at its port: {:?}",
        metric_lines(node, "xdhcp_guard_dropped")
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(s.reported(), Some(s.one_shot), "a forgery moved the entry");
    assert_eq!(s.api.patches(), patches, "a forgery wrote the pod");
    assert!(s.agent.learned().is_empty(), "{:?}", s.agent.learned());
}

/// Sends out of `ifname` in `ns` a broadcast DHCPACK for the VM's MAC
/// naming `yiaddr`, with the real server's identifier and `src_ip`.
fn send_ack(
    ns: &NetNs,
    ifname: &str,
    src_mac: [u8; 6],
    src_ip: Ipv4Addr,
    xid: u32,
    yiaddr: Ipv4Addr,
) {
    use dhcproto::v4::{DhcpOption, Message, MessageType, Opcode};
    use dhcproto::{Encodable as _, Encoder};
    use std::os::fd::AsRawFd as _;
    use xdhcp::datapath::frame::{FrameHeaders, build_udp_frame};

    let mut m = Message::default();
    m.set_opcode(Opcode::BootReply)
        .set_xid(xid)
        .set_chaddr(&vm_mac())
        .set_yiaddr(yiaddr);
    let o = m.opts_mut();
    o.insert(DhcpOption::MessageType(MessageType::Ack));
    o.insert(DhcpOption::ServerIdentifier(OvnLab::SERVER_IP));
    o.insert(DhcpOption::AddressLeaseTime(3600));
    o.insert(DhcpOption::SubnetMask(Ipv4Addr::new(255, 255, 255, 0)));
    let mut payload = Vec::new();
    m.encode(&mut Encoder::new(&mut payload)).unwrap();
    let frame = build_udp_frame(
        &FrameHeaders {
            src_mac,
            dst_mac: [0xff; 6],
            vlan: None,
            src_ip,
            dst_ip: Ipv4Addr::BROADCAST,
            src_port: 67,
            dst_port: 68,
        },
        &payload,
    );
    let sock = ns.packet_socket(ns.ifindex(ifname), libc::ETH_P_ALL as u16, None);
    // SAFETY: sending a buffer on a bound packet socket.
    let n = unsafe { libc::send(sock.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
    assert_eq!(
        n,
        frame.len() as isize,
        "send: {}",
        std::io::Error::last_os_error()
    );
}

/// The live migration the target launcher pod belongs to.
const MIGRATION: &str = "vm1-migration";
const MIGRATION_UID: &str = "6d1c0de0-0000-4000-8000-000000000091";
/// The source launcher pod, on another node.
const SOURCE_POD: &str = "virt-launcher-vm1-source";

/// The launcher pod object (controlled by VMI `vm1`, on the agent's node)
/// with `uid` and `annotations`; with `migration`, the target of
/// [`MIGRATION`] (its label and annotation, as virt-controller sets them).
fn launcher_pod(api: &Api, uid: &str, annotations: &Value, migration: bool) -> Value {
    let pod = LauncherPod {
        namespace: NS,
        name: POD,
        uid,
        node: xdhcp_tests::fake_apiserver::NODE,
        vmi: "vm1",
        migration: migration.then_some((MIGRATION, MIGRATION_UID)),
    };
    api.server.launcher_pod(&pod, annotations)
}

/// The default network's entry ovnkube-node writes beside ours.
const DEFAULT_ENTRY: &str =
    r#"{"ip_addresses":["10.128.0.9/23"],"mac_address":"0a:58:0a:80:00:09","role":"primary"}"#;

/// The VM on OVN-Kubernetes' own path: its launcher pod is only a port in
/// OVS and a pod in the API; the agent (on `--dhcp-network` the lab's NAD)
/// is never called; the one-shot leased A through the guarded port and
/// the entry reports A, pinned.
struct OwnPath {
    agent: NodeAgent,
    stand_in: StandIn,
    api: Arc<Api>,
    one_shot: Ipv4Addr,
    vm: Vm,
}

impl OwnPath {
    fn start() -> Self {
        Self::start_as(None)
    }

    /// With `source`, the launcher pod is [`MIGRATION`]'s target, and the
    /// source pod (on another node) reports `source` for the network.
    fn start_as(source: Option<Ipv4Addr>) -> Self {
        let migration = source.is_some();
        let vm = Vm::start();
        let api = Arc::new(Api::start_in(vm.lab.node.path()));
        let uid = vm.lab.pods()[0].uid.clone();
        put_localnet_vmi(&api);
        if let Some(ip) = source {
            put_migration_source(&api, ip);
        }
        api.server
            .put_pod(launcher_pod(&api, &uid, &json!({}), migration));
        let stand_in = StandIn::start(&api, vm.lab.dir(), &vm.lsp);
        let agent = NodeAgent::start_own_path(&vm.lab, &api.kubeconfig);
        let host_port = vm.lab.pods()[0].host_ifname.clone();
        assert!(
            wait_until(Duration::from_secs(10), || {
                let s: rpc::AgentStatus = agent.client().get(rpc::PATH_STATUS).expect("status");
                s.guarded_ports
                    .iter()
                    .any(|p| p.port == host_port && p.pod_uid.as_deref() == Some(uid.as_str()))
            }),
            "the VM's port found in OVS was not guarded"
        );
        assert!(
            wait_until(Duration::from_secs(10), || api.server.count(Op::WatchPods)
                > 0),
            "the agent does not watch the node's pods"
        );
        // The follower looks again every second: once the watch has the
        // pod, the port gets the VM policy, which the status shows.
        agent.wait_vm_policy(&host_port, Duration::from_secs(5));
        // ovnkube-node's one-shot, then its entry (with a foreign field,
        // the deprecated `ip_address`, and the default network's entry).
        let (a, server) =
            xdhcp_tests::udhcpc_once(&vm.guest, "eth0").expect("the one-shot leases A");
        assert_eq!(server, OvnLab::SERVER_IP);
        let ours = format!(
            r#"{{"ip_addresses":["{a}/24"],"mac_address":"{VM_MAC}","role":"secondary","ipam_mode":"dhcp","ip_address":"{a}/24","tunnel_id":7}}"#
        );
        let annotation = format!(r#"{{"default":{DEFAULT_ENTRY},"{}":{ours}}}"#, OvnLab::NAD);
        api.server.put_pod(launcher_pod(
            &api,
            &uid,
            &json!({ POD_NETWORKS: annotation }),
            migration,
        ));
        assert!(
            wait_until(Duration::from_secs(2), || stand_in.pins().contains(&a)),
            "the stand-in did not pin A: {:?}",
            stand_in.pins()
        );
        Self {
            agent,
            stand_in,
            api,
            one_shot: a,
            vm,
        }
    }

    fn reported(&self) -> Option<Ipv4Addr> {
        self.api
            .server
            .annotation(NS, POD, POD_NETWORKS)
            .as_deref()
            .and_then(entry_address)
            .map(|(ip, _)| ip)
    }
}

/// OVN-Kubernetes' own VM path, with no CNI ADD to the agent at all: the
/// launcher pod (controlled by its VMI, on the agent's node) is only a
/// `br-int` port wired as OVN-Kubernetes wires it (`iface-id-ver` its UID,
/// `k8s.ovn.org/nad`, `attached_mac`) on a `--dhcp-network`. The agent
/// finds it in OVS, its pod in the node's pod watch, and guards it as a
/// VM's. The one-shot (busybox `udhcpc`, client id `01:<MAC>`, as
/// ovnkube-node's) leases A through that port; the test writes the entry as
/// ovnkube-node does and the stand-in pins A. The guest's dhcpcd (DUID)
/// gets B; the entry moves to B within 2 s, only its address fields
/// changed; the stand-in re-pins; the guest pings from B. Without the VM
/// policy on a port found in OVS (learning and the broadcast rewrite) the
/// guest gets nothing through the pinned port.
#[test]
fn ovn_kubernetes_own_vm_path_with_no_add_moves_the_entry_to_the_guests_address_ovn_lab_fake_apiserver()
 {
    let s = OwnPath::start();
    let (a, vm) = (s.one_shot, &s.vm);
    let b = vm.dhcpcd(20).unwrap_or_else(|| {
        panic!(
            "the guest got no address; offers: {:?}\nport security: {}",
            vm.offers(),
            port_security(vm.lab.dir(), &vm.lsp)
        )
    });
    assert_ne!(b, a, "the DUID client gets another address");
    assert!(
        wait_until(Duration::from_secs(2), || s.reported() == Some(b)),
        "the entry reports {:?}, the guest holds {b}",
        s.reported()
    );
    let doc: Value =
        serde_json::from_str(&s.api.server.annotation(NS, POD, POD_NETWORKS).unwrap()).unwrap();
    assert_eq!(
        doc["default"],
        serde_json::from_str::<Value>(DEFAULT_ENTRY).unwrap(),
        "another network's entry changed"
    );
    let e = &doc[OvnLab::NAD];
    assert_eq!(e["ip_addresses"], json!([format!("{b}/24")]));
    assert_eq!(e["ip_address"], json!(format!("{b}/24")));
    assert_eq!(
        (
            &e["mac_address"],
            &e["role"],
            &e["ipam_mode"],
            &e["tunnel_id"]
        ),
        (
            &json!(VM_MAC),
            &json!("secondary"),
            &json!("dhcp"),
            &json!(7)
        ),
        "{e}"
    );
    assert!(
        wait_until(Duration::from_secs(2), || s.stand_in.last() == Some(b)),
        "the stand-in did not re-pin: {:?}",
        s.stand_in.pins()
    );
    assert_eq!(s.stand_in.pins(), vec![a, b]);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(vm.guest_addrs(), vec![b]);
    assert!(
        vm.pings_server(),
        "the guest does not reach the server from {b}"
    );
    let learned = s.agent.learned();
    assert_eq!(learned.len(), 1, "{learned:?}");
    assert_eq!((learned[0].mac.as_str(), learned[0].ip), (VM_MAC, b.into()));
    // Named by its pod, found from the port; it replaced the one-shot's A.
    let pod = format!("{NS}/{POD}");
    assert_eq!(
        (learned[0].pod.as_deref(), learned[0].replaced),
        (Some(pod.as_str()), Some(a.into()))
    );
    // No ADD reached the agent: it holds no lease.
    let leases: Vec<Value> = s.agent.client().get(rpc::PATH_LEASES).expect("leases");
    assert!(leases.is_empty(), "{leases:?}");
}

/// [`MIGRATION`] of VMI `vm1` from [`SOURCE_POD`] (on another node, its
/// entry reporting `ip`, as that node's agent left it) to [`POD`].
fn put_migration_source(api: &Api, ip: Ipv4Addr) {
    let entry = format!(
        r#"{{"{}":{{"ip_addresses":["{ip}/24"],"mac_address":"{VM_MAC}","role":"secondary","ipam_mode":"dhcp"}}}}"#,
        OvnLab::NAD
    );
    api.server.put_pod(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": SOURCE_POD, "namespace": NS,
            "uid": "6d1c0de0-0000-4000-8000-000000000092",
            "labels": {"kubevirt.io": "virt-launcher", "vm.kubevirt.io/name": "vm1"},
            "annotations": {POD_NETWORKS: entry}
        },
        "spec": {"nodeName": "node-a", "containers": [{"name": "compute", "image": "registry.invalid/c"}]}
    }));
    api.server.put_vmim(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
        "metadata": {"name": MIGRATION, "namespace": NS, "uid": MIGRATION_UID},
        "spec": {"vmiName": "vm1"},
        "status": {"migrationState": {"sourcePod": SOURCE_POD, "targetPod": POD}}
    }));
}

/// Node A's side of a live migration (and a VM stopped): the VM's port
/// leaves OVS; the binding learned on it is dropped within the agent's
/// sweep, no RELEASE is sent for the VM (dnsmasq sees none), and the entry
/// keeps the guest's address. Without the drop the binding stays until the
/// guest's lease expires.
#[test]
fn a_vm_port_leaving_ovs_drops_its_learned_binding_and_sends_no_release_ovn_lab_fake_apiserver() {
    let s = OwnPath::start();
    let b = s.vm.dhcpcd(20).expect("the guest gets its own address");
    assert!(wait_until(Duration::from_secs(2), || s.reported() == Some(b)));
    assert_eq!(s.agent.learned().len(), 1);
    let releases = || {
        s.vm.dnsmasq
            .log()
            .lines()
            .filter(|l| l.contains("DHCPRELEASE"))
            .count()
    };
    let before = (releases(), s.api.patches());
    s.vm.lab.remove_pod_port(0);
    assert!(
        wait_until(Duration::from_secs(8), || s.agent.learned().is_empty()),
        "the binding learned on the gone port stays: {:?}",
        s.agent.learned()
    );
    assert_eq!(
        (releases(), s.api.patches()),
        before,
        "a RELEASE or a write"
    );
    assert_eq!(s.reported(), Some(b));
}

/// Node B's side of a live migration: the target launcher pod (a new pod of
/// the same VMI, labelled with the migration) is wired on this node as
/// OVN-Kubernetes wires it; ovnkube-node's one-shot there leased A and its
/// entry reports A. The source pod, on another node, reports the address
/// the guest holds (learned there). The guest keeps its lease across the
/// migration and asks nothing: the target's entry takes the source's
/// address, the stand-in re-pins, and the guest, with that address, pings
/// through OVN. Without the copy the entry stays at A, pinned.
#[test]
fn a_migration_targets_entry_takes_the_sources_address_when_the_guest_keeps_its_lease_ovn_lab_fake_apiserver()
 {
    let kept = Ipv4Addr::new(192, 0, 2, 200);
    let s = OwnPath::start_as(Some(kept));
    assert!(
        wait_until(Duration::from_secs(8), || s.reported() == Some(kept)),
        "the target's entry reports {:?}, the source's {kept}",
        s.reported()
    );
    assert!(
        wait_until(Duration::from_secs(2), || s.stand_in.last() == Some(kept)),
        "the stand-in did not re-pin: {:?}",
        s.stand_in.pins()
    );
    s.vm.guest.add_addr("eth0", kept, 24);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        s.vm.pings_server(),
        "the guest does not reach the server from {kept}"
    );
    // Nothing was learned here: the guest did not ask.
    assert!(s.agent.learned().is_empty(), "{:?}", s.agent.learned());
}

/// The launcher pod's `pod-networks` annotation in the embedded pod store
/// at `store` (`<state dir>/pod-networks.json`).
fn stored_annotation(store: &Path) -> Option<String> {
    let doc: Value = serde_json::from_slice(&std::fs::read(store).ok()?).ok()?;
    doc["pods"][format!("{NS}/{POD}")]["annotations"][POD_NETWORKS]
        .as_str()
        .map(str::to_owned)
}

/// OVN-Kubernetes' own VM path with no cluster (`--kube off`): the embedded
/// pod store is the node's pods. The launcher pod is seeded there with the
/// UID its port carries (`iface-id-ver`) and its VMI; no ADD reaches the
/// agent. The agent finds the pod by that UID and guards the port as a
/// VM's (the status says `learning`); the one-shot leases A through it and
/// the test writes the entry into the store as ovnkube-node writes it; the
/// guest's dhcpcd gets B, the store's entry moves to B, the stand-in
/// re-pins, the guest pings from B. Without the store's lookup by UID the
/// port never gets the VM policy.
#[test]
fn ovn_kubernetes_own_vm_path_without_a_cluster_finds_the_pod_in_the_embedded_store_ovn_lab() {
    let vm = Vm::start();
    let uid = vm.lab.pods()[0].uid.clone();
    let store = Arc::new(Mutex::new(PathBuf::new()));
    let at = store.clone();
    let agent = NodeAgent::start_with(&vm.lab, Path::new("/nonexistent"), |args| {
        args.kube = KubeMode::Off;
        args.kubeconfig = None;
        args.dhcp_networks = vec![OvnLab::NAD.to_owned()];
        let path = args.state_dir.join("pod-networks.json");
        std::fs::write(
            &path,
            json!({"pods": {format!("{NS}/{POD}"): {
                "uid": uid,
                "labels": {"kubevirt.io": "virt-launcher", "vm.kubevirt.io/name": "vm1"},
                "owner_vmi": "vm1"
            }}})
            .to_string(),
        )
        .unwrap();
        *at.lock().unwrap() = path;
    });
    let store = store.lock().unwrap().clone();
    let host_port = vm.lab.pods()[0].host_ifname.clone();
    assert!(
        wait_until(Duration::from_secs(10), || {
            let s: rpc::AgentStatus = agent.client().get(rpc::PATH_STATUS).expect("status");
            s.guarded_ports.iter().any(|p| {
                p.port == host_port && p.pod_uid.as_deref() == Some(uid.as_str()) && p.learning
            })
        }),
        "the VM's port found in OVS did not get the VM policy from the embedded store"
    );
    let followed = store.clone();
    let stand_in = StandIn::following(vm.lab.dir(), &vm.lsp, move || stored_annotation(&followed));

    // ovnkube-node's one-shot, then its entry, written into the store.
    let (a, _) = xdhcp_tests::udhcpc_once(&vm.guest, "eth0").expect("the one-shot leases A");
    let mut doc: Value = serde_json::from_slice(&std::fs::read(&store).unwrap()).unwrap();
    doc["pods"][format!("{NS}/{POD}")]["annotations"][POD_NETWORKS] = json!(format!(
        r#"{{"{}":{{"ip_addresses":["{a}/24"],"mac_address":"{VM_MAC}","role":"secondary","ipam_mode":"dhcp"}}}}"#,
        OvnLab::NAD
    ));
    let tmp = store.with_extension("json.test");
    std::fs::write(&tmp, doc.to_string()).unwrap();
    std::fs::rename(&tmp, &store).unwrap();
    assert!(
        wait_until(Duration::from_secs(2), || stand_in.pins().contains(&a)),
        "the stand-in did not pin A: {:?}",
        stand_in.pins()
    );

    let b = vm.dhcpcd(20).unwrap_or_else(|| {
        panic!(
            "the guest got no address; offers: {:?}\nport security: {}",
            vm.offers(),
            port_security(vm.lab.dir(), &vm.lsp)
        )
    });
    assert_ne!(b, a, "the DUID client gets another address");
    let reported = || {
        stored_annotation(&store)
            .as_deref()
            .and_then(entry_address)
            .map(|(ip, _)| ip)
    };
    assert!(
        wait_until(Duration::from_secs(2), || reported() == Some(b)),
        "the store's entry reports {:?}, the guest holds {b}",
        reported()
    );
    assert!(
        wait_until(Duration::from_secs(2), || stand_in.last() == Some(b)),
        "the stand-in did not re-pin: {:?}",
        stand_in.pins()
    );
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        vm.pings_server(),
        "the guest does not reach the server from {b}"
    );
    let learned = agent.learned();
    assert_eq!(learned.len(), 1, "{learned:?}");
    assert_eq!((learned[0].mac.as_str(), learned[0].ip), (VM_MAC, b.into()));
}

/// The IPv4 address ovnkube-node's one-shot put in the own-path VM's entry
/// for the IPv6 test (written as it writes it; no DHCPv4 runs there).
const OWN_PATH_A4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 50);
/// A plain pod on the same network, leased by the agent (its DHCPv6 lease
/// is what vouches for the network's server and prefix).
const POD2: &str = "pod2";
const POD2_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x40, 0x01];
/// The guest's IPv6 link-local address (EUI-64 of the VM's MAC).
const GUEST_LL: std::net::Ipv6Addr =
    std::net::Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0xff, 0xfe00, 0x3001);
/// A host on the physical segment forging DHCPv6 REPLYs.
const FORGER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x66, 0x66];

/// The VM on OVN-Kubernetes' own path on a network dnsmasq serves DHCPv6
/// on too (`fd00:6::/64`, behind the provider bridge), its entry with the
/// IPv4 address ovnkube-node wrote; a plain pod on the same network whose
/// ADD leased it a DHCPv6 address through the agent.
struct OwnPath6 {
    agent: NodeAgent,
    api: Arc<Api>,
    _dnsmasq6: xdhcp_tests::Dnsmasq6,
    /// The plain pod's DHCPv6 address.
    neighbour6: std::net::Ipv6Addr,
    vm: Vm,
}

impl OwnPath6 {
    fn start() -> Self {
        let mut vm = Vm::start();
        let dnsmasq6 = xdhcp_tests::Dnsmasq6::start_on(
            &vm.lab.server,
            OvnLab::SERVER_IF,
            "fd00:6::1/64",
            "fd00:6::100,fd00:6::1ff",
            &[],
        );
        let api = Arc::new(Api::start_in(vm.lab.node.path()));
        let uid = vm.lab.pods()[0].uid.clone();
        put_localnet_vmi(&api);
        let a = OWN_PATH_A4;
        let ours = format!(
            r#"{{"ip_addresses":["{a}/24"],"mac_address":"{VM_MAC}","gateway_ips":["192.0.2.1"],"role":"secondary","ipam_mode":"dhcp","ip_address":"{a}/24","tunnel_id":7}}"#
        );
        let annotation = format!(r#"{{"default":{DEFAULT_ENTRY},"{}":{ours}}}"#, OvnLab::NAD);
        api.server.put_pod(launcher_pod(
            &api,
            &uid,
            &json!({ POD_NETWORKS: annotation }),
            false,
        ));
        let pod2 = vm.lab.add_pod(POD2, POD2_MAC);
        let (sandbox2, uid2, ns2) = (
            pod2.sandbox.clone(),
            pod2.uid.clone(),
            pod2.ns.path().to_path_buf(),
        );
        api.server.put_pod(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": POD2, "namespace": NS, "uid": uid2},
            "spec": {"nodeName": xdhcp_tests::fake_apiserver::NODE,
                     "containers": [{"name": "c", "image": "registry.invalid/c"}]}
        }));
        let agent = NodeAgent::start_own_path(&vm.lab, &api.kubeconfig);
        agent.wait_vm_policy(&vm.lab.pods()[0].host_ifname, Duration::from_secs(15));
        let conf = json!({
            "cniVersion": "1.1.0", "name": OvnLab::NETWORK, "type": "ovn-k8s-cni-overlay",
            "topology": "localnet", "netAttachDefName": OvnLab::NAD,
            "ipam": {"type": "xdhcp", "family": "ipv6", "timeout": "20s",
                     "ipv6": {"prefixLength": 64, "gateway": "fd00:6::1"}}
        });
        let req = CniRequest {
            container_id: sandbox2,
            ifname: "eth0".to_owned(),
            netns: Some(ns2),
            args: [
                ("K8S_POD_NAMESPACE".to_owned(), NS.to_owned()),
                ("K8S_POD_NAME".to_owned(), POD2.to_owned()),
                ("K8S_POD_UID".to_owned(), uid2),
            ]
            .into(),
            config: config::parse(conf.to_string().as_bytes()).unwrap(),
        };
        let neighbour6 = agent.add(&req).ips6[0].address.addr;
        Self {
            agent,
            api,
            _dnsmasq6: dnsmasq6,
            neighbour6,
            vm,
        }
    }

    /// The VM's entry for the lab's network.
    fn entry(&self) -> Value {
        let doc: Value =
            serde_json::from_str(&self.api.server.annotation(NS, POD, POD_NETWORKS).unwrap())
                .unwrap();
        doc[OvnLab::NAD].clone()
    }

    fn refused(&self, reason: &str) -> u64 {
        metric(
            self.vm.lab.node.path(),
            "xdhcp_learn_refused_total",
            &format!(r#"reason="{reason}""#),
        )
    }

    /// A REPLY answering the guest's REQUEST in flight (the right
    /// transaction, the guest's DUID and IAID, `wanted`, free and inside
    /// the prefix) from a server no lease of the network was served by:
    /// refused (`unknown_server`), nothing written, nothing learned.
    fn forged_reply_from_another_server_is_refused(&self, wanted: std::net::Ipv6Addr) {
        let before = self.entry();
        let patches = self.api.patches();
        let unknown = self.refused("unknown_server");
        let xid = 0x00c0_ffee;
        self.guest_request6(xid, wanted);
        // The REQUEST reaches the agent before the answer to it.
        std::thread::sleep(Duration::from_millis(300));
        self.forge_reply6(xid, wanted, &[0, 3, 0, 1, 2, 0, 0, 0, 0x66, 0x66]);
        assert!(
            wait_until(Duration::from_secs(3), || self.refused("unknown_server")
                > unknown),
            "the forgery was not refused as unknown_server: {:?}",
            metric_lines(self.vm.lab.node.path(), "xdhcp_learn")
        );
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(self.entry(), before, "the forgery moved the entry");
        assert_eq!(self.api.patches(), patches, "the forgery wrote the pod");
        assert!(
            self.agent.learned().is_empty(),
            "{:?}",
            self.agent.learned()
        );
    }

    /// The guest, its entry listing `want`, configures a static address
    /// inside the prefix: listed after the others; then the plain pod's
    /// address: refused (`address_taken`), nothing written.
    fn static_addresses_are_listed_a_neighbours_refused(&self, listed: &Value) {
        let own: std::net::Ipv6Addr = "fd00:6::abc".parse().unwrap();
        self.vm
            .guest
            .ip(&["-6", "addr", "add", &format!("{own}/64"), "dev", "eth0"]);
        let mut want = listed.clone();
        want.as_array_mut()
            .expect("a list of addresses")
            .push(json!(format!("{own}/64")));
        assert!(
            wait_until(Duration::from_secs(3), || self.entry()["ip_addresses"]
                == want),
            "the entry reports {}",
            self.entry()
        );
        let taken = self.refused("address_taken");
        let patches = self.api.patches();
        let neighbour = self.neighbour6;
        self.vm.guest.ip(&[
            "-6",
            "addr",
            "add",
            &format!("{neighbour}/64"),
            "dev",
            "eth0",
        ]);
        assert!(
            wait_until(Duration::from_secs(3), || self.refused("address_taken")
                > taken),
            "the pod's address was not refused: {:?}",
            metric_lines(self.vm.lab.node.path(), "xdhcp_learn")
        );
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(self.entry()["ip_addresses"], want);
        assert_eq!(self.api.patches(), patches);
    }

    /// Sends from the guest's interface a DHCPv6 REQUEST of the VM's
    /// DUID-LL for `addr`, transaction `xid`, naming a server that is not
    /// the network's (dnsmasq leaves it unanswered: it stays open for its
    /// whole window).
    fn guest_request6(&self, xid: u32, addr: std::net::Ipv6Addr) {
        use dhcproto::v6::{DhcpOption, MessageType};
        let mac = vm_mac();
        let payload =
            xdhcp_tests::frames::dhcp6(MessageType::Request, xid, vm_mac(), (addr, 3600), |o| {
                o.insert(DhcpOption::ServerId(vec![
                    0, 3, 0, 1, 2, 0, 0, 0, 0x99, 0x99,
                ]));
                o.insert(DhcpOption::ElapsedTime(0));
            });
        let frame = xdhcp_tests::frames::from_guest6((mac, GUEST_LL), &payload);
        self.vm.guest.send_frame("eth0", &frame);
    }

    /// Sends from the guest's interface a DHCPv6 RELEASE of `addr`,
    /// transaction `xid`.
    fn guest_release6(&self, xid: u32, addr: std::net::Ipv6Addr) {
        use dhcproto::v6::{DhcpOption, MessageType};
        let payload =
            xdhcp_tests::frames::dhcp6(MessageType::Release, xid, vm_mac(), (addr, 3600), |o| {
                o.insert(DhcpOption::ElapsedTime(0));
            });
        let frame = xdhcp_tests::frames::from_guest6((vm_mac(), GUEST_LL), &payload);
        self.vm.guest.send_frame("eth0", &frame);
    }

    /// Sends from the server's side of the segment a REPLY to the VM's
    /// MAC for transaction `xid`, the VM's DUID-LL and IAID, binding
    /// `addr`, with `server` as its Server Identifier, from the forger's
    /// own sources.
    fn forge_reply6(&self, xid: u32, addr: std::net::Ipv6Addr, server: &[u8]) {
        use dhcproto::v6::{DhcpOption, MessageType};
        let payload =
            xdhcp_tests::frames::dhcp6(MessageType::Reply, xid, vm_mac(), (addr, 3600), |o| {
                o.insert(DhcpOption::ServerId(server.to_vec()));
            });
        let forger = (FORGER_MAC, "fe80::6666".parse().unwrap());
        let frame = xdhcp_tests::frames::to_guest6(forger, (vm_mac(), GUEST_LL), &payload);
        self.vm.lab.server.send_frame(OvnLab::SERVER_IF, &frame);
    }
}

/// OVN-Kubernetes' own VM path, IPv6: no ADD reaches the agent for the VM
/// (its port found in OVS, its pod in the watch); its entry has the IPv4
/// address ovnkube-node wrote; a plain pod on the same network holds a
/// DHCPv6 lease through the agent, which is what vouches for the network's
/// DHCPv6 server (its DUID, where its REPLYs came from) and prefix on the
/// node. A REPLY answering the guest's REQUEST in flight — the right
/// transaction, the guest's DUID and IAID, a free address inside the
/// prefix — from a server no lease of the network was served by is refused
/// (`unknown_server`): nothing written, nothing learned. The guest's own
/// `dhcpcd -6` then gets an address from dnsmasq: the entry lists it after
/// the IPv4 address, which stays, with every other field kept; the binding
/// is learned (family `ipv6`, named by the port's pod); the guest's RELEASE
/// drops it and leaves the entry as it is. A static address
/// the guest configures is listed after it; the pod's address, probed by
/// the guest, is refused (`address_taken`).
#[test]
fn ovn_kubernetes_own_vm_path_learns_the_guests_dhcpv6_and_keeps_the_ipv4_address_ovn_lab_fake_apiserver()
 {
    let s = OwnPath6::start();
    let before = s.entry();
    let wanted: std::net::Ipv6Addr = "fd00:6::1ee".parse().unwrap();
    s.forged_reply_from_another_server_is_refused(wanted);

    let guest6 =
        s.vm.guest_fs
            .dhcpcd6_once(&s.vm.guest, "eth0", 20)
            .expect("dhcpcd bound a DHCPv6 address");
    assert_ne!(guest6, wanted);
    let a = OWN_PATH_A4;
    let want = json!([format!("{a}/24"), format!("{guest6}/64")]);
    assert!(
        wait_until(Duration::from_secs(2), || s.entry()["ip_addresses"] == want),
        "the entry reports {}, the guest holds {guest6}",
        s.entry()
    );
    let e = s.entry();
    for field in [
        "mac_address",
        "gateway_ips",
        "role",
        "ipam_mode",
        "tunnel_id",
    ] {
        assert_eq!(e[field], before[field], "{field}: {e}");
    }
    let doc: Value =
        serde_json::from_str(&s.api.server.annotation(NS, POD, POD_NETWORKS).unwrap()).unwrap();
    assert_eq!(
        doc["default"],
        serde_json::from_str::<Value>(DEFAULT_ENTRY).unwrap(),
        "another network's entry changed"
    );
    let rows: Vec<xdhcp::bindings::BindingRow> =
        s.agent.client().get(PATH_BINDINGS).expect("binding table");
    let learned: Vec<_> = rows
        .iter()
        .filter(|r| r.binding.source == BindingSource::Learned)
        .collect();
    assert_eq!(learned.len(), 1, "{rows:?}");
    let pod = format!("{NS}/{POD}");
    assert_eq!(
        (
            learned[0].binding.ip,
            learned[0].binding.mac.as_str(),
            learned[0].family.as_str(),
            learned[0].binding.pod.as_deref()
        ),
        (guest6.into(), VM_MAC, "ipv6", Some(pod.as_str()))
    );

    // The guest gives the address back: the binding goes, the entry keeps
    // the address, nothing is written.
    let patches = s.api.patches();
    s.guest_release6(0x00_5e1e, guest6);
    assert!(
        wait_until(Duration::from_secs(3), || s.agent.learned().is_empty()),
        "the RELEASE left {:?}",
        s.agent.learned()
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(s.entry()["ip_addresses"], want);
    assert_eq!(s.api.patches(), patches);

    s.static_addresses_are_listed_a_neighbours_refused(&want);
}
