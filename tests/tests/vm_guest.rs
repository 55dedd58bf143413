//! Checks of the VM test tier (`cargo xtask vmtest`): the eBPF programs,
//! native XDP on a real NIC driver (per interface, and the agent's uplink
//! on a NIC carrying a pod's DORA and RELEASE), and the VFIO handoff of a
//! real PCI NIC (with and without a live uplink on the VF's physical
//! network), on whatever kernel runs them.
//!
//! `cargo xtask vmtest` boots a second kernel (Debian 12's 6.1) in qemu over
//! this machine's root filesystem and runs this binary in the guest with
//! `--include-ignored`, next to other integration-test binaries. The guest
//! has devices the host does not:
//!
//! - two virtio-net NICs on one qemu hub ([`VIRTIO_CLIENT_MAC`] and
//!   [`VIRTIO_SERVER_MAC`]), with the guest offloads off so native XDP
//!   does not depend on what the backend offers;
//! - an e1000e NIC (8086:10d3) on qemu's user network, whose built-in DHCP
//!   server is a server implementation of its own, behind an emulated
//!   Intel IOMMU so `vfio-pci` can take it.
//!
//! The tests that need those devices are `#[ignore]`d: on the host they are
//! listed as ignored, and they fail (never skip) when run where the devices
//! are missing. [`every_program_in_the_object_passes_the_verifier`] runs on
//! the host too.
//!
//! Needs root.

mod agent_support;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use agent_support::{CniPath, NodeAgent, bridge_plugin};
use dhcproto::v4::{DhcpOption, Message, MessageType};
use dhcproto::{Decodable as _, Decoder};
use serde_json::{Value, json};
use xdhcp::cni::types::code;
use xdhcp::datapath::AttachMode;
use xdhcp::datapath::ebpf::{AttachTarget, CaptureMode, Datapath, DhcpEvent, EventReader};
use xdhcp::rpc::{self, Client, ClientError, CniRequest, CniResult};
use xdhcp::vfio::{PciAddr, VFIO_PCI};
use xdhcp_tests::{Bridge, Dnsmasq, DnsmasqConfig, NetNs, Process, parse_mac, wait_until};

/// The virtio-net NIC the capture program attaches to (set by `cargo xtask vmtest`).
pub const VIRTIO_CLIENT_MAC: &str = "52:54:00:78:64:01";
/// The virtio-net NIC dnsmasq serves on, on the same qemu hub.
pub const VIRTIO_SERVER_MAC: &str = "52:54:00:78:64:02";
/// The e1000e NIC's PCI ids (Intel 82574L).
const E1000E_IDS: (u16, u16) = (0x8086, 0x10d3);
/// The operator's driver-table entry the VFIO tests give the agent.
const E1000E_ENTRY: &str = "8086:10d3=e1000e";

const RING_WAIT: Duration = Duration::from_secs(20);
const RUN_IN_VM: &str = "needs the VM tier's devices: run `cargo xtask vmtest`";

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_owned()
}

// ------------------------------------------------------------ the programs --

#[test]
fn every_program_in_the_object_passes_the_verifier() {
    let object = xdhcp::datapath::ebpf::embedded_object();
    assert!(
        !object.is_empty(),
        "the agent was built without its eBPF object"
    );
    let mut ebpf = aya::Ebpf::load(object).expect("parse the object and create its maps");
    let mut loaded = Vec::new();
    for (name, program) in ebpf.programs_mut() {
        let result = match program {
            aya::programs::Program::Xdp(p) => p.load(),
            aya::programs::Program::SchedClassifier(p) => p.load(),
            other => panic!(
                "{name}: program type {:?} is not covered by this test",
                other.prog_type()
            ),
        };
        if let Err(e) = result {
            // The verifier's log is in the error's Display.
            panic!("{name} refused by kernel {}: {e}\n{e:?}", kernel_release());
        }
        loaded.push(name.to_owned());
    }
    loaded.sort();
    for wanted in [
        xdhcp_common::PROG_XDP,
        xdhcp_common::PROG_TC,
        xdhcp_common::PROG_UPLINK_XDP,
        xdhcp_common::PROG_UPLINK_TC,
        xdhcp_common::guard::PROG_GUARD_INGRESS,
        xdhcp_common::guard::PROG_GUARD_EGRESS,
    ] {
        assert!(
            loaded.iter().any(|n| n == wanted),
            "{wanted} not in {loaded:?}"
        );
    }
    // The agent's own loader sees no XDP refusal either.
    let dp = Datapath::load().expect("the agent's loader");
    assert_eq!(dp.xdp_unavailable(), None);
    // And the guard's own loader (its instance of the object).
    xdhcp::datapath::ebpf::Guard::load().expect("the guard's loader");
    #[expect(clippy::print_stderr, reason = "which kernel passed is the point")]
    {
        eprintln!("kernel {}: verified {loaded:?}", kernel_release());
    }
}

// ---------------------------------------------------- native XDP on virtio --

/// The interface in this (the guest's initial) namespace with `mac`.
fn netdev_with_mac(mac: &str) -> String {
    let want = parse_mac(mac).expect("valid MAC");
    let dir = std::fs::read_dir("/sys/class/net").expect("/sys/class/net");
    for entry in dir.filter_map(Result::ok) {
        let addr = std::fs::read_to_string(entry.path().join("address")).unwrap_or_default();
        if parse_mac(addr.trim()) == Some(want) {
            return entry.file_name().to_string_lossy().into_owned();
        }
    }
    panic!("no interface with MAC {mac}: {RUN_IN_VM}");
}

fn netdev_driver(ifname: &str) -> String {
    std::fs::read_link(format!("/sys/class/net/{ifname}/device/driver"))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_default()
}

/// A physical netdev moved into a test namespace; the kernel gives it back
/// to the initial namespace when the namespace is deleted.
struct MovedNic {
    ns: NetNs,
    ifname: String,
    mac: [u8; 6],
}

impl MovedNic {
    fn new(mac: &str) -> Self {
        // Nothing loads NIC drivers in the guest by itself.
        xdhcp_tests::netns::run(
            std::process::Command::new(xdhcp_tests::program("modprobe")).arg("virtio_net"),
        );
        let ifname = netdev_with_mac(mac);
        assert_eq!(
            netdev_driver(&ifname),
            "virtio_net",
            "{ifname} ({mac}) is not a virtio-net NIC"
        );
        let ns = NetNs::new();
        xdhcp_tests::netns::run(
            std::process::Command::new(xdhcp_tests::program("ip")).args([
                "link",
                "set",
                &ifname,
                "netns",
                ns.name(),
            ]),
        );
        ns.link_up(&ifname);
        Self {
            ns,
            ifname,
            mac: parse_mac(mac).expect("valid MAC"),
        }
    }
}

/// The server NIC moved into a namespace of its own, 192.0.2.1/24, with
/// dnsmasq serving on it.
fn dnsmasq_on_the_server_nic() -> (MovedNic, Dnsmasq) {
    let server = MovedNic::new(VIRTIO_SERVER_MAC);
    server
        .ns
        .add_addr(&server.ifname, "192.0.2.1".parse().unwrap(), 24);
    let dnsmasq = Dnsmasq::start(
        &server.ns,
        DnsmasqConfig {
            interface: server.ifname.clone(),
            ..DnsmasqConfig::default()
        },
    );
    (server, dnsmasq)
}

/// The kernel agrees: `ifname` (in `ns`) has its XDP program in driver
/// mode, not generic.
fn assert_driver_mode_xdp(ns: &NetNs, ifname: &str) {
    let link = ns.ip(&["-d", "link", "show", "dev", ifname]);
    assert!(link.contains("xdp ") || link.contains("xdpdrv"), "{link}");
    assert!(!link.contains("xdpgeneric"), "{link}");
}

/// An `AF_PACKET` socket on `nic` (send only), created in its namespace.
fn send_socket(nic: &MovedNic) -> std::os::fd::OwnedFd {
    nic.ns.packet_socket(nic.ns.ifindex(&nic.ifname), 0, None)
}

fn send_request(tx: &std::os::fd::OwnedFd, mac: [u8; 6], xid: u32, opts: Vec<DhcpOption>) {
    xdhcp_tests::frames::send(
        tx,
        &xdhcp_tests::frames::client_broadcast(mac, mac, xid, opts),
    );
}

/// The DHCP message a captured event carries (the reader hands payloads on
/// undecoded).
fn message(ev: &DhcpEvent) -> Message {
    Message::decode(&mut Decoder::new(&ev.frame.payload)).expect("a DHCP message")
}

async fn next_reply(reader: &mut EventReader, xid: u32, kind: MessageType) -> DhcpEvent {
    let deadline = tokio::time::Instant::now() + RING_WAIT;
    loop {
        let ev = tokio::time::timeout_at(deadline, reader.recv())
            .await
            .unwrap_or_else(|_| panic!("no {kind:?} with xid {xid:#x} in the ring buffer"))
            .expect("ring buffer");
        let xdhcp::datapath::ebpf::Captured::V4(ev) = ev else {
            continue;
        };
        let m = message(&ev);
        if m.xid() == xid && m.opts().msg_type() == Some(kind) {
            return ev;
        }
    }
}

#[tokio::test]
#[ignore = "needs the VM tier's devices: run `cargo xtask vmtest`"]
async fn native_xdp_on_virtio_net_delivers_a_dnsmasq_offer_and_ack() {
    let (_server, dnsmasq) = dnsmasq_on_the_server_nic();
    let client = MovedNic::new(VIRTIO_CLIENT_MAC);

    let mut dp = Datapath::load().expect("load");
    let mut reader = dp.take_reader().unwrap().unwrap();
    let target = AttachTarget {
        ifname: client.ifname.clone(),
        netns: Some(client.ns.path().to_path_buf()),
    };
    let att = dp
        .attach(&target, Some(AttachMode::XdpNative), CaptureMode::Observe)
        .expect("attach");
    assert_eq!(
        (att.mode, att.native_refused.as_deref()),
        (AttachMode::XdpNative, None),
        "virtio_net on {} refused native XDP",
        kernel_release()
    );
    assert_driver_mode_xdp(&client.ns, &client.ifname);

    let tx = send_socket(&client);
    let xid = 0x7e57_0001;
    // The programs copy only replies whose xid a lease owns: own it, as the
    // agent does before it sends.
    dp.xid_ownership()
        .own(xid, att.ifindex)
        .expect("own the xid in the kernel");
    send_request(
        &tx,
        client.mac,
        xid,
        vec![DhcpOption::MessageType(MessageType::Discover)],
    );
    let offer = next_reply(&mut reader, xid, MessageType::Offer).await;
    assert!(!offer.via_tc, "captured by TC, not XDP");
    assert_eq!(offer.frame.ifindex, att.ifindex);
    assert_eq!(message(&offer).chaddr()[..6], client.mac);
    let yiaddr = message(&offer).yiaddr();
    assert!(
        yiaddr.octets()[..3] == [192, 0, 2],
        "offered {yiaddr}\n{}",
        dnsmasq.log()
    );

    send_request(
        &tx,
        client.mac,
        xid,
        vec![
            DhcpOption::MessageType(MessageType::Request),
            DhcpOption::RequestedIpAddress(yiaddr),
            DhcpOption::ServerIdentifier("192.0.2.1".parse().unwrap()),
        ],
    );
    let ack = next_reply(&mut reader, xid, MessageType::Ack).await;
    assert!(!ack.via_tc);
    assert_eq!(message(&ack).yiaddr(), yiaddr);
    assert_eq!(
        dnsmasq.lease_for(client.mac).map(|l| l.ip),
        Some(yiaddr),
        "{}",
        dnsmasq.log()
    );
    assert!(dp.counters().unwrap().captured >= 2);
    dp.detach(&target).expect("detach");
}

// ------------------------------------------- a virtio-net NIC as the uplink --

/// The product's shape on a real NIC driver: the node's localnet uplink is
/// a NIC (the guest's virtio-net, on the qemu hub dnsmasq serves), a bridge
/// in the node namespace holds it and the pods' veths, and the agent takes
/// the NIC as its uplink (`--uplink physnet1=<nic>`). The agent must choose
/// native XDP for it (the kernel agrees: driver mode, not generic), a pod
/// added through the `bridge` plugin must get its OFFER and ACK through the
/// ring buffer at that NIC with nothing attached in the pod, and the
/// plugin's DEL (veth first) must release the lease at dnsmasq through the
/// NIC.
#[test]
#[ignore = "needs the VM tier's devices: run `cargo xtask vmtest`"]
fn a_virtio_nic_as_the_uplink_gets_native_xdp_and_carries_a_pods_dora_and_release() {
    let (_server, dnsmasq) = dnsmasq_on_the_server_nic();
    let uplink = MovedNic::new(VIRTIO_CLIENT_MAC);
    let node = &uplink.ns;
    let bridge = Bridge::new(node, "xbr0");
    bridge.attach(&uplink.ifname);
    let pod = NetNs::new();
    let cni = CniPath::new();

    let physnet = format!("physnet1={}", uplink.ifname);
    let metrics: std::net::SocketAddr = "127.0.0.1:9464".parse().unwrap();
    let agent = NodeAgent::start(
        node,
        &["--uplink", &physnet, "--metrics-addr", &metrics.to_string()],
    );
    agent.wait_uplink_live(Duration::from_secs(30), "the NIC uplink was not attached");
    let up = agent.status().uplinks[0].clone();
    assert_eq!(up.ifname, uplink.ifname);
    assert_eq!(
        up.mode.as_deref(),
        Some("xdp-native"),
        "a NIC uplink gets native XDP on {}: {up:?}\n{}",
        kernel_release(),
        agent.log()
    );
    assert_driver_mode_xdp(node, &uplink.ifname);
    // The metrics (scraped inside the node namespace) name the mode too.
    let scraped = node
        .run_in(move || xdhcp_tests::bench::http_get(metrics, "/metrics"))
        .expect("the agent's metrics");
    let series = format!("uplink=\"{}\",mode=\"xdp-native\"", uplink.ifname);
    assert!(
        xdhcp_tests::bench::metric(&scraped, "xdhcp_uplink_attached", &series) >= 1.0,
        "{scraped}"
    );

    let add = bridge_plugin(&cni, node, &pod, "xbr0", &agent.socket, "ADD", "pod-nic");
    assert!(
        add.ok,
        "ADD: {} {}\n{}\n{}",
        add.stdout,
        add.stderr,
        agent.log(),
        dnsmasq.log()
    );
    let mac = pod.mac("eth0");
    let held = dnsmasq.lease_for(mac).map(|l| l.ip);
    assert!(held.is_some(), "{}", dnsmasq.log());
    let s = agent.status();
    assert!(s.uplinks[0].replies >= 2, "OFFER and ACK: {:?}", s.uplinks);
    assert!(
        s.counters["kernel.dropped_owned"] >= 2,
        "consumed at the NIC: {:?}",
        s.counters
    );
    let leases = agent.leases();
    assert_eq!(
        leases.iter().map(|l| l.path.as_str()).collect::<Vec<_>>(),
        [format!("uplink:{}", uplink.ifname)],
        "{leases:?}"
    );
    assert!(
        s.interfaces.iter().all(|i| i.bpf_link.is_none()),
        "nothing attached for the pod: {:?}",
        s.interfaces
    );
    assert!(
        !pod.ip(&["-d", "link", "show", "dev", "eth0"])
            .contains("prog/xdp")
    );

    let del = bridge_plugin(&cni, node, &pod, "xbr0", &agent.socket, "DEL", "pod-nic");
    assert!(
        del.ok,
        "DEL: {} {}\n{}",
        del.stdout,
        del.stderr,
        agent.log()
    );
    assert!(
        wait_until(Duration::from_secs(10), || dnsmasq.lease_for(mac).is_none()),
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

// ------------------------------------------------- VFIO with a real e1000e --

/// The VFIO tests share the one e1000e: one at a time.
static E1000E: Mutex<()> = Mutex::new(());

/// The guest's e1000e, put on `vfio-pci` before each test.
struct E1000e {
    pci: PciAddr,
    _lock: std::sync::MutexGuard<'static, ()>,
}

fn write_sysfs(path: impl AsRef<Path>, value: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    std::fs::OpenOptions::new()
        .write(true)
        .open(path.as_ref())?
        .write_all(value.as_bytes())
}

impl E1000e {
    fn claim() -> Self {
        let lock = E1000E
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        xdhcp_tests::netns::run(
            std::process::Command::new(xdhcp_tests::program("modprobe"))
                .args(["-a", "e1000e", "igb", "vfio-pci"]),
        );
        let id = |dir: &Path, attr: &str| {
            std::fs::read_to_string(dir.join(attr))
                .ok()
                .and_then(|s| u16::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok())
        };
        let pci = std::fs::read_dir("/sys/bus/pci/devices")
            .expect("/sys/bus/pci/devices")
            .filter_map(Result::ok)
            .find(|e| {
                (id(&e.path(), "vendor"), id(&e.path(), "device"))
                    == (Some(E1000E_IDS.0), Some(E1000E_IDS.1))
            })
            .unwrap_or_else(|| panic!("no e1000e (8086:10d3) PCI device: {RUN_IN_VM}"))
            .file_name()
            .to_string_lossy()
            .parse()
            .expect("a PCI address");
        let me = Self { pci, _lock: lock };
        me.to_vfio();
        me
    }

    fn dir(&self) -> PathBuf {
        PathBuf::from("/sys/bus/pci/devices").join(self.pci.to_string())
    }

    fn driver(&self) -> Option<String> {
        xdhcp::vfio::bound_driver(&xdhcp::vfio::Sysfs::default(), &self.pci).expect("read driver")
    }

    fn driver_override(&self) -> String {
        std::fs::read_to_string(self.dir().join("driver_override"))
            .unwrap_or_default()
            .trim()
            .to_owned()
    }

    /// What an operator does to pass the NIC through: `vfio-pci` takes it.
    fn to_vfio(&self) {
        let bdf = self.pci.to_string();
        write_sysfs(self.dir().join("driver_override"), VFIO_PCI).expect("driver_override");
        if let Some(d) = self.driver().filter(|d| d != VFIO_PCI) {
            write_sysfs(format!("/sys/bus/pci/drivers/{d}/unbind"), &bdf).expect("unbind");
        }
        if self.driver().is_none() {
            write_sysfs("/sys/bus/pci/drivers/vfio-pci/bind", &bdf).expect(
                "bind vfio-pci (the guest needs intel_iommu=on and qemu's intel-iommu device)",
            );
        }
        assert_eq!(self.driver().as_deref(), Some(VFIO_PCI));
    }

    fn assert_on_vfio(&self, journal: &Path) {
        assert_eq!(self.driver().as_deref(), Some(VFIO_PCI));
        assert_eq!(self.driver_override(), VFIO_PCI);
        assert!(
            !self.dir().join("net").exists(),
            "a netdev is still there on vfio-pci"
        );
        let left: Vec<_> = std::fs::read_dir(journal)
            .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "journal entries left: {left:?}");
    }
}

const NS: &str = "tenant";
const VM_MAC: &str = "02:00:00:00:64:0e";
const NAD: &str = "localnet-dhcp-vfio";

/// An `xdhcp agent` process in this (the guest's initial) namespace, where
/// the handed-off NIC's netdev appears, with the embedded pod store seeded
/// with a KubeVirt launcher pod and its VMI.
struct VfioAgent {
    process: Option<Process>,
    dir: tempfile::TempDir,
    extra: Vec<String>,
}

impl VfioAgent {
    fn start(extra: &[&str]) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("xdt-vfio-agent-")
            .tempdir()
            .unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir_all(&state).unwrap();
        let vmi = json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "vm9", "namespace": NS},
            "spec": {
                "networks": [
                    {"name": "default", "pod": {}},
                    {"name": "sriovnet", "multus": {"networkName": format!("{NS}/{NAD}")}}
                ],
                "domain": {"devices": {"interfaces": [
                    {"name": "default", "masquerade": {}},
                    {"name": "sriovnet", "sriov": {}, "macAddress": VM_MAC}
                ]}}
            }
        });
        let seed = json!({
            "pods": {format!("{NS}/virt-launcher-vm9-x"): {"labels": {
                "kubevirt.io": "virt-launcher", "vm.kubevirt.io/name": "vm9"}}},
            "vmis": {format!("{NS}/vm9"): vmi}
        });
        std::fs::write(
            state.join("pod-networks.json"),
            serde_json::to_vec_pretty(&seed).unwrap(),
        )
        .unwrap();
        let mut me = Self {
            process: None,
            dir,
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
        };
        me.spawn();
        me
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("run/xdhcp.sock")
    }

    fn journal(&self) -> PathBuf {
        xdhcp::vfio::journal_dir(&self.dir.path().join("state"))
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("agent.log")).unwrap_or_default()
    }

    fn spawn(&mut self) {
        let mut cmd = xdhcp_tests::agent_command(
            &agent_support::xdhcp_bin(),
            &self.socket(),
            self.dir.path(),
        );
        cmd.args(["--vfio-netdev-timeout", "30s", "--acquire-timeout", "60s"])
            .args(&self.extra)
            .env("RUST_LOG", "info,xdhcp=debug");
        self.process = Some(Process::spawn_logged(
            "xdhcp agent",
            cmd,
            &self.dir.path().join("agent.log"),
        ));
        let client = self.client();
        let ready = wait_until(xdhcp_tests::AGENT_READY_WITHIN, || {
            client
                .get::<rpc::Readiness>(rpc::PATH_READY)
                .is_ok_and(|r| r.ready)
        });
        assert!(ready, "agent not ready:\n{}", self.log());
    }

    fn kill_and_restart(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.kill();
        }
        self.spawn();
    }

    fn client(&self) -> Client {
        Client::new(self.socket(), Duration::from_mins(2))
    }

    fn request(launcher: &NetNs, pci: PciAddr) -> CniRequest {
        let config = json!({
            "cniVersion": "1.0.0", "name": NAD, "type": "ovn-k8s-cni-overlay",
            "topology": "localnet", "role": "secondary", "physicalNetworkName": "physnet",
            "netAttachDefName": format!("{NS}/{NAD}"),
            "deviceID": pci.to_string(),
            "ipam": {"type": "dhcp"}
        });
        CniRequest {
            container_id: "ctr-vm9".to_owned(),
            ifname: "net1".to_owned(),
            netns: Some(launcher.path().to_path_buf()),
            args: [
                ("K8S_POD_NAMESPACE".to_owned(), NS.to_owned()),
                ("K8S_POD_NAME".to_owned(), "virt-launcher-vm9-x".to_owned()),
                ("K8S_POD_UID".to_owned(), "uid-vm9".to_owned()),
            ]
            .into(),
            config: xdhcp::cni::config::parse(config.to_string().as_bytes())
                .expect("test config is valid"),
        }
    }

    fn add(&self, req: &CniRequest) -> Result<CniResult, ClientError> {
        add_on(&self.client(), req)
    }

    fn del(&self, req: &CniRequest) {
        self.client()
            .post::<_, Value>(rpc::PATH_DEL, req)
            .unwrap_or_else(|e| panic!("DEL: {e}\n{}", self.log()));
    }

    fn pod_networks_entry(&self) -> Option<Value> {
        let store: Value = serde_json::from_slice(
            &std::fs::read(self.dir.path().join("state/pod-networks.json")).ok()?,
        )
        .ok()?;
        let ann = store["pods"][format!("{NS}/virt-launcher-vm9-x")]["annotations"]
            ["k8s.ovn.org/pod-networks"]
            .as_str()?;
        serde_json::from_str::<Value>(ann)
            .ok()?
            .get(format!("{NS}/{NAD}"))
            .cloned()
    }
}

fn add_on(client: &Client, req: &CniRequest) -> Result<CniResult, ClientError> {
    client
        .post::<_, Value>(rpc::PATH_ADD, req)
        .map(|v| serde_json::from_value(v).expect("ADD reply is a CNI result"))
}

/// The address qemu's user-network DHCP server hands out (10.0.2.15 and up,
/// gateway and server 10.0.2.2).
fn assert_qemu_lease(r: &CniResult) {
    let ip = r.ips[0].address.addr;
    assert_eq!(ip.octets()[..3], [10, 0, 2], "{r:?}");
    assert!(ip.octets()[3] >= 15, "{r:?}");
    assert_eq!(r.ips[0].address.prefix_len, 24, "{r:?}");
    assert_eq!(r.ips[0].gateway, Some("10.0.2.2".parse().unwrap()), "{r:?}");
}

#[test]
#[ignore = "needs the VM tier's devices: run `cargo xtask vmtest`"]
fn vfio_handoff_of_a_real_e1000e_runs_the_dora_against_qemus_server() {
    let nic = E1000e::claim();
    let agent = VfioAgent::start(&["--vf-driver", E1000E_ENTRY]);
    let launcher = NetNs::new();
    let req = VfioAgent::request(&launcher, nic.pci);

    let t0 = Instant::now();
    let r = agent
        .add(&req)
        .unwrap_or_else(|e| panic!("ADD: {:?}\n{}", e.into_cni(), agent.log()));
    #[expect(clippy::print_stderr, reason = "the figure is useful in test logs")]
    {
        eprintln!("VFIO handoff + DORA + restore: {:?}", t0.elapsed());
    }
    assert_qemu_lease(&r);
    nic.assert_on_vfio(&agent.journal());
    let log = agent.log();
    assert!(
        log.contains("VFIO handoff: binding kernel driver") && log.contains("e1000e"),
        "{log}"
    );
    assert!(log.contains("vfio-pci restored"), "{log}");
    let entry = agent
        .pod_networks_entry()
        .unwrap_or_else(|| panic!("no pod-networks entry\n{log}"));
    assert_eq!(entry["mac_address"], VM_MAC, "{entry}");
    assert_eq!(
        entry["ip_addresses"][0],
        format!("{}/24", r.ips[0].address.addr),
        "{entry}"
    );
    assert!(!launcher.has_link("net1"));
    agent.del(&req);
}

/// The node has a live uplink for the very physical network the VF's NAD
/// names (the virtio NIC, native XDP): a VF's replies arrive on its own
/// netdev, never at the uplink, so the handoff's discovery keeps the VF's
/// per-interface path and completes as it does without uplinks.
#[test]
#[ignore = "needs the VM tier's devices: run `cargo xtask vmtest`"]
fn vfio_handoff_with_a_live_uplink_on_its_physnet_keeps_the_vfs_own_path() {
    xdhcp_tests::netns::run(
        std::process::Command::new(xdhcp_tests::program("modprobe")).arg("virtio_net"),
    );
    let uplink = netdev_with_mac(VIRTIO_CLIENT_MAC);
    let nic = E1000e::claim();
    let physnet = format!("physnet={uplink}");
    let metrics: std::net::SocketAddr = "127.0.0.1:9465".parse().unwrap();
    let agent = VfioAgent::start(&[
        "--vf-driver",
        E1000E_ENTRY,
        "--uplink",
        &physnet,
        "--metrics-addr",
        &metrics.to_string(),
    ]);
    let status = || {
        agent
            .client()
            .get::<rpc::AgentStatus>(rpc::PATH_STATUS)
            .expect("agent status")
    };
    assert!(
        wait_until(Duration::from_secs(30), || status().uplinks[0].state
            == "live"),
        "the uplink was not attached: {:?}\n{}",
        status().uplinks,
        agent.log()
    );
    let up = status().uplinks[0].clone();
    assert_eq!(
        (up.physnet.as_deref(), up.mode.as_deref()),
        (Some("physnet"), Some("xdp-native")),
        "{up:?}"
    );
    let launcher = NetNs::new();
    let req = VfioAgent::request(&launcher, nic.pci);
    let r = agent
        .add(&req)
        .unwrap_or_else(|e| panic!("ADD: {:?}\n{}", e.into_cni(), agent.log()));
    assert_qemu_lease(&r);
    nic.assert_on_vfio(&agent.journal());
    let log = agent.log();
    assert!(log.contains("vfio-pci restored"), "{log}");
    assert!(!log.contains("replies arrive through the uplink"), "{log}");
    let s = status();
    assert_eq!(s.uplinks[0].replies, 0, "{:?}", s.uplinks);
    assert_eq!(s.uplinks[0].state, "live", "{:?}", s.uplinks);
    let scraped = xdhcp_tests::bench::http_get(metrics, "/metrics").expect("the agent's metrics");
    let bound = |path: &str| {
        xdhcp_tests::bench::metric_count(
            &scraped,
            "xdhcp_bound_by_path_total",
            &format!("path=\"{path}\""),
        )
    };
    assert_eq!(bound("uplink"), 0, "{scraped}");
    assert_eq!(bound("af_packet") + bound("ebpf"), 1, "{scraped}");
    let entry = agent
        .pod_networks_entry()
        .unwrap_or_else(|| panic!("no pod-networks entry\n{log}"));
    assert_eq!(
        entry["ip_addresses"][0],
        format!("{}/24", r.ips[0].address.addr),
        "{entry}"
    );
    agent.del(&req);
}

#[test]
#[ignore = "needs the VM tier's devices: run `cargo xtask vmtest`"]
fn vfio_handoff_killed_mid_way_is_healed_by_the_restarted_agent() {
    let nic = E1000e::claim();
    let mut agent = VfioAgent::start(&["--vf-driver", E1000E_ENTRY]);
    let launcher = NetNs::new();
    let req = VfioAgent::request(&launcher, nic.pci);

    // ADD from another thread; SIGKILL the agent once the NIC is on e1000e.
    let (client, add_req) = (agent.client(), req.clone());
    let adder = std::thread::spawn(move || add_on(&client, &add_req));
    let handed = wait_until(Duration::from_mins(1), || {
        nic.driver().as_deref() == Some("e1000e")
    });
    assert!(
        handed,
        "the NIC never reached e1000e (driver {:?})\n{}",
        nic.driver(),
        agent.log()
    );
    if let Some(p) = agent.process.as_mut() {
        p.kill();
    }
    assert!(
        adder.join().expect("ADD thread").is_err(),
        "the ADD finished before the kill"
    );
    // Killed inside the window: the NIC is off vfio-pci, the journal says so.
    let pending = xdhcp::vfio::journal_path(&agent.journal(), &nic.pci);
    let entry: xdhcp::vfio::JournalEntry = serde_json::from_slice(
        &std::fs::read(&pending).unwrap_or_else(|e| panic!("{}: {e}", pending.display())),
    )
    .expect("a journal entry");
    assert_eq!(
        (entry.bdf, entry.intended_driver.as_str()),
        (nic.pci, "e1000e")
    );
    assert_ne!(nic.driver().as_deref(), Some(VFIO_PCI));

    // The restarted agent heals before it serves, then hands off again.
    agent.kill_and_restart();
    nic.assert_on_vfio(&agent.journal());
    let log = agent.log();
    assert!(log.contains("interrupted VFIO handoff"), "{log}");
    let r = agent
        .add(&req)
        .unwrap_or_else(|e| panic!("ADD after heal: {:?}\n{}", e.into_cni(), agent.log()));
    assert_qemu_lease(&r);
    nic.assert_on_vfio(&agent.journal());
    agent.del(&req);
}

#[test]
#[ignore = "needs the VM tier's devices: run `cargo xtask vmtest`"]
fn vfio_handoff_whose_driver_bind_fails_gives_the_nic_back_to_vfio_pci() {
    let nic = E1000e::claim();
    // igb does not drive the 82574L: with the override pointing the device
    // at it, the kernel runs igb's probe, which fails, and the bind write
    // returns the error.
    let agent = VfioAgent::start(&["--vf-driver", "8086:10d3=igb"]);
    let launcher = NetNs::new();
    let req = VfioAgent::request(&launcher, nic.pci);
    let err = agent
        .add(&req)
        .expect_err("ADD through a driver that cannot bind")
        .into_cni();
    assert_eq!(err.code, code::VFIO, "{err:?}");
    assert!(
        err.msg.contains("bind failed") && err.msg.contains("igb"),
        "{err:?}"
    );
    nic.assert_on_vfio(&agent.journal());
    assert!(agent.pod_networks_entry().is_none());
    assert!(agent.log().contains("igb"), "{}", agent.log());
}
