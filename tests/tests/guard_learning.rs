//! Passive learning of a VM guest's own DHCP, end to end in namespaces,
//! with real Debian DHCP clients as the guest.
//!
//! Topology (bridge binding): the guest namespace's `eth0` (the VM's MAC)
//! → veth → bridge `k6t-eth0` in the launcher pod's namespace → the pod
//! interface `eth0` → its veth peer `c0`, a port of bridge `br0` in the
//! node namespace → dnsmasq on `br0`. The agent runs in-process inside the
//! node namespace (every thread it starts inherits it), so the guard goes on
//! `c0`; its pod API is the embedded store (`--kube=off`) seeded with the
//! launcher pod and the VMI — not a cluster and not the fake API server: the
//! `pod-networks` entry is read back from that store.
//!
//! The VM ADD runs the one-shot discovery (client id `01:<MAC>`); then the
//! guest's client leases for itself, and the entry must end at the address
//! the guest holds: `dhcpcd` with its DUID gets another address, `udhcpc`
//! (client id `01:<MAC>`) the same one, `dhclient` (no client id) whatever
//! the server gives it. Each against dnsmasq and against Kea.
//!
//! Needs root; fails, never skips, without it.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use xdhcp::bindings::{Binding, BindingSource, PATH_BINDINGS};
use xdhcp::cli::{AgentArgs, KubeMode};
use xdhcp::cni::config;
use xdhcp::rpc::{self, Client, CniRequest};
use xdhcp_tests::{
    Dnsmasq, DnsmasqConfig, Kea, KeaConfig, Lab, NetNs, Veth, parse_mac, wait_until,
};

const NS: &str = "tenant";
const NAD: &str = "dhcpnet";
const POD: &str = "virt-launcher-vm1";
const VM_MAC: &str = "02:00:00:00:30:01";
const POD_NETWORKS: &str = "k8s.ovn.org/pod-networks";

/// An in-process agent on its own thread inside `node`, stopped on drop.
struct NodeAgent {
    rt: tokio::runtime::Runtime,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<(), String>>>,
    socket: PathBuf,
    state_dir: PathBuf,
    _dir: tempfile::TempDir,
}

impl NodeAgent {
    fn start(node: &Path, seed: &Value) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("xdt-learn-agent-")
            .tempdir()
            .unwrap();
        let socket = dir.path().join("run/xdhcp.sock");
        let state_dir = dir.path().join("state");
        std::fs::create_dir_all(&state_dir).unwrap();
        std::fs::write(
            state_dir.join("pod-networks.json"),
            serde_json::to_vec_pretty(seed).unwrap(),
        )
        .unwrap();
        let mut args = AgentArgs::with_defaults(socket.clone(), state_dir.clone());
        args.kube = KubeMode::Off;
        args.bpffs_dir = dir.path().join("bpffs");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let sock = socket.clone();
        let agent = move || async move {
            let listener = xdhcp::daemon::bind_socket(&sock)
                .await
                .map_err(|e| e.to_string())?;
            xdhcp::daemon::run(args, listener, async move {
                let _ = stopped.await;
            })
            .await
            .map_err(|e| e.to_string())
        };
        let node = node.to_path_buf();
        let thread = std::thread::spawn(move || {
            xdhcp::sys::netns::block_on_in_netns(&node, agent)
                .map_err(|e| e.to_string())
                .and_then(|r| r)
        });
        let me = Self {
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap(),
            stop: Some(stop),
            thread: Some(thread),
            socket,
            state_dir,
            _dir: dir,
        };
        let c = me.client();
        let ready = wait_until(Duration::from_secs(20), || {
            me.rt
                .block_on(c.get::<rpc::Readiness>(rpc::PATH_READY))
                .is_ok_and(|r| r.ready)
        });
        assert!(ready, "agent did not become ready");
        me
    }

    fn client(&self) -> Client {
        Client::new(&self.socket, Duration::from_mins(1))
    }

    fn add(&self, req: &CniRequest) -> rpc::CniResult {
        let v = self
            .rt
            .block_on(self.client().post(rpc::PATH_ADD, req))
            .expect("VM ADD succeeds");
        serde_json::from_value(v).expect("a CNI result")
    }

    fn bindings(&self) -> Vec<Binding> {
        self.rt
            .block_on(self.client().get(PATH_BINDINGS))
            .expect("binding table")
    }

    /// The address of this network's `pod-networks` entry of the launcher pod.
    fn reported(&self) -> Option<Ipv4Addr> {
        let store: Value =
            serde_json::from_slice(&std::fs::read(self.state_dir.join("pod-networks.json")).ok()?)
                .ok()?;
        let ann = store["pods"][format!("{NS}/{POD}")]["annotations"][POD_NETWORKS].as_str()?;
        let doc: Value = serde_json::from_str(ann).ok()?;
        let ip = doc[format!("{NS}/{NAD}")]["ip_addresses"][0].as_str()?;
        ip.split('/').next()?.parse().ok()
    }
}

impl Drop for NodeAgent {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take()
            && wait_until(Duration::from_secs(20), || t.is_finished())
        {
            let _ = t.join();
        }
    }
}

/// The DHCP server on the node's bridge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Srv {
    Dnsmasq,
    Kea,
}

/// A running server of either kind (kept alive for the test).
#[expect(dead_code, reason = "held only so the server runs until the test ends")]
enum Running {
    Dnsmasq(Dnsmasq),
    Kea(Kea),
}

/// The lab, the guest namespace behind the launcher's bridge, the server,
/// and the agent after the VM's ADD.
struct Vm {
    agent: NodeAgent,
    guest: NetNs,
    _guest_link: Veth,
    _server: Running,
    lab: Lab,
    one_shot: Ipv4Addr,
    req: CniRequest,
}

fn vm_with_guest(srv: Srv) -> Vm {
    let lab = Lab::with_clients(1);
    let server = match srv {
        Srv::Dnsmasq => Running::Dnsmasq(Dnsmasq::start(&lab.server, DnsmasqConfig::default())),
        Srv::Kea => Running::Kea(Kea::start(&lab.server, KeaConfig::default())),
    };
    let launcher = &lab.clients[0];
    // Bridge binding: the pod interface and the guest's link on one bridge.
    let guest = NetNs::new();
    let mac = parse_mac(VM_MAC).unwrap();
    let link = Veth::with_mac(&launcher.ns, "tapg", &guest, "eth0", mac);
    launcher
        .ns
        .ip(&["link", "add", "k6t-eth0", "type", "bridge"]);
    launcher
        .ns
        .ip(&["link", "set", "eth0", "master", "k6t-eth0"]);
    launcher
        .ns
        .ip(&["link", "set", "tapg", "master", "k6t-eth0"]);
    for i in ["k6t-eth0", "tapg", "eth0"] {
        launcher.ns.link_up(i);
    }
    guest.link_up("eth0");

    let key = format!("{NS}/{NAD}");
    let seed = json!({
        "pods": {format!("{NS}/{POD}"): {"labels": {"kubevirt.io": "virt-launcher", "vm.kubevirt.io/name": "vm1"}}},
        "vmis": {format!("{NS}/vm1"): {
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "vm1", "namespace": NS},
            "spec": {
                "networks": [{"name": "default", "pod": {}}, {"name": "dhcpnet", "multus": {"networkName": key}}],
                "domain": {"devices": {"interfaces": [
                    {"name": "default", "masquerade": {}},
                    {"name": "dhcpnet", "bridge": {}, "macAddress": VM_MAC}
                ]}}
            }
        }}
    });
    let agent = NodeAgent::start(lab.server.path(), &seed);
    let conf = json!({
        "cniVersion": "1.0.0", "name": NAD, "type": "ovn-k8s-cni-overlay",
        "topology": "localnet", "netAttachDefName": key, "ipam": {"type": "dhcp"}
    });
    let req = CniRequest {
        container_id: "c-vm1".to_owned(),
        ifname: "eth0".to_owned(),
        netns: Some(launcher.ns.path().to_path_buf()),
        args: [
            ("K8S_POD_NAMESPACE".to_owned(), NS.to_owned()),
            ("K8S_POD_NAME".to_owned(), POD.to_owned()),
            ("K8S_POD_UID".to_owned(), "uid-vm1".to_owned()),
        ]
        .into(),
        config: config::parse(conf.to_string().as_bytes()).unwrap(),
    };
    let r = agent.add(&req);
    let one_shot = r.ips[0].address.addr;
    assert_eq!(
        agent.reported(),
        Some(one_shot),
        "the ADD reported its one-shot address"
    );
    // The VM's port is guarded: the lease's binding names it.
    let leased: Vec<_> = agent
        .bindings()
        .into_iter()
        .filter(|b| b.source == BindingSource::Leased)
        .collect();
    assert_eq!(leased.len(), 1, "{leased:?}");
    assert_eq!(leased[0].mac, VM_MAC);
    assert_eq!(
        leased[0].port.as_deref(),
        Some(launcher.port()),
        "{leased:?}"
    );
    Vm {
        agent,
        guest,
        _guest_link: link,
        _server: server,
        lab,
        one_shot,
        req,
    }
}

/// Waits up to a second for the entry to report `ip`.
fn reported_within_a_second(vm: &Vm, ip: Ipv4Addr) -> bool {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(1) {
        if vm.agent.reported() == Some(ip) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

fn learned(vm: &Vm) -> Vec<Binding> {
    vm.agent
        .bindings()
        .into_iter()
        .filter(|b| b.source == BindingSource::Learned)
        .collect()
}

/// A script a client runs on each state change: records the bound address.
fn recorder(dir: &Path, var: &str, when: &str) -> (PathBuf, PathBuf) {
    let script = dir.join("script");
    let out = dir.join("bound");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\ncase \"$reason$1\" in *{when}*) echo \"${var}\" > {} ;; esac\nexit 0\n",
            out.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    (script, out)
}

fn read_ip(path: &Path) -> Ipv4Addr {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("the client recorded no lease ({e})"))
        .trim()
        .parse()
        .expect("an IPv4 address")
}

/// dhcpcd keeps its pid file and control socket under `/run/dhcpcd`, named
/// after the interface, whatever the namespace: two at once would collide.
static DHCPCD: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn dhcpcd_guest(srv: Srv) {
    let _one_at_a_time = DHCPCD
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let vm = vm_with_guest(srv);
    let dir = tempfile::tempdir().unwrap();
    // The distribution's defaults that matter (DUID client id), no hooks
    // (the script replaces them: nothing touches this machine's files).
    let conf = dir.path().join("dhcpcd.conf");
    std::fs::write(&conf, "duid\npersistent\nrequire dhcp_server_identifier\n").unwrap();
    let (script, out) = recorder(dir.path(), "new_ip_address", "BOUND");
    let status = vm
        .guest
        .command("dhcpcd")
        .args(["-1", "-4", "-B", "-t", "20", "-f"])
        .arg(&conf)
        .arg("-c")
        .arg(&script)
        .arg("eth0")
        .status()
        .expect("run dhcpcd");
    assert!(status.success(), "dhcpcd failed");
    let guest_ip = read_ip(&out);
    assert_ne!(
        guest_ip, vm.one_shot,
        "dnsmasq gives the DUID client another address"
    );
    assert!(
        reported_within_a_second(&vm, guest_ip),
        "the entry reports {:?}, the guest holds {guest_ip}",
        vm.agent.reported()
    );
    let l = learned(&vm);
    assert_eq!(l.len(), 1, "{l:?}");
    assert_eq!((l[0].ip, l[0].mac.as_str()), (guest_ip, VM_MAC));
    assert_eq!(l[0].port.as_deref(), Some(vm.lab.clients[0].port()));
    assert!(l[0].expires_unix_ms.is_some());
    // The VM's DEL takes its port's guard and its learned binding away.
    vm.agent
        .rt
        .block_on(vm.agent.client().post::<_, Value>(rpc::PATH_DEL, &vm.req))
        .expect("DEL");
    assert!(learned(&vm).is_empty(), "{:?}", learned(&vm));
    assert!(vm.agent.bindings().is_empty());
}

fn udhcpc_guest(srv: Srv) {
    let vm = vm_with_guest(srv);
    let dir = tempfile::tempdir().unwrap();
    let (script, out) = recorder(dir.path(), "ip", "bound");
    let status = vm
        .guest
        .command("busybox")
        .args([
            "udhcpc", "-f", "-q", "-n", "-t", "5", "-T", "1", "-i", "eth0", "-s",
        ])
        .arg(&script)
        .status()
        .expect("run udhcpc");
    assert!(status.success(), "udhcpc failed");
    let guest_ip = read_ip(&out);
    // Same client id as the one-shot: the same address, nothing to change.
    assert_eq!(guest_ip, vm.one_shot);
    assert!(wait_until(Duration::from_secs(1), || !learned(&vm).is_empty()));
    assert_eq!(vm.agent.reported(), Some(vm.one_shot));
    assert_eq!(learned(&vm)[0].ip, guest_ip);
}

fn dhclient_guest(srv: Srv) {
    let vm = vm_with_guest(srv);
    let dir = tempfile::tempdir().unwrap();
    let (script, out) = recorder(dir.path(), "new_ip_address", "BOUND");
    let status = vm
        .guest
        .command("dhclient")
        .args(["-4", "-1", "-sf"])
        .arg(&script)
        .arg("-lf")
        .arg(dir.path().join("leases"))
        .arg("-pf")
        .arg(dir.path().join("pid"))
        .arg("eth0")
        .status()
        .expect("run dhclient");
    assert!(status.success(), "dhclient failed");
    let guest_ip = read_ip(&out);
    assert!(
        reported_within_a_second(&vm, guest_ip),
        "the entry reports {:?}, the guest holds {guest_ip}",
        vm.agent.reported()
    );
}

#[test]
fn dhcpcd_guest_with_its_duid_moves_the_entry_to_its_own_address_dnsmasq() {
    dhcpcd_guest(Srv::Dnsmasq);
}

#[test]
fn dhcpcd_guest_with_its_duid_moves_the_entry_to_its_own_address_kea() {
    dhcpcd_guest(Srv::Kea);
}

#[test]
fn udhcpc_guest_keeping_the_address_changes_nothing_dnsmasq() {
    udhcpc_guest(Srv::Dnsmasq);
}

#[test]
fn udhcpc_guest_keeping_the_address_changes_nothing_kea() {
    udhcpc_guest(Srv::Kea);
}

#[test]
fn dhclient_guest_entry_ends_at_the_address_it_holds_dnsmasq() {
    dhclient_guest(Srv::Dnsmasq);
}

#[test]
fn dhclient_guest_entry_ends_at_the_address_it_holds_kea() {
    dhclient_guest(Srv::Kea);
}
